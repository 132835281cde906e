"""danube's own async client: batching producer and credit-based consumer over the batch lane.

See docs/client.md.  The client uses only the frame codec and the protocol stubs.
"""

from danube.client.client import DanubeClient, DanubeClientBuilder, RetryPolicy
from danube.client.consumer import Consumer, ConsumerBuilder, SubType
from danube.client.consumer_set import ConsumerSet
from danube.client.messages import Message, MessageBatch
from danube.client.partition_router import fnv1a_64, partition_topic
from danube.client.producer import Producer, ProducerBuilder

__all__ = [
    "DanubeClient",
    "DanubeClientBuilder",
    "RetryPolicy",
    "Producer",
    "ProducerBuilder",
    "Consumer",
    "ConsumerBuilder",
    "ConsumerSet",
    "SubType",
    "Message",
    "MessageBatch",
    "fnv1a_64",
    "partition_topic",
]

"""Publish one record to a topic another broker of the cluster owns, through that broker's client
port (Danube's ``CreateProducer`` + ``SendMessage``), as the broker itself.

A subscription's dead-letter topic may be owned by any broker: the broker whose subscription
gave up on a message hands it to the owner this way: the cluster node installs a
:class:`ForwardPublisher` as the broker's ``remote_publisher`` (``danube.broker.contracts.RemotePublisher``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from danube.cluster import peers
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

_request_ids = itertools.count(1)


class ForwardPublisher:
    """The broker's ``remote_publisher`` in cluster mode: :func:`publish` through its peer channels."""

    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def publish(
        self,
        owner_url: str,
        topic: str,
        producer_name: str,
        payload: bytes,
        *,
        publish_time: int,
        routing_key: str | None,
        attributes: dict[str, str],
    ) -> None:
        await publish(
            self.broker,
            owner_url,
            topic,
            producer_name,
            payload,
            publish_time=publish_time,
            routing_key=routing_key,
            attributes=attributes,
        )


async def publish(
    broker: BrokerService,
    owner_url: str,
    topic: str,
    producer_name: str,
    payload: bytes,
    *,
    publish_time: int,
    routing_key: str | None,
    attributes: dict[str, str],
    timeout: float = 30.0,
) -> None:
    """Store one record on ``topic`` at its owner ``owner_url`` (a reliable producer named
    ``producer_name``); raises grpc.aio.AioRpcError when the owner refuses or cannot be reached."""
    channel = peers.for_broker(broker).channel(owner_url)
    try:
        producers = pb_grpc.ProducerServiceStub(channel)
        created = await producers.CreateProducer(
            pb.ProducerRequest(
                request_id=next(_request_ids),
                producer_name=producer_name,
                topic_name=topic,
                dispatch_strategy=pb.Reliable,
            ),
            timeout=timeout,
        )
        message = pb.StreamMessage(
            request_id=next(_request_ids),
            msg_id=pb.MsgID(producer_id=created.producer_id, topic_name=topic),
            payload=bytes(payload),
            publish_time=publish_time,
            producer_name=producer_name,
            attributes=attributes,
        )
        if routing_key is not None:
            message.routing_key = routing_key
        await producers.SendMessage(message, timeout=timeout)
    finally:
        await channel.close()

"""The admin failure policy is Danube's SubscriptionFailurePolicy message."""

import pytest

from danube.broker.policies import FailurePolicy
from danube.errors import InvalidArgumentError
from danube.proto.danube_admin import admin_pb2 as pb
from danube.server import failure_policy_wire as wire

# What Danube's admin client sends for max_redelivery_count 2, ack_timeout_ms 5000, base 50,
# max 50, Exponential, dead letter "/default/dlq", Drop — written by hand from the field numbers
# and enum values of Danube's admin proto (1 varint, 2 varint, 3, 4, 5 enum, 6 string, 7 enum).
DANUBE_BYTES = b"\x08\x02\x10\x88\x27\x18\x32\x20\x32\x28\x01\x32\x0c/default/dlq\x38\x02"


def test_danubes_bytes_decode_to_the_policy_and_back():
    msg = pb.SubscriptionFailurePolicy.FromString(DANUBE_BYTES)
    policy = wire.from_wire(msg)
    assert policy == FailurePolicy(
        max_redelivery_count=2,
        ack_timeout_ms=5000,
        base_redelivery_delay_ms=50,
        max_redelivery_delay_ms=50,
        backoff_strategy="exponential",
        dead_letter_topic="/default/dlq",
        poison_policy="drop",
    )
    assert wire.to_wire(policy).SerializeToString() == DANUBE_BYTES


def test_defaults_and_absent_dead_letter_topic():
    msg = wire.to_wire(FailurePolicy())
    assert not msg.HasField("dead_letter_topic")
    assert (msg.poison_policy, msg.backoff_strategy) == (pb.Block, pb.Exponential)
    assert wire.from_wire(msg) == FailurePolicy()


def test_bad_values_are_refused_with_a_reason():
    with pytest.raises(InvalidArgumentError, match="poison_policy"):
        wire.from_wire(pb.SubscriptionFailurePolicy.FromString(b"\x38\x07"))
    with pytest.raises(InvalidArgumentError, match="backoff_strategy"):
        wire.from_wire(pb.SubscriptionFailurePolicy.FromString(b"\x28\x05"))
    with pytest.raises(InvalidArgumentError, match="dead_letter_topic"):
        wire.from_wire(pb.SubscriptionFailurePolicy(poison_policy=pb.DeadLetter))

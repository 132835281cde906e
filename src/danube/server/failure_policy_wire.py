"""Danube's ``SubscriptionFailurePolicy`` admin message ↔ :class:`~danube.broker.policies.FailurePolicy`.

Same field numbers and enum values as Danube's admin proto, so Danube's admin CLI sets and
reads a subscription's failure policy here unchanged.
"""

from __future__ import annotations

from danube.broker.policies import FailurePolicy
from danube.errors import InvalidArgumentError
from danube.proto.danube_admin import admin_pb2 as pb

_POISON_FROM_WIRE = {pb.DeadLetter: "dead_letter", pb.Block: "block", pb.Drop: "drop"}
_POISON_TO_WIRE = {v: k for k, v in _POISON_FROM_WIRE.items()}
_BACKOFF_FROM_WIRE = {pb.Fixed: "fixed", pb.Exponential: "exponential"}
_BACKOFF_TO_WIRE = {v: k for k, v in _BACKOFF_FROM_WIRE.items()}

SUB_TYPE_NUMBERS = {"exclusive": 0, "shared": 1, "failover": 2, "key_shared": 3}
SUB_TYPE_NAMES = {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "KeyShared"}  # Danube's console labels


def from_wire(msg: pb.SubscriptionFailurePolicy) -> FailurePolicy:
    """The policy a Set request carries; InvalidArgumentError for an unknown enum value or a
    dead-letter policy without a topic."""
    if msg.poison_policy not in _POISON_FROM_WIRE:
        raise InvalidArgumentError(
            f"invalid poison_policy value {msg.poison_policy}; expected 0 (DeadLetter), 1 (Block) or 2 (Drop)"
        )
    if msg.backoff_strategy not in _BACKOFF_FROM_WIRE:
        raise InvalidArgumentError(
            f"invalid backoff_strategy value {msg.backoff_strategy}; expected 0 (Fixed) or 1 (Exponential)"
        )
    return FailurePolicy(
        max_redelivery_count=msg.max_redelivery_count,
        ack_timeout_ms=msg.ack_timeout_ms,
        base_redelivery_delay_ms=msg.base_redelivery_delay_ms,
        max_redelivery_delay_ms=msg.max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF_FROM_WIRE[msg.backoff_strategy],
        poison_policy=_POISON_FROM_WIRE[msg.poison_policy],
        dead_letter_topic=msg.dead_letter_topic if msg.HasField("dead_letter_topic") else "",
    )


def to_wire(policy: FailurePolicy) -> pb.SubscriptionFailurePolicy:
    msg = pb.SubscriptionFailurePolicy(
        max_redelivery_count=policy.max_redelivery_count,
        ack_timeout_ms=policy.ack_timeout_ms,
        base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
        max_redelivery_delay_ms=policy.max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF_TO_WIRE[policy.backoff_strategy],
        poison_policy=_POISON_TO_WIRE[policy.poison_policy],
    )
    if policy.dead_letter_topic:
        msg.dead_letter_topic = policy.dead_letter_topic
    return msg


def to_json(msg: pb.SubscriptionFailurePolicy) -> dict:
    """The policy as Danube's admin CLI and console print it: lowercase enum labels,
    ``dead_letter_topic`` null when unset."""
    return {
        "max_redelivery_count": msg.max_redelivery_count,
        "ack_timeout_ms": msg.ack_timeout_ms,
        "base_redelivery_delay_ms": msg.base_redelivery_delay_ms,
        "max_redelivery_delay_ms": msg.max_redelivery_delay_ms,
        "backoff_strategy": _BACKOFF_FROM_WIRE.get(msg.backoff_strategy, "fixed"),
        "dead_letter_topic": msg.dead_letter_topic if msg.HasField("dead_letter_topic") else None,
        "poison_policy": _POISON_FROM_WIRE.get(msg.poison_policy, "block"),
    }

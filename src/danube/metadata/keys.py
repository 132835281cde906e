"""Every metadata key the project writes, built in one place (Danube's layout).

Topic names are ``/namespace/topic``; ``split_topic`` validates them.
"""

from __future__ import annotations

import re

from danube.errors import InvalidTopicNameError

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,255}$")


def split_topic(topic: str) -> tuple[str, str]:
    """``"/ns/t"`` → ``("ns", "t")``; raises InvalidTopicNameError otherwise."""
    if not isinstance(topic, str) or not topic.startswith("/"):
        raise InvalidTopicNameError(f"invalid topic name {topic!r}: expected /namespace/topic")
    parts = topic[1:].split("/")
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise InvalidTopicNameError(
            f"invalid topic name {topic!r}: expected /namespace/topic with letters, digits, '_', '-', '.'"
        )
    return parts[0], parts[1]


def offset20(offset: int) -> str:
    return f"{offset:020d}"


# ---------------------------------------------------------------- namespaces and topics

def namespace(ns: str) -> str:
    return f"/namespaces/{ns}"


def namespace_policy(ns: str) -> str:
    return f"/namespaces/{ns}/policy"


def topic_root(topic: str) -> str:
    ns, name = split_topic(topic)
    return f"/topics/{ns}/{name}"


def topic_delivery(topic: str) -> str:
    return f"{topic_root(topic)}/delivery"


def topic_policy(topic: str) -> str:
    return f"{topic_root(topic)}/policy"


def topic_partitions(topic: str) -> str:
    return f"{topic_root(topic)}/partitions"


def topic_producer(topic: str, producer_name: str) -> str:
    return f"{topic_root(topic)}/producers/{producer_name}"


def topic_subscriptions(topic: str) -> str:
    return f"{topic_root(topic)}/subscriptions/"


def subscription(topic: str, sub: str) -> str:
    return f"{topic_root(topic)}/subscriptions/{sub}"


def subscription_cursor(topic: str, sub: str) -> str:
    return f"{subscription(topic, sub)}/cursor"


def subscription_failure_policy(topic: str, sub: str) -> str:
    return f"{subscription(topic, sub)}/failure_policy"


def subscription_consumer(topic: str, sub: str, consumer_name: str) -> str:
    """A consumer's registration (id, type, filters), so clients keep their ids across restarts."""
    return f"{subscription(topic, sub)}/consumers/{consumer_name}"


# ---------------------------------------------------------------- storage (prefix = metadata_prefix)

def storage_topic(prefix: str, topic: str) -> str:
    ns, name = split_topic(topic)
    return f"{prefix.rstrip('/')}/storage/topics/{ns}/{name}"


def storage_segments(prefix: str, topic: str) -> str:
    return f"{storage_topic(prefix, topic)}/segments/"


def storage_segment(prefix: str, topic: str, start_offset: int) -> str:
    return f"{storage_topic(prefix, topic)}/segments/{offset20(start_offset)}"


def storage_segments_cur(prefix: str, topic: str) -> str:
    return f"{storage_topic(prefix, topic)}/segments/cur"


def storage_state(prefix: str, topic: str) -> str:
    return f"{storage_topic(prefix, topic)}/state"


# ---------------------------------------------------------------- cluster

def broker_register(broker_id: str) -> str:
    return f"/cluster/register/{broker_id}"


def broker_topic(broker_id: str, topic: str) -> str:
    ns, name = split_topic(topic)
    return f"/cluster/brokers/{broker_id}/{ns}/{name}"


def broker_state(broker_id: str) -> str:
    return f"/cluster/brokers/{broker_id}/state"


def unassigned(topic: str) -> str:
    ns, name = split_topic(topic)
    return f"/cluster/unassigned/{ns}/{name}"


def load_report(broker_id: str) -> str:
    return f"/cluster/load/{broker_id}"


def leader() -> str:
    return "/cluster/leader"

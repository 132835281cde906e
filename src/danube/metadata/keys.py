"""Every metadata key the project writes, built in one place (Danube's layout).

It also holds THE name rule, the only one in the project: namespaces, topic names
(``/namespace/topic``), subscriptions, consumers and producers all pass
:func:`check_name` (topics through :func:`split_topic`) before anything is stored,
because each of them becomes a metadata key segment and namespaces and topics also
become directory names.  A valid name segment is 1-255 characters from ``A-Z a-z 0-9
_ - .`` that does not start with ``.`` — so ``.``, ``..`` and hidden names are
impossible and a segment is always one plain directory entry.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from danube.errors import InvalidNameError, InvalidTopicNameError, quote

MAX_NAME_CHARS = 255
# "/" + namespace + "/" + topic
MAX_TOPIC_CHARS = 2 * MAX_NAME_CHARS + 2
NAME_RULE = "1-255 characters from letters, digits, '_', '-' and '.', not starting with '.'"

# \Z, not $: "$" would also accept a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,%d}\Z" % (MAX_NAME_CHARS - 1))


def is_valid_name(name: object) -> TypeGuard[str]:
    """True when ``name`` is one valid name segment (see the module docstring)."""
    return isinstance(name, str) and _NAME.match(name) is not None


def check_name(kind: str, name: object) -> str:
    """``name`` if it is a valid ``kind`` name (namespace, subscription, consumer, producer);
    raises InvalidNameError quoting at most a short prefix of it otherwise."""
    if not is_valid_name(name):
        if not isinstance(name, str):
            raise InvalidNameError(f"invalid {kind} name: expected a string, got {type(name).__name__}")
        raise InvalidNameError(f"invalid {kind} name {quote(name)}: expected {NAME_RULE}")
    return name


def check_namespace(namespace: object) -> str:
    return check_name("namespace", namespace)


def split_topic(topic: object) -> tuple[str, str]:
    """``"/ns/t"`` → ``("ns", "t")``; raises InvalidTopicNameError otherwise."""
    if not isinstance(topic, str):
        raise InvalidTopicNameError(f"invalid topic name: expected a string, got {type(topic).__name__}")
    if not topic.startswith("/") or len(topic) > MAX_TOPIC_CHARS:
        raise InvalidTopicNameError(
            f"invalid topic name {quote(topic)}: expected /namespace/topic of at most {MAX_TOPIC_CHARS} characters"
        )
    parts = topic[1:].split("/")
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise InvalidTopicNameError(
            f"invalid topic name {quote(topic)}: expected /namespace/topic, each part {NAME_RULE}"
        )
    return parts[0], parts[1]


def check_topic(topic: object) -> str:
    """``topic`` if it is a valid ``/namespace/topic`` name."""
    split_topic(topic)
    return topic  # type: ignore[return-value]


def offset20(offset: int) -> str:
    return f"{offset:020d}"


# ---------------------------------------------------------------- namespaces and topics


def namespace(ns: str) -> str:
    return f"/namespaces/{check_namespace(ns)}"


def namespace_policy(ns: str) -> str:
    return f"{namespace(ns)}/policy"


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
    return f"{topic_root(topic)}/producers/{check_name('producer', producer_name)}"


def topic_subscriptions(topic: str) -> str:
    return f"{topic_root(topic)}/subscriptions/"


def subscription(topic: str, sub: str) -> str:
    return f"{topic_root(topic)}/subscriptions/{check_name('subscription', sub)}"


def subscription_cursor(topic: str, sub: str) -> str:
    return f"{subscription(topic, sub)}/cursor"


def subscription_failure_policy(topic: str, sub: str) -> str:
    return f"{subscription(topic, sub)}/failure_policy"


def subscription_consumer(topic: str, sub: str, consumer_name: str) -> str:
    """A consumer's registration (id, type, filters), so clients keep their ids across restarts."""
    return f"{subscription(topic, sub)}/consumers/{check_name('consumer', consumer_name)}"


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


# ---------------------------------------------------------------- schema registry (docs/schema-registry.md)
# Subjects are free text (a topic name is a common subject), so they are percent-encoded
# into one key segment.


def _subject_segment(subject: str) -> str:
    from urllib.parse import quote

    return quote(subject, safe="")


def schema_subjects() -> str:
    return "/schemas/subjects/"


def schema_subject(subject: str) -> str:
    """The subject's record: schema id, type, compatibility mode, latest version."""
    return f"/schemas/subjects/{_subject_segment(subject)}/meta"


def schema_versions(subject: str) -> str:
    return f"/schemas/subjects/{_subject_segment(subject)}/versions/"


def schema_version(subject: str, version: int) -> str:
    return f"/schemas/subjects/{_subject_segment(subject)}/versions/{version:010d}"


def schema_id_index(schema_id: int) -> str:
    """Schema id → subject (ids are globally unique, one per subject)."""
    return f"/schemas/ids/{schema_id:020d}"


def schema_next_id() -> str:
    return "/schemas/next_id"


def topic_schema_configs() -> str:
    return "/schemas/topics/"


def topic_schema_config(topic: str) -> str:
    """A topic's schema subject, validation policy and payload-validation switch."""
    ns, name = split_topic(topic)
    return f"/schemas/topics/{ns}/{name}"


def schemas_root() -> str:
    return "/schemas/"


# ---------------------------------------------------------------- security (RBAC)
# Role and subject names are kept as given (a JWT subject may hold any character), so they are
# percent-encoded into one key segment.


def security_role(role: str) -> str:
    from urllib.parse import quote as _pct

    return f"/security/roles/{_pct(role, safe='')}"


def security_roles() -> str:
    return "/security/roles/"


def security_binding(subject: str) -> str:
    from urllib.parse import quote as _pct

    return f"/security/bindings/{_pct(subject, safe='')}"


def security_bindings() -> str:
    return "/security/bindings/"


# ---------------------------------------------------------------- cluster view (danube.cluster.view)


def cluster_prefix() -> str:
    """Everything the cluster keeps (one watch): registrations, assignments, markers, load reports, leader."""
    return "/cluster/"


def load_prefix() -> str:
    """Every broker's latest LoadReport (``load_report``)."""
    return "/cluster/load/"


# ---------------------------------------------------------------- rebalancing (docs/rebalancing.md)


def rebalancing_history_prefix() -> str:
    return "/cluster/rebalancing_history/"


def rebalancing_history(timestamp_ms: int) -> str:
    """One automated move, keyed by its time in Unix milliseconds (zero-padded: key order = time order)."""
    return f"/cluster/rebalancing_history/{int(timestamp_ms):020d}"


def cluster_register_prefix() -> str:
    """Every broker registration (``broker_register``)."""
    return "/cluster/register/"


def cluster_brokers_prefix() -> str:
    """Every assignment (``broker_topic``) and broker state (``broker_state``)."""
    return "/cluster/brokers/"


def unassigned_prefix() -> str:
    """Every unassigned marker (``unassigned``)."""
    return "/cluster/unassigned/"


# ---------------------------------------------------------------- scalable topics (docs/scalable-topics.md)
# Pulsar PIP-468's layout: the topic's key holds the ScalableTopicMetadata JSON, with the
# controller lock, the subscriptions and their consumer sessions under it.  ``operation`` is
# danube's addition: the split/merge in progress, so a new controller leader can finish it.


def scalable_topic(topic: str) -> str:
    return topic_root(topic)


def scalable_controller(topic: str) -> str:
    return f"{topic_root(topic)}/controller"


def scalable_operation(topic: str) -> str:
    return f"{topic_root(topic)}/operation"


def scalable_subscriptions(topic: str) -> str:
    return f"{topic_root(topic)}/subscriptions/"


def scalable_subscription(topic: str, sub: str) -> str:
    return f"{topic_root(topic)}/subscriptions/{check_name('subscription', sub)}"


def scalable_consumers(topic: str, sub: str) -> str:
    return f"{scalable_subscription(topic, sub)}/consumers/"


def scalable_consumer(topic: str, sub: str, consumer_name: str) -> str:
    return f"{scalable_subscription(topic, sub)}/consumers/{check_name('consumer', consumer_name)}"


def scalable_namespace_prefix(ns: str) -> str:
    """Every topic key of namespace ``ns`` (scalable topic keys are the ones holding a layout)."""
    return f"/topics/{check_namespace(ns)}/"


# ---------------------------------------------------------------- live repartition (docs/repartition.md)
# One key per partitioned topic under its own prefix, so a watch on the routing content sees
# nothing of the topics' other metadata (cursors, producers) churning.


def partitioning_prefix() -> str:
    """Every partitioned topic's partitioning state (``topic_partitioning``)."""
    return "/routing/partitioning/"


def topic_partitioning(topic: str) -> str:
    """A partitioned topic's PartitioningState JSON (danube.routing.repartition.model)."""
    ns, name = split_topic(topic)
    return f"/routing/partitioning/{ns}/{name}"


def routing_adoption_prefix() -> str:
    """Every broker's adoption label (``routing_adoption``)."""
    return "/routing/adoption/"


def routing_adoption(broker_id: str) -> str:
    """A broker's lowest topology generation acked by its push-capable connections (JSON)."""
    return f"/routing/adoption/{check_name('broker', broker_id)}"


# ---------------------------------------------------------------- terminated topics (docs/broker.md)


def topic_terminated(topic: str) -> str:
    """The topic was terminated (sealed for good): the broker reads it when it opens the topic and
    refuses every publish from then on (a scalable topic's replaced segment, a retired partition)."""
    return f"{topic_root(topic)}/terminated"

"""Counters the broker keeps and the hook the metrics exporter plugs into.

The broker never imports prometheus; ``danube.server.metrics`` implements
:class:`MetricsSink` and the broker calls it once per commit or batch, never per message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The publish latency histogram's upper bounds (ms); a last bucket catches the rest (+Inf).
LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 250, 500, 1000, 5000)


class MetricsSink:
    """No-op sink; the server replaces it with Prometheus counters."""

    def published(self, topic: str, count: int, nbytes: int, latency_ms: float) -> None: ...

    def published_counts(self, topic: str) -> list | None:
        """The topic's ``[messages, bytes, latency sum (ms), then one count per latency bucket of
        LATENCY_BUCKETS_MS, +Inf last]``, a list the broker adds to in place once per commit
        instead of calling :meth:`published` per batch (it asks once, when the topic is opened).
        None: it calls :meth:`published` (a sink that overrides only that); this no-op sink
        gives a row nobody reads."""
        if type(self).published is not MetricsSink.published:
            return None
        return [0, 0, 0.0] + [0] * (len(LATENCY_BUCKETS_MS) + 1)

    def delivered(self, topic: str, subscription: str, count: int, nbytes: int) -> None: ...

    def acked(self, topic: str, subscription: str, count: int) -> None: ...

    def subscription_counts(self, topic: str, subscription: str) -> list[int] | None:
        """The subscription's ``[messages delivered, bytes delivered, messages acked]``, a list the
        broker adds to in place instead of calling :meth:`delivered` and :meth:`acked` (it asks
        once, when the subscription is made); None (this sink): it calls them."""
        return None

    def redelivered(self, topic: str, subscription: str, count: int) -> None: ...

    def dropped(self, topic: str, subscription: str, count: int, reason: str) -> None: ...

    def topic_opened(self, topic: str) -> None: ...

    def topic_closed(self, topic: str) -> None: ...


@dataclass
class SubscriptionStats:
    name: str
    sub_type: str
    consumers: int
    cursor: int
    unacked: int
    backlog: int


@dataclass
class TopicStats:
    """One topic's counters (``messages_in``/``bytes_in`` are cumulative since the topic was loaded).

    The ``*_total`` / ``*_count`` / ``backlog_messages`` names are what the load reporter reads
    (docs/internals.md, "Load reports")."""

    name: str
    reliable: bool
    messages_in: int
    bytes_in: int
    next_offset: int
    producers: int
    consumers: int
    subscriptions: list[SubscriptionStats] = field(default_factory=list)

    @property
    def backlog_messages(self) -> int:
        return sum(s.backlog for s in self.subscriptions)

    @property
    def messages_in_total(self) -> int:
        return self.messages_in

    @property
    def bytes_in_total(self) -> int:
        return self.bytes_in

    @property
    def producer_count(self) -> int:
        return self.producers

    @property
    def consumer_count(self) -> int:
        return self.consumers

    @property
    def subscription_count(self) -> int:
        return len(self.subscriptions)


@dataclass
class BrokerStats:
    broker_url: str
    topics: dict[str, TopicStats]  # topic name -> its stats

    @property
    def total_messages_in(self) -> int:
        return sum(t.messages_in for t in self.topics.values())

"""Prometheus metrics with Danube's names, served on the metrics port (9040 by default).

Counters are bumped once per commit or batch by the broker (``MetricsSink``); gauges
about topics, subscriptions and WALs are read from the broker at scrape time.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from danube.broker.stats import LATENCY_BUCKETS_MS, MetricsSink
from danube.server.rpc_counts import RpcCounts

log = logging.getLogger(__name__)

METRIC_NAMES = [
    "danube_topic_messages_in_total",
    "danube_topic_bytes_in_total",
    "danube_producer_send_latency_ms",
    "danube_consumer_messages_out_total",
    "danube_consumer_bytes_out_total",
    "danube_subscription_acks_total",
    "danube_subscription_redeliveries_total",
    "danube_subscription_dropped_total",
    "danube_broker_topics_owned",
    "danube_topic_producers",
    "danube_topic_consumers",
    "danube_subscription_backlog_messages",
    "danube_subscription_unacked_messages",
    "danube_wal_next_offset",
    "danube_wal_durable_offset",
    "danube_wal_first_offset",
    "danube_broker_rpc_total",
    "danube_wal_flush_total",
    "danube_wal_flush_latency_ms",
    "danube_wal_sync_rounds_total",
    "danube_wal_sync_round_latency_ms",
]


class PrometheusMetrics(MetricsSink):
    """The hot counters (published, delivered, acked: once per call on the broker's event loop) are
    plain integers in per-topic and per-subscription lists, read when Prometheus scrapes
    (``_CounterCollector``): a ``prometheus_client`` child takes a lock per ``inc`` and walks its
    buckets in Python per ``observe``, several times per 2-message call.  Like a labelled
    ``Counter`` child, a topic's or subscription's counts stay once created."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.redeliveries = Counter(
            "danube_subscription_redeliveries_total", "Messages redelivered", ["topic", "subscription"], registry=r
        )
        self._dropped = Counter(
            "danube_subscription_dropped_total",
            "Messages a subscription gave up on (poison policy, evicted history)",
            ["topic", "subscription", "reason"],
            registry=r,
        )
        # topic -> [messages, bytes, latency sum, then one count per latency bucket (+Inf last)]
        self._published: dict[str, list] = {}
        # topic -> subscription -> [messages out, bytes out, acked]
        self._subscriptions: dict[str, dict[str, list[int]]] = {}
        self.rpc = RpcCounts()  # the servers count every call they answer (danube.server.rpc_counts)
        self._broker = None
        self._cluster_broker_id: str | None = None
        self._cluster_topics_owned: Callable[[], Mapping[str, float]] | None = None
        r.register(_CounterCollector(self))
        r.register(_BrokerCollector(self))

    def attach(self, broker) -> None:
        self._broker = broker

    def label_topics_owned(self, broker_id: str, others: Callable[[], Mapping[str, float]] | None = None) -> None:
        """Cluster mode: ``danube_broker_topics_owned`` gets a ``broker_id`` label.  This broker's own
        sample is what it serves now; ``others()`` adds the other brokers' counts (the leader's
        rebalancing metrics, from the cluster's assignments: ``danube.cluster.rebalancing.metrics``),
        so the leader's registry holds the per-broker gauge of Danube's load manager without a second family."""
        self._cluster_broker_id = str(broker_id)
        self._cluster_topics_owned = others

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
        log.info("Prometheus metrics on http://%s:%d/metrics", host, port)

    # ------------------------------------------------------------ MetricsSink

    def published_counts(self, topic: str) -> list:
        # (a row stays once made, so the topic's commit queue may keep it)
        row = self._published.get(topic)
        if row is None:
            row = self._published[topic] = [0, 0, 0.0] + [0] * (len(LATENCY_BUCKETS_MS) + 1)
        return row

    def published(self, topic: str, count: int, nbytes: int, latency_ms: float) -> None:
        row = self._published.get(topic)
        if row is None:
            row = self.published_counts(topic)
        row[0] += count
        row[1] += nbytes
        row[2] += latency_ms
        row[3 + bisect_left(LATENCY_BUCKETS_MS, latency_ms)] += 1

    def _subscription(self, topic: str, subscription: str) -> list[int]:
        subs = self._subscriptions.get(topic)
        if subs is None:
            subs = self._subscriptions[topic] = {}
        row = subs.get(subscription)
        if row is None:
            row = subs[subscription] = [0, 0, 0]
        return row

    def delivered(self, topic: str, subscription: str, count: int, nbytes: int) -> None:
        subs = self._subscriptions.get(topic)
        row = subs.get(subscription) if subs is not None else None
        if row is None:
            row = self._subscription(topic, subscription)
        row[0] += count
        row[1] += nbytes

    def subscription_counts(self, topic: str, subscription: str) -> list[int]:
        # (a row stays once made, so the subscription may keep it)
        return self._subscription(topic, subscription)

    def acked(self, topic: str, subscription: str, count: int) -> None:
        subs = self._subscriptions.get(topic)
        row = subs.get(subscription) if subs is not None else None
        if row is None:
            row = self._subscription(topic, subscription)
        row[2] += count

    def redelivered(self, topic: str, subscription: str, count: int) -> None:
        self.redeliveries.labels(topic, subscription).inc(count)

    def dropped(self, topic: str, subscription: str, count: int, reason: str) -> None:
        self._dropped.labels(topic, subscription, reason).inc(count)


class _CounterCollector:
    """The hot counters of :class:`PrometheusMetrics`, as Prometheus families when it scrapes
    (on the exporter's thread: each list is copied in one C call, never half-updated)."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def collect(self):
        metrics = self._metrics
        messages_in = CounterMetricFamily("danube_topic_messages_in", "Messages published to a topic", labels=["topic"])
        bytes_in = CounterMetricFamily("danube_topic_bytes_in", "Bytes (frames) published to a topic", labels=["topic"])
        latency = HistogramMetricFamily(
            "danube_producer_send_latency_ms", "Publish latency from receipt to durable append (ms)", labels=["topic"]
        )
        for topic, row in list(metrics._published.items()):
            row = list(row)
            messages_in.add_metric([topic], row[0])
            bytes_in.add_metric([topic], row[1])
            buckets, total = [], 0
            for bound, n in zip(LATENCY_BUCKETS_MS + (float("inf"),), row[3:]):
                total += n
                buckets.append((floatToGoString(bound), total))
            latency.add_metric([topic], buckets, row[2])
        messages_out = CounterMetricFamily(
            "danube_consumer_messages_out", "Messages delivered to consumers", labels=["topic", "subscription"]
        )
        bytes_out = CounterMetricFamily(
            "danube_consumer_bytes_out", "Bytes delivered to consumers", labels=["topic", "subscription"]
        )
        acks = CounterMetricFamily("danube_subscription_acks", "Messages acked", labels=["topic", "subscription"])
        for topic, subs in list(metrics._subscriptions.items()):
            for name, row in list(subs.items()):
                row = list(row)
                messages_out.add_metric([topic, name], row[0])
                bytes_out.add_metric([topic, name], row[1])
                acks.add_metric([topic, name], row[2])
        yield from (messages_in, bytes_in, latency, messages_out, bytes_out, acks)


class _BrokerCollector:
    """Gauges read from the broker when Prometheus scrapes."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def collect(self):
        metrics = self._metrics
        broker = metrics._broker
        cluster_id = metrics._cluster_broker_id
        owned = (
            GaugeMetricFamily("danube_broker_topics_owned", "Topics served by this broker")
            if cluster_id is None
            else GaugeMetricFamily(
                "danube_broker_topics_owned",
                "Topics per broker: this broker's, and on the cluster leader every active broker's assignments",
                labels=["broker_id"],
            )
        )
        producers = GaugeMetricFamily("danube_topic_producers", "Producers per topic", labels=["topic"])
        consumers = GaugeMetricFamily("danube_topic_consumers", "Connected consumers per topic", labels=["topic"])
        backlog = GaugeMetricFamily(
            "danube_subscription_backlog_messages", "Messages not yet acked", labels=["topic", "subscription"]
        )
        unacked = GaugeMetricFamily(
            "danube_subscription_unacked_messages", "Delivered, not yet acked", labels=["topic", "subscription"]
        )
        wal_next = GaugeMetricFamily("danube_wal_next_offset", "Next offset the topic's WAL assigns", labels=["topic"])
        wal_first = GaugeMetricFamily("danube_wal_first_offset", "Oldest readable offset", labels=["topic"])
        wal_durable = GaugeMetricFamily(
            "danube_wal_durable_offset", "Highest offset covered by the sync policy", labels=["topic"]
        )
        if cluster_id is not None:
            counts = dict(metrics._cluster_topics_owned() or {}) if metrics._cluster_topics_owned else {}
            if broker is not None:  # its assigned topics, as the leader counts the others (not the
                # broker-local system topics such as its /system/load_reports)
                counts[cluster_id] = sum(1 for name in broker.topics if not name.startswith("/system/"))
            for broker_id in sorted(counts):
                owned.add_metric([broker_id], counts[broker_id])
        if broker is not None:
            topics = list(broker.topics.values())
            if cluster_id is None:
                owned.add_metric([], len(topics))
            for t in topics:
                st = t.stats()
                producers.add_metric([t.name], st.producers)
                consumers.add_metric([t.name], st.consumers)
                for s in st.subscriptions:
                    backlog.add_metric([t.name, s.name], s.backlog)
                    unacked.add_metric([t.name, s.name], s.unacked)
                if t.reliable:
                    wal_next.add_metric([t.name], t.storage.next_offset)
                    wal_first.add_metric([t.name], t.storage.first_offset)
                    wal = getattr(t.storage, "wal", None)
                    durable = getattr(wal, "durable_offset", None)
                    if isinstance(durable, int):
                        wal_durable.add_metric([t.name], durable)
        yield from (owned, producers, consumers, backlog, unacked, wal_next, wal_first, wal_durable)
        yield from _rpc_families(metrics.rpc)
        yield from _wal_sync_families(topics if broker is not None else [])


def _rpc_families(rpc: RpcCounts):
    family = CounterMetricFamily(
        "danube_broker_rpc_total",
        "Calls answered, by service, method, result (ok|error) and gRPC status code",
        labels=["service", "method", "result", "code"],
    )
    for service, method, result, code, count in sorted(rpc.samples()):
        family.add_metric([service, method, result, code], count)
    yield family


def _histogram(family: HistogramMetricFamily, labels: list[str], latency) -> None:
    buckets = [(("+Inf" if bound == float("inf") else repr(bound)), n) for bound, n in latency.cumulative()]
    family.add_metric(labels, buckets, latency.sum_ms)


def _wal_sync_families(topics):
    """Per topic: its WAL's syncs (fdatasync or its share of a syncfs) and how long each took; per
    process sync group (docs/wal.md, "Group commit across logs"): its rounds and their length."""
    from danube.wal.sync import process_sync_groups

    flushes = CounterMetricFamily(
        "danube_wal_flush_total", "Syncs that made a topic's WAL appends durable", labels=["topic"]
    )
    flush_ms = HistogramMetricFamily(
        "danube_wal_flush_latency_ms", "Length of each sync of a topic's WAL (ms)", labels=["topic"]
    )
    for t in topics:
        wal: Any = getattr(t.storage, "wal", None) if t.reliable else None  # has sync_count when it has a latency
        latency = getattr(wal, "flush_latency", None)
        if latency is None:
            continue
        flushes.add_metric([t.name], wal.sync_count)
        _histogram(flush_ms, [t.name], latency)
    rounds = CounterMetricFamily(
        "danube_wal_sync_rounds_total",
        "Group-commit rounds run (each syncs every WAL with appends to sync)",
        labels=["group"],
    )
    round_ms = HistogramMetricFamily(
        "danube_wal_sync_round_latency_ms",
        "Length of a group-commit round, its syncs to its waiters answered (ms)",
        labels=["group"],
    )
    for group in process_sync_groups():
        name = "syncfs" if group.syncfs_min_logs else "per_file"
        rounds.add_metric([name], group.rounds)
        _histogram(round_ms, [name], group.round_latency)
    yield from (flushes, flush_ms, rounds, round_ms)

"""Prometheus metrics of the load manager and the rebalancer (the names Danube's load manager uses).

Cluster health (gauges, set by every leader cycle)::

    danube_cluster_balance_cv  danube_cluster_balance_mean_load  danube_cluster_balance_max_load
    danube_cluster_balance_min_load  danube_cluster_balance_std_dev  danube_cluster_active_brokers

Rebalancing: ``danube_rebalancing_checks_total``, ``danube_rebalancing_moves_total``,
``danube_rebalancing_failures_total`` (counters), ``danube_rebalancing_cycle_duration_seconds``
(histogram).  Assignments: ``danube_topic_assignments_total{broker_id, action}`` with action
``assign`` / ``unassign`` (the load manager calls :meth:`RebalancingMetrics.assignment` for its own
assignments too).  Broker load (gauges per ``broker_id``, from the latest load reports):
``danube_broker_topics_owned``, ``danube_broker_cpu_usage``, ``danube_broker_memory_usage``,
``danube_broker_throughput_mbps``.

A broker's own metrics registry already exports ``danube_broker_topics_owned``: a cluster broker
(``danube.cluster.node``) shares its registry with ``topics_owned_gauge=False``: the per-broker
counts are then kept in :attr:`RebalancingMetrics.topics_owned_values` and the broker's collector
(``danube.server.metrics``) exports them in its own family, labelled ``broker_id``.
``broker_gauges=False`` leaves all four per-broker gauges out.
"""

from __future__ import annotations

from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from danube.cluster import scoring

METRIC_NAMES = [
    "danube_cluster_balance_cv",
    "danube_cluster_balance_mean_load",
    "danube_cluster_balance_max_load",
    "danube_cluster_balance_min_load",
    "danube_cluster_balance_std_dev",
    "danube_cluster_active_brokers",
    "danube_rebalancing_checks_total",
    "danube_rebalancing_moves_total",
    "danube_rebalancing_failures_total",
    "danube_rebalancing_cycle_duration_seconds",
    "danube_topic_assignments_total",
    "danube_broker_topics_owned",
    "danube_broker_cpu_usage",
    "danube_broker_memory_usage",
    "danube_broker_throughput_mbps",
]


class RebalancingMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, *, broker_gauges: bool = True, topics_owned_gauge: bool = True
    ) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.cv = Gauge(
            "danube_cluster_balance_cv", "Coefficient of variation of the active brokers' loads", registry=r
        )
        self.mean_load = Gauge("danube_cluster_balance_mean_load", "Mean broker load", registry=r)
        self.max_load = Gauge("danube_cluster_balance_max_load", "Max broker load", registry=r)
        self.min_load = Gauge("danube_cluster_balance_min_load", "Min broker load", registry=r)
        self.std_dev = Gauge("danube_cluster_balance_std_dev", "Standard deviation of the broker loads", registry=r)
        self.active_brokers = Gauge("danube_cluster_active_brokers", "Active brokers", registry=r)
        self.checks = Counter(
            "danube_rebalancing_checks_total", "Rebalancing check cycles run by the leader", registry=r
        )
        self.moves = Counter("danube_rebalancing_moves_total", "Topic moves executed by the rebalancer", registry=r)
        self.failures = Counter("danube_rebalancing_failures_total", "Failed rebalancing move attempts", registry=r)
        self.cycle_duration = Histogram(
            "danube_rebalancing_cycle_duration_seconds",
            "Duration of a rebalancing cycle",
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.assignments = Counter(
            "danube_topic_assignments_total", "Topic assignments", ["broker_id", "action"], registry=r
        )
        self.broker_gauges = broker_gauges
        self.topics_owned: Gauge | None = None
        # broker id → topics it owns, from the latest leader cycle (also without the gauge)
        self.topics_owned_values: dict[str, float] = {}
        if broker_gauges:
            if topics_owned_gauge:
                self.topics_owned = Gauge("danube_broker_topics_owned", "Topics per broker", ["broker_id"], registry=r)
            self.cpu_usage = Gauge("danube_broker_cpu_usage", "CPU usage %", ["broker_id"], registry=r)
            self.memory_usage = Gauge("danube_broker_memory_usage", "Memory usage %", ["broker_id"], registry=r)
            self.throughput = Gauge(
                "danube_broker_throughput_mbps", "Aggregate throughput (MB/s)", ["broker_id"], registry=r
            )
        self._known_brokers: set[str] = set()

    def balance(self, balance: Any) -> None:
        self.cv.set(balance.cv)
        self.mean_load.set(balance.mean)
        self.max_load.set(balance.max_load)
        self.min_load.set(balance.min_load)
        self.std_dev.set(balance.std_dev)
        self.active_brokers.set(balance.active_brokers)

    def brokers(self, reports: Mapping[str, Any], topics_owned: Mapping[str, int] | None = None) -> None:
        """Per-broker gauges from the latest reports; brokers no longer present are removed."""
        if not self.broker_gauges:
            return
        current = set(map(str, reports))
        self._remove(self._known_brokers - current)
        owned_values = {}
        for broker, report in reports.items():
            broker = str(broker)
            owned = (topics_owned or {}).get(broker)
            if owned is None:
                owned = len(scoring._get(report, "topics", ()) or ())
            owned_values[broker] = float(owned)
            if self.topics_owned is not None:
                self.topics_owned.labels(broker).set(owned)
            self.cpu_usage.labels(broker).set(scoring.resource_usage(report, scoring.CPU))
            self.memory_usage.labels(broker).set(scoring.resource_usage(report, scoring.MEMORY))
            self.throughput.labels(broker).set(float(scoring._get(report, "total_throughput_mbps", 0.0) or 0.0))
        self.topics_owned_values = owned_values
        self._known_brokers = current

    def forget_brokers(self) -> None:
        """No longer the leader: drop the per-broker gauges (they would go stale)."""
        if self._known_brokers:
            self._remove(self._known_brokers)
            self._known_brokers = set()
        self.topics_owned_values = {}

    def _remove(self, brokers) -> None:
        for broker in brokers:
            for gauge in (self.topics_owned, self.cpu_usage, self.memory_usage, self.throughput):
                if gauge is None:
                    continue
                try:
                    gauge.remove(broker)
                except KeyError:
                    pass

    def assignment(self, broker_id: str, action: str, count: int = 1) -> None:
        if count > 0:
            self.assignments.labels(str(broker_id), action).inc(count)

"""Cluster balance over the active brokers: loads, mean / std / CV, classification, topic estimates.

The broker load is the ranking score of the configured assignment strategy
(:func:`danube.cluster.scoring.broker_scores`), computed over the **active**
brokers only (draining and drained brokers, and brokers that have not reported
yet, are left out).  The statistics are scoring's: population mean and standard
deviation, CV = std / mean; overloaded = load > mean + std, underloaded =
load < mean − std and load < mean / 2.

To plan several moves ahead the planner needs what one topic contributes to its
broker's load.  The estimate (also written to the history as
``estimated_load``): under ``fair`` (and ``balanced`` when no broker reports CPU
or memory) every topic is worth 1; otherwise the broker's score is shared among
its topics in proportion to each topic's own weighted load
``0.2 + 0.3·MB/s + 0.3·connections + 0.2·backlog/10000``.  A move then takes the
topic's estimate from its source and adds it to its target, so the total (and
the mean) is unchanged.

Reports lag behind the assignments (a report is at most one interval old), so
:func:`build_state` reconciles them: a topic the metadata says moved since the
report is taken off its old broker's load and added to its new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping, NamedTuple

from danube.cluster import scoring
from danube.cluster.scoring import _get


class TopicInfo(NamedTuple):
    name: str
    move_score: float  # scoring.topic_load_score: the "lightest first" order
    estimated_load: float  # what the topic adds to its broker's load (see the module docstring)


@dataclass(frozen=True)
class ClusterBalance:
    mean: float
    std_dev: float
    cv: float
    max_load: float
    min_load: float
    active_brokers: int
    loads: Mapping[str, float] = field(default_factory=dict)
    overloaded: tuple = ()  # most loaded first
    underloaded: tuple = ()  # least loaded first

    def needs_rebalancing(self, threshold: float) -> bool:
        return self.active_brokers >= 2 and self.cv >= threshold

    def to_dict(self) -> dict:
        return {
            "cv": self.cv,
            "mean_load": self.mean,
            "std_dev": self.std_dev,
            "max_load": self.max_load,
            "min_load": self.min_load,
            "active_brokers": self.active_brokers,
            "loads": dict(sorted(self.loads.items())),
            "overloaded": list(self.overloaded),
            "underloaded": list(self.underloaded),
        }


def compute_balance(loads: Mapping[str, float]) -> ClusterBalance:
    """Mean, std, CV, max, min and the overloaded / underloaded brokers of ``loads``."""
    stats = scoring.imbalance(loads)
    return ClusterBalance(
        stats.mean,
        stats.std,
        stats.cv,
        stats.max,
        stats.min,
        len(loads),
        dict(loads),
        stats.overloaded,
        stats.underloaded,
    )


def sources(balance: ClusterBalance, *, fallback_above_mean: bool = True) -> tuple:
    """Brokers that give up topics: the overloaded ones (Danube's rule), most loaded first.

    When several brokers share the top load no broker is above mean + std
    (3 brokers at 100, 2 new ones at 0: mean 60, std 49), and Danube's rule
    would never move anything; then every broker above the mean is a source.
    """
    if balance.overloaded or not fallback_above_mean:
        return balance.overloaded
    ranked = scoring.rank(balance.loads)
    return tuple(b for b, v in reversed(ranked) if v > balance.mean)


def _fields(topic: Any) -> tuple[str, float, float, int, float]:
    """(name, MB/s, byte_rate, connections, backlog) of a topic load, read once."""
    if type(topic) is not dict:
        try:
            return (
                topic.topic_name,
                float(topic.byte_rate_mbps or 0.0),
                float(topic.byte_rate or 0),
                int(topic.producer_count or 0) + int(topic.consumer_count or 0),
                float(topic.backlog_messages or 0),
            )
        except AttributeError:
            pass
    return (
        _get(topic, "topic_name", ""),
        float(_get(topic, "byte_rate_mbps", 0.0) or 0.0),
        float(_get(topic, "byte_rate", 0) or 0),
        int(_get(topic, "producer_count", 0) or 0) + int(_get(topic, "consumer_count", 0) or 0),
        float(_get(topic, "backlog_messages", 0) or 0),
    )


def _topic_weight(mbps: float, connections: int, backlog: float) -> float:
    """One topic's weighted load: 0.2 + 0.3·MB/s + 0.3·connections + 0.2·backlog / 10000
    (``scoring.weighted_topic_load`` of the topic alone)."""
    return 0.2 + mbps * 0.3 + connections * 0.3 + backlog / 10_000.0 * 0.2


def _counts_only(strategy: str, reports: Collection[Any]) -> bool:
    if strategy == "fair":
        return True
    if strategy == "balanced":
        return not any(
            scoring.resource_usage(r, scoring.CPU) > 0.0 or scoring.resource_usage(r, scoring.MEMORY) > 0.0
            for r in reports
        )
    return False


@dataclass
class ClusterState:
    """What one rebalancing decision sees: the active brokers' loads and the topics they own."""

    loads: dict[str, float]
    topics: dict[str, dict[str, TopicInfo]]  # broker → topic name → info (metadata assignments)

    def balance(self) -> ClusterBalance:
        return compute_balance(self.loads)


def build_state(
    strategy: str,
    reports: Mapping[str, Any],
    active: Iterable[str],
    assignments: Mapping[str, Iterable[str]] | None = None,
) -> ClusterState:
    """Loads and topics of the active brokers that have a report.

    ``reports``: broker id → its latest LoadReport; ``assignments``: broker id →
    topics the metadata assigns to it (default: the topics of its report).
    """
    active_ids = [b for b in active if b in reports]
    active_reports = [reports[b] for b in active_ids]
    scores = scoring.broker_scores(strategy, active_reports) if active_reports else {}
    scores = {str(b): float(v) for b, v in scores.items()}
    counts_only = _counts_only(strategy, active_reports)
    new_topic_load = 1.0 if counts_only else (0.3 * 0.2 if strategy == "balanced" else 0.0)

    # own[b]: the topics of b's report as b saw them; newest: the newest report naming each topic
    own: dict[str, dict[str, TopicInfo]] = {}
    newest: dict[str, tuple[float, TopicInfo]] = {}
    for broker in active_ids:
        report = reports[broker]
        fields = [_fields(t) for t in (_get(report, "topics", ()) or ())]
        weights = [_topic_weight(mbps, conn, backlog) for _n, mbps, _r, conn, backlog in fields]
        total_weight = sum(weights)
        score = scores.get(broker, 0.0)
        stamp = float(_get(report, "timestamp", 0) or 0)
        mine = own[broker] = {}
        for (name, _mbps, byte_rate, conn, backlog), w in zip(fields, weights):
            est = 1.0 if counts_only else (score * w / total_weight if total_weight > 0 else 0.0)
            # scoring.topic_load_score: 0.5·MB/s + 0.3·connections + 0.2·backlog / 10000
            move_score = byte_rate / 1_000_000.0 * 0.5 + conn * 0.3 + backlog / 10_000.0 * 0.2
            ti = mine[name] = TopicInfo(name, move_score, est)
            previous = newest.get(name)
            if previous is None or previous[0] <= stamp:
                newest[name] = (stamp, ti)

    loads = dict(scores)
    if assignments is None:
        return ClusterState(loads, own)

    assigned_to: dict[str, str] = {}
    for broker in active_ids:
        for name in assignments.get(broker, ()) or ():
            assigned_to[name] = broker
    by_broker: dict[str, dict[str, TopicInfo]] = {b: {} for b in active_ids}
    for broker in active_ids:
        for name, reported in own[broker].items():
            if assigned_to.get(name) != broker:
                loads[broker] -= reported.estimated_load  # left since the report
    for name, broker in assigned_to.items():
        info = own[broker].get(name)
        if info is None:  # arrived since the report (or never reported: a new topic)
            entry = newest.get(name)
            info = entry[1] if entry is not None else TopicInfo(name, 0.0, new_topic_load)
            loads[broker] += info.estimated_load
        by_broker[broker][name] = info
    for broker in loads:
        if loads[broker] < 0.0:
            loads[broker] = 0.0
    return ClusterState(loads, by_broker)

"""Load scoring: broker rankings, topic load score, imbalance statistics, rebalance move proposal.

Pure functions only (no I/O, no broker imports): the broker's load manager and
the Spark ``load-stats`` job both call this module, so every formula lives in
exactly one place.  The formulas follow Danube's load manager as its broker codes them (its
rankings and rebalancing modules), with
one deliberate difference: scores stay floats instead of being truncated to
integers, so brokers whose loads differ by less than one unit still rank apart.

Inputs are duck-typed so a :class:`danube.cluster.load_report.LoadReport`, a
test double or a row object all work:

- a *report* has ``broker_id``, ``topics`` (a sequence of topic loads),
  ``resources_usage`` (a sequence of items with ``resource`` in
  ``"CPU" | "Memory" | "DiskIO" | "NetworkIO"`` and ``usage``) and
  ``total_throughput_mbps``;
- a *topic load* has ``topic_name``, ``byte_rate`` (bytes/s),
  ``byte_rate_mbps`` (MB/s, byte_rate / 1e6), ``producer_count``,
  ``consumer_count`` and ``backlog_messages``.

Formulas
--------
weighted topic load (of a broker's topics; 0 for none)
    0.2·count + 0.3·Σ byte_rate_mbps + 0.3·Σ (producers + consumers) + 0.2·Σ backlog / 10000
fair
    topic count
balanced
    0.3·weighted topic load + 0.35·CPU % + 0.35·memory %; when no broker reports a
    positive CPU or memory usage every broker falls back to its topic count
weighted_load
    each metric normalised by its cluster maximum (the maximum starts at 1.0, so
    tiny absolute values are not blown up); ``max_util`` is the largest of the
    CPU, memory, disk, network, throughput and topic-load utilisations. If
    ``max_util > 0.7`` the bottleneck gets weight 0.5, checked in this order:
    CPU (cpu .5 mem .2 thr .15 topic .15), memory (mem .5 cpu .2 thr .15 topic .15),
    throughput (thr .5 net .2 cpu .15 mem .15), network (net .5 thr .2 cpu .15 mem .15),
    otherwise topic load or disk (topic .5 cpu .2 mem .2 thr .1). Below that:
    .25 topic + .25 cpu + .25 mem + .15 thr + .1 net.
topic move score
    0.5·byte_rate / 1e6 + 0.3·(producers + consumers) + 0.2·backlog / 10000
imbalance
    population mean and standard deviation of the broker scores,
    CV = std / mean (0 when the mean is 0); overloaded: score > mean + std;
    underloaded: score < mean − std and score < 0.5·mean.
rebalancing
    needed when CV ≥ threshold (0.40 conservative, 0.30 balanced, 0.20 aggressive)
    and at least ``min_brokers`` brokers are active. One move per cycle: the most
    loaded overloaded broker that has an eligible topic gives up its lightest
    eligible topic (by move score; blacklist entries are exact names or prefixes
    ending in ``*`` such as ``/ns/*``) to the least loaded other eligible broker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping as _AbcMapping
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping, Sequence

STRATEGIES = ("fair", "balanced", "weighted_load")
AGGRESSIVENESS_THRESHOLDS = {"conservative": 0.40, "balanced": 0.30, "aggressive": 0.20}
BOTTLENECK_UTILISATION = 0.7

CPU = "CPU"
MEMORY = "Memory"
DISK_IO = "DiskIO"
NETWORK_IO = "NetworkIO"


# ---------------------------------------------------------------- report accessors

_MISSING = object()


def _get(obj: Any, name: str, default: Any = 0) -> Any:
    # attribute first: the common case (LoadReport, TopicLoad, rows) skips the Mapping check, which
    # costs more than the read; the field names here are never attributes of a mapping (get, items, ...)
    value = getattr(obj, name, _MISSING)
    if value is not _MISSING:
        return value
    if isinstance(obj, _AbcMapping):  # collections.abc: the ABC caches the answer per type (typing's does not)
        return obj.get(name, default)
    return default


def resource_usage(report: Any, resource: str) -> float:
    """The report's usage of ``resource`` (0.0 when not reported; the last entry wins)."""
    value = 0.0
    for item in _get(report, "resources_usage", ()) or ():
        if _get(item, "resource", None) == resource:
            value = float(_get(item, "usage", 0.0) or 0.0)
    return value


def _topics(report: Any) -> Sequence[Any]:
    return _get(report, "topics", ()) or ()


def _connections(topic: Any) -> int:
    return int(_get(topic, "producer_count", 0) or 0) + int(_get(topic, "consumer_count", 0) or 0)


# ---------------------------------------------------------------- per-topic and per-broker scores


def weighted_topic_load(topics: Sequence[Any]) -> float:
    """0.2·count + 0.3·Σ MB/s + 0.3·Σ connections + 0.2·Σ backlog / 10000 (0 for no topics)."""
    if not topics:
        return 0.0
    mbps = sum(float(_get(t, "byte_rate_mbps", 0.0) or 0.0) for t in topics)
    connections = sum(_connections(t) for t in topics)
    backlog = sum(float(_get(t, "backlog_messages", 0) or 0) for t in topics)
    return len(topics) * 0.2 + mbps * 0.3 + connections * 0.3 + backlog / 10_000.0 * 0.2


def topic_load_score(topic: Any) -> float:
    """Move score of one topic: 0.5·MB/s + 0.3·connections + 0.2·backlog / 10000."""
    mb_per_s = float(_get(topic, "byte_rate", 0) or 0) / 1_000_000.0
    backlog = float(_get(topic, "backlog_messages", 0) or 0)
    return mb_per_s * 0.5 + _connections(topic) * 0.3 + backlog / 10_000.0 * 0.2


def fair_scores(reports: Iterable[Any]) -> dict[Any, float]:
    return {_get(r, "broker_id", None): float(len(_topics(r))) for r in reports}


def balanced_scores(reports: Iterable[Any]) -> dict[Any, float]:
    reports = list(reports)
    has_resources = any(resource_usage(r, CPU) > 0.0 or resource_usage(r, MEMORY) > 0.0 for r in reports)
    if not has_resources:
        return fair_scores(reports)
    return {
        _get(r, "broker_id", None): weighted_topic_load(_topics(r)) * 0.3
        + resource_usage(r, CPU) * 0.35
        + resource_usage(r, MEMORY) * 0.35
        for r in reports
    }


def _ratio(value: float, maximum: float) -> float:
    return value / maximum if maximum > 0.0 else 0.0


def weighted_load_scores(reports: Iterable[Any]) -> dict[Any, float]:
    reports = list(reports)
    if not reports:
        return {}
    metrics = []
    for r in reports:
        metrics.append(
            {
                "cpu": resource_usage(r, CPU),
                "mem": resource_usage(r, MEMORY),
                "disk": resource_usage(r, DISK_IO),
                "net": resource_usage(r, NETWORK_IO),
                "thr": float(_get(r, "total_throughput_mbps", 0.0) or 0.0),
                "topic": weighted_topic_load(_topics(r)),
            }
        )
    maxima = {k: max([1.0] + [m[k] for m in metrics]) for k in ("cpu", "mem", "disk", "net", "thr", "topic")}
    scores: dict[Any, float] = {}
    for r, m in zip(reports, metrics):
        u = {k: _ratio(m[k], maxima[k]) for k in m}
        max_util = max(u.values())
        if max_util > BOTTLENECK_UTILISATION:
            if max_util == u["cpu"]:
                score = u["cpu"] * 0.5 + u["mem"] * 0.2 + u["thr"] * 0.15 + u["topic"] * 0.15
            elif max_util == u["mem"]:
                score = u["mem"] * 0.5 + u["cpu"] * 0.2 + u["thr"] * 0.15 + u["topic"] * 0.15
            elif max_util == u["thr"]:
                score = u["thr"] * 0.5 + u["net"] * 0.2 + u["cpu"] * 0.15 + u["mem"] * 0.15
            elif max_util == u["net"]:
                score = u["net"] * 0.5 + u["thr"] * 0.2 + u["cpu"] * 0.15 + u["mem"] * 0.15
            else:
                score = u["topic"] * 0.5 + u["cpu"] * 0.2 + u["mem"] * 0.2 + u["thr"] * 0.1
        else:
            score = u["topic"] * 0.25 + u["cpu"] * 0.25 + u["mem"] * 0.25 + u["thr"] * 0.15 + u["net"] * 0.1
        scores[_get(r, "broker_id", None)] = score
    return scores


_SCORERS = {"fair": fair_scores, "balanced": balanced_scores, "weighted_load": weighted_load_scores}


def broker_scores(strategy: str, reports: Iterable[Any]) -> dict[Any, float]:
    """Load score per broker id under ``strategy`` (lower = less loaded)."""
    try:
        scorer = _SCORERS[strategy]
    except KeyError:
        raise ValueError(f"unknown assignment strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}") from None
    return scorer(reports)


def rank(scores: Mapping[Any, float]) -> list[tuple[Any, float]]:
    """``(broker_id, score)`` ascending by score, ties broken by broker id (deterministic)."""
    return sorted(scores.items(), key=lambda item: (item[1], str(item[0])))


def rankings(strategy: str, reports: Iterable[Any]) -> list[tuple[Any, float]]:
    """The ranking ``strategy`` produces: least loaded broker first."""
    return rank(broker_scores(strategy, reports))


# ---------------------------------------------------------------- statistics


def mean(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    if max(values) == min(values):
        return float(values[0])  # exact, so equal loads are never "above the mean"
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float:
    """Population standard deviation (divides by n)."""
    if not values or max(values) == min(values):
        return 0.0  # exactly balanced, whatever the rounding of the mean
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population CV = std / mean; 0 when the mean is 0."""
    m = mean(values)
    return std(values) / m if m > 0.0 else 0.0


@dataclass(frozen=True)
class Imbalance:
    mean: float
    std: float
    cv: float
    max: float
    min: float
    overloaded: tuple = ()  # broker ids, most loaded first
    underloaded: tuple = ()  # broker ids, least loaded first

    def needs_rebalancing(self, threshold: float) -> bool:
        return self.cv >= threshold


def imbalance(scores: Mapping[Any, float]) -> Imbalance:
    """Mean, std, CV and the overloaded / underloaded brokers of a set of broker scores."""
    values = list(scores.values())
    if not values:
        return Imbalance(0.0, 0.0, 0.0, 0.0, 0.0)
    m, s = mean(values), std(values)
    ranked = rank(scores)
    over = tuple(b for b, v in reversed(ranked) if v > m + s)
    under = tuple(b for b, v in ranked if v < m - s and v < m * 0.5)
    return Imbalance(m, s, coefficient_of_variation(values), max(values), min(values), over, under)


def threshold_for(aggressiveness: str) -> float:
    try:
        return AGGRESSIVENESS_THRESHOLDS[aggressiveness]
    except KeyError:
        raise ValueError(
            f"unknown aggressiveness {aggressiveness!r}; expected one of {', '.join(AGGRESSIVENESS_THRESHOLDS)}"
        ) from None


# ---------------------------------------------------------------- rebalancing


def is_blacklisted(topic: str, patterns: Iterable[str]) -> bool:
    """Exact names, or prefixes written with a trailing ``*`` (``/system/*``, ``/ns/critical-*``)."""
    for pattern in patterns:
        if pattern.endswith("*"):
            if topic.startswith(pattern[:-1]):
                return True
        elif topic == pattern:
            return True
    return False


@dataclass(frozen=True)
class Move:
    topic: str
    from_broker: Any
    to_broker: Any
    topic_score: float
    cv: float
    reason: str = "LoadImbalance"


@dataclass(frozen=True)
class RebalancePolicy:
    threshold: float = AGGRESSIVENESS_THRESHOLDS["balanced"]
    blacklist: tuple = ()
    min_brokers: int = 2

    @classmethod
    def for_aggressiveness(cls, aggressiveness: str = "balanced", **kwargs) -> "RebalancePolicy":
        return cls(threshold=threshold_for(aggressiveness), **kwargs)


def propose_move(
    scores: Mapping[Any, float],
    topics_by_broker: Mapping[Any, Sequence[Any]],
    policy: RebalancePolicy = RebalancePolicy(),
    *,
    ineligible_topics: Collection[str] = (),
    eligible_targets: Collection[Any] | None = None,
) -> Move | None:
    """The single move a rebalancing cycle would make, or None.

    ``scores`` are the active brokers' load scores (one strategy); ``topics_by_broker``
    maps a broker id to its topic loads. ``ineligible_topics`` carries what the caller
    tracks over time (cooldown, minimum topic age); ``eligible_targets`` restricts the
    receiving brokers (e.g. those in state active), default every scored broker.
    """
    if len(scores) < max(policy.min_brokers, 2):
        return None
    stats = imbalance(scores)
    if not stats.needs_rebalancing(policy.threshold):
        return None
    ranked = rank(scores)
    for source in stats.overloaded:
        candidates = [
            t
            for t in topics_by_broker.get(source, ())
            if not is_blacklisted(_get(t, "topic_name", ""), policy.blacklist)
            and _get(t, "topic_name", "") not in ineligible_topics
        ]
        if not candidates:
            continue
        lightest = min(candidates, key=lambda t: (topic_load_score(t), _get(t, "topic_name", "")))
        for target, _score in ranked:
            if target == source or (eligible_targets is not None and target not in eligible_targets):
                continue
            return Move(_get(lightest, "topic_name", ""), source, target, topic_load_score(lightest), stats.cv)
        return None
    return None

"""danube.cluster.scoring against an independent plain-Python computation, plus properties."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.cluster import scoring
from danube.cluster.load_report import LoadReport, SystemLoad, TopicLoad


def topic(name, *, byte_rate=0, producers=0, consumers=0, backlog=0):
    return TopicLoad(
        topic_name=name,
        message_rate=0,
        byte_rate=byte_rate,
        byte_rate_mbps=byte_rate / 1e6,
        producer_count=producers,
        consumer_count=consumers,
        subscription_count=0,
        backlog_messages=backlog,
    )


def report(broker, topics=(), cpu=None, mem=None, disk=None, net=None):
    resources = []
    for name, value in (("CPU", cpu), ("Memory", mem), ("DiskIO", disk), ("NetworkIO", net)):
        if value is not None:
            resources.append(SystemLoad(name, value))
    topics = list(topics)
    return LoadReport(
        resources_usage=resources,
        topics=topics,
        total_throughput_mbps=sum(t.byte_rate_mbps for t in topics),
        timestamp=0,
        broker_id=broker,
    )


# ---------------------------------------------------------------- worked examples (hand computed)


def test_balanced_matches_danube_worked_example():
    # Danube's own test: topic_load = 10 × 0.2 = 2; score = 2×0.3 + 50×0.35 + 30×0.35 = 28.6
    reports = [
        report("1", [topic(f"/d/t{i}") for i in range(10)], cpu=50.0, mem=30.0),
        report("2", [topic(f"/d/t{i}") for i in range(5)], cpu=20.0, mem=20.0),
        report("3", [topic(f"/d/t{i}") for i in range(2)], cpu=10.0, mem=10.0),
    ]
    ranked = scoring.rankings("balanced", reports)
    assert [b for b, _ in ranked] == ["3", "2", "1"]
    assert [round(s, 6) for _, s in ranked] == [7.12, 14.3, 28.6]


def test_balanced_falls_back_to_topic_count_without_resources():
    reports = [report("a", [topic("/d/x"), topic("/d/y")]), report("b", [topic("/d/z")], cpu=0.0, mem=0.0)]
    assert scoring.broker_scores("balanced", reports) == {"a": 2.0, "b": 1.0}


def test_danubes_imbalance_example():
    # docs example: loads 45, 30, 25 → mean 33.33, std 8.50, CV 0.255; broker 1 overloaded, none underloaded
    stats = scoring.imbalance({"1": 45.0, "2": 30.0, "3": 25.0})
    assert stats.mean == pytest.approx(33.3333, abs=1e-3)
    assert stats.std == pytest.approx(8.4984, abs=1e-3)
    assert stats.cv == pytest.approx(0.255, abs=1e-3)
    assert stats.overloaded == ("1",)
    assert stats.underloaded == ()
    assert stats.needs_rebalancing(0.20) and not stats.needs_rebalancing(0.30)


def test_topic_load_score_weights():
    t = topic("/d/t", byte_rate=2_000_000, producers=1, consumers=2, backlog=50_000)
    assert scoring.topic_load_score(t) == pytest.approx(0.5 * 2 + 0.3 * 3 + 0.2 * 5)


def test_weighted_load_bottleneck_branches():
    # broker a: CPU 90 is the cluster max → util 1.0 > 0.7 → CPU bottleneck weights
    reports = [report("a", cpu=90.0, mem=10.0), report("b", cpu=45.0, mem=40.0)]
    scores = scoring.weighted_load_scores(reports)
    # maxima: cpu 90, mem 40, thr 1 (floor), topic 1 (floor)
    assert scores["a"] == pytest.approx(1.0 * 0.5 + 0.25 * 0.2)
    # b: cpu 0.5, mem 1.0 → memory bottleneck
    assert scores["b"] == pytest.approx(1.0 * 0.5 + 0.5 * 0.2)


def test_weighted_load_without_bottleneck_uses_even_weights():
    # values below the 1.0 floor of every maximum keep every utilisation ≤ 0.7
    reports = [report("a", cpu=0.5, mem=0.2, net=0.1), report("b", cpu=0.3, mem=0.6)]
    scores = scoring.weighted_load_scores(reports)
    assert scores["a"] == pytest.approx(0.25 * 0.5 + 0.25 * 0.2 + 0.1 * 0.1)
    assert scores["b"] == pytest.approx(0.25 * 0.3 + 0.25 * 0.6)


def test_unknown_strategy_and_aggressiveness_are_clear_errors():
    with pytest.raises(ValueError, match="unknown assignment strategy 'round_robin'"):
        scoring.broker_scores("round_robin", [])
    with pytest.raises(ValueError, match="unknown aggressiveness"):
        scoring.threshold_for("reckless")
    assert scoring.threshold_for("conservative") == 0.40
    assert scoring.threshold_for("balanced") == 0.30
    assert scoring.threshold_for("aggressive") == 0.20


def test_blacklist_exact_and_prefix():
    patterns = ["/system/*", "/default/critical-*", "/analytics/logs"]
    assert scoring.is_blacklisted("/system/load_reports", patterns)
    assert scoring.is_blacklisted("/default/critical-pay", patterns)
    assert scoring.is_blacklisted("/analytics/logs", patterns)
    assert not scoring.is_blacklisted("/analytics/logs2", patterns)
    assert not scoring.is_blacklisted("/default/normal", patterns)


def test_propose_move_lightest_eligible_topic_to_least_loaded():
    topics = {
        "hot": [
            topic("/system/x"),
            topic("/d/heavy", byte_rate=9_000_000, producers=3),
            topic("/d/light", producers=1),
            topic("/d/cooling"),
        ],
        "mid": [topic("/d/m")],
        "cold": [],
    }
    scores = {"hot": 100.0, "mid": 20.0, "cold": 5.0}
    policy = scoring.RebalancePolicy.for_aggressiveness("balanced", blacklist=("/system/*",))
    move = scoring.propose_move(scores, topics, policy, ineligible_topics={"/d/cooling"})
    assert move is not None
    assert (move.topic, move.from_broker, move.to_broker) == ("/d/light", "hot", "cold")
    assert move.topic_score == pytest.approx(0.3)
    assert move.cv == pytest.approx(scoring.coefficient_of_variation(list(scores.values())))


def test_propose_move_none_when_balanced_or_too_few_brokers_or_all_blacklisted():
    topics = {"a": [topic("/d/a")], "b": [topic("/d/b")], "c": [topic("/d/c")]}
    assert scoring.propose_move({"a": 10.0, "b": 10.0, "c": 11.0}, topics) is None
    assert scoring.propose_move({"a": 100.0}, topics) is None
    policy = scoring.RebalancePolicy(threshold=0.2, blacklist=("/d/*",))
    assert scoring.propose_move({"a": 100.0, "b": 1.0, "c": 1.0}, topics, policy) is None


def test_propose_move_respects_eligible_targets():
    topics = {"a": [topic("/d/a")], "b": [], "c": []}
    move = scoring.propose_move({"a": 100.0, "b": 1.0, "c": 2.0}, topics, eligible_targets={"c"})
    assert move.to_broker == "c"


def test_scoring_accepts_plain_mappings():
    as_dicts = [
        {
            "broker_id": "x",
            "topics": [{"topic_name": "/d/t", "byte_rate_mbps": 1.0}],
            "resources_usage": [{"resource": "CPU", "usage": 10.0}],
            "total_throughput_mbps": 1.0,
        }
    ]
    assert scoring.balanced_scores(as_dicts) == {"x": pytest.approx((0.2 + 0.3) * 0.3 + 3.5)}


# ---------------------------------------------------------------- independent reference


def reference_scores(strategy, reports):
    """A straight re-derivation from danube-internals.md, written without the module's helpers."""

    def usage(r, name):
        found = [s.usage for s in r.resources_usage if s.resource == name]
        return found[-1] if found else 0.0

    def wtl(ts):
        if not ts:
            return 0.0
        return (
            0.2 * len(ts)
            + 0.3 * sum(t.byte_rate_mbps for t in ts)
            + 0.3 * sum(t.producer_count + t.consumer_count for t in ts)
            + 0.2 * sum(t.backlog_messages for t in ts) / 10000
        )

    if strategy == "fair":
        return {r.broker_id: len(r.topics) for r in reports}
    if strategy == "balanced":
        if not any(usage(r, "CPU") > 0 or usage(r, "Memory") > 0 for r in reports):
            return {r.broker_id: len(r.topics) for r in reports}
        return {r.broker_id: 0.3 * wtl(r.topics) + 0.35 * usage(r, "CPU") + 0.35 * usage(r, "Memory") for r in reports}
    mx = {}
    for key, get in (
        ("cpu", lambda r: usage(r, "CPU")),
        ("mem", lambda r: usage(r, "Memory")),
        ("disk", lambda r: usage(r, "DiskIO")),
        ("net", lambda r: usage(r, "NetworkIO")),
        ("thr", lambda r: r.total_throughput_mbps),
        ("topic", lambda r: wtl(r.topics)),
    ):
        mx[key] = max([1.0] + [get(r) for r in reports])
    out = {}
    for r in reports:
        cpu, mem = usage(r, "CPU") / mx["cpu"], usage(r, "Memory") / mx["mem"]
        disk, net = usage(r, "DiskIO") / mx["disk"], usage(r, "NetworkIO") / mx["net"]
        thr, tl = r.total_throughput_mbps / mx["thr"], wtl(r.topics) / mx["topic"]
        top = max(cpu, mem, disk, net, thr, tl)
        if top > 0.7:
            if top == cpu:
                s = 0.5 * cpu + 0.2 * mem + 0.15 * thr + 0.15 * tl
            elif top == mem:
                s = 0.5 * mem + 0.2 * cpu + 0.15 * thr + 0.15 * tl
            elif top == thr:
                s = 0.5 * thr + 0.2 * net + 0.15 * cpu + 0.15 * mem
            elif top == net:
                s = 0.5 * net + 0.2 * thr + 0.15 * cpu + 0.15 * mem
            else:
                s = 0.5 * tl + 0.2 * cpu + 0.2 * mem + 0.1 * thr
        else:
            s = 0.25 * tl + 0.25 * cpu + 0.25 * mem + 0.15 * thr + 0.1 * net
        out[r.broker_id] = s
    return out


finite = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
topic_st = st.builds(
    lambda i, br, p, c, bl: topic(f"/ns/t{i}", byte_rate=br, producers=p, consumers=c, backlog=bl),
    st.integers(0, 50),
    st.integers(0, 10**8),
    st.integers(0, 20),
    st.integers(0, 20),
    st.integers(0, 10**6),
)
report_st = st.builds(
    lambda topics, cpu, mem, disk, net: (topics, cpu, mem, disk, net),
    st.lists(topic_st, max_size=6),
    st.one_of(st.none(), st.floats(0, 100)),
    st.one_of(st.none(), st.floats(0, 100)),
    st.one_of(st.none(), finite),
    st.one_of(st.none(), finite),
)
cluster_st = st.lists(report_st, min_size=1, max_size=6).map(
    lambda items: [report(f"b{i}", *item) for i, item in enumerate(items)]
)


@settings(max_examples=150, deadline=None)
@given(cluster_st, st.sampled_from(scoring.STRATEGIES))
def test_scores_equal_independent_reference(reports, strategy):
    got = scoring.broker_scores(strategy, reports)
    want = reference_scores(strategy, reports)
    assert got.keys() == want.keys()
    for broker in want:
        assert got[broker] == pytest.approx(want[broker], rel=1e-9, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(cluster_st, st.sampled_from(scoring.STRATEGIES))
def test_rankings_sorted_ascending_and_complete(reports, strategy):
    ranked = scoring.rankings(strategy, reports)
    assert sorted(b for b, _ in ranked) == sorted(r.broker_id for r in reports)
    values = [s for _, s in ranked]
    assert values == sorted(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e6)), min_size=1, max_size=20))
def test_statistics_match_statistics_module(values):
    assert scoring.mean(values) == pytest.approx(statistics.fmean(values), rel=1e-9, abs=1e-9)
    assert scoring.std(values) == pytest.approx(statistics.pstdev(values), rel=1e-6, abs=1e-6)
    m = statistics.fmean(values)
    expected_cv = statistics.pstdev(values) / m if m > 0 else 0.0
    assert scoring.coefficient_of_variation(values) == pytest.approx(expected_cv, rel=1e-6, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e6)),
        min_size=1,
        max_size=12,
    )
)
def test_classification_properties(scores):
    stats = scoring.imbalance(scores)
    # CV is scale invariant, overloaded/underloaded are disjoint and on the right side of the mean
    scaled = scoring.imbalance({k: v * 3.0 for k, v in scores.items()})
    assert scaled.cv == pytest.approx(stats.cv, rel=1e-6, abs=1e-9)
    assert not set(stats.overloaded) & set(stats.underloaded)
    for b in stats.overloaded:
        assert scores[b] > stats.mean + stats.std
    for b in stats.underloaded:
        assert scores[b] < stats.mean - stats.std and scores[b] < 0.5 * stats.mean
    if len(set(scores.values())) == 1:
        assert stats.cv == 0.0 and not stats.overloaded and not stats.underloaded


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.floats(min_value=0.0, max_value=1e3), min_size=2, max_size=6),
    st.sampled_from([0.2, 0.3, 0.4]),
)
def test_move_comes_from_an_overloaded_broker_to_a_less_loaded_one(scores, threshold):
    topics = {b: [topic(f"/ns/{b}{i}", producers=i) for i in range(3)] for b in scores}
    move = scoring.propose_move(scores, topics, scoring.RebalancePolicy(threshold=threshold))
    stats = scoring.imbalance(scores)
    if move is None:
        assert stats.cv < threshold or not stats.overloaded
        return
    assert stats.cv >= threshold
    assert move.from_broker in stats.overloaded
    assert move.to_broker != move.from_broker
    assert scores[move.to_broker] == min(v for b, v in scores.items() if b != move.from_broker)
    assert move.topic == f"/ns/{move.from_broker}0"  # the lightest (no connections)


def test_namespace_objects_work_as_reports():
    r = SimpleNamespace(
        broker_id="n",
        topics=[
            SimpleNamespace(
                topic_name="/a/b", byte_rate_mbps=0.0, producer_count=1, consumer_count=0, backlog_messages=0
            )
        ],
        resources_usage=[],
        total_throughput_mbps=0.0,
    )
    assert scoring.fair_scores([r]) == {"n": 1.0}
    assert math.isclose(scoring.weighted_topic_load(r.topics), 0.5)

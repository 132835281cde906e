"""Balance statistics, classification, topic estimates and reconciliation with the assignments."""

from __future__ import annotations

import math

import pytest

from danube.cluster.load_report import LoadReport, SystemLoad, TopicLoad
from danube.cluster.rebalancing.balance import build_state, compute_balance, sources


def topic(name, mbps=0.0, producers=1, consumers=1, backlog=0):
    return TopicLoad(
        topic_name=name,
        byte_rate=int(mbps * 1e6),
        byte_rate_mbps=mbps,
        producer_count=producers,
        consumer_count=consumers,
        backlog_messages=backlog,
    )


def report(broker, topics, cpu=None, mem=None, ts=100):
    res = [] if cpu is None else [SystemLoad("CPU", cpu), SystemLoad("Memory", mem or 0.0)]
    return LoadReport(resources_usage=res, topics=list(topics), timestamp=ts, broker_id=broker)


def test_danubes_worked_example():
    b = compute_balance({"1": 45.0, "2": 30.0, "3": 25.0})
    assert b.mean == pytest.approx(33.333, abs=1e-3)
    assert b.std_dev == pytest.approx(8.498, abs=1e-3)
    assert b.cv == pytest.approx(0.255, abs=1e-3)
    assert b.overloaded == ("1",) and b.underloaded == ()
    assert (b.max_load, b.min_load, b.active_brokers) == (45.0, 25.0, 3)
    assert not b.needs_rebalancing(0.30) and b.needs_rebalancing(0.20)


def test_sources_fall_back_to_above_the_mean_when_nobody_is_overloaded():
    b = compute_balance({"1": 100.0, "2": 100.0, "3": 100.0, "4": 0.0, "5": 0.0})
    assert b.overloaded == ()  # mean 60 + std 49 = 109: Danube's rule finds no source
    assert sources(b) == ("3", "2", "1")
    assert sources(b, fallback_above_mean=False) == ()
    assert b.underloaded == ("4", "5")


def test_fair_estimates_are_one_per_topic_and_loads_follow_the_assignments():
    reports = {"a": report("a", [topic("/d/x"), topic("/d/y"), topic("/d/z")]), "b": report("b", [topic("/d/w")])}
    state = build_state("fair", reports, ["a", "b"])
    assert state.loads == {"a": 3.0, "b": 1.0}
    assert {t.estimated_load for ts in state.topics.values() for t in ts.values()} == {1.0}
    # /d/x moved to b after the reports were taken
    moved = build_state("fair", reports, ["a", "b"], {"a": {"/d/y", "/d/z"}, "b": {"/d/w", "/d/x"}})
    assert moved.loads == {"a": 2.0, "b": 2.0}
    assert set(moved.topics["b"]) == {"/d/w", "/d/x"}


def test_balanced_estimates_share_the_score_and_sum_to_it():
    reports = {
        "a": report("a", [topic("/d/x", 5.0), topic("/d/y", 0.1)], cpu=60.0, mem=40.0),
        "b": report("b", [topic("/d/z", 0.1)], cpu=10.0, mem=20.0),
    }
    state = build_state("balanced", reports, ["a", "b"])
    for broker, topics in state.topics.items():
        assert math.fsum(t.estimated_load for t in topics.values()) == pytest.approx(state.loads[broker])
    assert state.topics["a"]["/d/x"].estimated_load > state.topics["a"]["/d/y"].estimated_load


def test_inactive_and_unreported_brokers_are_left_out():
    reports = {"a": report("a", [topic("/d/x")]), "b": report("b", [])}
    state = build_state("fair", reports, ["a", "c"])  # b not active, c has not reported
    assert set(state.loads) == {"a"}

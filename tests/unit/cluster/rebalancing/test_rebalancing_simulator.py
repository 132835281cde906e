"""The scenarios of Danube's load manager in the deterministic simulator: convergence and safety, and the CLI."""

from __future__ import annotations

import json

import pytest

from danube.cluster.simulator import EPOCH, check_safety, max_moves_in_window, run_scenario


async def test_add_brokers_converges_and_the_planner_beats_danubes_greedy_loop():
    plan = await run_scenario("add-brokers", planner="plan", hours=4)
    greedy = await run_scenario("add-brokers", planner="greedy", hours=6)
    for r in (plan, greedy):
        assert r.violations == [] and r.consistent
        assert r.final_cv < r.threshold and r.reached_at_h is not None
        assert max(cv for _, cv in r.timeline) > 0.6  # the new brokers start empty
    assert plan.moves_to_threshold <= greedy.moves_to_threshold
    assert plan.reached_at_h <= greedy.reached_at_h
    # the new brokers received the topics; no topic moved twice
    assert {m.to_broker for m in plan.moves} <= {"broker-4", "broker-5"}
    assert len({m.topic for m in plan.moves}) == len(plan.moves)


async def test_broker_failure_with_leader_changes():
    r = await run_scenario("broker-failure", hours=5.5)
    assert r.violations == [] and r.consistent
    labels = [label for _, label in r.events]
    for label in ("xbroker-1", "leader broker-2", "+broker-1", "broker-2 restarts", "leader broker-3"):
        assert label in labels
    assert r.final_cv < r.threshold and r.reached_at_h is not None
    # the returned (empty) broker-1 receives the topics, from both leaders; the hourly limit spans them
    assert {m.to_broker for m in r.moves} == {"broker-1"}
    handover = EPOCH + 5400.0
    around = [m for m in r.moves if handover - 1800 < m.timestamp <= handover + 1800]
    assert any(m.timestamp < handover for m in around) and any(m.timestamp >= handover for m in around)
    assert len(around) <= r.config.max_moves_per_hour  # the new leader counted the old one's moves
    assert max_moves_in_window(r.moves) <= r.config.max_moves_per_hour


async def test_workload_drift_is_rebalanced():
    r = await run_scenario("workload-drift", hours=7)
    assert r.violations == [] and r.consistent
    assert max(cv for h, cv in r.timeline if h <= 5.0) >= r.threshold  # the drift pushes it over
    assert r.final_cv < r.threshold and r.moves
    assert not any(m.topic.startswith("/system/") for m in r.moves)


def test_check_safety_reports_violations():
    from danube.cluster.rebalancing.config import RebalancingConfig
    from danube.cluster.rebalancing.history import MoveRecord

    cfg = RebalancingConfig.from_dict(
        {"max_moves_per_hour": 2, "cooldown_seconds": 60, "blacklist_topics": ["/system/*"]}
    )
    moves = [
        MoveRecord("/d/a", "x", "y", 0.0),
        MoveRecord("/d/a", "y", "x", 30.0),
        MoveRecord("/system/s", "x", "y", 100.0),
    ]
    problems = " ".join(check_safety(moves, cfg))
    for word in ("rate limit", "cooldown", "oscillation", "blacklist"):
        assert word in problems


def test_cli_simulate_json_and_chart(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from danube.cli.main import main

    chart = tmp_path / "chart.png"
    assert main(["cluster", "simulate", "add-brokers", "--hours", "1", "--json", "--out", str(chart)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chart"] == str(chart) and chart.stat().st_size > 1000
    [run] = out["runs"]
    assert run["scenario"] == "add-brokers" and run["violations"] == [] and run["moves"] > 0
    assert run["timeline"][0]["t_h"] == 0.0

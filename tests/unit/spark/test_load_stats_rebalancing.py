"""load-stats and the rebalancing history: the per-move CV before / after (pure part, no Spark)."""

from __future__ import annotations

import json

import pytest

from danube.spark.jobs.load_stats import move_cv_effects, parse_history


def test_cv_before_and_after_each_move():
    balance = [
        (0, "balanced", 0.50),
        (30, "balanced", 0.45),
        (60, "balanced", 0.30),
        (90, "balanced", 0.28),
        (0, "fair", 0.9),
        (30, "fair", 0.8),
        (60, "fair", 0.7),
        (90, "fair", 0.6),
    ]
    records = [
        {
            "topic": "/d/b",
            "from_broker": "1",
            "to_broker": "3",
            "timestamp": 75.0,
            "strategy": "fair",
            "cv_before": 0.7,
        },
        {
            "topic": "/d/a",
            "from_broker": "1",
            "to_broker": "2",
            "timestamp": 45.0,
            "estimated_load": 2.5,
            "cv_before": 0.46,
            "cv_after_estimated": 0.33,
        },
        {"topic": "/d/c", "from_broker": "2", "to_broker": "", "timestamp": 100.0, "outcome": "timeout"},
    ]
    rows = move_cv_effects(balance, records, bucket_seconds=30)
    assert [r["topic"] for r in rows] == ["/d/a", "/d/b", "/d/c"]
    a, b, c = rows
    # the snapshot [30, 60) contains the move at 45: before = [0, 30), after = [60, 90)
    assert (a["before_bucket"], a["cv_before"], a["after_bucket"], a["cv_after"]) == (0, 0.50, 60, 0.30)
    assert a["cv_change"] == pytest.approx(-0.20)
    assert (a["strategy"], a["estimated_load"], a["leader_cv_before"], a["leader_cv_after_estimated"]) == (
        "balanced",
        2.5,
        0.46,
        0.33,
    )
    assert (b["strategy"], b["cv_before"], b["cv_after"]) == ("fair", 0.8, 0.6)
    # [60, 90) ended before 100 s; no snapshot starts after it: no "after"
    assert (c["outcome"], c["cv_before"], c["cv_after"], c["cv_change"]) == ("timeout", 0.30, None, None)


def test_parse_history_formats():
    records = [{"topic": "/d/a", "from_broker": "1", "to_broker": "2", "timestamp": 1.0}]
    assert parse_history(json.dumps(records)) == records
    assert parse_history(json.dumps({"records": records})) == records
    assert parse_history("\n".join(json.dumps(r) for r in records * 2) + "\n") == records * 2
    assert parse_history("") == []

"""load-stats --rebalancing-history on local Spark: one row per move with the CV before and after."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from danube.spark.jobs import load_stats
from tests.integration.spark.test_jobs import history, parse, plain_balance, write_reports

pytestmark = pytest.mark.spark


def test_load_stats_reports_the_cv_around_each_move(spark, tmp_path):
    root = str(tmp_path / "durable")
    reports = history()
    write_reports(root, reports)
    snapshots, expected = plain_balance(reports)
    starts = sorted(snapshots)
    # a move inside the second snapshot: before = the first, after = the third
    move_at = starts[1] + 10
    records = [
        {
            "topic": "/b1/t1",
            "from_broker": "b1",
            "to_broker": "b3",
            "reason": "LoadImbalance",
            "estimated_load": 1.0,
            "timestamp": move_at,
            "strategy": "fair",
            "cv_before": 0.9,
            "cv_after_estimated": 0.8,
            "outcome": "moved",
        }
    ]
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"records": records}))
    out = str(tmp_path / "stats")
    args = parse(load_stats.add_arguments, ["--root", root, "--output", out, "--rebalancing-history", str(path)])
    summary = load_stats.run(spark, args)
    assert summary["rebalancing_moves"] == 1
    [row] = pq.read_table(os.path.join(out, "rebalancing_moves")).to_pylist()
    assert (row["topic"], row["from_broker"], row["to_broker"], row["strategy"]) == ("/b1/t1", "b1", "b3", "fair")
    assert row["before_bucket"] == starts[0] and row["after_bucket"] == starts[2]
    assert row["cv_before"] == pytest.approx(expected[(starts[0], "fair")][2])
    assert row["cv_after"] == pytest.approx(expected[(starts[2], "fair")][2])
    assert row["cv_change"] == pytest.approx(row["cv_after"] - row["cv_before"])
    assert row["leader_cv_before"] == 0.9

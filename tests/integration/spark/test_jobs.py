"""reprocess and load-stats on local[2], checked against plain-Python computations."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from danube import message_codec
from danube.cli import main as cli_main
from danube.cluster.load_report import LOAD_REPORTS_TOPIC, LoadReport, SystemLoad, TopicLoad, encode_report
from danube.spark.jobs import load_stats, reprocess
from danube.storage import segment as seg
from danube.storage.backends import FilesystemBackend
from tests.integration.spark.helpers import collect_rows, write_history

pytestmark = pytest.mark.spark

TOPIC = "/default/accounts"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def parse(add_arguments, argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def plain_compaction(rows):
    """Latest row per routing key, unkeyed rows kept, in source offset order."""
    latest = {}
    unkeyed = []
    for row in rows:
        if row[4] is None:
            unkeyed.append(row)
        else:
            latest[row[4]] = row
    return sorted(list(latest.values()) + unkeyed, key=lambda r: r[1])


def test_reprocess_compact_into_a_new_topic(spark, tmp_path):
    root = str(tmp_path / "durable")
    backend = FilesystemBackend(root)
    _, rows = write_history(backend, TOPIC, [(0, 120), (120, 80)])
    args = parse(
        reprocess.add_arguments,
        ["--root", root, "--topic", TOPIC, "--compact", "--output-topic", "/default/accounts-compacted"],
    )
    result = reprocess.run(spark, args)
    expected = plain_compaction(rows)
    got = collect_rows(spark.read.format("danube").option("topic", "/default/accounts-compacted").load(root))
    assert result.rows_written == len(expected) == len(got)
    assert [r[1] for r in got] == list(range(len(expected)))  # new history from offset 0
    assert [r[2:] for r in got] == [r[2:] for r in expected]  # same records, source order
    descs = seg.list_segments(backend, seg.topic_prefix("/default/accounts-compacted"))
    assert sum(d.record_count for d in descs) == len(expected)


def test_reprocess_filter_transform_rekey_into_parquet_via_cli(spark, tmp_path):
    root = str(tmp_path / "durable")
    _, rows = write_history(FilesystemBackend(root), TOPIC, [(0, 90)])
    out = str(tmp_path / "out.parquet")
    code = cli_main.main(
        [
            "spark",
            "reprocess",
            "--root",
            root,
            "--topic",
            TOPIC,
            "--start-offset",
            "10",
            "--filter",
            "producer_id = 41",
            "--payload-expr",
            "upper(cast(payload AS string))",
            "--key-expr",
            "attributes['n']",
            "--output-parquet",
            out,
        ]
    )
    assert code == 0
    table = pq.read_table(out).to_pylist()
    expected = [r for r in rows if r[1] >= 10 and r[3] == 41]
    assert [t["offset"] for t in table] == [r[1] for r in expected]
    assert [t["payload"] for t in table] == [r[6].decode().upper().encode() for r in expected]
    assert [t["routing_key"] for t in table] == [r[5].get("n") for r in expected]


# ---------------------------------------------------------------- load statistics


def history():
    """3 brokers × 4 snapshots of 30 s; b1 turns hot from the third snapshot; b2 reports twice in one."""
    reports = []
    base = 1_700_000_015  # mid-snapshot: snapshots start at 1_700_000_000 + 30 k
    for snap in range(4):
        for broker, cpu, mem, ntopics in (
            ("b1", 20 + 30 * snap, 30.0, 2 + 2 * snap),
            ("b2", 25.0, 30.0, 2),
            ("b3", 10.0, 20.0, 1),
        ):
            topics = [
                TopicLoad(
                    f"/{broker}/t{i}",
                    message_rate=10 * i,
                    byte_rate=100_000 * i,
                    byte_rate_mbps=100_000 * i / 1e6,
                    producer_count=1,
                    consumer_count=i,
                    subscription_count=1,
                    backlog_messages=500 * i,
                )
                for i in range(ntopics)
            ]
            resources = [
                SystemLoad("CPU", float(cpu)),
                SystemLoad("Memory", float(mem)),
                SystemLoad("DiskIO", 1000.0),
                SystemLoad("NetworkIO", 2000.0),
            ]
            reports.append(
                LoadReport(
                    resources,
                    topics,
                    sum(t.byte_rate_mbps for t in topics),
                    sum(t.message_rate for t in topics),
                    sum(t.backlog_messages for t in topics),
                    base + snap * 30,
                    broker,
                )
            )
    # an earlier b2 report in snapshot 0 that the later one supersedes
    stale = LoadReport([SystemLoad("CPU", 99.0), SystemLoad("Memory", 99.0)], [], 0.0, 0, 0, base - 5, "b2")
    return [stale] + reports


def plain_balance(reports, bucket=30):
    """CV per snapshot for fair and balanced, computed from scratch."""
    snapshots = {}
    for r in reports:
        start = r.timestamp - r.timestamp % bucket
        if r.broker_id not in snapshots.setdefault(start, {}) or snapshots[start][r.broker_id].timestamp < r.timestamp:
            snapshots[start][r.broker_id] = r
    out = {}
    for start, by_broker in snapshots.items():
        fair = [len(r.topics) for r in by_broker.values()]
        balanced = []
        for r in by_broker.values():
            cpu = [s.usage for s in r.resources_usage if s.resource == "CPU"][0]
            mem = [s.usage for s in r.resources_usage if s.resource == "Memory"][0]
            t = r.topics
            load = (
                (
                    0.2 * len(t)
                    + 0.3 * sum(x.byte_rate_mbps for x in t)
                    + 0.3 * sum(x.producer_count + x.consumer_count for x in t)
                    + 0.2 * sum(x.backlog_messages for x in t) / 10000
                )
                if t
                else 0.0
            )
            balanced.append(0.3 * load + 0.35 * cpu + 0.35 * mem)
        for name, values in (("fair", fair), ("balanced", balanced)):
            m = sum(values) / len(values)
            sd = math.sqrt(sum((v - m) ** 2 for v in values) / len(values))
            out[(start, name)] = (m, sd, sd / m if m else 0.0)
    return snapshots, out


def write_reports(root, reports):
    backend = FilesystemBackend(root)
    buf = bytearray()
    for r in reports:
        buf += encode_report(r, publish_time_ms=r.timestamp * 1000)
    data = bytearray(buf)
    message_codec.stamp_offsets(data, 0)
    half = message_codec.frame_positions(data)[len(reports) // 2]
    seg.write_segment(backend, LOAD_REPORTS_TOPIC, bytes(data[:half]))
    seg.write_segment(backend, LOAD_REPORTS_TOPIC, bytes(data[half:]))


def test_load_stats_against_plain_python(spark, tmp_path):
    root = str(tmp_path / "durable")
    reports = history()
    write_reports(root, reports)
    out = str(tmp_path / "stats")
    args = parse(
        load_stats.add_arguments,
        ["--root", root, "--output", out, "--aggressiveness", "aggressive", "--blacklist", "/b1/t0"],
    )
    summary = load_stats.run(spark, args)
    snapshots, expected = plain_balance(reports)
    assert summary["snapshots"] == 4 and summary["brokers"] == 3

    balance = pq.read_table(os.path.join(out, "cluster_balance")).to_pylist()
    assert len(balance) == 4 * 3
    for row in balance:
        start = int(row["bucket_start"].timestamp())
        if row["strategy"] in ("fair", "balanced"):
            m, sd, cv = expected[(start, row["strategy"])]
            assert row["mean"] == pytest.approx(m) and row["std"] == pytest.approx(sd)
            assert row["cv"] == pytest.approx(cv)
            assert row["needs_rebalancing"] == (cv >= 0.20)
        assert row["threshold"] == 0.20

    rankings = pq.read_table(os.path.join(out, "rankings")).to_pylist()
    for start, by_broker in snapshots.items():
        fair = sorted(by_broker, key=lambda b: (len(by_broker[b].topics), b))
        got = [
            r["broker_id"] for r in rankings if int(r["bucket_start"].timestamp()) == start and r["strategy"] == "fair"
        ]
        assert got == fair

    # snapshot 3: b1 has 8 topics (fair CV 0.98 ≥ 0.20), its lightest non-blacklisted topic is /b1/t1,
    # and the least loaded other broker under fair is b3
    moves = pq.read_table(os.path.join(out, "moves")).to_pylist()
    last = max(snapshots)
    fair_moves = [m for m in moves if m["strategy"] == "fair" and int(m["bucket_start"].timestamp()) == last]
    assert [(m["topic"], m["from_broker"], m["to_broker"]) for m in fair_moves] == [("/b1/t1", "b1", "b3")]
    assert all(m["topic"] != "/b1/t0" for m in moves)

    series = pq.read_table(os.path.join(out, "broker_timeseries")).to_pylist()
    assert len(series) == 12
    b2_first = [s for s in series if s["broker_id"] == "b2" and int(s["bucket_start"].timestamp()) == min(snapshots)]
    assert b2_first[0]["cpu"] == 25.0  # the stale 99 % report was superseded
    with open(summary["chart"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_spark_submit_with_pure_python_executors(tmp_path):
    """The thin spark-submit wrapper, with DANUBE_NO_EXTENSIONS=1 for the driver and every executor."""
    import pyspark

    root = str(tmp_path / "durable")
    _, rows = write_history(FilesystemBackend(root), TOPIC, [(0, 60)])
    out = str(tmp_path / "compacted.parquet")
    env = dict(
        os.environ,
        DANUBE_NO_EXTENSIONS="1",
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    proc = subprocess.run(
        [
            submit,
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=1",
            os.path.join(REPO, "spark", "jobs", "reprocess.py"),
            "--root",
            root,
            "--topic",
            TOPIC,
            "--compact",
            "--output-parquet",
            out,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reprocess:" in proc.stdout
    expected = plain_compaction(rows)
    table = pq.read_table(out).to_pylist()
    assert [(t["offset"], t["routing_key"], t["payload"]) for t in table] == [(r[1], r[4], r[6]) for r in expected]

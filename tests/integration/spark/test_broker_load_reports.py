"""Load reports end to end: a real broker (shared_fs storage) writes them, Spark reads the segments.

Run 1: the broker reports every 0.3 s while a client produces and consumes; small WAL files
rotate every few reports, so segments are exported while it runs.  Run 2 (reports off): the
system topic is loaded by an ordinary consumer, described (how many reports were written) and
unloaded through the admin API, which exports the tail.  Then the danube data source reads
``/system/load_reports`` from the shared directory and the load-stats job runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os

import grpc
import pyarrow.parquet as pq
import pytest

from danube.client import DanubeClient
from danube.cluster.load_report import LOAD_REPORTS_TOPIC, LoadReport
from danube.proto.danube_admin import admin_pb2, admin_pb2_grpc
from danube.spark.jobs import load_stats
from tests.support.broker import running_broker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

BROKER_ID = "broker-lr-1"
TRAFFIC = "/default/traffic"


def _config(tmp_path) -> str:
    path = tmp_path / "danube_broker.yml"
    path.write_text(
        json.dumps(
            {  # JSON is YAML
                "broker_id": BROKER_ID,
                "load_manager": {"load_report_interval_seconds": 0.3},
                "storage": {
                    "mode": "shared_fs",
                    "export_interval_seconds": 0.5,
                    "wal": {"max_file_mb": 0.004},  # ~4 KiB files: a rotation (= a segment) every few reports
                    "durable": {"root": str(tmp_path / "shared")},
                },
            }
        )
    )
    return str(path)


async def _traffic(url: str) -> None:
    client = DanubeClient.builder().service_url(url).build()
    producer = client.new_producer().with_topic(TRAFFIC).with_name("p").with_linger_ms(1).build()
    await producer.create()
    consumer = client.new_consumer().with_topic(TRAFFIC).with_consumer_name("c").with_subscription("s").build()
    await consumer.subscribe()
    for round_ in range(8):
        await (await producer.send_batch([b"m-%d-%d" % (round_, i) for i in range(50)]))
        await asyncio.sleep(0.25)
    await consumer.close()
    await producer.close()


async def _load_describe_unload(broker) -> int:
    """Load the system topic with an ordinary consumer, return its next offset, unload (seal) it."""
    client = DanubeClient.builder().service_url(broker.url).build()
    consumer = (
        client.new_consumer()
        .with_topic(LOAD_REPORTS_TOPIC)
        .with_consumer_name("audit")
        .with_subscription("audit")
        .build()
    )
    await consumer.subscribe()  # the topic exists: no with_reliable needed
    await consumer.close()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        admin = admin_pb2_grpc.TopicAdminStub(channel)
        info = await admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name=LOAD_REPORTS_TOPIC), timeout=30)
        assert info.delivery == "Reliable" and info.storage.mode == "shared_fs"
        written = info.storage.next_offset
        await admin.UnloadTopic(admin_pb2.TopicRequest(name=LOAD_REPORTS_TOPIC), timeout=30)
    return written


def test_load_reports_are_exported_as_segments_and_read_by_spark(spark, tmp_path):
    config = _config(tmp_path)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with running_broker("--config", config, data_dir=str(data_dir)) as broker:
        asyncio.run(_traffic(broker.url))
        assert broker.stop() == 0, broker.log()
    history = tmp_path / "shared" / "system" / f"load_reports.{BROKER_ID}"  # a system topic's: per broker
    segments_while_running = glob.glob(str(history / "segments" / "*.dnseg"))
    assert segments_while_running, "no segment exported while the broker ran (rotation / export interval)"

    with running_broker("--config", config, "--load-report-interval", "0", data_dir=str(data_dir)) as broker:
        written = asyncio.run(_load_describe_unload(broker))
        assert broker.stop() == 0, broker.log()
    assert written >= 5, f"only {written} reports in about 2 s at a 0.3 s interval"

    root = str(tmp_path / "shared")
    # every broker writes its own copy of a system topic: its history is kept per broker
    df = spark.read.format("danube").option("topic", f"{LOAD_REPORTS_TOPIC}.{BROKER_ID}").load(root)
    rows = df.select("offset", "routing_key", "attributes", "payload").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(written))  # every report, once, from segments
    assert {r.routing_key for r in rows} == {BROKER_ID}
    assert all(r.attributes["type"] == "LoadReport" for r in rows)
    reports = [LoadReport.from_json(bytes(r.payload)) for r in rows]
    assert {r.broker_id for r in reports} == {BROKER_ID}
    traffic = [t for rep in reports for t in rep.topics if t.topic_name == TRAFFIC]
    assert traffic and max(t.producer_count for t in traffic) == 1
    assert max(t.message_rate for t in traffic) > 0

    out = str(tmp_path / "stats")
    parser = argparse.ArgumentParser()
    load_stats.add_arguments(parser)
    args = parser.parse_args(["--root", root, "--output", out, "--bucket-seconds", "1"])
    summary = load_stats.run(spark, args)
    assert summary["brokers"] == 1
    buckets = {rep.timestamp - rep.timestamp % 1 for rep in reports}
    assert summary["snapshots"] == len(buckets)
    timeseries = pq.read_table(os.path.join(out, "broker_timeseries")).to_pylist()
    assert {row["broker_id"] for row in timeseries} == {BROKER_ID}
    assert len(timeseries) == len(buckets)  # one row per broker and snapshot
    # each snapshot keeps the broker's latest report of that second
    latest = {}
    for rep in reports:
        latest[rep.timestamp] = rep
    for row in timeseries:
        assert row["topic_count"] == len(latest[int(row["bucket_start"].timestamp())].topics)

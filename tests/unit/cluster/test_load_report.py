"""LoadReport JSON, /proc sampling, counter → rate conversion and the LoadReporter task."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from danube import message_codec
from danube.cluster import load_report as lr
from danube.cluster.load_report import LoadReport, LoadReporter, ResourceMonitor, SystemLoad, TopicLoad
from danube.errors import InvalidArgumentError


def write_proc(root, *, cpu, mem_total=1000, mem_avail=250, disk_sectors=(0, 0), net=(0, 0)):
    os.makedirs(os.path.join(root, "proc", "net"), exist_ok=True)
    os.makedirs(os.path.join(root, "sys_block", "sda"), exist_ok=True)
    with open(os.path.join(root, "proc", "stat"), "w") as f:
        f.write("cpu  " + " ".join(str(v) for v in cpu) + "\ncpu0 1 2 3 4\nintr 5\n")
    with open(os.path.join(root, "proc", "meminfo"), "w") as f:
        f.write(f"MemTotal:       {mem_total} kB\nMemFree:          1 kB\nMemAvailable:   {mem_avail} kB\n")
    with open(os.path.join(root, "proc", "diskstats"), "w") as f:
        r, w = disk_sectors
        f.write(f"   8       0 sda 10 0 {r} 0 10 0 {w} 0 0 0 0\n")
        f.write(f"   8       1 sda1 10 0 {r} 0 10 0 {w} 0 0 0 0\n")  # partition: must not count twice
        f.write("   7       0 loop0 1 0 999999 0 1 0 999999 0 0 0 0\n")
    with open(os.path.join(root, "proc", "net", "dev"), "w") as f:
        rx, tx = net
        f.write("Inter-|   Receive\n face |bytes    packets\n")
        f.write("    lo: 5000000 1 0 0 0 0 0 0 5000000 1 0 0 0 0 0 0\n")
        f.write(f"  eth0: {rx} 1 0 0 0 0 0 0 {tx} 1 0 0 0 0 0 0\n")


def test_resource_monitor_reads_proc_deltas(tmp_path):
    now = [100.0]
    root = str(tmp_path)
    # user nice system idle iowait irq softirq steal
    write_proc(root, cpu=[100, 0, 100, 700, 100, 0, 0, 0], disk_sectors=(0, 0), net=(0, 0))
    monitor = ResourceMonitor(
        proc=os.path.join(root, "proc"), sys_block=os.path.join(root, "sys_block"), clock=lambda: now[0]
    )
    first = {s.resource: s.usage for s in monitor.sample()}
    assert first == {"CPU": 0.0, "Memory": 75.0, "DiskIO": 0.0, "NetworkIO": 0.0}
    # +200 busy, +200 idle/iowait → 50 %; 2 s; disk +1000 sectors → 256000 B/s; net +3000 B → 1500 B/s
    write_proc(root, cpu=[200, 0, 200, 800, 200, 0, 0, 0], mem_avail=900, disk_sectors=(400, 600), net=(1000, 2000))
    now[0] = 102.0
    second = {s.resource: s.usage for s in monitor.sample()}
    assert second == {"CPU": 50.0, "Memory": 10.0, "DiskIO": 256000.0, "NetworkIO": 1500.0}


def test_resource_monitor_without_proc_reports_zeros(tmp_path):
    monitor = ResourceMonitor(proc=str(tmp_path / "missing"), sys_block=str(tmp_path / "missing"))
    monitor.sample()
    assert {s.resource: s.usage for s in monitor.sample()} == {
        "CPU": 0.0,
        "Memory": 0.0,
        "DiskIO": 0.0,
        "NetworkIO": 0.0,
    }


def test_real_proc_sample_is_sane():
    monitor = ResourceMonitor()
    monitor.sample()
    values = {s.resource: s.usage for s in monitor.sample()}
    assert set(values) == set(lr.RESOURCE_TYPES)
    assert 0.0 <= values["CPU"] <= 100.0 and 0.0 < values["Memory"] <= 100.0


def test_build_report_from_counters_and_json_roundtrip():
    rates = lr.RateTracker()
    stats = {
        "topics": {
            "/d/b": {
                "messages_in_total": 0,
                "bytes_in_total": 0,
                "producer_count": 1,
                "consumer_count": 2,
                "subscription_count": 1,
                "backlog_messages": 7,
            },
            "/d/a": {"message_rate": 5, "byte_rate": 3_000_000},
        }
    }
    first = lr.build_load_report(
        "b1", stats, rates=rates, now=10.0, timestamp=1_700_000_000, resources=[SystemLoad("CPU", 12.5)]
    )
    assert [t.topic_name for t in first.topics] == ["/d/a", "/d/b"]
    assert first.topics[1].message_rate == 0  # first report: no previous counters
    stats["topics"]["/d/b"].update(messages_in_total=100, bytes_in_total=4_000_000)
    second = lr.build_load_report("b1", stats, rates=rates, now=12.0, timestamp=1_700_000_002)
    b = second.topics[1]
    assert (b.message_rate, b.byte_rate, b.byte_rate_mbps) == (50, 2_000_000, 2.0)
    assert (b.producer_count, b.consumer_count, b.subscription_count, b.backlog_messages) == (1, 2, 1, 7)
    assert second.total_throughput_mbps == pytest.approx(5.0)
    assert second.total_message_rate == 55 and second.total_lag_messages == 7
    again = LoadReport.from_json(second.to_json())
    assert again == second
    raw = json.loads(first.to_json())
    assert raw["resources_usage"] == [{"resource": "CPU", "usage": 12.5}]
    assert raw["timestamp"] == 1_700_000_000 and raw["broker_id"] == "b1"


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"timestamp": 1}', "malformed load report"),
        (
            b'{"timestamp": 1, "broker_id": "x", "resources_usage": [{"resource": "GPU", "usage": 1}]}',
            "unknown resource type 'GPU'",
        ),
        (b'{"timestamp": "soon", "broker_id": "x"}', "malformed load report"),
    ],
)
def test_bad_reports_are_clear_errors(raw, message):
    with pytest.raises(InvalidArgumentError, match=message):
        LoadReport.from_json(raw)


def test_interval_must_be_positive():
    with pytest.raises(InvalidArgumentError, match="load_report_interval_seconds"):
        LoadReporter(object(), 0, broker_id="x")


class ProtocolBroker:
    """The two calls LoadReporter needs (docs/internals.md, "Load reports"), recorded.

    The real BrokerService implements the same protocol; this stand-in keeps the
    frames it is given so the test can decode them like a subscriber would.
    """

    broker_id = "broker-7"

    def __init__(self, fail_first: int = 0):
        self.published: list[tuple[str, bytes]] = []
        self.fail_first = fail_first
        self.calls = 0
        self.messages = 0

    def stats(self):
        self.messages += 10
        return {
            "topics": {
                "/default/orders": {
                    "messages_in_total": self.messages,
                    "bytes_in_total": self.messages * 100,
                    "producer_count": 1,
                    "consumer_count": 1,
                    "subscription_count": 1,
                    "backlog_messages": 3,
                }
            }
        }

    async def publish_system(self, topic, frame_batch):
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("storage not ready")
        assert isinstance(frame_batch, bytearray)
        count, _first, _last = message_codec.validate(frame_batch)
        assert count == 1
        self.published.append((topic, bytes(frame_batch)))
        return self.calls, self.calls


async def test_reporter_publishes_json_frames_periodically_and_survives_failures():
    broker = ProtocolBroker(fail_first=1)
    reporter = LoadReporter(broker, 0.05)
    reporter.start()
    try:
        for _ in range(200):
            if len(broker.published) >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        await reporter.stop()
    assert not reporter.running
    assert reporter.failures == 1
    assert len(broker.published) >= 3
    for topic, raw in broker.published:
        assert topic == "/system/load_reports"
        (record,) = list(message_codec.iter_records(raw))
        assert record.routing_key == "broker-7"
        assert record.attributes == {"content-type": "application/json", "type": "LoadReport"}
        report = LoadReport.from_json(bytes(record.payload))
        assert report.broker_id == "broker-7"
        assert [t.topic_name for t in report.topics] == ["/default/orders"]
        assert {s.resource for s in report.resources_usage} == set(lr.RESOURCE_TYPES)
        assert abs(record.publish_time / 1000 - report.timestamp) < 5
    last = LoadReport.from_json(bytes(next(message_codec.iter_records(broker.published[-1][1])).payload))
    assert last.topics[0].message_rate > 0  # derived from the growing counter


async def test_report_once_returns_the_published_report():
    broker = ProtocolBroker()
    reporter = LoadReporter(broker, 30, broker_id="override")
    report = await reporter.report_once()
    assert report.broker_id == "override"
    assert isinstance(report.topics[0], TopicLoad)
    (record,) = list(message_codec.iter_records(broker.published[0][1]))
    assert LoadReport.from_json(bytes(record.payload)) == report

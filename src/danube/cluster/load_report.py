"""LoadReport: what a broker tells the load manager about itself, and the task that publishes it.

Every ``load_report_interval_seconds`` a :class:`LoadReporter` samples the host
(``/proc``: CPU %, memory %, disk I/O B/s, network I/O B/s), reads the broker's
per-topic counters through ``broker.stats()``, turns counter deltas into rates
and appends the report as one JSON frame to the reliable system topic
``/system/load_reports`` through ``broker.publish_system(topic, frames)``.  The
history is therefore stored as ordinary segments and read back by the Spark
data source (``danube spark load-stats``).

JSON layout (Danube's field names; ``timestamp`` in Unix seconds)::

    {"resources_usage": [{"resource": "CPU", "usage": 12.5}, {"resource": "Memory", ...},
                         {"resource": "DiskIO", ...}, {"resource": "NetworkIO", ...}],
     "topics": [{"topic_name": "/default/t", "message_rate": 10, "byte_rate": 1000,
                 "byte_rate_mbps": 0.001, "producer_count": 1, "consumer_count": 2,
                 "subscription_count": 1, "backlog_messages": 0}],
     "total_throughput_mbps": 0.001, "total_message_rate": 10, "total_lag_messages": 0,
     "timestamp": 1700000000, "broker_id": "broker-1"}

The broker protocol this module needs is documented in docs/internals.md ("Load reports").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Protocol

from danube import message_codec
from danube._tasks import cancel_and_wait
from danube.errors import InvalidArgumentError

log = logging.getLogger(__name__)

LOAD_REPORTS_TOPIC = "/system/load_reports"
RESOURCE_TYPES = ("CPU", "Memory", "DiskIO", "NetworkIO")
REPORT_ATTRIBUTES = {"content-type": "application/json", "type": "LoadReport"}


@dataclass
class SystemLoad:
    resource: str  # "CPU" | "Memory" | "DiskIO" | "NetworkIO"
    usage: float  # percent for CPU and Memory, bytes/s for DiskIO and NetworkIO


@dataclass
class TopicLoad:
    topic_name: str
    message_rate: int = 0  # messages/s
    byte_rate: int = 0  # bytes/s
    byte_rate_mbps: float = 0.0  # MB/s (byte_rate / 1e6), Danube's name
    producer_count: int = 0
    consumer_count: int = 0
    subscription_count: int = 0
    backlog_messages: int = 0


@dataclass
class LoadReport:
    resources_usage: list[SystemLoad] = field(default_factory=list)
    topics: list[TopicLoad] = field(default_factory=list)
    total_throughput_mbps: float = 0.0
    total_message_rate: int = 0
    total_lag_messages: int = 0
    timestamp: int = 0  # Unix seconds
    broker_id: str = ""

    def usage(self, resource: str) -> float:
        value = 0.0
        for item in self.resources_usage:
            if item.resource == resource:
                value = item.usage
        return value

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoadReport":
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"load report must be a JSON object, got {type(data).__name__}")
        try:
            resources = []
            for item in data.get("resources_usage") or []:
                resource = item["resource"]
                if resource not in RESOURCE_TYPES:
                    raise InvalidArgumentError(f"unknown resource type {resource!r} in load report")
                resources.append(SystemLoad(resource, float(item["usage"])))
            topics = []
            for t in data.get("topics") or []:
                topics.append(
                    TopicLoad(
                        topic_name=str(t["topic_name"]),
                        message_rate=int(t.get("message_rate", 0)),
                        byte_rate=int(t.get("byte_rate", 0)),
                        byte_rate_mbps=float(t.get("byte_rate_mbps", 0.0)),
                        producer_count=int(t.get("producer_count", 0)),
                        consumer_count=int(t.get("consumer_count", 0)),
                        subscription_count=int(t.get("subscription_count", 0)),
                        backlog_messages=int(t.get("backlog_messages", 0)),
                    )
                )
            return cls(
                resources_usage=resources,
                topics=topics,
                total_throughput_mbps=float(data.get("total_throughput_mbps", 0.0)),
                total_message_rate=int(data.get("total_message_rate", 0)),
                total_lag_messages=int(data.get("total_lag_messages", 0)),
                timestamp=int(data["timestamp"]),
                broker_id=str(data["broker_id"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"malformed load report: {exc!r}") from exc

    @classmethod
    def from_json(cls, raw: bytes | str | memoryview) -> "LoadReport":
        if isinstance(raw, memoryview):
            raw = bytes(raw)
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"load report is not JSON: {exc}") from exc
        return cls.from_dict(data)


# ---------------------------------------------------------------- host resources from /proc


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cpu_times(proc: str) -> tuple[int, int] | None:
    """(busy, total) jiffies of the aggregate ``cpu`` line of /proc/stat."""
    text = _read(os.path.join(proc, "stat"))
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            # guest time is already counted in user/nice: sum the first 8 fields only
            total = sum(values[:8])
            return total - idle, total
    return None


def _memory_percent(proc: str) -> float:
    text = _read(os.path.join(proc, "meminfo"))
    if not text:
        return 0.0
    info = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            info[name] = int(parts[0])
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    return 100.0 * (total - available) / total if total else 0.0


def _disk_bytes(proc: str, sys_block: str) -> int | None:
    """Bytes read + written by whole disks (partitions and virtual devices excluded)."""
    text = _read(os.path.join(proc, "diskstats"))
    if text is None:
        return None
    try:
        disks = set(os.listdir(sys_block))
    except OSError:
        disks = None
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 10:
            continue
        name = parts[2]
        if name.startswith(("loop", "ram", "zram")):
            continue
        if disks is not None and name not in disks:
            continue  # a partition: its I/O is already in its disk's line
        total += (int(parts[5]) + int(parts[9])) * 512  # sectors read + written
    return total


def _network_bytes(proc: str) -> int | None:
    """Bytes received + sent on every interface but loopback."""
    text = _read(os.path.join(proc, "net", "dev"))
    if text is None:
        return None
    total = 0
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        parts = rest.split()
        if len(parts) >= 9:
            total += int(parts[0]) + int(parts[8])
    return total


class ResourceMonitor:
    """Samples host usage from /proc; rates come from the difference to the previous sample.

    The first sample reports 0 for CPU, disk and network (no previous sample yet).
    Off Linux every value is 0.
    """

    def __init__(self, proc: str = "/proc", sys_block: str = "/sys/block", clock=time.monotonic) -> None:
        self._proc = proc
        self._sys_block = sys_block
        self._clock = clock
        self._prev: tuple[float, tuple[int, int] | None, int | None, int | None] | None = None

    def sample(self) -> list[SystemLoad]:
        now = self._clock()
        cpu = _cpu_times(self._proc)
        disk = _disk_bytes(self._proc, self._sys_block)
        net = _network_bytes(self._proc)
        cpu_pct = disk_rate = net_rate = 0.0
        if self._prev is not None:
            then, pcpu, pdisk, pnet = self._prev
            elapsed = now - then
            if cpu and pcpu and cpu[1] > pcpu[1]:
                cpu_pct = 100.0 * max(0, cpu[0] - pcpu[0]) / (cpu[1] - pcpu[1])
            if elapsed > 0:
                if disk is not None and pdisk is not None:
                    disk_rate = max(0, disk - pdisk) / elapsed
                if net is not None and pnet is not None:
                    net_rate = max(0, net - pnet) / elapsed
        self._prev = (now, cpu, disk, net)
        return [
            SystemLoad("CPU", round(cpu_pct, 3)),
            SystemLoad("Memory", round(_memory_percent(self._proc), 3)),
            SystemLoad("DiskIO", round(disk_rate, 3)),
            SystemLoad("NetworkIO", round(net_rate, 3)),
        ]


# ---------------------------------------------------------------- topic rates from broker counters


def _field(obj: Any, name: str, default: Any = 0) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _topic_stats(stats: Any) -> Mapping[str, Any]:
    topics = _field(stats, "topics", None)
    if topics is None:
        raise InvalidArgumentError("broker stats have no 'topics' mapping")
    if isinstance(topics, Mapping):
        return topics
    # a sequence of per-topic entries carrying their own name
    return {_field(t, "topic", None) or _field(t, "topic_name"): t for t in topics}


class RateTracker:
    """Turns cumulative per-topic counters into per-second rates between two reports."""

    def __init__(self) -> None:
        self._prev: dict[str, tuple[float, int, int]] = {}

    def rates(self, topic: str, now: float, messages_total: int, bytes_total: int) -> tuple[int, int]:
        prev = self._prev.get(topic)
        self._prev[topic] = (now, messages_total, bytes_total)
        if prev is None or now <= prev[0]:
            return 0, 0
        elapsed = now - prev[0]
        return (int(max(0, messages_total - prev[1]) / elapsed), int(max(0, bytes_total - prev[2]) / elapsed))

    def forget_missing(self, topics: set[str]) -> None:
        for name in list(self._prev):
            if name not in topics:
                del self._prev[name]


def build_load_report(
    broker_id: str,
    stats: Any,
    *,
    resources: list[SystemLoad] | None = None,
    rates: RateTracker | None = None,
    now: float | None = None,
    timestamp: int | None = None,
) -> LoadReport:
    """A LoadReport from ``broker.stats()`` (see docs/internals.md, "Load reports").

    Per topic, ``message_rate`` / ``byte_rate`` are taken from the stats when they
    carry them, else derived from the cumulative ``messages_in_total`` /
    ``bytes_in_total`` counters through ``rates`` (0 on the first report).
    """
    now = time.monotonic() if now is None else now
    topic_stats = _topic_stats(stats)
    topics = []
    for name in sorted(topic_stats):
        t = topic_stats[name]
        msg_rate = _field(t, "message_rate", None)
        byte_rate = _field(t, "byte_rate", None)
        if msg_rate is None or byte_rate is None:
            if rates is None:
                msg_rate, byte_rate = 0, 0
            else:
                msg_rate, byte_rate = rates.rates(
                    name, now, int(_field(t, "messages_in_total", 0) or 0), int(_field(t, "bytes_in_total", 0) or 0)
                )
        topics.append(
            TopicLoad(
                topic_name=name,
                message_rate=int(msg_rate),
                byte_rate=int(byte_rate),
                byte_rate_mbps=int(byte_rate) / 1_000_000.0,
                producer_count=int(_field(t, "producer_count", 0) or 0),
                consumer_count=int(_field(t, "consumer_count", 0) or 0),
                subscription_count=int(_field(t, "subscription_count", 0) or 0),
                backlog_messages=int(_field(t, "backlog_messages", 0) or 0),
            )
        )
    if rates is not None:
        rates.forget_missing(set(topic_stats))
    return LoadReport(
        resources_usage=list(resources or []),
        topics=topics,
        total_throughput_mbps=sum(t.byte_rate_mbps for t in topics),
        total_message_rate=sum(t.message_rate for t in topics),
        total_lag_messages=sum(t.backlog_messages for t in topics),
        timestamp=int(time.time()) if timestamp is None else int(timestamp),
        broker_id=str(broker_id),
    )


def encode_report(report: LoadReport, *, publish_time_ms: int | None = None) -> bytearray:
    """One unstamped frame: JSON payload, routing key = broker id (so compaction keeps the latest per broker)."""
    publish_time = int(time.time() * 1000) if publish_time_ms is None else publish_time_ms
    return bytearray(
        message_codec.encode_record(
            report.to_json(),
            offset=0,
            publish_time=publish_time,
            producer_id=0,
            key=report.broker_id,
            attributes=REPORT_ATTRIBUTES,
        )
    )


class ReportingBroker(Protocol):
    """What a :class:`LoadReporter` needs of the broker (``BrokerService`` has it)."""

    @property
    def broker_id(self) -> str: ...

    def stats(self) -> Any: ...

    async def publish_system(self, topic: str, frames_buf: bytearray) -> tuple[int, int]: ...


class LoadReporter:
    """Publishes a LoadReport every ``interval_s`` to ``/system/load_reports`` through the broker.

    ``broker`` needs ``stats()`` and ``async publish_system(topic, frames)``
    (docs/internals.md, "Load reports"); ``broker_id`` defaults to ``broker.broker_id``.
    A failed cycle is logged and retried at the next interval; it never stops the task.
    """

    def __init__(
        self,
        broker: ReportingBroker,
        interval_s: float = 30.0,
        *,
        broker_id: str | None = None,
        topic: str = LOAD_REPORTS_TOPIC,
        monitor: ResourceMonitor | None = None,
    ) -> None:
        if not interval_s or interval_s <= 0:
            raise InvalidArgumentError(f"load_report_interval_seconds must be > 0, got {interval_s!r}")
        self._broker = broker
        self.interval_s = float(interval_s)
        self.broker_id = str(broker_id if broker_id is not None else broker.broker_id)
        self.topic = topic
        self._monitor = monitor or ResourceMonitor()
        self._rates = RateTracker()
        self._task: asyncio.Task | None = None
        self.reports_published = 0
        self.failures = 0
        self.last_report: LoadReport | None = None

    async def report_once(self) -> LoadReport:
        """Build one report and append it; returns the report."""
        # /proc reads are small but still file I/O: keep them off the event loop
        resources = await asyncio.to_thread(self._monitor.sample)
        report = build_load_report(self.broker_id, self._broker.stats(), resources=resources, rates=self._rates)
        await self._broker.publish_system(self.topic, encode_report(report))
        self.reports_published += 1
        self.last_report = report
        return report

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.report_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed report must not stop later ones
                self.failures += 1
                log.exception("load report for broker %s failed", self.broker_id)
            next_at += self.interval_s
            if next_at < loop.time():  # a slow cycle: skip the missed ticks rather than burst
                next_at = loop.time() + self.interval_s
            await asyncio.sleep(next_at - loop.time())

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"load-reporter-{self.broker_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

"""The simulator's synthetic cluster: a virtual clock, brokers that report load, the load manager's assignment.

Everything goes through a real :class:`~danube.metadata.embedded.EmbeddedMetadataStore` (registrations,
states, assignments, unassigned markers); only the brokers' load reports and the load manager's
choice of a broker are made up here (``danube.cluster.simulator`` runs the real leader on it).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable

from danube.cluster.load_report import LoadReport, SystemLoad, TopicLoad
from danube.cluster.rebalancing.loop import MetadataMoveExecutor
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Op

EPOCH = 1_700_000_000.0
REPORT_INTERVAL_S = 30.0


class VirtualClock:
    def __init__(self, start: float = EPOCH) -> None:
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class SimTopic:
    name: str
    created_at: float
    mbps: float
    producers: int
    consumers: int
    backlog: int
    growth: Callable[[float], float] | None = None  # traffic multiplier at a virtual time

    def rate(self, now: float) -> float:
        return self.mbps * (self.growth(now) if self.growth else 1.0)


class SimCluster:
    """Synthetic brokers and the load manager's assignment, on a real metadata store."""

    def __init__(self, store: EmbeddedMetadataStore, clock: VirtualClock, *, seed: int = 7) -> None:
        self.store = store
        self.clock = clock
        self.rng = random.Random(seed)
        self.brokers: list[str] = []  # registered, in join order
        self.assigned: dict[str, set[str]] = {}  # mirror of /cluster/brokers/{b}/{ns}/{t}
        self.topics: dict[str, SimTopic] = {}
        self._reports: dict[str, LoadReport] = {}
        self._rr = 0
        self.events: list[tuple[float, str]] = []

    # ------------------------------------------------------------ membership

    async def add_broker(self, broker: str) -> None:
        await self.store.put_json(keys.broker_register(broker), {"broker_id": broker, "broker_url": f"sim://{broker}"})
        await self.store.put_json(keys.broker_state(broker), "active")
        self.brokers.append(broker)
        self.assigned.setdefault(broker, set())
        self.events.append((self.clock.now(), f"+{broker}"))

    async def fail_broker(self, broker: str) -> None:
        """The broker dies: registration gone; the leader unassigns its topics (no hint) and reassigns them."""
        await self.store.delete(keys.broker_register(broker))
        await self.store.delete(keys.broker_state(broker))
        self.brokers.remove(broker)
        self._reports.pop(broker, None)
        ops = []
        for topic in sorted(self.assigned.pop(broker, set())):
            ops += [Op.delete(keys.broker_topic(broker, topic)), Op.put(keys.unassigned(topic), b"null")]
        for i in range(0, len(ops), 128):
            await self.store.txn([], ops[i : i + 128])
        self.events.append((self.clock.now(), f"x{broker}"))
        await self.assign_pending()

    async def set_broker_state(self, broker: str, state: str) -> None:
        await self.store.put_json(keys.broker_state(broker), state)

    # ------------------------------------------------------------ topics and the load manager stand-in

    async def create_topic(self, topic: SimTopic, broker: str | None = None) -> None:
        self.topics[topic.name] = topic
        if broker is None:
            await self.store.put(keys.unassigned(topic.name), b"null")
        else:
            await self.store.put(keys.broker_topic(broker, topic.name), b"null")
            self.assigned[broker].add(topic.name)

    async def _active(self) -> list[str]:
        active = []
        for broker in self.brokers:
            kv = await self.store.get(keys.broker_state(broker))
            if kv is None or json.loads(kv.value) == "active":
                active.append(broker)
        return active

    def _pick(self, active: list[str], exclude: str | None) -> str:
        """Least topics first; round-robin among the brokers within 10 % of the minimum."""
        pool = [b for b in active if b != exclude] or active
        counts = {b: len(self.assigned.get(b, ())) for b in pool}
        low = min(counts.values())
        near = sorted(b for b in pool if counts[b] <= low * 1.1 + 1e-9)
        self._rr += 1
        return near[self._rr % len(near)]

    async def assign_pending(self) -> int:
        """Assign every unassigned topic (the real load manager's reaction to the markers)."""
        active = await self._active()
        if not active:
            return 0
        markers = await self.store.get_prefix(keys.unassigned_prefix())
        for kv in markers:
            topic = "/" + kv.key[len(keys.unassigned_prefix()) :]
            marker = json.loads(kv.value) if kv.value else None
            hint = marker.get("to_broker") if isinstance(marker, dict) else None
            source = marker.get("from_broker") if isinstance(marker, dict) else None
            target = hint if hint in active else self._pick(active, source)
            await self.store.txn([], [Op.put(keys.broker_topic(target, topic), b"null"), Op.delete(kv.key)])
            for topics in self.assigned.values():
                topics.discard(topic)
            self.assigned.setdefault(target, set()).add(topic)
        return len(markers)

    # ------------------------------------------------------------ load reports

    def refresh_reports(self) -> None:
        """Every registered broker reports now (a snapshot of its current topics)."""
        now = self.clock.now()
        for broker in self.brokers:
            topics = []
            cpu, memory = 3.0, 12.0
            for name in sorted(self.assigned.get(broker, ())):
                t = self.topics[name]
                mbps = t.rate(now)
                byte_rate = int(mbps * 1e6)
                topics.append(
                    TopicLoad(
                        topic_name=name,
                        message_rate=int(byte_rate / 1000),
                        byte_rate=byte_rate,
                        byte_rate_mbps=byte_rate / 1e6,
                        producer_count=t.producers,
                        consumer_count=t.consumers,
                        subscription_count=1,
                        backlog_messages=t.backlog,
                    )
                )
                cpu += 0.15 + 1.2 * mbps
                memory += 0.12 + 0.25 * mbps + 0.02 * t.backlog / 1000.0
            cpu = min(100.0, cpu * (1.0 + self.rng.uniform(-0.01, 0.01)))
            memory = min(100.0, memory)
            self._reports[broker] = LoadReport(
                resources_usage=[
                    SystemLoad("CPU", cpu),
                    SystemLoad("Memory", memory),
                    SystemLoad("DiskIO", 0.0),
                    SystemLoad("NetworkIO", 0.0),
                ],
                topics=topics,
                total_throughput_mbps=sum(t.byte_rate_mbps for t in topics),
                total_message_rate=sum(t.message_rate for t in topics),
                total_lag_messages=sum(t.backlog_messages for t in topics),
                timestamp=int(now),
                broker_id=broker,
            )

    async def latest_reports(self) -> dict[str, LoadReport]:  # LoadReportSource
        return dict(self._reports)

    def created_at(self, topic: str) -> float | None:
        t = self.topics.get(topic)
        return None if t is None else t.created_at


class SimMoveExecutor:
    """The real metadata move, then the load manager stand-in reacts at once (as its watch would)."""

    def __init__(self, cluster: SimCluster, inner: MetadataMoveExecutor) -> None:
        self.cluster = cluster
        self.inner = inner

    async def move(self, topic: str, from_broker: str, to_broker: str) -> None:
        await self.inner.move(topic, from_broker, to_broker)
        self.cluster.assigned.get(from_broker, set()).discard(topic)
        await self.cluster.assign_pending()

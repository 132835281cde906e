"""A deterministic simulator of automated rebalancing: virtual time, synthetic brokers, the real leader code.

Everything the leader reads and writes goes through a real
:class:`~danube.metadata.embedded.EmbeddedMetadataStore` (in memory): broker
registrations, states, assignments, unassigned markers and the rebalancing
history.  Only the brokers and the load manager's assignment are synthetic:

- **brokers** report every 30 virtual seconds a LoadReport computed from the topics
  assigned to them (per topic: MB/s, producers, consumers, backlog; CPU % and
  memory % grow with the topics' traffic); a report is a snapshot, so it lags
  behind a move by up to one interval, as on a real cluster;
- **the load manager stand-in** (:meth:`SimCluster.assign_pending`) takes every
  ``/cluster/unassigned/`` marker the way the real one does: the ``to_broker``
  hint when that broker is active, otherwise the least loaded active broker
  (round-robin among those within 10 % of the minimum topic count; never the
  ``from_broker`` of an unload); a failed broker's topics are unassigned
  without a hint;
- the **leader** runs :class:`danube.cluster.rebalancing.Rebalancer` unchanged,
  with a virtual clock; a leader change (the leader's broker fails) starts a
  new Rebalancer that knows only what the store holds.

Scenarios (the use cases of Danube's load manager page): ``add-brokers`` (3 brokers × 100 topics, 2
brokers join), ``broker-failure`` (4 × 150 topics; the leader fails, its topics
fail over, it comes back empty, the next leader hands over mid-rebalancing),
``workload-drift`` (4 × 60 quiet topics; in the afternoon a third of them,
mostly on two brokers, grow fiftyfold).  A run returns the CV over virtual time,
the moves, and the safety checks (hourly rate limit, cooldowns, no topic moved
back within an hour); :func:`write_chart` draws it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from danube.cluster.load_report import LoadReport, SystemLoad, TopicLoad
from danube.cluster.rebalancing import history as _history
from danube.cluster.rebalancing.balance import compute_balance
from danube.cluster.rebalancing.config import OSCILLATION_WINDOW_SECONDS, RATE_WINDOW_SECONDS, RebalancingConfig
from danube.cluster.rebalancing.history import MoveRecord
from danube.cluster.rebalancing.loop import MetadataMoveExecutor, Rebalancer
from danube.cluster.scoring import broker_scores, is_blacklisted
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Op

EPOCH = 1_700_000_000.0
REPORT_INTERVAL_S = 30.0
SCENARIOS = ("add-brokers", "broker-failure", "workload-drift")


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


# ---------------------------------------------------------------- the synthetic cluster


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


# ---------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    name: str
    description: str
    aggressiveness: str
    hours: float
    setup: Callable[[SimCluster], Awaitable[None]]
    events: list[tuple[float, Callable[[SimCluster], Awaitable[None]]]] = field(default_factory=list)
    settle_after_s: float = 0.0  # convergence is measured after this and after the last event


def _topic(rng: random.Random, name: str, created_at: float, *, scale: float = 1.0) -> SimTopic:
    return SimTopic(
        name,
        created_at,
        mbps=scale * rng.lognormvariate(math.log(0.25), 0.8),
        producers=1,
        consumers=rng.choice((1, 1, 2, 3)),
        backlog=rng.randrange(0, 5000),
    )


async def _populate(cluster: SimCluster, brokers: int, per_broker: int, *, scale: float = 1.0) -> None:
    born = cluster.clock.now() - 86400.0
    for i in range(1, brokers + 1):
        await cluster.add_broker(f"broker-{i}")
    for i in range(1, brokers + 1):
        for j in range(per_broker):
            await cluster.create_topic(_topic(cluster.rng, f"/default/b{i}-t{j:03d}", born, scale=scale), f"broker-{i}")
    await cluster.store.put(keys.unassigned("/system/load_reports"), b"null")
    cluster.topics["/system/load_reports"] = SimTopic("/system/load_reports", born, 0.05, 5, 1, 0)
    await cluster.assign_pending()


def scenario(name: str) -> Scenario:
    if name == "add-brokers":

        async def setup(c: SimCluster) -> None:
            await _populate(c, 3, 100)

        async def join(c: SimCluster) -> None:
            await c.add_broker("broker-4")
            await c.add_broker("broker-5")

        return Scenario(
            name,
            "3 brokers with 100 topics each; 2 brokers join after a minute",
            "aggressive",
            12.0,
            setup,
            [(60.0, join)],
        )
    if name == "broker-failure":

        async def setup(c: SimCluster) -> None:
            await _populate(c, 4, 150)

        def fail(b: str):
            async def run(c: SimCluster) -> None:
                await c.fail_broker(b)

            return run

        async def back(c: SimCluster) -> None:
            await c.add_broker("broker-1")

        async def hand_over(c: SimCluster) -> None:  # broker-2 restarts: broker-3 leads, broker-2 rejoins
            c.brokers.remove("broker-2")
            c.brokers.append("broker-2")
            c.events.append((c.clock.now(), "broker-2 restarts"))

        return Scenario(
            name,
            "4 brokers × 150 topics; the leader (broker-1) fails at 0:30 and its topics fail "
            "over; it returns empty at 1:00; at 1:30, mid-rebalancing, the next leader "
            "(broker-2) restarts and broker-3 takes over",
            "balanced",
            10.0,
            setup,
            [(1800.0, fail("broker-1")), (3600.0, back), (5400.0, hand_over)],
        )
    if name == "workload-drift":

        async def setup(c: SimCluster) -> None:
            await _populate(c, 4, 60, scale=0.2)
            start = c.clock.now()
            ramp_from, ramp_to = start + 2 * 3600.0, start + 5 * 3600.0

            def growth(now: float) -> float:  # ×1 in the morning, ×50 from 5:00, linear in between
                f = min(1.0, max(0.0, (now - ramp_from) / (ramp_to - ramp_from)))
                return 1.0 + 49.0 * f

            hot = [n for n in sorted(c.topics) if n.startswith(("/default/b1-", "/default/b2-"))]
            hot = [n for n in hot if c.rng.random() < 0.6]
            hot += [n for n in sorted(c.topics) if n.startswith("/default/b3-") and c.rng.random() < 0.05]
            for n in hot:
                c.topics[n].growth = growth

        return Scenario(
            name,
            "4 brokers × 60 quiet topics; from 2:00 to 5:00 a third of them (mostly on "
            "broker-1 and broker-2) grow fiftyfold",
            "balanced",
            12.0,
            setup,
            settle_after_s=5 * 3600.0,
        )
    raise ValueError(f"unknown scenario {name!r}; expected one of {', '.join(SCENARIOS)}")


# ---------------------------------------------------------------- running one


@dataclass
class SimulationResult:
    scenario: str
    planner: str
    config: RebalancingConfig
    timeline: list[tuple[float, float]]  # (hours since start, CV of the active brokers)
    loads: dict[str, list[tuple[float, float]]]  # broker → (hours, load)
    moves: list[MoveRecord]
    events: list[tuple[float, str]]  # (hours, label)
    statuses: dict[str, int]
    cycle_seconds: list[float]
    final_cv: float
    converged_at_h: float | None  # first time after the last event the CV stayed under
    moves_to_converge: int | None
    reached_at_h: float | None  # first time after the last event the CV was under
    moves_to_threshold: int | None  # moves made until then
    violations: list[str]
    consistent: bool  # the store's assignments equal the simulator's

    @property
    def threshold(self) -> float:
        return self.config.cv_threshold

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "planner": self.planner,
            "config": self.config.to_dict(),
            "threshold": self.threshold,
            "final_cv": self.final_cv,
            "converged_at_h": self.converged_at_h,
            "moves": len(self.moves),
            "moves_to_converge": self.moves_to_converge,
            "reached_at_h": self.reached_at_h,
            "moves_to_threshold": self.moves_to_threshold,
            "max_moves_in_any_hour": max_moves_in_window(self.moves),
            "violations": self.violations,
            "statuses": self.statuses,
            "consistent": self.consistent,
            "cycle_ms_max": 1000 * max(self.cycle_seconds, default=0.0),
            "events": [{"t_h": t, "event": e} for t, e in self.events],
            "timeline": [{"t_h": t, "cv": cv} for t, cv in self.timeline],
            "move_list": [m.to_dict() for m in self.moves],
        }


def max_moves_in_window(moves: list[MoveRecord], window: float = RATE_WINDOW_SECONDS) -> int:
    stamps = sorted(m.timestamp for m in moves)
    best, lo = 0, 0
    for hi, t in enumerate(stamps):
        while stamps[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def check_safety(moves: list[MoveRecord], config: RebalancingConfig) -> list[str]:
    """Every rule the history must satisfy; an empty list when all hold."""
    out = []
    moves = sorted(moves, key=lambda m: m.timestamp)
    busiest_hour = max_moves_in_window(moves)
    if busiest_hour > config.max_moves_per_hour:
        out.append(f"rate limit: {busiest_hour} moves within an hour > {config.max_moves_per_hour}")
    for a, b in zip(moves, moves[1:]):
        if b.timestamp - a.timestamp < config.cooldown_seconds:
            out.append(f"cooldown: moves at {a.timestamp} and {b.timestamp}")
    last: dict[str, MoveRecord] = {}
    left: dict[str, list[tuple[float, str]]] = {}
    for m in moves:
        prev = last.get(m.topic)
        if prev is not None and m.timestamp - prev.timestamp < config.cooldown_seconds:
            out.append(f"topic cooldown: {m.topic} moved twice within {config.cooldown_seconds:g} s")
        for when, broker in left.get(m.topic, ()):
            if m.to_broker == broker and m.timestamp - when < OSCILLATION_WINDOW_SECONDS:
                out.append(f"oscillation: {m.topic} moved back to {broker} within an hour")
        if is_blacklisted(m.topic, config.blacklist_topics):
            out.append(f"blacklist: {m.topic} moved")
        last[m.topic] = m
        left.setdefault(m.topic, []).append((m.timestamp, m.from_broker))
    return out


async def run_scenario(
    name: str,
    *,
    planner: str = "plan",
    aggressiveness: str | None = None,
    hours: float | None = None,
    seed: int = 7,
    **overrides: Any,
) -> SimulationResult:
    sc = scenario(name)
    section = {
        "enabled": True,
        "aggressiveness": aggressiveness or sc.aggressiveness,
        "planner": planner,
        "blacklist_topics": ["/system/*"],
        **overrides,
    }
    config = RebalancingConfig.from_dict(section)
    duration = (hours if hours is not None else sc.hours) * 3600.0
    clock = VirtualClock()
    start = clock.now()
    store = EmbeddedMetadataStore(":memory:", clock=clock.now)
    try:
        cluster = SimCluster(store, clock, seed=seed)
        await sc.setup(cluster)
        cluster.events = []
        events = sorted(sc.events, key=lambda e: e[0])
        leader: list[Any] = [None, None]  # broker id, Rebalancer

        def elect() -> Rebalancer:
            current = cluster.brokers[0] if cluster.brokers else None
            if leader[0] != current or leader[1] is None:
                reb = Rebalancer(
                    store,
                    config,
                    clock=clock,
                    reports=cluster,
                    executor=None,
                    created_at=cluster.created_at,
                    reassignment_timeout_s=0.0,
                )
                reb.executor = SimMoveExecutor(cluster, MetadataMoveExecutor(store, clock))
                leader[0], leader[1] = current, reb
                if current is not None:
                    cluster.events.append((clock.now(), f"leader {current}"))
            return leader[1]

        timeline: list[tuple[float, float]] = []
        loads: dict[str, list[tuple[float, float]]] = {}
        statuses: dict[str, int] = {}
        cycles: list[float] = []
        next_check = start + config.check_interval_seconds
        t = start
        while t <= start + duration + 1e-9:
            while events and start + events[0][0] <= t:
                await events.pop(0)[1](cluster)
            cluster.refresh_reports()
            reports = await cluster.latest_reports()
            active = await cluster._active()
            balance = compute_balance(broker_scores(config.strategy, [reports[b] for b in active if b in reports]))
            h = (t - start) / 3600.0
            timeline.append((h, balance.cv))
            for b, v in balance.loads.items():
                loads.setdefault(b, []).append((h, v))
            if t >= next_check:
                result = await elect().run_cycle()
                statuses[result.status] = statuses.get(result.status, 0) + 1
                cycles.append(result.duration_s)
                next_check += config.check_interval_seconds
            clock.advance(REPORT_INTERVAL_S)
            t = clock.now()
        moves = await _history.RebalancingHistory(store).records()
        store_assigned: dict[str, set[str]] = {}
        for kv in await store.get_prefix(keys.cluster_brokers_prefix()):
            parts = kv.key[len(keys.cluster_brokers_prefix()) :].split("/")
            if len(parts) == 3:
                store_assigned.setdefault(parts[0], set()).add(f"/{parts[1]}/{parts[2]}")
        mirror = {b: s for b, s in cluster.assigned.items() if s}
        consistent = store_assigned == mirror and not await store.get_prefix(keys.unassigned_prefix())
    finally:
        await store.close()
    last_event_h = max([e[0] for e in sc.events] + [sc.settle_after_s]) / 3600.0
    converged = None
    for h, cv in timeline:
        if h < last_event_h:
            continue
        if cv < config.cv_threshold:
            if converged is None:
                converged = h
        else:
            converged = None
    reached = next((h for h, cv in timeline if h >= last_event_h and cv < config.cv_threshold), None)

    def moves_until(h: float | None) -> int | None:
        return None if h is None else sum(1 for m in moves if (m.timestamp - start) / 3600.0 <= h)

    return SimulationResult(
        scenario=name,
        planner=planner,
        config=config,
        timeline=timeline,
        loads=loads,
        moves=moves,
        events=[((when - start) / 3600.0, label) for when, label in cluster.events],
        statuses=statuses,
        cycle_seconds=cycles,
        final_cv=timeline[-1][1] if timeline else 0.0,
        converged_at_h=converged,
        moves_to_converge=moves_until(converged),
        reached_at_h=reached,
        moves_to_threshold=moves_until(reached),
        violations=check_safety(moves, config),
        consistent=consistent,
    )


def simulate(name: str, **kw: Any) -> SimulationResult:
    return asyncio.run(run_scenario(name, **kw))


# ---------------------------------------------------------------- the chart


def write_chart(results: list[SimulationResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0]
    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    ax = axes[0]
    for r in results:
        ax.plot(
            [h for h, _ in r.timeline], [cv for _, cv in r.timeline], label=f"CV ({r.planner}: {len(r.moves)} moves)"
        )
        ax.plot(
            [(m.timestamp - EPOCH) / 3600.0 for m in r.moves],
            [_cv_at(r.timeline, (m.timestamp - EPOCH) / 3600.0) for m in r.moves],
            "|",
            markersize=8,
        )
    ax.axhline(first.threshold, color="red", linestyle="--", label=f"threshold {first.threshold:.2f}")
    for h, label in first.events:
        ax.axvline(h, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(
            label, (h, ax.get_ylim()[1] if ax.get_ylim()[1] else 1.0), fontsize="x-small", rotation=90, va="top"
        )
    ax.set_ylabel("CV (std / mean)")
    ax.set_title(
        f"danube cluster simulate {first.scenario} ({first.config.aggressiveness}, "
        f"max {first.config.max_moves_per_hour} moves/h)"
    )
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    for broker, points in sorted(first.loads.items()):
        axes[1].plot([h for h, _ in points], [v for _, v in points], label=broker)
    axes[1].set_ylabel(f"broker load ({first.config.strategy}, {first.planner})")
    axes[1].set_xlabel("virtual time (hours)")
    axes[1].legend(loc="upper right", fontsize="small")
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cv_at(timeline: list[tuple[float, float]], h: float) -> float:
    best = 0.0
    for t, cv in timeline:
        if t > h:
            break
        best = cv
    return best

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

The synthetic cluster is in ``simulator_cluster.py``, the scenarios in ``simulator_scenarios.py``,
the chart in ``simulator_chart.py``; running a scenario and checking its safety rules are here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from danube.cluster.rebalancing import history as _history
from danube.cluster.rebalancing.balance import compute_balance
from danube.cluster.rebalancing.config import OSCILLATION_WINDOW_SECONDS, RATE_WINDOW_SECONDS, RebalancingConfig
from danube.cluster.rebalancing.history import MoveRecord
from danube.cluster.rebalancing.loop import MetadataMoveExecutor, Rebalancer
from danube.cluster.scoring import broker_scores, is_blacklisted
from danube.cluster.simulator_chart import write_chart
from danube.cluster.simulator_cluster import (
    EPOCH,
    REPORT_INTERVAL_S,
    SimCluster,
    SimMoveExecutor,
    SimTopic,
    VirtualClock,
)
from danube.cluster.simulator_scenarios import SCENARIOS, Scenario, scenario
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore

# What the siblings hold is re-exported: the CLI, tests and benchmarks import the simulator from here only.
__all__ = [
    "EPOCH",
    "REPORT_INTERVAL_S",
    "SCENARIOS",
    "Scenario",
    "SimCluster",
    "SimMoveExecutor",
    "SimTopic",
    "SimulationResult",
    "VirtualClock",
    "check_safety",
    "max_moves_in_window",
    "run_scenario",
    "scenario",
    "simulate",
    "write_chart",
]


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

"""Hypothesis state machines: the real Rebalancer on the simulator's cluster, under random events.

Whatever happens (time passing, workload changes, brokers joining, draining or failing, leader
changes), the history never shows more than max_moves_per_hour moves in an hour, two moves closer
than the cooldown, a topic moved within its cooldown or before min_topic_age, a blacklisted topic
moved, a topic moved back to a broker it left within the hour, or a move to an inactive broker.
"""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from danube.cluster.rebalancing import MetadataMoveExecutor, Rebalancer, RebalancingConfig
from danube.cluster.rebalancing.history import RebalancingHistory
from danube.cluster.simulator import SimCluster, SimMoveExecutor, SimTopic, VirtualClock, check_safety
from danube.metadata.embedded import EmbeddedMetadataStore

BLACKLIST = ["/system/*", "/default/critical-*"]


class RebalancerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = VirtualClock()
        self.store = EmbeddedMetadataStore(":memory:", clock=self.clock.now)
        self.cluster = SimCluster(self.store, self.clock, seed=1)
        self.next_broker = 1
        self.moves_seen = 0
        self.active_at_move: list[tuple[str, set]] = []

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self):
        self.run(self.store.close())
        self.loop.close()

    @initialize(
        level=st.sampled_from(["conservative", "balanced", "aggressive"]),
        max_moves=st.integers(1, 6),
        cooldown=st.sampled_from([0, 30, 300, 900]),
        min_age=st.sampled_from([0, 300, 1800]),
        planner=st.sampled_from(["plan", "greedy"]),
        topics=st.lists(st.tuples(st.floats(0.01, 5.0), st.integers(0, 4000)), min_size=8, max_size=40),
    )
    def setup(self, level, max_moves, cooldown, min_age, planner, topics):
        self.config = RebalancingConfig.from_dict(
            {
                "enabled": True,
                "aggressiveness": level,
                "max_moves_per_hour": max_moves,
                "cooldown_seconds": cooldown,
                "min_topic_age_seconds": min_age,
                "blacklist_topics": BLACKLIST,
                "planner": planner,
            }
        )
        for _ in range(3):
            self.run(self._add())
        now = self.clock.now()
        for i, (mbps, age) in enumerate(topics):
            name = f"/default/critical-{i}" if i % 7 == 0 else f"/default/t{i}"
            topic = SimTopic(name, now - age, mbps, 1, 1 + i % 3, 0)
            self.run(self.cluster.create_topic(topic, "broker-1" if i % 2 == 0 else None))
        self.run(self.cluster.assign_pending())
        self.rebalancer = self._new_leader()
        self.cluster.refresh_reports()

    def _new_leader(self):
        reb = Rebalancer(
            self.store,
            self.config,
            clock=self.clock,
            reports=self.cluster,
            created_at=self.cluster.created_at,
            reassignment_timeout_s=0.0,
        )
        reb.executor = SimMoveExecutor(self.cluster, MetadataMoveExecutor(self.store, self.clock))
        return reb

    async def _add(self):
        await self.cluster.add_broker(f"broker-{self.next_broker}")
        self.next_broker += 1

    @rule(seconds=st.sampled_from([1, 29, 30, 60, 120, 600, 1800]))
    def advance(self, seconds):
        self.clock.advance(seconds)
        self.cluster.refresh_reports()

    @rule()
    def cycle(self):
        active = set(self.run(self.cluster._active()))
        result = self.run(self.rebalancer.run_cycle())
        if result.move is not None:
            self.active_at_move.append((result.move.to_broker, active))

    @rule(factor=st.floats(0.1, 10.0), index=st.integers(0, 1000))
    def workload(self, factor, index):
        names = sorted(self.cluster.topics)
        self.cluster.topics[names[index % len(names)]].mbps *= factor

    @rule()
    def leader_change(self):
        self.rebalancer = self._new_leader()

    @precondition(lambda self: len(self.cluster.brokers) < 6)
    @rule()
    def add_broker(self):
        self.run(self._add())

    @precondition(lambda self: len(self.cluster.brokers) > 2)
    @rule(index=st.integers(0, 10))
    def fail_broker(self, index):
        self.run(self.cluster.fail_broker(self.cluster.brokers[index % len(self.cluster.brokers)]))

    @precondition(lambda self: len(self.cluster.brokers) > 2)
    @rule(index=st.integers(0, 10), state=st.sampled_from(["draining", "drained", "active"]))
    def set_state(self, index, state):
        self.run(self.cluster.set_broker_state(self.cluster.brokers[index % len(self.cluster.brokers)], state))

    @invariant()
    def history_is_safe(self):
        if not hasattr(self, "config"):
            return
        records = self.run(RebalancingHistory(self.store).records())
        assert check_safety(records, self.config) == []
        for r in records:
            born = self.cluster.created_at(r.topic)
            assert r.timestamp - born >= self.config.min_topic_age_seconds
        for to_broker, active in self.active_at_move:
            assert to_broker in active


TestRebalancerMachine = RebalancerMachine.TestCase
TestRebalancerMachine.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)

"""The planner and the history rules as a pure state machine (no store): many more steps than the loop's.

Each ``cycle`` does what the leader decides, with the pure pieces the Rebalancer uses: rate limit and
cooldown from the history, eligibility (blacklist, topic cooldown, minimum age, no return within an
hour), the planner's first move, applied to the model; loads drift and time passes between cycles.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from danube.cluster.rebalancing import history as h
from danube.cluster.rebalancing.balance import ClusterState, TopicInfo
from danube.cluster.rebalancing.candidates import eligibility
from danube.cluster.rebalancing.config import RebalancingConfig
from danube.cluster.rebalancing.planner import plan_moves
from danube.cluster.simulator import check_safety

BLACKLIST = ("/system/*", "/d/pinned-*")


class PlannerMachine(RuleBasedStateMachine):
    @initialize(
        brokers=st.integers(2, 5),
        max_moves=st.integers(1, 8),
        cooldown=st.sampled_from([0, 60, 600]),
        min_age=st.sampled_from([0, 300]),
        threshold=st.sampled_from([0.1, 0.2, 0.3, 0.4]),
        loads=st.lists(st.floats(0.05, 10.0), min_size=4, max_size=30),
        ages=st.randoms(),
    )
    def setup(self, brokers, max_moves, cooldown, min_age, threshold, loads, ages):
        self.config = RebalancingConfig.from_dict(
            {
                "max_moves_per_hour": max_moves,
                "cooldown_seconds": cooldown,
                "min_topic_age_seconds": min_age,
                "blacklist_topics": list(BLACKLIST),
                "cv_threshold": threshold,
            }
        )
        self.now = 1_000_000.0
        self.owner: dict[str, str] = {}
        self.load: dict[str, float] = {}
        self.born: dict[str, float] = {}
        self.brokers = [f"b{i}" for i in range(brokers)]
        for i, x in enumerate(loads):
            name = "/system/s" if i == 0 else (f"/d/pinned-{i}" if i % 5 == 0 else f"/d/t{i}")
            self.owner[name] = self.brokers[0] if i % 3 else self.brokers[i % brokers]
            self.load[name] = x
            self.born[name] = self.now - ages.choice([0, 1000, 100_000, 100_000, 100_000])
        self.records: list[h.MoveRecord] = []

    def state(self) -> ClusterState:
        topics = {b: {} for b in self.brokers}
        for name, b in self.owner.items():
            topics[b][name] = TopicInfo(name, self.load[name], self.load[name])
        loads = {b: sum(t.estimated_load for t in ts.values()) for b, ts in topics.items()}
        return ClusterState(loads, topics)

    @rule(seconds=st.sampled_from([1, 30, 120, 300, 900, 3600]))
    def advance(self, seconds):
        self.now += seconds

    @rule(index=st.integers(0, 100), factor=st.floats(0.2, 5.0))
    def drift(self, index, factor):
        name = sorted(self.load)[index % len(self.load)]
        self.load[name] *= factor

    @rule()
    def cycle(self):
        cfg = self.config
        recent = [r for r in self.records if self.now - r.timestamp < 3600]
        if h.moves_in_window(recent, self.now) >= cfg.max_moves_per_hour:
            return
        if h.in_cooldown(recent, self.now, cfg.cooldown_seconds):
            return
        state = self.state()
        rules = eligibility(cfg, recent, self.now, list(self.owner), self.born)
        plan = plan_moves(state, rules, cfg.cv_threshold, cfg.max_moves_per_hour)
        if not plan:
            return
        move = plan[0]
        assert self.owner[move.topic] == move.from_broker
        self.owner[move.topic] = move.to_broker
        self.records.append(h.MoveRecord(move.topic, move.from_broker, move.to_broker, self.now, move.estimated_load))

    @invariant()
    def safe(self):
        if not hasattr(self, "config"):
            return
        assert check_safety(self.records, self.config) == []
        for r in self.records:
            assert r.timestamp - self.born[r.topic] >= self.config.min_topic_age_seconds


TestPlannerMachine = PlannerMachine.TestCase
TestPlannerMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)

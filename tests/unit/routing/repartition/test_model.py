"""The repartition model: routing, sources/targets, the state machine, the finalize rule, and a
hypothesis state machine that publishes keyed messages through any number of cutovers (clients,
owners' version fences and the delivery gate all lagging) and checks per-key order."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from danube.client.partition_router import PartitionRouter
from danube.routing.repartition.model import (
    CUTOVER,
    GROW,
    MARKED,
    SHRINK,
    PartitioningState,
    RepartitionError,
    lagging,
    route,
    sources_of,
)

KEYS = [f"k{i}" for i in range(5)]  # few keys: a rule picks one that moves often


def test_route_is_the_clients_function():
    for n in (1, 2, 3, 4, 7):
        router = PartitionRouter(n)
        for k in KEYS:
            assert route(k, n) == router.route(k)


@pytest.mark.parametrize("old,new", [(2, 4), (4, 2), (2, 3), (3, 2), (1, 5), (6, 4)])
def test_sources_cover_every_moved_key(old, new):
    for i in range(2000):
        k = f"key-{i}"
        s, t = route(k, old), route(k, new)
        if s != t:
            assert s in sources_of(t, old, new)


def test_grow_2_to_4_sources_and_targets():
    st0 = PartitioningState(2).begin(4, now_ms=5)
    t = st0.transition
    assert t.kind == GROW and t.phase == MARKED and t.to_version == 1
    assert t.sources == {0, 1} and t.targets == {2, 3} and t.new_start == {2: 0, 3: 0}
    assert st0.partitions == 2 and st0.version == 0  # the marker alone changes no routing
    cut = st0.cutover()
    assert cut.partitions == 4 and cut.version == 1 and cut.transition.phase == CUTOVER
    assert cut.is_stale(0) and not cut.is_stale(1)


def test_shrink_4_to_2_holds_post_cutover_offsets_until_sources_drained():
    s = PartitioningState(4, version=3).begin(2).cutover()
    t = s.transition
    assert t.kind == SHRINK and t.sources == {2, 3} and t.targets == {0, 1}
    assert s.live_partitions == 4
    s = s.record_offsets(0, 100).record_offsets(1, 50).record_offsets(2, 7).record_offsets(3, 9)
    s = s.record_offsets(2, 999)  # first value wins
    assert s.transition.old_end == {2: 7, 3: 9} and s.transition.new_start == {0: 100, 1: 50}
    assert not s.holds(0, 99, {}) and s.holds(0, 100, {2: 6}) and not s.holds(0, 100, {2: 7})
    assert s.holds(1, 60, {3: 3}) and not s.holds(1, 60, {3: 9})
    assert not s.drained({"sub": {2: 7, 3: 8}}) and s.drained({"sub": {2: 7, 3: 9}, "b": {}})
    s = s.mark_drain_complete(1000)
    fin = s.finalize()
    assert fin.transition is None and fin.retired == (2, 3) and fin.partitions == 2


def test_a_grow_finalizes_with_a_lagging_subscription_as_a_pending_hold():
    s = PartitioningState(2).begin(4).cutover()
    s = s.record_offsets(0, 10).record_offsets(1, 20).mark_drain_complete(5)
    fin = s.finalize(["idle"])
    assert fin.transition is None and fin.partitions == 4 and fin.retired == ()
    assert [h.subscriptions for h in fin.pending] == [("idle",)]
    # the gate stays for "idle" only, exactly as the transition's
    assert fin.holds(2, 0, {0: 9, 1: 20}, "idle") and not fin.holds(2, 0, {0: 10, 1: 20}, "idle")
    assert not fin.holds(2, 0, {0: 9}, "s") and not fin.holds(0, 50, {}, "idle")
    assert PartitioningState.from_json(fin.to_json()) == fin
    # a later grow's transition gates every subscription; the old hold still gates "idle"
    again = fin.begin(8).cutover().record_offsets(2, 3)
    assert again.holds(2, 0, {0: 9, 1: 20}, "idle") and not again.holds(2, 0, {0: 9, 1: 20}, "s")
    assert again.holds(6, 0, {2: 1}, "s") and not again.holds(6, 0, {2: 3}, "s")
    assert fin.release_holds({}) == fin  # not looked at: kept
    assert fin.release_holds({1: {"idle": {0: 9, 1: 20}}}) == fin  # still behind on 0
    assert fin.release_holds({1: {"idle": {0: 10, 1: 20}}}).pending == ()
    assert fin.release_holds({1: {}}).pending == ()  # the subscription is gone


def test_a_shrink_finalizes_with_a_lagging_subscription_as_a_pending_hold():
    s = PartitioningState(4).begin(2).cutover()
    for p in range(4):
        s = s.record_offsets(p, 10)
    s = s.mark_drain_complete(5)
    fin = s.finalize(["idle"])
    assert fin.transition is None and fin.partitions == 2 and fin.retired == (2, 3)
    assert fin.readable_partitions == 4  # a consumer back later attaches to the retired ones to drain them
    assert [h.subscriptions for h in fin.pending] == [("idle",)]
    assert fin.holds(0, 10, {2: 9}, "idle") and not fin.holds(0, 10, {2: 10}, "idle")
    assert not fin.holds(0, 9, {2: 0}, "idle") and not fin.holds(0, 10, {2: 9}, "s")
    assert fin.release_holds({1: {"idle": {2: 10, 3: 10}}}).pending == ()
    unrecorded = PartitioningState(4).begin(2).cutover().record_offsets(0, 1)
    with pytest.raises(RepartitionError):
        unrecorded.mark_drain_complete(5).finalize(["idle"])  # which offsets would the hold wait for?


def test_finalize_rule():
    s = PartitioningState(2).begin(4).cutover()
    s = s.stamp_adoption(40).stamp_adoption(99)
    assert s.transition.adoption_generation == 40
    assert not s.can_finalize(10**9, 10**9)  # not drained: never
    with pytest.raises(RepartitionError):
        s.finalize()
    s = s.record_offsets(0, 3).record_offsets(1, 4).mark_drain_complete(1000)
    assert not s.can_finalize(1000, None)  # no adoption signal, no timeout yet
    assert not s.can_finalize(1000, 39)
    assert s.can_finalize(1000, 40)
    assert s.can_finalize(31_000, None) and not s.can_finalize(30_999, 39)
    assert s.can_finalize(1500, None, adoption_timeout_ms=500)
    ungated = PartitioningState(2).begin(4).cutover().record_offsets(0, 0).record_offsets(1, 0)
    assert ungated.mark_drain_complete(0).can_finalize(0, None)  # a marker without a generation


def test_refusals_and_json_roundtrip():
    s = PartitioningState(2)
    with pytest.raises(RepartitionError):
        s.begin(2)
    with pytest.raises(RepartitionError):
        s.begin(0)
    with pytest.raises(RepartitionError):
        s.cutover()
    m = s.begin(3, now_ms=7)
    with pytest.raises(RepartitionError):
        m.begin(5)
    c = m.cutover().stamp_adoption(12).record_offsets(1, 5)
    assert PartitioningState.from_json(c.to_json()) == c
    assert PartitioningState.from_json(PartitioningState(4, 2, None, (5,)).to_json()).retired == (5,)


# ---------------------------------------------------------------- the per-key order model


class RepartitionMachine(RuleBasedStateMachine):
    """One client, the owners' fences, one exclusive subscription per partition.

    The client sends under the version it knows; a message refused as stale goes back to the
    client, which adopts the new routing only once nothing it sent is in flight (the producer's
    cutover barrier) and resends refused messages first.  Owners apply a new version lazily (a
    watch) and record their offsets when they do; a publish newer than the owner's version makes
    it catch up first.  The consumer delivers a partition's next offset unless the gate holds it.
    A second subscription, "idle", consumes only while it is awake: a grow or a shrink may finalize
    while it sleeps behind (a pending hold keeps its gate); it reads the retired partitions too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = PartitioningState(2)
        self.logs: dict[int, list[tuple[str, int]]] = {0: [], 1: []}
        self.sealed: set[int] = set()
        self.fence: dict[int, int] = {0: 0, 1: 0}
        self.client_version = 0
        self.client_partitions = 2
        self.learned = 0
        self.pending: list[tuple[str, int]] = []  # unsent, in publish order
        self.inflight: dict[int, list[tuple[str, int, int]]] = {}
        self.next_seq = {k: 0 for k in KEYS}
        self.cursor: dict[int, int] = {0: 0, 1: 0}  # next offset to deliver = consumed-below
        self.seen = {k: -1 for k in KEYS}
        self.idle_cursor: dict[int, int] = {0: 0, 1: 0}
        self.idle_seen = {k: -1 for k in KEYS}
        self.idle_awake = False
        self.now = 0
        self.acked_generation: int | None = None
        self.generation = 0

    # ---- the client
    @rule(key=st.sampled_from(KEYS))
    def publish(self, key):
        self.pending.append((key, self.next_seq[key]))
        self.next_seq[key] += 1

    @precondition(lambda self: self.pending)
    @rule()
    def send(self):
        if self.learned > self.client_version:
            if any(self.inflight.values()):
                return  # the barrier: wait for acks/refusals
            self.client_version = self.learned
            self.client_partitions = self.state.partitions
        key, seq = self.pending.pop(0)
        p = route(key, self.client_partitions)
        self.inflight.setdefault(p, []).append((key, seq, self.client_version))

    @rule()
    def push_topology(self):
        self.learned = self.state.version  # the topology push (any time)
        self.acked_generation = self.generation

    # ---- the owners
    @rule(p=st.integers(0, 4))
    def store_head(self, p):
        busy = sorted(q for q, m in self.inflight.items() if m)
        if not busy:
            return
        p = busy[p % len(busy)]  # the rule's number picks among the partitions with messages in flight
        q = self.inflight[p]
        key, seq, version = q[0]
        if version > self.fence.get(p, 0):
            self.apply(p)  # catch up before accepting a newer version
        if version < self.fence.get(p, 0) or p in self.sealed or p >= self.state.live_partitions:
            # refused: the client re-routes it; everything it sent after it to p comes back too,
            # ahead of what it has not sent yet (one stream: the rest of its batches are refused)
            refused = [(k, s) for k, s, _ in q]
            q.clear()
            self.pending[:0] = refused
            self.learned = max(self.learned, self.state.version)
            return
        q.pop(0)
        self.logs.setdefault(p, []).append((key, seq))

    @rule(p=st.integers(0, 4))
    def apply(self, p):
        if self.fence.get(p, 0) >= self.state.version or p >= self.state.live_partitions:
            return
        self.fence[p] = self.state.version
        if self.state.transition is not None and self.state.transition.phase == CUTOVER:
            self.state = self.state.record_offsets(p, len(self.logs.setdefault(p, [])))

    # ---- the controller
    @precondition(lambda self: self.state.transition is None)
    @rule(n=st.integers(1, 4))
    def repartition(self, n):
        if n == self.state.partitions:
            return
        self.state = self.state.begin(n, now_ms=self.now).cutover()
        self.generation += 1
        self.state = self.state.stamp_adoption(self.generation)
        for p in range(self.state.partitions):
            self.logs.setdefault(p, [])
            self.cursor.setdefault(p, 0)
            self.idle_cursor.setdefault(p, 0)
            self.sealed.discard(p)

    @precondition(lambda self: self.state.transition is not None or self.state.pending)
    @rule(dt=st.integers(0, 20_000))
    def tick(self, dt):
        self.now += dt
        consumed = {"sub": dict(self.cursor), "idle": dict(self.idle_cursor)}
        if self.state.pending:
            self.state = self.state.release_holds({h.transition.to_version: consumed for h in self.state.pending})
        t = self.state.transition
        if t is None or not t.offsets_recorded:
            return
        behind = lagging(t, consumed)
        if t.drain_complete_ms is None:
            # the controller: "idle" asleep behind counts as idle (the transition drains without it)
            if not behind or (behind == ["idle"] and not self.idle_awake):
                self.state = self.state.mark_drain_complete(self.now)
        if self.state.can_finalize(self.now, self.acked_generation):
            t = self.state.transition
            before = self.state
            self.state = self.state.finalize(behind)
            assert not lagging(t, {"sub": consumed["sub"]})
            assert before.adopted(self.acked_generation) or self.now - t.drain_complete_ms >= 30_000
            self.sealed |= set(range(t.to_partitions, t.from_partitions))

    @rule()
    def idle_wakes_or_sleeps(self):
        self.idle_awake = not self.idle_awake

    # ---- the consumer
    @rule(p=st.integers(0, 4))
    def deliver(self, p):
        self._deliver(p, "sub", self.cursor, self.seen)

    @precondition(lambda self: self.idle_awake)
    @rule(p=st.integers(0, 4))
    def deliver_idle(self, p):
        self._deliver(p, "idle", self.idle_cursor, self.idle_seen)

    def _deliver(self, p, sub, cursor, seen):
        ready = sorted(q for q, log in self.logs.items() if cursor.get(q, 0) < len(log))
        if not ready:
            return
        p = ready[p % len(ready)]
        log = self.logs[p]
        off = cursor.get(p, 0)
        if off >= len(log) or self.state.holds(p, off, cursor, sub):
            return
        key, seq = log[off]
        assert seq == seen[key] + 1, f"{sub}: key {key}: {seq} after {seen[key]} (partition {p})"
        seen[key] = seq
        cursor[p] = off + 1

    @invariant()
    def nothing_duplicated(self):
        stored = [m for log in self.logs.values() for m in log]
        assert len(stored) == len(set(stored))

    def teardown(self):
        # drain everything: every message is stored and delivered exactly once, in order per key
        self.idle_awake = True
        for _ in range(10_000):
            self.push_topology()
            if self.pending:
                self.send()
            for i in range(len(self.inflight)):
                self.store_head(i)
            for p in list(self.logs):
                self.apply(p)
            for i in range(len(self.logs)):
                self.deliver(i)
                self.deliver_idle(i)
            if self.state.transition is not None or self.state.pending:
                self.tick(40_000)
            if (
                not self.pending
                and not any(self.inflight.values())
                and all(
                    self.cursor.get(p, 0) == len(log) and self.idle_cursor.get(p, 0) == len(log)
                    for p, log in self.logs.items()
                )
                and self.state.transition is None
                and not self.state.pending
            ):
                break
        assert all(self.seen[k] == self.next_seq[k] - 1 for k in KEYS), (self.seen, self.next_seq)
        assert all(self.idle_seen[k] == self.next_seq[k] - 1 for k in KEYS), (self.idle_seen, self.next_seq)


TestRepartitionMachine = RepartitionMachine.TestCase
TestRepartitionMachine.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _settle(m: RepartitionMachine, *, idle_awake: bool, until=lambda m: False, rounds: int = 500) -> None:
    """The machine's rules in a fixed order (what teardown does), the idle subscription awake or not."""
    m.idle_awake = idle_awake
    for _ in range(rounds):
        m.push_topology()
        if m.pending:
            m.send()
        for i in range(len(m.inflight)):
            m.store_head(i)
        for p in list(m.logs):
            m.apply(p)
        for i in range(len(m.logs)):  # partitions in index order: a surviving one before a retired one
            m.deliver(i)
            if idle_awake:
                m.deliver_idle(i)
        if m.state.transition is not None or m.state.pending:
            m.tick(40_000)
        if until(m):
            return


def test_an_idle_subscription_reads_in_order_across_a_shrink_that_finalized_with_its_hold():
    """The machine, driven: the idle subscription sleeps behind on the partitions a shrink retires,
    the shrink finalizes with a pending hold, then it wakes and reads the surviving partitions first
    (fails when a shrink's hold is not gated: the moved keys' new messages before their old ones)."""
    m = RepartitionMachine()
    for k in KEYS * 2:
        m.publish(k)
    m.repartition(4)
    _settle(m, idle_awake=True, until=lambda m: m.state.transition is None and not m.pending)
    assert m.state.partitions == 4 and m.state.transition is None
    for k in KEYS * 3:  # on all 4 partitions; the idle subscription does not read them
        m.publish(k)
    _settle(m, idle_awake=False, until=lambda m: not m.pending and not any(m.inflight.values()))
    assert any(m.idle_cursor.get(p, 0) < len(m.logs[p]) for p in (2, 3))
    m.repartition(2)
    for k in KEYS * 3:  # the moved keys' next messages land on 0 and 1
        m.publish(k)
    _settle(m, idle_awake=False, until=lambda m: m.state.transition is None and not m.pending)
    assert m.state.retired == (2, 3) and [h.subscriptions for h in m.state.pending] == [("idle",)]
    _settle(m, idle_awake=True, until=lambda m: not m.state.pending)  # asserts per-key order as it reads
    m.teardown()

"""The finalizer and the adoption labels (embedded store and real etcd): finalize only after the
drain and adoption; a silent client delays it no longer than the adoption timeout; a dead broker's
label is ignored; no label anywhere leans on the timeout; only the leader finalizes."""

import json

from danube.metadata import keys
from danube.routing.repartition.controller import AdoptionReporter, Finalizer, global_adoption
from danube.routing.repartition.store import RepartitionStore
from danube.routing.repartition.topology import AdoptionTracker

T = "/default/orders"


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


async def grown(metadata, store):
    await metadata.put_json(keys.topic_partitions(T), 2)
    for p in range(2):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 4)
    await store.repartition(T, 4, now_ms=0)
    for p in range(4):
        await store.record_offsets(T, p, 10)
    return (await store.load(T)).state


def finalizer(store, clock, live=("b1", "b2"), leader=True, timeout=30_000):
    return Finalizer(
        store, lambda: {}, is_leader=lambda: leader, live_brokers=lambda: live, adoption_timeout_ms=timeout, clock=clock
    )


async def tick(f, store):
    state = (await store.load(T)).state  # what the broker's watch would hold
    f._states = lambda: {T: state}
    return await f.tick()


async def test_finalize_waits_for_drain_then_adoption(metadata):
    store, clock = RepartitionStore(metadata), Clock()
    state = await grown(metadata, store)
    gen = state.transition.adoption_generation
    f = finalizer(store, clock)
    assert await tick(f, store) == []  # cursors at 4 < old_end 10: not drained
    for p in range(2):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 9)
    await metadata.put_json(keys.routing_adoption("b1"), {"lowest": gen})
    await metadata.put_json(keys.routing_adoption("b2"), {"lowest": gen - 1})  # b2 lags
    assert await tick(f, store) == []
    assert (await store.load(T)).state.transition.drain_complete_ms == clock.ms
    await metadata.put_json(keys.routing_adoption("b2"), {"lowest": gen})
    assert await tick(f, store) == [T]
    assert f.finalized[0]["adopted"] and (await store.load(T)).state.transition is None


async def test_silent_client_delays_finalize_no_longer_than_the_timeout(metadata):
    store, clock = RepartitionStore(metadata), Clock()
    state = await grown(metadata, store)
    for p in range(2):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 9)
    gen = state.transition.adoption_generation
    # b1's connections acked; b2 has a connection that acked once before the cutover and went silent
    await metadata.put_json(keys.routing_adoption("b1"), {"lowest": gen})
    await metadata.put_json(keys.routing_adoption("b2"), {"lowest": gen - 5})
    f = finalizer(store, clock, timeout=2_000)
    assert await tick(f, store) == []
    clock.ms += 1_999
    assert await tick(f, store) == []
    clock.ms += 1
    assert await tick(f, store) == [T]
    assert not f.finalized[0]["adopted"]


async def test_dead_brokers_label_is_ignored(metadata):
    store, clock = RepartitionStore(metadata), Clock()
    state = await grown(metadata, store)
    for p in range(2):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 9)
    gen = state.transition.adoption_generation
    await metadata.put_json(keys.routing_adoption("b1"), {"lowest": gen})
    await metadata.put_json(keys.routing_adoption("dead"), {"lowest": 1})  # frozen at departed clients
    assert await global_adoption(metadata, ["b1"]) == gen
    assert await global_adoption(metadata, ["b1", "dead"]) == 1
    assert await global_adoption(metadata, ["nobody"]) is None
    f = finalizer(store, clock, live=("b1",))
    assert await tick(f, store) == [T]  # at once: not on the timeout
    assert f.finalized[0]["adopted"]


async def test_no_signal_leans_on_the_timeout_and_only_the_leader_acts(metadata):
    store, clock = RepartitionStore(metadata), Clock()
    await grown(metadata, store)
    for p in range(2):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 9)
    follower = finalizer(store, clock, leader=False)
    clock.ms += 10**9
    assert await tick(follower, store) == []
    leader = finalizer(store, clock)
    assert await tick(leader, store) == []  # drain-complete now; timeout from here
    clock.ms += 30_000
    assert await tick(leader, store) == [T]


async def test_reporter_writes_the_lowest_acked_generation(metadata):
    tracker = AdoptionTracker()
    reporter = AdoptionReporter(metadata, "b1", tracker)
    await reporter.report_once()
    assert json.loads((await metadata.get(keys.routing_adoption("b1"))).value)["lowest"] is None
    tracker.ack(1, 50)
    tracker.ack(2, 40)
    tracker.ack(2, 30)  # acks only move up
    await reporter.report_once()
    assert json.loads((await metadata.get(keys.routing_adoption("b1"))).value)["lowest"] == 40
    tracker.drop(2)
    assert tracker.lowest() == 50


async def test_an_idle_subscription_does_not_hold_a_grow_but_keeps_its_gate(metadata):
    store, clock = RepartitionStore(metadata), Clock()
    state = await grown(metadata, store)
    gen = state.transition.adoption_generation
    for p in range(2):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 9)  # drained
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "idle"), 3)  # behind
    await metadata.put_json(keys.routing_adoption("b1"), {"lowest": gen})
    await metadata.put_json(keys.routing_adoption("b2"), {"lowest": gen})
    f = finalizer(store, clock, timeout=2_000)
    assert await tick(f, store) == []
    clock.ms += 1_000
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-0", "idle"), 5)  # it moved: not idle
    assert await tick(f, store) == []
    clock.ms += 1_999
    assert await tick(f, store) == []
    assert (await store.load(T)).state.transition.drain_complete_ms is None
    clock.ms += 1  # still for the whole idle window
    assert await tick(f, store) == [T]
    assert f.finalized[0]["held"] == ["idle"] and f.finalized[0]["adopted"]
    state = (await store.load(T)).state
    assert state.transition is None and [h.subscriptions for h in state.pending] == [("idle",)]
    assert state.holds(2, 0, {0: 6, 1: 4}, "idle") and not state.holds(2, 0, {0: 6, 1: 4}, "s")
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-0", "idle"), 9)
    assert await tick(f, store) == [] and (await store.load(T)).state.pending != ()  # part-1 still behind
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-1", "idle"), 9)
    assert await tick(f, store) == [] and (await store.load(T)).state.pending == ()  # drained: dropped


async def test_an_idle_subscription_does_not_hold_a_shrink_but_keeps_its_gate(metadata):
    store, clock = RepartitionStore(metadata), Clock()
    await metadata.put_json(keys.topic_partitions(T), 4)
    for p in range(4):
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-{p}", "s"), 9)
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-3", "idle"), 3)
    await store.repartition(T, 2, now_ms=0)
    for p in range(4):
        await store.record_offsets(T, p, 10)
    f = finalizer(store, clock, timeout=2_000)
    assert await tick(f, store) == []
    clock.ms += 1_999
    assert await tick(f, store) == []
    assert (await store.load(T)).state.transition.drain_complete_ms is None
    clock.ms += 1  # not moved for the idle window: drained without it
    assert await tick(f, store) == []  # adoption: no signal, so the timeout from here
    clock.ms += 2_000
    assert await tick(f, store) == [T]
    assert f.finalized[0]["held"] == ["idle"]
    state = (await store.load(T)).state
    assert state.transition is None and state.retired == (2, 3)
    assert [h.subscriptions for h in state.pending] == [("idle",)]
    # the surviving partition 1 (merge source 3) holds "idle" from new_start until it read 3 up to 10
    assert state.holds(1, 10, {3: 4}, "idle") and not state.holds(1, 10, {3: 4}, "s")
    assert not state.holds(1, 9, {3: 4}, "idle") and not state.holds(0, 10, {3: 4}, "idle")  # 2: nothing
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-3", "idle"), 9)
    assert await tick(f, store) == [] and (await store.load(T)).state.pending == ()  # drained: dropped


async def test_a_stalled_subscription_is_named_in_the_log_with_its_offsets(metadata, caplog):
    store, clock = RepartitionStore(metadata), Clock()
    await grown(metadata, store)
    f = finalizer(store, clock)
    f.stall_log_ms = 5_000
    with caplog.at_level("WARNING", logger="danube.routing.repartition.controller"):
        await tick(f, store)
        clock.ms += 4_000
        await tick(f, store)
        assert not [r for r in caplog.records if "waits for subscription" in r.getMessage()]  # not yet
        clock.ms += 1_000
        await tick(f, store)
        stalled = [r.getMessage() for r in caplog.records if "waits for subscription" in r.getMessage()]
        assert len(stalled) == 1
        assert "subscription s" in stalled[0] and "partition 0 consumed below 5, needs 10" in stalled[0]
        assert "partition 1 consumed below 5, needs 10" in stalled[0]
        await tick(f, store)  # once per window, not every pass
        await metadata.put_json(keys.subscription_cursor(f"{T}-part-0", "s"), 6)  # it moved: quiet again
        clock.ms += 5_000
        await tick(f, store)
        assert len([r for r in caplog.records if "waits for subscription" in r.getMessage()]) == 1


async def test_describe_shows_what_the_cutover_waits_for_and_the_pending_holds(metadata):
    from types import SimpleNamespace

    from danube.routing.repartition import admin

    broker = SimpleNamespace(metadata=metadata, broker_id="b1", cluster=None)
    store, clock = RepartitionStore(metadata), Clock()
    await grown(metadata, store)
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-0", "fast"), 9)
    await metadata.put_json(keys.subscription_cursor(f"{T}-part-1", "fast"), 9)
    progress = (await admin.describe(broker, T))["progress"]
    assert progress["waiting"] == [
        {"subscription": "s", "partition": 0, "consumed": 5, "old_end": 10},
        {"subscription": "s", "partition": 1, "consumed": 5, "old_end": 10},
    ]
    f = finalizer(store, clock, timeout=1_000)  # "s" idle for the window: a pending hold
    await tick(f, store)
    clock.ms += 1_000
    await tick(f, store)
    clock.ms += 1_000
    assert await tick(f, store) == [T]
    progress = (await admin.describe(broker, T))["progress"]
    assert "waiting" not in progress
    assert progress["pending"] == [
        {
            "to_version": 1,
            "to_partitions": 4,
            "subscriptions": ["s"],
            "waiting": [
                {"subscription": "s", "partition": 0, "consumed": 5, "old_end": 10},
                {"subscription": "s", "partition": 1, "consumed": 5, "old_end": 10},
            ],
        }
    ]

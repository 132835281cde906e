"""ScalableTopicController: election, split/merge in PIP-468's order, crash recovery at every step,
consumer sessions with grace timers (embedded store and a real etcd)."""

import pytest

from danube.metadata import keys
from danube.model.segment_layout import SegmentLayout, segment_topic_name
from danube.routing.scalable.controller import (
    STEPS,
    LayoutConflictError,
    NotLeaderError,
    ScalableTopicController,
    create_scalable_topic,
    delete_scalable_topic,
)
from danube.routing.scalable.store import ScalableTopicStore
from tests.support.waiting import async_wait_until
from tests.unit.routing.fakes import MemorySegmentOps, StoreLease

T = "/default/events"


class Crash(Exception):
    pass


async def controller(metadata, ops, url, *, grace=30.0, hook=None, start=True):
    lease = await StoreLease.grant(metadata)
    ctl = ScalableTopicController(T, ScalableTopicStore(metadata), ops, lease, url, grace_seconds=grace, step_hook=hook)
    if start:
        await ctl.start()
        await ctl.wait_leader()
    return ctl


async def crash(metadata, ctl):
    """The broker dies: no resignation, its lease goes away."""
    await ctl.stop(resign=False)
    await metadata.revoke_lease(ctl.lease.lease_id)


def seg_topic(layout, sid):
    return segment_topic_name(T, layout.segment(sid))


async def test_one_leader_forwarding_and_failover(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    a = await controller(metadata, ops, "http://a:1")
    b = await controller(metadata, ops, "http://b:1")
    assert a.is_leader and not b.is_leader and b.leader_url == "http://a:1"
    assert await store.controller_url(T) == "http://a:1"
    with pytest.raises(NotLeaderError) as info:
        await b.split_segment(0)
    assert info.value.leader_url == "http://a:1"
    await crash(metadata, a)
    await async_wait_until(lambda: b.is_leader)
    layout = await b.split_segment(0)
    assert [s.segment_id for s in layout.active_segments] == [1, 2]
    await b.stop()
    assert await store.controller_url(T) == ""


async def test_split_then_merge_in_pip468_order(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    ctl = await controller(metadata, ops, "http://a:1")
    await ctl.create_subscription("billing")
    root = (await store.load(T)).layout
    ops.segments[seg_topic(root, 0)].subscriptions["audit"] = 5  # a subscription only the segment knows
    ops.calls.clear()
    one = await ctl.split_segment(0)
    assert ops.calls == [("create", seg_topic(one, 1)), ("create", seg_topic(one, 2)), ("terminate", seg_topic(one, 0))]
    for sid in (1, 2):  # every cursor carried to the children
        assert set(ops.segments[seg_topic(one, sid)].subscriptions) == {"audit", "billing"}
    assert ops.segments[seg_topic(one, 0)].terminated
    two = await ctl.split_segment(1)
    assert [(s.hash_range.start, s.hash_range.end) for s in two.active_segments] == [
        (0, 16383),
        (16384, 32767),
        (32768, 65535),
    ]
    ops.calls.clear()
    three = await ctl.merge_segments(4, 3)
    assert ops.calls == [
        ("create", seg_topic(three, 5)),
        ("terminate", seg_topic(three, 3)),
        ("terminate", seg_topic(three, 4)),
    ]
    assert (await store.load(T)).layout == three and three.epoch == 3
    assert three.segment(5).parent_ids == (3, 4)
    assert await store.load_operation(T) is None
    await ctl.stop()
    assert await delete_scalable_topic(store, ops, T)
    assert ops.segments == {} and await metadata.get_prefix(keys.scalable_topic(T)) == []


@pytest.mark.parametrize("step", STEPS)
async def test_a_crash_at_every_step_is_completed_or_rolled_back(metadata, step):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)

    async def hook(name):
        if name == step:
            raise Crash(name)

    a = await controller(metadata, ops, "http://a:1", hook=hook)
    await a.create_subscription("billing")
    with pytest.raises(Crash):
        await a.split_segment(0)
    await crash(metadata, a)
    b = await controller(metadata, ops, "http://b:1")
    assert b.is_leader
    stored = await store.load(T)
    layout = stored.layout.validate()
    assert await store.load_operation(T) is None
    parent = segment_topic_name(T, SegmentLayout.initial(1).segment(0))
    if step in ("intent", "children_created"):  # before the point of no return: undone
        assert layout.epoch == 0 and layout.segment(0).is_active
        assert set(ops.segments) == {parent} and not ops.segments[parent].terminated
    else:  # parent sealed (or about to be): completed
        assert layout.epoch == 1 and [s.segment_id for s in layout.active_segments] == [1, 2]
        assert ops.segments[parent].terminated
        for sid in (1, 2):
            child = ops.segments[seg_topic(layout, sid)]
            assert not child.terminated and "billing" in child.subscriptions
    # the new leader keeps working
    after = await b.split_segment(layout.active_segments[0].segment_id)
    after.validate()
    await b.stop()


async def test_a_concurrent_change_fails_the_cas(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 2)

    async def hook(name):
        if name == "terminate_marked":  # someone else moves the layout meanwhile
            stored = await store.load(T)
            await store.cas_layout(T, stored.version, stored.layout.split_segment(1))

    ctl = await controller(metadata, ops, "http://a:1", hook=hook)
    with pytest.raises(LayoutConflictError):
        await ctl.split_segment(0)
    await ctl.stop()


async def test_consumer_sessions_grace_and_failover(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 4)
    # graces long enough that a reconnect "in time" cannot lose a race with a loaded machine
    a = await controller(metadata, ops, "http://a:1", grace=2.0)
    pushed = {"c1": [], "c2": []}
    c1 = await a.register_consumer("s", "c1", 11, pushed["c1"].append)
    assert c1.segment_ids == [0, 1, 2, 3]
    c2 = await a.register_consumer("s", "c2", 12, pushed["c2"].append)
    # round robin (segments by range start, consumers by name); c1 got its new assignment pushed
    assert pushed["c1"][-1].segment_ids == [0, 2] and c2.segment_ids == [1, 3]
    pushed["c2"].clear()
    assert (await store.consumers(T, "s"))["c1"]["assignedSegments"][0]["segmentId"] == 0
    # reconnect within the grace period: same assignment, nobody disturbed
    a.consumer_disconnected("s", "c1")
    again = await a.register_consumer("s", "c1", 11, pushed["c1"].append)
    assert again.segment_ids == [0, 2] and pushed["c2"] == []
    # stay away past the grace period: evicted, c2 gets everything
    a.consumer_disconnected("s", "c1")
    await async_wait_until(lambda: pushed["c2"] and pushed["c2"][-1].segment_ids == [0, 1, 2, 3])
    assert list(await store.consumers(T, "s")) == ["c2"]
    c1 = await a.register_consumer("s", "c1", 11, pushed["c1"].append)
    assert c1.segment_ids == [0, 2] and pushed["c2"][-1].segment_ids == [1, 3]
    # the leader dies: the new one restores both sessions, each with a fresh grace period
    await crash(metadata, a)
    b = await controller(metadata, ops, "http://b:1", grace=2.0)
    assert set(b.coordinators["s"].sessions) == {"c1", "c2"}
    resumed = await b.register_consumer("s", "c2", 12)  # c2 comes back in time
    assert resumed.segment_ids == [1, 3]
    # c1 does not: evicted once its fresh grace period ends
    await async_wait_until(lambda: list(b.coordinators["s"].sessions) == ["c2"])
    assert b.coordinators["s"].sessions["c2"].assignment.segment_ids == [0, 1, 2, 3]
    assert list(await store.consumers(T, "s")) == ["c2"]
    await b.stop()


async def test_children_wait_until_their_parents_are_drained(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    ctl = await controller(metadata, ops, "http://a:1")
    pushed = []
    await ctl.register_consumer("s", "x", 1, pushed.append)
    await ctl.register_consumer("s", "y", 2)
    layout = await ctl.split_segment(0)
    x = pushed[-1]
    # x holds the sealed parent (undrained) and the left child, which waits for it
    assert [(s.segment_id, s.sealed, s.waiting_for) for s in x.segments] == [(0, True, ()), (1, False, (0,))]
    y = ctl.coordinators["s"].sessions["y"].assignment
    assert [(s.segment_id, s.waiting_for) for s in y.segments] == [(2, (0,))]
    ops.segments[seg_topic(layout, 0)].subscriptions["s"] = 3
    with pytest.raises(Exception, match="unacknowledged"):
        await ctl.segment_drained("s", 0)
    ops.segments[seg_topic(layout, 0)].subscriptions["s"] = 0
    assert await ctl.segment_drained("s", 0)
    assert [(s.segment_id, s.waiting_for) for s in pushed[-1].segments] == [(1, ())]
    assert (await store.subscriptions(T))["s"]["drainedSegments"] == [0]
    await ctl.stop()


async def test_a_deleted_topic_ends_the_election(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    a = await controller(metadata, ops, "http://a:1")
    b = await controller(metadata, ops, "http://b:1")
    await delete_scalable_topic(store, ops, T)  # deletes the controller key too: b campaigns, finds no topic
    await async_wait_until(lambda: not b.election.running)
    assert await metadata.get(keys.scalable_controller(T)) is None
    await a.stop()
    await b.stop()


async def test_automatic_split_of_a_busy_segment(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 2)
    lease = await StoreLease.grant(metadata)
    ctl = ScalableTopicController(
        T, store, ops, lease, "http://a:1", auto_split_rate=100.0, auto_split_interval=3600, max_segments=3
    )
    await ctl.start()
    await ctl.wait_leader()
    layout = ctl.layout
    assert await ctl.auto_split_tick(0.0) is None  # first sight
    ops.segments[seg_topic(layout, 0)].messages_in = 50  # 50 msg/s: below
    ops.segments[seg_topic(layout, 1)].messages_in = 500  # 500 msg/s: split
    assert await ctl.auto_split_tick(1.0) == 1
    assert [s.segment_id for s in ctl.layout.active_segments] == [0, 2, 3]
    ops.segments[seg_topic(layout, 0)].messages_in = 5000
    assert await ctl.auto_split_tick(2.0) is None  # max_segments reached
    await ctl.stop()

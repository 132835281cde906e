"""Pruning sealed segments: only when every subscription drained them, parents first, children
present, after the retention; the layout CAS and the record, the segment topic deleted, a crash in
between completed by the next leader (embedded store and a real etcd)."""

import pytest

from danube.errors import InvalidArgumentError
from danube.metadata import keys
from danube.model.segment_layout import segment_topic_name
from danube.routing.scalable.config import ScalableTopicsConfig
from danube.routing.scalable.controller import (
    PRUNE_STEP,
    ScalableTopicController,
    create_scalable_topic,
)
from danube.routing.scalable.store import ScalableTopicStore
from tests.unit.routing.fakes import MemorySegmentOps, StoreLease

T = "/default/events"


class Crash(Exception):
    pass


async def leader(metadata, ops, url, *, retention=10.0, hook=None):
    lease = await StoreLease.grant(metadata)
    ctl = ScalableTopicController(
        T, ScalableTopicStore(metadata), ops, lease, url, step_hook=hook, sealed_retention=retention
    )
    await ctl.start()
    await ctl.wait_leader()
    assert ctl.is_leader
    return ctl


def topic_of(layout, sid):
    return segment_topic_name(T, layout.segment(sid))


async def test_a_sealed_segment_goes_once_every_subscription_drained_it_and_the_retention_passed(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    ctl = await leader(metadata, ops, "http://a:1", retention=10.0)
    await ctl.create_subscription("billing")
    await ctl.create_subscription("work", "queue")
    pushed = []
    await ctl.register_consumer("billing", "c1", 1, pushed.append)
    before = await ctl.split_segment(0)
    parent = topic_of(before, 0)
    ops.segments[parent].subscriptions.update(billing=3, work=0)  # billing still has 3 to read
    assert 0 in pushed[-1].segment_ids  # the ordered consumer reads the sealed parent first

    assert await ctl.prune_tick(100.0) == []
    assert await ctl.prune_tick(200.0) == []  # not drained: the retention clock has not started
    ops.segments[parent].subscriptions["billing"] = 0
    assert await ctl.prune_tick(300.0) == []  # drained from now on: kept for the retention
    assert await ctl.prune_tick(309.0) == []
    ops.segments[parent].subscriptions["billing"] = 1  # a redelivery: not drained, the clock restarts
    assert await ctl.prune_tick(311.0) == []
    ops.segments[parent].subscriptions["billing"] = 0
    assert await ctl.prune_tick(312.0) == []
    assert parent in ops.segments and ("delete", parent) not in ops.calls
    assert await ctl.prune_tick(322.0) == [0]

    layout = (await store.require(T)).layout.validate()
    assert 0 not in layout.segments and layout.epoch == before.epoch + 1
    assert [s.segment_id for s in layout.active_segments] == [1, 2]
    assert all(s.parent_ids == () for s in layout.segments.values())
    assert parent not in ops.segments and ops.calls[-1] == ("delete", parent)
    assert await store.load_operation(T) is None
    assert pushed[-1].segment_ids == [1, 2]  # the pruned segment left the assignment
    assert ctl.layout == layout
    await ctl.stop()


async def test_oldest_first_and_only_segments_whose_topic_is_terminated(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 2)
    ctl = await leader(metadata, ops, "http://a:1", retention=0.0)
    await ctl.split_segment(0)  # 0 -> 2, 3
    layout = await ctl.split_segment(2)  # 2 -> 4, 5
    ops.segments[topic_of(layout, 2)].terminated = False  # sealed in the layout, its topic still writable
    assert await ctl.prune_tick(1.0) == [0]
    ops.segments[topic_of(layout, 2)].terminated = True
    assert await ctl.prune_tick(2.0) == [2]
    final = (await store.require(T)).layout.validate()
    assert sorted(final.segments) == [1, 3, 4, 5] and all(s.is_active for s in final.segments.values())
    merged = await ctl.merge_segments(4, 5)  # 4 + 5 -> 6
    assert merged.segment(6).parent_ids == (4, 5)
    assert await ctl.prune_tick(3.0) == [4, 5]
    assert sorted((await store.require(T)).layout.segments) == [1, 3, 6]
    assert (await store.require(T)).layout.segment(6).parent_ids == ()
    await ctl.stop()


async def test_both_segments_in_one_look_when_a_child_is_sealed_too(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    ctl = await leader(metadata, ops, "http://a:1", retention=0.0)
    await ctl.split_segment(0)  # 0 -> 1, 2
    await ctl.split_segment(1)  # 1 -> 3, 4
    assert await ctl.prune_tick(1.0) == [0, 1]  # the parent first, then its sealed child
    assert sorted((await store.require(T)).layout.segments) == [2, 3, 4]
    await ctl.stop()


async def test_the_retention_of_a_sealed_child_runs_while_its_parent_is_still_there(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    ctl = await leader(metadata, ops, "http://a:1", retention=10.0)
    await ctl.split_segment(0)  # 0 -> 1, 2
    layout = await ctl.split_segment(1)  # 1 -> 3, 4
    ops.segments[topic_of(layout, 0)].subscriptions["s"] = 2  # the grandparent is not drained yet
    assert await ctl.prune_tick(0.0) == []  # 1 is drained: its clock starts, though 0 is still there
    ops.segments[topic_of(layout, 0)].subscriptions["s"] = 0
    assert await ctl.prune_tick(5.0) == []
    assert await ctl.prune_tick(11.0) == []  # 0 drained only since 5
    assert await ctl.prune_tick(15.0) == [0, 1]  # 1's retention has long passed: it follows at once
    await ctl.stop()


async def test_a_crash_between_the_cas_and_the_delete_is_completed_by_the_next_leader(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)

    async def hook(name):
        if name == PRUNE_STEP:
            raise Crash(name)

    a = await leader(metadata, ops, "http://a:1", retention=0.0, hook=hook)
    layout = await a.split_segment(0)
    parent = topic_of(layout, 0)
    with pytest.raises(Crash):
        await a.prune_tick(1.0)
    assert 0 not in (await store.require(T)).layout.segments  # pruned from the layout ...
    assert parent in ops.segments  # ... its topic not yet deleted
    record, _ = await store.load_operation(T)
    assert record == {"op": "prune", "segmentId": 0, "segmentTopic": parent, "fromEpoch": 2}
    await a.stop(resign=False)
    await metadata.revoke_lease(a.lease.lease_id)
    b = await leader(metadata, ops, "http://b:1")
    assert parent not in ops.segments and await store.load_operation(T) is None
    # and the next split works (no operation record in the way)
    (await b.split_segment(1)).validate()
    await b.stop()


async def test_a_pruned_segment_topic_created_again_by_a_late_client_is_deleted_again(metadata):
    class Ops(MemorySegmentOps):  # segment topics with their delivery key, as on a broker
        async def create_segment(self, topic, subscriptions):
            await super().create_segment(topic, subscriptions)
            await metadata.put_json(keys.topic_delivery(topic), {"dispatch_strategy": "reliable"})

        async def delete_segment(self, topic):
            await super().delete_segment(topic)
            await metadata.delete(keys.topic_delivery(topic))

    ops = Ops()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    ctl = await leader(metadata, ops, "http://a:1", retention=0.0)
    layout = await ctl.split_segment(0)
    parent = topic_of(layout, 0)
    assert await ctl.prune_tick(1.0) == [0]
    assert await metadata.get(keys.topic_delivery(parent)) is None
    await ops.create_segment(parent, {"work": "shared"})  # a consumer that had not seen the new layout
    assert await ctl.prune_tick(2.0) == []
    assert await metadata.get(keys.topic_delivery(parent)) is None and parent not in ops.segments
    deletes = ops.calls.count(("delete", parent))
    assert deletes == 2
    assert await ctl.prune_tick(3.0) == [] and ops.calls.count(("delete", parent)) == deletes  # gone: left alone
    await ctl.stop()


async def test_a_follower_prunes_nothing(metadata):
    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    a = await leader(metadata, ops, "http://a:1", retention=0.0)
    await a.split_segment(0)
    lease = await StoreLease.grant(metadata)
    b = ScalableTopicController(T, store, ops, lease, "http://b:1", sealed_retention=0.0)
    await b.start()
    await b.wait_leader()
    assert not b.is_leader and await b.prune_tick(1.0) == []
    assert 0 in (await store.require(T)).layout.segments
    await b.stop()
    await a.stop()


async def test_the_loop_prunes_on_its_own(metadata):
    import asyncio

    ops = MemorySegmentOps()
    store = ScalableTopicStore(metadata)
    await create_scalable_topic(store, ops, T, 1)
    lease = await StoreLease.grant(metadata)
    ctl = ScalableTopicController(T, store, ops, lease, "http://a:1", prune_interval=0.05, sealed_retention=0.1)
    await ctl.start()
    await ctl.wait_leader()
    await ctl.split_segment(0)
    for _ in range(200):
        if 0 not in (await store.require(T)).layout.segments:
            break
        await asyncio.sleep(0.02)
    assert 0 not in (await store.require(T)).layout.segments
    assert await metadata.get(keys.scalable_operation(T)) is None
    await ctl.stop()


def test_config():
    cfg = ScalableTopicsConfig.from_dict({"prune_interval_seconds": 5, "sealed_retention_seconds": 0})
    assert (cfg.prune_interval_seconds, cfg.sealed_retention_seconds) == (5.0, 0.0)
    default = ScalableTopicsConfig()
    assert (default.prune_interval_seconds, default.sealed_retention_seconds) == (30.0, 3600.0)
    with pytest.raises(InvalidArgumentError):
        ScalableTopicsConfig.from_dict({"sealed_retention_seconds": -1})
    with pytest.raises(InvalidArgumentError):
        ScalableTopicsConfig.from_dict({"prune_interval_seconds": "often"})

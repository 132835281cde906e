"""RepartitionStore on the embedded store and a real etcd: derived initial state, CAS transitions,
the adoption stamp = the cutover's commit revision, concurrent owners' records, the watch."""

import asyncio

import pytest

from danube.errors import NotFoundError
from danube.metadata import keys
from danube.metadata.store import Compare, Op
from danube.routing.repartition.model import CUTOVER, RepartitionError
from danube.routing.repartition.store import RepartitionStore, readable_partitions

T = "/default/orders"


async def test_initial_state_is_derived_from_the_partition_count(metadata):
    store = RepartitionStore(metadata)
    assert await store.load(T) is None
    with pytest.raises(NotFoundError):
        await store.repartition(T, 4, now_ms=0)
    await metadata.put_json(keys.topic_partitions(T), 2)
    stored = await store.load(T)
    assert stored.state.partitions == 2 and stored.state.version == 0 and stored.version == 0


async def test_grow_cutover_stamp_record_finalize(metadata):
    store = RepartitionStore(metadata)
    await metadata.put_json(keys.topic_partitions(T), 2)
    await metadata.put_json(keys.topic_delivery(f"{T}-part-1"), {"dispatch_strategy": "reliable"})
    stored = await store.repartition(T, 4, now_ms=123)
    s = stored.state
    for p in (2, 3):  # created by the cutover (as the old ones): a consumer may attach before a producer
        assert await metadata.get_json(keys.topic_delivery(f"{T}-part-{p}")) == {"dispatch_strategy": "reliable"}
    assert s.partitions == 4 and s.version == 1 and s.transition.phase == CUTOVER
    assert await metadata.get_json(keys.topic_partitions(T)) == 4
    # adoption_generation = the revision of the commit that bumped the version
    assert s.transition.adoption_generation is not None
    assert s.transition.adoption_generation < stored.revision
    with pytest.raises(RepartitionError):
        await store.repartition(T, 6, now_ms=0)  # one at a time
    with pytest.raises(RepartitionError):
        await store.finalize(T)  # not drained
    # the owners record concurrently: every record lands (CAS retries)
    await asyncio.gather(*(store.record_offsets(T, p, 10 + p) for p in range(4)))
    s = (await store.load(T)).state
    assert s.transition.old_end == {0: 10, 1: 11} and s.transition.new_start == {2: 0, 3: 0}
    assert s.drained({"sub": {0: 10, 1: 11}})
    await store.mark_drain_complete(T, 1000)
    s = (await store.finalize(T)).state
    assert s.transition is None and s.partitions == 4 and s.version == 1


async def test_shrink_retires_and_guard(metadata):
    store = RepartitionStore(metadata)
    await metadata.put_json(keys.topic_partitions(T), 4)
    await metadata.put("/guard", b"me")
    guard = [Compare.value("/guard", "==", b"me")]
    await store.repartition(T, 2, now_ms=0, compare=guard)
    for p in range(4):
        await store.record_offsets(T, p, 5)
    await store.mark_drain_complete(T, 0, compare=guard)
    await metadata.put("/guard", b"someone-else")
    with pytest.raises(RepartitionError):
        await store.finalize(T, compare=guard)
    await metadata.put("/guard", b"me")
    s = (await store.finalize(T, compare=guard)).state
    assert s.retired == (2, 3) and s.partitions == 2
    for p in (2, 3):  # not terminated: a client that still counts them publishes there (read, not lost)
        assert await metadata.get(keys.topic_terminated(f"{T}-part-{p}")) is None
    assert await readable_partitions(metadata, T, 2) == 4
    await metadata.put(keys.topic_terminated(f"{T}-part-2"), b"1")  # as an earlier version left it
    s = (await store.repartition(T, 3, now_ms=0, compare=guard)).state
    assert s.retired == (3,)  # a grow reopens part-2: a marker goes with the bump
    assert await metadata.get(keys.topic_terminated(f"{T}-part-2")) is None
    assert await readable_partitions(metadata, T, 3) == 4


async def test_resume_a_marker_left_before_the_cutover(metadata):
    store = RepartitionStore(metadata)
    await metadata.put_json(keys.topic_partitions(T), 2)
    await store.update(T, lambda s: s.begin(3))
    assert (await store.load(T)).state.version == 0  # the marker alone routes nothing differently
    s = (await store.resume(T)).state
    assert s.version == 1 and s.partitions == 3 and s.transition.adoption_generation is not None


async def test_a_resume_that_lost_the_cutover_race_does_not_stamp_a_later_revision(metadata):
    """The admin's repartition and the leader's finalizer (which resumes a marker it sees) both
    read the marker; one commits the cutover, the other finds it done.  The stamp must stay the
    bump's commit revision (what the brokers' pushes carry and the clients ack): a later one would
    keep the transition from ever counting as adopted, so it finalized only on the timeout."""
    store = RepartitionStore(metadata)
    await metadata.put_json(keys.topic_partitions(T), 4)
    await store.update(T, lambda s: s.begin(2))
    marked = await store.require(T)
    bump = (
        await store.update(
            T,
            lambda s: s.cutover(),  # the winner's cutover, not stamped yet
            extra_ops=lambda s: [Op.put(keys.topic_partitions(T), b"2")],
        )
    ).revision
    await metadata.put("/elsewhere", b"x")  # the store moves on (cursors, labels)
    require, reads = store.require, [marked]

    async def read_before_the_bump(topic):  # the loser read the marker before the bump
        return reads.pop() if reads else await require(topic)

    store.require = read_before_the_bump
    await store.resume(T)  # stamps first
    store.require = require
    t = (await store.load(T)).state.transition
    assert t.phase == CUTOVER and t.adoption_generation == bump


async def test_snapshot_and_watch(metadata):
    store = RepartitionStore(metadata)
    await metadata.put_json(keys.topic_partitions(T), 2)
    await metadata.put_json(keys.topic_partitions("/default/other"), 3)
    states, rev = await store.snapshot()
    assert states == {}
    events = []

    async def follow():
        async for ev in store.watch(start_revision=rev + 1):
            events.append(ev)
            if len(events) == 3:
                return

    task = asyncio.ensure_future(follow())
    await metadata.put_json(keys.subscription_cursor(T + "-part-0", "s"), 5)  # unrelated churn
    await store.repartition(T, 4, now_ms=0)
    await asyncio.wait_for(task, 10)
    assert [e.topic for e in events] == [T] * 3
    assert [e.state.version for e in events] == [0, 1, 1]
    states, _ = await store.snapshot()
    assert states[T].partitions == 4

"""The version fence on the batch lane (in-process broker, embedded store): a stale version is refused
with FAILED_PRECONDITION and nothing is stored; the current one is stored; a newer one than the
watch delivered makes the owner catch up; no version = no fence (Danube's lane); the owners record
old_end / new_start at the cutover."""

import asyncio

import grpc

from danube import message_codec as frame_codec
from danube.metadata import keys
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from danube.routing.repartition.store import RepartitionStore
from danube.server import batch_lane
from tests.support.inprocess import served_broker
from tests.support.waiting import async_wait_until

T = "/default/fenced"


async def publish(stub, topic, version, n=3, seq=1):
    req = pb.PublishRequest(
        sequence=seq,
        create=pb.ProducerSpec(topic=topic, producer_name="p", reliable=True),
        frames=frame_codec.encode_payloads([b"x"] * n, publish_time=1, producer_id=0),
    )
    if version is not None:
        req.partitioning_version = version

    async def one():
        yield req

    return [ack async for ack in stub.Publish(one())][0]


async def test_fence_refuses_stale_and_records_offsets(tmp_path):
    async with served_broker(tmp_path, batch_lane.add_to_server, sync="never") as (broker, channel):
        stub = pb_grpc.BatchLaneStub(channel)
        store = RepartitionStore(broker.metadata)
        await broker.metadata.put_json(keys.topic_partitions(T), 2)
        for p in range(2):
            ack = await publish(stub, f"{T}-part-{p}", 0)
            assert not ack.HasField("status") or ack.status.code == 0, ack
        runtime = broker.repartition
        assert runtime.fence._ready.is_set()

        await store.repartition(T, 4, now_ms=0)  # grow 2 -> 4: version 1
        # the fence learns through its watch and records each source's old_end (3: one batch of 3)
        await async_wait_until(
            lambda: runtime.fence.states.get(T) is not None and runtime.fence.states[T].version == 1,
            timeout=5,
            interval=0.02,
        )
        await async_wait_until(
            lambda: runtime.fence.states[T].transition.old_end == {0: 3, 1: 3}, timeout=5, interval=0.02
        )
        before = broker.topics[f"{T}-part-0"].storage.next_offset
        ack = await publish(stub, f"{T}-part-0", 0, seq=2)
        assert ack.status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0], ack
        assert ack.status.retriable and "version 1" in ack.status.message and "4 partitions" in ack.status.message
        assert broker.topics[f"{T}-part-0"].storage.next_offset == before  # nothing stored
        ack = await publish(stub, f"{T}-part-0", 1, seq=3)
        assert ack.status.code == 0 and ack.first_offset == 3
        ack = await publish(stub, f"{T}-part-3", 1, seq=4)
        assert ack.status.code == 0 and ack.first_offset == 0
        ack = await publish(stub, f"{T}-part-1", None, seq=5)  # no version: not fenced
        assert ack.status.code == 0
        assert runtime.fence.refused == 1


async def test_newer_version_than_the_watch_catches_up_and_shrink_records_new_start(tmp_path):
    async with served_broker(tmp_path, batch_lane.add_to_server, sync="never") as (broker, channel):
        stub = pb_grpc.BatchLaneStub(channel)
        store = RepartitionStore(broker.metadata)
        await broker.metadata.put_json(keys.topic_partitions(T), 4)
        for p in range(4):
            await publish(stub, f"{T}-part-{p}", 0, n=p + 1)
        runtime = broker.repartition
        await runtime.fence.stop()  # the watch is late: nothing arrives through it
        await store.repartition(T, 2, now_ms=0)  # shrink 4 -> 2
        ack = await publish(stub, f"{T}-part-0", 1, seq=9)  # newer than the fence knew: catches up
        assert ack.status.code == 0 and ack.first_offset == 1
        ack = await publish(stub, f"{T}-part-2", 0, seq=10)
        assert ack.status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]

        async def recorded():
            return (await store.load(T)).state.transition

        for _ in range(100):
            t = await recorded()
            if t.old_end == {2: 3, 3: 4} and set(t.new_start) == {0, 1}:
                break
            await asyncio.sleep(0.05)
        assert t.old_end == {2: 3, 3: 4}
        assert t.new_start == {0: 1, 1: 2}  # before the first new-version batch on partition 0


async def test_batches_waiting_for_the_fence_to_catch_up_keep_their_order(tmp_path):
    """A stream's batches reach the broker in arrival order: a later batch of a partition never
    passes one still waiting for the fence to read the newer state (whichever read ends first)."""
    async with served_broker(tmp_path, batch_lane.add_to_server, sync="never") as (broker, channel):
        stub = pb_grpc.BatchLaneStub(channel)
        store = RepartitionStore(broker.metadata)
        await broker.metadata.put_json(keys.topic_partitions(T), 2)
        await publish(stub, f"{T}-part-0", 0)
        runtime = broker.repartition
        await runtime.fence.stop()  # the watch is late
        await store.repartition(T, 4, now_ms=0)
        load, delays = runtime.fence.store.load, [0.3, 0.0, 0.0]

        async def slow_first_load(topic):  # the first read ends last
            await asyncio.sleep(delays.pop(0) if delays else 0)
            return await load(topic)

        runtime.fence.store.load = slow_first_load
        admitted = []

        async def batch(i):
            await runtime.admit(f"{T}-part-2", 1)
            admitted.append(i)

        await asyncio.gather(*(batch(i) for i in range(3)))
        assert admitted == [0, 1, 2]

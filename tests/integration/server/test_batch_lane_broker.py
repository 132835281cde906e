"""The batch lane over the real BrokerService (local WAL, sqlite metadata) on a real grpc.aio server,
and the in-process broker app's graceful stop."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from danube import message_codec as frame_codec
from danube.broker import FailurePolicy
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from danube.server import batch_lane
from danube.server.app import BrokerApp
from danube.server.batch_lane import redelivery_counts_in_frame_order
from danube.server.config import BrokerConfig
from danube.storage.factory import StorageFactory
from tests.support.inprocess import served_broker

pytestmark = pytest.mark.timeout(60)
T = "/default/lane-real"


def _frames(n: int) -> bytes:
    # producer id 0: not set (any other id must be the publishing producer's)
    return frame_codec.encode_payloads([b"m-%d" % i for i in range(n)], publish_time=1, producer_id=0)


@pytest.fixture()
async def lane(tmp_path):
    policy = FailurePolicy(base_redelivery_delay_ms=1, max_redelivery_delay_ms=10)
    async with served_broker(tmp_path, batch_lane.add_to_server, sync="never", failure_policy=policy) as (broker, ch):
        yield broker, pb_grpc.BatchLaneStub(ch)


class ConsumeStream:
    def __init__(self, stub, first: pb.ConsumeRequest) -> None:
        self.control: asyncio.Queue = asyncio.Queue()

        async def requests():
            yield first
            while (item := await self.control.get()) is not None:
                yield item

        self.call = stub.Consume(requests())
        self.responses = self.call.__aiter__()

    def send(self, **kind) -> None:
        self.control.put_nowait(pb.ConsumeRequest(**kind))

    async def next(self) -> pb.ConsumeResponse:
        return await asyncio.wait_for(self.responses.__anext__(), 10)

    def close(self) -> None:
        self.control.put_nowait(None)
        self.call.cancel()


async def _publish(stub, producer_id: int, frames: bytes) -> pb.PublishAck:
    call = stub.Publish()
    await call.write(pb.PublishRequest(sequence=1, producer_id=producer_id, frames=frames))
    await call.done_writing()
    acks = [a async for a in call]
    assert len(acks) == 1 and not acks[0].HasField("status"), acks
    return acks[0]


def test_redelivery_counts_follow_frame_order():
    buf = bytearray(frame_codec.encode_payloads([b"a", b"b", b"c"]))
    for i, pos in enumerate(frame_codec.frame_positions(buf)):
        buf[pos : pos + 8] = (7 - i * 2).to_bytes(8, "little")  # offsets 7, 5, 3: not sorted
    assert redelivery_counts_in_frame_order(buf, {5: 2, 3: 1}) == [0, 2, 1]
    assert redelivery_counts_in_frame_order(memoryview(buf), {7: 4}) == [4, 0, 0]
    assert redelivery_counts_in_frame_order(buf, {}) == []
    assert redelivery_counts_in_frame_order(buf, {5: 0}) == []  # first deliveries only


async def test_nacked_messages_come_back_with_one_count_per_message(lane):
    broker, stub = lane
    pid = (await stub.CreateProducer(pb.ProducerSpec(topic=T, producer_name="p", reliable=True))).producer_id
    stream = ConsumeStream(
        stub, pb.ConsumeRequest(subscribe=pb.SubscribeSpec(topic=T, subscription="s", consumer_name="c"))
    )
    try:
        assert (await stream.next()).WhichOneof("kind") == "subscribed"
        await _publish(stub, pid, _frames(4))
        stream.send(credit=pb.Credit(messages=100, bytes=1 << 20))
        first = (await stream.next()).batch
        assert first.count == 4 and list(first.redelivery_counts) == []
        for offset in (1, 3):
            stream.send(nack=pb.NackRequest(offset=offset, delay_ms=0))
        # The two nacks travel separately, so the redeliveries may come in one batch or two.
        offsets: list[int] = []
        counts: list[int] = []
        while len(offsets) < 2:
            again = (await asyncio.wait_for(stream.next(), 10)).batch
            batch_offsets = [r.offset for r in frame_codec.decode_batch(again.frames)]
            assert len(again.redelivery_counts) == len(batch_offsets)  # one count per message
            offsets += batch_offsets
            counts += list(again.redelivery_counts)
        assert offsets == [1, 3]
        assert counts == [1, 1]  # counts, not the offsets
    finally:
        stream.close()


async def test_subscribe_without_reliable_needs_the_topic_to_exist(lane):
    broker, stub = lane
    missing = ConsumeStream(
        stub,
        pb.ConsumeRequest(subscribe=pb.SubscribeSpec(topic="/default/nobody", subscription="s", consumer_name="c")),
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await missing.next()
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "/default/nobody" in info.value.details()
    assert "/default/nobody" not in broker.topics
    missing.close()

    # reliable set: the topic is created with that dispatch strategy
    creating = ConsumeStream(
        stub,
        pb.ConsumeRequest(
            subscribe=pb.SubscribeSpec(topic="/default/made", subscription="s", consumer_name="c", reliable=False)
        ),
    )
    try:
        assert (await creating.next()).WhichOneof("kind") == "subscribed"
        assert broker.topics["/default/made"].reliable is False
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateProducer(pb.ProducerSpec(topic="/default/made", producer_name="p", reliable=True))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        creating.close()


async def test_graceful_stop_refuses_new_batches_and_acks_the_stored_ones(tmp_path):
    config = BrokerConfig(
        port=0, admin_port=0, metrics_port=0, data_dir=str(tmp_path), sync="always", load_report_interval_seconds=0
    )
    app = BrokerApp(config)
    await app.start()
    stopping = None
    try:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.bound['client']}")
        stub = pb_grpc.BatchLaneStub(channel)
        pid = (await stub.CreateProducer(pb.ProducerSpec(topic=T, producer_name="p", reliable=True))).producer_id
        call = stub.Publish()
        await call.write(pb.PublishRequest(sequence=1, producer_id=pid, frames=_frames(3)))
        acks = call.__aiter__()
        first = await asyncio.wait_for(acks.__anext__(), 10)
        assert (first.sequence, first.count) == (1, 3) and not first.HasField("status")

        stopping = asyncio.ensure_future(app.stop())
        await asyncio.sleep(0.2)  # the stop has begun; the stream is still open (grace period)
        assert not stopping.done()
        await call.write(pb.PublishRequest(sequence=2, producer_id=pid, frames=_frames(2)))
        late = await asyncio.wait_for(acks.__anext__(), 10)
        assert late.sequence == 2
        assert late.status.code == grpc.StatusCode.UNAVAILABLE.value[0], late
        assert late.status.retriable and "shutting down" in late.status.message
        await call.done_writing()
        assert [a async for a in acks] == []
        await asyncio.wait_for(stopping, 10)
        await channel.close()
    finally:
        if stopping is None:
            await app.stop()
        elif not stopping.done():
            await stopping

    # only the batch acked before the stop is stored
    metadata = EmbeddedMetadataStore(config.metadata_path)
    factory = StorageFactory(config.storage_config(), metadata, broker_id="test")
    try:
        storage = await factory.open_topic(T)
        assert storage.next_offset == 3
        await storage.close()
    finally:
        await factory.close()
        await metadata.close()


async def test_a_publish_request_that_does_not_parse_ends_its_call_as_before_and_the_lane_serves_on(tmp_path):
    """Publish's requests are read by danube's own reader (registered by add_to_server): bytes
    protobuf would refuse end the call as protobuf's DecodeError ended it (grpc.aio, whose request
    iterator raises: UNKNOWN; danube's own server: INTERNAL), saying what is wrong; nothing is stored."""
    async with served_broker(tmp_path, batch_lane.add_to_server, sync="never") as (broker, channel):
        stub = pb_grpc.BatchLaneStub(channel)
        pid = (await stub.CreateProducer(pb.ProducerSpec(topic="/default/raw", producer_name="p"))).producer_id
        raw = channel.stream_stream("/danube_batch.BatchLane/Publish", None, pb.PublishAck.FromString)
        good = pb.PublishRequest(sequence=1, producer_id=pid, frames=_frames(2)).SerializeToString()
        for bad in (good[:-3], b"\x22" + b"\xff" * 9 + b"\x01", good + b"\x0e"):  # cut, huge length, wire type 6
            call = raw()
            await call.write(bad)
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                _ = [ack async for ack in call]
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert "malformed PublishRequest" in (info.value.details() or "")
        assert broker.topics["/default/raw"].storage.next_offset == 0
        call = raw()
        await call.write(good)
        await call.done_writing()
        acks = [ack async for ack in call]
        assert [(a.sequence, a.first_offset, a.last_offset) for a in acks] == [(1, 0, 1)]

"""The batch-lane service over a test double of BrokerService, on a real grpc.aio server."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from danube import message_codec as frame_codec
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from tests.support.fake_broker import FakeBroker, start_fake_server

TOPIC = "/default/lane"


@pytest.fixture
async def lane():
    broker = FakeBroker()
    server, port = await start_fake_server(broker)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield broker, pb_grpc.BatchLaneStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


def _frames(n: int, size: int = 10) -> bytes:
    return frame_codec.encode_payloads([bytes([i % 256]) * size for i in range(n)], publish_time=1, producer_id=1)


async def _publish(stub, requests):
    call = stub.Publish()
    for r in requests:
        await call.write(r)
    await call.done_writing()
    acks = [ack async for ack in call]
    return sorted(acks, key=lambda a: a.sequence)


async def test_publish_acks_each_batch_with_its_offsets(lane):
    broker, stub = lane
    pid = (await stub.CreateProducer(pb.ProducerSpec(topic=TOPIC, producer_name="p", reliable=True))).producer_id
    acks = await _publish(stub, [pb.PublishRequest(sequence=s, producer_id=pid, frames=_frames(5)) for s in (1, 2, 3)])
    assert [(a.sequence, a.first_offset, a.last_offset, a.count) for a in acks] == [
        (1, 0, 4, 5),
        (2, 5, 9, 5),
        (3, 10, 14, 5),
    ]
    assert all(not a.HasField("status") for a in acks)
    stored = frame_codec.decode_batch(bytes(broker.topics[TOPIC].log))
    assert [r.offset for r in stored] == list(range(15))


async def test_publish_with_create_spec_creates_the_producer_once(lane):
    broker, stub = lane
    spec = pb.ProducerSpec(topic=TOPIC, producer_name="p2", reliable=True)
    acks = await _publish(stub, [pb.PublishRequest(sequence=s, create=spec, frames=_frames(2)) for s in (1, 2)])
    assert acks[0].producer_id == acks[1].producer_id == broker.producer_names[(TOPIC, "p2")]
    assert [a.last_offset for a in acks] == [1, 3]


@pytest.mark.parametrize(
    "damage, code",
    [
        # a client's corrupt frame is bad input (DATA_LOSS is kept for stored data that fails its checksum)
        ("flip_payload_byte", grpc.StatusCode.INVALID_ARGUMENT),
        ("truncate", grpc.StatusCode.INVALID_ARGUMENT),
        ("garbage", grpc.StatusCode.INVALID_ARGUMENT),
        ("empty", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_bad_frames_get_a_status_and_the_stream_keeps_serving(lane, damage, code):
    broker, stub = lane
    pid = (await stub.CreateProducer(pb.ProducerSpec(topic=TOPIC, producer_name="p", reliable=True))).producer_id
    good = _frames(3)
    bad = bytearray(good)
    if damage == "flip_payload_byte":
        bad[-1] ^= 0xFF
    elif damage == "truncate":
        bad = bad[:-4]
    elif damage == "garbage":
        bad = bytearray(b"\x01" * 40)
    else:
        bad = bytearray()
    acks = await _publish(
        stub,
        [
            pb.PublishRequest(sequence=1, producer_id=pid, frames=good),
            pb.PublishRequest(sequence=2, producer_id=pid, frames=bytes(bad)),
            pb.PublishRequest(sequence=3, producer_id=pid, frames=good),
        ],
    )
    assert acks[1].status.code == code.value[0], acks[1]
    assert acks[1].status.message
    assert not acks[0].HasField("status") and not acks[2].HasField("status")
    assert (acks[2].first_offset, acks[2].last_offset) == (3, 5)
    stored = frame_codec.decode_batch(bytes(broker.topics[TOPIC].log))
    assert [r.offset for r in stored] == list(range(6))
    assert broker.publish_calls == 2  # the bad batch never reached the broker


async def test_unknown_producer_is_not_found_per_batch(lane):
    _, stub = lane
    acks = await _publish(stub, [pb.PublishRequest(sequence=7, producer_id=999, frames=_frames(1))])
    assert acks[0].status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "999" in acks[0].status.message


async def test_request_without_producer_is_invalid(lane):
    _, stub = lane
    acks = await _publish(stub, [pb.PublishRequest(sequence=1, frames=_frames(1))])
    assert acks[0].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def _consume_stream(stub, first, queue: asyncio.Queue):
    async def requests():
        yield first
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    return stub.Consume(requests())


async def test_consume_respects_message_credit_and_takes_acks(lane):
    broker, stub = lane
    pid = (await stub.CreateProducer(pb.ProducerSpec(topic=TOPIC, producer_name="p", reliable=True))).producer_id
    control: asyncio.Queue = asyncio.Queue()
    call = await _consume_stream(
        stub,
        pb.ConsumeRequest(subscribe=pb.SubscribeSpec(topic=TOPIC, subscription="s", consumer_name="c", reliable=True)),
        control,
    )
    responses = call.__aiter__()
    first = await responses.__anext__()
    cid = first.subscribed.consumer_id
    assert cid in broker.consumers
    await _publish(stub, [pb.PublishRequest(sequence=1, producer_id=pid, frames=_frames(10))])
    control.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=4, bytes=1 << 20)))
    got = (await responses.__anext__()).batch
    assert (got.first_offset, got.last_offset, got.count) == (0, 3, 4)
    assert [r.offset for r in frame_codec.decode_batch(got.frames)] == [0, 1, 2, 3]
    # no credit left: nothing more arrives until more is granted
    pending = asyncio.ensure_future(responses.__anext__())
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done
    control.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(ranges=[pb.OffsetRange(first=0, last=3)])))
    control.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=100, bytes=1 << 20)))
    got = (await asyncio.wait_for(pending, 5)).batch
    assert (got.first_offset, got.last_offset) == (4, 9)
    assert broker.acked[cid] == {0, 1, 2, 3}
    control.put_nowait(None)
    assert [r async for r in responses] == []


async def test_consume_byte_credit_limits_batch_size(lane):
    broker, stub = lane
    pid = (await stub.CreateProducer(pb.ProducerSpec(topic=TOPIC, producer_name="p", reliable=True))).producer_id
    control: asyncio.Queue = asyncio.Queue()
    call = await _consume_stream(
        stub, pb.ConsumeRequest(subscribe=pb.SubscribeSpec(topic=TOPIC, subscription="s", consumer_name="c")), control
    )
    responses = call.__aiter__()
    await responses.__anext__()
    frames = _frames(10, size=100)
    one = len(frames) // 10
    await _publish(stub, [pb.PublishRequest(sequence=1, producer_id=pid, frames=frames)])
    control.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=1000, bytes=3 * one)))
    got = (await responses.__anext__()).batch
    assert got.count == 3 and len(got.frames) == 3 * one
    control.put_nowait(None)
    call.cancel()


async def test_consume_unknown_consumer_id_is_not_found(lane):
    _, stub = lane
    control: asyncio.Queue = asyncio.Queue()
    control.put_nowait(None)
    call = await _consume_stream(stub, pb.ConsumeRequest(consumer_id=4242), control)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_in_stream_ack_error_is_reported_and_stream_goes_on(lane):
    broker, stub = lane
    control: asyncio.Queue = asyncio.Queue()
    call = await _consume_stream(
        stub, pb.ConsumeRequest(subscribe=pb.SubscribeSpec(topic=TOPIC, subscription="s", consumer_name="c")), control
    )
    responses = call.__aiter__()
    await responses.__anext__()
    control.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(consumer_id=555, ranges=[pb.OffsetRange(first=0, last=0)])))
    err = await asyncio.wait_for(responses.__anext__(), 5)
    assert err.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    control.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(ranges=[pb.OffsetRange(first=5, last=1)])))
    err = await asyncio.wait_for(responses.__anext__(), 5)
    assert err.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    control.put_nowait(None)
    assert [r async for r in responses] == []


async def test_unary_ack_and_nack(lane):
    broker, stub = lane
    cid = await broker.subscribe(TOPIC, "s", "c")
    answer = await stub.Ack(
        pb.AckBatch(consumer_id=cid, ranges=[pb.OffsetRange(first=2, last=4), pb.OffsetRange(first=9, last=9)])
    )
    assert answer.acked == 4 and broker.acked[cid] == {2, 3, 4, 9}
    await stub.Nack(pb.NackRequest(consumer_id=cid, offset=3, delay_ms=50))
    assert broker.nacked == [(cid, 3, 50)]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Ack(pb.AckBatch(consumer_id=777, ranges=[pb.OffsetRange(first=0, last=0)]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

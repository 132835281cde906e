"""A Consume stream's acks as the server reads them from their bytes (``pbwire.consume_request``):
acks in any encoding protobuf accepts are applied, a bad range is answered in the stream, bad
bytes end the call with a clear status and apply nothing; on both gRPC servers."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from danube import message_codec as frame_codec
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from tests.support.broker import running_broker


@pytest.fixture(scope="module", params=["native", "grpcio"])
def broker(request):
    with running_broker("--sync", "interval", "--grpc-server", request.param) as b:
        yield b, request.param


def _raw(request) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


async def _open(channel, topic: str):
    """A Consume stream whose requests may be raw bytes: (queue of requests, response iterator)."""
    consume = channel.stream_stream(
        "/danube_batch.BatchLane/Consume", request_serializer=_raw, response_deserializer=pb.ConsumeResponse.FromString
    )
    control: asyncio.Queue = asyncio.Queue()

    async def requests():
        yield pb.ConsumeRequest(
            subscribe=pb.SubscribeSpec(topic=topic, subscription="s", consumer_name="c", reliable=True)
        )
        while (item := await control.get()) is not None:
            yield item

    call = consume(requests())
    responses = call.__aiter__()
    assert (await asyncio.wait_for(responses.__anext__(), 10)).subscribed.consumer_id > 0
    return call, control, responses


async def _publish(stub, topic: str, n: int) -> None:
    pid = (await stub.CreateProducer(pb.ProducerSpec(topic=topic, producer_name="p", reliable=True))).producer_id
    publish = stub.Publish()
    await publish.write(pb.PublishRequest(sequence=1, producer_id=pid, frames=frame_codec.encode_payloads([b"x"] * n)))
    await publish.done_writing()
    (ack,) = [a async for a in publish]
    assert ack.count == n


async def _offsets(responses, n: int) -> list[int]:
    got: list[int] = []
    while len(got) < n:
        batch = (await asyncio.wait_for(responses.__anext__(), 10)).batch
        got.extend(range(batch.first_offset, batch.last_offset + 1))
    return got


async def test_an_unreadable_first_request_ends_the_call_internal(broker):
    broker, _server = broker
    channel = grpc.aio.insecure_channel(broker.target)
    try:
        call = channel.stream_stream(
            "/danube_batch.BatchLane/Consume", request_serializer=None, response_deserializer=None
        )(iter([b"\x0a\x05\x0a"]))  # a subscribe field cut short
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.INTERNAL and "cannot parse" in info.value.details()
    finally:
        await channel.close()


async def test_acks_in_every_encoding_are_applied_and_bad_bytes_end_the_call(broker):
    broker, _server = broker
    topic = f"/default/acks-{uuid.uuid4().hex[:10]}"
    channel = grpc.aio.insecure_channel(broker.target)
    stub = pb_grpc.BatchLaneStub(channel)
    try:
        call, control, responses = await _open(channel, topic)
        await _publish(stub, topic, 10)
        control.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=100, bytes=1 << 20)))
        assert await _offsets(responses, 10) == list(range(10))
        # 0..1 as protobuf writes it; 2..3 as two ack fields protobuf merges, the range's
        # ``first`` with a longer varint than it needs
        control.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(ranges=[pb.OffsetRange(first=0, last=1)])))
        control.put_nowait(b"\x22\x00" + b"\x22\x07\x12\x05\x08\x82\x00\x10\x03")
        # a range that ends before it starts: answered in the stream, which goes on
        control.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(ranges=[pb.OffsetRange(first=6, last=5)])))
        error = (await asyncio.wait_for(responses.__anext__(), 10)).error
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "ends before it starts" in error.message
        # bytes no reader takes (an ack cut short): the call ends, nothing of them applied
        control.put_nowait(b"\x22\x06\x12\x04\x08\x04\x10")
        with pytest.raises(grpc.aio.AioRpcError) as info:  # native and grpcio alike
            await asyncio.wait_for(responses.__anext__(), 10)
        assert info.value.code() == grpc.StatusCode.INTERNAL and "cannot parse" in info.value.details()
        control.put_nowait(None)
        # what was not acked (4..9) comes back to the subscription's next consumer
        call2, control2, responses2 = await _open(channel, topic)
        control2.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=100, bytes=1 << 20)))
        assert sorted(await _offsets(responses2, 6)) == list(range(4, 10))
        control2.put_nowait(None)
        call2.cancel()
    finally:
        await channel.close()

"""The batch lane and danube.client against a real broker subprocess."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from danube import message_codec as frame_codec
from danube.client import DanubeClient, SubType
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from tests.support.broker import running_broker


@pytest.fixture(scope="module", params=["native", "grpcio"])
def broker(request):
    # Both gRPC servers the client port can run (docs/broker.md) pass the same tests.
    with running_broker("--sync", "interval", "--grpc-server", request.param) as b:
        yield b


@pytest.fixture
async def client(broker):
    c = (
        DanubeClient.builder()
        .service_url(broker.url)
        .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
        .build()
    )
    yield c
    await c.close()


def fresh_topic() -> str:
    return f"/default/lane-{uuid.uuid4().hex[:10]}"


async def collect(consumer, n: int, timeout: float = 10.0) -> list:
    got = []

    async def run():
        async for m in consumer:
            got.append(m)
            if len(got) >= n:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def test_publish_and_consume_round_trip(client):
    topic = fresh_topic()
    consumer = (
        client.new_consumer().with_topic(topic).with_consumer_name("c").with_subscription("s").with_reliable().build()
    )  # with_reliable: creates the topic, no producer yet
    await consumer.subscribe()
    producer = client.new_producer().with_topic(topic).with_name("p").with_linger_ms(2).build()
    await producer.create()
    futures = [await producer.send(b"msg-%d" % i, attributes={"i": str(i)}) for i in range(300)]
    offsets = await asyncio.gather(*futures)
    assert offsets == list(range(offsets[0], offsets[0] + 300))
    got = await collect(consumer, 300)
    assert [m.payload for m in got] == [b"msg-%d" % i for i in range(300)]
    assert [m.offset for m in got] == offsets
    assert got[7].attributes == {"i": "7"}
    await consumer.ack_many(got)
    await consumer.close()
    await producer.close()


async def test_acked_messages_do_not_come_back_unacked_ones_do(client):
    topic = fresh_topic()
    sub = client.new_consumer().with_topic(topic).with_consumer_name("c").with_subscription("s").with_reliable()
    consumer = sub.build()
    await consumer.subscribe()
    async with client.new_producer().with_topic(topic).with_name("p").build() as producer:
        await (await producer.send_batch([b"a%d" % i for i in range(10)]))
    got = await collect(consumer, 10)
    await consumer.ack_many(got[:6])  # one AckBatch with range [first, first+5]
    await consumer.close()
    consumer = sub.build()
    await consumer.subscribe()
    again = await collect(consumer, 4)
    assert [m.payload for m in again] == [b"a%d" % i for i in range(6, 10)]
    await consumer.ack_many(again)
    await consumer.close()


async def test_credit_limits_what_the_broker_sends(broker):
    topic = fresh_topic()
    channel = grpc.aio.insecure_channel(broker.target)
    stub = pb_grpc.BatchLaneStub(channel)
    try:
        control: asyncio.Queue = asyncio.Queue()

        async def requests():
            yield pb.ConsumeRequest(
                subscribe=pb.SubscribeSpec(topic=topic, subscription="s", consumer_name="c", reliable=True)
            )
            while (item := await control.get()) is not None:
                yield item

        call = stub.Consume(requests())
        responses = call.__aiter__()
        assert (await responses.__anext__()).subscribed.consumer_id > 0
        pid = (await stub.CreateProducer(pb.ProducerSpec(topic=topic, producer_name="p", reliable=True))).producer_id
        frames = frame_codec.encode_payloads([b"x"] * 20, publish_time=1, producer_id=pid)
        publish = stub.Publish()
        await publish.write(pb.PublishRequest(sequence=1, producer_id=pid, frames=frames))
        await publish.done_writing()
        (ack,) = [a async for a in publish]
        assert ack.count == 20 and not ack.HasField("status")
        control.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=3, bytes=1 << 20)))
        received = 0
        while received < 3:
            batch = (await asyncio.wait_for(responses.__anext__(), 5)).batch
            received += batch.count
        assert received == 3
        pending = asyncio.ensure_future(responses.__anext__())
        done, _ = await asyncio.wait({pending}, timeout=0.5)
        assert not done  # no credit, nothing more
        control.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=100, bytes=1 << 20)))
        batch = (await asyncio.wait_for(pending, 5)).batch
        assert batch.first_offset == ack.first_offset + 3
        control.put_nowait(None)
        call.cancel()
    finally:
        await channel.close()


async def test_partitioned_topic_by_key(client):
    topic = fresh_topic()
    producer = client.new_producer().with_topic(topic).with_name("p").with_partitions(3).build()
    await producer.create()
    for i in range(30):
        await producer.send(b"%d" % i, key=f"k{i % 5}")
    await producer.flush()
    consumer = client.new_consumer().with_topic(topic).with_consumer_name("c").with_subscription("s").build()
    await consumer.subscribe()
    assert len(consumer.consumer_ids) == 3
    for i in range(30, 60):
        await producer.send(b"%d" % i, key=f"k{i % 5}")
    await producer.flush()
    got = await collect(consumer, 30)
    from danube.client.partition_router import fnv1a_64

    for m in got:
        assert m.topic == f"{topic}-part-{fnv1a_64(m.routing_key.encode()) % 3}"
    assert sorted(int(m.payload) for m in got) == list(range(30, 60))
    await consumer.ack_many(got)
    await consumer.close()
    await producer.close()


async def test_bad_frames_are_rejected_and_stored_data_stays_intact(broker, client):
    topic = fresh_topic()
    consumer = (
        client.new_consumer().with_topic(topic).with_consumer_name("c").with_subscription("s").with_reliable().build()
    )
    await consumer.subscribe()
    channel = grpc.aio.insecure_channel(broker.target)
    stub = pb_grpc.BatchLaneStub(channel)
    try:
        pid = (await stub.CreateProducer(pb.ProducerSpec(topic=topic, producer_name="p", reliable=True))).producer_id
        good = frame_codec.encode_payloads([b"good"] * 3, publish_time=1, producer_id=pid)
        corrupt = bytearray(good)
        corrupt[-1] ^= 0x55
        truncated = good[:-5]
        call = stub.Publish()
        for seq, data in enumerate([good, bytes(corrupt), truncated, b"\x00" * 64, good], start=1):
            await call.write(pb.PublishRequest(sequence=seq, producer_id=pid, frames=data))
        await call.write(pb.PublishRequest(sequence=6, producer_id=987654321, frames=good))
        await call.done_writing()
        acks = {a.sequence: a async for a in call}
        for seq in (2, 3, 4):
            assert acks[seq].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], acks[seq]
            assert acks[seq].status.message
        assert acks[6].status.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert not acks[1].HasField("status") and not acks[5].HasField("status")
        assert acks[5].first_offset == acks[1].last_offset + 1
        got = await collect(consumer, 6)
        assert [m.payload for m in got] == [b"good"] * 6
        assert [m.offset for m in got] == list(range(acks[1].first_offset, acks[1].first_offset + 6))
        # the broker keeps serving on a fresh stream too
        call = stub.Publish()
        await call.write(pb.PublishRequest(sequence=1, producer_id=pid, frames=good))
        await call.done_writing()
        (ack,) = [a async for a in call]
        assert ack.first_offset == acks[5].last_offset + 1
    finally:
        await channel.close()
        await consumer.close()


async def test_unknown_consumer_and_acks_get_not_found(broker):
    channel = grpc.aio.insecure_channel(broker.target)
    stub = pb_grpc.BatchLaneStub(channel)
    try:

        async def requests():
            yield pb.ConsumeRequest(consumer_id=123456789)

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Consume(requests()):
                pass
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Ack(pb.AckBatch(consumer_id=123456789, ranges=[pb.OffsetRange(first=0, last=1)]))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateProducer(pb.ProducerSpec(topic="not-a-topic", producer_name="p"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await channel.close()


async def test_client_reconnects_after_broker_restart():
    with running_broker("--sync", "always") as broker:
        client = (
            DanubeClient.builder()
            .service_url(broker.url)
            .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
            .build()
        )
        topic = fresh_topic()
        try:
            consumer = (
                client.new_consumer()
                .with_topic(topic)
                .with_consumer_name("c")
                .with_subscription("s")
                .with_subscription_type(SubType.Exclusive)
                .with_reliable()
                .build()
            )
            await consumer.subscribe()
            producer = client.new_producer().with_topic(topic).with_name("p").with_linger_ms(1).build()
            await producer.create()
            before = await (await producer.send_batch([b"before-%d" % i for i in range(5)]))
            got = await collect(consumer, 5)
            await consumer.ack_many(got)
            await asyncio.sleep(0.3)  # let the in-stream acks reach the broker
            await asyncio.get_running_loop().run_in_executor(None, broker.restart)
            after = await asyncio.wait_for(await producer.send_batch([b"after-%d" % i for i in range(5)]), 30)
            assert after[0] == before[-1] + 1  # offsets continue across the restart
            got = await collect(consumer, 5, timeout=30)
            assert [m.payload for m in got] == [b"after-%d" % i for i in range(5)]
            await consumer.ack_many(got)
            await consumer.close()
            await producer.close()
        finally:
            await client.close()

"""The client against the batch lane over a BrokerService test double (real gRPC server)."""

from __future__ import annotations

import asyncio

import pytest

from danube import message_codec as frame_codec
from danube.client import DanubeClient, SubType
from danube.errors import ClientError, InvalidArgumentError, NotFoundError
from tests.support.fake_broker import FakeBroker, start_fake_server
from tests.support.ports import free_port

TOPIC = "/default/client"


@pytest.fixture
async def served():
    broker = FakeBroker()
    server, port = await start_fake_server(broker)
    client = DanubeClient.builder().service_url(f"http://127.0.0.1:{port}").build()
    try:
        yield broker, client, port
    finally:
        await client.close()
        await server.stop(None)


async def test_send_returns_future_of_offset_after_linger(served):
    broker, client, _ = served
    producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(20).build()
    await producer.create()
    futures = [await producer.send(f"m{i}".encode()) for i in range(5)]
    assert not any(f.done() for f in futures)  # still lingering
    assert await asyncio.wait_for(asyncio.gather(*futures), 5) == [0, 1, 2, 3, 4]
    assert broker.publish_calls == 1  # one batch for the five
    records = frame_codec.decode_batch(bytes(broker.topics[TOPIC].log))
    assert [bytes(r.payload) for r in records] == [f"m{i}".encode() for i in range(5)]
    assert {r.producer_id for r in records} == set(producer.producer_ids)
    await producer.close()


async def test_keys_and_attributes_travel_in_the_frames(served):
    broker, client, _ = served
    async with client.new_producer().with_topic(TOPIC).with_name("p").build() as producer:
        await producer.send(b"a", key="k1", attributes={"x": "1"})
        await producer.send(b"b")
        await producer.flush()
    records = frame_codec.decode_batch(bytes(broker.topics[TOPIC].log))
    assert [(r.routing_key, r.attributes) for r in records] == [("k1", {"x": "1"}), (None, {})]


async def test_max_batch_bytes_seals_and_send_batch_chunks(served):
    broker, client, _ = served
    producer = (
        client.new_producer()
        .with_topic(TOPIC)
        .with_name("p")
        .with_linger_ms(10_000)
        .with_max_batch_bytes(1000)
        .with_max_in_flight(2)
        .build()
    )
    await producer.create()
    offsets = await (await producer.send_batch([b"x" * 100] * 30))
    assert offsets == list(range(30))
    assert broker.publish_calls >= 3  # 30 * 138 bytes in batches of <= ~1000
    fut = await producer.send(b"y" * 2000)  # alone over the limit: sealed at once
    assert await asyncio.wait_for(fut, 5) == 30
    await producer.close()


async def test_consumer_iterates_messages_and_acks(served):
    broker, client, _ = served
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_subscription_type(SubType.Exclusive)
        .build()
    )
    producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
    await producer.create()
    await consumer.subscribe()
    await (await producer.send_batch([b"%d" % i for i in range(20)]))
    got = []
    async for message in consumer:
        got.append(message)
        await consumer.ack(message)
        if len(got) == 20:
            break
    assert [m.payload for m in got] == [b"%d" % i for i in range(20)]
    assert [m.offset for m in got] == list(range(20))
    await consumer.close()
    await producer.close()
    (cid,) = consumer.consumer_ids
    assert broker.acked[cid] == set(range(20))


async def test_consumer_batches_and_bulk_ack(served):
    broker, client, _ = served
    consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name("c").with_subscription("s").build()
    await consumer.subscribe()
    async with client.new_producer().with_topic(TOPIC).with_name("p").build() as producer:
        await (await producer.send_batch([b"v"] * 50))
    total = 0
    async for batch in consumer.batches():
        assert batch.payloads() == [b"v"] * batch.count
        await consumer.ack_batch(batch)
        total += batch.count
        if total == 50:
            break
    await consumer.close()
    (cid,) = consumer.consumer_ids
    assert broker.acked[cid] == set(range(50))


async def test_partitioned_producer_routes_by_key(served):
    broker, client, _ = served
    producer = client.new_producer().with_topic(TOPIC).with_name("p").with_partitions(3).build()
    await producer.create()
    assert producer.partitions == [f"{TOPIC}-part-{i}" for i in range(3)]
    for i in range(30):
        await producer.send(b"k", key=f"key-{i % 4}")
    for _ in range(6):
        await producer.send(b"u")
    await producer.flush()
    from danube.client.partition_router import fnv1a_64

    for i, name in enumerate(producer.partitions):
        records = frame_codec.decode_batch(bytes(broker.topics[name].log))
        keyed = [r.routing_key for r in records if r.routing_key]
        assert all(fnv1a_64(k.encode()) % 3 == i for k in keyed)
        assert sum(1 for r in records if r.routing_key is None) == 2  # round robin
    await producer.close()


async def test_partitioned_consumer_reads_every_partition(served):
    broker, client, _ = served
    broker.partitioned[TOPIC] = 2
    consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name("c").with_subscription("s").build()
    await consumer.subscribe()
    assert len(consumer.consumer_ids) == 2
    producer = client.new_producer().with_topic(TOPIC).with_name("p").build()
    await producer.create()
    for i in range(10):
        await producer.send(b"%d" % i)
    await producer.flush()
    seen = set()
    async for m in consumer:
        seen.add((m.topic, m.payload))
        if len(seen) == 10:
            break
    assert {t for t, _ in seen} == {f"{TOPIC}-part-0", f"{TOPIC}-part-1"}
    await consumer.close()
    await producer.close()


async def test_unknown_topic_name_fails_clearly(served):
    _, client, _ = served
    producer = client.new_producer().with_topic("no-slashes").with_name("p").build()
    with pytest.raises(InvalidArgumentError, match="invalid topic name"):
        await producer.create()


async def test_builder_rejects_missing_fields(served):
    _, client, _ = served
    with pytest.raises(InvalidArgumentError):
        client.new_producer().with_name("p").build()
    with pytest.raises(InvalidArgumentError):
        client.new_consumer().with_topic(TOPIC).with_consumer_name("c").build()
    with pytest.raises(InvalidArgumentError):
        client.new_consumer().with_subscription_type("round-robin")


@pytest.mark.parametrize("linger", [-1, 1000.5, float("nan"), "soon", None])
async def test_builder_rejects_a_bad_ack_linger(served, linger):
    _, client, _ = served
    with pytest.raises(InvalidArgumentError, match="ack linger must be between 0 and 1000 ms"):
        client.new_consumer().with_ack_linger_ms(linger)


async def _acked_at_broker(broker, cid: int, offsets: set[int], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not offsets <= broker.acked[cid]:
        assert asyncio.get_running_loop().time() < deadline, f"{offsets - broker.acked[cid]} never acked"
        await asyncio.sleep(0.005)


async def _consumer_with_five_messages(client, ack_linger_ms: float):
    """A consumer lingering ``ack_linger_ms`` over its acks, its id, and five messages it received."""
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_ack_linger_ms(ack_linger_ms)
        .build()
    )
    await consumer.subscribe()
    async with client.new_producer().with_topic(TOPIC).with_name("p").build() as producer:
        await (await producer.send_batch([b"%d" % i for i in range(5)]))
    got = []
    async for message in consumer:
        got.append(message)
        if len(got) == 5:
            (cid,) = consumer.consumer_ids
            return consumer, cid, got


async def test_acks_within_the_linger_travel_as_one_request(served):
    broker, client, _ = served
    consumer, cid, messages = await _consumer_with_five_messages(client, 1000)
    for message in messages:  # five acks, one range each, the stream idle between them
        await consumer.ack(message)
        await asyncio.sleep(0.02)
    assert broker.acked[cid] == set()  # held for the linger
    await _acked_at_broker(broker, cid, set(range(5)))
    assert broker.ack_calls == 1  # one request for the five
    await consumer.close()


async def test_without_linger_an_ack_goes_out_at_once(served):
    broker, client, _ = served
    consumer, cid, messages = await _consumer_with_five_messages(client, 0)
    for i, message in enumerate(messages):
        await consumer.ack(message)
        await _acked_at_broker(broker, cid, {i}, timeout=0.5)  # not waiting for a linger of any size
    assert broker.ack_calls == 5
    await consumer.close()


async def test_close_sends_acks_still_lingering(served):
    broker, client, _ = served
    consumer, cid, messages = await _consumer_with_five_messages(client, 500)
    await consumer.ack_many(messages)
    await consumer.close()
    assert broker.acked[cid] == set(range(5))


async def test_send_before_create_is_an_error(served):
    _, client, _ = served
    producer = client.new_producer().with_topic(TOPIC).with_name("p").build()
    with pytest.raises(ClientError, match="create"):
        await producer.send(b"x")


async def test_producer_resends_after_the_server_comes_back():
    broker = FakeBroker()
    port = free_port()
    server, _ = await start_fake_server(broker, port)
    client = (
        DanubeClient.builder()
        .service_url(f"http://127.0.0.1:{port}")
        .with_retry(initial_backoff_s=0.05, max_backoff_s=0.2, give_up_after_s=20)
        .build()
    )
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        assert await (await producer.send(b"before")) == 0
        await server.stop(None)
        pending = await producer.send(b"during")
        await asyncio.sleep(0.3)
        assert not pending.done()
        server, _ = await start_fake_server(broker, port)
        assert await asyncio.wait_for(pending, 15) == 1
        await producer.close()
    finally:
        await client.close()
        await server.stop(None)


async def test_producer_the_broker_forgot_is_re_created_and_the_batch_resent():
    broker = FakeBroker()
    server, port = await start_fake_server(broker)
    client = DanubeClient.builder().service_url(f"http://127.0.0.1:{port}").build()
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        assert await (await producer.send(b"first")) == 0
        broker.producers.clear()  # the broker forgot the producer entirely: NOT_FOUND
        broker.producer_names.clear()
        fut = await producer.send(b"x")
        assert await asyncio.wait_for(fut, 10) == 1  # re-created under the same name, resent
        records = frame_codec.decode_batch(bytes(broker.topics[TOPIC].log))
        assert [bytes(r.payload) for r in records] == [b"first", b"x"]
        await producer.close()
    finally:
        await client.close()
        await server.stop(None)


async def test_unknown_producer_fails_the_futures_with_client_error_after_bounded_retries():
    broker = FakeBroker()
    server, port = await start_fake_server(broker)
    client = (
        DanubeClient.builder()
        .service_url(f"http://127.0.0.1:{port}")
        .with_retry(initial_backoff_s=0.01, max_backoff_s=0.02, give_up_after_s=30, max_attempts=3)
        .build()
    )
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        broker.producers.clear()  # re-creating returns the same, still unknown, id: NOT_FOUND every time
        fut = await producer.send(b"x")
        with pytest.raises(ClientError, match="gave up retrying after 3 attempt") as info:
            await asyncio.wait_for(fut, 10)
        assert isinstance(info.value.__cause__, NotFoundError)
        assert broker.publish_calls == 4  # the first send and three resends
        with pytest.raises(ClientError, match="gave up"):
            await producer.send(b"y")  # the producer stays failed
    finally:
        await client.close()
        await server.stop(None)


async def test_credit_goes_back_in_half_window_steps_and_delivery_never_stalls(served):
    broker, client, _ = served
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_receive_credit(10, 1 << 20)
        .build()
    )
    await consumer.subscribe()
    (part,) = consumer._parts
    got, owed_seen = [], []
    async with client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(0).build() as producer:
        for i in range(25):  # 25 one-message deliveries through a window of 10
            await producer.send_and_wait(b"%d" % i)
            batch = await asyncio.wait_for(consumer.receive_batch(), 5)
            got += batch.payloads()
            owed_seen.append(part.owed[0])
            await consumer.ack_batch(batch)
    assert got == [b"%d" % i for i in range(25)]
    # a batch's credit is owed once the application asks for the next batch (after its acks), and
    # held back until half the window (5 messages) is owed, then goes back as one grant
    assert owed_seen[:6] == [0, 1, 2, 3, 4, 0]
    assert max(owed_seen) == 4
    await consumer.close()
    (cid,) = consumer.consumer_ids
    assert broker.acked[cid] == set(range(25))


async def test_receive_batch_timeout_and_concurrent_receivers(served):
    broker, client, _ = served
    consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name("c").with_subscription("s").build()
    await consumer.subscribe()
    assert await consumer.receive_batch(timeout=0.05) is None
    first = asyncio.ensure_future(consumer.receive_batch(timeout=5))
    second = asyncio.ensure_future(consumer.receive_batch(timeout=5))
    async with client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(0).build() as producer:
        await producer.send_and_wait(b"a")
        await asyncio.wait_for(asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED), 5)
        await producer.send_and_wait(b"b")
    batches = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert sorted(p for b in batches for p in b.payloads()) == [b"a", b"b"]
    await consumer.close()

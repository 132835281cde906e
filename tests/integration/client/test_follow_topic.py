"""The client follows its topic when the broker drops it (unload): health CLOSE, UNAVAILABLE, NOT_FOUND.

Runs the real broker (``danube.server.app.BrokerApp``: BrokerService, local storage,
real gRPC server on a free loopback port) in the test's event loop, and unloads
with ``BrokerService.unload_topic`` exactly as the admin ``UnloadTopic`` does.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from danube.client import DanubeClient, SubType, health
from danube.server.app import BrokerApp
from danube.server.config import BrokerConfig
from tests.support.ports import free_port
from tests.support.waiting import async_wait_until

TOPIC = "/default/follow"


@pytest.fixture
async def app(tmp_path):
    broker_app = BrokerApp(
        BrokerConfig(port=free_port(), admin_port=0, metrics_port=0, data_dir=str(tmp_path / "broker"))
    )
    await broker_app.start()
    try:
        yield broker_app
    finally:
        await broker_app.stop()


def client_for(app: BrokerApp, *, health_s: float) -> DanubeClient:
    return (
        DanubeClient.builder()
        .service_url(f"http://127.0.0.1:{app.bound['client']}")
        .with_retry(initial_backoff_s=0.02, max_backoff_s=0.2, give_up_after_s=20)
        .with_health_check_interval(health_s)
        .build()
    )


def health_tasks() -> list[asyncio.Task]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name() == "danube-health-checker" and not t.done() and not t.cancelling()
    ]


async def test_producer_resends_after_unload_and_offsets_continue(app):
    # Health checks off: the batch coming back UNAVAILABLE alone makes the producer follow.
    client = client_for(app, health_s=0)
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        assert await (await producer.send_batch([b"%d" % i for i in range(5)])) == list(range(5))
        (pid,) = producer.producer_ids
        assert await app.broker.unload_topic(TOPIC) == 4
        assert TOPIC not in app.broker.topics
        futures = [await producer.send(b"%d" % i) for i in range(5, 10)]
        assert await asyncio.wait_for(asyncio.gather(*futures), 15) == list(range(5, 10))
        assert producer._parts[0].reconnects == 1
        assert producer.producer_ids == [pid]  # same name, same id after re-creation
        assert TOPIC in app.broker.topics  # reloaded through resume
        await producer.close()
    finally:
        await client.close()


async def test_health_close_re_creates_an_idle_producer(app):
    client = client_for(app, health_s=0.1)
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        assert await producer.send_and_wait(b"a") == 0
        await app.broker.unload_topic(TOPIC)
        # Nothing is sent: only the health check's CLOSE can bring the topic back here.
        await async_wait_until(lambda: producer._parts[0].reconnects == 1 and TOPIC in app.broker.topics)
        assert app.broker.health("producer", producer.producer_ids[0])
        assert await producer.send_and_wait(b"b") == 1
        await producer.close()
        assert health_tasks() == []
    finally:
        await client.close()


async def test_the_batch_health_call_names_what_the_broker_no_longer_serves(app):
    from danube.proto.danube_batch import batch_pb2 as batch_pb

    client = client_for(app, health_s=0)
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").build()
        consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name("c").with_subscription("s").build()
        await producer.create()
        await consumer.subscribe()
        (pid,), cid = producer.producer_ids, consumer._parts[0].consumer_id
        conn = producer._parts[0]._conn
        assert conn.batch_health

        async def closed() -> tuple[list[int], list[int]]:
            request = batch_pb.HealthRequest(producer_ids=[pid, 9999], consumer_ids=[cid, 8888])
            answer = await conn.batch_lane.Health(request, timeout=5)
            return list(answer.closed_producer_ids), list(answer.closed_consumer_ids)

        assert await closed() == ([9999], [8888])  # unknown ids are closed, as HealthCheck answers
        await app.broker.unload_topic(TOPIC)
        assert await closed() == ([pid, 9999], [cid, 8888])
        await producer.close()
        await consumer.close()
    finally:
        await client.close()


async def test_consumer_follows_unload_without_repeating_acked_messages(app):
    client = client_for(app, health_s=0.2)
    try:
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
        await (await producer.send_batch([b"%d" % i for i in range(10)]))
        seen: list[int] = []
        async for message in consumer:
            seen.append(message.offset)
            await consumer.ack(message)
            if len(seen) == 4:
                break
        await asyncio.sleep(0.2)  # the four acks reach the broker
        await app.broker.unload_topic(TOPIC)
        assert await (await producer.send_batch([b"%d" % i for i in range(10, 15)])) == list(range(10, 15))
        while len(seen) < 15:
            batch = await consumer.receive_batch(timeout=10)
            assert batch is not None, f"only {seen} arrived"
            for message in batch.messages():
                seen.append(message.offset)
                await consumer.ack(message)
        assert seen == list(range(15))  # nothing acked came twice, nothing missing
        await async_wait_until(lambda: consumer._parts[0].resubscribes >= 1)
        extra = await consumer.receive_batch(timeout=0.5)
        assert extra is None
        await producer.close()
        await consumer.close()
        assert health_tasks() == []
        assert client._watches == set()
    finally:
        await client.close()


async def test_consumer_without_credit_left_follows_on_health_close(app):
    # One message of credit: after it the server waits for credit and never notices the
    # unload on the stream; only the health check's CLOSE makes the consumer re-subscribe.
    client = client_for(app, health_s=0.1)
    try:
        consumer = (
            client.new_consumer()
            .with_topic(TOPIC)
            .with_consumer_name("c")
            .with_subscription("s")
            .with_receive_credit(1, 1 << 20)
            .build()
        )
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        await consumer.subscribe()
        await producer.send_and_wait(b"0")
        await async_wait_until(lambda: not consumer._queue.empty())
        await app.broker.unload_topic(TOPIC)
        await async_wait_until(lambda: consumer._parts[0].resubscribes == 1)
        first = await consumer.receive_batch(timeout=5)
        assert first is not None and first.offsets() == [0]
        await consumer.ack_batch(first)
        await producer.send_and_wait(b"1")
        got = []
        while len(got) < 1:
            batch = await consumer.receive_batch(timeout=5)
            assert batch is not None
            got.extend(batch.offsets())
            await consumer.ack_batch(batch)
        assert got == [1]  # 0 (redelivered, then acked) is not handed out again
        await producer.close()
        await consumer.close()
    finally:
        await client.close()


async def test_closing_producer_and_consumer_stops_health_checks(app):
    client = client_for(app, health_s=0.05)
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").build()
        consumer = client.new_consumer().with_topic(TOPIC).with_consumer_name("c").with_subscription("s").build()
        await producer.create()
        await consumer.subscribe()
        # one shared checker task for both watches
        assert health.watching() == 2 and len(health_tasks()) == 1
        await asyncio.sleep(0.2)  # a few checks answered OK: nothing happened
        assert producer._parts[0].reconnects == 0 and consumer._parts[0].resubscribes == 0
        await producer.close()
        await consumer.close()
        assert health_tasks() == []
    finally:
        await client.close()


async def test_client_close_stops_health_checks_of_unclosed_producers(app):
    client = client_for(app, health_s=0.05)
    producer = client.new_producer().with_topic(TOPIC).with_name("p").build()
    await producer.create()
    assert health.watching() == 1 and len(health_tasks()) == 1
    await client.close()
    assert health.watching() == 0 and health_tasks() == []


def test_health_interval_and_retry_options_are_checked():
    from danube.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        DanubeClient.builder().with_health_check_interval(-1)
    with pytest.raises(InvalidArgumentError):
        DanubeClient.builder().with_retry(max_attempts=0)
    assert DanubeClient.builder().build().health_check_interval_s == 5.0
    assert DanubeClient.builder().with_health_check_interval(None).build().health_check_interval_s == 0.0


def test_a_write_racing_the_end_of_a_stream_is_retriable_other_internal_errors_are_not():
    from grpc.aio import AioRpcError, Metadata

    from danube.client.errors import from_rpc_error, is_retriable

    lost = AioRpcError(grpc.StatusCode.INTERNAL, Metadata(), Metadata(), details="Internal error from Core")
    bug = AioRpcError(grpc.StatusCode.INTERNAL, Metadata(), Metadata(), details="internal error: KeyError: 3")
    assert is_retriable(lost) and from_rpc_error(lost).retriable
    assert not is_retriable(bug) and not from_rpc_error(bug).retriable


async def test_one_shared_checker_tells_only_the_producers_and_consumers_of_the_unloaded_topic(app):
    # Two clients in one loop, 12 producers and 6 consumers over 6 topics, all idle: one checker task
    # serves them all, and only those on the unloaded topic hear CLOSE and re-create themselves.
    clients = [client_for(app, health_s=0.2) for _ in range(2)]
    topics = [f"{TOPIC}-{i}" for i in range(6)]
    try:
        producers = [
            clients[i % 2].new_producer().with_topic(topics[i % 6]).with_name(f"p{i}").with_linger_ms(1).build()
            for i in range(12)
        ]
        consumers = [
            clients[i % 2]
            .new_consumer()
            .with_topic(topics[i])
            .with_consumer_name(f"c{i}")
            .with_subscription("s")
            .build()
            for i in range(6)
        ]
        await asyncio.gather(*(p.create() for p in producers))
        await asyncio.gather(*(c.subscribe() for c in consumers))
        assert health.watching() == 18 and len(health_tasks()) == 1
        await app.broker.unload_topic(topics[2])
        moved = [p for p in producers if p.topic == topics[2]]
        await async_wait_until(
            lambda: all(p._parts[0].reconnects == 1 for p in moved) and consumers[2]._parts[0].resubscribes == 1
        )
        await asyncio.sleep(0.5)  # two more rounds of checks: nobody else was told anything
        assert all(p._parts[0].reconnects == 0 for p in producers if p not in moved)
        assert all(c._parts[0].resubscribes == 0 for i, c in enumerate(consumers) if i != 2)
        assert all(app.broker.health("producer", p.producer_ids[0]) for p in producers)
        assert health.watching() == 18
        await asyncio.gather(*(p.close() for p in producers), *(c.close() for c in consumers))
        assert health.watching() == 0 and health_tasks() == []
    finally:
        for client in clients:
            await client.close()

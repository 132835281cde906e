"""Consumers read together through a ConsumerSet, and acks flushed before their linger, against
the batch lane over a BrokerService test double (real gRPC server)."""

from __future__ import annotations

import asyncio

import pytest

from danube.client import ConsumerSet, DanubeClient
from danube.client.consumer import DEFAULT_ACK_LINGER_MS
from danube.errors import ClientError
from tests.support.fake_broker import FakeBroker, start_fake_server
from tests.support.waiting import async_wait_until


@pytest.fixture
async def served():
    broker = FakeBroker()
    server, port = await start_fake_server(broker)
    client = DanubeClient.builder().service_url(f"http://127.0.0.1:{port}").build()
    try:
        yield broker, client
    finally:
        await client.close()
        await server.stop(None)


def _consumer(client, topic: str, linger_ms: float = DEFAULT_ACK_LINGER_MS):
    return (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_ack_linger_ms(linger_ms)
        .build()
    )


async def _publish(client, topic: str, payloads: list[bytes]) -> None:
    async with client.new_producer().with_topic(topic).with_name("p").build() as producer:
        await (await producer.send_batch(payloads))


async def test_a_set_reads_every_topic_and_acks_go_to_each_consumer(served):
    broker, client = served
    topics = [f"/default/set-{i}" for i in range(3)]
    consumers = [_consumer(client, t) for t in topics]
    await asyncio.gather(*(c.subscribe() for c in consumers))
    group = ConsumerSet(consumers)
    for i, topic in enumerate(topics):
        await _publish(client, topic, [b"%d-%d" % (i, n) for n in range(i + 2)])
    got: dict[str, list[bytes]] = {t: [] for t in topics}
    while sum(len(v) for v in got.values()) < 2 + 3 + 4:
        for consumer, batches in await asyncio.wait_for(group.receive(), 10):
            for batch in batches:
                got[consumer.topic].extend(bytes(p) for p in batch.payloads())
                await consumer.ack_batch(batch)
    assert got == {t: [b"%d-%d" % (i, n) for n in range(i + 2)] for i, t in enumerate(topics)}
    for consumer in consumers:
        await consumer.close()  # sends the lingering acks
    for i, consumer in enumerate(consumers):
        (cid,) = consumer.consumer_ids
        assert broker.acked[cid] == set(range(i + 2))
    assert await asyncio.wait_for(group.receive(), 5) == []  # all closed: the set is empty


async def test_flush_writes_lingering_acks_without_waiting_for_the_linger(served):
    broker, client = served
    topic = "/default/flush"
    consumer = _consumer(client, topic, linger_ms=1000)
    await consumer.subscribe()
    await _publish(client, topic, [b"a", b"b", b"c"])
    batch = await asyncio.wait_for(consumer.receive_batch(), 10)
    await consumer.ack_batch(batch)
    (part,) = consumer._parts
    assert len(part._outbox) == 1  # lingering
    await asyncio.wait_for(consumer.flush(), 5)
    assert len(part._outbox) == 0  # written, long before the second of linger is over
    (cid,) = consumer.consumer_ids
    await async_wait_until(lambda: broker.acked[cid] == {0, 1, 2}, timeout=10, what="the flushed acks at the broker")
    await consumer.close()
    with pytest.raises(ClientError, match="closed"):
        await consumer.flush()


async def test_a_reader_that_takes_the_whole_window_at_once_still_reads_everything(served):
    """A reader slower than the deliveries finds the whole receive window waiting and takes it in
    one receive: the broker, out of credit, sends nothing more until the set's next receive gives
    the credit of those batches back."""
    broker, client = served
    topic = "/default/slow-reader"
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_receive_credit(10, 1 << 20)
        .build()
    )
    await consumer.subscribe()
    group = ConsumerSet([consumer])
    await _publish(client, topic, [b"%d" % n for n in range(30)])
    inbox = consumer._queue.items
    await async_wait_until(lambda: sum(b.count for b in inbox) == 10, timeout=10, what="the whole window delivered")
    got: list[bytes] = []
    while len(got) < 30:
        for member, batches in await asyncio.wait_for(group.receive(), 10):
            for batch in batches:
                got.extend(bytes(p) for p in batch.payloads())
                await member.ack_batch(batch)
    assert got == [b"%d" % n for n in range(30)]
    await consumer.close()

"""Many consumers on one connection (the batch lane, native server): every consumer receives its
topic in order while their credits and acks share the connection's reads (one callback per
control message, acks applied once per consumer and loop turn), a nack brings its message back,
and the acks persist: nothing acked comes back after the consumers reconnect or the broker
restarts."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from danube.client import DanubeClient
from tests.support.broker import running_broker

TOPICS = 24
BATCHES = 5
PER_BATCH = 3


@pytest.fixture
def broker():
    with running_broker("--sync", "interval") as b:
        yield b


def client_for(broker) -> DanubeClient:
    return (
        DanubeClient.builder()
        .service_url(broker.url)
        .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
        .build()
    )


async def drain(consumer, n: int, timeout: float = 20.0) -> list:
    got: list = []

    async def run():
        while len(got) < n:
            batch = await consumer.receive_batch()
            got.extend(batch.messages())
            await consumer.ack_batch(batch)

    await asyncio.wait_for(run(), timeout)
    return got


async def test_many_consumers_on_one_connection_receive_in_order_and_their_acks_persist(broker):
    base = f"/default/many-{uuid.uuid4().hex[:8]}"
    topics = [f"{base}-{i}" for i in range(TOPICS)]
    consuming = client_for(broker)  # one client: one connection for every consumer
    producing = client_for(broker)
    try:

        def consumer_of(topic):
            return (
                consuming.new_consumer()
                .with_topic(topic)
                .with_consumer_name("c")
                .with_subscription("s")
                .with_reliable()
                .build()
            )

        consumers = [consumer_of(t) for t in topics]
        await asyncio.gather(*(c.subscribe() for c in consumers))
        producers = [producing.new_producer().with_topic(t).with_name("p").build() for t in topics]
        await asyncio.gather(*(p.create() for p in producers))
        # small batches to every topic, interleaved: every consumer's deliveries and acks share the connection
        for b in range(BATCHES):
            sent = [
                await p.send_batch([b"%s:%d:%d" % (t.encode(), b, k) for k in range(PER_BATCH)])
                for p, t in zip(producers, topics)
            ]
            await asyncio.gather(*sent)
        total = BATCHES * PER_BATCH
        got = await asyncio.gather(*(drain(c, total) for c in consumers))
        for topic, messages in zip(topics, got):
            assert [m.payload for m in messages] == [
                b"%s:%d:%d" % (topic.encode(), b, k) for b in range(BATCHES) for k in range(PER_BATCH)
            ]
            assert [m.offset for m in messages] == list(range(total))

        # a nack on one stream while the others ack: its message comes back, to it alone
        await (await producers[0].send_batch([b"nacked"]))
        (m,) = (await asyncio.wait_for(consumers[0].receive_batch(), 10)).messages()
        await consumers[0].nack(m, delay_ms=0)
        again = await asyncio.wait_for(consumers[0].receive_batch(), 15)
        assert [(x.offset, x.payload) for x in again.messages()] == [(total, b"nacked")]
        await consumers[0].ack_batch(again)
        await asyncio.gather(*(c.close() for c in consumers))  # the stream's end applies its last acks
        await asyncio.gather(*(p.close() for p in producers))
    finally:
        await consuming.close()
        await producing.close()

    broker.restart()  # a graceful stop persists every cursor
    consuming, producing = client_for(broker), client_for(broker)
    try:
        consumers = [
            consuming.new_consumer()
            .with_topic(t)
            .with_consumer_name("c")
            .with_subscription("s")
            .with_reliable()
            .build()
            for t in topics
        ]
        await asyncio.gather(*(c.subscribe() for c in consumers))
        for t in topics:
            async with producing.new_producer().with_topic(t).with_name("p").build() as p:
                await (await p.send_batch([b"after restart"]))
        for i, c in enumerate(consumers):
            batch = await asyncio.wait_for(c.receive_batch(), 15)
            # nothing acked came back: the first delivery is the new message
            assert [(m.offset, m.payload) for m in batch.messages()] == [(total + (i == 0), b"after restart")]
            await c.ack_batch(batch)
        await asyncio.gather(*(c.close() for c in consumers))
    finally:
        await consuming.close()
        await producing.close()


async def test_more_consumers_than_one_connection_carries_all_subscribe_and_receive(broker):
    """A broker limits the concurrent streams of an HTTP/2 connection and the transport holds a
    stream past that until another ends: consumers past a share of it get another channel instead
    of waiting forever for their subscription."""
    base = f"/default/wide-{uuid.uuid4().hex[:8]}"
    n = 300
    topics = [f"{base}-{i}" for i in range(n)]
    consuming = client_for(broker)
    producing = client_for(broker)
    try:
        consumers = [
            consuming.new_consumer()
            .with_topic(t)
            .with_consumer_name("c")
            .with_subscription("s")
            .with_reliable(False)
            .build()
            for t in topics
        ]
        await asyncio.wait_for(asyncio.gather(*(c.subscribe() for c in consumers)), 60)
        assert consuming.connection().channels > 1
        for i in (0, n - 1):  # the first consumer's channel and the last one's
            async with producing.new_producer().with_topic(topics[i]).with_name("p").with_reliable(False).build() as p:
                await (await p.send_batch([b"m%d" % i]))
            (m,) = (await asyncio.wait_for(consumers[i].receive_batch(), 15)).messages()
            assert m.payload == b"m%d" % i
        await asyncio.gather(*(c.close() for c in consumers))
    finally:
        await consuming.close()
        await producing.close()

"""danube.client's Publish and Consume streams on its own HTTP/2 transport against a real broker
process: produce and consume, and a broker killed mid-stream loses nothing that was acked.

(The other tests of this directory run the same transport, the default, against grpcio servers.)
"""

from __future__ import annotations

import asyncio

import pytest

from danube.client import DanubeClient
from danube.client.h2.call import H2StreamCall
from danube.client.h2.lane import H2BatchLane
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(180)


def client_of(url: str) -> DanubeClient:
    return (
        DanubeClient.builder()
        .service_url(url)
        .with_transport("h2")
        .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=60)
        .with_health_check_interval(0)
        .build()
    )


async def consume(client: DanubeClient, topic: str, name: str, count: int) -> list[tuple[int, bytes]]:
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(name)
        .with_initial_position("earliest")
        .build()
    )
    await consumer.subscribe()
    got: list[tuple[int, bytes]] = []
    try:
        while len(got) < count:
            batch = await consumer.receive_batch(timeout=20)
            assert batch is not None, f"only {len(got)} of {count} messages arrived"
            got += [(m.offset, m.payload) for m in batch.messages()]
            await consumer.ack_batch(batch)
    finally:
        await consumer.close()
    return got


async def test_produce_and_consume_over_the_h2_transport():
    topic = "/default/h2-roundtrip"
    with running_broker("--sync", "never") as broker:
        client = client_of(broker.url)
        try:
            producer = client.new_producer().with_topic(topic).with_name("p").with_linger_ms(1).build()
            await producer.create()
            assert isinstance(client.connection().batch_lane, H2BatchLane)
            payloads = [b"m%d" % i + b"x" * (i % 50) for i in range(3000)]
            futures = [await producer.send(p) for p in payloads]
            assert await asyncio.wait_for(asyncio.gather(*futures), 30) == list(range(3000))
            big = b"B" * 300_000  # several DATA frames each way
            assert await (await producer.send(big)) == 3000
            got = await consume(client, topic, "c", 3001)
            assert [p for _, p in got] == payloads + [big]
            await producer.close()
        finally:
            await client.close()


async def test_broker_killed_mid_stream_the_producer_reconnects_and_nothing_acked_is_lost():
    topic = "/default/h2-kill"
    with running_broker("--sync", "always") as broker:
        client = client_of(broker.url)
        acked: dict[int, bytes] = {}
        try:
            producer = client.new_producer().with_topic(topic).with_name("p").with_linger_ms(2).build()
            await producer.create()

            async def send(i: int) -> None:
                payload = b"k%d" % i
                acked[await (await producer.send(payload))] = payload

            pending = []
            for i in range(4000):
                pending.append(asyncio.ensure_future(send(i)))
                if i % 50 == 0:
                    await asyncio.sleep(0.005)
                if i == 1500:
                    await asyncio.sleep(0.2)
                    assert acked, "acks before the kill"
                    (part,) = producer._parts
                    assert isinstance(part._call, H2StreamCall)  # the Publish stream is this transport's
                    broker.kill()
                    await asyncio.sleep(0.5)
                    broker.start()
            await asyncio.wait_for(asyncio.gather(*pending), 90)
            assert len(acked) == 4000 and producer.reconnects >= 1
            await producer.close()
        finally:
            await client.close()
        reader = client_of(broker.url)
        try:
            stored = dict(await consume(reader, topic, "after", len(acked)))
        finally:
            await reader.close()
        assert {offset: stored.get(offset) for offset in acked} == acked

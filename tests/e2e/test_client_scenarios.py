"""The scenarios of test_danube_client.py, run with the project's own client (``danube.client``, batch lane).

One broker process serves the whole module (every test uses its own topic); the restart
scenario starts its own broker because it stops and restarts it.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from danube.client import DanubeClient, SubType
from danube.client.partition_router import fnv1a_64
from danube.errors import AlreadyExistsError, ClientError, InvalidArgumentError, NotFoundError
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(90)

MAX_MESSAGE_SIZE = 10 * 1024 * 1024  # the broker's default max_message_size


@pytest.fixture(scope="module")
def broker():
    with running_broker("--sync", "interval") as b:
        yield b


def new_client(broker) -> DanubeClient:
    return (
        DanubeClient.builder()
        .service_url(broker.url)
        .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
        .build()
    )


@pytest.fixture
async def client(broker):
    c = new_client(broker)
    yield c
    await c.close()


def fresh_topic(kind: str) -> str:
    return f"/default/{kind}-{uuid.uuid4().hex[:8]}"


async def make_producer(client, topic, name="p", **options):
    builder = client.new_producer().with_topic(topic).with_name(name).with_linger_ms(options.pop("linger_ms", 1))
    if "reliable" in options:
        builder = builder.with_reliable(options.pop("reliable"))
    if "partitions" in options:
        builder = builder.with_partitions(options.pop("partitions"))
    assert not options, options
    return await builder.build().create()


async def make_consumer(client, topic, sub, name, sub_type=SubType.Exclusive, *, filters=(), reliable=True):
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(sub)
        .with_subscription_type(sub_type)
        .with_key_filters(filters)
        .with_reliable(reliable)
        .build()
    )
    return await consumer.subscribe()


async def collect(consumer, n: int, timeout: float = 10.0) -> list:
    """Exactly the next ``n`` messages (fails if they do not come within ``timeout``)."""
    got = []

    async def run():
        async for m in consumer:
            got.append(m)
            if len(got) == n:
                return

    try:
        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"got {len(got)} of {n} messages in {timeout}s: {[m.payload for m in got]}")
    return got


async def drain(consumer, seconds: float) -> list:
    """Every message arriving within ``seconds``."""
    got = []

    async def run():
        async for m in consumer:
            got.append(m)

    try:
        await asyncio.wait_for(run(), seconds)
    except asyncio.TimeoutError:
        pass
    return got


async def send_each(producer, payloads, key=None) -> list[int]:
    """One message at a time, each awaited: every message is its own batch on the wire."""
    return [await producer.send_and_wait(p, key=key) for p in payloads]


def payloads_of(messages) -> list[bytes]:
    return [m.payload for m in messages]


# ---------------------------------------------------------------- subscription types, reliable or not


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "non_reliable"])
async def test_produce_consume_exclusive(client, reliable):
    topic = fresh_topic("basic")
    producer = await make_producer(client, topic, reliable=reliable)
    assert await producer.send_and_wait(b"before") == 0  # creates the topic, offset 0
    consumer = await make_consumer(client, topic, "sub", "c1", reliable=reliable)
    sent = [b"m-%d" % i for i in range(20)]
    futures = [await producer.send(p, attributes={"i": str(i)}) for i, p in enumerate(sent)]
    assert await asyncio.gather(*futures) == list(range(1, 21))
    got = await collect(consumer, 20)
    assert payloads_of(got) == sent  # in order, nothing from before
    assert [m.offset for m in got] == list(range(1, 21))
    assert {m.topic for m in got} == {topic}
    assert [m.attributes for m in got] == [{"i": str(i)} for i in range(20)]
    assert {m.redelivery_count for m in got} == {0}
    await consumer.ack_many(got)
    assert await drain(consumer, 0.3) == []
    await consumer.close()
    await producer.close()


async def test_leaving_the_message_loop_early_loses_nothing(client):
    topic = fresh_topic("early-exit")
    producer = await make_producer(client, topic)
    consumer = await make_consumer(client, topic, "sub", "c1")
    sent = [b"e-%d" % i for i in range(20)]
    assert await (await producer.send_batch(sent)) == list(range(20))  # one batch on the wire
    head = await collect(consumer, 5)  # breaks out in the middle of it
    rest = await collect(consumer, 15)
    assert payloads_of(head) + payloads_of(rest) == sent
    await consumer.ack_many(head + rest)
    assert await drain(consumer, 0.3) == []
    await consumer.close()
    await producer.close()


async def test_second_exclusive_consumer_is_rejected(client):
    topic = fresh_topic("excl")
    producer = await make_producer(client, topic)
    first = await make_consumer(client, topic, "only", "c1")
    with pytest.raises(AlreadyExistsError) as info:
        await make_consumer(client, topic, "only", "c2")
    assert "exclusive" in str(info.value) and "'c1'" in str(info.value), str(info.value)
    # joining the exclusive subscription as a shared consumer is refused too
    with pytest.raises(InvalidArgumentError) as info:
        await make_consumer(client, topic, "only", "c3", SubType.Shared)
    assert "exclusive" in str(info.value), str(info.value)
    sent = [b"x-%d" % i for i in range(5)]
    assert await send_each(producer, sent) == list(range(5))
    got = await collect(first, 5)  # the first consumer keeps working
    assert payloads_of(got) == sent
    await first.ack_many(got)
    await first.close()
    await producer.close()


async def test_shared_subscription_splits_messages_exactly_once(client):
    topic = fresh_topic("shared")
    producer = await make_producer(client, topic)
    a = await make_consumer(client, topic, "work", "a", SubType.Shared)
    b = await make_consumer(client, topic, "work", "b", SubType.Shared)
    sent = [b"s-%d" % i for i in range(40)]
    offsets = await send_each(producer, sent)
    assert offsets == list(range(40))
    got_a, got_b = await asyncio.gather(drain(a, 1.5), drain(b, 1.5))
    assert sorted(payloads_of(got_a) + payloads_of(got_b)) == sorted(sent)  # each exactly once
    assert len(got_a) + len(got_b) == 40
    assert got_a and got_b, (len(got_a), len(got_b))  # both took turns
    for got in (got_a, got_b):  # each in publish order
        assert [m.offset for m in got] == sorted(m.offset for m in got)
        assert [m.payload for m in got] == [sent[m.offset] for m in got]
    await a.ack_many(got_a)
    await b.ack_many(got_b)
    assert await drain(a, 0.3) == [] and await drain(b, 0.3) == []
    await a.close()
    await b.close()
    await producer.close()


async def test_failover_standby_takes_over_when_active_leaves(client):
    topic = fresh_topic("failover")
    producer = await make_producer(client, topic)
    active = await make_consumer(client, topic, "fo", "active", SubType.Failover)
    standby = await make_consumer(client, topic, "fo", "standby", SubType.Failover)
    first = [b"f-%d" % i for i in range(10)]
    await send_each(producer, first)
    got = await collect(active, 10)
    assert payloads_of(got) == first
    await active.ack_many(got)
    # delivered but not acked by the active one: the standby gets these once it takes over
    unacked = [b"u-%d" % i for i in range(5)]
    await send_each(producer, unacked)
    assert payloads_of(await collect(active, 5)) == unacked
    assert await drain(standby, 0.5) == []  # the standby receives nothing meanwhile
    await active.close()
    later = [b"l-%d" % i for i in range(5)]
    await send_each(producer, later)
    taken_over = await collect(standby, 10)
    assert payloads_of(taken_over) == unacked + later
    assert [m.offset for m in taken_over] == list(range(10, 20))
    await standby.ack_many(taken_over)
    assert await drain(standby, 0.3) == []
    await standby.close()
    await producer.close()


async def test_key_shared_keeps_each_key_on_one_consumer(client):
    topic = fresh_topic("keyed")
    producer = await make_producer(client, topic)
    a = await make_consumer(client, topic, "ks", "a", SubType.KeyShared)
    b = await make_consumer(client, topic, "ks", "b", SubType.KeyShared)
    keys = [f"key-{k}" for k in range(12)]
    sent = []
    for i in range(60):
        key = keys[i % len(keys)]
        payload = b"%s:%d" % (key.encode(), i)
        await producer.send_and_wait(payload, key=key)
        sent.append(payload)
    got_a, got_b = await asyncio.gather(drain(a, 1.5), drain(b, 1.5))
    assert sorted(payloads_of(got_a) + payloads_of(got_b)) == sorted(sent)
    keys_a = {m.routing_key for m in got_a}
    keys_b = {m.routing_key for m in got_b}
    assert keys_a.isdisjoint(keys_b) and keys_a | keys_b == set(keys)  # one consumer per key
    assert keys_a and keys_b, (keys_a, keys_b)
    for got in (got_a, got_b):  # per-key order kept
        for key in {m.routing_key for m in got}:
            assert [m.payload for m in got if m.routing_key == key] == [
                p for p in sent if p.startswith(key.encode() + b":")
            ]
    await a.ack_many(got_a)
    await b.ack_many(got_b)
    await a.close()
    await b.close()
    await producer.close()


async def test_key_shared_with_glob_filters(client):
    topic = fresh_topic("filtered")
    producer = await make_producer(client, topic)
    eu = await make_consumer(client, topic, "ks", "eu", SubType.KeyShared, filters=["eu-*"])
    us = await make_consumer(client, topic, "ks", "us", SubType.KeyShared, filters=["us-?"])
    keys = ["eu-west", "us-1", "eu-north", "us-10"]  # us-10 matches no filter yet
    sent: dict[str, list[bytes]] = {k: [] for k in keys}
    for i in range(24):
        key = keys[i % len(keys)]
        payload = b"%s@%d" % (key.encode(), i)
        await producer.send_and_wait(payload, key=key)
        sent[key].append(payload)
    got_eu, got_us = await asyncio.gather(drain(eu, 1.5), drain(us, 1.5))
    assert payloads_of(got_eu) == in_publish_order(sent, ["eu-west", "eu-north"])
    assert payloads_of(got_us) == sent["us-1"]
    assert {m.routing_key for m in got_eu} == {"eu-west", "eu-north"}
    # a key no consumer accepts waits until one does
    late = await make_consumer(client, topic, "ks", "us-long", SubType.KeyShared, filters=["us-??"])
    got_late = await collect(late, 6)
    assert payloads_of(got_late) == sent["us-10"]
    for consumer, got in ((eu, got_eu), (us, got_us), (late, got_late)):
        await consumer.ack_many(got)
    assert await drain(late, 0.3) == []
    for consumer in (eu, us, late):
        await consumer.close()
    await producer.close()


def in_publish_order(sent: dict[str, list[bytes]], keys: list[str]) -> list[bytes]:
    """The payloads of ``keys`` in publish order (payloads end with @<publish index>)."""
    chosen = [p for k in keys for p in sent[k]]
    return sorted(chosen, key=lambda p: int(p.rsplit(b"@", 1)[1]))


# ---------------------------------------------------------------- partitions


async def test_partitioned_producer_and_consumer(client):
    topic = fresh_topic("parts")
    producer = await make_producer(client, topic, partitions=3)
    assert producer.partitions == [f"{topic}-part-{i}" for i in range(3)]
    consumer = await make_consumer(client, topic, "p", "c", SubType.Shared)  # partitions found by lookup
    assert len(consumer.consumer_ids) == 3
    keyed = [(f"user-{i % 7}", b"k-%d" % i) for i in range(35)]
    for key, payload in keyed:
        await producer.send(payload, key=key)
    unkeyed = [b"u-%d" % i for i in range(9)]
    for payload in unkeyed:
        await producer.send(payload)  # round robin: i % 3
    await producer.flush()
    got = await collect(consumer, 44)
    assert sorted(payloads_of(got)) == sorted([p for _, p in keyed] + unkeyed)
    by_payload = {m.payload: m for m in got}
    for key, payload in keyed:  # FNV-1a-64(key) % 3, as Danube's clients
        m = by_payload[payload]
        assert m.routing_key == key
        assert m.topic == f"{topic}-part-{fnv1a_64(key.encode()) % 3}"
    for i, payload in enumerate(unkeyed):
        assert by_payload[payload].topic == f"{topic}-part-{i % 3}"
    for i in range(3):  # each partition: its own offsets from 0
        part = [m for m in got if m.topic == f"{topic}-part-{i}"]
        assert [m.offset for m in part] == list(range(len(part)))
    await consumer.ack_many(got)
    assert await drain(consumer, 0.3) == []
    await consumer.close()
    await producer.close()


# ---------------------------------------------------------------- nack


async def test_nack_with_delay_redelivers_no_earlier_than_the_delay(client):
    topic = fresh_topic("nacked")
    producer = await make_producer(client, topic)
    consumer = await make_consumer(client, topic, "n", "c")
    sent = [b"n-%d" % i for i in range(3)]
    offsets = await send_each(producer, sent)
    got = await collect(consumer, 3)
    assert payloads_of(got) == sent
    delay_ms = 1500
    nacked_at = {}
    for m in got:
        nacked_at[m.offset] = time.monotonic()
        await consumer.nack(m, delay_ms=delay_ms, reason="not yet")
    again = await collect(consumer, 3, timeout=10)
    arrived = time.monotonic()
    assert payloads_of(again) == sent
    assert [m.offset for m in again] == offsets
    for m in again:
        waited = arrived - nacked_at[m.offset]
        assert waited >= delay_ms / 1000 - 0.01, (m.offset, waited)
    await consumer.ack_many(again)
    assert await drain(consumer, 0.5) == []  # acked: never again
    await consumer.close()
    await producer.close()


async def test_nack_redelivery_carries_its_redelivery_count(client):
    topic = fresh_topic("nack-count")
    producer = await make_producer(client, topic)
    consumer = await make_consumer(client, topic, "n", "c")
    for payload in (b"p-0", b"p-1", b"p-2"):
        await producer.send_and_wait(payload)
    got = await collect(consumer, 3)
    assert [m.redelivery_count for m in got] == [0, 0, 0]
    for m in got:
        await consumer.nack(m, delay_ms=0)
    again = await collect(consumer, 3)
    await consumer.ack_many(again)
    await consumer.close()
    await producer.close()
    assert [m.offset for m in again] == [0, 1, 2]
    assert [m.redelivery_count for m in again] == [1, 1, 1]


# ---------------------------------------------------------------- restart


async def test_broker_restart_mid_stream_resumes_at_cursor(tmp_path):
    loop = asyncio.get_running_loop()
    with running_broker("--sync", "interval", data_dir=str(tmp_path)) as broker:
        topic = fresh_topic("resume")
        live = new_client(broker)
        audit_client = new_client(broker)
        try:
            producer = await make_producer(live, topic, linger_ms=2)
            consumer = await make_consumer(live, topic, "live", "c")
            audit = await make_consumer(audit_client, topic, "audit", "a")
            first = [b"r-%03d" % i for i in range(40)]
            assert await (await producer.send_batch(first)) == list(range(40))
            got = await collect(consumer, 40)
            assert payloads_of(got) == first
            await consumer.ack_many(got[:25])  # 25..39 delivered, never acked
            audited = await collect(audit, 40)
            await audit.ack_many(audited[:10])
            await asyncio.sleep(0.5)  # let the in-stream acks reach the broker
            await audit.close()
            await audit_client.close()

            second = [b"r-%03d" % i for i in range(40, 100)]

            async def produce_through_restart():
                futures = []
                for p in second:
                    futures.append(await producer.send(p))
                    await asyncio.sleep(0.05)
                return await asyncio.wait_for(asyncio.gather(*futures), 30)

            received, seen = [], set()

            async def consume_through_restart():
                async for m in consumer:  # ack each message as it is read
                    received.append(m)
                    await consumer.ack(m)
                    seen.add(m.offset)

            producing = asyncio.ensure_future(produce_through_restart())
            consuming = asyncio.ensure_future(consume_through_restart())
            await asyncio.sleep(0.5)
            # SIGTERM while both streams are busy, then start again on the same data dir and port
            port = broker.port
            await loop.run_in_executor(None, broker.stop)
            assert broker.exit_codes == [0], broker.log()  # clean exit
            assert not producing.done()  # the restart really is mid-stream
            await loop.run_in_executor(None, broker.start)
            assert broker.port == port
            offsets = await producing
            # offsets continue after the restart; a batch stored just before the stop whose ack the
            # stop cut off is resent (at-least-once), so it may be stored twice, earlier than its offset
            assert offsets == sorted(set(offsets)) and offsets[0] >= 40, offsets
            end = offsets[-1]
            stored_twice = sorted(set(range(40, end + 1)) - set(offsets))
            assert len(stored_twice) <= 4, (stored_twice, broker.log()[-4000:])  # max_in_flight batches
            deadline = loop.time() + 30
            while not seen >= set(range(25, end + 1)) and loop.time() < deadline and not consuming.done():
                await asyncio.sleep(0.05)
            if consuming.done():
                consuming.result()  # the consumer's own failure, if any
            consuming.cancel()
            assert consumer._parts[0].resubscribes >= 1
            # no acked message comes back, no unacked message is lost: every stored offset exactly once
            assert sorted(m.offset for m in received) == list(range(25, end + 1))
            stored = {m.offset: m.payload for m in received}
            assert [stored[o] for o in range(25, 40)] == first[25:]
            assert [stored[o] for o in offsets] == second
            for o in stored_twice:  # an earlier copy of a resent message
                assert offsets[second.index(stored[o])] > o, (o, stored[o])
            assert await drain(consumer, 0.3) == []
            await consumer.close()
            await producer.close()

            # a fresh client (no memory of acks) on the other subscription: the broker's persisted cursor
            audit_client = new_client(broker)
            audit = await make_consumer(audit_client, topic, "audit", "a")
            again = await collect(audit, end + 1 - 10, timeout=15)
            assert [m.offset for m in again] == list(range(10, end + 1))
            assert payloads_of(again) == first[10:25] + [stored[o] for o in range(25, end + 1)]
            assert await drain(audit, 0.3) == []
            await audit.ack_many(again)
            await audit.close()
            # ... and the acks made after the restart hold too
            fresh = await make_consumer(audit_client, topic, "live", "c")
            assert await drain(fresh, 0.5) == []
            await fresh.close()
        finally:
            await live.close()
            await audit_client.close()
        assert broker.stop() == 0


# ---------------------------------------------------------------- bad input through the client


async def test_invalid_topic_names_get_clear_errors(client):
    for bad in ("no-slash", "/default/bad topic", "/too/many/parts"):
        with pytest.raises(InvalidArgumentError) as info:
            await make_producer(client, bad)
        assert "/namespace/topic" in str(info.value), str(info.value)
        with pytest.raises(InvalidArgumentError) as info:
            await make_consumer(client, bad, "s", "c")
        assert "/namespace/topic" in str(info.value), str(info.value)
    # the client and broker keep working
    topic = fresh_topic("after-bad-name")
    producer = await make_producer(client, topic)
    consumer = await make_consumer(client, topic, "s", "c")
    assert await send_each(producer, [b"ok-1", b"ok-2"]) == [0, 1]
    assert payloads_of(await collect(consumer, 2)) == [b"ok-1", b"ok-2"]
    await consumer.close()
    await producer.close()


async def test_subscribing_to_a_missing_topic_is_not_found(client):
    topic = fresh_topic("missing")
    consumer = client.new_consumer().with_topic(topic).with_consumer_name("c").with_subscription("s").build()
    try:
        with pytest.raises(NotFoundError) as info:
            await consumer.subscribe()
        assert topic in str(info.value), str(info.value)
    finally:
        await consumer.close()


async def test_oversized_payload_fails_its_future_and_nothing_else(client):
    topic = fresh_topic("big")
    producer = await make_producer(client, topic)
    consumer = await make_consumer(client, topic, "s", "c")
    assert await send_each(producer, [b"a", b"b"]) == [0, 1]
    big = await producer.send(b"x" * (MAX_MESSAGE_SIZE + 1))
    with pytest.raises(InvalidArgumentError) as info:
        await asyncio.wait_for(big, 30)
    assert "max_message_size" in str(info.value), str(info.value)
    # the producer stays usable, offsets continue, the stored data is intact
    assert await send_each(producer, [b"c", b"d"]) == [2, 3]
    got = await collect(consumer, 4)
    assert payloads_of(got) == [b"a", b"b", b"c", b"d"]
    assert [m.offset for m in got] == [0, 1, 2, 3]
    await consumer.ack_many(got)
    assert await drain(consumer, 0.3) == []
    await consumer.close()
    await producer.close()


async def test_producer_of_the_other_dispatch_strategy_is_refused(client):
    topic = fresh_topic("strategy")
    producer = await make_producer(client, topic, reliable=True)
    with pytest.raises(InvalidArgumentError) as info:
        await make_producer(client, topic, name="other", reliable=False)
    assert "reliable" in str(info.value), str(info.value)
    assert await producer.send_and_wait(b"still fine") == 0
    await producer.close()
    with pytest.raises(ClientError):  # closed: refused on the client side
        await producer.send(b"late")

"""Danube broker tests deleted upstream, ported from their last version (each function is named
``<file>__<test>``).  The oldest ones used a TLS client and the since-removed producer option
``.with_schema("my_schema", SchemaType::String)``: here they run on the plain broker (TLS has its
own tests) and the producer names a registered string subject ``my_schema`` instead.
"""

import asyncio

from common import blob, consumer, fan_in, producer, recv, recv_n, stop
from schema_registry_basic import register_empty

from danube import SchemaType, SubType


async def _string_subject(client):
    await register_empty(client.schema(), "my_schema", SchemaType.STRING)
    return "my_schema"


async def _one_message(ctx, topic, p_name, c_name, sub, sub_type, schema=True, settle=0.5):
    client = await ctx.client()
    subject = await _string_subject(client) if schema else None
    p = await producer(client, topic, p_name, subject=subject)
    c = await consumer(client, topic, c_name, sub, sub_type)
    stream = await c.receive()
    await asyncio.sleep(settle)
    await p.send(b"Hello Danube", None)
    msg = await recv(stream, ctx.t(10), "the message (the test timed out waiting for it)")
    assert msg.payload.decode() == "Hello Danube"
    await c.ack(msg)


async def _partitioned(ctx, topic, p_name, c_name, sub, sub_type, schema=True):
    client = await ctx.client()
    subject = await _string_subject(client) if schema else None
    p = await producer(client, topic, p_name, subject=subject, partitions=3)
    c = await consumer(client, topic, c_name, sub, sub_type)
    stream = await c.receive()
    await asyncio.sleep(0.5)
    messages = ["Hello Danube 1", "Hello Danube 2", "Hello Danube 3"]
    for m in messages:
        await p.send(m.encode(), None)
    got = [m.payload.decode() for m in await recv_n(stream, 3, ctx.t(10))]
    assert len(got) == len(messages), "Not all messages were received"
    for expected in messages:
        assert expected in got, f"Expected message {expected!r} not found"


async def _reliable_blobs(ctx, topic, p_name, c_name, sub, sub_type, schema=True):
    client = await ctx.client()
    subject = await _string_subject(client) if schema else None
    p = await producer(client, topic, p_name, subject=subject, reliable=True)
    c = await consumer(client, topic, c_name, sub, sub_type)
    stream = await c.receive()
    await asyncio.sleep(0.5)
    data = blob()
    for _ in range(20):
        await p.send(data, None)
    for msg in await recv_n(stream, 20, ctx.t(10), c, "blobs"):
        assert msg.payload == data


# subscription_exclusive.rs / subscription_shared.rs (removed in a62487f)


async def test_subscription_exclusive__exclusive_subscription(ctx):
    await _one_message(
        ctx,
        ctx.unique_topic("/default/exclusive_subscription"),
        "producer_exclusive",
        "consumer_exclusive",
        "test_subscription_consumer_exclusive",
        SubType.EXCLUSIVE,
    )


async def test_subscription_shared__shared_subscription(ctx):
    await _one_message(
        ctx,
        ctx.unique_topic("/default/shared_subscription"),
        "producer_shared",
        "consumer_shared",
        "test_subscription_consumer_shared",
        SubType.SHARED,
    )


# partitioned_exclusive.rs / partitioned_shared.rs (removed in fa69384)


async def test_partitioned_exclusive__part_exclusive_subscription(ctx):
    await _partitioned(
        ctx,
        ctx.unique_topic("/default/part_exclusive_subsc"),
        "part_producer_exclusive",
        "part_consumer_exclusive",
        "test_subscription_part_consumer_exclusive",
        SubType.EXCLUSIVE,
    )


async def test_partitioned_shared__part_shared_subscription(ctx):
    await _partitioned(
        ctx,
        ctx.unique_topic("/default/part_shared_subsc"),
        "part_producer_shared",
        "part_consumer_shared",
        "test_subscription_part_consumer_shared",
        SubType.SHARED,
    )


# reliable_dispatch_exclusive.rs / reliable_dispatch_shared.rs (removed in fa69384)


async def test_reliable_dispatch_exclusive__reliable_exclusive_dispatch(ctx):
    await _reliable_blobs(
        ctx,
        ctx.unique_topic("/default/reliable_exclusive"),
        "producer_reliable_exclusive",
        "consumer_reliable_exclusive",
        "reliable_subscription_consumer_reliable_exclusive",
        SubType.EXCLUSIVE,
    )


async def test_reliable_dispatch_shared__reliable_shared_dispatch(ctx):
    await _reliable_blobs(
        ctx,
        ctx.unique_topic("/default/reliable_shared"),
        "producer_reliable_shared",
        "consumer_reliable_shared",
        "reliable_subscription_consumer_reliable_shared",
        SubType.SHARED,
    )


# non_partitioned_topic_test.rs, partitioned_topic_test.rs, reliable_dispatch_topic_test.rs (removed in 540d7ac)


async def test_non_partitioned_topic_test__test_exclusive_subscription(ctx):
    await _one_message(
        ctx,
        "/default/topic_test_exclusive_subscription",
        "test_producer_exclusive",
        "test_consumer_exclusive",
        "test_subscription_test_consumer_exclusive",
        SubType.EXCLUSIVE,
    )


async def test_non_partitioned_topic_test__test_shared_subscription(ctx):
    await _one_message(
        ctx,
        "/default/topic_test_shared_subscription",
        "test_producer_shared",
        "test_consumer_shared",
        "test_subscription_test_consumer_shared",
        SubType.SHARED,
    )


async def test_partitioned_topic_test__test_exclusive_subscription(ctx):
    await _partitioned(
        ctx,
        "/default/topic_exclusive_subsc",
        "producer_exclusive",
        "consumer_exclusive",
        "test_subscription_consumer_exclusive",
        SubType.EXCLUSIVE,
    )


async def test_partitioned_topic_test__test_shared_subscription(ctx):
    await _partitioned(
        ctx,
        "/default/topic_shared_subsc",
        "producer_shared",
        "consumer_shared",
        "test_subscription_consumer_shared",
        SubType.SHARED,
    )


async def test_reliable_dispatch_topic_test__test_reliable_exclusive_delivery(ctx):
    await _reliable_blobs(
        ctx,
        "/default/topic_test_reliable_exclusive",
        "test_producer_reliable_exclusive",
        "test_consumer_reliable_exclusive",
        "reliable_subscription_test_consumer_reliable_exclusive",
        SubType.EXCLUSIVE,
        schema=False,
    )


async def test_reliable_dispatch_topic_test__test_reliable_shared_delivery(ctx):
    await _reliable_blobs(
        ctx,
        "/default/topic_test_reliable_shared",
        "test_producer_reliable_shared",
        "test_consumer_reliable_shared",
        "reliable_subscription_test_consumer_reliable_shared",
        SubType.SHARED,
        schema=False,
    )


# reliable_shared_redelivery.rs (ignored upstream, removed in f9065a6)


async def test_reliable_shared_redelivery__reliable_shared_redelivery_to_other_consumer(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_shared_redelivery")
    subject = await _string_subject(client)
    p = await producer(client, topic, "producer_reliable_shared_redelivery", subject=subject, reliable=True)
    sub = "reliable-shared-sub"
    c1 = await consumer(client, topic, "c1", sub, SubType.SHARED)
    s1 = await c1.receive()
    await asyncio.sleep(0.4)
    total = 24
    for i in range(total):
        await p.send(f"p{i}".encode(), None)
    skipped = set()
    seen = 0

    async def phase1():
        nonlocal seen
        while seen < total:
            msg = await s1.get()
            if seen % 3 == 0:
                skipped.add(msg.payload.decode())  # not acked
            else:
                await c1.ack(msg)
            seen += 1

    try:
        await asyncio.wait_for(phase1(), 3.0)  # Danube's test gives c1 3 s, whatever it got
    except asyncio.TimeoutError:
        pass
    await c1.close()
    await asyncio.sleep(0.3)
    c2 = await consumer(client, topic, "c2", sub, SubType.SHARED)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = fan_in([("c2", c2, await c2.receive())], sink)
    redelivered = set()

    async def phase2():
        events = 0
        while events < total * 3 and len(redelivered) < max(0, len(skipped) - 1):
            _, msg = await sink.get()
            if msg.payload.decode() in skipped:
                redelivered.add(msg.payload.decode())
            events += 1

    try:
        await asyncio.wait_for(phase2(), ctx.t(30))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout waiting for redelivery after c2 join: {len(redelivered)} of {len(skipped)}")
    finally:
        stop(tasks)
    assert skipped, "expected some messages to be skipped by c1"
    assert redelivered, "expected some skipped messages to be redelivered to c2"

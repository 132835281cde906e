"""danube-broker/tests/partitioned_variants.rs: a 3-partition topic as a shared queue and as exclusive fan-out."""

import asyncio

from common import consumer, fan_in, producer, stop

from danube import SubType


async def _setup(ctx, prefix, p_name, c_prefix, sub_of, sub_type):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, p_name, partitions=3)
    named = []
    for i in range(3):
        c = await consumer(client, topic, f"{c_prefix}-cons-{i}", sub_of(i), sub_type)
        named.append((f"{c_prefix}-cons-{i}", c, await c.receive()))
    await asyncio.sleep(0.5)
    sink: asyncio.Queue = asyncio.Queue()
    return topic, p, sink, fan_in(named, sink)


async def test_partitioned_queue_shared_distribution_and_partition_coverage(ctx):
    topic, p, sink, tasks = await _setup(
        ctx,
        "/default/part_queue_shared",
        "producer_part_queue_shared",
        "pq",
        lambda i: "part-queue-shared-sub",
        SubType.SHARED,
    )
    total = 60
    for i in range(total):
        await p.send(f"pm{i}".encode(), None)
    counts: dict = {}
    parts = set()

    async def collect():
        for _ in range(total):
            name, msg = await sink.get()
            counts[name] = counts.get(name, 0) + 1
            parts.add(msg.msg_id.topic_name)

    try:
        await asyncio.wait_for(collect(), ctx.t(20))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving partitioned queue messages: {counts}")
    finally:
        stop(tasks)
    for i in range(3):
        assert f"{topic}-part-{i}" in parts, f"missing partition {topic}-part-{i}"
    expected = total // 3
    tolerance = max(2, expected // 5)
    for i in range(3):
        got = counts.get(f"pq-cons-{i}", 0)
        assert abs(got - expected) <= tolerance, (
            f"pq-cons-{i} should receive near-equal share: got {got}, expected ~{expected} (+/-{tolerance}): {counts}"
        )


async def test_partitioned_pubsub_fanout_exclusive_full_receipt(ctx):
    topic, p, sink, tasks = await _setup(
        ctx,
        "/default/part_fanout_excl",
        "producer_part_fanout_excl",
        "pfe",
        lambda i: f"pfe-sub-{i}",
        SubType.EXCLUSIVE,
    )
    total = 45
    expected = [f"pm{i}" for i in range(total)]
    for body in expected:
        await p.send(body.encode(), None)
    per: dict = {}
    parts = set()
    done = 0

    async def collect():
        nonlocal done
        while done < 3:
            name, msg = await sink.get()
            parts.add(msg.msg_id.topic_name)
            got = per.setdefault(name, set())
            got.add(msg.payload.decode())
            if len(got) == total:
                done += 1

    try:
        await asyncio.wait_for(collect(), ctx.t(25))
    except asyncio.TimeoutError:
        raise AssertionError(
            f"timeout receiving partitioned fanout messages: { ({k: len(v) for k, v in per.items()}) }"
        )
    finally:
        stop(tasks)
    for i in range(3):
        assert f"{topic}-part-{i}" in parts, f"missing partition {topic}-part-{i}"
    for i in range(3):
        got = per.get(f"pfe-cons-{i}", set())
        assert len(got) == total, f"pfe-cons-{i} should receive all messages"
        for body in expected:
            assert body in got, f"pfe-cons-{i} missing {body}"

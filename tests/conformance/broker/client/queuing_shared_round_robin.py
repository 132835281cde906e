"""danube-broker/tests/queuing_shared_round_robin.rs: three shared consumers get equal shares."""

import asyncio

from common import consumer, fan_in, producer, stop

from danube import SubType


async def test_queue_shared_round_robin_distribution(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/queue_shared")
    p = await producer(client, topic, "producer_queue_shared")
    named = []
    for i in range(3):
        c = await consumer(client, topic, f"queue-cons-{i}", "queue-shared-sub", SubType.SHARED)
        named.append((f"queue-cons-{i}", c, await c.receive()))
    await asyncio.sleep(0.4)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = fan_in(named, sink)
    total = 36
    for i in range(total):
        await p.send(f"m{i}".encode(), None)
    counts: dict = {}

    async def collect():
        for _ in range(total):
            name, _msg = await sink.get()
            counts[name] = counts.get(name, 0) + 1

    try:
        await asyncio.wait_for(collect(), ctx.t(15))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving queue messages: {counts}")
    finally:
        stop(tasks)
    for i in range(3):
        assert counts.get(f"queue-cons-{i}", 0) == total // 3, f"queue-cons-{i} should receive equal share: {counts}"

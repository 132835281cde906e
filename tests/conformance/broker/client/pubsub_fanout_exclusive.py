"""danube-broker/tests/pubsub_fanout_exclusive.rs: three exclusive subscriptions each get every message."""

import asyncio

from common import consumer, fan_in, producer, stop

from danube import SubType


async def test_pubsub_fanout_exclusive_unique_subscriptions(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/fanout_exclusive")
    p = await producer(client, topic, "producer_fanout_exclusive")
    named = []
    for i in range(3):
        c = await consumer(client, topic, f"fanout-cons-{i}", f"fanout-sub-{i}", SubType.EXCLUSIVE)
        named.append((f"fanout-cons-{i}", c, await c.receive()))
    await asyncio.sleep(0.4)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = fan_in(named, sink)
    total = 24
    expected = [f"m{i}" for i in range(total)]
    for body in expected:
        await p.send(body.encode(), None)
    per_consumer: dict = {}
    done = 0

    async def collect():
        nonlocal done
        while done < 3:
            name, msg = await sink.get()
            got = per_consumer.setdefault(name, [])
            got.append(msg.payload.decode())
            if len(got) == total:
                done += 1

    try:
        await asyncio.wait_for(collect(), ctx.t(20))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving fan-out messages: { ({k: len(v) for k, v in per_consumer.items()}) }")
    finally:
        stop(tasks)
    for i in range(3):
        got = per_consumer.get(f"fanout-cons-{i}", [])
        assert len(got) == total, f"fanout-cons-{i} should receive all messages"
        for body in expected:
            assert body in got, f"fanout-cons-{i} missing message {body}"

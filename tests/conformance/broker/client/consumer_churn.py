"""danube-broker/tests/consumer_churn.rs: a consumer joining while messages flow (shared and exclusive)."""

import asyncio

from common import consumer, fan_in, producer, stop

from danube import SubType


async def _churn(ctx, prefix, p_name, c_prefix, sub_of, sub_type, pause_b):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, p_name)
    named = []
    for i in range(2):
        c = await consumer(client, topic, f"{c_prefix}-cons-{i}", sub_of(i), sub_type)
        named.append((f"{c_prefix}-cons-{i}", c, await c.receive()))
    await asyncio.sleep(0.3)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = fan_in(named, sink)
    for i in range(15):
        await p.send(f"m{i}".encode(), None)
        await asyncio.sleep(0.01)
    c3 = await consumer(client, topic, f"{c_prefix}-cons-2", sub_of(2), sub_type)
    tasks += fan_in([(f"{c_prefix}-cons-2", c3, await c3.receive())], sink)
    for i in range(15, 30):
        await p.send(f"m{i}".encode(), None)
        await asyncio.sleep(pause_b)
    for i in range(30, 45):
        await p.send(f"m{i}".encode(), None)
    return sink, tasks


async def test_churn_shared_queue_join_leave(ctx):
    sink, tasks = await _churn(
        ctx, "/default/churn_shared", "prod_churn_shared", "cs", lambda i: "churn-shared-sub", SubType.SHARED, 0.01
    )
    total = 45
    counts: dict = {}
    seen = set()

    async def collect():
        for _ in range(total):
            name, msg = await sink.get()
            counts[name] = counts.get(name, 0) + 1
            seen.add(msg.payload.decode())

    try:
        await asyncio.wait_for(collect(), ctx.t(25))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving churn shared messages: {counts}")
    finally:
        stop(tasks)
    assert len(seen) == total, "should see all unique messages exactly once"
    for name in ("cs-cons-0", "cs-cons-1", "cs-cons-2"):
        assert counts.get(name, 0) > 0, f"{name} should receive some messages: {counts}"


async def test_churn_exclusive_fanout_join_leave(ctx):
    sink, tasks = await _churn(
        ctx, "/default/churn_exclusive", "prod_churn_excl", "ce", lambda i: f"ce-sub-{i}", SubType.EXCLUSIVE, 0.005
    )
    total = 45
    per: dict = {}

    async def collect():
        while True:
            name, msg = await sink.get()
            per.setdefault(name, set()).add(msg.payload.decode())
            if (
                len(per.get("ce-cons-0", ())) == total
                and len(per.get("ce-cons-1", ())) == total
                and per.get("ce-cons-2")
            ):
                return

    try:
        await asyncio.wait_for(collect(), ctx.t(30))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving churn exclusive messages: { ({k: len(v) for k, v in per.items()}) }")
    finally:
        stop(tasks)
    assert len(per.get("ce-cons-0", ())) == total, "ce-cons-0 should receive all messages"
    assert len(per.get("ce-cons-1", ())) == total, "ce-cons-1 should receive all messages"
    assert per.get("ce-cons-2"), "ce-cons-2 should receive some messages after joining"

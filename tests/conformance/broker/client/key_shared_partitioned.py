"""danube-broker/tests/key_shared_partitioned.rs: key-shared over partitioned topics, and a consumer joining."""

import asyncio

from common import consumer, fan_in, producer, recv, stop
from key_shared_basic import spread_over_consumers

from danube import SubType


async def _members(ctx, topic, sub, names, sink):
    named = []
    for name in names:
        c = await consumer(await ctx.client(), topic, name, sub, SubType.KEY_SHARED)
        named.append((name, c, await c.receive()))
    return fan_in(named, sink)


async def _collect(ctx, sink, total, wait, what):
    got = []

    async def collect():
        while len(got) < total:
            name, msg = await sink.get()
            got.append((name, msg.payload.decode()))

    try:
        await asyncio.wait_for(collect(), ctx.t(wait))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving {what}: got {len(got)} of {total}")
    return got


def _one_consumer_per_key(got):
    key_to = {}
    for name, payload in got:
        key_to.setdefault(payload.rsplit("-", 1)[0], set()).add(name)
    for key, names in key_to.items():
        assert len(names) == 1, f"key {key!r} should be served by exactly 1 consumer, got {names}"
    return key_to


async def test_key_shared_partitioned_single_consumer(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/ks_part_single")
    p = await producer(client, topic, "prod_ks_part", partitions=3)
    c = await consumer(client, topic, "cons_ks_part", "ks_part_sub", SubType.KEY_SHARED)
    stream = await c.receive()
    await asyncio.sleep(0.4)
    keys = ["user-a", "user-b", "user-c", "user-d", "user-e"]
    for rnd in range(3):
        for key in keys:
            await p.send_with_key(f"{key}-{rnd}".encode(), None, key)
    received, parts = [], set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.t(15)
    while len(received) < 15:
        msg = await recv(stream, max(0.1, deadline - loop.time()), f"message {len(received) + 1} of 15")
        received.append(msg.payload.decode())
        parts.add(msg.msg_id.topic_name)
        await c.ack(msg)
    assert len(received) == 15, "should receive all messages"
    assert len(parts) >= 2, f"messages should span multiple partitions, got {parts}"


async def test_key_shared_partitioned_multi_consumer_affinity(ctx):
    await spread_over_consumers(lambda: _multi_consumer_affinity_once(ctx))


async def _multi_consumer_affinity_once(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/ks_part_multi")
    p = await producer(client, topic, "prod_ks_part_multi", partitions=3)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = await _members(ctx, topic, "ks_part_multi_sub", ["ks-part-cons-0", "ks-part-cons-1"], sink)
    await asyncio.sleep(0.5)
    keys = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    for rnd in range(3):
        for key in keys:
            await p.send_with_key(f"{key}-{rnd}".encode(), None, key)
    try:
        got = await _collect(ctx, sink, 18, 20, "partitioned multi-consumer messages")
    finally:
        stop(tasks)
    return _one_consumer_per_key(got), None


async def test_key_shared_consumer_churn_join(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/ks_churn_join")
    p = await producer(client, topic, "prod_ks_churn")
    sub = "ks_churn_join_sub"
    sink: asyncio.Queue = asyncio.Queue()
    tasks = await _members(ctx, topic, sub, ["ks-churn-cons-0", "ks-churn-cons-1"], sink)
    await asyncio.sleep(0.4)
    keys = ["k1", "k2", "k3", "k4", "k5", "k6"]
    for rnd in range(2):
        for key in keys:
            await p.send_with_key(f"{key}-t1-{rnd}".encode(), None, key)
        await asyncio.sleep(0.01)
    tasks += await _members(ctx, topic, sub, ["ks-churn-cons-2"], sink)
    await asyncio.sleep(0.3)
    for rnd in range(2):
        for key in keys:
            await p.send_with_key(f"{key}-t2-{rnd}".encode(), None, key)
        await asyncio.sleep(0.01)
    total = len(keys) * 4
    try:
        got = await _collect(ctx, sink, total, 20, "churn key-shared messages")
    finally:
        stop(tasks)
    seen = {payload for _, payload in got}
    assert len(seen) == total, f"all unique messages should be received, got {len(seen)}"
    counts: dict = {}
    for name, _ in got:
        counts[name] = counts.get(name, 0) + 1
    assert len(counts) >= 2, f"at least 2 consumers should have received messages, got {counts}"


async def test_key_shared_reliable_partitioned(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/ks_rel_part")
    p = await producer(client, topic, "prod_ks_rel_part", partitions=2, reliable=True)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = await _members(ctx, topic, "ks_rel_part_sub", ["ks-rp-cons-0", "ks-rp-cons-1"], sink)
    await asyncio.sleep(0.5)
    keys = ["acc-100", "acc-200", "acc-300", "acc-400"]
    for rnd in range(4):
        for key in keys:
            await p.send_with_key(f"{key}-{rnd}".encode(), None, key)
    try:
        got = await _collect(ctx, sink, 16, 25, "reliable partitioned key-shared messages")
    finally:
        stop(tasks)
    _one_consumer_per_key(got)

"""danube-broker/tests/reliable_dispatch_basic.rs: 20 blobs of 100 KiB through a reliable topic."""

import asyncio

from common import blob, consumer, producer, recv

from danube import SubType

NAMES = {SubType.EXCLUSIVE: "cons_rel_exclusive", SubType.SHARED: "cons_rel_shared"}


async def _reliable_basic(ctx, prefix, sub_type):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, "producer_reliable_basic", reliable=True)
    name = NAMES[sub_type]
    c = await consumer(client, topic, name, f"rel_sub_{name}", sub_type)
    stream = await c.receive()
    await asyncio.sleep(0.4)
    data = blob()
    for _ in range(20):
        await p.send(data, None)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.t(15)
    for i in range(20):
        msg = await recv(stream, max(0.1, deadline - loop.time()), f"message {i + 1} of 20")
        assert msg.payload == data
        await c.ack(msg)


async def test_reliable_basic_exclusive(ctx):
    await _reliable_basic(ctx, "/default/reliable_basic_exclusive", SubType.EXCLUSIVE)


async def test_reliable_basic_shared(ctx):
    await _reliable_basic(ctx, "/default/reliable_basic_shared", SubType.SHARED)

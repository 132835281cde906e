"""danube-broker/tests/subscription_basic.rs: one message through a shared and an exclusive subscription."""

import asyncio

from common import consumer, producer, recv

from danube import SubType

NAMES = {SubType.EXCLUSIVE: "consumer_exclusive", SubType.SHARED: "consumer_shared"}


async def _basic(ctx, prefix, sub_type):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, "producer_basic")
    name = NAMES[sub_type]
    c = await consumer(client, topic, name, f"test_subscription_{name}", sub_type)
    stream = await c.receive()
    await asyncio.sleep(0.3)
    await p.send(b"Hello Danube", None)
    msg = await recv(stream, ctx.t(10), "the message")
    assert msg.payload.decode() == "Hello Danube"
    await c.ack(msg)


async def test_basic_subscription_shared(ctx):
    await _basic(ctx, "/default/sub_basic_shared", SubType.SHARED)


async def test_basic_subscription_exclusive(ctx):
    await _basic(ctx, "/default/sub_basic_exclusive", SubType.EXCLUSIVE)

"""danube-broker/tests/producer_reconnect.rs: a second create with the same producer name leaves the first working."""

import asyncio

from common import producer


async def test_producer_reconnection_reuse(ctx):
    client = await ctx.client()
    topic = "/default/producer_reconnect_reuse"
    p1 = await producer(client, topic, "producer_reconn_reuse")
    await asyncio.sleep(0.2)
    await p1.send(b"Hello Danube", None)
    try:  # Danube's test ignores the second create's outcome
        await producer(client, topic, "producer_reconn_reuse")
    except Exception:  # noqa: BLE001
        pass
    await p1.send(b"Hello again", None)

"""danube-broker/tests/reliable_dispatch_heartbeat.rs: bursts, a subscription racing a producer, a consumer
leaving with a message unacked, pauses between bursts — every message still arrives (in order where
the subscription promises it)."""

import asyncio

from common import consumer, producer, recv, recv_n

from danube import SubType


async def _pair(ctx, prefix, suffix, settle=0.2):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, f"producer_{suffix}", reliable=True)
    c = await consumer(client, topic, f"consumer_{suffix}", f"sub_{suffix}", SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(settle)
    return client, topic, p, c, stream


async def test_notification_coalescing_recovery(ctx):
    _, _, p, c, stream = await _pair(ctx, "/default/heartbeat_coalescing", "coalescing")
    payloads = [f"coalesce_msg_{i}" for i in range(100)]
    for body in payloads:
        await p.send(body.encode(), None)
    got = [m.payload.decode() for m in await recv_n(stream, 100, ctx.t(20), c, "coalesced burst")]
    assert len(got) == 100, "Should receive all 100 messages despite notification coalescing"
    for i, body in enumerate(got):
        assert body == payloads[i], f"Message {i} should match expected payload: {body}"


async def test_subscription_creation_race_condition(ctx):
    _, _, p, c, stream = await _pair(ctx, "/default/heartbeat_race", "race", settle=0.1)
    for i in range(50):
        await p.send(f"race_msg_{i}".encode(), None)
        if i % 10 == 0:
            await asyncio.sleep(0.001)
    got = [int(m.payload.decode().removeprefix("race_msg_")) for m in await recv_n(stream, 50, ctx.t(15), c)]
    assert len(got) == 50, "Should receive all 50 messages"
    for i in range(50):
        assert got[i] == i, f"Message {i} should be at position {i}: {got}"


async def test_consumer_disconnect_during_notification(ctx):
    client, topic, p, c, stream = await _pair(ctx, "/default/heartbeat_disconnect", "disconnect")
    for i in range(3):
        await p.send(f"disconnect_msg_{i}".encode(), None)
    for i in range(3):
        msg = await recv(stream, ctx.t(5), f"message {i}")
        assert msg.payload.decode() == f"disconnect_msg_{i}"
        await c.ack(msg)
    await p.send(b"disconnect_msg_3", None)
    pending = await recv(stream, ctx.t(5), "message 3")
    assert pending.payload.decode() == "disconnect_msg_3"
    await c.close()  # not acked
    await asyncio.sleep(0.3)
    c2 = await consumer(client, topic, "consumer_disconnect", "sub_disconnect", SubType.EXCLUSIVE)
    stream2 = await c2.receive()
    await asyncio.sleep(0.2)
    again = await recv(stream2, ctx.t(10), "the pending message again")
    assert again.payload.decode() == "disconnect_msg_3", f"Should redeliver unacked message #3: {again.payload}"
    await c2.ack(again)
    for i in range(4, 7):
        await p.send(f"disconnect_msg_{i}".encode(), None)
    for i in range(4, 7):
        msg = await recv(stream2, ctx.t(5), f"message {i}")
        assert msg.payload.decode() == f"disconnect_msg_{i}"
        await c2.ack(msg)


async def test_poll_next_returns_none_recovery(ctx):
    _, _, p, c, stream = await _pair(ctx, "/default/heartbeat_poll_none", "poll_none")
    for burst in range(3):
        for i in range(10):
            await p.send(f"poll_none_msg_{burst * 10 + i}".encode(), None)
        await asyncio.sleep(0.8)
    got = [m.payload.decode() for m in await recv_n(stream, 30, ctx.t(20), c)]
    assert len(got) == 30, "Should receive all 30 messages despite storage lags"
    for i in range(30):
        assert f"poll_none_msg_{i}" in got, f"Should receive message {i}"

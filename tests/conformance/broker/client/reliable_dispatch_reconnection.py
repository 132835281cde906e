"""danube-broker/tests/reliable_dispatch_reconnection.rs: what a consumer left unacked comes back after it
reconnects (exclusive), or goes to the other consumer (shared)."""

import asyncio

from common import consumer, fan_in, producer, recv, stop

from danube import SubType


async def test_reliable_exclusive_reconnection_resends_pending_message(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_exclusive_reconnect")
    p = await producer(client, topic, "producer_exclusive_reconnect", reliable=True)
    payloads = [f"msg_{i}" for i in range(10)]
    name, sub = "cons_exclusive_reconnect", "sub_exclusive_reconnect"
    c = await consumer(client, topic, name, sub, SubType.EXCLUSIVE)
    stream = await c.receive()
    for body in payloads:
        await p.send(body.encode(), None)
    for i in range(3):
        msg = await recv(stream, ctx.t(5), f"message {i}")
        assert msg.payload.decode() == payloads[i], f"Message {i} should match"
        await c.ack(msg)
    pending = await recv(stream, ctx.t(5), "the pending message")
    assert pending.payload.decode() == payloads[3], "Pending message should be msg_3"
    await c.close()
    await asyncio.sleep(0.3)
    c2 = await consumer(client, topic, name, sub, SubType.EXCLUSIVE)
    stream2 = await c2.receive()
    again = await recv(stream2, ctx.t(5), "the redelivered message")
    assert again.payload.decode() == payloads[3], (
        f"Redelivered message should be msg_3 (the unacked message), got {again.payload!r}"
    )
    await c2.ack(again)
    for i in range(4, 10):
        msg = await recv(stream2, ctx.t(5), f"message {i}")
        assert msg.payload.decode() == payloads[i], f"Message {i} should match"
        await c2.ack(msg)


async def test_reliable_shared_reconnection_failover_to_another_consumer(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_shared_reconnect")
    p = await producer(client, topic, "producer_shared_reconnect", reliable=True)
    sub = "sub_shared_reconnect"
    c1 = await consumer(client, topic, "c1_shared_reconnect", sub, SubType.SHARED)
    s1 = await c1.receive()
    c2 = await consumer(client, topic, "c2_shared_reconnect", sub, SubType.SHARED)
    s2 = await c2.receive()
    await asyncio.sleep(0.4)
    payloads = [f"msg_{i}" for i in range(10)]
    for body in payloads:
        await p.send(body.encode(), None)
    members = {"c1": c1, "c2": c2}
    sink: asyncio.Queue = asyncio.Queue()
    pumps = dict(zip(("c1", "c2"), fan_in([("c1", c1, s1), ("c2", c2, s2)], sink, ack=False)))
    received = {"c1": [], "c2": []}
    try:
        for i in range(3):
            who, msg = await recv(sink, ctx.t(5), f"message {i + 1}")
            received[who].append(msg.payload.decode())
            await members[who].ack(msg)
        who, msg = await recv(sink, ctx.t(5), "a fourth message")
        pending = msg.payload.decode()
        survivor = "c2" if who == "c1" else "c1"
        pumps[who].cancel()
        await members[who].close()  # leaves its message unacked
        await asyncio.sleep(0.3)
        while True:  # the survivor drains everything, the unacked message among it
            try:
                got_by, msg = await asyncio.wait_for(sink.get(), 5.0)  # Danube's drain: until 5 s of silence
            except asyncio.TimeoutError:
                break
            if got_by != survivor:
                continue  # delivered to the closed consumer before it left: unacked, comes back
            received[survivor].append(msg.payload.decode())
            await members[survivor].ack(msg)
    finally:
        stop(pumps.values())
    everything = received["c1"] + received["c2"]
    assert pending in everything, f"the surviving consumer must receive the unacked message {pending!r}: {everything}"
    assert len(everything) == 10, f"Should have received all 10 messages: {sorted(everything)}"


async def test_reliable_multiple_reconnections_same_message(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_multi_reconnect")
    p = await producer(client, topic, "producer_multi_reconnect", reliable=True)
    payloads = [f"msg_{i}" for i in range(5)]
    name, sub = "cons_multi_reconnect", "sub_multi_reconnect"
    c = await consumer(client, topic, name, sub, SubType.EXCLUSIVE)
    stream = await c.receive()
    for body in payloads:
        await p.send(body.encode(), None)
    msg0 = await recv(stream, ctx.t(5), "msg0")
    assert msg0.payload.decode() == payloads[0]
    await c.ack(msg0)
    msg1 = await recv(stream, ctx.t(5), "msg1")
    assert msg1.payload.decode() == payloads[1]
    for cycle in (1, 2):
        await c.close()
        await asyncio.sleep(0.3)
        c = await consumer(client, topic, name, sub, SubType.EXCLUSIVE)
        stream = await c.receive()
        again = await recv(stream, ctx.t(5), f"redelivery {cycle}")
        assert again.payload.decode() == payloads[1], (
            f"reconnection {cycle} should redeliver msg_1, got {again.payload!r}"
        )
    await c.ack(again)
    msg2 = await recv(stream, ctx.t(5), "msg2")
    assert msg2.payload.decode() == payloads[2], "After acking msg_1, should receive msg_2"
    await c.ack(msg2)

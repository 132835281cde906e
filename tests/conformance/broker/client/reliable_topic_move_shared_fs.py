"""danube-broker/tests/reliable_topic_move_shared_fs.rs: a reliable topic unloaded from its broker
moves to another one of a shared-fs cluster; offsets continue and what was unacked comes back."""

import asyncio

from common import blob, consumer, producer, recv, recv_n

from danube import SubType


async def wait_for_assignment(ctx, topic, previous=None):
    """Danube's helper: until a broker lists the topic (another one than ``previous``), 45 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.t(45)
    last_error = None
    while True:
        try:
            found = await ctx.admin.find_topic_assignment(topic)
            if found and found["broker_id"] and found["broker_id"] != previous:
                return found
        except Exception as exc:  # noqa: BLE001 - kept for the timeout message, as Danube's
            last_error = exc
        if loop.time() >= deadline:
            raise AssertionError(
                f"timed out waiting for topic assignment change for {topic} "
                f"(previous broker: {previous}, last admin error: {last_error!r})"
            )
        await asyncio.sleep(1)


async def _move(ctx, topic, original, c, p):
    await c.close()
    await p.close()
    await asyncio.sleep(0.5)
    await ctx.admin.unload_topic(topic)
    moved = await wait_for_assignment(ctx, topic, original["broker_id"])
    assert moved["broker_id"] != original["broker_id"]
    assert moved["delivery"] == original["delivery"]


async def test_reliable_topic_move_shared_fs_continues_offsets(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_move_shared_fs")
    subscription = "sub-" + topic.replace("/", "-")
    data = blob()
    p = await producer(client, topic, "producer_topic_move_shared_fs", reliable=True)
    c = await consumer(client, topic, "consumer_topic_move_shared_fs", subscription, SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(0.5)
    for _ in range(10):
        await p.send(data, None)
    original = await wait_for_assignment(ctx, topic)
    assert original["delivery"]
    for msg in await recv_n(stream, 5, ctx.t(15), c, "messages before unload"):
        assert msg.payload == data, "payload mismatch before unload"
    await _move(ctx, topic, original, c, p)
    p2 = await producer(client, topic, "producer_topic_move_shared_fs_after_move", reliable=True)
    await asyncio.sleep(0.5)
    for _ in range(10, 18):
        await p2.send(data, None)
    c2 = await consumer(client, topic, "consumer_topic_move_shared_fs_after_move", subscription, SubType.EXCLUSIVE)
    stream2 = await c2.receive()
    await asyncio.sleep(0.5)
    offsets = []
    for msg in await recv_n(stream2, 13, ctx.t(20), c2, "messages after move"):
        assert msg.payload == data, "payload mismatch after move"
        offsets.append(msg.msg_id.topic_offset)
    assert offsets == list(range(5, 18)), f"unexpected offset sequence {offsets}"


async def test_reliable_topic_move_shared_fs_redelivers_unacked_message(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_move_pending_shared_fs")
    subscription = "sub-" + topic.replace("/", "-")
    payloads = [f"msg_{i}".encode() for i in range(15)]
    p = await producer(client, topic, "producer_topic_move_pending_shared_fs", reliable=True)
    name = "consumer_topic_move_pending_shared_fs"
    c = await consumer(client, topic, name, subscription, SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(0.5)
    for payload in payloads[:10]:
        await p.send(payload, None)
    original = await wait_for_assignment(ctx, topic)
    assert original["delivery"]
    for expected_offset in range(3):
        msg = await recv(stream, ctx.t(10), "an acknowledged message before move")
        assert msg.msg_id.topic_offset == expected_offset
        assert msg.payload == payloads[expected_offset]
        await c.ack(msg)
    pending = await recv(stream, ctx.t(10), "the pending message before move")
    assert pending.msg_id.topic_offset == 3
    assert pending.payload == payloads[3]
    await _move(ctx, topic, original, c, p)
    p2 = await producer(client, topic, "producer_topic_move_pending_shared_fs_after_move", reliable=True)
    await asyncio.sleep(0.5)
    for payload in payloads[10:]:
        await p2.send(payload, None)
    c2 = await consumer(client, topic, name, subscription, SubType.EXCLUSIVE)
    stream2 = await c2.receive()
    again = await recv(stream2, ctx.t(15), "the redelivered pending message after move")
    assert again.msg_id.topic_offset == 3
    assert again.payload == payloads[3]
    await c2.ack(again)
    rest = await recv_n(stream2, 11, ctx.t(20), c2, "remaining messages after move")
    assert [m.msg_id.topic_offset for m in rest] == list(range(4, 15))
    assert [m.payload for m in rest] == payloads[4:15]


async def test_reliable_topic_move__test_reliable_topic_move_with_offset_continuity(ctx):
    """reliable_topic_move.rs (ignored upstream, deleted in 7cbea0d), from its last version: unload,
    a fixed 4 s pause, then offsets continue with no gap."""
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_move")
    data = blob()
    p = await producer(client, topic, "producer_topic_move", reliable=True)
    c = await consumer(client, topic, "consumer_topic_move", "sub_topic_move", SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(0.5)
    for _ in range(10):
        await p.send(data, None)
    await asyncio.sleep(0.3)
    for i, msg in enumerate(await recv_n(stream, 5, ctx.t(10), c, "the first batch")):
        assert msg.payload == data, f"Payload mismatch for message {i}"
    await c.close()
    await p.close()
    await asyncio.sleep(0.5)
    await ctx.admin.unload_topic(topic)
    await asyncio.sleep(4)
    p2 = await producer(client, topic, "producer_topic_move_2", reliable=True)
    await asyncio.sleep(0.5)
    for _ in range(10, 18):
        await p2.send(data, None)
    await asyncio.sleep(0.5)
    c2 = await consumer(client, topic, "consumer_topic_move_2", "sub_topic_move", SubType.EXCLUSIVE)
    stream2 = await c2.receive()
    await asyncio.sleep(0.5)
    offsets = []
    for msg in await recv_n(stream2, 13, ctx.t(15), c2, "the rest after the move"):
        assert msg.payload == data, "Payload mismatch for message"
        offsets.append(msg.msg_id.topic_offset)
    assert offsets == list(range(5, 18)), f"Offset sequence broken: {offsets}"
    for prev, cur in zip(offsets, offsets[1:]):
        assert cur == prev + 1, f"Gap detected: offset {prev} followed by {cur}"

"""danube-broker/tests/reliable_dispatch_failure_handling.rs: nack, ack timeout and the poison
policies (block, drop, dead letter) on reliable subscriptions, set through Danube's admin API."""

import asyncio

from common import consumer, nothing_within, producer, recv
from danube_admin import failure_policy

from danube import SubType


async def _setup(ctx, prefix, subscription, policy, sub_type=SubType.EXCLUSIVE, suffix=""):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    await ctx.admin.create_topic(topic, "reliable")
    await ctx.admin.set_failure_policy(topic, subscription, policy)
    p = await producer(client, topic, f"producer_{suffix}", reliable=True)
    c = await consumer(client, topic, f"consumer_{suffix}", subscription, sub_type)
    stream = await c.receive()
    await asyncio.sleep(0.2)
    return client, topic, p, c, stream


async def _nack_redelivers(ctx, prefix, subscription, sub_type, suffix, payload, reason):
    _, _, p, c, stream = await _setup(ctx, prefix, subscription, failure_policy(2, 5_000, "block"), sub_type, suffix)
    await p.send(payload, None)
    first = await recv(stream, ctx.t(5), "first delivery")
    await c.nack(first, 0, reason)
    again = await recv(stream, ctx.t(5), "redelivery")
    assert again.payload == first.payload
    assert again.msg_id.topic_offset == first.msg_id.topic_offset
    await c.ack(again)


async def test_reliable_exclusive_nack_redelivers_same_message(ctx):
    await _nack_redelivers(
        ctx,
        "/default/reliable_failure_nack_exclusive",
        "sub_failure_nack_exclusive",
        SubType.EXCLUSIVE,
        "failure_nack_exclusive",
        b"nack-exclusive",
        "retry please",
    )


async def test_reliable_shared_nack_redelivers_same_message(ctx):
    await _nack_redelivers(
        ctx,
        "/default/reliable_failure_nack_shared",
        "sub_failure_nack_shared",
        SubType.SHARED,
        "failure_nack_shared",
        b"nack-shared",
        "retry shared",
    )


async def test_reliable_exclusive_ack_timeout_redelivers_same_message(ctx):
    _, _, p, c, stream = await _setup(
        ctx,
        "/default/reliable_failure_ack_timeout",
        "sub_failure_ack_timeout",
        failure_policy(2, 200, "block"),
        suffix="failure_ack_timeout",
    )
    await p.send(b"ack-timeout", None)
    first = await recv(stream, ctx.t(5), "first delivery")
    again = await recv(stream, ctx.t(10), "timeout-based redelivery")
    assert again.payload == first.payload
    assert again.msg_id.topic_offset == first.msg_id.topic_offset
    await c.ack(again)


async def test_reliable_retry_exhausted_block_prevents_progress(ctx):
    _, _, p, c, stream = await _setup(
        ctx,
        "/default/reliable_failure_block",
        "sub_failure_block",
        failure_policy(0, 5_000, "block"),
        suffix="failure_block",
    )
    await p.send(b"blocked-msg", None)
    first = await recv(stream, ctx.t(5), "first delivery")
    await c.nack(first, 0, "block it")
    await p.send(b"after-block", None)
    got = await nothing_within(stream, 2.0)
    assert got is None, f"blocked poison policy should stall progress, got {got.payload!r}"


async def test_reliable_retry_exhausted_drop_skips_poisoned_message(ctx):
    _, _, p, c, stream = await _setup(
        ctx,
        "/default/reliable_failure_drop",
        "sub_failure_drop",
        failure_policy(0, 5_000, "drop"),
        suffix="failure_drop",
    )
    await p.send(b"drop-me", None)
    first = await recv(stream, ctx.t(5), "first delivery")
    await c.nack(first, 0, "drop it")
    await asyncio.sleep(0.2)
    await p.send(b"after-drop", None)
    nxt = await recv(stream, ctx.t(5), "the next message after drop")
    assert nxt.payload == b"after-drop", nxt.payload
    await c.ack(nxt)


async def test_reliable_retry_exhausted_deadletter_routes_message_to_dlq(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/reliable_failure_deadletter")
    dlq_topic = f"{topic}-dlq"
    subscription = "sub_failure_deadletter"
    await ctx.admin.create_topic(topic, "reliable")
    await ctx.admin.create_topic(dlq_topic, "reliable")
    await ctx.admin.set_failure_policy(topic, subscription, failure_policy(0, 5_000, "dead_letter", dlq_topic))
    p = await producer(client, topic, "producer_failure_deadletter", reliable=True)
    c = await consumer(client, topic, "consumer_failure_deadletter", subscription)
    stream = await c.receive()
    dlq = await consumer(client, dlq_topic, "consumer_failure_deadletter_dlq", "sub_failure_deadletter_dlq")
    dlq_stream = await dlq.receive()
    await asyncio.sleep(0.2)
    await p.send(b"to-dlq", None)
    first = await recv(stream, ctx.t(5), "first delivery")
    await c.nack(first, 0, "dead-letter it")
    dead = await recv(dlq_stream, ctx.t(5), "the dead-lettered message")
    assert dead.payload == b"to-dlq"
    assert dead.msg_id.topic_name == dlq_topic
    assert dead.attributes.get("x-original-topic") == topic
    assert dead.attributes.get("x-original-subscription") == subscription
    assert dead.attributes.get("x-poison-policy") == "dead_letter"
    assert dead.attributes.get("x-failure-reason") == "dead-letter it"
    await asyncio.sleep(0.2)
    await p.send(b"after-dlq", None)
    nxt = await recv(stream, ctx.t(5), "progress after dlq routing")
    assert nxt.payload == b"after-dlq", nxt.payload
    await c.ack(nxt)

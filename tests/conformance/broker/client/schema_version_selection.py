"""danube-broker/tests/schema_version_selection.rs: pinned, minimum and latest schema versions."""

import asyncio
import json

from common import consumer, producer, recv
from schema_registry_basic import register

from danube import SubType


def obj(props: dict, required: list | None = None) -> bytes:
    doc = {"type": "object", "properties": props}
    if required is not None:
        doc["required"] = required
    return json.dumps(doc).encode()


INT, STR, BOOL = {"type": "integer"}, {"type": "string"}, {"type": "boolean"}


async def _consume_one(ctx, client, topic, p, c_name, sub, payload):
    c = await consumer(client, topic, c_name, sub, SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(0.2)
    await p.send(json.dumps(payload).encode(), None)
    message = await recv(stream, ctx.t(5), "the message")
    await c.ack(message)
    return message


async def test_producer_pin_to_specific_version(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/pin_version")
    subject = "version-pin-test"
    await register(client.schema(), subject, obj({"id": INT}, ["id"]))
    await register(client.schema(), subject, obj({"id": INT, "name": STR}, ["id"]))
    p = await producer(client, topic, "producer_v1_pinned", subject=subject, version=1)
    message = await _consume_one(ctx, client, topic, p, "consumer_version", "sub_version", {"id": 123})
    assert message.HasField("schema_version") and message.schema_version == 1, "Should use pinned version 1"


async def test_producer_minimum_version_uses_latest(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/min_version")
    subject = "min-version-test"
    await register(client.schema(), subject, obj({"id": INT}, ["id"]))
    await register(client.schema(), subject, obj({"id": INT, "name": STR}, ["id"]))
    await register(client.schema(), subject, obj({"id": INT, "name": STR, "active": BOOL}, ["id"]))
    p = await producer(client, topic, "producer_min_v2", subject=subject, min_version=2)
    message = await _consume_one(ctx, client, topic, p, "consumer_min", "sub_min", {"id": 456})
    assert message.schema_version >= 2, f"Should use version >= 2 (got {message.schema_version})"


async def test_multiple_producers_different_versions(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/multi_version")
    subject = "multi-version-subject"
    await register(client.schema(), subject, obj({"value": INT}, ["value"]))
    await register(client.schema(), subject, obj({"value": INT, "label": STR}, ["value"]))
    p1 = await producer(client, topic, "producer_v1", subject=subject, version=1)
    p2 = await producer(client, topic, "producer_v2", subject=subject, version=2)
    c = await consumer(client, topic, "consumer_both", "sub_both", SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(0.2)
    await p1.send(json.dumps({"value": 1}).encode(), None)
    await p2.send(json.dumps({"value": 2, "label": "test"}).encode(), None)
    msg1 = await recv(stream, ctx.t(5), "message 1")
    msg2 = await recv(stream, ctx.t(5), "message 2")
    versions = [msg1.schema_version, msg2.schema_version]
    assert 1 in versions, "Should have V1 message"
    assert 2 in versions, "Should have V2 message"
    await c.ack(msg1)
    await c.ack(msg2)


async def test_producer_invalid_version_fails(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/invalid_version")
    subject = "invalid-version-test"
    await register(client.schema(), subject, obj({"x": INT}))
    try:
        await producer(client, topic, "producer_invalid", subject=subject, version=99)
    except Exception:  # noqa: BLE001 - the refusal is the observation
        return
    raise AssertionError("Should fail with invalid version")


async def test_producer_no_version_uses_latest(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/latest_version")
    subject = "latest-version-test"
    await register(client.schema(), subject, obj({"a": STR}))
    await register(client.schema(), subject, obj({"a": STR, "b": INT}))
    p = await producer(client, topic, "producer_latest", subject=subject)
    message = await _consume_one(ctx, client, topic, p, "consumer_latest", "sub_latest", {"a": "test"})
    assert message.HasField("schema_version") and message.schema_version == 2, "Should use latest version (V2)"


async def test_producer_minimum_version_at_boundary(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/min_boundary")
    subject = "boundary-test"
    for i in (1, 2, 3):
        await register(client.schema(), subject, obj({"v": {"type": "integer", "const": i}}))
    p = await producer(client, topic, "producer_boundary", subject=subject, min_version=3)
    message = await _consume_one(ctx, client, topic, p, "consumer_boundary", "sub_boundary", {"v": 3})
    assert message.HasField("schema_version") and message.schema_version == 3, "Should use exactly V3"

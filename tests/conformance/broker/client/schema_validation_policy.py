"""danube-broker/tests/schema_validation_policy.rs: messages carry their schema end to end."""

import asyncio
import json

from common import consumer, producer, recv
from schema_registry_basic import register, register_empty

from danube import SchemaType, SubType


async def _pipe(ctx, topic_prefix, subject, p_name, c_name, sub):
    client = await ctx.client()
    topic = ctx.unique_topic(topic_prefix)
    p = await producer(client, topic, p_name, subject=subject)
    c = await consumer(client, topic, c_name, sub, SubType.EXCLUSIVE)
    stream = await c.receive()
    await asyncio.sleep(0.2)
    return client, topic, p, c, stream


async def test_matching_schemas_end_to_end(ctx):
    client = await ctx.client()
    schema_id = await register(
        client.schema(),
        "matching-schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"message": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["message", "count"],
            }
        ).encode(),
    )
    _, _, p, c, stream = await _pipe(
        ctx, "/default/matching_schemas", "matching-schema", "producer_matching", "consumer_matching", "sub_matching"
    )
    await p.send(json.dumps({"message": "hello", "count": 42}).encode(), None)
    message = await recv(stream, ctx.t(5), "the message")
    assert message.HasField("schema_id") and message.schema_id == schema_id
    data = json.loads(message.payload)
    assert data["message"] == "hello"
    assert data["count"] == 42
    await c.ack(message)


async def test_multiple_valid_payloads(ctx):
    client = await ctx.client()
    await register(
        client.schema(),
        "multi-type-schema",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "string_field": {"type": "string"},
                    "int_field": {"type": "integer"},
                    "bool_field": {"type": "boolean"},
                    "array_field": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["string_field", "int_field"],
            }
        ).encode(),
    )
    _, _, p, c, stream = await _pipe(
        ctx, "/default/multi_valid", "multi-type-schema", "producer_multi", "consumer_multi", "sub_multi"
    )
    payloads = [
        {"string_field": "test", "int_field": 1},
        {"string_field": "test2", "int_field": 2, "bool_field": True},
        {"string_field": "test3", "int_field": 3, "array_field": ["a", "b"]},
    ]
    for payload in payloads:
        await p.send(json.dumps(payload).encode(), None)
    for payload in payloads:
        msg = await recv(stream, ctx.t(5), "the next message")
        assert json.loads(msg.payload)["string_field"] == payload["string_field"]
        await c.ack(msg)


async def test_schema_evolution_consumer_compatibility(ctx):
    client = await ctx.client()
    schema = client.schema()
    topic = ctx.unique_topic("/default/evolution")
    subject = f"evolution-schema-{topic.split('-')[-1]}"
    await register(
        schema,
        subject,
        json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}).encode(),
    )
    p1 = await producer(client, topic, "producer_v1", subject=subject)
    c = await consumer(client, topic, "consumer_evolution", "sub_evolution")
    stream = await c.receive()
    await asyncio.sleep(0.2)
    await p1.send(json.dumps({"id": 1}).encode(), None)
    await register(
        schema,
        subject,
        json.dumps(
            {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["id"],
            }
        ).encode(),
    )
    p2 = await producer(client, topic, "producer_v2", subject=subject)
    await p2.send(json.dumps({"id": 2, "name": "test"}).encode(), None)
    msg1 = await recv(stream, ctx.t(5), "the V1 message")
    assert json.loads(msg1.payload)["id"] == 1
    assert msg1.HasField("schema_version") and msg1.schema_version == 1
    await c.ack(msg1)
    msg2 = await recv(stream, ctx.t(5), "the V2 message")
    data2 = json.loads(msg2.payload)
    assert data2["id"] == 2
    assert data2["name"] == "test"
    assert msg2.HasField("schema_version") and msg2.schema_version == 2
    await c.ack(msg2)


async def test_avro_schema_end_to_end(ctx):
    client = await ctx.client()
    schema_id = await register(
        client.schema(),
        "avro-user-schema",
        json.dumps(
            {
                "type": "record",
                "name": "User",
                "fields": [
                    {"name": "username", "type": "string"},
                    {"name": "age", "type": "int"},
                    {"name": "active", "type": "boolean"},
                ],
            }
        ).encode(),
        SchemaType.AVRO,
    )
    _, _, p, c, stream = await _pipe(
        ctx, "/default/avro_test", "avro-user-schema", "producer_avro", "consumer_avro", "sub_avro"
    )
    # (Danube's test sends the record as JSON: without payload validation the broker does not parse it)
    await p.send(json.dumps({"username": "alice", "age": 30, "active": True}).encode(), None)
    message = await recv(stream, ctx.t(5), "the message")
    assert message.HasField("schema_id") and message.schema_id == schema_id
    await c.ack(message)


async def test_string_schema_type(ctx):
    client = await ctx.client()
    schema_id = await register_empty(client.schema(), "log-messages", SchemaType.STRING)
    _, _, p, c, stream = await _pipe(
        ctx, "/default/string_schema", "log-messages", "producer_string", "consumer_string", "sub_string"
    )
    messages = ["INFO: Server started", "DEBUG: Connection established", "ERROR: Timeout"]
    for m in messages:
        await p.send(m.encode(), None)
    for expected in messages:
        msg = await recv(stream, ctx.t(5), "the next message")
        assert msg.payload.decode() == expected
        assert msg.HasField("schema_id") and msg.schema_id == schema_id
        await c.ack(msg)


async def test_bytes_schema_type(ctx):
    client = await ctx.client()
    schema_id = await register_empty(client.schema(), "binary-data", SchemaType.BYTES)
    _, _, p, c, stream = await _pipe(
        ctx, "/default/bytes_schema", "binary-data", "producer_bytes", "consumer_bytes", "sub_bytes"
    )
    binary = bytes([0x00, 0xFF, 0xAB, 0xCD, 0xEF])
    await p.send(binary, None)
    msg = await recv(stream, ctx.t(5), "the message")
    assert msg.payload == binary
    assert msg.HasField("schema_id") and msg.schema_id == schema_id
    await c.ack(msg)


async def test_verify_schema_metadata_in_messages(ctx):
    client = await ctx.client()
    schema = client.schema()
    schema_id = await register(
        schema, "metadata-schema", json.dumps({"type": "object", "properties": {"value": {"type": "number"}}}).encode()
    )
    _, _, p, c, stream = await _pipe(
        ctx, "/default/metadata_verify", "metadata-schema", "producer_metadata", "consumer_metadata", "sub_metadata"
    )
    await p.send(json.dumps({"value": 3.14}).encode(), None)
    msg = await recv(stream, ctx.t(5), "the message")
    assert msg.HasField("schema_id"), "Message should have schema_id"
    assert msg.schema_id == schema_id, "Schema ID should match"
    assert msg.HasField("schema_version"), "Message should have schema_version"
    assert msg.schema_version == 1, "Schema version should be 1"
    retrieved = await schema.get_latest_schema("metadata-schema")
    assert retrieved.schema_id == schema_id
    await c.ack(msg)


async def test_second_producer_different_subject_fails(ctx):
    client = await ctx.client()
    schema = client.schema()
    topic = ctx.unique_topic("/default/multi_schema")
    await register(
        schema,
        "event-schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"type": {"type": "string", "enum": ["event"]}, "data": {"type": "string"}},
            }
        ).encode(),
    )
    await register(
        schema,
        "metric-schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"type": {"type": "string", "enum": ["metric"]}, "value": {"type": "number"}},
            }
        ).encode(),
    )
    await producer(client, topic, "producer_events", subject="event-schema")
    try:
        await producer(client, topic, "producer_metrics", subject="metric-schema")
    except Exception as exc:  # noqa: BLE001 - the refusal is the observation
        message = str(exc)
        assert "event-schema" in message or "cannot use" in message, f"Error should mention schema mismatch: {message}"
    else:
        raise AssertionError("Second producer with different schema subject should fail")

"""danube-broker/tests/schema_registry_basic.rs: registering subjects and producing with them."""

import json

from common import consumer, producer, recv

from danube import SchemaType, SubType


async def register(schema, subject, data: bytes, schema_type=SchemaType.JSON_SCHEMA):
    return await schema.register_schema(subject).with_type(schema_type).with_schema_data(data).execute()


async def register_empty(schema, subject, schema_type):
    """What Danube's Rust client sends for ``.with_schema_data(b"")``; the Python client refuses
    empty schema data before sending, so the request goes through its registry stub."""
    from danube.proto import SchemaRegistry_pb2

    metadata, stub = await schema._prepare(schema._uri)
    resp = await stub.RegisterSchema(
        SchemaRegistry_pb2.RegisterSchemaRequest(
            subject=subject, schema_type=schema_type.as_string(), schema_definition=b"", created_by="danube-py"
        ),
        metadata=metadata,
    )
    return resp.schema_id


def props(**types) -> bytes:
    return json.dumps({"type": "object", "properties": {n: {"type": t} for n, t in types.items()}}).encode()


async def test_schema_registration_multiple_types(ctx):
    client = await ctx.client()
    schema = client.schema()
    json_id = await register(schema, "user-events-json", props(name="string", age="integer"))
    avro = {
        "type": "record",
        "name": "User",
        "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}],
    }
    avro_id = await register(schema, "user-events-avro", json.dumps(avro).encode(), SchemaType.AVRO)
    await register_empty(schema, "log-events-string", SchemaType.STRING)
    await register_empty(schema, "binary-events", SchemaType.BYTES)
    latest_json = await schema.get_latest_schema("user-events-json")
    assert latest_json.schema_id == json_id
    assert latest_json.version == 1
    latest_avro = await schema.get_latest_schema("user-events-avro")
    assert latest_avro.schema_id == avro_id


async def test_producer_with_registered_schema_succeeds(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/schema_registered")
    await register(client.schema(), "test-registered-schema", props(msg="string"))
    p = await producer(client, topic, "producer_registered", subject="test-registered-schema")
    await p.send(json.dumps({"msg": "hello"}).encode(), None)


async def test_producer_with_unregistered_schema_fails(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/schema_unregistered")
    try:
        await producer(client, topic, "producer_unregistered", subject="non-existent-schema")
    except Exception as exc:  # noqa: BLE001 - the refusal is the observation
        message = str(exc)
        assert "not found" in message or "validation failed" in message, (
            f"Error should mention schema not found: {message}"
        )
    else:
        raise AssertionError("Producer creation should fail with unregistered schema")


async def test_producer_without_schema_works(ctx):
    client = await ctx.client()
    p = await producer(client, ctx.unique_topic("/default/no_schema"), "producer_no_schema")
    await p.send(b"any bytes work", None)


async def test_schema_versioning_evolution(ctx):
    client = await ctx.client()
    schema = client.schema()
    subject = "versioned-schema-test"
    id_v1 = await register(schema, subject, props(name="string"))
    id_v2 = await register(schema, subject, props(name="string", email="string"))
    assert id_v1 == id_v2, "Same subject should have same schema_id"
    latest = await schema.get_latest_schema(subject)
    assert latest.schema_id == id_v1
    assert latest.version == 2, "Latest version should be 2"


async def test_consumer_receives_schema_metadata(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/schema_metadata")
    schema_id = await register(client.schema(), "metadata-test-schema", props(data="string"))
    p = await producer(client, topic, "producer_metadata", subject="metadata-test-schema")
    c = await consumer(client, topic, "consumer_metadata", "sub_metadata", SubType.EXCLUSIVE)
    stream = await c.receive()
    await p.send(json.dumps({"data": "test"}).encode(), None)
    message = await recv(stream, ctx.t(5), "the message")
    assert message.HasField("schema_id"), "Message should have schema_id"
    assert message.schema_id == schema_id, "Schema ID should match"
    assert message.HasField("schema_version"), "Message should have schema_version"
    assert message.schema_version == 1, "Schema version should be 1"
    await c.ack(message)


async def test_multiple_producers_same_schema(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/multi_prod_schema")
    await register(client.schema(), "shared-schema", props(value="integer"))
    p1 = await producer(client, topic, "producer1_shared", subject="shared-schema")
    p2 = await producer(client, topic, "producer2_shared", subject="shared-schema")
    await p1.send(json.dumps({"value": 1}).encode(), None)
    await p2.send(json.dumps({"value": 2}).encode(), None)

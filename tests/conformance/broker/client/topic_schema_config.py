"""danube-broker/tests/topic_schema_config.rs: the first producer gives a topic its subject."""

import json

from common import producer
from schema_registry_basic import register


def obj(props: dict) -> bytes:
    return json.dumps({"type": "object", "properties": props}).encode()


async def _creates(client, topic, name, **schema) -> bool:
    try:
        await producer(client, topic, name, **schema)
        return True
    except Exception:  # noqa: BLE001 - the refusal is the observation
        return False


async def test_first_producer_assigns_schema(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/first_producer")
    await register(client.schema(), "first-schema", obj({"msg": {"type": "string"}}))
    await producer(client, topic, "first_producer", subject="first-schema")
    assert await _creates(client, topic, "second_producer", subject="first-schema"), (
        "Second producer with same schema should succeed"
    )


async def test_second_producer_different_schema_fails(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/schema_mismatch")
    await register(client.schema(), "schema-a", obj({"a": {"type": "string"}}))
    await register(client.schema(), "schema-b", obj({"b": {"type": "integer"}}))
    await producer(client, topic, "producer_schema_a", subject="schema-a")
    assert not await _creates(client, topic, "producer_schema_b", subject="schema-b"), (
        "Second producer with different schema should fail"
    )


async def test_producer_without_schema_can_connect(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/no_schema_allowed")
    await register(client.schema(), "optional-schema", obj({"x": {"type": "number"}}))
    await producer(client, topic, "first_with_schema", subject="optional-schema")
    assert await _creates(client, topic, "second_no_schema"), (
        "Producer without schema should be allowed to connect. Schema validation happens at message level."
    )


async def test_topic_allows_different_versions_same_subject(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/version_evolution")
    subject = "evolving-schema"
    await register(client.schema(), subject, obj({"id": {"type": "integer"}}))
    await producer(client, topic, "producer_v1", subject=subject, version=1)
    await register(client.schema(), subject, obj({"id": {"type": "integer"}, "name": {"type": "string"}}))
    assert await _creates(client, topic, "producer_v2", subject=subject, version=2), (
        "Producer with different version of same subject should succeed"
    )

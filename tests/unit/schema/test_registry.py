"""The registry's storage model over the embedded metadata store, and the publish gate."""

from __future__ import annotations

import io
import json

import pytest
from fastavro import parse_schema, schemaless_writer

from danube import message_codec
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.schema.errors import IncompatibleSchemaError, InvalidSchemaError, SchemaNotFoundError, SchemaViolationError
from danube.schema.registry import SchemaRegistry
from danube.schema.validation import SCHEMA_ATTR, SchemaGate, schema_attributes

USER_V1 = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
USER_V2 = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "email", "type": ["null", "string"], "default": None}]}


def avro(doc) -> bytes:
    return json.dumps(doc).encode()


def avro_payload(doc, record) -> bytes:
    b = io.BytesIO()
    schemaless_writer(b, parse_schema(doc), record)
    return b.getvalue()


@pytest.fixture()
async def registry(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    yield SchemaRegistry(store)
    await store.close()


async def test_register_versions_ids_and_fingerprints(registry):
    v1, new = await registry.register(
        "users", "avro", avro(USER_V1), description="first", created_by="me", tags=["a", "b"]
    )
    assert new and v1.version == 1 and v1.schema_id >= 1 and len(v1.fingerprint) == 64
    # the same schema, formatted differently: the existing version, not a new one
    again, new = await registry.register("users", "avro", json.dumps(USER_V1, indent=4).encode())
    assert not new and (again.schema_id, again.version) == (v1.schema_id, 1)
    v2, new = await registry.register("users", "avro", avro(USER_V2))
    assert new and v2.version == 2 and v2.schema_id == v1.schema_id
    other, _ = await registry.register("orders", "json_schema", b'{"type": "object"}')
    assert other.schema_id != v1.schema_id  # ids are per subject, globally unique
    got = await registry.get(v1.schema_id, 1)
    assert (got.subject, got.description, got.created_by, got.tags) == ("users", "first", "me", ["a", "b"])
    assert (await registry.get(v1.schema_id)).version == 2  # no version: the latest
    assert [v.version for v in await registry.versions("users")] == [1, 2]
    assert (await registry.latest("users")).version == 2
    assert sorted(await registry.subjects()) == ["orders", "users"]


async def test_invalid_definitions_are_refused(registry):
    with pytest.raises(InvalidSchemaError, match="avro"):
        await registry.register(
            "s", "avro", b'{"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}'
        )
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        await registry.register("s", "avro", b"{nope")
    with pytest.raises(InvalidSchemaError, match="json_schema"):
        await registry.register("s", "json_schema", b'{"type": 12}')
    with pytest.raises(InvalidSchemaError, match="protobuf"):
        await registry.register("s", "protobuf", b"syntax = 'proto3'; message M { strin x = 1; }")
    with pytest.raises(InvalidSchemaError, match="unknown schema type"):
        await registry.register("s", "xml", b"<x/>")
    with pytest.raises(SchemaNotFoundError):
        await registry.latest("s")


async def test_modes_and_compatibility(registry):
    await registry.register("users", "avro", avro(USER_V1))
    assert await registry.compatibility_mode("users") == "backward"
    breaking = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "age", "type": "int"}]}  # no default
    reasons = await registry.check("users", "avro", avro(breaking))
    assert reasons and "age" in reasons[0]
    with pytest.raises(IncompatibleSchemaError) as info:
        await registry.register("users", "avro", avro(breaking))
    assert info.value.reasons
    assert await registry.check("users", "avro", avro(breaking), mode="forward") == []
    await registry.set_compatibility_mode("users", "none")
    v, new = await registry.register("users", "avro", avro(breaking))
    assert new and v.version == 2
    with pytest.raises(InvalidSchemaError, match="holds avro"):
        await registry.register("users", "json_schema", b'{"type": "object"}')


async def test_delete_version(registry):
    v1, _ = await registry.register("users", "avro", avro(USER_V1))
    await registry.register("users", "avro", avro(USER_V2))
    await registry.delete_version("users", 2)
    assert [v.version for v in await registry.versions("users")] == [1]
    assert (await registry.latest("users")).version == 1
    with pytest.raises(SchemaNotFoundError):
        await registry.get(v1.schema_id, 2)
    assert (await registry.get(v1.schema_id, 2, include_deleted=True)).deleted
    v3, new = await registry.register("users", "avro", avro(USER_V2))  # numbers are not reused
    assert new and v3.version == 3


async def test_gate_enforce_and_payload_validation(registry):
    v1, _ = await registry.register("users", "avro", avro(USER_V1))
    gate = SchemaGate(registry)
    await registry.configure_topic("/default/users", "users", "enforce", payload_validation=False)
    await gate.refresh()
    good = avro_payload(USER_V1, {"id": 1, "name": "ann"})
    attrs = schema_attributes(v1.schema_id, 1)
    batch = bytearray(message_codec.encode_payloads([good, good], attributes=attrs))
    gate.check_batch("/default/users", v1.schema_id, 1, batch)
    gate.check_batch("/default/users-part-3", v1.schema_id, 1, batch)  # a partition follows its topic
    with pytest.raises(SchemaViolationError, match="no schema id"):
        gate.check_batch("/default/users", None, None, batch)
    with pytest.raises(SchemaViolationError, match="not the topic's"):
        gate.check_batch("/default/users", v1.schema_id + 100, 1, batch)
    with pytest.raises(SchemaViolationError, match="version 7"):
        gate.check_batch("/default/users", v1.schema_id, 7, batch)
    bad = bytearray(message_codec.encode_payloads([good, b"\xff\xff\xff"], attributes=attrs))
    gate.check_batch("/default/users", v1.schema_id, 1, bad)  # ids only: passes
    await registry.update_topic_policy("/default/users", "enforce", payload_validation=True)
    await gate.refresh()
    with pytest.raises(SchemaViolationError, match="message 1"):
        gate.check_batch("/default/users", v1.schema_id, 1, bad)
    gate.check_batch("/default/users", v1.schema_id, 1, batch)
    with pytest.raises(SchemaViolationError):
        gate.check_message("/default/users", v1.schema_id, 1, b"\x02")
    await registry.update_topic_policy("/default/users", "warn", payload_validation=True)
    await gate.refresh()
    gate.check_batch("/default/users", v1.schema_id, 1, bad)  # warn: let through, counted
    assert gate.warnings == 1
    gate.check_batch("/default/other", None, None, bad)  # no config: nothing checked
    no_attrs = bytearray(message_codec.encode_payloads([good]))
    await registry.update_topic_policy("/default/users", "enforce")
    await gate.refresh()
    with pytest.raises(SchemaViolationError, match=SCHEMA_ATTR):
        gate.check_batch("/default/users", v1.schema_id, 1, no_attrs)


async def test_topic_config_and_producer_subject(registry):
    await registry.register("users", "avro", avro(USER_V1))
    await registry.register("orders", "string", b"")
    cfg = await registry.assign_topic_subject("/default/t", "users")
    assert (cfg.subject, cfg.validation_policy) == ("users", "none")
    with pytest.raises(Exception, match="uses schema subject"):
        await registry.assign_topic_subject("/default/t", "orders")
    with pytest.raises(SchemaNotFoundError):
        await registry.configure_topic("/default/t", "missing", "enforce")
    with pytest.raises(InvalidSchemaError, match="policy"):
        await registry.configure_topic("/default/t", "users", "strict")


@pytest.mark.parametrize("fast", [True, False], ids=["jsonschema-rs", "jsonschema"])
def test_json_payload_validation_with_either_library(fast, monkeypatch):
    import sys

    from danube.schema.types import parse
    from danube.schema.validation import payload_validator

    if not fast:
        monkeypatch.setitem(sys.modules, "jsonschema_rs", None)  # import fails: the fallback
    elif pytest.importorskip("jsonschema_rs") is None:
        return
    p = parse(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "required": ["id"],
                "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            }
        ),
    )
    check = payload_validator(p)
    check(b'{"id": 1, "tags": ["a"]}')
    for bad, where in (
        (b'{"id": "x"}', "at id"),
        (b'{"tags": []}', "at root"),
        (b'{"id": 1, "tags": [2]}', "at tags/0"),
    ):
        with pytest.raises(ValueError, match=where):
            check(bad)
    with pytest.raises(ValueError, match="not JSON"):
        check(b"nope")


async def test_partitions_share_the_partitioned_topics_config(registry):
    v1, _ = await registry.register("users", "avro", avro(USER_V1))
    await registry.configure_topic("/default/p", "users", "enforce")
    # a schema-aware producer on a partition does not shadow the topic's policy with its own config
    cfg = await registry.assign_topic_subject("/default/p-part-1", "users")
    assert (cfg.topic, cfg.validation_policy) == ("/default/p", "enforce")
    gate = SchemaGate(registry)
    await gate.refresh()
    with pytest.raises(SchemaViolationError):
        gate.check_message("/default/p-part-1", None, None, b"x")
    await registry.assign_topic_subject("/default/q-part-0", "users")
    assert (await registry.topic_config("/default/q")).subject == "users"


TYPED = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}).encode()
TYPED_PLUS = json.dumps(
    {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}}, "required": ["name"]}
).encode()


async def test_json_schema_rule_default_per_subject_and_per_broker(registry, tmp_path):
    # Danube's rule by default: an added optional property is backward compatible
    await registry.register("open", "json_schema", TYPED)
    assert await registry.json_schema_rule_of("open") == "danube"
    assert await registry.check("open", "json_schema", TYPED_PLUS) == []
    # a subject opting in to the stricter rule refuses it (the writer allowed any 'email')
    await registry.register("strict", "json_schema", TYPED)
    await registry.set_compatibility_mode("strict", "backward", "reader_writer")
    assert await registry.json_schema_rule_of("strict") == "reader_writer"
    with pytest.raises(IncompatibleSchemaError, match="email"):
        await registry.register("strict", "json_schema", TYPED_PLUS)
    await registry.set_compatibility_mode("strict", "backward", "default")  # back to the broker's
    assert (await registry.register("strict", "json_schema", TYPED_PLUS))[0].version == 2
    with pytest.raises(InvalidSchemaError, match="rule"):
        await registry.set_compatibility_mode("strict", "backward", "lenient")
    # a broker whose setting is reader_writer: every subject without its own rule
    store = EmbeddedMetadataStore(str(tmp_path / "strict.db"))
    try:
        strict_broker = SchemaRegistry(store, "reader_writer")
        await strict_broker.register("s", "json_schema", TYPED)
        assert await strict_broker.check("s", "json_schema", TYPED_PLUS)
        await strict_broker.set_compatibility_mode("s", "backward", "danube")
        assert await strict_broker.check("s", "json_schema", TYPED_PLUS) == []
    finally:
        await store.close()

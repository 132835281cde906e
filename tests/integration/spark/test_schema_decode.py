"""decode=schema: a two-version Avro topic read into typed columns with the latest schema."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from fastavro import parse_schema, schemaless_writer

from danube import message_codec
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.schema.registry import SchemaRegistry
from danube.schema.validation import schema_attributes
from danube.storage import segment as seg
from danube.storage.backends import FilesystemBackend

pytestmark = pytest.mark.spark

TOPIC = "/default/users"
V1 = {
    "type": "record",
    "name": "User",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {
            "name": "address",
            "type": {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]},
        },
    ],
}
V2 = {
    "type": "record",
    "name": "User",
    "fields": [
        {"name": "id", "type": "long"},  # int → long (promotion)
        {"name": "name", "type": "string"},
        {
            "name": "address",
            "type": {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]},
        },
        {"name": "email", "type": ["null", "string"], "default": None},  # added with defaults
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


def avro(doc, record) -> bytes:
    b = io.BytesIO()
    schemaless_writer(b, parse_schema(doc), record)
    return b.getvalue()


def test_two_version_avro_topic_reads_into_typed_columns(spark, tmp_path):
    meta = str(tmp_path / "metadata.db")

    async def setup():
        store = EmbeddedMetadataStore(meta)
        registry = SchemaRegistry(store)
        v1, _ = await registry.register("users", "avro", json.dumps(V1))
        v2, _ = await registry.register("users", "avro", json.dumps(V2))
        await registry.configure_topic(TOPIC, "users", "enforce")
        await store.close()
        return v1, v2

    v1, v2 = asyncio.run(setup())
    assert (v1.version, v2.version) == (1, 2)
    first = [
        (
            1_700_000_000_000 + i,
            7,
            f"k{i}",
            schema_attributes(v1.schema_id, 1),
            avro(V1, {"id": i, "name": f"user-{i}", "address": {"city": "Oslo"}}),
        )
        for i in range(3)
    ]
    second = [
        (
            1_700_000_100_000 + i,
            7,
            None,
            schema_attributes(v2.schema_id, 2),
            avro(
                V2,
                {
                    "id": 2**40 + i,
                    "name": f"new-{i}",
                    "address": {"city": "Rome"},
                    "email": f"n{i}@x.org",
                    "tags": ["a", "b"],
                },
            ),
        )
        for i in range(2)
    ]
    root = str(tmp_path / "durable")
    backend = FilesystemBackend(root)
    seg.write_segment(backend, TOPIC, message_codec.encode_records(first, base_offset=0))
    seg.write_segment(backend, TOPIC, message_codec.encode_records(second, base_offset=3))

    df = (
        spark.read.format("danube")
        .option("topic", TOPIC)
        .option("decode", "schema")
        .option("schemaRegistry", meta)
        .load(root)
    )
    types = dict(df.dtypes)
    assert types["id"] == "bigint" and types["name"] == "string" and types["email"] == "string"
    assert types["address"] == "struct<city:string>" and types["tags"] == "array<string>"
    assert types["schema_version"] == "int" and "payload" not in types
    rows = [r.asDict(recursive=True) for r in df.orderBy("offset").collect()]
    assert [
        (r["offset"], r["schema_version"], r["id"], r["name"], r["email"], r["tags"], r["address"]["city"])
        for r in rows
    ] == [
        (0, 1, 0, "user-0", None, [], "Oslo"),
        (1, 1, 1, "user-1", None, [], "Oslo"),
        (2, 1, 2, "user-2", None, [], "Oslo"),
        (3, 2, 2**40, "new-0", "n0@x.org", ["a", "b"], "Rome"),
        (4, 2, 2**40 + 1, "new-1", "n1@x.org", ["a", "b"], "Rome"),
    ]
    assert rows[0]["routing_key"] == "k0"
    # typed columns work in SQL like any other
    assert df.where("id > 1 AND address.city = 'Rome'").count() == 2

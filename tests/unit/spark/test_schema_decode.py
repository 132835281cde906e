"""decode=schema without Spark: the column plan and the per-batch decoder for each schema type."""

from __future__ import annotations

import datetime
import io
import json

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from google.protobuf import message_factory

from danube.schema.types import parse, protobuf_main_message
from danube.schema.validation import schema_attributes
from danube.spark.schema_decode import Decoder, SubjectVersions, plan

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def source_batch(payloads, tags):
    n = len(payloads)
    return pa.RecordBatch.from_pydict(
        {
            "offset": list(range(n)),
            "publish_time": [T0] * n,
            "routing_key": [None] * n,
            "attributes": [list(t.items()) for t in tags],
            "payload": payloads,
        },
        schema=pa.schema(
            [
                ("offset", pa.int64()),
                ("publish_time", pa.timestamp("us", tz="UTC")),
                ("routing_key", pa.string()),
                ("attributes", pa.map_(pa.string(), pa.string())),
                ("payload", pa.binary()),
            ]
        ),
    )


def test_avro_versions_read_into_the_latest():
    v1 = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "int"}, {"name": "m", "type": {"type": "map", "values": "long"}}],
    }
    v2 = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "a", "type": "long"},
            {"name": "m", "type": {"type": "map", "values": "long"}},
            {"name": "c", "type": {"type": "enum", "name": "C", "symbols": ["X", "Y"]}, "default": "Y"},
        ],
    }
    sv = SubjectVersions("s", "avro", 9, 2, {1: json.dumps(v1).encode(), 2: json.dumps(v2).encode()})
    p = plan(sv)
    assert p.ddl.endswith("`a` bigint, `m` map<string,bigint>, `c` string")

    def enc(doc, rec):
        b = io.BytesIO()
        schemaless_writer(b, parse_schema(doc), rec)
        return b.getvalue()

    out = Decoder(p).decode(
        source_batch(
            [
                enc(v1, {"a": 1, "m": {"k": 2}}),
                enc(v2, {"a": 2**40, "m": {}, "c": "X"}),
                enc(v2, {"a": 3, "m": {}, "c": "X"}),
            ],
            [schema_attributes(9, 1), schema_attributes(9, 2), {}],
        )
    )  # the last is untagged: read as latest
    assert out.column("schema_version").to_pylist() == [1, 2, 2]
    assert out.column("a").to_pylist() == [1, 2**40, 3]
    assert out.column("c").to_pylist() == ["Y", "X", "X"]
    assert out.column("m").to_pylist() == [[("k", 2)], [], []]


def test_json_schema_columns_by_field_name():
    doc = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "geo": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "any": {},
        },
    }
    p = plan(SubjectVersions("j", "json_schema", 1, 1, {1: json.dumps(doc).encode()}))
    out = Decoder(p).decode(
        source_batch(
            [b'{"id": 5, "tags": ["a"], "geo": {"lat": 1.5}, "any": {"x": 1}}', b'{"id": 6}'],
            [schema_attributes(1, 1)] * 2,
        )
    )
    assert out.column("id").to_pylist() == [5, 6]
    assert out.column("geo").to_pylist() == [{"lat": 1.5}, None]
    assert out.column("any").to_pylist() == ['{"x": 1}', None]


def test_protobuf_versions_read_with_the_latest_message():
    v1 = 'syntax = "proto3"; package t; message U { int64 id = 1; string name = 2; }'
    v2 = (
        'syntax = "proto3"; package t; '  # the schema's message is the file's first one
        "message U { int64 id = 1; string name = 2; Kind kind = 3; repeated string tags = 4; Addr addr = 5; "
        "map<string, int32> counts = 6; } enum Kind { A = 0; B = 1; } message Addr { string city = 1; }"
    )
    p = plan(SubjectVersions("p", "protobuf", 4, 2, {1: v1.encode(), 2: v2.encode()}))
    assert "`kind` string" in p.ddl and "`addr` struct<`city`:string>" in p.ddl and "map<string,int>" in p.ddl
    old = message_factory.GetMessageClass(protobuf_main_message(parse("protobuf", v1)))
    new = message_factory.GetMessageClass(protobuf_main_message(parse("protobuf", v2)))
    payloads = [
        old(id=1, name="a").SerializeToString(),
        new(id=2, name="b", kind=1, tags=["x"], addr={"city": "Oslo"}, counts={"k": 3}).SerializeToString(),
    ]
    out = Decoder(p).decode(source_batch(payloads, [schema_attributes(4, 1), schema_attributes(4, 2)]))
    rows = out.to_pylist()
    assert [(r["id"], r["name"], r["kind"], r["tags"], r["addr"], r["counts"]) for r in rows] == [
        (1, "a", "A", [], None, []),
        (2, "b", "B", ["x"], {"city": "Oslo"}, [("k", 3)]),
    ]


def test_a_payload_that_does_not_decode_names_its_offset():
    doc = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    p = plan(SubjectVersions("s", "avro", 1, 1, {1: json.dumps(doc).encode()}))
    batch = source_batch([b"\x02a", b"\x09"], [schema_attributes(1, 1)] * 2)
    with pytest.raises(Exception, match="offset 1"):
        Decoder(p).decode(batch)
    assert Decoder(p, "null").decode(batch).column("s").to_pylist() == ["a", None]

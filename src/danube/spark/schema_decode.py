"""``.option("decode", "schema")``: a topic read with its registered schema into typed columns.

    df = (spark.read.format("danube").option("topic", "/default/users")
          .option("decode", "schema")
          .option("schemaRegistry", "/var/lib/danube/metadata.db")   # or http://broker:6650
          .option("subject", "users")                                 # default: the topic's subject
          .load("/var/lib/danube/durable"))

Columns: ``offset``, ``publish_time``, ``routing_key``, ``schema_version`` (the version the
message was written with), then one column per field of the subject's **latest** schema
(records nest as struct columns, arrays and maps as Spark arrays and maps).  Every version is
read into the latest one as reader schema: Avro with the specification's schema resolution
(fastavro: fields added with defaults take their default, removed fields are dropped, promoted
types widen); JSON documents by field name (absent fields are null); Protobuf payloads with the
latest message (the file's first), as protobuf evolves by field numbers.  A message without schema
attributes is read as written with the latest version; one that does not decode fails the read
with its offset (``onError=null`` makes it a row of nulls instead).

The versions are looked up once on the driver, from the broker's metadata database (the
embedded store's file) or a broker's registry over gRPC, and travel to the executors with the
reader.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import pyarrow as pa

from danube.errors import InvalidArgumentError
from danube.schema.validation import SCHEMA_ATTR, parse_schema_value

META_COLUMNS = [
    ("offset", pa.int64(), "bigint"),
    ("publish_time", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("routing_key", pa.string(), "string"),
    ("schema_version", pa.int32(), "int"),
]
SOURCE_COLUMNS = ("offset", "publish_time", "routing_key", "attributes", "payload")


@dataclass
class SubjectVersions:
    subject: str
    schema_type: str
    schema_id: int
    latest: int
    definitions: dict[int, bytes] = field(default_factory=dict)  # every version, deleted ones too


def wants_schema_decode(options: Mapping[str, str]) -> bool:
    opts = {k.lower(): v for k, v in options.items()}
    decode = (opts.get("decode") or "").lower()
    if decode and decode not in ("schema", "none"):
        raise InvalidArgumentError(f"option decode={decode!r}: expected schema or none")
    return decode == "schema"


# ---------------------------------------------------------------- driver: the subject's versions


def load_versions(options: Mapping[str, str]) -> SubjectVersions:
    opts = {k.lower(): v for k, v in options.items()}
    source = opts.get("schemaregistry")
    topic = opts.get("topic")
    if not source:
        raise InvalidArgumentError(
            "option decode=schema needs option schemaRegistry (the broker's metadata "
            "database file, or a broker URL such as http://127.0.0.1:6650)"
        )
    if source.startswith(("http://", "https://", "grpc://")) or (":" in source and not source.startswith("/")):
        return _from_grpc(source, opts.get("subject"), topic)
    return _from_metadata(source, opts.get("subject"), topic)


def _from_metadata(path: str, subject: str | None, topic: str | None) -> SubjectVersions:
    import asyncio
    import os

    from danube.metadata.embedded import EmbeddedMetadataStore
    from danube.schema.registry import SchemaRegistry

    if not os.path.isfile(path):
        raise InvalidArgumentError(f"option schemaRegistry={path!r}: no metadata database there")

    async def fetch() -> SubjectVersions:
        store = EmbeddedMetadataStore(path)
        try:
            registry = SchemaRegistry(store)
            name = subject or await _topic_subject(registry, topic)
            versions = await registry.versions(name, include_deleted=True)
            live = [v for v in versions if not v.deleted]
            if not live:
                raise InvalidArgumentError(f"schema subject {name!r} has no live version")
            return SubjectVersions(
                name,
                live[-1].schema_type,
                live[-1].schema_id,
                live[-1].version,
                {v.version: v.definition for v in versions},
            )
        finally:
            await store.close()

    return asyncio.run(fetch())


async def _topic_subject(registry, topic: str | None) -> str:
    if not topic:
        raise InvalidArgumentError("option decode=schema needs option subject or option topic")
    cfg = await registry.topic_config(topic)
    if not cfg.subject:
        raise InvalidArgumentError(f"topic {topic} has no schema subject; give option subject")
    return cfg.subject


def _from_grpc(url: str, subject: str | None, topic: str | None) -> SubjectVersions:
    import grpc

    from danube.proto.danube_schema import SchemaRegistry_pb2 as pb
    from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as pb_grpc

    target = url.split("://", 1)[-1].rstrip("/")
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.SchemaRegistryStub(channel)
        if not subject:
            if not topic:
                raise InvalidArgumentError("option decode=schema needs option subject or option topic")
            subject = stub.GetTopicSchemaConfig(
                pb.GetTopicSchemaConfigRequest(topic_name=topic), timeout=30
            ).schema_subject
            if not subject:
                raise InvalidArgumentError(f"topic {topic} has no schema subject; give option subject")
        latest = stub.GetLatestSchema(pb.GetLatestSchemaRequest(subject=subject), timeout=30)
        listed = stub.ListVersions(pb.ListVersionsRequest(subject=subject), timeout=30)
        defs = {}
        for v in listed.versions:
            defs[v.version] = stub.GetSchema(
                pb.GetSchemaRequest(schema_id=latest.schema_id, version=v.version), timeout=30
            ).schema_definition
    return SubjectVersions(subject, latest.schema_type, latest.schema_id, latest.version, defs)


# ---------------------------------------------------------------- the DataFrame schema


def _avro_type(s, named: dict) -> tuple[pa.DataType, str]:
    """(Arrow type, Spark DDL type) of an Avro schema node (fastavro-parsed)."""
    if isinstance(s, str):
        prim = {
            "null": (pa.null(), "void"),
            "boolean": (pa.bool_(), "boolean"),
            "int": (pa.int32(), "int"),
            "long": (pa.int64(), "bigint"),
            "float": (pa.float32(), "float"),
            "double": (pa.float64(), "double"),
            "bytes": (pa.binary(), "binary"),
            "string": (pa.string(), "string"),
        }
        if s in prim:
            return prim[s]
        return _avro_type(named[s], named)
    if isinstance(s, list):
        branches = [b for b in s if b != "null"]
        if len(branches) == 1:
            return _avro_type(branches[0], named)
        return pa.string(), "string"  # a general union: its JSON text
    t = s.get("type")
    logical = s.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("us", tz="UTC"), "timestamp"
    if logical == "date":
        return pa.date32(), "date"
    if logical in ("decimal", "uuid", "time-millis", "time-micros"):
        return pa.string(), "string"
    if isinstance(t, (dict, list)) or (
        isinstance(t, str) and t not in ("record", "error", "enum", "fixed", "array", "map")
    ):
        return _avro_type(t, named)
    if t in ("record", "error"):
        fields = [(f["name"],) + _avro_type(f["type"], named) for f in s["fields"]]
        return (
            pa.struct([(n, a) for n, a, _ in fields]),
            "struct<" + ",".join(f"`{n}`:{d}" for n, _, d in fields) + ">",
        )
    if t == "enum":
        return pa.string(), "string"
    if t == "fixed":
        return pa.binary(), "binary"
    if t == "array":
        a, d = _avro_type(s["items"], named)
        return pa.list_(a), f"array<{d}>"
    if t == "map":
        a, d = _avro_type(s["values"], named)
        return pa.map_(pa.string(), a), f"map<string,{d}>"
    raise InvalidArgumentError(f"cannot map Avro type {t!r} to a column")


def _json_type(s: Any) -> tuple[pa.DataType, str]:
    if not isinstance(s, dict):
        return pa.string(), "string"
    t = s.get("type")
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        t = rest[0] if len(rest) == 1 else None
    if t == "integer":
        return pa.int64(), "bigint"
    if t == "number":
        return pa.float64(), "double"
    if t == "boolean":
        return pa.bool_(), "boolean"
    if t == "string":
        return pa.string(), "string"
    if t == "object" and isinstance(s.get("properties"), dict):
        fields = [(n,) + _json_type(sub) for n, sub in s["properties"].items()]
        return (
            pa.struct([(n, a) for n, a, _ in fields]),
            "struct<" + ",".join(f"`{n}`:{d}" for n, _, d in fields) + ">",
        )
    if t == "array" and isinstance(s.get("items"), dict):
        a, d = _json_type(s["items"])
        return pa.list_(a), f"array<{d}>"
    return pa.string(), "string"  # anything else: its JSON text


def _proto_scalar(f) -> tuple[pa.DataType, str]:
    from google.protobuf.descriptor import FieldDescriptor as F

    t = f.type
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return pa.int32(), "int"
    if t in (
        F.TYPE_INT64,
        F.TYPE_SINT64,
        F.TYPE_SFIXED64,
        F.TYPE_UINT32,
        F.TYPE_FIXED32,
        F.TYPE_UINT64,
        F.TYPE_FIXED64,
    ):
        return pa.int64(), "bigint"
    if t == F.TYPE_FLOAT:
        return pa.float32(), "float"
    if t == F.TYPE_DOUBLE:
        return pa.float64(), "double"
    if t == F.TYPE_BOOL:
        return pa.bool_(), "boolean"
    if t == F.TYPE_BYTES:
        return pa.binary(), "binary"
    if t == F.TYPE_MESSAGE:
        fields = [(sub.name,) + _proto_type(sub) for sub in f.message_type.fields]
        return (
            pa.struct([(n, a) for n, a, _ in fields]),
            "struct<" + ",".join(f"`{n}`:{d}" for n, _, d in fields) + ">",
        )
    return pa.string(), "string"  # string, enum (its name)


def _proto_repeated(f) -> bool:
    rep = getattr(f, "is_repeated", None)
    return rep if rep is not None else f.label == f.LABEL_REPEATED


def _proto_type(f, _depth: int = 0) -> tuple[pa.DataType, str]:
    """(Arrow type, Spark DDL type) of a protobuf field: maps, repeated fields, messages nest."""
    if _depth > 32:
        return pa.string(), "string"  # deeply recursive messages: their text
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        k, kd = _proto_scalar(f.message_type.fields_by_name["key"])
        v, vd = _proto_type(f.message_type.fields_by_name["value"], _depth + 1)
        return pa.map_(k, v), f"map<{kd},{vd}>"
    a, d = _proto_scalar(f)
    if _proto_repeated(f):
        return pa.list_(a), f"array<{d}>"
    return a, d


def _proto_value(msg) -> dict:
    """A message as plain Python values by field name (enums by name, nested messages as dicts)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = [
                (k, _proto_value(v) if vf.type == F.TYPE_MESSAGE else _enum_name(vf, v)) for k, v in value.items()
            ]
        elif _proto_repeated(f):
            out[f.name] = [_proto_value(v) if f.type == F.TYPE_MESSAGE else _enum_name(f, v) for v in value]
        elif f.type == F.TYPE_MESSAGE:
            out[f.name] = _proto_value(value) if msg.HasField(f.name) else None
        else:
            out[f.name] = _enum_name(f, value)
    return out


def _enum_name(f, value):
    if f.enum_type is not None:
        named = f.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    return value


@dataclass
class DecodePlan:
    versions: SubjectVersions
    value_fields: list[tuple[str, pa.DataType, str]]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(n, a) for n, a, _ in META_COLUMNS] + [(n, a) for n, a, _ in self.value_fields])

    @property
    def ddl(self) -> str:
        return ", ".join(f"`{n}` {d}" for n, _, d in META_COLUMNS + self.value_fields)


def plan(versions: SubjectVersions) -> DecodePlan:
    from danube.schema.types import parse

    latest = parse(versions.schema_type, versions.definitions[versions.latest])
    if latest.schema_type == "avro":
        root = latest.parsed
        if not (isinstance(root, dict) and root.get("type") in ("record", "error")):
            raise InvalidArgumentError("decode=schema needs an Avro record schema (one column per field)")
        fields = [(f["name"],) + _avro_type(f["type"], latest.named) for f in root["fields"]]
    elif latest.schema_type == "json_schema":
        props = latest.parsed.get("properties") if isinstance(latest.parsed, dict) else None
        if not isinstance(props, dict):
            raise InvalidArgumentError("decode=schema needs a JSON Schema object with properties")
        fields = [(n,) + _json_type(sub) for n, sub in props.items()]
    elif latest.schema_type == "protobuf":
        from danube.schema.types import protobuf_main_message

        fields = [(f.name,) + _proto_type(f) for f in protobuf_main_message(latest).fields]
    else:
        raise InvalidArgumentError(
            f"decode=schema reads Avro, JSON Schema and Protobuf subjects, not {latest.schema_type}"
        )
    taken = {n for n, _, _ in META_COLUMNS}
    clash = [n for n, _, _ in fields if n in taken]
    if clash:
        raise InvalidArgumentError(f"schema fields {clash} clash with the columns {sorted(taken)}")
    return DecodePlan(versions, fields)


# ---------------------------------------------------------------- executors: decode batches


class Decoder:
    def __init__(self, decode_plan: DecodePlan, on_error: str = "fail") -> None:
        self.plan = decode_plan
        self.on_error = on_error
        self._readers: dict[int, Any] = {}
        v = decode_plan.versions
        self._json = v.schema_type == "json_schema"
        self._proto = None
        if v.schema_type == "protobuf":
            # protobuf evolves by field numbers: every version is read with the latest message
            from google.protobuf import message_factory

            from danube.schema.types import parse, protobuf_main_message

            self._proto = message_factory.GetMessageClass(
                protobuf_main_message(parse("protobuf", v.definitions[v.latest]))
            )
        elif not self._json:
            from fastavro import parse_schema

            self._reader_schema = parse_schema(json.loads(v.definitions[v.latest]))
        self._names = [n for n, _, _ in decode_plan.value_fields]
        self._types = {n: a for n, a, _ in decode_plan.value_fields}

    def _avro(self, version: int):
        r = self._readers.get(version)
        if r is None:
            from fastavro import parse_schema, schemaless_reader

            defs = self.plan.versions.definitions
            if version not in defs:
                raise InvalidArgumentError(
                    f"schema version {version} of subject {self.plan.versions.subject!r} is not registered"
                )
            writer = parse_schema(json.loads(defs[version]))
            reader = self._reader_schema

            def r(payload, writer=writer, reader=reader):
                bio = io.BytesIO(payload)
                return schemaless_reader(bio, writer, reader)

            self._readers[version] = r
        return r

    def _value(self, name: str, value: Any) -> Any:
        t = self._types[name]
        if pa.types.is_string(t) and value is not None and not isinstance(value, str):
            return json.dumps(value, default=str)
        return value

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        cols = batch.to_pydict()
        v = self.plan.versions
        rows: dict[str, list] = {n: [] for n, _, _ in META_COLUMNS}
        for name in self._names:
            rows[name] = []
        for i, payload in enumerate(cols["payload"]):
            attrs = dict(cols["attributes"][i] or [])
            sid, version = parse_schema_value(attrs.get(SCHEMA_ATTR))
            if version is None or sid != v.schema_id:
                version = v.latest  # untagged (or another subject's id): read as the latest
            try:
                if self._json:
                    doc = json.loads(payload)
                    if not isinstance(doc, dict):
                        raise ValueError("not a JSON object")
                elif self._proto is not None:
                    doc = _proto_value(self._proto.FromString(payload))
                else:
                    doc = self._avro(version)(payload)
            except Exception as exc:  # noqa: BLE001
                if self.on_error != "null":
                    raise InvalidArgumentError(
                        f"offset {cols['offset'][i]}: payload does not decode with schema "
                        f"{v.subject!r} version {version}: {exc}"
                    ) from None
                doc = {}
            rows["offset"].append(cols["offset"][i])
            rows["publish_time"].append(cols["publish_time"][i])
            rows["routing_key"].append(cols["routing_key"][i])
            rows["schema_version"].append(version)
            for name in self._names:
                rows[name].append(self._value(name, doc.get(name)))
        arrays = []
        schema = self.plan.arrow_schema
        for f in schema:
            try:
                arrays.append(pa.array(rows[f.name], type=f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise InvalidArgumentError(f"column {f.name!r}: values do not fit {f.type}: {exc}") from None
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def decode_partition(batches: Iterator[pa.RecordBatch], decoder: Decoder) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if batch.num_rows:
            yield decoder.decode(batch)

"""Compatibility rules per schema type, each mode with a compatible and an incompatible change."""

from __future__ import annotations

import json

import pytest

from danube.schema import compat
from danube.schema.types import parse


def avro(fields, name="User", **extra):
    return parse("avro", json.dumps({"type": "record", "name": name, "fields": fields, **extra}))


ID = {"name": "id", "type": "long"}
NAME = {"name": "name", "type": "string"}


@pytest.mark.parametrize(
    "mode,old,new,ok",
    [
        # backward: new reads old data
        ("backward", [ID], [ID, {"name": "e", "type": "string", "default": ""}], True),  # added with default
        ("backward", [ID], [ID, NAME], False),  # added without default
        ("backward", [ID, NAME], [ID], True),  # removed
        ("backward", [{"name": "n", "type": "int"}], [{"name": "n", "type": "long"}], True),  # int → long promotion
        ("backward", [{"name": "n", "type": "long"}], [{"name": "n", "type": "int"}], False),
        # forward: old reads new data
        ("forward", [ID], [ID, NAME], True),  # added: old skips it
        ("forward", [ID, NAME], [ID], False),  # removed without default
        ("forward", [ID, {"name": "e", "type": "string", "default": ""}], [ID], True),
        # full: both
        ("full", [ID], [ID, {"name": "e", "type": ["null", "string"], "default": None}], True),
        ("full", [ID], [ID, NAME], False),
        ("none", [ID], [{"name": "x", "type": "boolean"}], True),
    ],
)
def test_avro_modes(mode, old, new, ok):
    reasons = compat.check(avro(old), avro(new), mode)
    assert (reasons == []) is ok, reasons


def test_avro_unions_enums_nested_and_names():
    old = avro([{"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["R", "G"]}}])
    new = avro([{"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["R"]}}])
    assert compat.check(old, new, "backward")  # the reader lacks G
    widened = avro([{"name": "v", "type": ["null", "long", "string"]}])
    narrow = avro([{"name": "v", "type": ["null", "long"]}])
    assert compat.check(narrow, widened, "backward") == []
    assert compat.check(widened, narrow, "backward")
    nested_old = avro([{"name": "a", "type": {"type": "record", "name": "A", "fields": [ID]}}])
    nested_new = avro([{"name": "a", "type": {"type": "record", "name": "A", "fields": [ID, NAME]}}])
    reasons = compat.check(nested_old, nested_new, "backward")
    assert reasons and "a.name" in reasons[0]
    assert compat.check(avro([ID], name="User"), avro([ID], name="Person"), "backward")
    assert compat.check(avro([ID], name="User"), avro([ID], name="Person", aliases=["User"]), "backward") == []


def js(doc):
    return parse("json_schema", json.dumps(doc))


OBJ = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id"]}


@pytest.mark.parametrize(
    "mode,new,ok",
    [
        (
            "backward",
            {**OBJ, "properties": {**OBJ["properties"], "email": {"type": "string"}}},
            False,
        ),  # typed addition, open writer
        ("backward", {**OBJ, "properties": {"id": {"type": "number"}, "name": {"type": "string"}}}, True),  # widening
        ("backward", {**OBJ, "properties": {"id": {"type": "string"}, "name": {"type": "string"}}}, False),
        ("backward", {**OBJ, "properties": {"id": {"type": "integer"}}}, True),  # removed
        ("backward", {**OBJ, "required": ["id", "name"]}, False),  # newly required
        ("forward", {**OBJ, "properties": {"id": {"type": "number"}, "name": {"type": "string"}}}, False),
        ("forward", {**OBJ, "required": ["id", "name"]}, True),
        ("full", OBJ, True),
    ],
)
def test_json_schema_reader_writer_modes(mode, new, ok):
    reasons = compat.check(js(OBJ), js(new), mode, "reader_writer")
    assert (reasons == []) is ok, reasons


def test_json_schema_reader_writer_added_optional_property_on_closed_writer():
    closed = {**OBJ, "additionalProperties": False}
    added = {**closed, "properties": {**OBJ["properties"], "email": {"type": "string"}}}
    assert compat.check(js(closed), js(added), "backward", "reader_writer") == []  # added optional property
    assert compat.check(js(closed), js(added), "forward", "reader_writer")  # the old reader refuses email


def obj(props, required):
    return js({"type": "object", "properties": {n: {"type": t} for n, t in props.items()}, "required": required})


S, INT = "string", "integer"


# Danube's rule (the default): a required property removed, an optional one made required,
# a type changed; nothing else.  The cases of Danube's own checker tests, and their edges.
@pytest.mark.parametrize(
    "mode,old,new,reason",
    [
        ("backward", obj({"name": S}, ["name"]), obj({"name": S, "email": S}, ["name"]), None),
        (
            "backward",
            obj({"name": S, "age": INT}, ["name", "age"]),
            obj({"name": S}, ["name"]),
            "required property 'age' removed",
        ),
        (
            "backward",
            obj({"name": S, "age": INT}, ["name"]),
            obj({"name": S, "age": INT}, ["name", "age"]),
            "optional property 'age' made required",
        ),
        ("backward", obj({"id": S}, ["id"]), obj({"id": INT}, ["id"]), "type of property 'id' changed"),
        ("backward", obj({"id": INT}, ["id"]), obj({"id": "number"}, ["id"]), "type of property 'id' changed"),
        (
            "backward",
            obj({"name": S}, ["name"]),
            obj({"name": S, "email": S}, ["name", "email"]),
            None,
        ),  # new + required
        ("forward", obj({"name": S, "nickname": S}, ["name"]), obj({"name": S}, ["name"]), None),
        (
            "forward",
            obj({"name": S}, ["name"]),
            obj({"name": S, "email": S}, ["name", "email"]),
            "required property 'email' added",
        ),
        ("forward", obj({"name": S, "age": INT}, ["name", "age"]), obj({"name": S}, ["name"]), None),
        (
            "full",
            obj({"id": INT, "name": S}, ["id", "name"]),
            obj({"id": INT, "name": S, "description": S}, ["id", "name"]),
            None,
        ),
        (
            "full",
            obj({"id": INT, "name": S}, ["id", "name"]),
            obj({"id": INT}, ["id"]),
            "required property 'name' removed",
        ),
        ("none", obj({"name": S}, ["name"]), obj({"age": INT}, ["age"]), None),
    ],
)
def test_json_schema_danube_rule(mode, old, new, reason):
    reasons = compat.check(old, new, mode)
    assert reasons == compat.check(old, new, mode, "danube")
    if reason is None:
        assert reasons == []
    else:
        assert reasons and reason in reasons[0], reasons


def test_json_schema_danube_rule_ignores_what_it_does_not_check():
    open_ = js({"type": "object", "properties": {"a": {"type": "string"}}})
    closed = js(
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "additionalProperties": False}
    )
    for mode in ("backward", "forward", "full"):
        assert compat.check(open_, closed, mode) == []
    assert compat.check(open_, closed, "backward", "reader_writer")  # the stricter rule sees maxLength
    assert compat.check(js({"type": "array"}), js({"type": "object"}), "full") == []


def test_json_schema_full_reports_backward_reasons_first():
    old, new = obj({"a": S}, ["a"]), obj({"b": S}, ["b"])
    reasons = compat.check(old, new, "full")
    assert reasons and all(r.startswith("backward:") for r in reasons)
    assert compat.check(old, new, "forward") == ["forward: required property 'b' added"]


def test_unknown_json_schema_rule_is_refused():
    with pytest.raises(compat.InvalidSchemaError, match="reader_writer"):
        compat.check(obj({"a": S}, []), obj({"a": S}, []), "backward", "loose")


PROTO_V1 = 'syntax = "proto3"; package p; message User { int64 id = 1; string name = 2; }'


@pytest.mark.parametrize(
    "mode,new,ok",
    [
        (
            "backward",
            'syntax = "proto3"; package p; message User { int64 id = 1; string name = 2; string email = 3; }',
            True,
        ),
        ("backward", 'syntax = "proto3"; package p; message User { int64 id = 1; int32 name = 2; }', False),
        ("backward", 'syntax = "proto3"; package p; message User { int64 id = 1; }', True),
        ("backward", 'syntax = "proto3"; package p; message User { uint64 id = 1; bytes name = 2; }', True),
        ("forward", 'syntax = "proto3"; package p; message User { int64 id = 1; repeated string name = 2; }', False),
        ("full", 'syntax = "proto3"; package p; message User { int64 id = 1; string full_name = 2; }', True),
        ("full", 'syntax = "proto3"; package p; message User { int64 id = 1; double name = 2; }', False),
    ],
)
def test_protobuf_modes(mode, new, ok):
    reasons = compat.check(parse("protobuf", PROTO_V1), parse("protobuf", new), mode)
    assert (reasons == []) is ok, reasons


def test_protobuf_required_and_fingerprint():
    v1 = parse("protobuf", 'syntax = "proto2"; message M { optional int32 a = 1; }')
    v2 = parse("protobuf", 'syntax = "proto2"; message M { optional int32 a = 1; required string b = 2; }')
    assert compat.check(v1, v2, "backward") and compat.check(v1, v2, "forward") == []
    same = parse("protobuf", 'syntax = "proto2";\n\nmessage M {\n  optional int32 a = 1;\n}\n')
    assert same.fingerprint == v1.fingerprint

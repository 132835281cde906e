"""The Avro payload checkers (compiled and pure twin) against fastavro's reader as the oracle."""

from __future__ import annotations

import io
import random

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from danube import message_codec
from danube._pure import avrocheck as pure
from danube.schema.avro_program import compile_avro

try:
    from danube._core import avrocheck as compiled
except ImportError:  # pragma: no cover - DANUBE_NO_EXTENSIONS
    compiled = None

CHECKERS = [pure] + ([compiled] if compiled is not None else [])

SCHEMAS = [
    (
        {
            "type": "record",
            "name": "R",
            "fields": [
                {"name": "id", "type": "long"},
                {"name": "n", "type": "int"},
                {"name": "s", "type": "string"},
                {"name": "b", "type": "bytes"},
                {"name": "f", "type": "float"},
                {"name": "d", "type": "double"},
                {"name": "ok", "type": "boolean"},
                {"name": "nul", "type": "null"},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
                {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
                {"name": "u", "type": ["null", "string", "long"]},
                {"name": "arr", "type": {"type": "array", "items": "string"}},
                {"name": "m", "type": {"type": "map", "values": "long"}},
                {"name": "sub", "type": {"type": "record", "name": "S", "fields": [{"name": "x", "type": "int"}]}},
                {"name": "sub2", "type": "S"},
            ],
        },
        lambda r: {
            "id": r.randint(-(2**63), 2**63 - 1),
            "n": r.randint(-(2**31), 2**31 - 1),
            "s": "".join(r.choice("aé€😀z") for _ in range(r.randint(0, 8))),
            "b": r.randbytes(r.randint(0, 5)),
            "f": r.random(),
            "d": r.random(),
            "ok": r.random() < 0.5,
            "nul": None,
            "e": r.choice("ABC"),
            "fx": r.randbytes(3),
            "u": r.choice([None, "x" * r.randint(0, 3), r.randint(-9, 9)]),
            "arr": ["q" * r.randint(0, 3) for _ in range(r.randint(0, 4))],
            "m": {f"k{i}": r.randint(-5, 5) for i in range(r.randint(0, 3))},
            "sub": {"x": r.randint(-100, 100)},
            "sub2": {"x": 1},
        },
    ),
    (
        {
            "type": "record",
            "name": "Node",
            "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
        },
        lambda r: {"v": 1, "next": {"v": 2, "next": None} if r.random() < 0.5 else None},
    ),
]


def encode(parsed, record) -> bytes:
    b = io.BytesIO()
    schemaless_writer(b, parsed, record)
    return b.getvalue()


def fastavro_accepts(parsed, payload: bytes) -> bool:
    bio = io.BytesIO(payload)
    try:
        schemaless_reader(bio, parsed, None)
    except Exception:  # noqa: BLE001
        return False
    return bio.tell() == len(payload)


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_checker_agrees_with_fastavro(checker, case):
    doc, make = SCHEMAS[case]
    named: dict = {}
    parsed = parse_schema(doc, named_schemas=named, _write_hint=False)
    prog = compile_avro(parsed, named)
    r = random.Random(case)
    for _ in range(300):
        payload = encode(parse_schema(doc), make(r))
        assert checker.check_payload(prog, payload) == -1
        mutated = bytearray(payload)
        kind = r.randrange(3)
        if kind == 0 and mutated:
            del mutated[r.randrange(len(mutated)) :]  # truncated
        elif kind == 1:
            mutated += bytes([r.randrange(256)])  # trailing byte
        elif mutated:
            mutated[r.randrange(len(mutated))] = r.randrange(256)  # flipped byte
        expected = fastavro_accepts(parsed, bytes(mutated))
        assert (checker.check_payload(prog, bytes(mutated)) == -1) == expected, (kind, payload, bytes(mutated))


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda m: m.__name__)
def test_check_frames_names_the_bad_message(checker):
    doc, make = SCHEMAS[0]
    named: dict = {}
    parsed = parse_schema(doc, named_schemas=named, _write_hint=False)
    prog = compile_avro(parsed, named)
    r = random.Random(7)
    good = [encode(parse_schema(doc), make(r)) for _ in range(20)]
    attrs = {"danube.schema": "1:1"}
    buf = message_codec.encode_records([(1, 2, "key" if i % 2 else None, attrs, p) for i, p in enumerate(good)])
    assert checker.check_frames(prog, buf) == (-1, -1)
    bad = list(good)
    bad[13] = good[13][:-1]
    buf = message_codec.encode_records([(1, 2, None, attrs, p) for p in bad])
    index, pos = checker.check_frames(prog, buf)
    assert index == 13 and pos >= 0


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda m: m.__name__)
def test_check_attribute_finds_the_first_untagged_message(checker):
    good = {"x": "1", "danube.schema": "12:3"}
    args = (b"danube.schema", b"12:3")
    records = [(1, 2, "k" if i % 2 else None, dict(good), b"p") for i in range(10)]
    assert checker.check_attribute(message_codec.encode_records(records), *args) == -1
    for i, attrs in (
        (4, {"danube.schema": "12"}),  # no version
        (7, {"x": "2", "danube.schema": "12:2"}),  # another version
        (0, {"danube.schema": "120:3"}),  # another id
        (9, {"danube.schema_": "12:3"}),  # another name
        (5, {}),
    ):
        bad = list(records)
        bad[i] = (1, 2, None, attrs, b"p")
        assert checker.check_attribute(message_codec.encode_records(bad), *args) == i

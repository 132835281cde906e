"""Frames ⇄ Arrow: the data source's row layout, independent of Spark.

Reading turns a buffer of whole frames into one ``pyarrow.RecordBatch`` through
``danube._core.arrowcols`` (Arrow buffers filled in C) or, without the compiled
core, its pure-Python twin built on ``danube.message_codec.decode_columns``.  Writing turns Arrow batches back into frames with
``danube.message_codec.encode_records``.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from danube import _native
from danube.errors import InvalidArgumentError

_columns = _native.load("arrowcols")

SCHEMA_DDL = (
    "topic string, offset long, publish_time timestamp, producer_id long, "
    "routing_key string, attributes map<string,string>, payload binary"
)
COLUMNS = ("topic", "offset", "publish_time", "producer_id", "routing_key", "attributes", "payload")
# column → its Spark type as ``DataType.simpleString()`` reports it (``long`` reads back as ``bigint``)
SPARK_TYPES = {
    "topic": "string",
    "offset": "bigint",
    "publish_time": "timestamp",
    "producer_id": "bigint",
    "routing_key": "string",
    "attributes": "map<string,string>",
    "payload": "binary",
}
TIMESTAMP = pa.timestamp("us", tz="UTC")
ATTRIBUTES = pa.map_(pa.string(), pa.string())
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("offset", pa.int64()),
        ("publish_time", TIMESTAMP),
        ("producer_id", pa.int64()),
        ("routing_key", pa.string()),
        ("attributes", ATTRIBUTES),
        ("payload", pa.binary()),
    ]
)
# columns a writer accepts; ``topic`` and ``offset`` are ignored (the target topic assigns offsets)
WRITABLE = {"payload", "routing_key", "attributes", "publish_time", "producer_id", "topic", "offset"}


def check_read_columns(names_and_types: list[tuple[str, str]]) -> tuple[str, ...]:
    """The columns of a user-given read schema (a subset of :data:`COLUMNS`, any order), checked.

    ``names_and_types`` are ``(column, spark simpleString)`` pairs.  Python data sources
    are not told which columns a query uses, so a narrower schema is how a reader asks for
    fewer columns: unused ones are then neither built nor handed to the JVM.
    """
    expected = SPARK_TYPES
    names = [n for n, _ in names_and_types]
    if not names:
        raise InvalidArgumentError("a danube read schema needs at least one column")
    for name, kind in names_and_types:
        if name not in expected:
            raise InvalidArgumentError(f"the danube data source has no column {name!r}; its columns are {SCHEMA_DDL}")
        if kind != expected[name]:
            raise InvalidArgumentError(f"column {name!r} is {expected[name]} in the danube data source, not {kind}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"a danube read schema names a column twice: {', '.join(names)}")
    return tuple(names)


def frames_to_batch(topic: str, buf, columns: tuple[str, ...] = COLUMNS) -> pa.RecordBatch:
    """A RecordBatch of ``columns`` (default: all, :data:`ARROW_SCHEMA`) from a buffer of whole frames.

    The compiled ``danube._core.arrowcols`` fills Arrow buffers in C (no Python object
    per record); its twin goes through ``message_codec.decode_columns``.  Every frame is checked
    whichever columns are asked for; strings of the columns built are UTF-8-validated by
    Arrow.  Building a column is zero-copy over the decoded buffers.
    """
    c = _columns.decode_arrow_buffers(buf)
    n = c["count"]

    def i32(name):
        return pa.py_buffer(c[name])

    def topic_column():
        return pa.repeat(pa.scalar(topic, pa.string()), n) if n else pa.array([], pa.string())

    def keys_column():
        keys = pa.Array.from_buffers(
            pa.string(),
            n,
            [
                pa.py_buffer(c["key_validity"]) if c["key_nulls"] else None,
                i32("key_offsets"),
                pa.py_buffer(c["key_data"]),
            ],
            null_count=c["key_nulls"],
        )
        keys.validate(full=True)  # UTF-8 as the frame format promises
        return keys

    def attributes_column():
        m = len(c["name_offsets"]) // 4 - 1
        names = pa.Array.from_buffers(pa.string(), m, [None, i32("name_offsets"), pa.py_buffer(c["name_data"])])
        values = pa.Array.from_buffers(pa.string(), m, [None, i32("value_offsets"), pa.py_buffer(c["value_data"])])
        names.validate(full=True)
        values.validate(full=True)
        return pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), n + 1, [None, i32("attr_offsets")]), names, values
        )

    builders = {
        "topic": topic_column,
        "offset": lambda: pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(c["offset"])]),
        "publish_time": lambda: pa.Array.from_buffers(TIMESTAMP, n, [None, pa.py_buffer(c["publish_us"])]),
        "producer_id": lambda: pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(c["producer_id"])]),
        "routing_key": keys_column,
        "attributes": attributes_column,
        "payload": lambda: pa.Array.from_buffers(
            pa.binary(), n, [None, i32("payload_offsets"), pa.py_buffer(c["payload_data"])]
        ),
    }
    schema = ARROW_SCHEMA if columns == COLUMNS else pa.schema([ARROW_SCHEMA.field(name) for name in columns])
    return pa.RecordBatch.from_arrays([builders[name]() for name in columns], schema=schema)


def filter_batch(
    batch: pa.RecordBatch,
    *,
    start_offset: int | None,
    end_offset: int | None,
    start_time_ms: int | None,
    end_time_ms: int | None,
) -> pa.RecordBatch:
    """Rows with start_offset ≤ offset < end_offset and start_time ≤ publish_time < end_time."""
    mask = None

    def both(a, b):
        return b if a is None else pc.and_(a, b)

    if start_offset is not None:
        mask = both(mask, pc.greater_equal(batch.column("offset"), start_offset))
    if end_offset is not None:
        mask = both(mask, pc.less(batch.column("offset"), end_offset))
    if start_time_ms is not None or end_time_ms is not None:
        micros = batch.column("publish_time").cast(pa.int64())
        if start_time_ms is not None:
            mask = both(mask, pc.greater_equal(micros, start_time_ms * 1000))
        if end_time_ms is not None:
            mask = both(mask, pc.less(micros, end_time_ms * 1000))
    return batch if mask is None else batch.filter(mask)


# ---------------------------------------------------------------- writing


def check_writable_schema(names_and_types: list[tuple[str, str]]) -> None:
    """Reject DataFrames the writer cannot store, naming the offending column.

    ``names_and_types`` are ``(column, spark simpleString)`` pairs.
    """
    names = {n for n, _ in names_and_types}
    unknown = sorted(names - WRITABLE)
    if unknown:
        raise InvalidArgumentError(
            f"cannot write column(s) {', '.join(unknown)} to a danube topic; select from "
            f"{', '.join(sorted(WRITABLE))} (payload required)"
        )
    if "payload" not in names:
        raise InvalidArgumentError("a danube topic write needs a 'payload' column (binary or string)")
    expected = {
        "payload": ("binary", "string"),
        "routing_key": ("string",),
        "attributes": ("map<string,string>",),
        "publish_time": ("timestamp", "timestamp_ntz", "bigint"),
        "producer_id": ("bigint", "int"),
    }
    for name, kind in names_and_types:
        if name in expected and kind not in expected[name]:
            raise InvalidArgumentError(
                f"column {name!r} has type {kind}; the danube writer expects {' or '.join(expected[name])}"
            )


def batch_to_records(batch: pa.RecordBatch, *, default_publish_time_ms: int | None = None) -> list[tuple]:
    """``(publish_time_ms, producer_id, key, attributes, payload)`` tuples for ``message_codec.encode_records``."""
    n = batch.num_rows
    names = batch.schema.names
    now_ms = int(time.time() * 1000) if default_publish_time_ms is None else default_publish_time_ms
    payload_col = batch.column("payload")
    if payload_col.null_count:
        first_null = pc.index(pc.is_null(payload_col), True).as_py()
        raise InvalidArgumentError(
            f"row {first_null} of the batch has a null payload; write an empty payload (b'') instead"
        )
    if pa.types.is_string(payload_col.type) or pa.types.is_large_string(payload_col.type):
        payloads = [p.encode("utf-8") for p in payload_col.to_pylist()]
    else:
        payloads = payload_col.to_pylist()
    if "publish_time" in names:
        col = batch.column("publish_time")
        if pa.types.is_timestamp(col.type):
            unit = col.type.unit
            divisor = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
            raw = col.cast(pa.int64())
            ms = (pc.multiply(raw, 1000) if divisor is None else pc.divide(raw, divisor)).to_pylist()
        else:
            ms = col.to_pylist()
        times = [now_ms if t is None else int(t) for t in ms]
        if any(t < 0 for t in times):
            raise InvalidArgumentError("publish_time before 1970 cannot be stored in a frame")
    else:
        times = [now_ms] * n
    producers = batch.column("producer_id").to_pylist() if "producer_id" in names else [0] * n
    producers = [0 if p is None else p for p in producers]
    if any(p < 0 for p in producers):
        raise InvalidArgumentError("producer_id must be ≥ 0")
    keys = batch.column("routing_key").to_pylist() if "routing_key" in names else [None] * n
    if "attributes" in names:
        attrs: list[Any] = [dict(a) if a else {} for a in batch.column("attributes").to_pylist()]
        for a in attrs:
            if any(v is None for v in a.values()):
                raise InvalidArgumentError("attribute values must not be null")
    else:
        attrs = [None] * n
    return list(zip(times, producers, keys, attrs, payloads))

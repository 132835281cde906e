"""Test data for the Spark tests: segments written by the storage code, rows compared exactly."""

from __future__ import annotations

from danube import message_codec
from danube.storage import segment as seg


def make_records(base: int, count: int, *, t0: int = 1_700_000_000_000, step_ms: int = 10):
    """``(publish_time, producer_id, key, attributes, payload)`` with keys, no keys, attributes, unicode."""
    out = []
    for i in range(count):
        n = base + i
        key = None if n % 7 == 0 else f"key-{n % 5}"
        attrs = {"n": str(n), "region": "eu-ß"} if n % 3 == 0 else {}
        payload = b"" if n % 11 == 0 else (f"payload-{n}-" + "x" * (n % 200)).encode()
        out.append((t0 + n * step_ms, 40 + n % 3, key, attrs, payload))
    return out


def write_history(backend, topic: str, segments, **record_kwargs):
    """Write ``segments`` (``(base, count)`` pairs) with ``segment.write_segment``; return descriptors, rows."""
    descriptors, rows = [], []
    for base, count in segments:
        records = make_records(base, count, **record_kwargs)
        data = message_codec.encode_records(records, base_offset=base)
        descriptors.append(seg.write_segment(backend, topic, data))
        rows.extend(expected_row(topic, base + i, r) for i, r in enumerate(records))
    return descriptors, rows


def expected_row(topic, offset, record):
    publish_time, producer_id, key, attrs, payload = record
    return (topic, offset, publish_time, producer_id, key, dict(attrs or {}), bytes(payload))


def collect_rows(df):
    """Rows as plain tuples, publish_time as epoch milliseconds (time-zone independent)."""
    out = []
    for r in (
        df.selectExpr(
            "topic", "offset", "unix_millis(publish_time) AS t", "producer_id", "routing_key", "attributes", "payload"
        )
        .orderBy("topic", "offset")
        .collect()
    ):
        out.append((r.topic, r.offset, r.t, r.producer_id, r.routing_key, dict(r.attributes or {}), bytes(r.payload)))
    return out

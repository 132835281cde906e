"""Compiled codec against its pure-Python twin on random and damaged batches.

Same bytes out of every encoder; same results, or the same error type, message
and fields, out of every decoder, validator and scanner.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import danube._pure.frame as pure

try:
    import danube._core.frame as compiled
except ImportError:
    pytest.skip("danube._core.frame not built", allow_module_level=True)

U64 = st.integers(min_value=0, max_value=2**64 - 1)
TEXT = st.text(max_size=10)
RECORDS = st.lists(
    st.tuples(U64, U64, st.none() | TEXT, st.none() | st.dictionaries(TEXT, TEXT, max_size=3), st.binary(max_size=80)),
    min_size=1,
    max_size=10,
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(call, *args, **kwargs):
    """What a call did: its (normalised) result, or the error with every field."""
    try:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):
            result = list(result)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        fields = {k: getattr(exc, k, None) for k in ("position", "offset", "expected_crc", "actual_crc")}
        return ("error", type(exc), str(exc), fields)
    return ("ok", normalise(result))


def normalise(value):
    if isinstance(value, memoryview):
        return ("memoryview", bytes(value))
    if isinstance(value, (list, tuple)):
        return type(value), [normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    return value


def assert_same_everywhere(buf, start=0, expected=-1):
    """Every read-side function gives the same outcome on both twins."""
    calls = [
        ("validate", (buf,), {}),
        ("validate", (buf, expected, True), {}),
        ("scan", (buf, start, expected, 64), {}),
        ("decode_batch", (buf,), {}),
        ("iter_records", (buf,), {}),
        ("decode_columns", (buf,), {}),
        ("decode_frame", (buf, start), {}),
        ("frame_positions", (buf,), {}),
        ("frames_within", (buf, 3, 100), {}),
        ("frames_within", (buf, 1 << 30, len(buf)), {}),
        ("routing_keys", (buf,), {}),
        ("find_offset", (buf, expected, start), {}),
        ("crc32c", (buf,), {}),
    ]
    for name, args, kwargs in calls:
        assert outcome(getattr(compiled, name), *args, **kwargs) == outcome(getattr(pure, name), *args, **kwargs), name
    a, b = bytearray(buf), bytearray(buf)
    assert outcome(compiled.stamp_offsets, a, 1000) == outcome(pure.stamp_offsets, b, 1000)
    assert a == b


@SETTINGS
@given(records=RECORDS, base=U64)
def test_encode_records_byte_identical(records, base):
    assert outcome(compiled.encode_records, records, base_offset=base) == outcome(
        pure.encode_records, records, base_offset=base
    )


@SETTINGS
@given(
    payloads=st.lists(st.binary(max_size=120), max_size=12),
    base=st.integers(0, 2**63),
    t=U64,
    pid=U64,
    key=st.none() | TEXT,
    attrs=st.none() | st.dictionaries(TEXT, TEXT, max_size=2),
)
def test_encode_payloads_and_record_byte_identical(payloads, base, t, pid, key, attrs):
    kwargs = dict(publish_time=t, producer_id=pid, key=key, attributes=attrs)
    assert compiled.encode_payloads(payloads, base_offset=base, **kwargs) == pure.encode_payloads(
        payloads, base_offset=base, **kwargs
    )
    for p in payloads[:2]:
        assert compiled.encode_record(p, offset=base, **kwargs) == pure.encode_record(p, offset=base, **kwargs)


@SETTINGS
@given(records=RECORDS, base=st.integers(0, 2**40), data=st.data())
def test_valid_batches_read_the_same(records, base, data):
    batch = pure.encode_records(records, base_offset=base)
    expected = data.draw(st.sampled_from([-1, base, base + 1]))
    start = data.draw(st.sampled_from([0] + pure.frame_positions(batch)))
    assert_same_everywhere(batch, start, expected)


@SETTINGS
@given(records=RECORDS, data=st.data())
def test_flipped_bits_read_the_same(records, data):
    batch = bytearray(pure.encode_records(records, base_offset=7))
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, len(batch) * 8 - 1))
        batch[bit // 8] ^= 1 << (bit % 8)
    assert_same_everywhere(bytes(batch), 0, 7)


@SETTINGS
@given(records=RECORDS, data=st.data())
def test_truncations_read_the_same(records, data):
    batch = pure.encode_records(records, base_offset=7)
    cut = data.draw(st.integers(0, len(batch)))
    assert_same_everywhere(batch[:cut], 0, 7)
    assert_same_everywhere(batch[cut:], 0, 7)


@SETTINGS
@given(records=RECORDS, garbage=st.binary(min_size=1, max_size=40), where=st.sampled_from(["before", "after"]))
def test_garbage_reads_the_same(records, garbage, where):
    batch = pure.encode_records(records, base_offset=7)
    assert_same_everywhere(garbage + batch if where == "before" else batch + garbage, 0, 7)


@SETTINGS
@given(buf=st.binary(max_size=200))
def test_random_bytes_read_the_same(buf):
    assert_same_everywhere(buf)


@SETTINGS
@given(records=RECORDS, zeros=st.integers(1, 40))
def test_zero_filled_tail_scans_the_same(records, zeros):
    batch = pure.encode_records(records, base_offset=7) + bytes(zeros)
    assert_same_everywhere(batch, 0, 7)


def test_outcome_tells_errors_apart():
    batch = bytearray(pure.encode_payloads([b"abc"], base_offset=1))
    batch[-1] ^= 1
    kind, error_type, message, fields = outcome(compiled.validate, bytes(batch))
    assert (kind, error_type.__name__, fields["position"], fields["offset"]) == ("error", "CorruptFrameError", 0, 1)
    assert "checksum mismatch" in message
    assert outcome(pure.validate, bytes(batch)) != outcome(pure.validate, bytes(batch[:-1]))


def test_body_layout_errors_read_the_same():
    bodies = [
        struct.pack("<QQBBHH", 0, 0, 2, 0, 0, 0),
        struct.pack("<QQBBHH", 0, 0, 0, 0, 0, 2) + b"ab",
        struct.pack("<QQBBHH", 0, 0, 1, 0, 0, 5) + b"ab",
        struct.pack("<QQBBHH", 0, 0, 0, 0, 1, 0) + b"\x01",
        struct.pack("<QQBBHH", 0, 0, 1, 0, 0, 1) + b"\xff",
    ]
    good = pure.encode_payloads([b"ok"], base_offset=3)
    for body in bodies:
        len_field = struct.pack("<I", len(body))
        frame = struct.pack("<QI", 4, pure.crc32c(len_field + body)) + len_field + body
        assert_same_everywhere(good + frame, 0, 3)

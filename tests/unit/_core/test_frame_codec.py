"""The frame codec on its own: round trips, the byte layout, bad inputs.

Runs against both implementations (the compiled one when it is built) so the
pure twin stays a faithful reference.
"""

from __future__ import annotations

import array
import importlib
import mmap
import os
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import danube._pure.frame as pure
from danube.errors import CorruptFrameError, FrameFormatError

try:
    compiled = importlib.import_module("danube._core.frame")
except ImportError:  # pure-only build: only the twin's half of the suite runs
    compiled = None

IMPLS = [
    pytest.param(pure, id="pure"),
    pytest.param(
        compiled, id="compiled", marks=pytest.mark.skipif(compiled is None, reason="danube._core.frame not built")
    ),
]
needs_compiled = pytest.mark.skipif(compiled is None, reason="danube._core.frame not built")

U64 = st.integers(min_value=0, max_value=2**64 - 1)
TEXT = st.text(max_size=12)
RECORDS = st.lists(
    st.tuples(U64, U64, st.none() | TEXT, st.dictionaries(TEXT, TEXT, max_size=3), st.binary(max_size=64)),
    max_size=8,
)


@pytest.fixture(params=IMPLS, scope="module")
def codec(request):
    return request.param


def _records(t_pid_key_attrs_payload, base):
    return [
        pure.Record(base + i, t, pid, key, dict(attrs), payload)
        for i, (t, pid, key, attrs, payload) in enumerate(t_pid_key_attrs_payload)
    ]


def _plain(records):
    return [r._replace(payload=bytes(r.payload)) for r in records]


# ---------------------------------------------------------------- CRC32C


@pytest.mark.parametrize(
    "data, crc", [(b"", 0), (b"123456789", 0xE3069283), (b"\x00" * 32, 0x8A9136AA), (b"\xff" * 32, 0x62A8AB43)]
)
def test_crc32c_known_values(codec, data, crc):
    assert codec.crc32c(data) == crc


def test_crc32c_continues_a_previous_value(codec):
    data = os.urandom(300)
    assert codec.crc32c(data[100:], codec.crc32c(data[:100])) == codec.crc32c(data)


@needs_compiled
def test_crc32c_implementations_agree_on_every_block_boundary():
    impls = ["slicing-by-8"] + (["sse4.2"] if compiled.crc32c_implementation() == "sse4.2" else [])
    data = os.urandom(3 * 4096 * 2 + 3 * 256 + 3 * 64 + 17)
    lengths = list(range(0, 200)) + [191, 192, 193, 767, 768, 769, 1050, 12287, 12288, 12289, len(data)]
    for n in lengths:
        for start in (0, 1, 5):
            chunk = data[start : start + n]
            expected = pure.crc32c(chunk) if n < 2000 else compiled._crc32c_with("slicing-by-8", chunk)
            for impl in impls:
                assert compiled._crc32c_with(impl, chunk, 0) == expected, (impl, n, start)
                assert compiled._crc32c_with(impl, chunk, 0x12345678) == compiled._crc32c_with(
                    "slicing-by-8", chunk, 0x12345678
                )


@needs_compiled
def test_crc32c_environment_variable_forces_the_portable_path():
    code = (
        "import danube._core.frame as f, danube._pure.frame as p, os; d = os.urandom(5000);"
        "print(f.crc32c_implementation(), f.crc32c(d) == p.crc32c(d))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DANUBE_CRC32C": "portable"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["slicing-by-8", "True"]


@needs_compiled
def test_crc32c_implementation_names():
    assert compiled.crc32c_implementation() in ("sse4.2", "slicing-by-8")
    assert pure.crc32c_implementation() == "python"
    with pytest.raises(ValueError):
        compiled._crc32c_with("crc-by-hand", b"x")


def test_crc32c_rejects_non_buffers(codec):
    with pytest.raises(TypeError):
        codec.crc32c("text")


# ---------------------------------------------------------------- byte layout


def test_layout_of_one_frame_byte_by_byte(codec):
    frame = codec.encode_record(
        b"PAY", offset=7, publish_time=0x0102030405060708, producer_id=9, key="k", attributes={"a": "bc"}
    )
    body = (
        struct.pack("<QQBBHH", 0x0102030405060708, 9, 1, 0, 1, 1)
        + b"k"
        + struct.pack("<H", 1)
        + b"a"
        + struct.pack("<I", 2)
        + b"bc"
        + b"PAY"
    )
    len_field = struct.pack("<I", len(body))
    assert frame == struct.pack("<Q", 7) + struct.pack("<I", pure.crc32c(len_field + body)) + len_field + body
    assert codec.HEADER_SIZE == 16 and codec.MIN_BODY == 22 and codec.MAX_BODY == 256 * 1024 * 1024
    assert (codec.SCAN_END, codec.SCAN_ZERO, codec.SCAN_TORN, codec.SCAN_CORRUPT) == (0, 1, 2, 3)


def test_key_absent_versus_empty(codec):
    batch = codec.encode_records([(0, 0, None, None, b""), (0, 0, "", None, b"")])
    assert [r.routing_key for r in codec.decode_batch(batch)] == [None, ""]
    assert codec.routing_keys(batch) == [None, ""]


# ---------------------------------------------------------------- round trips


@settings(max_examples=60, deadline=None)
@given(records=RECORDS, base=st.integers(min_value=0, max_value=2**40))
def test_round_trip_records(codec, records, base):
    batch = codec.encode_records(records, base_offset=base)
    expected = _records(records, base)
    assert _plain(codec.decode_batch(batch)) == expected
    assert _plain(list(codec.iter_records(batch))) == expected
    assert codec.validate(batch, base, True) == (
        (len(records), base, base + len(records) - 1) if records else (0, -1, -1)
    )
    cols = codec.decode_columns(batch)
    assert cols["payload"] == [bytes(p) for *_, p in records]
    assert cols["offset"] == [r.offset for r in expected]
    positions = codec.frame_positions(batch)
    assert len(positions) == len(records)
    for i, pos in enumerate(positions):
        assert codec.find_offset(batch, base + i) == pos
        record, next_pos = codec.decode_frame(batch, pos)
        assert _plain([record]) == [expected[i]]
        assert next_pos == (positions[i + 1] if i + 1 < len(positions) else len(batch))
    assert codec.routing_keys(batch) == [r.routing_key for r in expected]


@settings(max_examples=40, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=200), max_size=20),
    key=st.none() | TEXT,
    attrs=st.none() | st.dictionaries(TEXT, TEXT, max_size=2),
    t=U64,
    pid=U64,
)
def test_encode_payloads_equals_encode_records(codec, payloads, key, attrs, t, pid):
    fast = codec.encode_payloads(payloads, base_offset=5, publish_time=t, producer_id=pid, key=key, attributes=attrs)
    general = codec.encode_records([(t, pid, key, attrs, p) for p in payloads], base_offset=5)
    assert fast == general
    assert isinstance(fast, bytes)


def test_payload_types(codec):
    as_bytes = codec.encode_payloads([b"abc", b"xyz"])
    assert codec.encode_payloads([bytearray(b"abc"), memoryview(b"xyz")]) == as_bytes
    assert codec.encode_payloads((p for p in [b"abc", b"xyz"])) == as_bytes
    assert codec.encode_payloads([memoryview(b"aXbXc")[::2], b"xyz"]) == as_bytes  # non-contiguous
    with pytest.raises(TypeError, match="bytes-like"):  # bytes() would accept it; a payload must be bytes-like
        codec.encode_payloads([[97, 98, 99], b"xyz"])
    with pytest.raises(TypeError):
        codec.encode_payloads(["text"])


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "array", "mmap"])
def test_any_buffer_is_accepted(codec, kind, tmp_path):
    batch = codec.encode_payloads([b"x" * 10, b"y" * 30], base_offset=3)
    if kind == "array":  # 4-byte items: 16 + 32 + 16 + 52 bytes is a multiple of 4
        buf = array.array("I")
        buf.frombytes(batch)
    elif kind == "mmap":
        path = tmp_path / "batch"
        path.write_bytes(batch)
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    else:
        buf = {"bytes": bytes, "bytearray": bytearray, "memoryview": memoryview}[kind](batch)
    assert codec.validate(buf) == (2, 3, 4)
    assert codec.scan(buf)[:5] == (2, len(batch), 3, 4, codec.SCAN_END)
    assert [bytes(r.payload) for r in codec.decode_batch(buf)] == [b"x" * 10, b"y" * 30]
    assert codec.crc32c(buf) == pure.crc32c(batch)
    del buf


def test_large_batches_take_the_gil_free_paths(codec):
    payloads = [os.urandom(1000) for _ in range(70)]  # > 64 KiB
    batch = codec.encode_payloads(payloads, base_offset=1)
    assert len(batch) > 64 * 1024
    assert batch == pure.encode_payloads(payloads, base_offset=1)
    assert codec.validate(batch, 1, True) == (70, 1, 70)
    count, end, first, last, reason, index = codec.scan(batch, index_every=16 * 1024)
    assert (count, end, first, last, reason) == (70, len(batch), 1, 70, codec.SCAN_END)
    assert index[0] == (1, 0) and len(index) == 5
    writable = bytearray(batch)
    assert codec.stamp_offsets(writable, 1000) == 70
    assert codec.validate(writable, 1000, True) == (70, 1000, 1069)
    assert codec.crc32c(batch) == pure.crc32c(batch)


# ---------------------------------------------------------------- stamping


def test_stamp_offsets_rewrites_headers_only(codec):
    batch = bytearray(codec.encode_payloads([b"a", b"bb", b"ccc"]))
    assert codec.stamp_offsets(batch, 40) == 3
    assert [r.offset for r in codec.decode_batch(batch)] == [40, 41, 42]
    assert codec.stamp_offsets(bytearray(), 5) == 0


def test_stamp_offsets_needs_a_writable_buffer(codec):
    with pytest.raises(TypeError, match="writable"):
        codec.stamp_offsets(codec.encode_payloads([b"a"]), 0)


def test_stamp_offsets_leaves_a_bad_batch_unchanged(codec):
    good = codec.encode_payloads([b"a", b"bb"])
    for bad in (bytearray(good + b"\x01\x02"), bytearray(good[:-1])):
        before = bytes(bad)
        with pytest.raises(FrameFormatError):
            codec.stamp_offsets(bad, 77)
        assert bytes(bad) == before
    overflow = bytearray(good)
    with pytest.raises(OverflowError):
        codec.stamp_offsets(overflow, 2**64 - 1)
    assert overflow == good
    assert codec.stamp_offsets(bytearray(good), 2**64 - 2) == 2


# ---------------------------------------------------------------- bad inputs


def test_encode_rejects_oversized_fields(codec):
    with pytest.raises(FrameFormatError, match="routing key"):
        codec.encode_record(b"", key="k" * 65536)
    with pytest.raises(FrameFormatError, match="attribute name"):
        codec.encode_record(b"", attributes={"n" * 65536: "v"})
    with pytest.raises(FrameFormatError, match="more than 65535 attributes"):
        codec.encode_record(b"", attributes={str(i): "" for i in range(65536)})
    with pytest.raises(OverflowError):
        codec.encode_payloads([b"a", b"b"], base_offset=2**64 - 1)
    with pytest.raises(OverflowError):
        codec.encode_record(b"", offset=-1)


def test_encode_rejects_a_body_over_max_body(codec):
    big = memoryview(bytearray(codec.MAX_BODY - 21))
    with pytest.raises(FrameFormatError, match="exceeds"):
        codec.encode_payloads([big])


def test_checksum_mismatch_carries_position_offset_and_both_crcs(codec):
    batch = bytearray(codec.encode_payloads([b"first", b"second"], base_offset=10))
    second = codec.frame_positions(batch)[1]
    batch[-1] ^= 0x40
    with pytest.raises(CorruptFrameError) as info:
        codec.validate(batch)
    err = info.value
    assert (err.position, err.offset) == (second, 11)
    assert err.expected_crc == struct.unpack_from("<I", batch, second + 8)[0]
    assert err.actual_crc == pure.crc32c(bytes(batch[second + 12 :]))
    assert err.expected_crc != err.actual_crc


def test_truncated_batch(codec):
    batch = codec.encode_payloads([b"first", b"second"])
    for cut in (1, 15, 16, 20, len(batch) - 1):
        with pytest.raises(CorruptFrameError, match="ends inside a frame"):
            codec.validate(batch[:cut] if cut > 16 else batch[:cut])
        assert codec.decode_frame(batch[:cut], 0) == (None, 0) or cut > len(batch) // 2
    assert codec.decode_frame(batch, len(batch)) == (None, len(batch))


def test_bad_body_length_is_corrupt(codec):
    frame = bytearray(codec.encode_record(b"x"))
    struct.pack_into("<I", frame, 12, 5)
    with pytest.raises(CorruptFrameError, match="invalid body length 5"):
        codec.decode_frame(frame)
    with pytest.raises(FrameFormatError, match="invalid body length"):
        codec.frame_positions(frame)


def _reframe(codec, body: bytes) -> bytes:
    """A frame with a valid checksum around an arbitrary body."""
    len_field = struct.pack("<I", len(body))
    return struct.pack("<Q", 0) + struct.pack("<I", pure.crc32c(len_field + body)) + len_field + body


@pytest.mark.parametrize(
    "fixed, rest, message",
    [
        ((0, 0, 2, 0, 0, 0), b"", "unknown flags"),
        ((0, 0, 0, 1, 0, 0), b"", "unknown flags"),
        ((0, 0, 0, 0, 0, 3), b"abc", "key length without key flag"),
        ((0, 0, 1, 0, 0, 9), b"abc", "routing key overruns"),
        ((0, 0, 0, 0, 1, 0), b"\x05", "attributes overrun"),
        ((0, 0, 0, 0, 1, 0), b"\x01\x00a\x09\x00", "attributes overrun"),
        ((0, 0, 0, 0, 1, 0), b"\x01\x00a\x09\x00\x00\x00xy", "attributes overrun"),
    ],
)
def test_bad_body_layout_with_a_valid_checksum(codec, fixed, rest, message):
    frame = _reframe(codec, struct.pack("<QQBBHH", *fixed) + rest)
    for call in (codec.validate, codec.decode_batch, codec.decode_columns, lambda b: codec.decode_frame(b)):
        with pytest.raises(FrameFormatError, match=message):
            call(frame)
    assert codec.scan(frame)[4] == codec.SCAN_CORRUPT


def test_invalid_utf8_key_is_reported_on_decode(codec):
    frame = _reframe(codec, struct.pack("<QQBBHH", 0, 0, 1, 0, 0, 1) + b"\xff")
    assert codec.validate(frame) == (1, 0, 0)
    with pytest.raises(UnicodeDecodeError):
        codec.decode_batch(frame)


def test_sequence_checks(codec):
    batch = bytearray(codec.encode_payloads([b"a", b"b", b"c"], base_offset=5))
    with pytest.raises(CorruptFrameError, match="first offset 5, expected 6"):
        codec.validate(batch, 6)
    codec.stamp_offsets(batch, 5)
    struct.pack_into("<Q", batch, codec.frame_positions(batch)[2], 9)
    assert codec.validate(batch) == (3, 5, 9)
    with pytest.raises(CorruptFrameError, match="offset 9 does not follow 6") as info:
        codec.validate(batch, check_sequence=True)
    assert info.value.offset == 9


def test_scan_reasons(codec):
    batch = codec.encode_payloads([b"a" * 10, b"b" * 10, b"c" * 10], base_offset=3)
    n = len(batch)
    assert codec.scan(batch)[:5] == (3, n, 3, 5, codec.SCAN_END)
    assert codec.scan(batch + bytes(100))[:5] == (3, n, 3, 5, codec.SCAN_ZERO)
    assert codec.scan(batch[:-4])[:5] == (2, codec.frame_positions(batch)[2], 3, 4, codec.SCAN_TORN)
    assert codec.scan(batch + b"\x01" * 40)[:5] == (3, n, 3, 5, codec.SCAN_TORN)  # 16 MiB body_len
    assert codec.scan(batch + b"\x01" * 12 + b"\x05\x00\x00\x00")[:5] == (3, n, 3, 5, codec.SCAN_CORRUPT)
    assert codec.scan(batch, expected_first_offset=4)[:5] == (0, 0, -1, -1, codec.SCAN_CORRUPT)
    second = codec.frame_positions(batch)[1]
    assert codec.scan(batch, start=second)[:5] == (2, n, 4, 5, codec.SCAN_END)
    assert codec.scan(batch, start=n + 10) == (0, n + 10, -1, -1, codec.SCAN_END, [])
    assert codec.scan(b"") == (0, 0, -1, -1, codec.SCAN_END, [])
    with pytest.raises(ValueError):
        codec.scan(batch, start=-1)


def test_find_offset_edges(codec):
    batch = codec.encode_payloads([b"a", b"b"], base_offset=10)
    assert codec.find_offset(batch, 9) == -1
    assert codec.find_offset(batch, 12) == -1
    assert codec.find_offset(batch, -5) == -1
    assert codec.find_offset(batch, 2**70) == -1
    assert codec.find_offset(batch, 11, start=codec.frame_positions(batch)[1]) > 0
    with pytest.raises(ValueError):
        codec.find_offset(batch, 10, start=-1)


def test_non_buffers_are_type_errors(codec):
    for call in (codec.validate, codec.scan, codec.decode_batch, codec.frame_positions, codec.routing_keys):
        with pytest.raises(TypeError):
            call(12345)
    with pytest.raises(ValueError):
        codec.decode_frame(b"", -1)


@pytest.mark.parametrize("bad", [5, "text", None, [1, 2, 3]])
def test_non_bytes_payload_is_refused_by_both_codecs(bad):
    # bytes(5) would silently store five zero bytes; both twins must refuse it instead
    from danube._core import frame as compiled
    from danube._pure import frame as pure

    for codec in (compiled, pure):
        with pytest.raises(TypeError, match="bytes-like"):
            codec.encode_record(bad)
        with pytest.raises(TypeError, match="bytes-like"):
            codec.encode_payloads([b"ok", bad])

"""danube._core.arrowcols against its pure-Python twin, and both against the frame codec."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube._pure import arrowcols as pure
from danube._pure import frame as pure_frame
from danube.errors import CorruptFrameError, FrameFormatError

compiled = pytest.importorskip("danube._core.arrowcols", reason="compiled core not built")

text = st.text(max_size=12)
record = st.tuples(
    st.integers(0, 2**40),
    st.integers(0, 2**63 - 1),
    st.one_of(st.none(), text),
    st.dictionaries(text, text, max_size=3),
    st.binary(max_size=64),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(record, max_size=25), st.integers(0, 2**40))
def test_compiled_equals_pure_equals_codec(records, base):
    buf = pure_frame.encode_records(records, base_offset=base)
    got = compiled.decode_arrow_buffers(buf)
    assert got == pure.decode_arrow_buffers(buf)
    n = got["count"]
    assert n == len(records)
    assert list(struct.unpack(f"<{n}q", got["offset"])) == list(range(base, base + n))
    assert list(struct.unpack(f"<{n}q", got["publish_us"])) == [r[0] * 1000 for r in records]
    payload_offsets = struct.unpack(f"<{n + 1}i", got["payload_offsets"])
    payloads = [bytes(got["payload_data"][a:b]) for a, b in zip(payload_offsets, payload_offsets[1:])]
    assert payloads == [r[4] for r in records]
    assert got["key_nulls"] == sum(1 for r in records if r[2] is None)


def test_corruption_raises_like_the_codec():
    buf = bytearray(pure_frame.encode_records([(1, 2, "k", {"a": "b"}, b"payload")] * 3))
    buf[-3] ^= 0x40
    for impl in (compiled, pure):
        with pytest.raises(CorruptFrameError) as err:
            impl.decode_arrow_buffers(bytes(buf))
        assert err.value.offset == 2 and err.value.expected_crc != err.value.actual_crc


def test_values_outside_spark_types_are_clear_errors():
    too_big_producer = pure_frame.encode_records([(1, 2**63, None, {}, b"x")])
    too_late = pure_frame.encode_records([(2**63 // 1000 + 1, 1, None, {}, b"x")])
    for impl in (compiled, pure):
        with pytest.raises(FrameFormatError, match="producer id"):
            impl.decode_arrow_buffers(too_big_producer)
        with pytest.raises(FrameFormatError, match="publish_time"):
            impl.decode_arrow_buffers(too_late)


def test_empty_buffer():
    for impl in (compiled, pure):
        out = impl.decode_arrow_buffers(b"")
        assert out["count"] == 0 and out["payload_offsets"] == bytearray(4)

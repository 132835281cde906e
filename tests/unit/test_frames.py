"""The public codec module ``danube.frames``: the right implementation, the whole API."""

from __future__ import annotations

import os

import pytest

import danube._pure.frame as pure
from danube import _native, frames
from danube.errors import CorruptFrameError


def test_exposes_the_whole_api():
    for name in frames.__all__:
        assert getattr(frames, name) is getattr(frames._impl, name), name
    assert set(frames.__all__) <= set(dir(pure))


def test_uses_the_compiled_core_unless_forced_off():
    if _native.extensions_forced_off():
        assert frames._impl is pure
        assert frames.crc32c_implementation() == "python"
    else:
        pytest.importorskip("danube._core.frame")
        assert frames._impl.__name__ == "danube._core.frame"
        assert frames._impl.__file__.endswith((".so", ".pyd"))
        assert frames.crc32c_implementation() in ("sse4.2", "slicing-by-8")
        if os.environ.get("DANUBE_CRC32C") != "portable":
            assert frames.crc32c_implementation() == frames._impl.crc32c_implementation()


def test_records_are_the_pure_named_tuple():
    batch = frames.encode_payloads([b"hello"], base_offset=3, publish_time=9, key="k")
    (record,) = frames.decode_batch(batch)
    assert frames.Record is pure.Record
    assert type(record) is pure.Record
    assert record == pure.Record(3, 9, 0, "k", {}, b"hello")
    assert record.payload.obj is batch or bytes(record.payload) == b"hello"


def test_publish_path_validate_stamp_decode():
    batch = bytearray(frames.encode_payloads([b"a" * 100] * 10))
    assert frames.validate(batch) == (10, 0, 9)
    assert frames.stamp_offsets(batch, 500) == 10
    assert frames.validate(batch, 500, True) == (10, 500, 509)
    assert [r.offset for r in frames.iter_records(batch)] == list(range(500, 510))
    assert frames.find_offset(batch, 505) == 5 * (16 + 22 + 100)
    batch[-1] ^= 0xFF
    with pytest.raises(CorruptFrameError) as info:
        frames.validate(batch)
    assert info.value.offset == 509 and info.value.actual_crc != info.value.expected_crc

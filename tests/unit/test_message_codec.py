"""The public codec module ``danube.message_codec``: the right implementation, the whole API."""

from __future__ import annotations

import os

import pytest

import danube._pure.frame as pure
from danube import _native, message_codec
from danube.errors import CorruptFrameError


def test_exposes_the_whole_api():
    for name in message_codec.__all__:
        assert getattr(message_codec, name) is getattr(message_codec._impl, name), name
    assert set(message_codec.__all__) <= set(dir(pure))


def test_uses_the_compiled_core_unless_forced_off():
    if _native.extensions_forced_off():
        assert message_codec._impl is pure
        assert message_codec.crc32c_implementation() == "python"
    else:
        pytest.importorskip("danube._core.frame")
        assert message_codec._impl.__name__ == "danube._core.frame"
        assert message_codec._impl.__file__.endswith((".so", ".pyd"))
        assert message_codec.crc32c_implementation() in ("sse4.2", "slicing-by-8")
        if os.environ.get("DANUBE_CRC32C") != "portable":
            assert message_codec.crc32c_implementation() == message_codec._impl.crc32c_implementation()


def test_records_are_the_pure_named_tuple():
    batch = message_codec.encode_payloads([b"hello"], base_offset=3, publish_time=9, key="k")
    (record,) = message_codec.decode_batch(batch)
    assert message_codec.Record is pure.Record
    assert type(record) is pure.Record
    assert record == pure.Record(3, 9, 0, "k", {}, b"hello")
    assert record.payload.obj is batch or bytes(record.payload) == b"hello"


def test_publish_path_validate_stamp_decode():
    batch = bytearray(message_codec.encode_payloads([b"a" * 100] * 10))
    assert message_codec.validate(batch) == (10, 0, 9)
    assert message_codec.stamp_offsets(batch, 500) == 10
    assert message_codec.validate(batch, 500, True) == (10, 500, 509)
    assert [r.offset for r in message_codec.iter_records(batch)] == list(range(500, 510))
    assert message_codec.find_offset(batch, 505) == 5 * (16 + 22 + 100)
    batch[-1] ^= 0xFF
    with pytest.raises(CorruptFrameError) as info:
        message_codec.validate(batch)
    assert info.value.offset == 509 and info.value.actual_crc != info.value.expected_crc

"""Pure-Python twin of ``danube._core.arrowcols``: frames → Arrow column buffers.

Same output as the compiled module (see the top of ``arrowcols.pyx`` for the
buffer layout), built on ``danube._pure.frame.decode_columns`` so every frame
is checked the same way.  ``tests/unit/_core/test_arrowcols.py`` compares the two.
"""

from __future__ import annotations

import struct

from danube._pure.frame import decode_columns
from danube.errors import FrameFormatError

_MAX_I32 = 2**31 - 1
_MAX_I64 = 2**63 - 1


def _i32(values: list[int]) -> bytearray:
    return bytearray(struct.pack(f"<{len(values)}i", *values))


def _i64(values: list[int]) -> bytearray:
    return bytearray(struct.pack(f"<{len(values)}q", *values))


def _offsets(chunks: list[bytes]) -> tuple[bytearray, bytearray]:
    offsets = [0]
    for c in chunks:
        offsets.append(offsets[-1] + len(c))
    if offsets[-1] > _MAX_I32:
        raise FrameFormatError("a column of this batch exceeds 2 GiB; decode smaller batches")
    return _i32(offsets), bytearray(b"".join(chunks))


def decode_arrow_buffers(buf) -> dict:
    cols = decode_columns(buf)
    n = len(cols["offset"])
    for p in cols["producer_id"]:
        if p > _MAX_I64:
            raise FrameFormatError("producer id above 2^63-1 cannot be a Spark long")
    for t in cols["publish_time"]:
        if t * 1000 > _MAX_I64:
            raise FrameFormatError("publish_time is beyond the timestamp range")
    validity = bytearray((n + 7) // 8)
    keys = []
    for i, k in enumerate(cols["routing_key"]):
        if k is not None:
            validity[i >> 3] |= 1 << (i & 7)
            keys.append(k.encode("utf-8"))
        else:
            keys.append(b"")
    key_offsets, key_data = _offsets(keys)
    attr_offsets = [0]
    names, values = [], []
    for attrs in cols["attributes"]:
        for name, value in attrs.items():
            names.append(name.encode("utf-8"))
            values.append(value.encode("utf-8"))
        attr_offsets.append(len(names))
    name_offsets, name_data = _offsets(names)
    value_offsets, value_data = _offsets(values)
    payload_offsets, payload_data = _offsets([bytes(p) for p in cols["payload"]])
    return {
        "count": n,
        "offset": _i64(cols["offset"]),
        "publish_us": _i64([t * 1000 for t in cols["publish_time"]]),
        "producer_id": _i64(cols["producer_id"]),
        "key_validity": validity,
        "key_nulls": sum(1 for k in cols["routing_key"] if k is None),
        "key_offsets": key_offsets,
        "key_data": key_data,
        "attr_offsets": _i32(attr_offsets),
        "name_offsets": name_offsets,
        "name_data": name_data,
        "value_offsets": value_offsets,
        "value_data": value_data,
        "payload_offsets": payload_offsets,
        "payload_data": payload_data,
    }

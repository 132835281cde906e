"""Read what can be read of a record that cannot be delivered (for its dead-letter copy).

A stored record whose routing key or attributes are not UTF-8 cannot be decoded by
``danube.message_codec``; its dead-letter copy keeps the payload and publish time unchanged and
the text fields with each undecodable byte written as ``\\xNN`` (``backslashreplace``),
so the copy itself is deliverable and nothing of the original is silently lost.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from danube import message_codec

_BODY_FIXED = struct.Struct("<QQBBHH")  # publish_time, producer_id, flags, reserved, attr_count, key_len
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FLAG_HAS_KEY = 0x01


class SalvagedRecord(NamedTuple):
    publish_time: int
    producer_id: int
    routing_key: str | None
    attributes: dict[str, str]
    payload: bytes


def _text(raw) -> str:
    return bytes(raw).decode("utf-8", "backslashreplace")


def salvage(frame) -> SalvagedRecord:
    """The record of one whole, checksum-valid frame, text fields decoded leniently.

    Raises ``danube.errors.FrameFormatError`` when the frame's lengths do not hold together."""
    view = memoryview(frame).cast("B")
    message_codec.validate(view)  # lengths, flags and checksum: the walk below may trust them
    b = message_codec.HEADER_SIZE
    (body_len,) = _U32.unpack_from(view, 12)
    end = b + body_len
    publish_time, producer_id, flags, _reserved, attr_count, key_len = _BODY_FIXED.unpack_from(view, b)
    p = b + _BODY_FIXED.size
    key = _text(view[p : p + key_len]) if flags & _FLAG_HAS_KEY else None
    p += key_len
    attributes: dict[str, str] = {}
    for _ in range(attr_count):
        (name_len,) = _U16.unpack_from(view, p)
        name = _text(view[p + 2 : p + 2 + name_len])
        p += 2 + name_len
        (value_len,) = _U32.unpack_from(view, p)
        attributes[name] = _text(view[p + 4 : p + 4 + value_len])
        p += 4 + value_len
    return SalvagedRecord(publish_time, producer_id, key, attributes, bytes(view[p:end]))

"""Protobuf's base-128 varint, for the messages the server and the client encode by hand (a
delivery's head, an ack request) instead of building a protobuf object per call."""

from __future__ import annotations

_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

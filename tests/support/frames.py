"""Frames built from raw bytes, for tests of the checks that refuse them (the codec's
encoders take only text, so they cannot write a key or an attribute that is not UTF-8)."""

from __future__ import annotations

import struct

import danube._pure.frame as pure


def raw_frame(
    key: bytes | None, attrs: list[tuple[bytes, bytes]], *, producer_id: int = 0, payload: bytes = b"p"
) -> bytes:
    """A frame with any bytes as key and attributes (the codec's encoders take only text)."""
    body = bytearray(
        struct.pack("<QQBBHH", 0, producer_id, 1 if key is not None else 0, 0, len(attrs), len(key or b""))
    )
    body += key or b""
    for name, value in attrs:
        body += struct.pack("<H", len(name)) + name + struct.pack("<I", len(value)) + value
    body += payload
    len_field = struct.pack("<I", len(body))
    return struct.pack("<QI", 0, pure.crc32c(bytes(body), pure.crc32c(len_field))) + len_field + bytes(body)

"""Pure-Python twin of ``danube._core.pbwire``: protobuf messages written by hand around a
buffer the caller shares (never copied).

``consume_batch(frames, first, last, count)`` returns the three parts of the batch lane's
``ConsumeResponse(batch=ConsumeBatch(frames=..., first_offset=first, last_offset=last,
count=count))`` as written one after the other: the head (the ``batch`` field's tag and
length, then the ``frames`` field's tag and length), ``frames`` itself, and the rest (the
three number fields, each left out when zero, as proto3 does).  The bytes are protobuf's own
serialization of that message (``tests/unit/_core/test_pbwire.py``), but for empty ``frames``
(never a delivery), whose field is written all the same.  ``first`` and ``last``
are uint64 and ``count`` uint32: a value out of range raises ``OverflowError``.

``consume_batch_as(cls, frames, first, last, count)`` returns the same three parts as an
instance of ``cls``, a subclass of tuple (the server's ``Encoded``: the compiled core makes it
without an intermediate tuple); any other class raises ``TypeError``.
"""

from __future__ import annotations

_U64 = 1 << 64
_U32 = 1 << 32


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, value: int, limit: int) -> bytes:
    if not 0 <= value < limit:
        raise OverflowError(f"{value} is out of range for a protobuf field of {limit.bit_length() - 1} bits")
    return bytes((tag,)) + _varint(value) if value else b""


def consume_batch(frames, first: int, last: int, count: int) -> tuple[bytes, object, bytes]:
    rest = _field(0x10, first, _U64) + _field(0x18, last, _U64) + _field(0x20, count, _U32)
    size = len(frames)
    frames_head = b"\x0a" + _varint(size)
    return b"\x12" + _varint(len(frames_head) + size + len(rest)) + frames_head, frames, rest


def consume_batch_as(cls: type, frames, first: int, last: int, count: int):
    if cls is tuple or not (isinstance(cls, type) and issubclass(cls, tuple)):
        raise TypeError(f"{getattr(cls, '__name__', cls)} is not a subclass of tuple")
    return tuple.__new__(cls, consume_batch(frames, first, last, count))

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

``read_ack(data)`` reads a batch lane ``ConsumeRequest`` whose kind is ``ack`` (the one request
a Consume stream sends per delivery) from its bytes, or returns None: then protobuf must read
it.  ``consume_request(data)`` is the Consume call's request deserializer: ``read_ack(data)``,
or else ``ConsumeRequest.FromString(data)`` (which refuses bad bytes with ``DecodeError``).

The bytes ``read_ack`` takes, and nothing else (anything else is None, never an error)::

    ConsumeRequest   := ack*                        (at least one; the kinds' other fields: None)
    ack              := 0x22 len AckBatch           (field 4, length-delimited)
    AckBatch         := ( 0x08 varint               (field 1: consumer_id)
                        | 0x12 len OffsetRange )*   (field 2: one element of ranges)
    OffsetRange      := ( 0x08 varint | 0x10 varint )*   (fields 1 and 2: first, last)
    varint           := 1 to 10 bytes, low 7 bits first, the last without 0x80; bits past the
                        64th dropped (as protobuf reads a uint64)
    len              := a varint of 1 to 5 bytes, at most the bytes left in the enclosing message

Every tag is that one byte (a longer encoding of the same tag, another field, another wire
type, unknown fields: None).  As protobuf merges them: several ``ack`` fields make one
``AckBatch`` (the last ``consumer_id`` given wins, the ranges follow one another); in an
``OffsetRange`` the last ``first`` and ``last`` given win, absent ones are 0.  The result, an
``AckRequest``, answers the little of a ``ConsumeRequest`` that its readers ask (``WhichOneof
("kind") == "ack"``, ``.ack`` is itself, ``.ack.consumer_id``) and gives the ranges as
``(first, last)`` tuples; ``checked`` is True when each range is one the broker takes (first
<= last, fewer than 1,000,000 offsets), else the stream answers the request with its error.
"""

from __future__ import annotations

from danube.proto.danube_batch import batch_pb2 as _pb

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


# Offsets one range of an ack may name at most (a larger one is refused, as ``ack_pairs`` does).
MAX_ACK_SPAN = 1_000_000
_U64_MASK = _U64 - 1


class AckRequest:
    """A ``ConsumeRequest`` of kind ``ack``, as ``read_ack`` reads it."""

    __slots__ = ("consumer_id", "ranges", "checked")

    def __init__(self, consumer_id: int, ranges: list[tuple[int, int]], checked: bool) -> None:
        self.consumer_id = consumer_id
        self.ranges = ranges
        self.checked = checked

    def WhichOneof(self, name: str) -> str:  # noqa: N802 - protobuf's name, for the same readers
        if name != "kind":
            raise ValueError(f"ConsumeRequest has no oneof {name!r}")
        return "ack"

    @property
    def ack(self) -> AckRequest:
        return self

    def __repr__(self) -> str:
        return f"AckRequest(consumer_id={self.consumer_id}, ranges={self.ranges!r}, checked={self.checked})"


def _read_varint(data, pos: int, end: int, limit: int) -> tuple[int, int] | None:
    value = 0
    shift = 0
    start = pos
    while pos < end and pos - start < limit:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value & _U64_MASK, pos
    return None  # runs past the end, or longer than ``limit`` bytes


def _read_len(data, pos: int, end: int) -> tuple[int, int] | None:
    got = _read_varint(data, pos, end, 5)
    if got is None or got[0] > end - got[1]:
        return None
    return got


def read_ack(data) -> AckRequest | None:
    data = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
    end = len(data)
    pos = 0
    consumer_id = 0
    ranges: list[tuple[int, int]] = []
    checked = True
    if end == 0:
        return None
    while pos < end:
        if data[pos] != 0x22:
            return None
        got = _read_len(data, pos + 1, end)
        if got is None:
            return None
        size, pos = got
        ack_end = pos + size
        while pos < ack_end:
            tag = data[pos]
            if tag == 0x08:
                got = _read_varint(data, pos + 1, ack_end, 10)
                if got is None:
                    return None
                consumer_id, pos = got
            elif tag == 0x12:
                got = _read_len(data, pos + 1, ack_end)
                if got is None:
                    return None
                size, pos = got
                range_end = pos + size
                first = last = 0
                while pos < range_end:
                    tag = data[pos]
                    if tag != 0x08 and tag != 0x10:
                        return None
                    got = _read_varint(data, pos + 1, range_end, 10)
                    if got is None:
                        return None
                    if tag == 0x08:
                        first, pos = got
                    else:
                        last, pos = got
                ranges.append((first, last))
                if not 0 <= last - first < MAX_ACK_SPAN:
                    checked = False
            else:
                return None
    return AckRequest(consumer_id, ranges, checked)


def consume_request(data):
    request = read_ack(data)
    if request is None:
        return _pb.ConsumeRequest.FromString(bytes(data))
    return request

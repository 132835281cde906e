"""Pure-Python twin of ``danube._core.avrocheck``: Avro binary payload checks against a compiled
program (``danube.schema.avro_program``), without decoding into objects.

``check_payload(prog, payload) -> -1`` when the payload is exactly one valid datum, else the
byte position where it goes wrong (``len(payload)`` when it ends early or has bytes left over).
``check_frames(prog, frames) -> (-1, -1)`` when every frame's payload passes, else
``(index of the first bad frame, position in its payload)``.  Frames must already be valid
(``danube.message_codec.validate``); layout at the top of ``danube._pure.frame``.
"""

from __future__ import annotations

NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, BYTES, STRING, FIXED, ENUM, UNION, ARRAY, MAP, RECORD = range(14)
MAX_DEPTH = 256
ZERO_WIDTH_ITEMS = 1 << 20


class _Bad(Exception):
    def __init__(self, pos: int) -> None:
        self.pos = pos


def _varint(buf, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    shift = 0
    acc = 0
    for _ in range(max_bytes):
        if pos >= end:
            raise _Bad(pos)
        b = buf[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if not b & 0x80:
            return (acc >> 1) ^ -(acc & 1), pos
        shift += 7
    raise _Bad(pos)


def _check(prog, node: int, buf, pos: int, end: int, depth: int) -> int:
    if depth > MAX_DEPTH:
        raise _Bad(pos)
    op = prog[node]
    if op == NULL:
        return pos
    if op == BOOLEAN:
        if pos >= end:  # any byte, as fastavro's reader (and Avro's Java one) take it
            raise _Bad(pos)
        return pos + 1
    if op in (INT, LONG):  # no 32-bit range check for int: fastavro's reader has none
        _, p = _varint(buf, pos, end, 10)
        return p
    if op in (FLOAT, DOUBLE):
        p = pos + (4 if op == FLOAT else 8)
        if p > end:
            raise _Bad(pos)
        return p
    if op in (BYTES, STRING):
        n, p = _varint(buf, pos, end, 10)
        if n < 0 or p + n > end:
            raise _Bad(pos)
        if op == STRING:
            try:
                bytes(buf[p : p + n]).decode("utf-8")
            except UnicodeDecodeError:
                raise _Bad(p) from None
        return p + n
    if op == FIXED:
        p = pos + prog[node + 1]
        if p > end:
            raise _Bad(pos)
        return p
    if op == ENUM:
        v, p = _varint(buf, pos, end, 10)
        if not 0 <= v < prog[node + 1]:
            raise _Bad(pos)
        return p
    if op == UNION:
        v, p = _varint(buf, pos, end, 10)
        if not 0 <= v < prog[node + 1]:
            raise _Bad(pos)
        return _check(prog, prog[node + 2 + v], buf, p, end, depth + 1)
    if op in (ARRAY, MAP):
        child = prog[node + 1]
        while True:
            count, p = _varint(buf, pos, end, 10)
            if count == 0:
                return p
            pos = p
            if count < 0:
                count = -count
                _, pos = _varint(buf, pos, end, 10)  # the block's byte size
            if count > end - pos + ZERO_WIDTH_ITEMS:
                raise _Bad(pos)
            for _ in range(count):
                if op == MAP:
                    pos = _check(prog, _STRING_NODE, buf, pos, end, depth + 1)
                pos = _check(prog, child, buf, pos, end, depth + 1)
    if op == RECORD:
        for i in range(prog[node + 1]):
            pos = _check(prog, prog[node + 2 + i], buf, pos, end, depth + 1)
        return pos
    raise _Bad(pos)


def check_payload(prog, payload) -> int:
    buf = memoryview(payload).cast("B") if not isinstance(payload, (bytes, bytearray)) else payload
    end = len(buf)
    try:
        pos = _run(prog, buf, 0, end)
    except _Bad as bad:
        return bad.pos
    return -1 if pos == end else pos


def _run(prog, buf, pos, end):
    return _check(_Prog(prog), 0, buf, pos, end, 0)


_STRING_NODE = -1  # map keys: the program view below reads node -1 as STRING


class _Prog:
    """Program view whose map-key node (-1) reads as STRING."""

    __slots__ = ("p",)

    def __init__(self, p) -> None:
        self.p = p

    def __getitem__(self, i):
        return STRING if i == -1 else self.p[i]


def check_frames(prog, frames) -> tuple[int, int]:
    buf = memoryview(frames).cast("B")
    n = len(buf)
    pos = 0
    index = 0
    while pos + 16 <= n:
        body_len = int.from_bytes(buf[pos + 12 : pos + 16], "little")
        body = pos + 16
        attr_count = int.from_bytes(buf[body + 18 : body + 20], "little")
        key_len = int.from_bytes(buf[body + 20 : body + 22], "little")
        p = body + 22 + key_len
        for _ in range(attr_count):
            name_len = int.from_bytes(buf[p : p + 2], "little")
            p += 2 + name_len
            value_len = int.from_bytes(buf[p : p + 4], "little")
            p += 4 + value_len
        end = body + body_len
        bad = check_payload(prog, buf[p:end])
        if bad >= 0:
            return index, bad
        pos = end
        index += 1
    return -1, -1


def check_attribute(frames, name: bytes, value: bytes) -> int:
    """Index of the first frame without the attribute ``name`` equal to ``value``, or -1."""
    buf = memoryview(frames).cast("B")
    n = len(buf)
    pos = 0
    index = 0
    while pos + 16 <= n:
        body_len = int.from_bytes(buf[pos + 12 : pos + 16], "little")
        body = pos + 16
        attr_count = int.from_bytes(buf[body + 18 : body + 20], "little")
        key_len = int.from_bytes(buf[body + 20 : body + 22], "little")
        p = body + 22 + key_len
        found = False
        for _ in range(attr_count):
            name_len = int.from_bytes(buf[p : p + 2], "little")
            value_len = int.from_bytes(buf[p + 2 + name_len : p + 6 + name_len], "little")
            if bytes(buf[p + 2 : p + 2 + name_len]) == name:
                found = bytes(buf[p + 6 + name_len : p + 6 + name_len + value_len]) == value
                break
            p += 6 + name_len + value_len
        if not found:
            return index
        pos = body + body_len
        index += 1
    return -1

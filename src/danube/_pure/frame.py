"""Pure-Python twin of ``danube._core.frame``: the native frame codec.

This module is the reference for the byte layout and must stay byte-identical
to the compiled codec; ``tests/unit/_core/test_frame_differential.py`` runs the
two against each other on random batches.  Longer than 600 lines because it mirrors one
compiled module function for function (``danube._native.load("frame")`` picks one or the
other whole), and the byte layout below is its reference.

Frame format "danube-frames-v1"
===============================

A *batch* is a contiguous buffer of frames, nothing before, between or after
them.  The same bytes travel from the producer, over the batch lane, into the
WAL, out to every subscriber, into durable segments and into Spark.  All
integers are little-endian.

Frame = 16-byte header + body::

    header (16 bytes)
      0   u64  offset       topic offset; producers write 0, the broker's WAL
                            stamps it in place (the CRC does not cover it, so
                            stamping needs no re-checksum)
      8   u32  crc          CRC32C (Castagnoli, reflected, init/xorout
                            0xFFFFFFFF) of bytes [12, 16 + body_len): the
                            body_len field followed by the body
      12  u32  body_len     length of the body; MIN_BODY <= body_len <= MAX_BODY

    body (body_len bytes)
      0   u64  publish_time milliseconds since the Unix epoch
      8   u64  producer_id
      16  u8   flags        bit 0 = a routing key is present; bits 1-7 are 0
      17  u8   reserved     0
      18  u16  attr_count   number of attributes
      20  u16  key_len      routing key length (0 when flags bit 0 is clear)
      22  key_len bytes     routing key, UTF-8
          attr_count times:
              u16  name_len, name_len bytes   attribute name, UTF-8
              u32  value_len, value_len bytes attribute value, UTF-8
          the rest          payload (body_len minus everything above)

A header whose 16 bytes are all zero marks the end of written data in a
preallocated WAL file; anywhere else a body_len below MIN_BODY is corrupt.

Decoding has three outcomes: a whole frame, "need more bytes" (the buffer ends
inside a frame) and corrupt (:class:`danube.errors.CorruptFrameError`, which
carries the byte position, the frame's offset and both checksums).

Validation of a whole buffer checks every checksum and length and, when asked,
that offsets are consecutive from an expected first offset.
"""

from __future__ import annotations

import struct
from typing import Iterable, Iterator, Mapping, NamedTuple, Sequence

from danube.errors import CorruptFrameError, FrameFormatError

HEADER_SIZE = 16
BODY_FIXED_SIZE = 22
MIN_BODY = BODY_FIXED_SIZE
MAX_BODY = 256 * 1024 * 1024
FLAG_HAS_KEY = 0x01

# scan() stop reasons
SCAN_END = 0  # the buffer ended exactly on a frame boundary
SCAN_ZERO = 1  # an all-zero header: end of written data in a preallocated file
SCAN_TORN = 2  # the buffer ends inside a frame (need more bytes)
SCAN_CORRUPT = 3  # bad checksum, bad length or broken offset sequence

_HEADER = struct.Struct("<QII")
_BODY_FIXED = struct.Struct("<QQBBHH")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U64_MAX = 0xFFFFFFFFFFFFFFFF


def _check_offsets(base_offset: int, count: int) -> None:
    if count and (base_offset < 0 or base_offset + count - 1 > _U64_MAX):
        raise OverflowError(f"offsets {base_offset}..{base_offset + count - 1} do not fit in u64")


def _check_start(start: int, name: str) -> None:
    if start < 0:
        raise ValueError(f"{name} must not be negative, got {start}")


class Record(NamedTuple):
    """One decoded record. ``payload`` is a zero-copy memoryview when decoded."""

    offset: int
    publish_time: int
    producer_id: int
    routing_key: str | None
    attributes: dict[str, str]
    payload: bytes | memoryview


# ---------------------------------------------------------------- CRC32C


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _make_table()


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``; ``value`` continues a previous result."""
    crc = value ^ 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c_implementation() -> str:
    return "python"


# ---------------------------------------------------------------- encoding


def _encode_body(
    publish_time: int, producer_id: int, key: str | None, attributes: Mapping[str, str] | None, payload
) -> bytes:
    parts = []
    key_bytes = b""
    flags = 0
    if key is not None:
        key_bytes = key.encode("utf-8")
        flags = FLAG_HAS_KEY
        if len(key_bytes) > 0xFFFF:
            raise FrameFormatError("routing key longer than 65535 bytes")
    attrs = attributes or {}
    if len(attrs) > 0xFFFF:
        raise FrameFormatError("more than 65535 attributes")
    parts.append(_BODY_FIXED.pack(publish_time, producer_id, flags, 0, len(attrs), len(key_bytes)))
    parts.append(key_bytes)
    for name, value in attrs.items():
        name_b = str(name).encode("utf-8")
        value_b = str(value).encode("utf-8")
        if len(name_b) > 0xFFFF:
            raise FrameFormatError("attribute name longer than 65535 bytes")
        parts.append(_U16.pack(len(name_b)))
        parts.append(name_b)
        parts.append(_U32.pack(len(value_b)))
        parts.append(value_b)
    try:
        parts.append(memoryview(payload).tobytes())
    except TypeError:
        raise TypeError(f"payload must be a bytes-like object, not {type(payload).__name__}") from None
    body = b"".join(parts)
    if len(body) > MAX_BODY:
        raise FrameFormatError(f"record body of {len(body)} bytes exceeds {MAX_BODY}")
    return body


def _frame(offset: int, body: bytes) -> bytes:
    len_field = _U32.pack(len(body))
    crc = crc32c(body, crc32c(len_field))
    return _U64.pack(offset) + _U32.pack(crc) + len_field + body


def encode_record(
    payload,
    *,
    offset: int = 0,
    publish_time: int = 0,
    producer_id: int = 0,
    key: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> bytes:
    """Encode one record as one frame."""
    body = _encode_body(publish_time, producer_id, key, attributes, payload)
    _check_offsets(offset, 1)
    return _frame(offset, body)


def encode_payloads(
    payloads: Sequence,
    *,
    base_offset: int = 0,
    publish_time: int = 0,
    producer_id: int = 0,
    key: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> bytes:
    """Encode payloads sharing publish time, producer, key and attributes (the fast path)."""
    bodies = [_encode_body(publish_time, producer_id, key, attributes, p) for p in payloads]
    _check_offsets(base_offset, len(bodies))
    return b"".join(_frame(base_offset + i, body) for i, body in enumerate(bodies))


def encode_records(records: Iterable, *, base_offset: int = 0) -> bytes:
    """Encode records given as ``(publish_time, producer_id, key, attributes, payload)`` tuples."""
    bodies = [_encode_body(t, pid, key, attrs, payload) for (t, pid, key, attrs, payload) in records]
    _check_offsets(base_offset, len(bodies))
    return b"".join(_frame(base_offset + i, body) for i, body in enumerate(bodies))


# ---------------------------------------------------------------- decoding


def _check_frame(mv: memoryview, pos: int, n: int) -> tuple[int, int] | None:
    """Return (offset, body_len) of a whole, valid frame at ``pos``; None if torn."""
    if n - pos < HEADER_SIZE:
        return None
    offset, crc, body_len = _HEADER.unpack_from(mv, pos)
    if body_len < MIN_BODY or body_len > MAX_BODY:
        raise CorruptFrameError(
            f"invalid body length {body_len}", position=pos, offset=offset, expected_crc=crc, actual_crc=None
        )
    if n - pos - HEADER_SIZE < body_len:
        return None
    actual = crc32c(mv[pos + 12 : pos + HEADER_SIZE + body_len])
    if actual != crc:
        raise CorruptFrameError("checksum mismatch", position=pos, offset=offset, expected_crc=crc, actual_crc=actual)
    _check_body_layout(mv, pos, offset, body_len)
    return offset, body_len


def _check_body_layout(mv: memoryview, pos: int, offset: int, body_len: int) -> int:
    """Validate the variable part of a body; return the payload start (absolute position)."""
    b = pos + HEADER_SIZE
    end = b + body_len
    _t, _p, flags, reserved, attr_count, key_len = _BODY_FIXED.unpack_from(mv, b)
    if flags & ~FLAG_HAS_KEY or reserved:
        raise FrameFormatError(f"unknown flags at position {pos} (offset {offset})")
    if not flags & FLAG_HAS_KEY and key_len:
        raise FrameFormatError(f"key length without key flag at position {pos} (offset {offset})")
    p = b + BODY_FIXED_SIZE + key_len
    if p > end:
        raise FrameFormatError(f"routing key overruns the frame at position {pos} (offset {offset})")
    for _ in range(attr_count):
        if p + 2 > end:
            raise FrameFormatError(f"attributes overrun the frame at position {pos} (offset {offset})")
        (nl,) = _U16.unpack_from(mv, p)
        p += 2 + nl
        if p + 4 > end:
            raise FrameFormatError(f"attributes overrun the frame at position {pos} (offset {offset})")
        (vl,) = _U32.unpack_from(mv, p)
        p += 4 + vl
        if p > end:
            raise FrameFormatError(f"attributes overrun the frame at position {pos} (offset {offset})")
    return p


def _decode_body(mv: memoryview, pos: int, offset: int, body_len: int) -> Record:
    b = pos + HEADER_SIZE
    end = b + body_len
    publish_time, producer_id, flags, _r, attr_count, key_len = _BODY_FIXED.unpack_from(mv, b)
    p = b + BODY_FIXED_SIZE
    key = None
    if flags & FLAG_HAS_KEY:
        key = bytes(mv[p : p + key_len]).decode("utf-8")
    p += key_len
    attrs: dict[str, str] = {}
    for _ in range(attr_count):
        (nl,) = _U16.unpack_from(mv, p)
        name = bytes(mv[p + 2 : p + 2 + nl]).decode("utf-8")
        p += 2 + nl
        (vl,) = _U32.unpack_from(mv, p)
        attrs[name] = bytes(mv[p + 4 : p + 4 + vl]).decode("utf-8")
        p += 4 + vl
    return Record(offset, publish_time, producer_id, key, attrs, mv[p:end])


def decode_frame(buf, pos: int = 0) -> tuple[Record | None, int]:
    """Decode the frame at ``pos``: ``(record, next_pos)``, or ``(None, pos)`` if more bytes are needed."""
    _check_start(pos, "pos")
    mv = memoryview(buf).cast("B")
    checked = _check_frame(mv, pos, len(mv))
    if checked is None:
        return None, pos
    offset, body_len = checked
    return _decode_body(mv, pos, offset, body_len), pos + HEADER_SIZE + body_len


def iter_records(buf) -> Iterator[Record]:
    """Iterate the records of a whole batch; payloads are memoryviews into ``buf``."""
    mv = memoryview(buf).cast("B")
    pos, n = 0, len(mv)
    while pos < n:
        checked = _check_frame(mv, pos, n)
        if checked is None:
            raise CorruptFrameError(
                "batch ends inside a frame", position=pos, offset=None, expected_crc=None, actual_crc=None
            )
        offset, body_len = checked
        yield _decode_body(mv, pos, offset, body_len)
        pos += HEADER_SIZE + body_len


def decode_batch(buf) -> list[Record]:
    return list(iter_records(buf))


def validate(buf, expected_first_offset: int = -1, check_sequence: bool = False) -> tuple[int, int, int]:
    """Validate a whole batch in one call: ``(count, first_offset, last_offset)``.

    Checks every length and checksum; with ``check_sequence`` offsets must be
    consecutive, and with ``expected_first_offset >= 0`` start there.
    An empty buffer gives ``(0, -1, -1)``.
    """
    mv = memoryview(buf).cast("B")
    pos, n, count = 0, len(mv), 0
    first = last = -1
    while pos < n:
        checked = _check_frame(mv, pos, n)
        if checked is None:
            raise CorruptFrameError(
                "batch ends inside a frame", position=pos, offset=None, expected_crc=None, actual_crc=None
            )
        offset, body_len = checked
        if count == 0:
            first = offset
            if expected_first_offset >= 0 and offset != expected_first_offset:
                raise CorruptFrameError(
                    f"first offset {offset}, expected {expected_first_offset}",
                    position=pos,
                    offset=offset,
                    expected_crc=None,
                    actual_crc=None,
                )
        elif check_sequence and offset != last + 1:
            raise CorruptFrameError(
                f"offset {offset} does not follow {last}",
                position=pos,
                offset=offset,
                expected_crc=None,
                actual_crc=None,
            )
        last = offset
        count += 1
        pos += HEADER_SIZE + body_len
    return count, first, last


def scan(buf, start: int = 0, expected_first_offset: int = -1, index_every: int = 0):
    """Scan for recovery; never raises on bad data.

    Returns ``(count, end_pos, first_offset, last_offset, reason, index)`` where
    ``end_pos`` is the end of the last whole valid frame, ``reason`` one of the
    ``SCAN_*`` constants and ``index`` a list of ``(offset, position)`` pairs,
    one at the first frame and then one whenever at least ``index_every`` bytes
    (0 = never) have passed since the previous entry.
    """
    _check_start(start, "start")
    mv = memoryview(buf).cast("B")
    n = len(mv)
    pos, count = start, 0
    first = last = -1
    index: list[tuple[int, int]] = []
    last_indexed = -1
    reason = SCAN_END
    while pos < n:
        if n - pos >= HEADER_SIZE and not any(mv[pos : pos + HEADER_SIZE]):
            reason = SCAN_ZERO
            break
        try:
            checked = _check_frame(mv, pos, n)
        except (CorruptFrameError, FrameFormatError):
            reason = SCAN_CORRUPT
            break
        if checked is None:
            reason = SCAN_TORN
            break
        offset, body_len = checked
        if count == 0:
            if expected_first_offset >= 0 and offset != expected_first_offset:
                reason = SCAN_CORRUPT
                break
            first = offset
        elif offset != last + 1:
            reason = SCAN_CORRUPT
            break
        if count == 0 or (index_every and pos - last_indexed >= index_every):
            index.append((offset, pos))
            last_indexed = pos
        last = offset
        count += 1
        pos += HEADER_SIZE + body_len
    return count, pos, first, last, reason, index


def stamp_offsets(buf, base_offset: int) -> int:
    """Write consecutive offsets from ``base_offset`` into a writable batch; return the count.

    Only headers are touched; lengths are checked first, so a bad batch is left
    unchanged (the checksums are not: validate first).
    """
    mv = memoryview(buf).cast("B")
    if mv.readonly:
        raise TypeError("stamp_offsets needs a writable buffer")
    pos, n = 0, len(mv)
    positions = []
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise FrameFormatError(f"batch ends inside a header at position {pos}")
        (body_len,) = _U32.unpack_from(mv, pos + 12)
        if body_len < MIN_BODY or pos + HEADER_SIZE + body_len > n:
            raise FrameFormatError(f"invalid body length {body_len} at position {pos}")
        positions.append(pos)
        pos += HEADER_SIZE + body_len
    _check_offsets(base_offset, len(positions))
    for i, pos in enumerate(positions):
        _U64.pack_into(mv, pos, base_offset + i)
    return len(positions)


def frame_positions(buf) -> list[int]:
    """Start position of every frame (lengths trusted; validate first)."""
    mv = memoryview(buf).cast("B")
    pos, n, out = 0, len(mv), []
    while pos + HEADER_SIZE <= n:
        (body_len,) = _U32.unpack_from(mv, pos + 12)
        if body_len < MIN_BODY or pos + HEADER_SIZE + body_len > n:
            raise FrameFormatError(f"invalid body length {body_len} at position {pos}")
        out.append(pos)
        pos += HEADER_SIZE + body_len
    return out


def frames_within(buf, max_messages: int, max_bytes: int) -> tuple[int, int]:
    """``(end, count)``: the longest prefix of whole frames within both limits, always at least
    one frame when the buffer starts with one (a delivery's cut: no list of positions)."""
    mv = memoryview(buf).cast("B")
    pos, n, count = 0, len(mv), 0
    while count < max_messages and pos + HEADER_SIZE <= n:
        (body_len,) = _U32.unpack_from(mv, pos + 12)
        if body_len < MIN_BODY or pos + HEADER_SIZE + body_len > n:
            raise FrameFormatError(f"invalid body length {body_len} at position {pos}")
        nxt = pos + HEADER_SIZE + body_len
        if count and nxt > max_bytes:
            break
        pos = nxt
        count += 1
    return pos, count


def find_offset(buf, offset: int, start: int = 0) -> int:
    """Byte position of the frame holding ``offset`` (searching from ``start``), or -1."""
    _check_start(start, "start")
    mv = memoryview(buf).cast("B")
    pos, n = start, len(mv)
    while pos + HEADER_SIZE <= n:
        off, _crc, body_len = _HEADER.unpack_from(mv, pos)
        if body_len < MIN_BODY:
            return -1
        if off == offset:
            return pos
        if off > offset:
            return -1
        pos += HEADER_SIZE + body_len
    return -1


def routing_keys(buf) -> list[str | None]:
    """The routing key of every frame (for key-shared dispatch; lengths trusted)."""
    mv = memoryview(buf).cast("B")
    out: list[str | None] = []
    for pos in frame_positions(mv):
        b = pos + HEADER_SIZE
        flags = mv[b + 16]
        (key_len,) = _U16.unpack_from(mv, b + 20)
        out.append(bytes(mv[b + 22 : b + 22 + key_len]).decode("utf-8") if flags & FLAG_HAS_KEY else None)
    return out


def decode_columns(buf) -> dict[str, list]:
    """Decode a whole batch column-wise (for Arrow/Spark): one list per field.

    Keys: offset, publish_time, producer_id, routing_key, attributes, payload
    (payloads as ``bytes``).  Validates every frame like :func:`iter_records`.
    """
    cols: dict[str, list] = {
        k: [] for k in ("offset", "publish_time", "producer_id", "routing_key", "attributes", "payload")
    }
    for r in iter_records(buf):
        cols["offset"].append(r.offset)
        cols["publish_time"].append(r.publish_time)
        cols["producer_id"].append(r.producer_id)
        cols["routing_key"].append(r.routing_key)
        cols["attributes"].append(r.attributes)
        cols["payload"].append(bytes(r.payload))
    return cols


# ---------------------------------------------------------------- fields delivery needs

# check_fields reasons (the first problem of the first failing frame, checked in this order)
FIELDS_OK = 0
FIELDS_BAD_LAYOUT = 1  # lengths or flags do not hold together
FIELDS_KEY_NOT_UTF8 = 2
FIELDS_ATTR_NAME_NOT_UTF8 = 3
FIELDS_ATTR_VALUE_NOT_UTF8 = 4
FIELDS_WRONG_PRODUCER = 5  # the frame's producer id is not the expected one


def _utf8(mv: memoryview, start: int, length: int) -> bool:
    try:
        bytes(mv[start : start + length]).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _body_fields(mv: memoryview, b: int, body_len: int, producer_id: int | None) -> int:
    end = b + body_len
    _t, pid, flags, reserved, attr_count, key_len = _BODY_FIXED.unpack_from(mv, b)
    if flags & ~FLAG_HAS_KEY or reserved or (not flags & FLAG_HAS_KEY and key_len):
        return FIELDS_BAD_LAYOUT
    p = b + BODY_FIXED_SIZE + key_len
    if p > end:
        return FIELDS_BAD_LAYOUT
    fields = []  # (reason if invalid, start, length)
    for _ in range(attr_count):
        if p + 2 > end:
            return FIELDS_BAD_LAYOUT
        (nl,) = _U16.unpack_from(mv, p)
        fields.append((FIELDS_ATTR_NAME_NOT_UTF8, p + 2, nl))
        p += 2 + nl
        if p + 4 > end:
            return FIELDS_BAD_LAYOUT
        (vl,) = _U32.unpack_from(mv, p)
        fields.append((FIELDS_ATTR_VALUE_NOT_UTF8, p + 4, vl))
        p += 4 + vl
        if p > end:
            return FIELDS_BAD_LAYOUT
    if producer_id is not None and pid != producer_id and pid != 0:
        return FIELDS_WRONG_PRODUCER
    if not _utf8(mv, b + BODY_FIXED_SIZE, key_len):
        return FIELDS_KEY_NOT_UTF8
    for reason, start, length in fields:
        if not _utf8(mv, start, length):
            return reason
    return FIELDS_OK


def check_fields(buf, producer_id: int | None = None) -> tuple[int, int]:
    """``(position, reason)`` of the first frame a subscriber could not decode, or
    ``(-1, FIELDS_OK)``: routing key, attribute names and values must be UTF-8 and, with
    ``producer_id``, every frame must carry that producer id or 0 (the encoders' default:
    not set).  Lengths are checked (a frame that does not hold together is
    FIELDS_BAD_LAYOUT); checksums are not (``validate`` does that)."""
    if producer_id is not None and not 0 <= producer_id <= _U64_MAX:
        raise OverflowError(f"producer_id {producer_id} does not fit in u64")
    mv = memoryview(buf).cast("B")
    pos, n = 0, len(mv)
    while pos < n:
        if n - pos < HEADER_SIZE:
            return pos, FIELDS_BAD_LAYOUT
        (body_len,) = _U32.unpack_from(mv, pos + 12)
        if body_len < MIN_BODY or n - pos - HEADER_SIZE < body_len:
            return pos, FIELDS_BAD_LAYOUT
        reason = _body_fields(mv, pos + HEADER_SIZE, body_len, producer_id)
        if reason != FIELDS_OK:
            return pos, reason
        pos += HEADER_SIZE + body_len
    return -1, FIELDS_OK


# ---------------------------------------------------------------- check once (the publish path)

_CHECKED_TOKEN = object()


class CheckedFrames(bytearray):
    """A writable copy of a producer's batch that :func:`check_batch` made after checking it
    whole; only ``check_batch`` makes one.  ``frame_count`` frames, ``nbytes`` checked, and
    :func:`check_fields`' result for ``producer_id`` (``fields_position``, ``fields_problem``).
    The WAL writer appends one without validating its frames again while its length is still
    ``nbytes``."""

    __slots__ = ("frame_count", "nbytes", "producer_id", "fields_position", "fields_problem")
    frame_count: int
    nbytes: int
    producer_id: int
    fields_position: int
    fields_problem: int

    def __new__(cls, *args, **kwargs):
        if cls is not CheckedFrames or len(args) != 1 or args[0] is not _CHECKED_TOKEN or kwargs:
            raise TypeError("CheckedFrames are made by check_batch only")
        return bytearray.__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        bytearray.__init__(self)

    def __init_subclass__(cls, **kwargs):
        raise TypeError("CheckedFrames cannot be subclassed")


def check_batch(buf, producer_id: int) -> CheckedFrames:
    """A writable copy of a producer's batch, checked once for all the publish path asks of
    it: every length, checksum and layout exactly as :func:`validate` checks them (raising
    what it raises), then the fields as :func:`check_fields` checks them for ``producer_id``,
    whose result is kept on the copy for the broker to act on at its turn.  The WAL appends
    the copy without validating its frames again; anything else is validated there as
    before."""
    if not 0 <= producer_id <= _U64_MAX:
        raise OverflowError(f"producer_id {producer_id} does not fit in u64")
    count = validate(buf)[0]
    position, problem = check_fields(buf, producer_id)
    out = CheckedFrames(_CHECKED_TOKEN)
    out += memoryview(buf).cast("B")
    out.frame_count = count
    out.nbytes = len(out)
    out.producer_id = producer_id
    out.fields_position = position
    out.fields_problem = problem
    return out

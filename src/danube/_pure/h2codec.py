"""Pure-Python twin of ``danube._core.h2codec``: HTTP/2 frames and gRPC length-prefixed messages.

The byte layouts are the comment block at the top of ``danube/_core/h2codec.pyx``.  This twin
must give the same results and raise the same errors (type, message, fields) for the same
input; ``tests/unit/_core/test_h2codec_differential.py`` runs the two against each other.

The error classes live here, and the compiled module raises these very classes, so a caller
catches one type whichever implementation ``danube._native`` picked.
"""

from __future__ import annotations

import struct

HEADER_SIZE = 9
PREFIX_SIZE = 5

DATA = 0
HEADERS = 1
CONTINUATION = 9
PADDED = 0x08
PROTOCOL_ERROR = 0x1
FRAME_SIZE_ERROR = 0x6

_HEADER = struct.Struct(">HBBBL")
_DATA_HEADER = struct.Struct(">HBBBLBL")
_MAX_LENGTH = 0xFFFFFF  # what a frame header's 24-bit length carries
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_STREAM_MASK = 0x7FFFFFFF
_COMPRESSED = 0x01


class FrameError(Exception):
    """A frame that breaks HTTP/2 framing, or a peer past one of the server's limits (``limit``
    names it, see ``limits.H2Limits``): the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.limit = limit


class MessageTooLarge(Exception):
    """A message's length prefix is over the receive limit (RESOURCE_EXHAUSTED at the edge)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"received message larger than max ({length} vs. {limit})")
        self.length = length
        self.limit = limit


class CompressedMessage(Exception):
    """A message flagged as compressed; this server does not decompress (UNIMPLEMENTED)."""


def parse_frames(
    buffer, max_frame_size: int, max_frames: int = 1 << 62, max_headers: int = 1 << 62, max_header_bytes: int = 1 << 62
) -> tuple[list[tuple[int, int, int, bytes]], int]:
    """The whole frames at the start of ``buffer`` (at most ``max_frames``, and up to the
    ``max_headers``-th HEADERS frame or the HEADERS or CONTINUATION frame that takes the header
    block bytes to ``max_header_bytes``) as ``(type, flags, stream_id, payload)``, and how many
    bytes they took.  FrameError(FRAME_SIZE_ERROR) for a frame longer than ``max_frame_size``
    (seen from its header, before the payload has arrived)."""
    frames = []
    start = 0
    end = len(buffer)
    unpack = _HEADER.unpack_from
    left = max_frames
    headers_left = max_headers
    header_bytes_left = max_header_bytes
    with memoryview(buffer) as view:  # one copy per payload, none for the slicing
        while end - start >= HEADER_SIZE and left > 0:
            high, low, kind, flags, stream_id = unpack(view, start)
            length = (high << 8) | low
            if length > max_frame_size:
                raise FrameError(FRAME_SIZE_ERROR, f"a {length}-byte frame is over the {max_frame_size}-byte limit")
            payload_start = start + HEADER_SIZE
            if end - payload_start < length:
                break
            frames.append(
                (kind, flags, stream_id & _STREAM_MASK, view[payload_start : payload_start + length].tobytes())
            )
            start = payload_start + length
            left -= 1
            if kind == HEADERS or kind == CONTINUATION:
                header_bytes_left -= length
                if kind == HEADERS:
                    headers_left -= 1
                if headers_left <= 0 or header_bytes_left <= 0:
                    break
    return frames, start


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """Just the 9-byte header, for a payload written separately (large DATA frames)."""
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header and ``payload``."""
    length = len(payload)
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def unpadded(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its pad length byte and padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise FrameError(PROTOCOL_ERROR, "the padding is as long as the frame or longer")
    return payload[1 : len(payload) - payload[0]]


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise FrameError(FRAME_SIZE_ERROR, f"a SETTINGS payload of {len(payload)} bytes is not a multiple of 6")
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def parse_u32(payload: bytes, what: str) -> int:
    """The 31-bit value of a WINDOW_UPDATE or the error code of a RST_STREAM."""
    if len(payload) != 4:
        raise FrameError(FRAME_SIZE_ERROR, f"a {what} payload must be 4 bytes, got {len(payload)}")
    return _U32.unpack(payload)[0]


def message_prefix(length: int) -> bytes:
    """The five bytes in front of an uncompressed message of ``length`` bytes."""
    return b"\x00" + length.to_bytes(4, "big")


def data_header(stream_id: int, length: int) -> bytes:
    """The 14 bytes in front of a message of ``length`` bytes sent whole in one DATA frame (no
    flags): the frame header, then the message's prefix."""
    total = length + PREFIX_SIZE
    if length < 0 or total > _MAX_LENGTH:
        raise OverflowError(f"a frame payload of {total} bytes is outside 0..2^24-1")
    return _DATA_HEADER.pack(total >> 8, total & 0xFF, 0, 0, stream_id, 0, length)


def frame_message(out: list, stream_id: int, data, stream_window: int, connection_window: int, frame_limit: int) -> int:
    """One message sent whole in one DATA frame: when its frame payload fits both windows and the
    frame size, the frame's header and prefix (``data_header``) then the message (bytes, or a
    tuple of buffers sent one after the other: ``wire.Encoded``) are appended to ``out``, and
    the payload's size is returned; else 0 and ``out`` is left as it was."""
    parts = isinstance(data, tuple)
    length = sum(map(len, data)) if parts else len(data)
    total = length + PREFIX_SIZE
    if total > stream_window or total > connection_window or total > frame_limit:
        return 0
    out.append(data_header(stream_id, length))
    if parts:
        out.extend(data)
    else:
        out.append(data)
    return total


_U64_MAX = 2**64 - 1
MAX_FIELDS = 15  # field numbers with a one-byte protobuf tag


def uint_fields(fields) -> bytes:
    """A protobuf message of unsigned varint fields numbered 1, 2, ... in order, one per item of
    ``fields`` (a tuple of ints), each omitted when 0 as proto3 serializes it: what a message of
    uint64 fields serializes to, without a message object.  ValueError for more than
    ``MAX_FIELDS`` fields or a value that is no uint64."""
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"{len(fields)} fields (at most {MAX_FIELDS})")
    out = bytearray()
    number = 0
    for value in fields:
        number += 1
        if type(value) is not int or value < 0 or value > _U64_MAX:
            raise ValueError(f"field {number}: {value!r} is not a uint64")
        if value:
            out.append(number << 3)
            while value >= 0x80:
                out.append((value & 0x7F) | 0x80)
                value >>= 7
            out.append(value)
    return bytes(out)


def frame_fields(
    out: list, stream_id: int, fields, stream_window: int, connection_window: int, frame_limit: int
) -> int:
    """``frame_message`` of ``uint_fields(fields)`` as one buffer: the DATA frame's header, the
    message's prefix and the message appended to ``out`` as a single bytes object (a small
    answer, such as an ack, costs one allocation); the payload's size, or 0 with ``out`` left
    as it was when it does not fit."""
    message = uint_fields(fields)
    total = len(message) + PREFIX_SIZE
    if total > stream_window or total > connection_window or total > frame_limit:
        return 0
    out.append(data_header(stream_id, len(message)) + message)
    return total


class MessageReader:
    """Cuts a stream's DATA payload into whole messages, whatever the DATA frame boundaries."""

    __slots__ = ("_buffer", "_limit", "pending")

    def __init__(self, limit: int) -> None:
        self._buffer = bytearray()
        self._limit = limit
        self.pending = 0  # bytes received that are not yet part of a whole message

    def feed(self, data) -> list[bytes]:
        """Adds ``data``; the messages it completed, in order.  Raises MessageTooLarge or
        CompressedMessage as soon as a prefix shows either (before the body has arrived); the
        reader is then left as it was before this call."""
        buffer = self._buffer
        before = len(buffer)
        buffer += data
        messages = []
        start = 0
        end = len(buffer)
        error: Exception | None = None
        with memoryview(buffer) as view:  # one copy per message, none for the slicing
            while end - start >= PREFIX_SIZE:
                length = int.from_bytes(view[start + 1 : start + PREFIX_SIZE], "big")
                if buffer[start] & _COMPRESSED:
                    error = CompressedMessage(
                        "compressed messages are not supported by this server (send with grpc-encoding identity)"
                    )
                    break
                if length > self._limit:
                    error = MessageTooLarge(length, self._limit)
                    break
                if end - start < PREFIX_SIZE + length:
                    break
                messages.append(view[start + PREFIX_SIZE : start + PREFIX_SIZE + length].tobytes())
                start += PREFIX_SIZE + length
        if error is not None:
            del buffer[before:]
            raise error
        if start:
            del buffer[:start]
        self.pending = end - start
        return messages

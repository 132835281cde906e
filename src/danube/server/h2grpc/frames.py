"""HTTP/2 frames (RFC 9113 section 4 and 6) as this server reads and writes them.

Every frame starts with a 9-byte header:

    offset  size  field
    0       3     payload length L, unsigned big-endian (at most the receiver's
                  SETTINGS_MAX_FRAME_SIZE; 16384 until the receiver says otherwise)
    3       1     type: 0 DATA, 1 HEADERS, 2 PRIORITY, 3 RST_STREAM, 4 SETTINGS,
                  5 PUSH_PROMISE, 6 PING, 7 GOAWAY, 8 WINDOW_UPDATE, 9 CONTINUATION;
                  other types are ignored
    4       1     flags: 0x01 END_STREAM (DATA, HEADERS) or ACK (SETTINGS, PING),
                  0x04 END_HEADERS (HEADERS, CONTINUATION), 0x08 PADDED (DATA,
                  HEADERS), 0x20 PRIORITY (HEADERS)
    5       4     1 reserved bit (ignored on receipt) + 31-bit stream id, big-endian
    9       L     payload

Payloads this server looks into:

    DATA          [1 pad length P, if PADDED] data [P bytes of padding]
    HEADERS       [1 pad length P, if PADDED] [4 stream dependency + 1 weight, if
                  PRIORITY] header block fragment (HPACK) [P bytes of padding]
    CONTINUATION  header block fragment
    RST_STREAM    4 error code
    SETTINGS      (2 identifier + 4 value) repeated; empty with ACK
    PING          8 opaque bytes, echoed back with ACK
    GOAWAY        4 (reserved bit + last stream id) + 4 error code + debug data
    WINDOW_UPDATE 4 (reserved bit + 31-bit increment, 1..2^31-1)

The client's connection preface is the 24 bytes ``PREFACE`` followed by its SETTINGS.

Header blocks this server writes use only two HPACK (RFC 7541) representations, so
it keeps no encoder state: "indexed" (one byte 0x80 | static index) for a header
that is in the static table name and value alike, and "literal without indexing,
new name" for everything else:

    0x00, name length (7-bit prefix integer, H=0), name, value length (same), value

An N-bit prefix integer fits in the low N bits of its first byte when smaller than
2^N - 1; otherwise those bits are all 1 and the rest, minus 2^N - 1, follows 7 bits
at a time, least significant first, with 0x80 on every byte but the last.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_SIZE = 9
DEFAULT_MAX_FRAME_SIZE = 16384
DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

END_STREAM = 0x01
ACK = 0x01
END_HEADERS = 0x04
PADDED = 0x08
PRIORITY_FLAG = 0x20

# SETTINGS identifiers
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

# Error codes (RFC 9113 section 7)
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

_HEADER = struct.Struct(">HBBBL")
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")
_STREAM_MASK = 0x7FFFFFFF

# The HPACK static table entries (RFC 7541 appendix A) a gRPC server's answers can use.
_STATIC_INDEXED = {(b":status", b"200"): 8, (b":status", b"204"): 9, (b":status", b"206"): 10,
                   (b":status", b"304"): 11, (b":status", b"400"): 12, (b":status", b"404"): 13,
                   (b":status", b"500"): 14}


class FrameError(Exception):
    """A frame that breaks HTTP/2 framing, or a peer past one of the server's limits (``limit``
    names it, see ``limits.H2Limits``): the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.limit = limit


def parse_frames(buffer: bytearray, max_frame_size: int, max_frames: int = 1 << 62,
                 max_headers: int = 1 << 62,
                 max_header_bytes: int = 1 << 62) -> tuple[list[tuple[int, int, int, bytes]], int]:
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
    with memoryview(buffer) as view:   # one copy per payload, none for the slicing
        while end - start >= HEADER_SIZE and left:
            high, low, kind, flags, stream_id = unpack(buffer, start)
            length = (high << 8) | low
            if length > max_frame_size:
                raise FrameError(FRAME_SIZE_ERROR, f"a {length}-byte frame is over the {max_frame_size}-byte limit")
            payload_start = start + HEADER_SIZE
            if end - payload_start < length:
                break
            frames.append((kind, flags, stream_id & _STREAM_MASK, view[payload_start:payload_start + length].tobytes()))
            start = payload_start + length
            left -= 1
            if kind == HEADERS or kind == CONTINUATION:
                header_bytes_left -= length
                if kind == HEADERS:
                    headers_left -= 1
                if not headers_left or header_bytes_left <= 0:
                    break
    return frames, start


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header and ``payload``."""
    length = len(payload)
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """Just the 9-byte header, for a payload written separately (large DATA frames)."""
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def unpadded(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its pad length byte and padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise FrameError(PROTOCOL_ERROR, "the padding is as long as the frame or longer")
    return payload[1:len(payload) - payload[0]]


def settings(pairs: list[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in pairs))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise FrameError(FRAME_SIZE_ERROR, f"a SETTINGS payload of {len(payload)} bytes is not a multiple of 6")
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def parse_u32(payload: bytes, what: str) -> int:
    """The 31-bit value of a WINDOW_UPDATE or the error code of a RST_STREAM."""
    if len(payload) != 4:
        raise FrameError(FRAME_SIZE_ERROR, f"a {what} payload must be 4 bytes, got {len(payload)}")
    return _U32.unpack(payload)[0]


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def _prefix_integer(value: int, bits: int, first: int) -> bytes:
    limit = (1 << bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_header_block(headers) -> bytes:
    """An HPACK block of ``(name, value)`` byte pairs that needs no encoder state."""
    out = []
    for name, value in headers:
        index = _STATIC_INDEXED.get((name, value))
        if index is not None:
            out.append(bytes((0x80 | index,)))
            continue
        out.append(b"\x00")
        out.append(_prefix_integer(len(name), 7, 0))
        out.append(name)
        out.append(_prefix_integer(len(value), 7, 0))
        out.append(value)
    return b"".join(out)


def headers_frames(stream_id: int, block: bytes, end_stream: bool, max_frame_size: int) -> bytes:
    """HEADERS (and CONTINUATION frames when ``block`` is over ``max_frame_size``)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame_size:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    pieces = [block[i:i + max_frame_size] for i in range(0, len(block), max_frame_size)]
    out = [frame(HEADERS, flags, stream_id, pieces[0])]
    for piece in pieces[1:-1]:
        out.append(frame(CONTINUATION, 0, stream_id, piece))
    out.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
    return b"".join(out)

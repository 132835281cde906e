"""The HTTP/2 frames (RFC 9113) the client's own transport reads and writes.

Parsing and the DATA framing of gRPC messages are the compiled codec's (``danube._core.h2codec``,
or its pure-Python twin as ``danube._native`` picks); this module names the frame types, flags,
settings and error codes, and builds the few control frames and request header blocks a client
sends.

Request header blocks use one HPACK (RFC 7541) representation only, "literal without indexing,
new name", with no Huffman coding, so the client keeps no encoder state:

    0x00, name length (7-bit prefix integer), name, value length (same), value
"""

from __future__ import annotations

import struct

from danube import _native

_codec = _native.load("h2codec")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME_SIZE = 16384
LARGEST_FRAME_SIZE = 2**24 - 1
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
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xA
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC
HTTP_1_1_REQUIRED = 0xD

FrameError = _codec.FrameError
MessageTooLarge = _codec.MessageTooLarge
CompressedMessage = _codec.CompressedMessage
MessageReader = _codec.MessageReader
parse_frames = _codec.parse_frames
parse_settings = _codec.parse_settings
parse_u32 = _codec.parse_u32
unpadded = _codec.unpadded
frame = _codec.frame
frame_header = _codec.frame_header
message_prefix = _codec.message_prefix
# A message sent whole in one DATA frame when it fits both windows and the frame size: appended to
# a send list with its header and prefix, its payload size returned (else 0, nothing appended).
frame_message = _codec.frame_message
HEADER_SIZE = _codec.HEADER_SIZE
PREFIX_SIZE = _codec.PREFIX_SIZE

_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")

SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def settings(pairs: list[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in pairs))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def ping(payload: bytes, *, ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def parse_goaway(payload: bytes) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY payload."""
    if len(payload) < 8:
        raise FrameError(FRAME_SIZE_ERROR, f"a GOAWAY payload must be at least 8 bytes, got {len(payload)}")
    last, code = _GOAWAY.unpack_from(payload)
    return last & MAX_WINDOW, code, payload[8:]


def _prefix_integer(value: int, bits: int) -> bytes:
    limit = (1 << bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal_block(headers) -> bytes:
    """An HPACK block of ``(name, value)`` byte pairs as literals without indexing."""
    out = []
    for name, value in headers:
        out.append(b"\x00")
        out.append(_prefix_integer(len(name), 7))
        out.append(name)
        out.append(_prefix_integer(len(value), 7))
        out.append(value)
    return b"".join(out)


def headers_frames(stream_id: int, block: bytes, max_frame_size: int, *, end_stream: bool = False) -> bytes:
    """HEADERS, and CONTINUATION frames when ``block`` is over the peer's ``max_frame_size``."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame_size:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    pieces = [block[i : i + max_frame_size] for i in range(0, len(block), max_frame_size)]
    out = [frame(HEADERS, flags, stream_id, pieces[0])]
    out.extend(frame(CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1])
    out.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
    return b"".join(out)

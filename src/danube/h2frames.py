"""The HTTP/2 (RFC 9113) vocabulary both sides of our gRPC transport speak: frame types, flags,
SETTINGS identifiers, error codes, the compiled codec's parsers and framers, and the few control
frames and header blocks built in Python.  The server (``danube.server.h2grpc.frames``) and the
client (``danube.client.h2.frames``) each add only what their side alone writes.

The byte layout of a frame and of the payloads read here is the comment block at the top of
``danube/_core/h2codec.pyx`` (compiled, or its pure-Python twin ``danube/_pure/h2codec.py`` as
``danube._native`` picks).  The client's connection preface is the 24 bytes ``PREFACE`` followed by
its SETTINGS.

Header blocks built here need no HPACK (RFC 7541) encoder state: "indexed" (one byte 0x80 | static
index) for a pair the caller's static table names whole, else "literal without indexing, new name":

    0x00, name length (7-bit prefix integer, H=0), name, value length (same), value

An N-bit prefix integer fits in the low N bits of its first byte when smaller than 2^N - 1;
otherwise those bits are all 1 and the rest, minus 2^N - 1, follows 7 bits at a time, least
significant first, with 0x80 on every byte but the last.
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

# A frame that breaks HTTP/2 framing, or a peer past one of our limits: the connection ends with
# GOAWAY ``code``.  Defined by the codec, which raises it from the compiled parser too.
FrameError = _codec.FrameError
MessageTooLarge = _codec.MessageTooLarge
CompressedMessage = _codec.CompressedMessage
# Reassembles gRPC messages (5-byte prefix, then the message) from DATA payloads, bounded.
MessageReader = _codec.MessageReader
# The whole frames at the start of a receive buffer, within the read's budgets, and the bytes they
# took; the per-frame header and payload work of every read (see the codec for the contract).
parse_frames = _codec.parse_frames
parse_settings = _codec.parse_settings
parse_u32 = _codec.parse_u32
unpadded = _codec.unpadded
frame = _codec.frame
frame_header = _codec.frame_header
message_prefix = _codec.message_prefix
# A DATA frame's header and the gRPC prefix of the one whole message it carries (14 bytes).
data_header = _codec.data_header
# That header and the message itself appended to a send list when the message fits the windows
# and the frame size (its payload size returned, else 0): a message's send in one codec call.
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


_NO_STATIC: dict[tuple[bytes, bytes], int] = {}


def encode_header_block(headers, static_indexed: dict[tuple[bytes, bytes], int] = _NO_STATIC) -> bytes:
    """An HPACK block of ``(name, value)`` byte pairs that needs no encoder state: the pairs
    ``static_indexed`` names by their static-table index, the rest as literals."""
    out = []
    for name, value in headers:
        index = static_indexed.get((name, value))
        if index is not None:
            out.append(bytes((0x80 | index,)))
            continue
        out.append(b"\x00")
        out.append(_prefix_integer(len(name), 7))
        out.append(name)
        out.append(_prefix_integer(len(value), 7))
        out.append(value)
    return b"".join(out)


def headers_frames(stream_id: int, block: bytes, end_stream: bool, max_frame_size: int) -> bytes:
    """HEADERS (and CONTINUATION frames when ``block`` is over the peer's ``max_frame_size``)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame_size:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    pieces = [block[i : i + max_frame_size] for i in range(0, len(block), max_frame_size)]
    out = [frame(HEADERS, flags, stream_id, pieces[0])]
    out.extend(frame(CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1])
    out.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
    return b"".join(out)

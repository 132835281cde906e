"""gRPC's framing inside HTTP/2 DATA frames, and the header values gRPC defines.

Length-prefixed messages (gRPC over HTTP/2, "Length-Prefixed-Message": a flag byte, a 4-byte
big-endian length, the message), repeated back to back in a stream's DATA payload and split
across DATA frames anywhere, are cut and prefixed by the codec ``danube._core.h2codec`` (byte
layout in the comment block at its top; pure twin ``danube/_pure/h2codec.py``).

``grpc-timeout`` request header: 1 to 8 ASCII digits followed by one unit letter,
``H`` hours, ``M`` minutes, ``S`` seconds, ``m`` milliseconds, ``u`` microseconds,
``n`` nanoseconds (``"250m"`` = 0.25 s).

``grpc-message`` trailer: the status message as UTF-8, percent-encoded: every byte
outside 0x20..0x7E, and ``%`` itself, is written ``%XX`` (upper-case hex).
"""

from __future__ import annotations

import base64

from danube import _native
from danube.errors import InvalidArgumentError

_codec = _native.load("h2codec")

PREFIX_SIZE = _codec.PREFIX_SIZE

# Headers gRPC itself uses; the rest of a request's headers are the call's metadata.
_TRANSPORT_HEADERS = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


# A message's length prefix over the receive limit (RESOURCE_EXHAUSTED at the edge), and a message
# flagged as compressed, which this server does not decompress (UNIMPLEMENTED).
MessageTooLarge = _codec.MessageTooLarge
CompressedMessage = _codec.CompressedMessage
# Cuts a stream's DATA payload into whole messages, whatever the DATA frame boundaries:
# ``feed(data)`` returns the messages it completed; ``pending`` counts the bytes of an
# unfinished one.
MessageReader = _codec.MessageReader
# The five bytes in front of an uncompressed message of ``length`` bytes.
message_prefix = _codec.message_prefix


class Encoded(tuple):
    """A response message already serialized, as buffers sent one after the other (bytes,
    bytearray or memoryview; never copied before the socket).  A handler on the native server
    writes one to share a large buffer (a delivered payload) between every stream sending it,
    instead of building a copy per stream; ``ServerCall`` passes it by without serializing."""

    __slots__ = ()

    def __new__(cls, parts) -> "Encoded":
        return super().__new__(cls, parts)

    @property
    def length(self) -> int:
        return sum(map(len, self))

    def tobytes(self) -> bytes:
        return b"".join(self)


def parse_timeout(value: bytes) -> float:
    """Seconds from a ``grpc-timeout`` value; InvalidArgumentError when it is malformed."""
    digits, unit = value[:-1], value[-1:]
    if not (1 <= len(digits) <= 8 and digits.isdigit()) or unit not in _TIMEOUT_UNITS:
        raise InvalidArgumentError(f"malformed grpc-timeout header {value[:32]!r}")
    return int(digits) * _TIMEOUT_UNITS[unit]


def encode_status_message(message: str) -> bytes:
    """``message`` as a ``grpc-message`` value (percent-encoded UTF-8)."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def metadata_from_headers(headers) -> tuple:
    """A request's metadata as grpc.aio gives it: ``(key, value)`` pairs without the pseudo and
    gRPC transport headers; ``-bin`` values base64-decoded to bytes, the rest as text."""
    out = []
    for name, value in headers:
        if name[:1] == b":" or name in _TRANSPORT_HEADERS:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                out.append((key, value))
        else:
            out.append((key, value.decode("ascii", "replace")))
    return tuple(out)

"""gRPC's framing inside HTTP/2 DATA frames, and the header values gRPC defines.

Length-prefixed message (gRPC over HTTP/2, "Length-Prefixed-Message"), repeated
back to back in a stream's DATA payload, split across DATA frames anywhere:

    offset  size  field
    0       1     compressed flag: 0 = identity, 1 = compressed with the stream's
                  ``grpc-encoding`` (this server accepts only 0; other bits are reserved)
    1       4     message length N, unsigned, big-endian
    5       N     the serialized message (protobuf here)

``grpc-timeout`` request header: 1 to 8 ASCII digits followed by one unit letter,
``H`` hours, ``M`` minutes, ``S`` seconds, ``m`` milliseconds, ``u`` microseconds,
``n`` nanoseconds (``"250m"`` = 0.25 s).

``grpc-message`` trailer: the status message as UTF-8, percent-encoded: every byte
outside 0x20..0x7E, and ``%`` itself, is written ``%XX`` (upper-case hex).
"""

from __future__ import annotations

import base64

from danube.errors import InvalidArgumentError

PREFIX_SIZE = 5
_COMPRESSED = 0x01

# Headers gRPC itself uses; the rest of a request's headers are the call's metadata.
_TRANSPORT_HEADERS = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                                b"grpc-accept-encoding"))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class MessageTooLarge(Exception):
    """A message's length prefix is over the receive limit (RESOURCE_EXHAUSTED at the edge)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"received message larger than max ({length} vs. {limit})")
        self.length = length
        self.limit = limit


class CompressedMessage(Exception):
    """A message flagged as compressed; this server does not decompress (UNIMPLEMENTED)."""


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


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint, for ``Encoded`` messages built by hand."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def message_prefix(length: int) -> bytes:
    """The five bytes in front of an uncompressed message of ``length`` bytes."""
    return b"\x00" + length.to_bytes(4, "big")


class MessageReader:
    """Cuts a stream's DATA payload into whole messages, whatever the DATA frame boundaries."""

    __slots__ = ("_buffer", "_limit", "pending")

    def __init__(self, limit: int) -> None:
        self._buffer = bytearray()
        self._limit = limit
        self.pending = 0   # bytes received that are not yet part of a whole message

    def feed(self, data: bytes) -> list[bytes]:
        """Adds ``data``; the messages it completed, in order.  Raises MessageTooLarge or
        CompressedMessage as soon as a prefix shows either (before the body has arrived)."""
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        end = len(buffer)
        with memoryview(buffer) as view:   # one copy per message, none for the slicing
            while end - start >= PREFIX_SIZE:
                flag = buffer[start]
                length = int.from_bytes(view[start + 1:start + PREFIX_SIZE], "big")
                if flag & _COMPRESSED:
                    raise CompressedMessage("compressed messages are not supported by this server "
                                            "(send with grpc-encoding identity)")
                if length > self._limit:
                    raise MessageTooLarge(length, self._limit)
                if end - start < PREFIX_SIZE + length:
                    break
                messages.append(view[start + PREFIX_SIZE:start + PREFIX_SIZE + length].tobytes())
                start += PREFIX_SIZE + length
        if start:
            del buffer[:start]
        self.pending = end - start
        return messages


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

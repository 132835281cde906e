"""A call's end as grpc.aio reports it: status code, details and metadata from response headers.

Failures are real ``grpc.aio.AioRpcError`` instances, so the client's error translation
(``danube.client.errors``) and its redirect handling (``connection.broker_url_of``) read them
as they read grpc.aio's own.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote_to_bytes

import grpc

from danube.client.h2 import frames

_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

# What a RST_STREAM's HTTP/2 error code means for the call (the gRPC HTTP/2 protocol document).
_RESET_CODES = {
    frames.NO_ERROR: grpc.StatusCode.INTERNAL,
    frames.REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    frames.CANCEL: grpc.StatusCode.CANCELLED,
    frames.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    frames.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}

# Headers that are HTTP/2 or gRPC protocol, not the application's metadata.
_PROTOCOL = frozenset((b"content-type", b"grpc-status", b"grpc-message", b"grpc-encoding", b"grpc-accept-encoding"))


def code_of(number: int) -> grpc.StatusCode:
    return _CODE_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


def reset_code(h2_code: int) -> grpc.StatusCode:
    return _RESET_CODES.get(h2_code, grpc.StatusCode.INTERNAL)


def decode_message(value: bytes) -> str:
    """A ``grpc-message`` value: percent-encoded UTF-8 (a bad sequence is kept, not an error)."""
    return unquote_to_bytes(value).decode("utf-8", "replace")


def metadata_of(headers) -> grpc.aio.Metadata:
    """The application's metadata among decoded ``(name, value)`` byte pairs: ``-bin`` values
    base64-decoded to bytes, others as text."""
    pairs = []
    for name, value in headers:
        if name[:1] == b":" or name in _PROTOCOL:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                pairs.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except (binascii.Error, ValueError):
                continue
        else:
            pairs.append((key, value.decode("utf-8", "replace")))
    return grpc.aio.Metadata(*pairs)


def status_of(headers) -> tuple[grpc.StatusCode, str] | None:
    """(code, details) from a trailer block, or None when it carries no ``grpc-status``."""
    number = message = None
    for name, value in headers:
        if name == b"grpc-status":
            number = value
        elif name == b"grpc-message":
            message = value
    if number is None:
        return None
    try:
        code = code_of(int(number))
    except ValueError:
        return grpc.StatusCode.UNKNOWN, f"a grpc-status that is not a number: {number!r}"
    return code, decode_message(message) if message is not None else ""


def http_status_problem(headers) -> tuple[grpc.StatusCode, str] | None:
    """A response that is not gRPC (its :status is not 200, or no application/grpc content type):
    the code the gRPC HTTP/2 protocol maps its HTTP status to, and why."""
    status = content_type = None
    for name, value in headers:
        if name == b":status":
            status = value
        elif name == b"content-type":
            content_type = value
    if status != b"200":
        code = {
            b"400": grpc.StatusCode.INTERNAL,
            b"401": grpc.StatusCode.UNAUTHENTICATED,
            b"403": grpc.StatusCode.PERMISSION_DENIED,
            b"404": grpc.StatusCode.UNIMPLEMENTED,
            b"429": grpc.StatusCode.UNAVAILABLE,
            b"502": grpc.StatusCode.UNAVAILABLE,
            b"503": grpc.StatusCode.UNAVAILABLE,
            b"504": grpc.StatusCode.UNAVAILABLE,
        }.get(status or b"", grpc.StatusCode.UNKNOWN)
        return code, f"the server answered HTTP status {status!r}, not 200"
    if content_type is None or not content_type.startswith(b"application/grpc"):
        return grpc.StatusCode.UNKNOWN, f"the server answered content-type {content_type!r}, not application/grpc"
    return None


EMPTY = grpc.aio.Metadata()


def rpc_error(
    code: grpc.StatusCode,
    details: str,
    initial: grpc.aio.Metadata = EMPTY,
    trailing: grpc.aio.Metadata = EMPTY,
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, initial, trailing, details, None)

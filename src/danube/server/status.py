"""The one place where the server ends a call with a gRPC status for a project error.

Every service handler funnels its errors through :func:`status_for`, so a
client always sees the same code for the same failure, with the error's own
sentence as the message.  Which code each error class travels as is the table of
``danube.status_codes``, which the client (``danube.client.errors``) reads the
other way; :func:`error_class_for` is that reading.
"""

from __future__ import annotations

import logging

import grpc

from danube.errors import DanubeError
from danube.status_codes import ERROR_CODES, ERROR_FOR_CODE

log = logging.getLogger(__name__)


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code for an error raised while serving a request."""
    for cls, code in ERROR_CODES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, DanubeError):
        return grpc.StatusCode.UNAVAILABLE if exc.retriable else grpc.StatusCode.INTERNAL
    return grpc.StatusCode.INTERNAL


def error_class_for(code: grpc.StatusCode) -> type[DanubeError] | None:
    """The inverse of :func:`status_for`: the first class the table lists with ``code``, or None
    for a code no DanubeError is sent with (INTERNAL, CANCELLED, ...)."""
    return ERROR_FOR_CODE.get(code)


# The last wall against echoing client input: whatever an error says, its status message
# keeps at most this many characters (errors quote input with danube.errors.quote; this
# catches any that do not).  grpc-message is percent-encoded in a header, and clients
# refuse oversized metadata, so a whole 100 KB name would hide the error itself.
MAX_MESSAGE_CHARS = 1024


def message_for(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, DanubeError):
        text = text or type(exc).__name__
    else:
        text = f"internal error: {type(exc).__name__}: {text}" if text else f"internal error: {type(exc).__name__}"
    return cap_message(text)


def cap_message(text: str) -> str:
    """``text`` cut to MAX_MESSAGE_CHARS characters, saying how long it was."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}…(message cut, {len(text.encode('utf-8', 'surrogatepass'))} bytes)"


async def abort(context: grpc.aio.ServicerContext, exc: BaseException):
    """End the RPC with the status for ``exc`` (never returns)."""
    code = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("internal error while serving a request", exc_info=exc)
    owner = getattr(exc, "owner_url", None)  # cluster mode: the topic's owner (docs/cluster.md)
    if owner:
        await context.abort(code, message_for(exc), trailing_metadata=(("x-danube-broker-url", owner),))
    await context.abort(code, message_for(exc))

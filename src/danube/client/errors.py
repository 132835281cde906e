"""Turns gRPC failures seen by the client back into ``danube.errors`` types.

The table is the server's (``danube.status_codes``, shared by both sides): a status code
becomes the first error class the server sends it for, so an error keeps its code and its
``retriable`` flag across the wire (``tests/unit/client/test_errors.py`` checks every class).
"""

from __future__ import annotations

import grpc

from danube.errors import ClientError, DanubeError, FencedError, TopicTerminatedError
from danube.status_codes import ERROR_FOR_CODE

# Codes after which the same call may succeed once the topic is looked up again.
RETRIABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

# Codes danube's servers never send for a DanubeError but other gRPC peers use for the same failure.
_OTHER_PEERS: dict[grpc.StatusCode, type[DanubeError]] = {grpc.StatusCode.ABORTED: FencedError}

_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


# What grpc-core reports when the client writes on a stream the server has just ended
# (e.g. an ack racing the server's UNAVAILABLE): the server's status is lost, the stream is gone.
_CORE_WRITE_RACE = "Internal error from Core"


def is_lost_stream(exc: BaseException) -> bool:
    """The client's own gRPC core failed a write on a stream that had ended: reconnecting helps."""
    return (
        isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() == grpc.StatusCode.INTERNAL
        and (exc.details() or "").startswith(_CORE_WRITE_RACE)
    )


def is_retriable(exc: BaseException) -> bool:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in RETRIABLE_CODES or is_lost_stream(exc)
    return bool(getattr(exc, "retriable", False))


def error_class(code: grpc.StatusCode) -> type[DanubeError]:
    """The error class the client raises for ``code`` (ClientError for codes without one)."""
    return ERROR_FOR_CODE.get(code) or _OTHER_PEERS.get(code, ClientError)


def error_for(code: grpc.StatusCode, message: str, *, retriable: bool | None = None) -> DanubeError:
    error = error_class(code)(f"{code.name}: {message}")
    error.grpc_code = code  # type: ignore[attr-defined]
    if retriable is not None:
        error.retriable = retriable
    return error


def from_rpc_error(exc: grpc.aio.AioRpcError) -> DanubeError:
    return error_for(exc.code(), exc.details() or "", retriable=is_retriable(exc))


def from_batch_status(code_number: int, message: str, retriable: bool) -> DanubeError:
    code = _CODE_BY_NUMBER.get(code_number, grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.FAILED_PRECONDITION and not retriable:
        # a batch status carries the flag: the one non-retriable error of this code is a publish to
        # a terminated topic (a stale partitioning version, FencedError, is retriable)
        error = TopicTerminatedError(f"{code.name}: {message}")
        error.grpc_code = code  # type: ignore[attr-defined]
        return error
    return error_for(code, message, retriable=retriable)

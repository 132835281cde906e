"""Turns gRPC failures seen by the client back into ``danube.errors`` types."""

from __future__ import annotations

import grpc

from danube.errors import (
    AlreadyExistsError, ClientError, DanubeError, FencedError, FrameFormatError,
    InvalidArgumentError, NotFoundError, NotServedHereError, PolicyViolationError,
)

# Codes after which the same call may succeed once the topic is looked up again.
RETRIABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
})

_BY_CODE: dict[grpc.StatusCode, type[DanubeError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.DATA_LOSS: FrameFormatError,
    grpc.StatusCode.FAILED_PRECONDITION: FencedError,
    grpc.StatusCode.ABORTED: FencedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: PolicyViolationError,
    grpc.StatusCode.UNAVAILABLE: NotServedHereError,
}

_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


# What grpc-core reports when the client writes on a stream the server has just ended
# (e.g. an ack racing the server's UNAVAILABLE): the server's status is lost, the stream is gone.
_CORE_WRITE_RACE = "Internal error from Core"


def is_lost_stream(exc: BaseException) -> bool:
    """The client's own gRPC core failed a write on a stream that had ended: reconnecting helps."""
    return (isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.INTERNAL
            and (exc.details() or "").startswith(_CORE_WRITE_RACE))


def is_retriable(exc: BaseException) -> bool:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in RETRIABLE_CODES or is_lost_stream(exc)
    return bool(getattr(exc, "retriable", False))


def error_for(code: grpc.StatusCode, message: str, *, retriable: bool | None = None) -> DanubeError:
    cls = _BY_CODE.get(code, ClientError)
    error = cls(f"{code.name}: {message}")
    error.grpc_code = code
    if retriable is not None:
        error.retriable = retriable
    return error


def from_rpc_error(exc: grpc.aio.AioRpcError) -> DanubeError:
    return error_for(exc.code(), exc.details() or "", retriable=is_retriable(exc))


def from_batch_status(code_number: int, message: str, retriable: bool) -> DanubeError:
    return error_for(_CODE_BY_NUMBER.get(code_number, grpc.StatusCode.UNKNOWN), message, retriable=retriable)

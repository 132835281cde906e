"""HTTP statuses of the project's errors, and gRPC failures turned back into them."""

from __future__ import annotations

import grpc

from danube.errors import (
    AlreadyExistsError,
    AuthenticationError,
    DanubeError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PolicyViolationError,
    TopicTerminatedError,
)
from danube.status_codes import ERROR_FOR_CODE


class GatewayRequestError(InvalidArgumentError):
    """A request the gateway refuses before asking a broker (bad JSON, unknown action, too large)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class UpstreamError(DanubeError):
    """The broker could not be reached or failed in a way no project error names."""


# Checked in order, subclasses first.  Danube's gateway answers 502 for the codes it does not name;
# 409 for conflicts is this project's (the UI shows the message either way).
_HTTP_STATUS: tuple[tuple[type[DanubeError], int], ...] = (
    (InvalidArgumentError, 400),
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (AlreadyExistsError, 409),
    (FencedError, 409),
    (TopicTerminatedError, 409),
    (PolicyViolationError, 429),
)

# gRPC code names as Danube's gateway spells them in {"code": ...} (tonic's Debug names)
_CODE_NAMES = {code: "".join(part.capitalize() for part in code.name.split("_")) for code in grpc.StatusCode}


def http_status(exc: BaseException) -> int:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    code = getattr(exc, "grpc_code", None)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return 504
    if code == grpc.StatusCode.UNIMPLEMENTED:  # e.g. rebalancing on a standalone broker
        return 501
    for cls, code in _HTTP_STATUS:
        if isinstance(exc, cls):
            return code
    return 502


def from_rpc_error(exc: grpc.RpcError) -> DanubeError:
    """The project error a broker's status stands for, carrying the code for the JSON body."""
    code = exc.code()
    details = exc.details() or code.name.lower()
    cls = ERROR_FOR_CODE.get(code)
    err: DanubeError
    try:
        err = cls(details) if cls is not None else UpstreamError(details)
    except TypeError:  # pragma: no cover - every class in the table takes a message alone
        err = UpstreamError(details)
    err.grpc_code = code  # type: ignore[attr-defined]
    return err


def error_body(exc: BaseException) -> dict:
    """Danube's error JSON ({"error", "code"}) plus "message", which Danube's UI reads."""
    message = str(exc) or type(exc).__name__
    body = {"error": message, "message": message}
    code = getattr(exc, "grpc_code", None)
    if code is not None:
        body["code"] = _CODE_NAMES.get(code, str(code))
    return body

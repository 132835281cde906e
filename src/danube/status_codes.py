"""The gRPC status code each project error travels as: the one table the server and the client share.

Data only.  The server (``danube.server.status``, the only place that ends a call with a status)
sends the code of the first class in :data:`ERROR_CODES` an error is an instance of; the client
(``danube.client.errors``) raises, for a code, :data:`ERROR_FOR_CODE`'s class — the first class
listed with that code — so an error keeps its code and its ``retriable`` flag across the wire.
Both sides depend on grpcio, so the table holds grpc's ``StatusCode`` values.
"""

from __future__ import annotations

import grpc

from danube.errors import (
    AlreadyExistsError,
    AuthenticationError,
    DanubeError,
    DataLossError,
    FencedError,
    FrameFormatError,
    InvalidArgumentError,
    NotFoundError,
    NotServedHereError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    PolicyViolationError,
    StorageFullError,
    TooManyOpenFilesError,
    TopicSealedError,
    TopicTerminatedError,
    WalClosedError,
)

__all__ = ["ERROR_CODES", "ERROR_FOR_CODE"]

# Checked in order: subclasses before their bases.  The first class listed with a code is the one
# a client raises for it, so it must be constructible from a message alone.  A DanubeError of no
# class here is UNAVAILABLE when retriable, else INTERNAL.
ERROR_CODES: tuple[tuple[type[DanubeError], grpc.StatusCode], ...] = (
    # stored bytes failed their checksum (CorruptStoredFrameError, SegmentCorruptError): lost data
    (DataLossError, grpc.StatusCode.DATA_LOSS),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),  # incl. InvalidTopicName, MessageTooLarge
    (FrameFormatError, grpc.StatusCode.INVALID_ARGUMENT),  # a client's bad frame (CorruptFrameError too)
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (PolicyViolationError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManyOpenFilesError, grpc.StatusCode.RESOURCE_EXHAUSTED),  # the broker's descriptors ran out
    (StorageFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),  # the WAL's file system is full
    (NotServedHereError, grpc.StatusCode.UNAVAILABLE),
    (TopicSealedError, grpc.StatusCode.UNAVAILABLE),  # the topic is moving: look it up again
    (WalClosedError, grpc.StatusCode.UNAVAILABLE),
    (FencedError, grpc.StatusCode.FAILED_PRECONDITION),
    # sealed for good (not retriable); after FencedError, which clients raise for the code
    (TopicTerminatedError, grpc.StatusCode.FAILED_PRECONDITION),
    (OffsetOutOfRangeError, grpc.StatusCode.OUT_OF_RANGE),
    (AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
)

# The same table read the other way: code -> the first class listed with it.  Codes no
# DanubeError is sent with (INTERNAL, CANCELLED, ...) are absent.
ERROR_FOR_CODE: dict[grpc.StatusCode, type[DanubeError]] = {}
for _cls, _code in ERROR_CODES:
    ERROR_FOR_CODE.setdefault(_code, _cls)
del _cls, _code

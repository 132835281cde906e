"""The one error hierarchy of the project.

Every error raised on purpose is a :class:`DanubeError`.  ``retriable`` says
whether the same call may succeed later unchanged.  Translation to gRPC status
codes happens only at the server edge (``danube.server.status``).
"""

from __future__ import annotations


class DanubeError(Exception):
    """Base of every project error."""

    retriable: bool = False

    def __init__(self, message: str = "", *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


# ---------------------------------------------------------------- data format

class FrameFormatError(DanubeError):
    """A frame's structure is invalid (lengths, flags)."""


class CorruptFrameError(FrameFormatError):
    """A frame failed its checksum or a batch is truncated or out of sequence.

    Carries the byte ``position`` in the buffer or file, the frame ``offset``
    when known, and both checksums when the failure is a checksum mismatch.
    """

    def __init__(self, message: str, *, position: int | None, offset: int | None,
                 expected_crc: int | None, actual_crc: int | None, path: str | None = None) -> None:
        self.position = position
        self.offset = offset
        self.expected_crc = expected_crc
        self.actual_crc = actual_crc
        self.path = path
        detail = [message]
        if path is not None:
            detail.append(f"file {path}")
        if position is not None:
            detail.append(f"position {position}")
        if offset is not None:
            detail.append(f"offset {offset}")
        if expected_crc is not None:
            detail.append(f"stored crc 0x{expected_crc:08x}")
        if actual_crc is not None:
            detail.append(f"computed crc 0x{actual_crc:08x}")
        super().__init__(", ".join(detail))


# ---------------------------------------------------------------- WAL and storage

class WalError(DanubeError):
    """A write-ahead log operation failed."""


class WalClosedError(WalError):
    """The WAL was used after close()."""


class OffsetOutOfRangeError(WalError):
    """A read asked for an offset the log does not hold (pruned, or beyond the end)."""

    def __init__(self, message: str, *, offset: int, first_offset: int, next_offset: int) -> None:
        self.offset = offset
        self.first_offset = first_offset
        self.next_offset = next_offset
        super().__init__(f"{message} (offset {offset}, log holds {first_offset}..{next_offset - 1})")


class StorageError(DanubeError):
    """Durable storage failed (a backend I/O error)."""

    retriable = True


class SegmentCorruptError(StorageError):
    """A durable segment failed its etag or a frame checksum."""

    retriable = False

    def __init__(self, message: str, *, segment_id: str, offset: int | None = None,
                 expected: str | int | None = None, actual: str | int | None = None) -> None:
        self.segment_id = segment_id
        self.offset = offset
        self.expected = expected
        self.actual = actual
        detail = [message, f"segment {segment_id}"]
        if offset is not None:
            detail.append(f"offset {offset}")
        if expected is not None:
            detail.append(f"expected {expected}")
        if actual is not None:
            detail.append(f"actual {actual}")
        super().__init__(", ".join(detail))


class TopicSealedError(StorageError):
    """The topic was sealed for a handoff and accepts no writes here."""


class MetadataError(DanubeError):
    """The metadata store failed."""

    retriable = True


# ---------------------------------------------------------------- broker

class InvalidArgumentError(DanubeError):
    """A request is malformed (bad name, bad option value)."""


class InvalidTopicNameError(InvalidArgumentError):
    """A topic name is not ``/namespace/topic``."""


class MessageTooLargeError(InvalidArgumentError):
    """A message exceeds the topic's max_message_size."""


class NotFoundError(DanubeError):
    """A producer, consumer, topic or subscription id is unknown."""


class AlreadyExistsError(DanubeError):
    """The resource exists and cannot be shared (e.g. a second exclusive consumer)."""


class PolicyViolationError(DanubeError):
    """A topic policy limit was reached (producers, consumers, subscriptions, rates)."""

    retriable = True


class NotServedHereError(DanubeError):
    """This broker does not serve the topic (now); look it up again."""

    retriable = True


class FencedError(DanubeError):
    """A request carried a stale partitioning version or ownership epoch."""

    retriable = True


class ClientError(DanubeError):
    """A client-side failure (connection lost, retries exhausted)."""

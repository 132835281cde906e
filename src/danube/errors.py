"""The one error hierarchy of the project.

Every error raised on purpose is a :class:`DanubeError`.  ``retriable`` says
whether the same call may succeed later unchanged.  The gRPC status code each
error travels as is the table of ``danube.status_codes``; only the server edge
(``danube.server.status``) ends a call with it, and the client reads it back.
"""

from __future__ import annotations

# Client input quoted in an error message keeps at most this many characters: a hostile
# 100 KB name must not travel back whole in a status message (clients cap metadata size).
QUOTE_PREFIX_CHARS = 64


def quote(value: object, limit: int = QUOTE_PREFIX_CHARS) -> str:
    """``value`` for an error message: its repr, cut to ``limit`` characters of input.

    A longer value keeps its first ``limit`` characters followed by ``…(N bytes)``,
    N being the size of the whole value (UTF-8 for text), so the reader still learns
    how large it was."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return repr(raw) if len(raw) <= limit else f"{raw[:limit]!r}…({len(raw)} bytes)"
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    size = len(text.encode("utf-8", "surrogatepass"))
    return f"{text[:limit]!r}…({size} bytes)"


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
    Bytes read back from a file raise :class:`CorruptStoredFrameError`.
    """

    def __init__(
        self,
        message: str,
        *,
        position: int | None,
        offset: int | None,
        expected_crc: int | None,
        actual_crc: int | None,
        path: str | None = None,
    ) -> None:
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


class DataLossError(DanubeError):
    """Stored data is damaged (a checksum or an etag failed): retrying will not bring it back."""


class CorruptStoredFrameError(CorruptFrameError, DataLossError):
    """Bytes read back from a WAL file fail their checksum or structure; ``path`` names the file.

    A class of its own because damaged stored bytes are lost data while a client's bad
    frame (a plain :class:`CorruptFrameError`) is bad input: they get different gRPC codes.
    """


# ---------------------------------------------------------------- WAL and storage


class WalError(DanubeError):
    """A write-ahead log operation failed."""


class WalClosedError(WalError):
    """The WAL was used after close()."""


class WalBusyError(WalError):
    """Another process holds the WAL's lock (one writer per log): a topic's previous owner has not
    closed it yet (it is stopping, or stopped and not yet fenced).  Retriable: it lets go soon."""

    retriable = True


class TooManyOpenFilesError(WalError):
    """The process ran out of file descriptors (EMFILE/ENFILE) opening a log: raise the limit
    (``ulimit -n``; the broker raises its soft limit to the hard limit at start) or let idle
    topics close sooner (``storage.wal.idle_close_seconds``)."""

    retriable = True


class OffsetOutOfRangeError(WalError):
    """A read asked for an offset the log does not hold (pruned, or beyond the end)."""

    def __init__(
        self,
        message: str,
        *,
        offset: int | None = None,
        first_offset: int | None = None,
        next_offset: int | None = None,
    ) -> None:
        # The offsets are optional so a client can rebuild this error from a status message alone.
        self.offset = offset
        self.first_offset = first_offset
        self.next_offset = next_offset
        if offset is not None and first_offset is not None and next_offset is not None:
            message = f"{message} (offset {offset}, log holds {first_offset}..{next_offset - 1})"
        super().__init__(message)


class StorageError(DanubeError):
    """Durable storage failed (a backend I/O error)."""

    retriable = True


class SegmentCorruptError(StorageError, DataLossError):
    """A durable segment failed its etag or a frame checksum."""

    retriable = False

    def __init__(
        self,
        message: str,
        *,
        segment_id: str,
        offset: int | None = None,
        expected: str | int | None = None,
        actual: str | int | None = None,
    ) -> None:
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


class StorageFullError(StorageError):
    """The file system under a topic's WAL has no space left: the write was refused, nothing of it
    stored; writes are accepted again as soon as space is freed (retriable, RESOURCE_EXHAUSTED)."""


class MetadataError(DanubeError):
    """The metadata store failed."""

    retriable = True


# ---------------------------------------------------------------- broker


class InvalidArgumentError(DanubeError):
    """A request is malformed (bad name, bad option value)."""


class MalformedRequestError(InvalidArgumentError):
    """A request's protobuf bytes do not parse (truncated, a length past the end, a bad wire type)."""


class InvalidNameError(InvalidArgumentError):
    """A name (namespace, topic, subscription, consumer, producer) breaks the name rule
    of ``danube.metadata.keys``."""


class InvalidTopicNameError(InvalidNameError):
    """A topic name is not ``/namespace/topic``."""


class UnsafePathError(InvalidArgumentError):
    """A storage path built from a name would lie outside its root (the second wall behind
    the name rule: raised before anything is opened, created, renamed or removed)."""


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


class StreamSupersededError(NotServedHereError):
    """A newer receive stream took over this consumer; the older one should end quietly."""


class FencedError(DanubeError):
    """A batch carried a stale partitioning version (the version fence of live repartition).

    The other two fences refuse with other classes: a broker whose cluster lease is not renewed
    with NotServedHereError, an old owner of a shared WAL with TopicSealedError.

    Clients and the gateway raise it for every FAILED_PRECONDITION they receive (the code's first
    class in ``danube.status_codes``), so there it also stands for the admin API's refusals sent
    with that code: a namespace that still has topics, a call only the cluster leader answers, a
    partition deleted on its own."""

    retriable = True


class TopicTerminatedError(DanubeError):
    """The topic was terminated (sealed for good: a scalable topic's segment a split or merge
    replaced; a partition a shrink retired is not terminated): no publish is accepted any more, on
    any broker, after any restart; its history stays readable to the end.  Not retriable: the same
    publish to this topic never succeeds."""

    @classmethod
    def of(cls, topic: str) -> "TopicTerminatedError":
        return cls(f"topic {quote(topic)} is terminated: it accepts no more publishes (its history stays readable)")


class ClientError(DanubeError):
    """A client-side failure (connection lost, retries exhausted)."""


# ---------------------------------------------------------------- security


class AuthenticationError(DanubeError):
    """A call carried no credentials, or ones that do not verify (expired, forged, wrong issuer)."""


class PermissionDeniedError(DanubeError):
    """The caller is authenticated but no role bound to it grants the permission on the resource."""

    def __init__(
        self,
        message: str = "",
        *,
        permission: str | None = None,
        resource: str | None = None,
        principal: str | None = None,
    ) -> None:
        super().__init__(message)
        self.permission = permission
        self.resource = resource
        self.principal = principal

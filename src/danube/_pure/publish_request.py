"""Pure-Python twin of ``danube._core.publish_request``: the batch lane's ``PublishRequest``
read from its protobuf bytes in one call, into exactly the fields the Publish handler and the
auth guard use (no protobuf message object, no field access through protobuf).

The bytes (``proto/danube_batch/batch.proto``), a sequence of fields in any order, each a tag
varint ``field_number << 3 | wire_type`` then its value:

  field 1 ``sequence``              varint (wire type 0), uint64
  field 2 ``producer_id``           varint, uint64; one choice of the oneof ``producer``
  field 3 ``create``                length-delimited (wire type 2): a ``ProducerSpec`` message;
                                    the other choice of ``producer``
  field 4 ``frames``                length-delimited: the batch's frames, bytes as they are
  field 5 ``partitioning_version``  varint, uint64, ``optional`` (absent: None)
  field 6 ``schema_id``             varint, uint64, ``optional``
  field 7 ``schema_version``        varint, uint32 (the low 32 bits), ``optional``

Read as protobuf (the upb runtime) reads them, which the differential tests check:

* a field seen twice: the last one wins; ``create`` seen twice: the two messages merged; the
  oneof takes whichever of ``producer_id`` and ``create`` came last (a ``create`` after a
  ``producer_id`` starts a new message);
* a known field number with another wire type, and any unknown field, is skipped (no packed
  form: none of these fields is repeated);
* varints take at most 10 bytes, the bits beyond 64 dropped (overlong forms are fine); a tag
  at most 5 bytes, below 2**32, field number not 0; a length at most 5 bytes and within the
  bytes left; wire types 6 and 7 do not exist; groups (wire types 3 and 4) nest at most 100
  deep (99 inside ``create``) and end with their own field number.

Anything else raises :class:`~danube.errors.MalformedRequestError`, as protobuf raises
``DecodeError`` (the call ends INTERNAL, as for any request that does not parse).  A
``create`` is parsed by protobuf itself (a rare request: it names a producer to create), so
its strings are checked for UTF-8 as protobuf checks them.

A request naming its producer by id gets its frames checked for that producer, as the lane
would check them (``frame.check_batch``): ``frames`` is then the checked copy
(``CheckedFrames``), else the bytes (a batch the check refuses, an empty one, or one whose
producer is created by the request), which the lane checks itself and refuses as before.
"""

from __future__ import annotations

from danube._pure.frame import check_batch
from danube.errors import CorruptFrameError, FrameFormatError, MalformedRequestError
from danube.proto.danube_batch import batch_pb2 as _pb

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_MAX_LENGTH = (1 << 31) - 1
MAX_GROUP_DEPTH = 100  # protobuf's own nesting limit, counted from the request


class PublishRequest:
    """The fields of one ``PublishRequest``: ``producer_id`` is None unless the oneof chose it,
    ``create`` (a ``ProducerSpec``) None unless it chose that; the optionals None when absent."""

    __slots__ = (
        "sequence",
        "producer_id",
        "create",
        "frames",
        "partitioning_version",
        "schema_id",
        "schema_version",
    )

    def __init__(
        self,
        sequence: int,
        producer_id: int | None,
        create,
        frames: bytes | bytearray,
        partitioning_version: int | None,
        schema_id: int | None,
        schema_version: int | None,
    ) -> None:
        self.sequence = sequence
        self.producer_id = producer_id
        self.create = create
        self.frames = frames
        self.partitioning_version = partitioning_version
        self.schema_id = schema_id
        self.schema_version = schema_version

    def __repr__(self) -> str:
        return (
            f"PublishRequest(sequence={self.sequence}, producer_id={self.producer_id}, create={self.create!r}, "
            f"frames=<{len(self.frames)} bytes>, partitioning_version={self.partitioning_version}, "
            f"schema_id={self.schema_id}, schema_version={self.schema_version})"
        )


def _bad(what: str, pos: int) -> MalformedRequestError:
    return MalformedRequestError(f"malformed PublishRequest: {what} at byte {pos}")


def _varint(data, pos: int, end: int, limit: int, what: str) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``, at most ``limit`` bytes."""
    value = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _bad(f"{what} runs past the end", start)
        if pos - start >= limit:
            raise _bad(f"{what} longer than {limit} bytes", start)
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _tag(data, pos: int, end: int, in_group: bool = False) -> tuple[int, int, int]:
    """(field number, wire type, next position).  Field number 0 is refused in a message, not
    inside a group being skipped (protobuf's upb reads it there)."""
    tag, nxt = _varint(data, pos, end, 5, "tag")
    if tag > _MASK32:
        raise _bad("tag above 2**32", pos)
    if tag >> 3 == 0 and not in_group:
        raise _bad("field number 0", pos)
    return tag >> 3, tag & 7, nxt


def _length(data, pos: int, end: int) -> tuple[int, int]:
    """(end of the length-delimited value, its start)."""
    length, nxt = _varint(data, pos, end, 5, "length")
    if length > _MAX_LENGTH or length > end - nxt:
        raise _bad(f"length {length} past the end", pos)
    return nxt + length, nxt


def _skip(data, pos: int, end: int, field: int, wire_type: int, depth: int, max_depth: int) -> int:
    """The position after the value of a field skipped (unknown, or a known field with another
    wire type); a group is walked to its own end."""
    if wire_type == 0:
        return _varint(data, pos, end, 10, "varint")[1]
    if wire_type == 1 or wire_type == 5:
        size = 8 if wire_type == 1 else 4
        if end - pos < size:
            raise _bad("fixed-size value runs past the end", pos)
        return pos + size
    if wire_type == 2:
        return _length(data, pos, end)[0]
    if wire_type == 3:
        if depth >= max_depth:
            raise _bad(f"groups nested deeper than {max_depth}", pos)
        while True:
            inner, inner_type, pos = _tag(data, pos, end, True)
            if inner_type == 4:
                if inner != field:
                    raise _bad(f"group {field} ended by field {inner}", pos)
                return pos
            pos = _skip(data, pos, end, inner, inner_type, depth + 1, max_depth)
    if wire_type == 4:
        raise _bad("end of a group never started", pos)
    raise _bad(f"wire type {wire_type}", pos)


def _check_message(data, pos: int, end: int, max_depth: int) -> None:
    """The wire format of an embedded message walked (each field skipped), with the group
    depth left to it."""
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        pos = _skip(data, pos, end, field, wire_type, 0, max_depth)


def parse(data) -> PublishRequest:
    """The fields of the ``PublishRequest`` in ``data`` (bytes or any buffer)."""
    if not isinstance(data, bytes):
        data = bytes(data)
    end = len(data)
    pos = 0
    sequence = 0
    producer_id = None
    create = None
    frames: bytes | bytearray = b""
    partitioning_version = None
    schema_id = None
    schema_version = None
    while pos < end:
        field, wire_type, pos = _tag(data, pos, end)
        if wire_type == 0 and field in (1, 2, 5, 6, 7):
            value, pos = _varint(data, pos, end, 10, "varint")
            value &= _MASK64
            if field == 1:
                sequence = value
            elif field == 2:
                producer_id = value
                create = None
            elif field == 5:
                partitioning_version = value
            elif field == 6:
                schema_id = value
            else:
                schema_version = value & _MASK32
        elif wire_type == 2 and (field == 3 or field == 4):
            stop, start = _length(data, pos, end)
            if field == 4:
                frames = data[start:stop]
            else:
                _check_message(data, start, stop, MAX_GROUP_DEPTH - 1)
                if create is None:
                    create = _pb.ProducerSpec()
                    producer_id = None
                try:
                    create.MergeFromString(data[start:stop])
                except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, said as ours
                    raise _bad(f"create does not parse ({exc})", start) from None
            pos = stop
        else:
            pos = _skip(data, pos, end, field, wire_type, 0, MAX_GROUP_DEPTH)
    if frames and producer_id is not None:
        try:
            frames = check_batch(frames, producer_id)
        except (CorruptFrameError, FrameFormatError):
            pass  # the lane checks the bytes again and refuses them with this error
    return PublishRequest(sequence, producer_id, create, frames, partitioning_version, schema_id, schema_version)

"""The batch lane's messages as they cross the wire, shared by its publish and consume handlers
(``danube.server.batch_lane``): a batch's status from an error, the frames check of a publish
request, an ack request's ranges, and the answers the native server sends already serialized
(``Encoded``): a stored batch's ``PublishAck`` and a delivery's ``ConsumeResponse`` built around
the delivered frames' own buffer."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from danube import _native
from danube import message_codec as frame_codec
from danube.errors import InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.protowire import varint
from danube.server import status as status_map
from danube.server.h2grpc.wire import Encoded

if TYPE_CHECKING:
    from danube.routing.repartition.version_fence import StaleRoutingError


def batch_status(exc: BaseException) -> pb.BatchStatus:
    status = pb.BatchStatus(
        code=status_map.status_for(exc).value[0],
        message=status_map.message_for(exc),
        retriable=bool(getattr(exc, "retriable", False)),
    )
    if getattr(exc, "partitions", None):  # a stale partitioning version (docs/repartition.md)
        stale = cast("StaleRoutingError", exc)
        status.partitioning_version = stale.version
        status.partitions = stale.partitions
        status.redirect_url = stale.redirect_url
    return status


def refused_ack(sequence: int, producer_id: int, exc: BaseException) -> pb.PublishAck:
    """The ack of a batch refused with ``exc`` (nothing stored)."""
    ack = pb.PublishAck(sequence=sequence, producer_id=producer_id)
    ack.status.CopyFrom(batch_status(exc))
    return ack


def check_ack_range(first: int, last: int) -> None:
    """The ``InvalidArgumentError`` for an ack range the broker does not take."""
    if last < first:
        raise InvalidArgumentError(f"ack range {first}..{last} ends before it starts")
    if last - first >= 1_000_000:
        raise InvalidArgumentError(f"ack range {first}..{last} spans more than 1,000,000 offsets")


def ack_pairs(ranges) -> tuple[list[tuple[int, int]], int]:
    """An ack request's ranges as (first, last) pairs, and how many offsets they name."""
    if len(ranges) == 1:  # (the usual ack: the client merges consecutive deliveries' acks)
        r = ranges[0]
        first, last = r.first, r.last
        if 0 <= last - first < 1_000_000:
            return [(first, last)], last - first + 1
    pairs: list[tuple[int, int]] = []
    named = 0
    for r in ranges:
        first, last = r.first, r.last
        check_ack_range(first, last)
        pairs.append((first, last))
        named += last - first + 1
    return pairs, named


def redelivery_counts_in_frame_order(buf, by_offset) -> list[int]:
    """One count per frame of ``buf``, in frame order (0 = first delivery), from the broker's
    ``{offset: count}``; empty when no message of the batch is a redelivery."""
    if not by_offset or not any(by_offset.values()):
        return []
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    return [by_offset.get(int.from_bytes(view[p : p + 8], "little"), 0) for p in frame_codec.frame_positions(view)]


_PublishAck = pb.PublishAck


def encoded_ack(sequence: int, producer_id: int, first: int, last: int) -> Encoded:
    """A stored batch's ``PublishAck``, serialized for the native server (protobuf's own C
    serializer: about twice as fast as varints written in Python)."""
    return Encoded(
        (
            _PublishAck(
                sequence=sequence, producer_id=producer_id, first_offset=first, last_offset=last, count=last - first + 1
            ).SerializeToString(),
        )
    )


# ConsumeResponse.batch (field 2) and ConsumeBatch.frames (field 1), both length-delimited.
_BATCH_TAG = b"\x12"
_FRAMES_TAG = b"\x0a"


def encoded_batch(frames, rest: bytes) -> Encoded:
    """``ConsumeResponse(batch=...)`` serialized around the delivered frames' own buffer: the
    frames field first, then ``rest`` (the batch's other fields; protobuf fields may come in
    any order)."""
    size = len(frames)
    frames_head = _FRAMES_TAG + varint(size)
    inner = len(frames_head) + size + len(rest)
    return Encoded((_BATCH_TAG + varint(inner) + frames_head, frames, rest))


_pbwire = _native.load("pbwire")
# A fresh delivery's ConsumeResponse as an ``Encoded`` of its three parts in one compiled call (no
# ``__new__`` frame, no tuple of parts copied): the push path calls it inline with ``Encoded``.
consume_batch_as = _pbwire.consume_batch_as


def encoded_delivery(frames, first: int, last: int, count: int) -> Encoded:
    """A fresh delivery's ``ConsumeResponse``: the bytes of ``encoded_batch`` with ``ConsumeBatch``'s
    offsets and count as protobuf serializes them, its fields written by the compiled core in one
    call (no protobuf message per delivery)."""
    return consume_batch_as(Encoded, frames, first, last, count)

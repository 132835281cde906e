"""An in-stream ack request encoded straight to protobuf bytes.

At a thousand topics nearly every ack request a consumer writes carries one range, and building
``ConsumeRequest(ack=AckBatch(ranges=[OffsetRange(...)]))`` in upb (each nested message built,
then copied into its parent) and serializing it cost three times what writing its few bytes here
does.  ``ack_request`` writes the bytes ``SerializeToString`` would (fields in number order, proto3
defaults left out); the Consume streams' serializer passes bytes through as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from danube.protowire import varint


def ack_request(ranges: Iterable[Sequence[int]]) -> bytes:
    """``ConsumeRequest(ack=AckBatch(consumer_id=0, ranges=[OffsetRange(first, last), ...]))``."""
    batch = bytearray()
    for first, last in ranges:
        body = (b"\x08" + varint(first) if first else b"") + (b"\x10" + varint(last) if last else b"")
        batch += b"\x12"
        batch += varint(len(body))
        batch += body
    return b"\x22" + varint(len(batch)) + batch


def passing_bytes(message_type: Any):
    """A request serializer for ``message_type`` that writes bytes (encoded here) as they are."""
    serialize = message_type.SerializeToString

    def serializer(request) -> bytes:
        return request if type(request) is bytes else serialize(request)

    return serializer

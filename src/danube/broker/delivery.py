"""What a receive hands a consumer, and the frame cutting every dispatcher uses."""

from __future__ import annotations

import enum
import struct
from types import MappingProxyType
from typing import Final, Mapping

from danube import message_codec

_HEADER = message_codec.HEADER_SIZE
_frames_within = message_codec.frames_within
# a frame's offset: its first 8 bytes, little-endian (``frame_offset``; inline on hot paths)
FRAME_OFFSET = struct.Struct("<Q").unpack_from


# What a fresh delivery's redelivery_counts is: shared, read-only, no dict per delivery.
NO_REDELIVERIES: Mapping[int, int] = MappingProxyType({})


class Delivery:
    """Frames handed to one consumer: whole frames, offsets stamped.

    ``redelivery_counts`` maps offset -> times redelivered, only for redelivered
    messages.  Offsets are consecutive unless the subscription is key_shared or
    the delivery holds redeliveries.  One per receive: slots, no dict of its own.
    """

    __slots__ = ("frames", "first_offset", "last_offset", "count", "redelivery_counts")

    def __init__(
        self,
        frames: memoryview | bytes,
        first_offset: int,
        last_offset: int,
        count: int,
        redelivery_counts: Mapping[int, int] = NO_REDELIVERIES,
    ) -> None:
        self.frames = frames
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.count = count
        self.redelivery_counts = redelivery_counts

    def __repr__(self) -> str:
        return (
            f"Delivery(first_offset={self.first_offset}, last_offset={self.last_offset}, count={self.count}, "
            f"{len(self.frames)} bytes, redelivery_counts={dict(self.redelivery_counts)})"
        )


NOTHING = Delivery(b"", -1, -1, 0)  # an interrupted receive


class MustAwait(enum.Enum):
    """What a fetch without an await answers when only the awaited fetch can decide (a storage
    read that must wait, a redelivery, key routing)."""

    MUST_AWAIT = "must await"


MUST_AWAIT: Final = MustAwait.MUST_AWAIT


def cut_frames(buf, max_messages: int, max_bytes: int) -> tuple[memoryview, int]:
    """The longest prefix of whole frames within both limits (always at least one frame).

    The frame walk is one codec call (``message_codec.frames_within``, compiled), so a
    delivery costs no Python work per message."""
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    end, count = _frames_within(view, max_messages, max_bytes)
    return view[:end], count


def split_frames(buf) -> list[memoryview]:
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    positions = message_codec.frame_positions(view)
    out = []
    for i, p in enumerate(positions):
        end = positions[i + 1] if i + 1 < len(positions) else len(view)
        out.append(view[p:end])
    return out


def frame_offset(view) -> int:
    # (unpack_from reads the buffer in place: no 8-byte view and no bytes copy per delivery)
    return FRAME_OFFSET(view)[0]

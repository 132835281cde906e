"""What a receive hands a consumer, and the frame cutting every dispatcher uses."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from danube import frames

_HEADER = frames.HEADER_SIZE


@dataclass
class Delivery:
    """Frames handed to one consumer: whole frames, offsets stamped.

    ``redelivery_counts`` maps offset -> times redelivered, only for redelivered
    messages.  Offsets are consecutive unless the subscription is key_shared or
    the delivery holds redeliveries.
    """

    frames: memoryview | bytes
    first_offset: int
    last_offset: int
    count: int
    redelivery_counts: dict[int, int] = field(default_factory=dict)


NOTHING = Delivery(b"", -1, -1, 0)  # an interrupted receive


def cut_frames(buf, max_messages: int, max_bytes: int) -> tuple[memoryview, int]:
    """The longest prefix of whole frames within both limits (always at least one frame).

    The frame walk is one codec call (``frames.frame_positions``, compiled), so a
    delivery costs no Python work per message."""
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    n = len(view)
    if n < _HEADER:
        return view[:0], 0
    positions = frames.frame_positions(view)
    count = min(len(positions), max_messages)
    if count == 0:
        return view[:0], 0
    end = positions[count] if count < len(positions) else n
    if end > max_bytes and count > 1:
        # positions[k] is where the first k frames end: keep the most that end within max_bytes
        count = max(1, bisect.bisect_right(positions, max_bytes, 1, count) - 1)
        end = positions[count]
    return view[:end], count


def split_frames(buf) -> list[memoryview]:
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    positions = frames.frame_positions(view)
    out = []
    for i, p in enumerate(positions):
        end = positions[i + 1] if i + 1 < len(positions) else len(view)
        out.append(view[p:end])
    return out


def frame_offset(view) -> int:
    return int.from_bytes(view[0:8], "little")

"""The offsets a consumer's application acked, kept as merged ranges.

After the consumer follows its topic (re-subscribes after CLOSE or a broken
stream) the broker redelivers from the subscription's persisted cursor, and
in-stream acks sent just before the move may never have been applied.  The
consumer uses this set to drop redeliveries of messages the application
already acked (and acks them again), so an acked message is never handed out
twice.  Acking in order keeps one range; the set keeps at most ``max_ranges``
ranges, forgetting the oldest (lowest) ones first.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable


class AckedOffsets:
    __slots__ = ("_firsts", "_lasts", "max_ranges", "highest")

    def __init__(self, max_ranges: int = 10_000) -> None:
        if max_ranges < 1:
            raise ValueError("max_ranges must be at least 1")
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        self.max_ranges = max_ranges
        # The highest acked offset remembered, -1 when none: an attribute kept by add_range (the
        # delivery path reads it for every batch; a property would be a call each time)
        self.highest = -1

    def __len__(self) -> int:
        """Number of ranges (not offsets)."""
        return len(self._firsts)

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._firsts, self._lasts))

    def add(self, offset: int) -> None:
        self.add_range(offset, offset)

    def add_many(self, offsets: Iterable[int]) -> None:
        for offset in offsets:
            self.add_range(offset, offset)

    def add_range(self, first: int, last: int) -> None:
        if last < first:
            raise ValueError(f"range {first}..{last} ends before it starts")
        firsts, lasts = self._firsts, self._lasts
        if not lasts or first > lasts[-1] + 1:  # the common case: after everything
            firsts.append(first)
            lasts.append(last)
        elif first >= firsts[-1] and first <= lasts[-1] + 1 and last >= lasts[-1]:
            lasts[-1] = last  # extends the last range
        else:
            # Ranges overlapping or touching [first, last] are merged into one.
            lo = bisect_right(lasts, first - 2)  # first range ending at or after first - 1
            hi = bisect_right(firsts, last + 1)  # ranges starting after last + 1 stay
            if lo < hi:
                first = min(first, firsts[lo])
                last = max(last, lasts[hi - 1])
            firsts[lo:hi] = [first]
            lasts[lo:hi] = [last]
        self.highest = lasts[-1]
        if len(firsts) > 2 * self.max_ranges:  # trimmed in bulk: amortised O(1)
            drop = len(firsts) - self.max_ranges
            del firsts[:drop]
            del lasts[:drop]

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self._firsts, offset) - 1
        return i >= 0 and offset <= self._lasts[i]

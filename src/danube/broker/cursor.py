"""Per-subscription acknowledgement state: what is in flight, what waits for
redelivery, and the cursor (the last contiguous acked offset).

Deliveries are tracked as *runs* of consecutive offsets (a delivered batch is
one run), so a batch of a thousand messages costs one object, not a thousand.
Acks arrive as offsets or ranges, in any order; the cursor only moves over
offsets that are all acked, so an out-of-order ack never skips a message.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from typing import Iterable


def to_ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Collapse offsets (any order, duplicates allowed) into sorted inclusive ranges."""
    if isinstance(offsets, range):
        if offsets.step != 1 or len(offsets) == 0:
            offsets = list(offsets)
        else:
            return [(offsets.start, offsets.stop - 1)]
    values = sorted(set(int(o) for o in offsets))
    out: list[tuple[int, int]] = []
    if not values:
        return out
    start = prev = values[0]
    for v in values[1:]:
        if v != prev + 1:
            out.append((start, prev))
            start = v
        prev = v
    out.append((start, prev))
    return out


class Run:
    """Consecutive offsets delivered together to one consumer."""

    __slots__ = ("first", "last", "consumer_id", "deadline", "settled", "remaining")

    def __init__(self, first: int, last: int, consumer_id: int, deadline: float) -> None:
        self.first = first
        self.last = last
        self.consumer_id = consumer_id
        self.deadline = deadline
        self.settled: set[int] | None = None  # offsets acked or taken back (None = none yet)
        self.remaining = last - first + 1

    def outstanding(self) -> list[int]:
        settled = self.settled or ()
        return [o for o in range(self.first, self.last + 1) if o not in settled]


_new = object.__new__


class AckTracker:
    """In-flight runs, the redelivery queue and the cursor of one subscription."""

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor  # last contiguous acked offset (-1: nothing yet)
        self.unacked = 0  # delivered, not acked, not waiting for redelivery
        self._runs: dict[int, Run] = {}
        self._firsts: list[int] = []
        # Runs in delivery order; with one ack timeout per subscription that is deadline order.
        # Its first run is always live (a dropped run leaves from the front at once), so the next
        # ack deadline is one look at ``order[0]``, with no clean-up on the way.
        self.order: deque[Run] = deque()
        # Heap (ready_at, offset) of offsets waiting for redelivery; an entry whose offset was acked
        # meanwhile leaves lazily, so empty means none waits (what the push fast path looks at).
        self.redeliveries: list[tuple[float, int]] = []
        self._waiting: set[int] = set()  # offsets in redeliveries (not yet redelivered)
        self.attempts: dict[int, int] = {}  # offset -> redeliveries so far
        self.blocked: set[int] = set()  # poison messages held under the block policy
        # messages held back, undelivered, behind a blocked message of their key (key shared)
        self.parked: set[int] = set()

    # ------------------------------------------------------------ delivery

    def delivered(self, first: int, last: int, consumer_id: int, deadline: float) -> None:
        # (``Run(...)`` without its ``__init__``: a class call into a Python ``__init__`` is the
        # dearest part of a small delivery's tracking; the fields are those ``__init__`` sets)
        run = _new(Run)
        run.first = first
        run.last = last
        run.consumer_id = consumer_id
        run.deadline = deadline
        run.settled = None
        run.remaining = n = last - first + 1
        firsts = self._firsts
        if not firsts or first > firsts[-1]:  # (fresh frames: after every run in flight)
            firsts.append(first)
        else:
            old = self._runs.get(first)
            if old is not None:  # its first offset was taken back and goes out again: it starts later
                self._trim_front(old)
            bisect.insort(firsts, first)
        self._runs[first] = run
        self.order.append(run)
        self.unacked += n

    def _trim_front(self, run: Run) -> None:
        """``run`` (live) now starts at its lowest outstanding offset: its settled front leaves it,
        so a redelivery of its first offset gets a run of its own under that key."""
        settled = run.settled or set()
        first = run.first
        while first in settled:
            first += 1
        del self._runs[run.first]
        firsts = self._firsts
        del firsts[bisect.bisect_left(firsts, run.first)]
        bisect.insort(firsts, first)
        left = {o for o in settled if o > first}
        run.settled = left or None
        run.first = first
        self._runs[first] = run

    def _find(self, offset: int) -> Run | None:
        i = bisect.bisect_right(self._firsts, offset) - 1
        if i < 0:
            return None
        run = self._runs[self._firsts[i]]
        return run if offset <= run.last else None

    def _drop_run(self, run: Run) -> None:
        del self._runs[run.first]
        firsts = self._firsts
        if firsts[0] == run.first:  # (acks come mostly in delivery order)
            del firsts[0]
        else:
            del firsts[bisect.bisect_left(firsts, run.first)]
        run.remaining = 0  # (dead: it may still sit in ``order`` behind a live run)
        order = self.order
        while order and order[0].remaining == 0:
            order.popleft()

    def _settle(self, run: Run, lo: int, hi: int) -> int:
        """Mark [lo, hi] (inside the run) settled; return how many were outstanding."""
        if run.settled is None and lo == run.first and hi == run.last:
            n = run.remaining
            run.remaining = 0
        else:
            if run.settled is None:
                run.settled = set()
            before = len(run.settled)
            run.settled.update(range(lo, hi + 1))
            n = len(run.settled) - before
            run.remaining -= n
        if run.remaining == 0:
            self._drop_run(run)
        return n

    # ------------------------------------------------------------ acks

    def ack_ranges(self, ranges: list[tuple[int, int]]) -> int:
        """Ack inclusive ranges; unknown or already acked offsets are ignored. Returns newly acked count."""
        acked = 0
        runs = self._runs
        for lo, hi in ranges:
            run = runs.get(lo)
            if run is not None and run.last == hi and run.settled is None:
                # one whole delivery (the usual ack): no search
                acked += run.remaining
                self.unacked -= run.remaining
                self._drop_run(run)
            elif hi <= self.cursor:
                continue
            else:
                acked += self._ack_range(max(lo, self.cursor + 1), hi)
            if self._waiting:
                for o in [o for o in self._waiting if lo <= o <= hi]:
                    self._waiting.discard(o)  # a late ack of a message queued for redelivery
                    acked += 1
            if self.blocked:
                for o in [o for o in self.blocked if lo <= o <= hi]:
                    self.blocked.discard(o)
                    acked += 1
        return acked

    def ack_oldest(self, lo: int, hi: int, next_unread: int) -> int:
        """:meth:`ack_ranges` of ``[(lo, hi)]`` followed by :meth:`advance`, in one call, when that
        range is exactly the oldest deliveries still in flight (one, or several back to back: a
        client merges the acks of consecutive deliveries into one range), untouched, and nothing
        waits for redelivery, is blocked or parked (a consumer acking its deliveries in turn).
        Returns how many it acked, or -1 when it is not that case (nothing changed: take the
        general way)."""
        firsts = self._firsts
        if not firsts or firsts[0] != lo or self._waiting or self.blocked or self.parked:
            return -1
        runs = self._runs
        run = runs[lo]
        if run.settled is not None:
            return -1
        if run.last == hi:  # (the usual case: one delivery)
            n = run.remaining
            del runs[lo]
            del firsts[0]
            run.remaining = 0
        else:
            # The runs it covers must be whole, back to back from lo, the last ending at hi: looked
            # over before anything changes, so that -1 leaves the tracker as it was.
            n = 0
            taken = 0
            expect = lo
            for first in firsts:
                run = runs[first]
                if first != expect or run.settled is not None or run.last > hi:
                    return -1
                n += run.remaining
                taken += 1
                if run.last == hi:
                    break
                expect = run.last + 1
            else:
                return -1
            for first in firsts[:taken]:
                runs.pop(first).remaining = 0
            del firsts[:taken]
        self.unacked -= n
        order = self.order
        while order and order[0].remaining == 0:
            order.popleft()
        # the cursor: below what is now the oldest in flight, or below next_unread
        if firsts:
            low = firsts[0] if runs[firsts[0]].settled is None else self.lowest_in_flight()
            if low is not None and low < next_unread:
                next_unread = low
        target = next_unread - 1
        if target > self.cursor:
            self.cursor = target
            if self.attempts:
                self.drop_attempts(target)
        return n

    def drop_attempts(self, cursor: int) -> None:
        """Forget the redelivery counts of offsets the cursor (now ``cursor``) moved over."""
        attempts = self.attempts
        for o in [o for o in attempts if o <= cursor]:
            del attempts[o]

    def _ack_range(self, lo: int, hi: int) -> int:
        """Ack [lo, hi] (above the cursor) in whichever runs it touches; returns how many."""
        acked = 0
        i = max(bisect.bisect_right(self._firsts, lo) - 1, 0)
        while i < len(self._firsts):
            run = self._runs[self._firsts[i]]
            if run.first > hi:
                break
            if run.last < lo:
                i += 1
                continue
            n = self._settle(run, max(lo, run.first), min(hi, run.last))
            acked += n
            self.unacked -= n
            if run.first in self._runs:
                i += 1
        return acked

    def take_back(self, offset: int) -> int | None:
        """Remove one in-flight offset (nack); return its consumer id, None if not in flight."""
        run = self._find(offset)
        if run is None or (run.settled and offset in run.settled):
            return None
        consumer_id = run.consumer_id
        self._settle(run, offset, offset)
        self.unacked -= 1
        return consumer_id

    def take_back_consumer(self, consumer_id: int) -> list[int]:
        """Remove everything in flight to a consumer (it left); return the offsets."""
        out: list[int] = []
        for first in list(self._firsts):
            run = self._runs.get(first)
            if run is not None and run.consumer_id == consumer_id:
                offsets = run.outstanding()
                out.extend(offsets)
                self.unacked -= len(offsets)
                self._drop_run(run)
        return out

    def expired(self, now: float) -> list[int]:
        """Take back every in-flight offset whose ack timeout passed."""
        out: list[int] = []
        order = self.order
        while order and order[0].deadline <= now:
            run = order[0]  # (live: dropping it pops it and the dead runs behind it)
            offsets = run.outstanding()
            out.extend(offsets)
            self.unacked -= len(offsets)
            self._drop_run(run)
        return out

    def next_deadline(self) -> float | None:
        order = self.order
        return order[0].deadline if order else None

    # ------------------------------------------------------------ redelivery

    def schedule(self, offset: int, ready_at: float) -> None:
        if offset <= self.cursor or offset in self._waiting:
            return
        self._waiting.add(offset)
        heapq.heappush(self.redeliveries, (ready_at, offset))

    def pop_ready(self, now: float, limit: int) -> list[int]:
        out: list[int] = []
        while self.redeliveries and self.redeliveries[0][0] <= now and len(out) < limit:
            _, offset = heapq.heappop(self.redeliveries)
            if offset in self._waiting:
                self._waiting.discard(offset)
                out.append(offset)
        return out

    def push_back(self, offsets: list[int]) -> None:
        """Return popped offsets that could not be delivered now (ready immediately)."""
        for o in offsets:
            self.schedule(o, 0.0)

    def next_ready(self) -> float | None:
        while self.redeliveries and self.redeliveries[0][1] not in self._waiting:
            heapq.heappop(self.redeliveries)
        return self.redeliveries[0][0] if self.redeliveries else None

    def has_ready(self, now: float) -> bool:
        if not self.redeliveries:
            return False
        t = self.next_ready()
        return t is not None and t <= now

    # ------------------------------------------------------------ cursor

    def lowest_in_flight(self) -> int | None:
        """The lowest offset delivered to a consumer and neither acked nor taken back."""
        if not self._firsts:
            return None
        run = self._runs[self._firsts[0]]
        if run.settled is None:
            return run.first
        return next(o for o in range(run.first, run.last + 1) if o not in run.settled)

    def lowest_unacked(self) -> int | None:
        if not (self._waiting or self.blocked or self.parked):
            return self.lowest_in_flight()
        candidates = []
        low = self.lowest_in_flight()
        if low is not None:
            candidates.append(low)
        if self._waiting:
            candidates.append(min(self._waiting))
        if self.blocked:
            candidates.append(min(self.blocked))
        if self.parked:
            candidates.append(min(self.parked))
        return min(candidates) if candidates else None

    def advance(self, next_unread: int) -> bool:
        """Move the cursor to just below the lowest unacked offset; True if it moved."""
        low = self.lowest_unacked()
        target = (next_unread if low is None else min(low, next_unread)) - 1
        if target > self.cursor:
            self.cursor = target
            if self.attempts:
                for o in [o for o in self.attempts if o <= target]:
                    del self.attempts[o]
            return True
        return False

"""Pure-Python twin of ``danube._core.ring``: the cache of the newest frames.

The ring indexes the most recently appended frames, bounded in bytes, and
serves reads by offset as zero-copy memoryviews.  It has no on-disk format;
the compiled module must return the same bytes for the same calls
(``tests/unit/_core/test_ring.py`` runs the two against each other).

Layout
======

The ring never copies frames: an append *references* whole, stamped frames
where they already are -- for the WAL, the active segment's file mapping, just
written by the log writer -- and the caller promises those bytes never change
again (the WAL only appends).  Memory is a list of *spans*, oldest first.  A
span references one contiguous run of frames in one source buffer, holding
consecutive offsets from its first offset, plus the first offset and position
of every batch appended to it (one entry per append: O(1), whatever the batch
size).  An append extends the newest span when it continues it in the same
source and the span stays within ``chunk_bytes``; otherwise it starts a new
span, so a batch is never split across spans and every read returns whole
frames from one span (a reader asks again for the rest).

``size_bytes`` counts the bytes referenced.  When it exceeds the capacity,
whole spans are dropped from the front.  A span keeps its source exported (a
mapping stays mapped even after its segment file is sealed or deleted) while
the span or any reader's view of it lives, so views never change under their
holder.  That is what makes the broadcast fanout copy-free and safe: every
reader gets views of the same bytes.
"""

from __future__ import annotations

import struct
from bisect import bisect_right

from danube._pure.frame import FIELDS_OK, HEADER_SIZE, check_fields, frames_within

DEFAULT_CHUNK_BYTES = 1 << 20
_BODY_LEN = struct.Struct("<I")
_BODY_LEN_AT = 12  # a frame's body_len field (layout: danube/_pure/frame.py)


class _Span:
    __slots__ = ("source", "view", "start", "used", "first_offset", "next_offset", "batch_first", "batch_pos")

    def __init__(self, source, view: memoryview, start: int, first_offset: int) -> None:
        self.source = source
        self.view = view  # the whole source, exported for as long as the span lives
        self.start = start
        self.used = 0
        self.first_offset = first_offset
        self.next_offset = first_offset
        self.batch_first: list[int] = []
        self.batch_pos: list[int] = []  # relative to start


class FrameRing:
    """Newest frames, bounded by ``capacity_bytes`` referenced (0 disables the cache)."""

    def __init__(self, capacity_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, next_offset: int = 0) -> None:
        if capacity_bytes < 0 or chunk_bytes <= 0:
            raise ValueError("capacity_bytes must be >= 0 and chunk_bytes > 0")
        self.capacity_bytes = capacity_bytes
        self.chunk_bytes = min(chunk_bytes, capacity_bytes) if capacity_bytes else chunk_bytes
        self._spans: list[_Span] = []
        self._firsts: list[int] = []
        self._size = 0
        self._first = next_offset
        self._next = next_offset

    # ------------------------------------------------------------ state

    @property
    def first_offset(self) -> int:
        """Oldest offset held (equals ``next_offset`` when empty)."""
        return self._first

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def size_bytes(self) -> int:
        """Bytes of frames referenced (the quantity bounded by the capacity)."""
        return self._size

    @property
    def chunk_count(self) -> int:
        return len(self._spans)

    def reset(self, next_offset: int) -> None:
        """Drop everything; the next append must start at ``next_offset``."""
        self._first = self._next = next_offset
        self._spans = []
        self._firsts = []
        self._size = 0

    # ------------------------------------------------------------ writing

    def append(self, frames, first_offset: int, count: int | None = None) -> int:
        """Reference all of ``frames`` (whole stamped frames from ``first_offset``, bytes that
        never change); return the frame count."""
        return self.append_from(frames, 0, -1, first_offset, count)

    def append_from(self, source, pos: int, n: int, first_offset: int, count: int | None = None) -> int:
        """Reference ``source[pos:pos + n]`` (``n`` -1: to the end), whole stamped frames from
        ``first_offset``; return the frame count (``count`` when given: trusted).

        An append that does not continue the ring (``first_offset != next_offset``)
        resets it first.  Lengths are trusted: the caller validated the frames.
        """
        view = memoryview(source).cast("B")
        if n < 0:
            n = len(view) - pos
        if pos < 0 or n < 0 or pos + n > len(view):
            raise ValueError("frames outside the source buffer")
        if count is None:
            count = count_frames(view[pos : pos + n])
        if n == 0:
            return count
        if first_offset != self._next:
            self.reset(first_offset)
        if self.capacity_bytes == 0:
            self._first = self._next = first_offset + count
            return count
        span = self._spans[-1] if self._spans else None
        if span is not None and not (
            span.source is source and pos == span.start + span.used and span.used + n <= self.chunk_bytes
        ):
            span = None
        if span is None:
            span = _Span(source, view, pos, first_offset)
            self._spans.append(span)
            self._firsts.append(first_offset)
        # readers snapshot the ring's next offset first: publish it last
        span.batch_first.append(first_offset)
        span.batch_pos.append(span.used)
        span.used += n
        span.next_offset = first_offset + count
        self._size += n
        self._next = first_offset + count
        self._evict()
        return count

    def _evict(self) -> None:
        while self._size > self.capacity_bytes and len(self._spans) > 1:
            dropped = self._spans[0]
            # publish the new first offset before the span disappears (readers check it first)
            self._first = self._spans[1].first_offset
            self._spans.pop(0)
            self._firsts.pop(0)
            self._size -= dropped.used

    # ------------------------------------------------------------ reading

    def contains(self, offset: int) -> bool:
        return self._first <= offset < self._next

    def read(self, offset: int, max_bytes: int):
        """Whole frames from ``offset`` as a memoryview (at least one frame, then up to ``max_bytes``).

        ``None`` when the ring does not hold ``offset`` (evicted, or beyond the end);
        an empty view when ``offset == next_offset``.
        """
        got = self.read_counted(offset, max_bytes)
        return None if got is None else got[0]

    def read_counted(self, offset: int, max_bytes: int):
        """``read`` as ``(view, frame count)``; None when the ring does not hold ``offset``."""
        next_offset = self._next
        if offset == next_offset:
            return memoryview(b""), 0
        if offset < self._first or offset > next_offset:
            return None
        spans, firsts = self._spans, self._firsts
        i = bisect_right(firsts, offset) - 1
        if i < 0 or i >= len(spans):
            return None
        span = spans[i]
        # a consistent snapshot of the span (the writer may append meanwhile)
        stop = min(span.next_offset, next_offset)
        if offset >= stop:
            return None
        nb = bisect_right(span.batch_first, stop - 1)
        batch_first, batch_pos = span.batch_first[:nb], span.batch_pos[:nb]
        data = span.view[span.start :]
        unpack = _BODY_LEN.unpack_from
        b = bisect_right(batch_first, offset) - 1
        start = batch_pos[b]
        off = batch_first[b]
        while off < offset:
            start += HEADER_SIZE + unpack(data, start + _BODY_LEN_AT)[0]
            off += 1
        # whole batches first (their ends are known: no walk over the frames), then frames
        limit = start + max_bytes
        end = start + HEADER_SIZE + unpack(data, start + _BODY_LEN_AT)[0]
        off = offset + 1
        if b + 1 < nb and batch_pos[b + 1] <= limit:
            last = bisect_right(batch_pos, limit, b + 1) - 1
            end, off = batch_pos[last], batch_first[last]
        while off < stop:
            nxt = end + HEADER_SIZE + unpack(data, end + _BODY_LEN_AT)[0]
            if nxt > limit:
                break
            end = nxt
            off += 1
        return data[start:end], off - offset

    def read_deliverable(self, offset: int, max_messages: int, max_bytes: int):
        """``(view, count)``: whole frames from ``offset``, at least one, at most ``max_messages``,
        then up to ``max_bytes``, each one a subscriber can decode (``check_fields``); None when
        the ring does not hold ``offset`` (or it is ``next_offset``), ``max_messages`` < 1, or a
        frame of that cut fails the check."""
        if max_messages < 1 or offset >= self._next:
            return None
        got = self.read_counted(offset, max_bytes)
        if got is None:
            return None
        view = got[0]
        end, count = frames_within(view, max_messages, max_bytes)
        view = view[:end]
        if check_fields(view)[1] != FIELDS_OK:
            return None
        return view, count


def count_frames(buf) -> int:
    """Number of frames in a buffer of whole frames (lengths trusted)."""
    mv = memoryview(buf).cast("B")
    pos, n, count = 0, len(mv), 0
    while pos + HEADER_SIZE <= n:
        (body_len,) = _BODY_LEN.unpack_from(mv, pos + _BODY_LEN_AT)
        pos += HEADER_SIZE + body_len
        count += 1
    return count

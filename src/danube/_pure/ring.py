"""Pure-Python twin of ``danube._core.ring``: the cache of the newest frames.

The ring keeps the most recently appended frames in memory, bounded in bytes,
and serves reads by offset as zero-copy memoryviews.  It has no on-disk
format; the compiled module must return the same bytes for the same calls
(``tests/unit/_core/test_ring.py`` runs the two against each other).

Layout
======

Memory is a list of *chunks*, oldest first.  A chunk is a fixed-size buffer
(``chunk_bytes``, or larger for a batch that does not fit one) filled with
whole frames back to back, plus the start position of every frame in it; the
frames of one chunk hold consecutive offsets starting at the chunk's first
offset, and chunks follow each other without gaps.

A batch is never split across chunks, so every read returns whole frames from
one chunk (a reader asks again for the rest).  When the bytes held exceed the
capacity, whole chunks are dropped from the front.  A dropped chunk is never
reused: a reader still holding a memoryview of it keeps it alive, so views
never change under their holder.  That is what makes the broadcast fanout
copy-free and safe: every reader gets views of the same bytes.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right

HEADER_SIZE = 16
DEFAULT_CHUNK_BYTES = 1 << 20
_BODY_LEN = struct.Struct("<I")
_OFFSET = struct.Struct("<Q")


class _Chunk:
    __slots__ = ("buf", "used", "first_offset", "positions")

    def __init__(self, size: int, first_offset: int) -> None:
        self.buf = bytearray(size)
        self.used = 0
        self.first_offset = first_offset
        self.positions = array("q")


class FrameRing:
    """Newest frames in memory, bounded by ``capacity_bytes`` (0 disables the cache)."""

    def __init__(self, capacity_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, next_offset: int = 0) -> None:
        if capacity_bytes < 0 or chunk_bytes <= 0:
            raise ValueError("capacity_bytes must be >= 0 and chunk_bytes > 0")
        self.capacity_bytes = capacity_bytes
        self.chunk_bytes = min(chunk_bytes, capacity_bytes) if capacity_bytes else chunk_bytes
        self._chunks: list[_Chunk] = []
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
        """Bytes of chunk memory held (the quantity bounded by the capacity)."""
        return self._size

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    def reset(self, next_offset: int) -> None:
        """Drop everything; the next append must start at ``next_offset``."""
        self._first = self._next = next_offset
        self._chunks = []
        self._firsts = []
        self._size = 0

    # ------------------------------------------------------------ writing

    def append(self, frames, first_offset: int) -> int:
        """Copy whole, stamped frames holding offsets from ``first_offset``; return the count.

        An append that does not continue the ring (``first_offset != next_offset``)
        resets it first.  Lengths are trusted: the caller validated the frames.
        """
        mv = memoryview(frames).cast("B")
        n = len(mv)
        if n == 0:
            return 0
        if first_offset != self._next:
            self.reset(first_offset)
        if self.capacity_bytes == 0:
            count = count_frames(mv)
            self._first = self._next = first_offset + count
            return count
        chunk = self._chunks[-1] if self._chunks else None
        if chunk is None or len(chunk.buf) - chunk.used < n:
            chunk = _Chunk(max(self.chunk_bytes, n), first_offset)
            self._chunks.append(chunk)
            self._firsts.append(first_offset)
            self._size += len(chunk.buf)
        base = chunk.used
        chunk.buf[base:base + n] = mv
        positions = chunk.positions
        pos = 0
        count = 0
        while pos < n:
            positions.append(base + pos)
            (body_len,) = _BODY_LEN.unpack_from(mv, pos + 12)
            pos += HEADER_SIZE + body_len
            count += 1
        chunk.used = base + n
        self._next = first_offset + count
        self._evict()
        return count

    def _evict(self) -> None:
        while self._size > self.capacity_bytes and len(self._chunks) > 1:
            dropped = self._chunks[0]
            # publish the new first offset before the chunk disappears (readers check it first)
            self._first = self._chunks[1].first_offset
            self._chunks.pop(0)
            self._firsts.pop(0)
            self._size -= len(dropped.buf)

    # ------------------------------------------------------------ reading

    def contains(self, offset: int) -> bool:
        return self._first <= offset < self._next

    def read(self, offset: int, max_bytes: int):
        """Whole frames from ``offset`` as a memoryview (at least one frame, then up to ``max_bytes``).

        ``None`` when the ring does not hold ``offset`` (evicted, or beyond the end);
        an empty view when ``offset == next_offset``.
        """
        chunks = self._chunks
        firsts = self._firsts
        next_offset = self._next
        if offset == next_offset:
            return memoryview(b"")
        if offset < self._first or offset > next_offset:
            return None
        i = bisect_right(firsts, offset) - 1
        if i < 0 or i >= len(chunks):
            return None
        chunk = chunks[i]
        index = offset - chunk.first_offset
        positions = chunk.positions
        count = len(positions)
        if index >= count:
            return None
        start = positions[index]
        # frames published to readers: those below next_offset (snapshot taken first)
        last_index = min(count, next_offset - chunk.first_offset)
        buf = chunk.buf
        limit = start + max_bytes
        # largest e in [index + 1, last_index] whose frames index..e-1 fit the byte budget
        lo, hi = index + 1, last_index
        while lo < hi:
            mid = (lo + hi + 1) // 2
            p = positions[mid - 1]
            if p + HEADER_SIZE + _BODY_LEN.unpack_from(buf, p + 12)[0] <= limit:
                lo = mid
            else:
                hi = mid - 1
        p = positions[lo - 1]
        end = p + HEADER_SIZE + _BODY_LEN.unpack_from(buf, p + 12)[0]
        return memoryview(chunk.buf)[start:end]


def count_frames(buf) -> int:
    """Number of frames in a buffer of whole frames (lengths trusted)."""
    mv = memoryview(buf).cast("B")
    pos, n, count = 0, len(mv), 0
    while pos < n:
        (body_len,) = _BODY_LEN.unpack_from(mv, pos + 12)
        pos += HEADER_SIZE + body_len
        count += 1
    return count

"""Reads of a topic's durable history, and their chaining into the hot WAL.

``DurableHistoryReader.stream`` walks segments with fixed-size range reads,
keeping ``prefetch`` reads in flight (the next range of this segment or the
first range of the next one) on worker threads.  Every range is checked before
a byte of it is handed out: frame checksums, lengths and the consecutive offset
sequence (``message_codec.scan``), the object's size, and, when a segment is read from
its first byte to its last, its etag.  A failure is a
:class:`SegmentCorruptError` naming the segment and offset; nothing is skipped.

Ranges start and end on frame boundaries known from each descriptor's offset
index (one entry every >= 64 KiB), so each range is read and checked on a worker
thread by itself, in parallel with the next ones, and handed out without a copy.
A stream's ranges are ``chunk_bytes`` long, or the backend's ``min_range_bytes``
if larger (object stores want fewer, larger requests).  The worker's scan also
notes a frame start every ``max_bytes / 8`` bytes, where the event loop cuts the
range into pieces of at most ``max_bytes`` (and knows each piece's last offset)
without walking the frame headers again: for a 16 MiB range that walk took
longer than everything else the event loop did.  Range reads go through the
backend's ``get_self_checked``: these checks make a transport checksum of the
same bytes redundant, and on S3 botocore's CRC32 of each response cost about
as much client CPU as the GET itself.

``chained_tail`` serves one logical stream: durable history below the hot
WAL's start, then the WAL itself (live), with no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import struct
import threading
from typing import AsyncGenerator, AsyncIterator, Callable, Iterator, NamedTuple

import xxhash

from danube import message_codec
from danube.errors import OffsetOutOfRangeError, SegmentCorruptError
from danube.storage.backends import DurableBackend
from danube.storage.catalog import SegmentCatalog
from danube.storage.segment import SegmentDescriptor

DEFAULT_CHUNK = 4 * 1024 * 1024


def split_frames(buf, max_bytes: int) -> list:
    """Cut a whole-frame buffer into pieces of at most ``max_bytes`` (a single larger frame stays whole)."""
    mv = memoryview(buf)
    if len(mv) <= max_bytes:
        return [mv]
    positions = message_codec.frame_positions(mv)
    pieces = []
    start = 0
    while start < len(mv):
        limit = start + max_bytes
        i = bisect.bisect_right(positions, limit) - 1  # last frame starting at or before limit
        cut = positions[i] if i >= 0 else len(mv)
        if cut <= start:  # one frame larger than max_bytes
            j = bisect.bisect_right(positions, start)
            cut = positions[j] if j < len(positions) else len(mv)
        elif limit >= len(mv):
            cut = len(mv)
        pieces.append(mv[start:cut])
        start = cut
    return pieces


def split_frames_at(buf, marks: list[tuple[int, int]], last_offset: int, max_bytes: int) -> list:
    """``split_frames`` for a checked buffer whose scan noted some frame starts: ``(piece, its last offset)``.

    ``marks`` are ascending ``(position, offset)`` pairs of frames inside ``buf``
    (the worker's ``message_codec.scan`` index) and ``last_offset`` the offset of its
    last frame.  Pieces are cut at the last mark that keeps them within
    ``max_bytes``, so the event loop neither walks every frame header to cut
    nor to tell where each piece ends.  A stretch with no mark close enough is
    cut frame by frame, exactly as ``split_frames`` does.
    """
    mv = memoryview(buf)
    total = len(mv)
    if total <= max_bytes:
        return [(mv, last_offset)]
    cuts = [pos for pos, _off in marks if 0 < pos < total] + [total]
    offsets = [off for pos, off in marks if 0 < pos < total] + [last_offset + 1]
    pieces = []
    start = 0
    while start < total:
        limit = start + max_bytes
        if limit >= total:
            pieces.append((mv[start:], last_offset))
            break
        i = bisect.bisect_right(cuts, limit) - 1
        if i >= 0 and cuts[i] > start:
            pieces.append((mv[start : cuts[i]], offsets[i] - 1))
            start = cuts[i]
            continue
        # no mark within reach: cut up to the next one frame by frame
        j = bisect.bisect_right(cuts, start)
        parts = split_frames(mv[start : cuts[j]], max_bytes)
        pieces.extend((part, _last_offset(part)) for part in parts[:-1])
        pieces.append((parts[-1], offsets[j] - 1))
        start = cuts[j]
    return pieces


class _Range(NamedTuple):
    """Bytes ``[start, end)`` of segment ``segment``: whole frames, offsets ``first``..``last``."""

    segment: int  # the catalog's index of the segment
    start: int
    end: int
    first: int
    last: int


class _Fetched(NamedTuple):
    data: bytes
    frame_count: int  # frames that scanned good
    end_pos: int
    first: int
    last: int
    reason: int
    etag: str | None  # hex digest when this range completed a hashed segment
    marks: list  # (position, offset) of some frames, noted by the scan, for cutting pieces


class _HashChain:
    """Feeds ranges of one segment to its xxh3-128 in order, on the worker threads.

    Each range's thread waits for its predecessor's update before its own, so
    hashing overlaps with the next ranges' reads and checks instead of running
    on the event loop.
    """

    def __init__(self) -> None:
        self.hasher = xxhash.xxh3_128()
        self.stopped = False

    def update_after(
        self, previous: threading.Event | None, data: bytes, done: threading.Event, final: bool
    ) -> str | None:
        try:
            while previous is not None and not previous.wait(0.1):
                if self.stopped:
                    return None
            if self.stopped:
                return None
            self.hasher.update(data)
            return self.hasher.hexdigest() if final else None
        finally:
            done.set()


class DurableHistoryReader:
    def __init__(
        self, backend: DurableBackend, catalog: SegmentCatalog, *, chunk_bytes: int = DEFAULT_CHUNK, prefetch: int = 2
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.chunk_bytes = max(int(chunk_bytes), 1)
        self.prefetch = max(int(prefetch), 0)

    @property
    def end_offset(self) -> int:
        return self.catalog.end_offset

    def _corrupt(self, desc: SegmentDescriptor, message: str, offset: int, expected=None, actual=None):
        return SegmentCorruptError(
            f"{message} in {self.backend.describe()}",
            segment_id=desc.segment_id,
            offset=offset,
            expected=expected,
            actual=actual,
        )

    def _plan(self, from_offset: int, until_offset: int, chunk: int) -> Iterator[_Range]:
        """Ranges to fetch, in order.  They start and end on frame boundaries taken from each
        descriptor's offset index, so every range is checked on its own (on the worker thread)."""
        index = self.catalog.find(from_offset)
        if index < 0:
            raise OffsetOutOfRangeError(
                "offset is not in the durable history",
                offset=from_offset,
                first_offset=self.catalog.start_offset or 0,
                next_offset=self.catalog.end_offset + 1,
            )
        first_segment = True
        while index < len(self.catalog):
            desc = self.catalog.at(index)
            if desc.start_offset > until_offset:
                return
            points = [(p, o) for o, p in desc.offset_index if 0 < p < desc.size]
            points = [(0, desc.start_offset)] + points + [(desc.size, desc.end_offset + 1)]
            i = 0
            if first_segment:
                while i + 1 < len(points) - 1 and points[i + 1][1] <= from_offset:
                    i += 1
            while i < len(points) - 1:
                j = i + 1
                while j < len(points) - 1 and points[j + 1][0] - points[i][0] <= chunk:
                    j += 1
                (start, first), (end, after) = points[i], points[j]
                yield _Range(index, start, end, first, after - 1)
                if after - 1 >= until_offset:
                    return
                i = j
            first_segment = False
            index += 1

    def _fetch(
        self,
        job: _Range,
        chain: _HashChain | None,
        previous: threading.Event | None,
        done: threading.Event,
        max_bytes: int,
    ) -> _Fetched:
        """Worker thread: one range read, its checksums and offset sequence, its share of the etag.

        The scan also notes a frame start every ``max_bytes / 8`` bytes or so
        (its offset index), which the event loop uses to cut pieces of at most
        ``max_bytes`` without walking every frame header itself.
        """
        try:
            desc = self.catalog.at(job.segment)
            data = self.backend.get_self_checked(desc.data_key, job.start, job.end)
            if len(data) != job.end - job.start:
                return _Fetched(data, 0, 0, -1, -1, -1, None, [])
            note_every = 0 if len(data) <= max_bytes else max(max_bytes // 8, 1)
            count, end_pos, first, last, reason, index = message_codec.scan(data, 0, job.first, note_every)
            etag = None
            if chain is not None:
                etag = chain.update_after(previous, data, done, job.end == desc.size)
            return _Fetched(data, count, end_pos, first, last, reason, etag, [(pos, off) for off, pos in index])
        finally:
            done.set()

    async def stream(
        self,
        from_offset: int,
        until_offset: int | None = None,
        *,
        max_bytes: int = DEFAULT_CHUNK,
        chunk_bytes: int | None = None,
        prefetch: int | None = None,
    ) -> AsyncGenerator[memoryview, None]:
        """Whole-frame buffers holding offsets ``from_offset`` .. ``until_offset`` (default: durable end)."""
        pieces = self.stream_with_last_offsets(
            from_offset, until_offset, max_bytes=max_bytes, chunk_bytes=chunk_bytes, prefetch=prefetch
        )
        try:
            async for piece, _last in pieces:
                yield piece
        finally:
            await pieces.aclose()

    async def stream_with_last_offsets(
        self,
        from_offset: int,
        until_offset: int | None = None,
        *,
        max_bytes: int = DEFAULT_CHUNK,
        chunk_bytes: int | None = None,
        prefetch: int | None = None,
    ) -> AsyncGenerator[tuple[memoryview, int], None]:
        """``stream``, each piece with the offset of its last frame."""
        end_offset = self.catalog.end_offset
        until = end_offset if until_offset is None else min(until_offset, end_offset)
        if from_offset > until:
            return
        depth = max(self.prefetch if prefetch is None else prefetch, 0) + 1
        if chunk_bytes is None:
            chunk_bytes = max(self.chunk_bytes, getattr(self.backend, "min_range_bytes", 0))
        plan = self._plan(from_offset, until, chunk_bytes)
        inflight: collections.deque = collections.deque()
        chains: list[_HashChain] = []
        # the etag chain of the segment being launched, and the previous range's done event
        chain: _HashChain | None = None
        previous: threading.Event | None = None

        def launch() -> bool:
            nonlocal chain, previous
            job = next(plan, None)
            if job is None:
                return False
            if job.start == 0:  # a segment read from its first byte is checked against its etag
                chain, previous = _HashChain(), None
                chains.append(chain)
            elif job.first == from_offset or chain is None:
                chain, previous = None, None
            done = threading.Event()
            task = asyncio.ensure_future(asyncio.to_thread(self._fetch, job, chain, previous, done, max_bytes))
            previous = done
            inflight.append((job, task))
            return True

        try:
            while len(inflight) < depth and launch():
                pass
            while inflight:
                job, task = inflight.popleft()
                got = await task
                launch()
                desc = self.catalog.at(job.segment)
                self._check(desc, job, got)
                if got.etag is not None and got.etag != desc.etag:
                    raise self._corrupt(
                        desc, "segment etag mismatch", desc.start_offset, expected=desc.etag, actual=got.etag
                    )
                data = memoryview(got.data)
                lo, hi = 0, len(data)
                if job.first < from_offset:
                    lo = message_codec.find_offset(data, from_offset)
                if job.last > until:
                    hi = message_codec.find_offset(data, until + 1, lo)
                marks = [(pos - lo, off) for pos, off in got.marks if lo < pos < hi]
                for part in split_frames_at(data[lo:hi], marks, min(job.last, until), max_bytes):
                    yield part
                if job.last >= until:
                    return
        finally:
            for started in chains:
                started.stopped = True
            for _job, task in inflight:
                task.cancel()
            for _job, task in inflight:
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled prefetches are discarded
                    pass

    def _check(self, desc: SegmentDescriptor, job: _Range, got: _Fetched) -> None:
        if got.reason == -1:
            raise self._corrupt(
                desc,
                "segment object is shorter than its descriptor",
                job.first,
                expected=desc.size,
                actual=job.start + len(got.data),
            )
        if got.reason != message_codec.SCAN_END or got.end_pos != len(got.data) or got.last != job.last:
            bad = job.first + got.frame_count
            detail = "frame checksum, length or offset sequence check failed"
            try:
                message_codec.validate(memoryview(got.data)[got.end_pos :], bad, True)
            except Exception as exc:  # noqa: BLE001 - only used to enrich the message
                detail = str(exc)
            raise self._corrupt(desc, f"corrupt frame ({detail})", bad)

    async def read(self, from_offset: int, max_bytes: int, until_offset: int | None = None) -> bytes | memoryview:
        """Whole frames from ``from_offset`` (at most ``max_bytes`` unless one frame is larger)."""
        # Ranges about the wanted size, no prefetch: a read returns the first piece.
        chunk = max(max_bytes, 1)
        gen = self.stream(from_offset, until_offset, max_bytes=max_bytes, chunk_bytes=chunk, prefetch=0)
        try:
            async for piece in gen:
                return piece
        finally:
            await gen.aclose()
        return b""


async def chained_tail(
    history: DurableHistoryReader,
    hot_start: Callable[[], int],
    wal_tail: Callable[[int, int], AsyncIterator],
    from_offset: int,
    max_bytes: int,
) -> AsyncGenerator[memoryview, None]:
    """Durable history below the hot WAL's start, then the hot WAL (following live appends).

    ``hot_start()`` is re-read at each switch: retention may move the WAL's start
    forward while a reader is behind it, in which case the reader goes back to
    durable history for the pruned range.
    """
    offset = from_offset
    while True:
        start = hot_start()
        if offset < start:
            if history.end_offset < start - 1 and offset > history.end_offset:
                raise OffsetOutOfRangeError(
                    "offset is neither in durable history nor in the local WAL",
                    offset=offset,
                    first_offset=history.catalog.start_offset or start,
                    next_offset=start,
                )
            async for piece, last in history.stream_with_last_offsets(offset, start - 1, max_bytes=max_bytes):
                yield piece
                offset = last + 1
            if offset < start:
                raise OffsetOutOfRangeError(
                    "durable history ends before the local WAL starts",
                    offset=offset,
                    first_offset=history.catalog.start_offset or 0,
                    next_offset=start,
                )
            continue
        try:
            async for piece in wal_tail(offset, max_bytes):
                if len(piece):
                    yield piece
                    offset = _last_offset(piece) + 1
            return
        except OffsetOutOfRangeError:
            if offset >= hot_start():
                raise
            # pruned underneath the reader: continue from durable history


_OFFSET = struct.Struct("<Q")


def _last_offset(buf) -> int:
    """Offset of the last frame of a whole-frame buffer (headers only; the data was checked upstream)."""
    return _OFFSET.unpack_from(buf, message_codec.frame_positions(buf)[-1])[0]

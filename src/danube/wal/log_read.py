"""The WAL's read side: whole frames and records by offset, iteration, and tails that follow
live appends.

A base class of :class:`~danube.wal.log.Wal` (``wal/log.py``), which holds the state; its
methods are moved here whole.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, AsyncGenerator, Iterator

from danube import _native, message_codec
from danube.errors import OffsetOutOfRangeError, WalClosedError

if TYPE_CHECKING:
    # the one Record class: the compiled codec re-exports the pure twin's (frame.pyi)
    from danube._pure.frame import Record
    from danube.wal.log_suspend import _Dormant
    from danube.wal.tail import AppendNotifier

DEFAULT_READ_BYTES = 1 << 20

_count_frames = _native.load("ring").count_frames


class WalReading:
    if TYPE_CHECKING:  # what this part uses of the rest of Wal
        _closed: bool
        _dormant: _Dormant | None
        _generation: int
        _notifier: AppendNotifier | None
        _reads: int
        _ring: Any
        _segments: list
        _seg_firsts: list[int]
        _writer: Any

        @property
        def first_offset(self) -> int: ...

        @property
        def next_offset(self) -> int: ...

        def _resume_if_dormant(self) -> None: ...

    # ------------------------------------------------------------ reading

    def _range_error(self, offset: int, message: str) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            message, offset=offset, first_offset=self.first_offset, next_offset=self.next_offset
        )

    def read_frames(self, from_offset: int, max_bytes: int = DEFAULT_READ_BYTES):
        """Whole frames from ``from_offset``: at least one, then up to ``max_bytes``.

        A zero-copy memoryview (of the cache or of the file mapping); empty at the end
        of the log.  Raises :class:`OffsetOutOfRangeError` outside the log and
        :class:`CorruptFrameError` when the stored bytes fail their checksum.
        """
        if self._closed:
            raise WalClosedError("the WAL is closed")
        # The cache first, and its answer stands: the writer adds frames to it before it
        # publishes next_offset, so it is never behind (an empty view means the end), and
        # it may be ahead while the writer finishes an append in another thread.
        view = self._ring.read(from_offset, max_bytes)
        if view is not None:
            return view
        next_offset = self._writer.next_offset
        if from_offset == next_offset:
            return memoryview(b"")
        if self._dormant is not None:
            self._resume_if_dormant()
            return self.read_frames(from_offset, max_bytes)
        self._reads += 1
        generation = self._generation
        segments, firsts = self._segments, self._seg_firsts
        if from_offset > next_offset or from_offset < firsts[0] or (from_offset < segments[0].first_offset):
            raise self._range_error(from_offset, "offset outside the log")
        i = bisect_right(firsts, from_offset) - 1
        seg = segments[i]
        if from_offset >= seg.next_offset and seg is not segments[-1]:
            # only possible while a rotation is being published; the next segment has it
            seg = segments[i + 1]
        try:
            return seg.read_frames(from_offset, max_bytes, next_offset)
        except WalClosedError:
            if self._closed:
                raise
            if generation != self._generation:  # suspended while reading: reopen and read again
                return self.read_frames(from_offset, max_bytes)
            raise self._range_error(from_offset, "offset pruned while reading") from None

    def read_hot(self, from_offset: int, max_bytes: int, floor: int = 0):
        """:meth:`read_frames` for a reader at the live end (a consumer taking fresh frames): None
        instead of :class:`OffsetOutOfRangeError`, and for ``from_offset`` below the log's start
        (even when the cache still holds it) or below ``floor``, so a caller that has another way
        for those offsets asks once, without a try of its own; frames still in the cache cost no
        other call."""
        firsts = self._seg_firsts
        if from_offset < firsts[0] or from_offset < floor:
            return None
        if not self._closed:
            view = self._ring.read(from_offset, max_bytes)
            if view is not None:
                return view
        try:
            return self.read_frames(from_offset, max_bytes)
        except OffsetOutOfRangeError:
            return None

    def read_deliverable(self, from_offset: int, max_messages: int, max_bytes: int, floor: int = 0):
        """A fresh delivery's frames in one call, for a reader at the live end: ``(view, count)``
        from the cache, cut to ``max_messages`` and ``max_bytes`` (at least one frame), each one a
        subscriber can decode; None whenever that is not at hand (the offsets are not in the
        cache, are below the log's start or ``floor``, or a frame fails that check): the caller
        then takes its general way, which reads and checks them itself."""
        if from_offset < self._seg_firsts[0] or from_offset < floor or self._closed:
            return None
        return self._ring.read_deliverable(from_offset, max_messages, max_bytes)

    def read(self, from_offset: int, max_records: int | None = None) -> list[Record]:
        """Records from ``from_offset`` to the end (or ``max_records`` of them)."""
        out: list[Record] = []
        pos = from_offset
        while max_records is None or len(out) < max_records:
            view = self.read_frames(pos, DEFAULT_READ_BYTES)
            if not len(view):
                break
            for record in message_codec.iter_records(view):
                out.append(record)
                if max_records is not None and len(out) >= max_records:
                    break
            pos = out[-1].offset + 1
        return out

    def iter(self, from_offset: int | None = None, *, max_bytes: int = DEFAULT_READ_BYTES) -> Iterator[Record]:
        """Iterate records from ``from_offset`` (default: the first) up to the end as it grows."""
        pos = self.first_offset if from_offset is None else from_offset
        while True:
            view = self.read_frames(pos, max_bytes)
            if not len(view):
                return
            for record in message_codec.iter_records(view):
                yield record
            pos = record.offset + 1

    def __iter__(self) -> Iterator[Record]:
        return self.iter()

    async def tail_frames(
        self, from_offset: int | None = None, max_bytes: int = DEFAULT_READ_BYTES
    ) -> AsyncGenerator[memoryview, None]:
        """Yield frame batches from ``from_offset`` (default: the end), following live appends.

        Every reader gets views of the same bytes (no copy per reader).  Ends when the WAL closes.
        """
        pos = self.next_offset if from_offset is None else from_offset
        notifier = self._notifier
        assert notifier is not None, "set by _open_state, which __init__ runs"
        read_cached = self._ring.read_counted  # frames and their count, no walk over them (the ring
        while not self._closed:  # object lives as long as the WAL, across suspends)
            got = read_cached(pos, max_bytes)
            if got is not None:
                view, count = got
            else:
                try:
                    view = self.read_frames(pos, max_bytes)
                except WalClosedError:
                    return
                count = _count_frames(view)
            if count:
                pos += count
                yield view
            else:
                await notifier.wait_beyond(pos, self._next_offset_fn)

    def _next_offset_fn(self) -> int:
        return self._writer.next_offset

    async def tail(self, from_offset: int | None = None) -> AsyncGenerator[Record, None]:
        """Yield records from ``from_offset`` (default: the end), following live appends."""
        async for view in self.tail_frames(from_offset):
            for record in message_codec.iter_records(view):
                yield record

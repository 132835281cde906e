"""The embeddable write-ahead log: :class:`Wal`.

One writer (appends from one thread at a time), any number of concurrent
readers (threads and asyncio tasks).  Offsets are consecutive integers; a
record is readable as soon as its append returns.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from bisect import bisect_right
from typing import AsyncIterator, Callable, Iterator

from danube import _native, frames
from danube.errors import OffsetOutOfRangeError, WalClosedError, WalError
from danube.wal.checkpoint import Checkpoint, write_checkpoint
from danube.wal.files import LOCK_NAME, WalFileInfo, fsync_directory
from danube.wal.options import SyncPolicy, WalOptions
from danube.wal.pagecache import PageCacheWindow
from danube.wal.recovery import RecoveryReport, recover
from danube.wal.rotation import FileKeeper, file_info as _info
from danube.wal.sync import Syncer
from danube.wal.tail import AppendNotifier

_walfile = _native.load("walfile")
_ring = _native.load("ring")

Record = frames.Record
DEFAULT_READ_BYTES = 1 << 20
PREFAULT_BYTES = 4 << 20


class Wal:
    """A write-ahead log in a directory.  Open with :meth:`Wal.open`."""

    def __init__(self, path: str, options: WalOptions) -> None:
        self.path = os.path.abspath(path)
        self.options = options
        self._closed = False
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise WalError(f"WAL {self.path} is open elsewhere (one writer per log)") from None
        try:
            recovered = recover(self.path, options)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.recovery: RecoveryReport = recovered.report
        self._closing = False
        self._rotated = list(recovered.rotated)
        active = recovered.active
        self._segments = self._rotated + [active]
        self._seg_firsts = [s.first_offset for s in self._segments]
        self._admin_lock = threading.RLock()  # the segment lists: rotation, pruning, close
        self._ring = _ring.FrameRing(options.cache_bytes, next_offset=active.next_offset)
        self._writer = _walfile.LogWriter(active, self._ring, self._rotate,
                                          max_file_age_s=options.max_file_age_s)
        if options.sync is SyncPolicy.NEVER:
            # fault the file mapping in ahead of the writer (never under a sync policy: each
            # fdatasync would also write the populated zero pages)
            self._writer.prefault_bytes = PREFAULT_BYTES
        self._notifier = AppendNotifier(self._writer)
        try:
            write_checkpoint(self.path, recovered.checkpoint)
        except BaseException:
            for seg in self._segments:
                seg.close()
            os.close(self._lock_fd)
            raise
        # Under sync=never nothing is synced, so nothing is dropped from the page cache either.
        self.page_cache = (PageCacheWindow(options.page_cache_bytes)
                           if options.page_cache_bytes is not None and options.sync is not SyncPolicy.NEVER
                           else None)
        self._syncer = Syncer(options.sync, options.sync_interval_ms, self._appended, self._sync_files,
                              after_sync=self._trim_page_cache if self.page_cache is not None else None)
        self._keeper = FileKeeper(self.path, options, recovered.checkpoint,
                                  durable=options.sync is not SyncPolicy.NEVER, sync_lock=self._syncer.lock)
        # The per-record hot path is the writer's own method unless every append must wait for disk.
        if options.sync is not SyncPolicy.ALWAYS:
            self.append = self._writer.append
            self.append_frames = self._writer.append_frames

    @classmethod
    def open(cls, path: str | os.PathLike, **options) -> "Wal":
        """Open (creating if needed) the log in directory ``path``; see ``docs/wal.md`` for the options."""
        return cls(os.fspath(path), WalOptions.from_kwargs(**options))

    def __enter__(self) -> "Wal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "Wal":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"offsets {self.first_offset}..{self.next_offset - 1}"
        return f"<Wal {self.path} {state} sync={self.options.sync.value}>"

    # ------------------------------------------------------------ state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def next_offset(self) -> int:
        """The offset the next append gets."""
        return self._writer.next_offset

    @property
    def first_offset(self) -> int:
        """The oldest offset held (``next_offset`` when the log is empty)."""
        return self._seg_firsts[0]

    @property
    def durable_offset(self) -> int:
        """The highest offset covered by the sync policy (-1 or below when nothing is)."""
        return self._syncer.durable_offset

    @property
    def checkpoint(self) -> Checkpoint:
        """What ``wal.ckpt`` holds (it may lag the latest rotation: see ``finish_rotations``)."""
        return self._keeper.checkpoint

    @property
    def sync_count(self) -> int:
        """fdatasync calls made for appends so far (group commit makes it smaller than the waits)."""
        return self._syncer.sync_count

    def _appended(self) -> int:
        return self._writer.next_offset - 1

    def _sync_files(self) -> None:
        """fdatasync every file that may hold appended offsets (the syncer holds its lock).

        The active file is read before the rotated-but-unsynced list: a rotation adds the old
        file to that list before switching, so a file left after the read is in the list."""
        active = self._writer.segment
        keeper = self._keeper
        for seg in list(keeper.unsynced):
            seg.sync()
            keeper.unsynced.remove(seg)
        if keeper.dir_dirty:
            keeper.dir_dirty = False
            try:
                fsync_directory(self.path)
            except BaseException:
                keeper.dir_dirty = True
                raise
        active.sync()

    def _trim_page_cache(self) -> None:
        """After a sync, on the thread that synced: drop what lies behind the page-cache window."""
        if not self._closing:
            self.page_cache.trim(self._segments)

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise WalClosedError("the WAL is closed")

    # ------------------------------------------------------------ writing

    def _durable_now(self) -> bool:
        """Under sync=always, appends outside an event loop wait for the disk; inside one they do
        not (the loop must not block): coroutines ``await wait_durable(offset)``."""
        return asyncio._get_running_loop() is None

    def append(self, payload, *, key: str | None = None, attributes: dict[str, str] | None = None,
               publish_time: int | None = None) -> int:
        """Append one record; return its offset."""
        offset = self._writer.append(payload, key=key, attributes=attributes, publish_time=publish_time)
        if self._durable_now():
            self._syncer.sync_now()
        return offset

    def append_batch(self, batch, *, key: str | None = None, attributes: dict[str, str] | None = None,
                     publish_time: int | None = None) -> tuple[int, int]:
        """Append a list of payloads (sharing key, attributes, publish time) or an encoded frame
        buffer; return ``(first, last)`` offsets."""
        if isinstance(batch, (bytes, bytearray, memoryview)):
            first_last = self._writer.append_frames(batch)
        else:
            first_last = self._writer.append_payloads(batch, key=key, attributes=attributes,
                                                      publish_time=publish_time)
        if self.options.sync is SyncPolicy.ALWAYS and self._durable_now():
            self._syncer.sync_now()
        return first_last

    def append_frames(self, buf) -> tuple[int, int]:
        """Validate a frame batch, stamp it in place with the next offsets, append it (one copy).

        Returns once the frames are in the file mapping (readable, safe from a process
        crash); ``await wait_durable(last)`` for the sync policy's guarantee.
        """
        return self._writer.append_frames(buf)

    def sync(self) -> int:
        """Block until everything appended is on disk (fdatasync); return the durable offset."""
        self._check_open()
        return self._syncer.sync_now()

    async def wait_durable(self, offset: int) -> None:
        """Resolve once ``offset`` is covered by the sync policy (never blocks the event loop)."""
        if offset >= self.next_offset:
            raise OffsetOutOfRangeError("wait_durable for an offset not appended yet", offset=offset,
                                        first_offset=self.first_offset, next_offset=self.next_offset)
        await self._syncer.wait_durable(offset)

    # ------------------------------------------------------------ rotation and pruning

    def rotate(self) -> WalFileInfo | None:
        """Close the active file now (if it holds records) and start a new one (writer thread only).

        Returns the rotated file at once; it becomes final on disk (trimmed, synced,
        checkpointed, listeners called) shortly after, in the background."""
        self._check_open()
        if self._writer.segment.count == 0:
            return None
        return self._rotate(0)

    def maybe_rotate(self) -> WalFileInfo | None:
        """Rotate if the active file is older than ``max_file_age_s`` (writer thread only)."""
        if not (self._closed or self._closing) and self._writer.rotation_due():
            return self._rotate(0)
        return None

    def _rotate(self, min_bytes: int) -> WalFileInfo | None:
        """Called by the writer when the active file cannot take ``min_bytes`` more or is too old.

        A pointer switch to a file made ahead of need; no system call on this thread
        (``danube/wal/rotation.py`` does the rest in the background)."""
        with self._admin_lock:
            old = self._writer.segment
            keeper = self._keeper
            new = keeper.next_active(old.next_offset, min_bytes)
            if old.count == 0:
                self._segments = self._rotated + [new]
                self._seg_firsts = [s.first_offset for s in self._segments]
                self._writer.set_segment(new)
                keeper.discard(old)
                return None
            keeper.retire(old)  # before the switch: the syncer must find it (see _sync_files)
            self._rotated = self._rotated + [old]
            self._segments = self._rotated + [new]
            self._seg_firsts = [s.first_offset for s in self._segments]
            self._writer.set_segment(new)
            return _info(old)

    def finish_rotations(self, timeout: float | None = None) -> bool:
        """Block until every file rotated so far is final: trimmed to its frames, fdatasync'd
        (sync modes), in the checkpoint, and its rotation listeners called.  False on timeout.

        Blocks (briefly): call from a worker thread, not an event loop."""
        return self._keeper.wait_finished(timeout)

    def rotated_files(self) -> list[WalFileInfo]:
        """Rotated files, oldest first: the writer has left them, their frames (``size`` bytes)
        never change again.  A file just rotated may still have its preallocated tail on disk
        until it is final; rotation listeners are called only then."""
        return [_info(s) for s in self._rotated]

    def add_rotation_listener(self, callback: Callable[[WalFileInfo], None]) -> None:
        """Call ``callback(WalFileInfo)`` once each rotated file is final: trimmed, synced and in
        the checkpoint.  It runs on the WAL's background file thread; keep it short (wake
        something up) and do not block it."""
        self._keeper.listeners.append(callback)

    def prune_through(self, offset: int) -> list[WalFileInfo]:
        """Delete rotated files whose last offset is <= ``offset``; return what was deleted.

        Waits for those files to be final first, then writes the checkpoint and deletes
        them: blocking file work, so call it from a worker thread."""
        self._check_open()
        with self._admin_lock:
            if not any(s.last_offset <= offset for s in self._rotated):
                return []
        self._keeper.wait_finished(notified=False)
        doomed: list = []

        def drop(ckpt: Checkpoint) -> None:
            with self._admin_lock:
                self._check_open()
                # only files the checkpoint lists (final): one rotated meanwhile is not yet
                doomed.extend(s for s in self._rotated if s.last_offset <= offset and s.seq in ckpt.rotated)
                if not doomed:
                    return
                keep = self._rotated[len(doomed):]
                self._rotated = keep
                self._segments = keep + [self._writer.segment]
                self._seg_firsts = [s.first_offset for s in self._segments]
                for s in doomed:
                    ckpt.rotated.pop(s.seq, None)
                ckpt.first_offset = self._segments[0].first_offset

        self._keeper.update_checkpoint(drop)
        infos = [_info(s) for s in doomed]
        for s in doomed:
            s.delete()
        if doomed:
            fsync_directory(self.path)
        return infos

    # ------------------------------------------------------------ reading

    def _range_error(self, offset: int, message: str) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(message, offset=offset, first_offset=self.first_offset,
                                     next_offset=self.next_offset)

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
        segments, firsts = self._segments, self._seg_firsts
        if from_offset > next_offset or from_offset < firsts[0] or (
                from_offset < segments[0].first_offset):
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
            raise self._range_error(from_offset, "offset pruned while reading") from None

    def read(self, from_offset: int, max_records: int | None = None) -> list[Record]:
        """Records from ``from_offset`` to the end (or ``max_records`` of them)."""
        out: list[Record] = []
        pos = from_offset
        while max_records is None or len(out) < max_records:
            view = self.read_frames(pos, DEFAULT_READ_BYTES)
            if not len(view):
                break
            for record in frames.iter_records(view):
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
            for record in frames.iter_records(view):
                yield record
            pos = record.offset + 1

    def __iter__(self) -> Iterator[Record]:
        return self.iter()

    async def tail_frames(self, from_offset: int | None = None,
                          max_bytes: int = DEFAULT_READ_BYTES) -> AsyncIterator[memoryview]:
        """Yield frame batches from ``from_offset`` (default: the end), following live appends.

        Every reader gets views of the same bytes (no copy per reader).  Ends when the WAL closes.
        """
        pos = self.next_offset if from_offset is None else from_offset
        notifier = self._notifier
        read_cached = self._ring.read_counted  # frames and their count, no walk over them
        while not self._closed:
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

    async def tail(self, from_offset: int | None = None) -> AsyncIterator[Record]:
        """Yield records from ``from_offset`` (default: the end), following live appends."""
        async for view in self.tail_frames(from_offset):
            for record in frames.iter_records(view):
                yield record

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Sync (unless sync='never'), finish rotated files, stop background work, release the
        files. Idempotent."""
        with self._admin_lock:
            if self._closed or self._closing:
                return
            self._closing = True
            self._writer.close()  # no append (hence no rotation) from here on
        try:
            # outside the lock: a rotation listener running meanwhile may call into the WAL
            self._keeper.close()
        finally:
            with self._admin_lock:
                try:
                    self._syncer.close()
                    self._closed = True
                    self._notifier.close()
                    # the cache references the file mappings: drop it so they are unmapped now
                    # (views readers still hold keep theirs alive)
                    self._ring.reset(self._writer.next_offset)
                    self._keeper.update_checkpoint()
                finally:
                    self._closed = True
                    for s in self._segments:
                        s.close()
                    os.close(self._lock_fd)


_count_frames = _ring.count_frames

"""The embeddable write-ahead log: :class:`Wal`.

One writer (appends from one thread at a time), any number of concurrent
readers (threads and asyncio tasks).  Offsets are consecutive integers; a
record is readable as soon as its append returns.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import threading
import time
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Iterator

from danube import _native, message_codec
from danube.errors import OffsetOutOfRangeError, TooManyOpenFilesError, WalBusyError, WalClosedError
from danube.wal.checkpoint import Checkpoint, write_checkpoint
from danube.wal.files import LOCK_NAME, WalFileInfo, fsync_directory
from danube.wal.flushstats import FlushLatency
from danube.wal.options import SyncPolicy, WalOptions
from danube.wal.pagecache import PageCacheWindow
from danube.wal.recovery import RecoveryReport, recover
from danube.wal.rotation import FileKeeper, grow_reservation
from danube.wal.rotation import file_info as _info
from danube.wal.sync import Syncer
from danube.wal.tail import AppendNotifier

if TYPE_CHECKING:
    # the one Record class: the compiled codec re-exports the pure twin's (frame.pyi)
    from danube._pure.frame import Record

_walfile = _native.load("walfile")
_ring = _native.load("ring")
log = logging.getLogger("danube.wal")

DEFAULT_READ_BYTES = 1 << 20
PREFAULT_BYTES = 4 << 20


class Wal:
    """A write-ahead log in a directory.  Open with :meth:`Wal.open`."""

    def __init__(self, path: str, options: WalOptions) -> None:
        self.path = os.path.abspath(path)
        self.options = options
        self._closed = False
        self._read_only = False  # stop_writing(): the lock is released, the mappings stay readable
        os.makedirs(self.path, exist_ok=True)
        try:
            self._lock_fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _fd_error(exc, self.path) from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise WalBusyError(
                f"WAL {self.path} is open elsewhere (one writer per log); it is free once "
                "that process closes it or ends"
            ) from None
        self._device = os.fstat(self._lock_fd).st_dev
        self._closing = False
        self._admin_lock = threading.RLock()  # the segment lists: rotation, pruning, close, suspend
        self._listeners: list[Callable[[WalFileInfo], None]] = []
        self._resume_listeners: list[Callable[[], None]] = []
        self._dormant: _Dormant | None = None  # set while suspended (files, threads, cache released)
        self._generation = 0  # bumped by every suspend
        self.suspend_count = 0
        self._reads = 0  # reads that reached the files (idleness)
        self._sync_base = 0
        self.flush_latency = FlushLatency()  # every sync's, across suspends
        self.resume_count = 0
        self._ring: Any = None
        self._notifier: AppendNotifier | None = None
        try:
            self._open_state()
        except OSError as exc:
            os.close(self._lock_fd)
            raise _fd_error(exc, self.path) from exc
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open_state(self) -> None:
        """Recover the files, start the writer and join the sync group (at open, and again on
        the first use after :meth:`suspend`)."""
        options = self.options
        recovered = recover(self.path, options)
        self.recovery: RecoveryReport = recovered.report
        self._rotated = list(recovered.rotated)
        active = recovered.active
        self._segments = self._rotated + [active]
        self._seg_firsts = [s.first_offset for s in self._segments]
        if self._ring is None:
            self._ring = _ring.FrameRing(options.cache_bytes, next_offset=active.next_offset)
        else:  # resuming: the cache was emptied at suspend
            self._ring.reset(active.next_offset)
        self._writer = _walfile.LogWriter(active, self._ring, self._on_full, max_file_age_s=options.max_file_age_s)
        if options.sync is SyncPolicy.NEVER:
            # fault the file mapping in ahead of the writer (never under a sync policy: each
            # fdatasync would also write the populated zero pages)
            self._writer.prefault_bytes = PREFAULT_BYTES
        if self._notifier is None:
            self._notifier = AppendNotifier(self._writer)
        else:  # tail readers waiting across a suspend keep their notifier
            self._notifier.attach(self._writer)
        if recovered.changed:
            try:
                write_checkpoint(self.path, recovered.checkpoint)
            except BaseException:
                for seg in self._segments:
                    seg.close()
                raise
        # Under sync=never nothing is synced, so nothing is dropped from the page cache either.
        self.page_cache = (
            PageCacheWindow(options.page_cache_bytes)
            if options.page_cache_bytes is not None and options.sync is not SyncPolicy.NEVER
            else None
        )
        self._syncer = Syncer(
            options.sync,
            options.sync_interval_ms,
            self._appended,
            self._sync_files,
            after_sync=self._trim_page_cache if self.page_cache is not None else None,
            group=options.sync_group,
            watch_appends=self._notifier.watch,
            fs_target=self._fs_sync_target,
            latency=self.flush_latency,
        )
        self._keeper = FileKeeper(
            self.path,
            options,
            recovered.checkpoint,
            durable=options.sync is not SyncPolicy.NEVER,
            sync_lock=self._syncer.lock,
        )
        self._keeper.listeners = self._listeners
        self._last_use = ((self._writer.next_offset, self._reads), time.monotonic())
        # The per-record hot path is the writer's own method unless every append must wait for disk.
        if options.sync is not SyncPolicy.ALWAYS:
            self._route_appends(self._writer)
        else:
            self.__dict__.pop("append", None)
            self.__dict__.pop("append_frames", None)

    def _route_appends(self, writer: Any) -> None:
        """``append`` and ``append_frames`` call ``writer``'s own methods (no wrapper per record):
        the instance's entries shadow the class's methods (under sync=always ``_open_state`` pops
        them, so the class's, which wait for the disk, are called)."""
        shadows = self.__dict__
        shadows["append"] = writer.append
        shadows["append_frames"] = writer.append_frames

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
        if self._read_only and not self._closed:
            state += " read-only"
        return f"<Wal {self.path} {state} sync={self.options.sync.value}>"

    # ------------------------------------------------------------ state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def read_only(self) -> bool:
        """True after :meth:`stop_writing`: offsets below ``next_offset`` stay readable, nothing
        else works (appends, rotation, pruning and syncs raise :class:`WalClosedError`)."""
        return self._read_only

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
        return self._sync_base + self._syncer.sync_count

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

    def _fs_sync_target(self) -> tuple[int, int] | None:
        """What a syncfs round syncs for this log: the file system of its directory, through the
        lock file's descriptor (open as long as the log).  None while a rotated file or the
        directory still needs its own fsync (rare: around rotations), so ``_sync_files`` runs."""
        keeper = self._keeper
        if keeper.unsynced or keeper.dir_dirty:
            return None
        return self._device, self._lock_fd

    def _trim_page_cache(self) -> None:
        """After a sync, on the thread that synced: drop what lies behind the page-cache window."""
        cache = self.page_cache  # None once the log stops writing or suspends
        if cache is not None and not self._closing:
            cache.trim(self._segments)

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise WalClosedError(
                "the WAL is read-only (stop_writing)" if self._read_only and not self._closed else "the WAL is closed"
            )

    # ------------------------------------------------------------ writing

    def _durable_now(self) -> bool:
        """Under sync=always, appends outside an event loop wait for the disk; inside one they do
        not (the loop must not block): coroutines ``await wait_durable(offset)``."""
        return asyncio._get_running_loop() is None

    def append(
        self,
        payload,
        *,
        key: str | None = None,
        attributes: dict[str, str] | None = None,
        publish_time: int | None = None,
    ) -> int:
        """Append one record; return its offset."""
        offset = self._writer.append(payload, key=key, attributes=attributes, publish_time=publish_time)
        if self._durable_now():
            self._syncer.sync_now()
        return offset

    def append_batch(
        self,
        batch,
        *,
        key: str | None = None,
        attributes: dict[str, str] | None = None,
        publish_time: int | None = None,
    ) -> tuple[int, int]:
        """Append a list of payloads (sharing key, attributes, publish time) or an encoded frame
        buffer; return ``(first, last)`` offsets."""
        if isinstance(batch, (bytes, bytearray, memoryview)):
            first_last = self._writer.append_frames(batch)
        else:
            first_last = self._writer.append_payloads(batch, key=key, attributes=attributes, publish_time=publish_time)
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
        if self._dormant is not None:
            return self.durable_offset  # everything was synced before the suspend
        return self._syncer.sync_now()

    async def wait_durable(self, offset: int) -> None:
        """Resolve once ``offset`` is covered by the sync policy (never blocks the event loop)."""
        if offset >= self.next_offset:
            raise OffsetOutOfRangeError(
                "wait_durable for an offset not appended yet",
                offset=offset,
                first_offset=self.first_offset,
                next_offset=self.next_offset,
            )
        if self._dormant is not None and offset <= self.durable_offset:
            return
        await self._syncer.wait_durable(offset)

    # ------------------------------------------------------------ rotation and pruning

    def rotate(self) -> WalFileInfo | None:
        """Close the active file now (if it holds records) and start a new one (writer thread only).

        Returns the rotated file at once; it becomes final on disk (trimmed, synced,
        checkpointed, listeners called) shortly after, in the background."""
        self._check_open()
        self._resume_if_dormant()
        if self._writer.segment.count == 0:
            return None
        return self._rotate(0)

    def maybe_rotate(self) -> WalFileInfo | None:
        """Rotate if the active file is older than ``max_file_age_s`` (writer thread only)."""
        if not (self._closed or self._closing) and self._writer.rotation_due():
            self._resume_if_dormant()
            return self._rotate(0)
        return None

    def _on_full(self, min_bytes: int) -> WalFileInfo | None:
        """Called by the writer when the active file's reserved space cannot take ``min_bytes``
        more, or the file is older than ``max_file_age_s``: reserve more disk for the file
        (doubling, up to ``max_file_bytes``) while it fits, else rotate."""
        seg = self._writer.segment
        if not self._writer.rotation_due() and grow_reservation(seg, min_bytes):
            return None
        return self._rotate(min_bytes)

    def _rotate(self, min_bytes: int) -> WalFileInfo | None:
        """Called by the writer when the active file cannot take ``min_bytes`` more or is too old.

        A pointer switch to a file made ahead of need; no system call on this thread
        (``danube/wal/rotation.py`` does the rest in the background)."""
        with self._admin_lock:
            old = self._writer.segment
            keeper = self._keeper
            new = keeper.next_active(old.next_offset, min_bytes, old.capacity)
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
        if self._dormant is not None:
            return True  # suspend finished them all
        return self._keeper.wait_finished(timeout)

    def rotated_files(self) -> list[WalFileInfo]:
        """Rotated files, oldest first: the writer has left them, their frames (``size`` bytes)
        never change again.  A file just rotated may still have its preallocated tail on disk
        until it is final; rotation listeners are called only then."""
        dormant = self._dormant
        if dormant is not None:
            return list(dormant.rotated)
        return [_info(s) for s in self._rotated]

    def add_rotation_listener(self, callback: Callable[[WalFileInfo], None]) -> None:
        """Call ``callback(WalFileInfo)`` once each rotated file is final: trimmed, synced and in
        the checkpoint.  It runs on one of the WAL's background file threads, which every log of
        the process shares; keep it short (wake something up) and do not block it (above all, not
        on another log's file work, which may be queued behind it)."""
        self._listeners.append(callback)

    def add_resume_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time a suspended log reopens (on the thread whose use reopened
        it: the writer's, or a reader's).  Whoever suspends the log when idle needs this to look at
        its idleness again: a reopened log holds its files and threads until suspended again."""
        self._resume_listeners.append(callback)

    def prune_through(self, offset: int) -> list[WalFileInfo]:
        """Delete rotated files whose last offset is <= ``offset``; return what was deleted.

        Waits for those files to be final first, then writes the checkpoint and deletes
        them: blocking file work, so call it from a worker thread."""
        self._check_open()
        with self._admin_lock:
            dormant = self._dormant
            if dormant is not None:
                if not any(f.last_offset <= offset for f in dormant.rotated):
                    return []
                self._resume_if_dormant()
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
                keep = self._rotated[len(doomed) :]
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

    # ------------------------------------------------------------ closing

    # ------------------------------------------------------------ suspending an idle log

    @property
    def suspended(self) -> bool:
        """True while :meth:`suspend` has released the files (the next use reopens them)."""
        return self._dormant is not None

    def idle_seconds(self) -> float:
        """Seconds since this was last seen appending or reading from its files (sampled: each
        call compares with the previous one, so call it periodically)."""
        mark = (self._writer.next_offset, self._reads)
        last_mark, since = self._last_use
        now = time.monotonic()
        if mark != last_mark:
            self._last_use = (mark, now)
            return 0.0
        return now - since

    def suspend(self) -> bool:
        """Release what an idle log holds: segment files and their mappings, the frame cache, the
        place in the sync group, the spare file, the active file's preallocated tail.  Only the
        lock file stays open (one descriptor: no other process can take the log meanwhile).

        The next use (an append, a read below the end, a rotation, pruning) reopens the log the
        way :meth:`open` does (a cleanly suspended log scans only its active file), on the
        caller's thread.  Tail readers waiting at the end keep waiting and are woken by the next
        append.  Call from the writer's thread (the one that appends).  Returns False and does
        nothing when the log is closed, already suspended, or someone waits for durability."""
        with self._admin_lock:
            if self._closed or self._closing or self._dormant is not None or self._syncer.has_waiters():
                return False
            writer = self._writer
            self._closing = True
            writer.close()  # no append (hence no rotation) from here on
        try:
            self._keeper.close()  # finishes rotated files, deletes the spare
            with self._admin_lock:
                self._syncer.close()  # a last sync (sync modes)
                self._sync_base += self._syncer.sync_count
                active = writer.segment
                dormant = _Dormant(
                    self, writer.next_offset, [_info(s) for s in self._rotated], active.created_ms, active.count
                )
                self._ring.reset(writer.next_offset)  # the cache references the mappings
                release = _release_tail(active)  # a dup of the fd: the truncates run in the background
                for seg in self._segments:
                    seg.close()
                if release is not None:
                    dormant.released = _RELEASER.submit(*release)
                self._segments = []
                self._rotated = []
                self._dormant = dormant
                self._writer = dormant
                self.page_cache = None
                self._generation += 1
                self.suspend_count += 1
                self._route_appends(dormant)
        finally:
            self._closing = False
        return True

    def _resume_if_dormant(self) -> None:
        """Reopen a suspended log (no-op when it is open)."""
        if self._dormant is None:
            return
        with self._admin_lock:
            dormant = self._dormant
            if dormant is None:
                return
            if self._closed or self._closing:
                raise WalClosedError("the WAL is closed")
            if dormant.released is not None:
                dormant.released.wait()  # the tail release of the suspend, if still running
            firsts = self._seg_firsts
            try:
                try:
                    self._open_state()
                except OSError as exc:
                    raise _fd_error(exc, self.path) from exc
            except BaseException:
                self._writer = dormant
                self._segments = []
                self._rotated = []
                self._seg_firsts = firsts
                self._route_appends(dormant)
                raise
            self._dormant = None
            self.resume_count += 1
        for callback in list(self._resume_listeners):
            try:
                callback()
            except Exception:  # noqa: BLE001 - the log is open and usable whatever a listener does
                log.exception("WAL %s: resume listener %r failed", self.path, callback)

    def stop_writing(self) -> int:
        """Give up writing but keep reading: sync (unless sync='never'), finish rotated files,
        write the checkpoint, stop the writer and release the directory's lock; the files stay
        mapped, so every offset below ``next_offset`` is read as before until :meth:`close`.

        Another process may open the directory from then on (the next owner of a topic whose WAL
        is on a shared file system) and append after those offsets: this log never writes to the
        directory again (no sync, rotation, pruning, suspend or checkpoint), and its reads stop at
        its own ``next_offset``, below which the files never change.  A suspended log is reopened
        first, while the lock is still held (reading it later would recover the files, which
        writes).  Returns the last offset stored (``next_offset - 1``).  Blocks (syncs, file work):
        call from a worker thread."""
        self._resume_if_dormant()
        with self._admin_lock:
            if self._closed or self._closing:
                raise WalClosedError("the WAL is closed" if not self._read_only else "the WAL is read-only")
            self._closing = True  # stays set: everything that writes refuses (see _check_open)
            self._writer.close()  # no append (hence no rotation) from here on
        try:
            self._keeper.close()  # rotated files finished (trimmed, synced), the spare deleted
        finally:
            with self._admin_lock:
                try:
                    self._syncer.close()  # a last sync
                    self._keeper.update_checkpoint()
                finally:
                    self._read_only = True
                    self.page_cache = None
                    os.close(self._lock_fd)  # the lock goes with its descriptor
                    self._lock_fd = -1
        return self._writer.next_offset - 1

    def close(self) -> None:
        """Sync (unless sync='never'), finish rotated files, stop background work, release the
        files. Idempotent."""
        notifier = self._notifier
        assert notifier is not None, "set by _open_state, which __init__ runs"
        with self._admin_lock:
            if self._read_only and not self._closed:
                # stop_writing did the rest (and gave the directory up): only the mappings go
                self._closed = True
                notifier.close()
                self._ring.reset(self._writer.next_offset)
                for s in self._segments:
                    s.close()
                return
            if self._closed or self._closing:
                return
            self._closing = True
            self._writer.close()  # no append (hence no rotation) from here on
            dormant = self._dormant
        if dormant is not None and dormant.released is not None:
            # the suspend's tail release must be done before the lock goes: the next owner of the
            # directory must not have its file truncated under it
            dormant.released.wait()
        try:
            # outside the lock: a rotation listener running meanwhile may call into the WAL
            self._keeper.close()
        finally:
            with self._admin_lock:
                try:
                    self._syncer.close()
                    self._closed = True
                    notifier.close()
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


def _fd_error(exc: OSError, path: str) -> OSError | TooManyOpenFilesError:
    """EMFILE/ENFILE as a clear :class:`TooManyOpenFilesError`; other errors unchanged."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE):
        return exc
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    which = "this process" if exc.errno == errno.EMFILE else "the system"
    return TooManyOpenFilesError(
        f"WAL {path}: {which} ran out of file descriptors (RLIMIT_NOFILE soft {soft}, hard {hard}); "
        f"raise the limit (ulimit -n, LimitNOFILE=) or close idle topics sooner "
        f"(storage.wal.idle_close_seconds)"
    )


def _release_tail(seg) -> tuple[int, int, int] | None:
    """What to do to give back the disk blocks allocated after the last frame of an (idle)
    active file: cut the file at the page after its data and extend it again (a hole reads as
    zeros, which is where recovery's scan stops).  A crash between the two leaves a shorter file
    holding every frame, which recovery takes as a full file and continues after.  Returns
    ``(dup'd fd, keep, size)`` for :data:`_RELEASER` (freeing extents can take ~10 ms of journal
    work: not on the caller's thread, an event loop), or None when there is nothing to free."""
    if not seg.writable or seg.closed:
        return None
    size = os.fstat(seg.fileno()).st_size
    keep = -(-seg.write_pos // _PAGE) * _PAGE
    if keep >= size:
        return None
    return os.dup(seg.fileno()), keep, size


class _TailReleaser:
    """One background thread for every log's tail release (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: list = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)

    def submit(self, fd: int, keep: int, size: int) -> threading.Event:
        done = threading.Event()
        with self._lock:
            self._jobs.append((fd, keep, size, done))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="danube-tail-release", daemon=True)
                self._thread.start()
            self._wake.notify()
        return done

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    if not self._wake.wait(5.0) and not self._jobs:
                        self._thread = None  # idle: the thread ends, the next submit starts one
                        return
                fd, keep, size, done = self._jobs.pop(0)
            try:
                os.ftruncate(fd, keep)
                os.ftruncate(fd, size)
            except OSError:  # nothing lost: the blocks stay allocated until the next suspend
                log.warning("WAL: giving back an idle file's preallocated tail failed", exc_info=True)
            finally:
                os.close(fd)
                done.set()


_RELEASER = _TailReleaser()


_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Dormant:
    """Stands in for the writer while the log is suspended: offsets and rotated files as they
    were; the first append reopens the log and goes to the real writer."""

    def __init__(self, wal: Wal, next_offset: int, rotated: list, created_ms: int, count: int) -> None:
        self._wal = wal
        self.next_offset = next_offset
        self.rotated = rotated
        self.created_ms = created_ms
        self.count = count
        self.armed = False
        self.on_append = None
        self.segment = None
        self.released: threading.Event | None = None  # set once the tail release finished

    def close(self) -> None:
        pass

    def rotation_due(self) -> bool:
        age = self._wal.options.max_file_age_s
        return bool(self.count and age is not None and time.time() * 1000 >= self.created_ms + age * 1000)

    def _writer(self):
        self._wal._resume_if_dormant()
        return self._wal._writer

    def append(self, *args, **kwargs):
        return self._writer().append(*args, **kwargs)

    def append_frames(self, buf):
        return self._writer().append_frames(buf)

    def append_payloads(self, *args, **kwargs):
        return self._writer().append_payloads(*args, **kwargs)

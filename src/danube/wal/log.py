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
import time
from typing import Any, Callable

from danube import _native
from danube.errors import OffsetOutOfRangeError, WalBusyError, WalClosedError
from danube.wal.checkpoint import Checkpoint, write_checkpoint
from danube.wal.files import LOCK_NAME, WalFileInfo, fsync_directory
from danube.wal.flushstats import FlushLatency
from danube.wal.log_read import DEFAULT_READ_BYTES, WalReading
from danube.wal.log_rotation import WalRotation
from danube.wal.log_suspend import WalSuspension, _Dormant, _fd_error
from danube.wal.options import REARM_AHEAD_BYTES, SyncPolicy, WalOptions
from danube.wal.pagecache import PageCacheWindow
from danube.wal.recovery import RecoveryReport, recover
from danube.wal.rotation import FileKeeper
from danube.wal.sync import DurableCallback, Syncer
from danube.wal.tail import AppendNotifier

_walfile = _native.load("walfile")
_ring = _native.load("ring")

PREFAULT_BYTES = 4 << 20

__all__ = ["DEFAULT_READ_BYTES", "PREFAULT_BYTES", "Wal"]


class Wal(WalReading, WalRotation, WalSuspension):
    """A write-ahead log in a directory.  Open with :meth:`Wal.open`.

    Its parts by job: reading (``wal/log_read.py``), rotation and pruning
    (``wal/log_rotation.py``), suspending an idle log (``wal/log_suspend.py``); opening,
    appending, syncing, ``stop_writing`` and closing are here."""

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
            after_sync=self._after_sync,
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
        # The per-record hot path is the writer's own method unless every append must wait for disk
        # (``append_frames`` never waits: under sync=always too it is the writer's).
        if options.sync is not SyncPolicy.ALWAYS:
            self._route_appends(self._writer)
        else:
            self.__dict__.pop("append", None)
            self.__dict__["append_frames"] = self._writer.append_frames

    def _route_appends(self, writer: Any) -> None:
        """``append`` and ``append_frames`` call ``writer``'s own methods (no wrapper per record):
        the instance's entries shadow the class's methods (under sync=always ``_open_state`` pops
        ``append``'s, so the class's, which waits for the disk, is called)."""
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

    def _after_sync(self, rearms: list | None = None) -> None:
        """After a sync, on the thread that synced: make the active file's tail writable again in
        this process's mapping (off the appending thread: see SegmentFile.rearm) unless the writer
        pwrites (big batches never store through the mapping), and drop what lies behind the
        page-cache window.  With ``rearms`` (a sync round's list), the file goes there instead,
        for the round to rearm with its other logs' files in one call."""
        if self._closing:
            return
        writer = self._writer
        active = writer.segment  # None while suspended
        if active is not None and writer.last_stored:
            if rearms is None:
                active.rearm(REARM_AHEAD_BYTES)
            else:
                rearms.append(active)
        cache = self.page_cache  # None once the log stops writing or suspends
        # (``cache.due``, inline: a round asks it of every log it synced)
        if cache is not None and (active is None or active.seq != cache.due_seq or active.write_pos >= cache.due_pos):
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
        self._check_appended(offset, "wait_durable")
        if self._dormant is not None and offset <= self.durable_offset:
            return
        await self._syncer.wait_durable(offset)

    def when_durable(self, offset: int, callback: DurableCallback) -> None:
        """:meth:`wait_durable` as a callback: ``callback(None)`` on the running event loop once
        ``offset`` is covered by the sync policy, ``callback(error)`` if it cannot be; never
        called before this returns.  Cheaper than a future awaited by a task when the caller
        keeps its own state (``danube.broker.commits``)."""
        if offset >= self._writer.next_offset:  # (``_check_appended``, inline: once per commit)
            self._check_appended(offset, "when_durable")
        if self._dormant is not None and offset <= self.durable_offset:
            asyncio.get_running_loop().call_soon(callback, None)
            return
        self._syncer.when_durable(offset, callback)

    def _check_appended(self, offset: int, what: str) -> None:
        if offset >= self.next_offset:
            raise OffsetOutOfRangeError(
                f"{what} for an offset not appended yet",
                offset=offset,
                first_offset=self.first_offset,
                next_offset=self.next_offset,
            )

    # ------------------------------------------------------------ read-only and closing

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

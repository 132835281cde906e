"""Suspending an idle WAL: releasing its files, mappings, cache, threads and the active file's
preallocated tail while it is idle, and reopening it on the next use.

A base class of :class:`~danube.wal.log.Wal` (``wal/log.py``), which holds the state; its
methods are moved here whole, with the writer's stand-in while suspended (:class:`_Dormant`) and
the background thread that gives idle files' tails back.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from danube.errors import TooManyOpenFilesError, WalClosedError
from danube.wal.rotation import file_info as _info

if TYPE_CHECKING:
    from danube.wal.options import WalOptions
    from danube.wal.pagecache import PageCacheWindow
    from danube.wal.rotation import FileKeeper
    from danube.wal.sync import Syncer

log = logging.getLogger("danube.wal")


class WalSuspension:
    if TYPE_CHECKING:  # what this part uses of the rest of Wal
        _admin_lock: threading.RLock
        _closed: bool
        _closing: bool
        _dormant: _Dormant | None
        _generation: int
        _keeper: FileKeeper
        _last_use: tuple[tuple[int, int], float]
        _reads: int
        _resume_listeners: list[Callable[[], None]]
        _ring: Any
        _rotated: list
        _segments: list
        _seg_firsts: list[int]
        _sync_base: int
        _syncer: Syncer
        _writer: Any
        options: WalOptions
        page_cache: PageCacheWindow | None
        path: str
        resume_count: int
        suspend_count: int

        def _open_state(self) -> None: ...

        def _route_appends(self, writer: Any) -> None: ...

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

    def add_resume_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time a suspended log reopens (on the thread whose use reopened
        it: the writer's, or a reader's).  Whoever suspends the log when idle needs this to look at
        its idleness again: a reopened log holds its files and threads until suspended again."""
        self._resume_listeners.append(callback)


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

    def __init__(self, wal: WalSuspension, next_offset: int, rotated: list, created_ms: int, count: int) -> None:
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

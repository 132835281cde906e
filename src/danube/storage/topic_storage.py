"""TopicStorage: one reliable topic's storage (hot WAL + durable history) on this broker.

Created only by :class:`danube.storage.factory.StorageFactory`.  The write path
is the WAL's (``append_frames`` is synchronous and never blocks on disk);
everything that touches a backend or deletes files runs on worker threads.

Reads below ``hot_start`` come from durable segments, the rest from the WAL.
``hot_start`` is the WAL's first offset, or, after a sealed resume (hot
cutover), never below the resume offset.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from danube import movetrace
from danube._tasks import cancel_and_wait
from danube.errors import (
    OffsetOutOfRangeError,
    StorageError,
    StorageFullError,
    TopicSealedError,
    WalClosedError,
)
from danube.metadata.store import MetadataStore
from danube.storage.backends import DurableBackend
from danube.storage.catalog import SegmentCatalog
from danube.storage.config import StorageConfig
from danube.storage.exporter import SegmentExporter
from danube.storage.paths import remove_topic_dir
from danube.storage.recovery import RecoveryStart, write_sealed_state
from danube.storage.retention import RetentionEnforcer
from danube.storage.tiered_reader import DurableHistoryReader, chained_tail
from danube.wal.options import SyncPolicy

if TYPE_CHECKING:
    from danube.storage.owner_fence import OwnerFence

log = logging.getLogger(__name__)

_RETRY_AFTER_FAILURE_S = 5.0
# A graceful stop exports each topic's unexported committed tail for at most this long (a backend
# outage must not hold the broker's exit forever; the WAL keeps what was not exported).
SHUTDOWN_EXPORT_TIMEOUT_S = 30.0


class TopicStorage:
    def __init__(
        self,
        topic: str,
        config: StorageConfig,
        wal: Any,
        backend: DurableBackend,
        catalog: SegmentCatalog,
        metadata: MetadataStore,
        *,
        broker_id: str,
        recovery: RecoveryStart,
        wal_dir: str,
        durable_topic: str | None = None,
    ) -> None:
        self.topic = topic
        # the name of its durable history (factory.durable_topic: a system topic's is per broker)
        self.durable_topic = durable_topic or topic
        self.config = config
        self.wal = wal
        self.backend = backend
        self.catalog = catalog
        self.metadata = metadata
        self.broker_id = broker_id
        self.recovery = recovery
        self.wal_dir = wal_dir
        self.cutover = recovery.initial_offset if recovery.hot_cutover else 0
        self.exporter = SegmentExporter(
            self.durable_topic, wal, backend, catalog, max_segment_bytes=config.wal.max_file_bytes
        )
        self.retention = RetentionEnforcer(
            topic, wal, self.exporter, config.local_retention, export_before_prune=not config.exports_continuously
        )
        self.history = DurableHistoryReader(backend, catalog, chunk_bytes=config.read_chunk_bytes)
        self.sealed_offset: int | None = None
        self._writable = True
        self._closed = False
        # make_read_only(): why writes are refused while the stored offsets are still served
        self.read_only_reason: str | None = None
        self._seal_lock = asyncio.Lock()
        self._wake = asyncio.Event()  # the maintenance task has something to look at
        self._rotation_seen = False  # ... a rotated file (export, retention)
        self._listening = False  # the WAL listeners are registered (once: a failed seal restarts)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.on_closed: Callable[[TopicStorage], None] | None = None  # set by the factory
        self.owner_fence: OwnerFence | None = None  # shared_fs only, set by the factory
        self._sync_never = getattr(getattr(wal, "options", None), "sync", None) is SyncPolicy.NEVER

    def __repr__(self) -> str:
        return f"<TopicStorage {self.topic} {self.config.mode} {self.first_offset}..{self.next_offset - 1}>"

    # ------------------------------------------------------------------ state

    @property
    def next_offset(self) -> int:
        if self.sealed_offset is not None:
            return self.sealed_offset + 1
        return self.wal.next_offset

    @property
    def hot_start(self) -> int:
        """First offset served by the local WAL."""
        if self.sealed_offset is not None:
            return self.sealed_offset + 1
        return max(self.wal.first_offset, self.cutover)

    @property
    def first_offset(self) -> int:
        """Oldest readable offset, durable history included."""
        start = self.catalog.start_offset
        hot = self.hot_start
        return start if start is not None and start < hot else hot

    @property
    def durable_end(self) -> int:
        return self.catalog.end_offset

    @property
    def sealed(self) -> bool:
        return self.sealed_offset is not None

    @property
    def read_only(self) -> bool:
        return self.read_only_reason is not None

    def describe(self) -> dict[str, Any]:
        segments = self.catalog.segments
        return {
            "topic": self.topic,
            "mode": self.config.mode,
            "first_offset": self.first_offset,
            "next_offset": self.next_offset,
            "hot_start_offset": self.hot_start,
            "durable_end_offset": self.durable_end,
            "segment_count": len(segments),
            "segment_bytes": sum(d.size for d in segments),
            "segments": [
                {
                    "segment_id": d.segment_id,
                    "start_offset": d.start_offset,
                    "end_offset": d.end_offset,
                    "size": d.size,
                    "record_count": d.record_count,
                }
                for d in segments[-20:]
            ],
            "recovered_from": self.recovery.source,
            "sealed": self.sealed,
            "read_only": self.read_only,
            "backend": self.backend.describe(),
        }

    # ------------------------------------------------------------------ background work

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if not self._listening:
            self._listening = True
            self.wal.add_rotation_listener(self._on_rotation)
            # a suspended log reopened by a use must be looked at again (idle -> suspend once more):
            # the task stopped counting its idleness when it suspended it
            self.wal.add_resume_listener(self._on_resume)
        self._task = asyncio.create_task(self._maintain(), name=f"storage-maintenance {self.topic}")

    def _on_rotation(self, _info) -> None:
        self._poke(True)

    def _on_resume(self) -> None:
        self._poke(False)

    def _poke(self, rotated: bool) -> None:
        """Wake the maintenance task from any thread (the WAL's file thread, a reader's thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._woken, rotated)
        except RuntimeError:  # loop shut down
            pass

    def _woken(self, rotated: bool) -> None:
        if rotated:
            self._rotation_seen = True
        self._wake.set()

    async def _maintain(self) -> None:
        continuous = self.config.exports_continuously
        export_every = self.config.export_interval_s
        check_every = self.config.local_retention.check_interval_s
        now = time.monotonic()
        next_export, next_check = now + export_every, now + check_every
        age_limit = self.config.wal.max_file_age_s
        idle_limit = self.config.wal.idle_close_s
        while True:
            due = min(next_export if continuous else float("inf"), next_check)
            if age_limit:
                due = min(due, time.monotonic() + age_limit / 4)
            if idle_limit and not self.wal.suspended:
                due = min(due, time.monotonic() + idle_limit / 2)
            # asyncio.timeout, not wait_for: under 3.11 wait_for drops a cancellation that lands
            # with the wake (a rotation finishing as seal() stops this task), and seal() then
            # waits for this task forever (CPython gh-86296; tests/unit/storage/test_maintenance_stop.py)
            try:
                async with asyncio.timeout(max(due - time.monotonic(), 0.0)):
                    await self._wake.wait()
            except TimeoutError:
                pass
            rotated, self._rotation_seen = self._rotation_seen, False
            self._wake.clear()
            now = time.monotonic()
            try:
                if age_limit and self._writable:
                    self.wal.maybe_rotate()  # idle topics rotate by age too; runs on the writer's loop
                if continuous and now >= next_export:
                    if self._may_export():
                        await self.exporter.export_committed()
                    # on a fixed cadence (not an interval after a slow upload): a record acked
                    # right after a tick is durable one interval plus one upload later
                    next_export = max(next_export + export_every, time.monotonic())
                elif continuous and rotated and self._may_export():
                    await self.exporter.export_rotated()
                if rotated or now >= next_check:
                    await self.retention.enforce()
                    next_check = time.monotonic() + check_every
                if idle_limit and self._writable:
                    if (
                        continuous
                        and self._may_export()
                        and self.exporter.pending()
                        and self.wal.idle_seconds() >= idle_limit
                    ):
                        await self.exporter.export_committed()  # before its files and cache go
                    self._suspend_if_idle(idle_limit)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop must survive a backend outage
                log.exception(
                    "%s: background export/retention failed; retrying in %.0fs", self.topic, _RETRY_AFTER_FAILURE_S
                )
                next_export = min(next_export, time.monotonic() + _RETRY_AFTER_FAILURE_S)
                next_check = min(next_check, time.monotonic() + _RETRY_AFTER_FAILURE_S)
                await asyncio.sleep(min(_RETRY_AFTER_FAILURE_S, 1.0))

    def _may_export(self) -> bool:
        """Not once another broker took the WAL over (shared_fs): its new owner exports from here on."""
        return self.owner_fence is None or not self.owner_fence.fenced

    def _suspend_if_idle(self, idle_limit: float) -> bool:
        """Release the WAL's files, threads and cache once it has been idle ``idle_limit`` seconds
        (on the writer's loop: no append can run meanwhile); the next use reopens it."""
        wal = self.wal
        if wal.suspended or wal.idle_seconds() < idle_limit:
            return False
        suspended = wal.suspend()
        if suspended:
            log.debug("%s: idle for %.0fs, WAL files released", self.topic, idle_limit)
        return suspended

    async def _stop_background(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    # ------------------------------------------------------------------ writes

    def append_frames(self, buf: bytearray) -> tuple[int, int]:
        """Stamp and append an unstamped frame batch; ``(first, last)`` offsets."""
        if not self._writable:
            if self.read_only_reason is not None:
                raise TopicSealedError(
                    f"topic {self.topic} is read-only on this broker: {self.read_only_reason}; "
                    "publish refused, nothing stored",
                    retriable=True,
                )
            if self.sealed_offset is not None or not self._closed:
                raise TopicSealedError(f"topic {self.topic} is sealed for a handoff; look it up again", retriable=True)
            raise TopicSealedError(f"topic {self.topic} storage is closed", retriable=True)
        if self.owner_fence is not None:
            # one stat: an owner that was stopped while another broker took the shared WAL over must
            # not write into it when it wakes (the new owner appends to the same files)
            self.owner_fence.check()
        try:
            return self.wal.append_frames(buf)
        except OSError as exc:
            raise self._disk_error(exc, "publish refused") from exc

    def _disk_error(self, exc: OSError, what: str) -> Exception:
        """A full file system becomes StorageFullError (RESOURCE_EXHAUSTED, naming the topic and the
        reason); the WAL took nothing of the refused batch, so the next append after space was freed
        simply succeeds.  Other I/O errors stay what they are."""
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return exc
        return StorageFullError(
            f"topic {self.topic}: {what}: the file system of its WAL ({self.wal_dir}) is full "
            f"({exc.strerror}); accepted again once space is freed"
        )

    def durable_now(self, offset: int) -> bool:
        """Whether :meth:`wait_durable` would return for ``offset`` (appended already) without
        waiting (a commit then needs no task): covered by the sync policy, no owner fence to check."""
        if self.owner_fence is not None:
            return False
        # sync=never covers whatever was appended: no need to ask the log
        return self._sync_never or offset <= self.wal.durable_offset

    async def wait_durable(self, offset: int) -> None:
        try:
            await self.wal.wait_durable(offset)
        except OSError as exc:
            raise self._disk_error(exc, "not made durable") from exc
        self._check_fence()

    def when_durable(self, offset: int, callback: Callable[[BaseException | None], object]) -> None:
        """:meth:`wait_durable` as a callback on the running event loop: ``callback(None)`` once
        ``offset`` is durable (and this broker still owns the WAL), ``callback(error)`` with the
        error :meth:`wait_durable` would raise; never called before this returns."""
        self.wal.when_durable(offset, partial(self._durable_reached, callback))

    def _durable_reached(self, callback: Callable[[BaseException | None], object], exc: BaseException | None) -> None:
        if exc is None:
            if self.owner_fence is not None:  # (``_check_fence``'s test, inline: once per commit)
                try:
                    self._check_fence()
                except Exception as failed:  # noqa: BLE001 - handed to the caller, as wait_durable raises it
                    exc = failed
        elif isinstance(exc, OSError):
            error = self._disk_error(exc, "not made durable")
            if error is not exc:
                error.__cause__ = exc
            exc = error
        callback(exc)

    def _check_fence(self) -> None:
        if self.owner_fence is not None:
            try:
                self.owner_fence.check()  # ack nothing once another broker took the WAL over
            except TopicSealedError:
                self._writable = False
                raise

    # ------------------------------------------------------------------ reads

    async def read_frames(self, from_offset: int, max_bytes: int) -> bytes | memoryview:
        """Whole frames from ``from_offset``: durable history below the hot WAL, then the WAL; b"" at the end."""
        for _attempt in range(3):
            hot = self.hot_start
            if from_offset < hot:
                if from_offset > self.catalog.end_offset or self.catalog.find(from_offset) < 0:
                    raise OffsetOutOfRangeError(
                        "offset is no longer held",
                        offset=from_offset,
                        first_offset=self.first_offset,
                        next_offset=self.next_offset,
                    )
                return await self.history.read(from_offset, max_bytes, hot - 1)
            if self.sealed_offset is not None:
                if from_offset > self.sealed_offset + 1:
                    raise OffsetOutOfRangeError(
                        "offset beyond the end",
                        offset=from_offset,
                        first_offset=self.first_offset,
                        next_offset=self.next_offset,
                    )
                return b""
            try:
                return self.wal.read_frames(from_offset, max_bytes)
            except OffsetOutOfRangeError:
                if from_offset >= self.hot_start:
                    raise
                # pruned by retention between the check and the read: go to durable history
        raise OffsetOutOfRangeError(
            "offset moved out of the local WAL repeatedly",
            offset=from_offset,
            first_offset=self.first_offset,
            next_offset=self.next_offset,
        )

    def read_frames_now(self, from_offset: int, max_bytes: int) -> bytes | memoryview | None:
        """:meth:`read_frames` when it needs no await (the hot WAL, read in place); None when it
        does (durable history, a sealed storage, an offset pruned meanwhile): the caller awaits
        :meth:`read_frames` then."""
        if self.sealed_offset is not None:
            return None
        # (one call: the WAL checks its own start and the cutover, what hot_start would)
        return self.wal.read_hot(from_offset, max_bytes, self.cutover)

    def read_deliverable_now(self, from_offset: int, max_messages: int, max_bytes: int):
        """A fresh delivery's ``(frames, count)`` from the hot WAL's cache, cut and checked in one
        call (``Wal.read_deliverable``); None when not at hand that way (the caller's general
        path reads them)."""
        if self.sealed_offset is not None:
            return None
        return self.wal.read_deliverable(from_offset, max_messages, max_bytes, self.cutover)

    def tail_frames(self, from_offset: int, max_bytes: int) -> AsyncIterator[bytes | memoryview]:
        """Frames from ``from_offset`` onwards: durable history, then the hot WAL, following live appends.

        Ends when the storage is sealed or closed.
        """
        return chained_tail(self.history, lambda: self.hot_start, self._wal_tail, from_offset, max_bytes)

    async def _wal_tail(self, from_offset: int, max_bytes: int):
        if self.sealed_offset is not None or self._closed:
            return
        try:
            async for view in self.wal.tail_frames(from_offset, max_bytes):
                yield view
        except WalClosedError:
            return

    # ------------------------------------------------------------------ seal and close

    async def make_read_only(self, reason: str) -> int:
        """Stop writing and give the WAL directory up (its lock, its writer) but go on serving
        every offset stored here: the files stay mapped and those offsets never change, even when
        another broker opens the directory and continues the log (shared_fs).  No export, no
        retention, no seal: this broker may not own the topic any more.  Appends are refused with
        ``reason``.  The storage factory forgets this storage, so the next ``open_topic`` opens
        the WAL anew (``BrokerService.reopen_for_writing``).  Returns the last offset stored."""
        async with self._seal_lock:
            if self._closed:
                raise StorageError(f"topic {self.topic} storage is closed", retriable=True)
            if self.read_only_reason is not None:
                return self.wal.next_offset - 1
            self._writable = False
            self.read_only_reason = reason
            await self._stop_background()
            try:
                last = await asyncio.to_thread(self.wal.stop_writing)
            finally:
                self._notify_closed()
            log.warning("%s: read-only from offset %d on (WAL released): %s", self.topic, last + 1, reason)
            return last

    async def seal(self) -> int:
        """Stop writes, flush, export the tail, write StorageStateSealed, clear the local WAL.

        Returns the last committed offset (-1 for a topic that never held a message).
        If the export fails the topic stays writable here and the error is raised.
        """
        async with self._seal_lock:
            if self.sealed_offset is not None:
                return self.sealed_offset
            if self._closed:
                raise StorageError(f"topic {self.topic} storage is closed", retriable=False)
            if self.read_only_reason is not None:
                raise StorageError(
                    f"topic {self.topic} cannot be sealed: it is read-only on this broker ({self.read_only_reason})",
                    retriable=True,
                )
            self._writable = False
            restart = self._task is not None
            await self._stop_background()
            wal = self.wal
            last = wal.next_offset - 1
            try:
                if wal.next_offset > wal.first_offset:
                    await wal.wait_durable(last)
                await self.exporter.export_through(last)
                movetrace.step(self.topic, "source.exported")
                if self.catalog.end_offset < last and last >= 0:
                    raise StorageError(
                        f"{self.topic}: durable history ends at {self.catalog.end_offset}, "
                        f"before the last committed offset {last}"
                    )
            except BaseException:
                self._writable = True
                if restart:
                    self.start()
                raise
            self.sealed_offset = last
            self._closed = True
            await asyncio.to_thread(wal.close)
            await write_sealed_state(
                self.metadata, self.config.metadata_prefix, self.durable_topic, last, self.broker_id
            )
            movetrace.step(self.topic, "source.seal_recorded")
            # Only this topic's own directory (checked again right before the delete).
            await asyncio.to_thread(remove_topic_dir, self.config.local_wal_root, self.wal_dir)
            log.info(
                "%s: sealed at offset %d (durable through %d, broker %s)",
                self.topic,
                last,
                self.catalog.end_offset,
                self.broker_id,
            )
            self._notify_closed()
            return last

    async def close(self, *, export: bool = False, timeout: float = SHUTDOWN_EXPORT_TIMEOUT_S) -> None:
        """Flush and stop background tasks; the topic stays here (no seal).

        ``export`` (a graceful stop of the broker, in ``shared_fs`` / ``object_store`` mode): first
        export every committed offset not yet in durable history, for at most ``timeout``
        seconds; what could not be exported stays in the local WAL (and is exported by the
        next owner of this directory).  Never for a broker that may have lost the topic."""
        async with self._seal_lock:
            if self._closed:
                return
            self._writable = False
            self._closed = True
            await self._stop_background()
            if self.read_only_reason is not None:
                # the directory was given up (make_read_only): only the mappings are left to release
                await asyncio.to_thread(self.wal.close)
                return
            if export and self.config.exports_continuously and self._may_export():
                await self._export_at_close(timeout)
            await asyncio.to_thread(self.wal.close)
            self._notify_closed()

    async def _export_at_close(self, timeout: float) -> None:
        wal = self.wal
        before = self.catalog.end_offset
        last = wal.next_offset - 1
        if last <= before:
            return
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await wal.wait_durable(last)
                await self.exporter.export_through(last)
        except Exception as exc:  # noqa: BLE001 - closing goes on; the WAL keeps the offsets
            log.warning(
                "%s: export at shutdown stopped after %.1fs (%s); durable history ends at %d, offsets "
                "%d..%d stay in the local WAL only",
                self.topic,
                time.monotonic() - started,
                exc or type(exc).__name__,
                self.catalog.end_offset,
                self.catalog.end_offset + 1,
                last,
            )
            return
        log.info(
            "%s: exported offsets %d..%d at shutdown (%.2fs); durable history ends at %d",
            self.topic,
            before + 1,
            last,
            time.monotonic() - started,
            self.catalog.end_offset,
        )

    def _notify_closed(self) -> None:
        callback, self.on_closed = self.on_closed, None
        if callback is not None:
            callback(self)

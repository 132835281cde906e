"""Rotation off the writer's thread: spare files made ahead, old files finished behind.

The writer's part of a rotation is a pointer switch (:meth:`FileKeeper.next_active`
and :meth:`FileKeeper.retire`): the next file was created, preallocated and made
durable in the directory ahead of need in the background (``danube-wal-files``: a
few threads shared by every log of the process, see ``danube/wal/workers.py``), so
taking it only writes its 64-byte header into its mapping.  Everything that
calls the disk happens there, GIL released: the old file's trim to its
last frame and fdatasync, the checkpoint (two fsyncs), the rotation listeners,
deleting discarded files, and the next spare.

Crash safety, step by step (recovery in ``danube/wal/recovery.py``):

* a spare made but never used has an all-zero header: recovery deletes it;
* switched to the spare, header not yet on disk: nothing in the new file was
  reported durable (an fdatasync of the file would have written the header), so
  recovery deleting the file loses nothing promised; the old file is the last one
  again and continues;
* old file not yet trimmed, or trimmed but not in the checkpoint: recovery scans it
  (the checkpoint only vouches for files listed with the size on disk) and trims it;
* checkpoint written: the old file is trusted on the next open.

Durability: until its trim + fdatasync ran here, a rotated file is in
``unsynced``; the syncer fdatasyncs those (and, after a fallback creation on the
writer's thread, the directory) before the active file, so an offset reported
durable is on disk whichever file holds it.  The keeper trims under the syncer's
lock, so the two never race on a file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Callable

from danube import _native
from danube.errors import WalError
from danube.wal.checkpoint import Checkpoint, write_checkpoint
from danube.wal.files import WalFileInfo, fsync_directory, segment_file_name
from danube.wal.options import SyncPolicy, WalOptions
from danube.wal.workers import WorkerPool

_walfile = _native.load("walfile")
log = logging.getLogger("danube.wal")

# Write faults taken ahead on a spare, off the writer's thread.  sync=never: the writer's
# own prefault window (the populated pages are dirty zeros, which no sync writes out).
# Sync modes: just the first pages (the header's page and the first frames); a sync
# writes populated zero pages out, so no more than that.
POPULATE_NEVER = 4 << 20
POPULATE_SYNCED = 64 << 10

# The threads that do every log's file work (one job per log at a time; a log's jobs in order).
FILE_WORKERS = WorkerPool(2, "danube-wal-files")


def grow_reservation(seg, need: int) -> bool:
    """Reserve disk (``posix_fallocate``) for ``need`` more bytes at the write position of
    ``seg``, doubling its reservation (a few microseconds on ext4), when the file's size allows;
    False when it does not (rotate instead).

    Why in steps (docs/wal.md "Disk"): a file reserved whole up front costs its full
    size on disk the moment a topic exists.  The file is created at its full size but sparse
    (``ftruncate``: a hole reads as zeros, where recovery's scan stops) and only its reserved
    part is allocated; stores through the mapping never go beyond the reservation, so a full
    disk is an error from ``posix_fallocate`` here, never a SIGBUS in the writer."""
    want = seg.write_pos + need
    if want > seg.map_size:
        return False
    seg.reserve(min(seg.map_size, max(2 * seg.capacity, want)))
    return True


def file_info(seg) -> WalFileInfo:
    return WalFileInfo(seg.path, seg.seq, seg.first_offset, seg.last_offset, seg.write_pos)


class FileKeeper:
    """Makes the next file ahead of need and finishes rotated files on its own thread."""

    def __init__(
        self, directory: str, options: WalOptions, checkpoint: Checkpoint, *, durable: bool, sync_lock: threading.Lock
    ) -> None:
        self.directory = directory
        self.options = options
        self.checkpoint = checkpoint
        self.durable = durable  # fsync anything at all (every policy but never)
        self.sync_lock = sync_lock  # the syncer's: trims and syncs never overlap
        self.unsynced: list = []  # rotated files whose frames may not be fdatasync'd yet
        self.dir_dirty = False  # a file was created without a directory fsync
        self.listeners: list[Callable[[WalFileInfo], None]] = []
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._ckpt_lock = threading.Lock()  # checkpoint edits + writes, in order
        self._to_finish: deque = deque()
        self._to_delete: list = []
        self._spare = None
        self._next_seq = checkpoint.next_seq
        self._last_used_seq = checkpoint.next_seq - 1
        self._retired = 0  # rotated files handed over
        self._finished = 0  # ... trimmed, synced and in the checkpoint
        self._notified = 0  # ... and their listeners called
        self._closing = False
        self._spare_failed = False  # stop retrying until the next rotation
        # A spare only for a log that writes: made after its first rotation, not at open (an idle
        # or small topic holds one file, so many idle topics cost little disk).
        self._want_spare = False
        self._spare_reserve = options.initial_file_bytes  # disk reserved for the next spare
        self.spares_used = 0  # rotations that found their file ready
        self.fallback_creates = 0  # rotations that had to create it on the writer's thread
        self._scheduled = False  # a job of this keeper is queued or running
        self._worker: threading.Thread | None = None  # the thread running it

    # ------------------------------------------------------------ the writer's side (cheap)

    def next_active(self, first_offset: int, min_bytes: int, reserve: int = 0):
        """The file to continue the log in at ``first_offset``: the spare when it is ready and
        big enough (no system call), else one created here (rare: the keeper is behind, or a
        record is bigger than ``max_file_bytes``; and a log's first rotation, which has no spare
        yet) reserving ``reserve`` bytes (what the file rotated away from came to)."""
        need = _walfile.FILE_HEADER_SIZE + min_bytes
        with self._cond:
            spare, self._spare = self._spare, None
            if spare is not None and spare.map_size >= need:
                self._last_used_seq = spare.seq
                self._kick()  # make the next one
            else:
                if spare is not None:
                    self._to_delete.append(spare)
                spare = None
                self._spare_failed = False
                seq = self._next_seq
                self._next_seq += 1
                self._last_used_seq = seq
                self._kick()
        if spare is not None:
            spare.activate(first_offset)
            if spare.capacity < need:  # a record bigger than the spare's reservation
                spare.reserve(need)
            self.spares_used += 1
            return spare
        self.fallback_creates += 1
        path = os.path.join(self.directory, segment_file_name(seq))
        seg = _walfile.SegmentFile.create(
            path,
            seq,
            first_offset,
            max(self.options.max_file_bytes, need),
            index_every=self.options.index_every_bytes,
            reserve=max(self.options.initial_file_bytes, need, min(reserve, self.options.max_file_bytes)),
            read_around=self.options.sync is not SyncPolicy.NEVER,
        )
        if self.durable:
            self.dir_dirty = True  # the syncer fsyncs the directory before anything in it counts as durable
        return seg

    def retire(self, old) -> None:
        """``old`` stops being written (call before the writer switches away from it)."""
        if self.durable:
            self.unsynced.append(old)
        with self._cond:
            # the next spare reserves what this file came to need: a hot log's files are
            # reserved whole (as every file was before reservations grew in steps), a log rotated by
            # age keeps small files
            self._spare_reserve = min(max(old.capacity, self.options.initial_file_bytes), self.options.max_file_bytes)
            self._want_spare = True  # the log writes: keep a spare ahead from now on
            self._retired += 1
            self._to_finish.append(old)
            self._kick()

    def discard(self, seg) -> None:
        """Delete ``seg`` (an empty file the log no longer uses) in the background."""
        with self._cond:
            self._to_delete.append(seg)
            self._kick()

    # ------------------------------------------------------------ waiting for the thread

    def wait_finished(self, timeout: float | None = None, *, notified: bool = True) -> bool:
        """Block until every file retired so far is finished (and, with ``notified``, its
        listeners called); False on timeout.  Raises the keeper's I/O error, if any."""
        if threading.current_thread() is self._worker:
            return True  # a listener waiting for itself
        with self._cond:
            target = self._retired
            ok = self._cond.wait_for(
                lambda: self.error is not None or (self._notified if notified else self._finished) >= target, timeout
            )
        if self.error is not None:
            raise WalError(f"WAL {self.directory}: background file work failed: {self.error}") from self.error
        return ok

    # ------------------------------------------------------------ the checkpoint

    def update_checkpoint(self, edit: Callable[[Checkpoint], None] | None = None) -> None:
        """Apply ``edit`` to the checkpoint and write it (serialised with the keeper's writes)."""
        with self._ckpt_lock:
            if edit is not None:
                edit(self.checkpoint)
            self.checkpoint.next_seq = max(self.checkpoint.next_seq, self._next_seq)
            write_checkpoint(self.directory, self.checkpoint)

    # ------------------------------------------------------------ the thread

    def _has_work(self) -> bool:
        return bool(
            self._to_finish
            or self._to_delete
            or (self._spare is None and self._want_spare and not self._spare_failed and not self._closing)
        )

    def _kick(self) -> None:
        """Queue this keeper's job if there is work and none is queued (``_cond`` held)."""
        if not self._scheduled and self.error is None and self._has_work():
            self._scheduled = True
            FILE_WORKERS.submit(self._run)

    def _run(self) -> None:
        self._worker = threading.current_thread()
        try:
            self._work()
        finally:
            self._worker = None
            with self._cond:
                self._scheduled = False
                self._kick()  # work that came after the job's last look
                self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._has_work() or self.error is not None:
                    return
                batch = list(self._to_finish)
                self._to_finish.clear()
                doomed, self._to_delete = self._to_delete, []
                want_spare = self._spare is None and self._want_spare and not self._spare_failed and not self._closing
            if want_spare:
                # first: the next rotation needs it, while the old file's durability does not
                # wait for this job (the syncer syncs unsynced files itself)
                try:
                    self._make_spare()
                except Exception:  # noqa: BLE001 - rotations fall back to creating files themselves
                    log.exception("WAL %s: creating the next file ahead of need failed", self.directory)
                    with self._cond:
                        self._spare_failed = True
            try:
                if batch:
                    self._finish(batch)
                for seg in doomed:
                    seg.delete()
            except BaseException as exc:  # noqa: BLE001 - reported to waiters and the log, not lost
                log.exception("WAL %s: finishing rotated files failed", self.directory)
                with self._cond:
                    self.error = exc
                    self._to_finish.extendleft(reversed(batch))  # close() retries them
                    self._cond.notify_all()
                return  # unsynced files stay unsynced: the syncer reports the error to durability waiters

    def _finish(self, batch: list) -> None:
        for seg in batch:
            with self.sync_lock:
                seg.trim(sync=self.durable)  # the file now ends at its last frame, on disk
                if seg in self.unsynced:
                    self.unsynced.remove(seg)
            seg.seal(sync=False)  # read-only mapping of exactly the frames

        def add(ckpt: Checkpoint) -> None:
            for seg in batch:
                ckpt.rotated[seg.seq] = (seg.first_offset, seg.last_offset, seg.write_pos)

        self.update_checkpoint(add)
        with self._cond:
            self._finished += len(batch)
            self._cond.notify_all()
        for seg in batch:
            info = file_info(seg)
            for callback in list(self.listeners):
                try:
                    callback(info)
                except Exception:  # noqa: BLE001 - one listener must not stop the others or the WAL
                    log.exception("WAL %s: rotation listener %r failed", self.directory, callback)
        with self._cond:
            self._notified += len(batch)
            self._cond.notify_all()

    def _make_spare(self) -> None:
        with self._cond:
            seq = self._next_seq
            self._next_seq += 1
        path = os.path.join(self.directory, segment_file_name(seq))
        seg = _walfile.SegmentFile.create_spare(
            path,
            seq,
            self.options.max_file_bytes,
            index_every=self.options.index_every_bytes,
            reserve=self._spare_reserve,
        )
        try:
            if self.durable:
                seg.sync()  # the preallocation's metadata, not on the first sync of the active file
                fsync_directory(self.directory)  # the name survives a machine crash before it is used
            # after the syncs (writeback write-protects the pages it cleans again)
            seg.populate(POPULATE_SYNCED if self.durable else POPULATE_NEVER)
        except BaseException:
            seg.delete()
            raise
        with self._cond:
            if self._spare is None and seq > self._last_used_seq and not self._closing:
                self._spare, seg = seg, None
        if seg is not None:  # the writer created a newer file meanwhile: this one would sort before it
            seg.delete()

    def close(self) -> None:
        """Finish what was retired, stop the thread, delete the spare (a spare left by a crash is
        deleted by recovery instead)."""
        with self._cond:
            self._closing = True
            self._kick()
            if self._worker is not threading.current_thread():
                self._cond.wait_for(lambda: not self._scheduled)
        with self._cond:
            spare, self._spare = self._spare, None
            doomed, self._to_delete = self._to_delete, []
            leftover = list(self._to_finish)
            self._to_finish.clear()
        if spare is not None:
            spare.delete()
        for seg in doomed:
            seg.delete()
        if leftover:  # the thread stopped on an error: finish them here, errors to the caller
            self._finish(leftover)

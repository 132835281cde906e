"""The WAL's rotation and pruning: switching the active file for a new one, the rotated files
and their listeners, and deleting rotated files below an offset.

A base class of :class:`~danube.wal.log.Wal` (``wal/log.py``), which holds the state; its
methods are moved here whole.  The file work behind a rotation runs in ``wal/rotation.py``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from danube.wal.checkpoint import Checkpoint
from danube.wal.files import WalFileInfo, fsync_directory
from danube.wal.rotation import file_info as _info
from danube.wal.rotation import grow_reservation

if TYPE_CHECKING:
    from danube.wal.log_suspend import _Dormant
    from danube.wal.rotation import FileKeeper


class WalRotation:
    if TYPE_CHECKING:  # what this part uses of the rest of Wal
        _admin_lock: threading.RLock
        _closed: bool
        _closing: bool
        _dormant: _Dormant | None
        _keeper: FileKeeper
        _listeners: list[Callable[[WalFileInfo], None]]
        _rotated: list
        _segments: list
        _seg_firsts: list[int]
        _writer: Any
        path: str

        def _check_open(self) -> None: ...

        def _resume_if_dormant(self) -> None: ...

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

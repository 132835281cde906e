"""A WAL's footprint in the OS page cache: the newest bytes stay, older synced bytes are dropped.

Why: on a virtual machine whose host takes back the memory its guest leaves free (a memory
balloon with free page reporting, as on Firecracker and many cloud VMs), the first write into a
page the host took back costs a fault in the host.  A log that keeps all it wrote in the page
cache makes every new write land in such pages, many times slower (measurements:
docs/benchmarks.md, "The page cache behind the WAL").  Dropping the pages that lie more than a
window behind the head returns them to the kernel's free lists, where the next writes find them still backed.

Readers inside the window, and so everything the WAL's frame cache serves, are unaffected; a
reader further behind faults its pages back in from the file, as after a restart.  The trim runs
after each sync, on the thread that synced, so what it drops is synced: ``POSIX_FADV_DONTNEED``
skips dirty pages, and nothing is lost either way (see ``SegmentFile.drop_cache``).
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

log = logging.getLogger("danube.wal")

MiB = 1024 * 1024


def drop_step(keep_bytes: int) -> int:
    """How far the head moves between two trims: an eighth of the window, 1 to 8 MiB."""
    return max(MiB, min(8 * MiB, keep_bytes // 8))


class PageCacheWindow:
    """Keeps the newest ``keep_bytes`` of a log's files in the page cache; drops the rest.

    ``trim`` is called with the segments oldest first, the active one last, after each sync, by
    whichever thread synced (the WAL's sync thread, or a writer syncing inline); a call that
    finds another one running returns at once."""

    def __init__(self, keep_bytes: int) -> None:
        if keep_bytes < 0:
            raise ValueError("keep_bytes must be >= 0")
        self.keep_bytes = keep_bytes
        self.step_bytes = drop_step(keep_bytes)
        self.dropped_bytes = 0  # bytes dropped so far (stats, tests)
        self.failed: OSError | None = None  # trimming stopped after this error
        self._dropped_to: dict[int, int] = {}  # segment seq -> file position dropped up to
        self._last: tuple[int, int] | None = None  # (seq, write_pos) of the active file at the last trim
        # the next trim is due once the active file is another one or its head reaches this
        # position (the caller's test before each call: most syncs move the head less than a step)
        self.due_seq = -1
        self.due_pos = 0
        self._busy = threading.Lock()

    def due(self, active) -> bool:
        """Whether :meth:`trim` may drop anything with ``active`` the active file (callers
        inline it: it is asked after every sync)."""
        return active.seq != self.due_seq or active.write_pos >= self.due_pos

    def trim(self, segments: Sequence) -> int:
        """Drop what lies more than the window behind the head; return the bytes dropped now."""
        if self.failed is not None or not segments:
            return 0
        active = segments[-1]
        last = self._last
        if last is not None and last[0] == active.seq and active.write_pos - last[1] < self.step_bytes:
            return 0
        if not self._busy.acquire(blocking=False):
            return 0
        try:
            self._last = (active.seq, active.write_pos)
            self.due_seq, self.due_pos = active.seq, active.write_pos + self.step_bytes
            return self._trim(segments)
        except OSError as exc:  # the kernel or file system refuses: keep serving, stop trimming
            self.failed = exc
            log.warning(
                "WAL page-cache trimming stopped (the log keeps working; the OS now decides what stays cached): %s", exc
            )
            return 0
        finally:
            self._busy.release()

    def _trim(self, segments: Sequence) -> int:
        active = segments[-1]
        keep = self.keep_bytes
        dropped_to = self._dropped_to
        dropped = 0
        for seg in reversed(segments):
            size = seg.write_pos
            if keep >= size:
                keep -= size
                continue
            upto, keep = size - keep, 0
            done = dropped_to.get(seg.seq, 0)
            if done >= upto:
                if seg is active:
                    continue
                break  # a rotated file dropped whole: every older one was dropped before it
            # the active file once the head has moved a step; a rotated one up to the window's edge
            if upto - done >= self.step_bytes or seg is not active:
                dropped += seg.drop_cache(done, upto)
                dropped_to[seg.seq] = upto
        if len(dropped_to) > len(segments) + 16:  # forget pruned files
            present = {s.seq for s in segments}
            self._dropped_to = {seq: pos for seq, pos in dropped_to.items() if seq in present}
        self.dropped_bytes += dropped
        return dropped

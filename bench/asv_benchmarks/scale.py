"""Per-topic costs of many WALs in one process (asv): disk, descriptors and memory of a
small log and of an idle (suspended) one, and the time to reopen an idle log on its next use.

Each ``track_*`` opens ``TOPICS`` logs (sync=interval, one 100 B record each, as a broker's
reliable topics) in a temp directory and reports one figure per log; the whole-broker version
with restart times is ``bench/scale.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from danube.wal import Wal

TOPICS = 200


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _disk(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class PerTopic:
    """Costs per small reliable log, open and then idle (suspended)."""

    timeout = 120
    number = 1
    repeat = 1

    def setup(self):
        self.dir = tempfile.mkdtemp(prefix="danube-asv-scale-")
        self.rss0, self.fds0 = _rss(), _fds()
        self.wals = []
        for i in range(TOPICS):
            wal = Wal.open(os.path.join(self.dir, f"t{i}"), sync="interval")
            wal.append(b"x" * 100)
            self.wals.append(wal)
        for wal in self.wals:
            wal.sync()
        self.open_disk, self.open_fds = _disk(self.dir), _fds()
        for wal in self.wals:
            wal.suspend()
        for wal in self.wals:
            if wal._dormant is not None and wal._dormant.released is not None:
                wal._dormant.released.wait(10)
        self.idle_disk, self.idle_fds, self.idle_rss = _disk(self.dir), _fds(), _rss()

    def teardown(self):
        for wal in self.wals:
            wal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def track_disk_bytes_open(self):
        return self.open_disk / TOPICS

    track_disk_bytes_open.unit = "bytes"

    def track_disk_bytes_idle(self):
        return self.idle_disk / TOPICS

    track_disk_bytes_idle.unit = "bytes"

    def track_descriptors_open(self):
        return (self.open_fds - self.fds0) / TOPICS

    track_descriptors_open.unit = "descriptors"

    def track_descriptors_idle(self):
        return (self.idle_fds - self.fds0) / TOPICS

    track_descriptors_idle.unit = "descriptors"

    def track_rss_bytes_idle(self):
        return (self.idle_rss - self.rss0) / TOPICS

    track_rss_bytes_idle.unit = "bytes"

    def track_reopen_ms(self):
        """Mean time of the first append to an idle log (its reopen included)."""
        t0 = time.perf_counter()
        for wal in self.wals:
            wal.append(b"y")
        return (time.perf_counter() - t0) * 1000 / TOPICS

    track_reopen_ms.unit = "ms"

"""Local retention: prune rotated WAL files past the size or age limit, never before they are durable.

A rotated file is a pruning candidate when it is older than
``local_retention.time_minutes`` or when the local WAL is over
``local_retention.size_mb`` (oldest files go first).  A candidate is deleted
only once a durable segment covers its last offset.  In ``local`` mode nothing
is exported continuously, so candidates are exported first (to the local
durable directory) and then pruned; in the other modes the background exporter
covers them and retention waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from danube.storage.config import LocalRetention
from danube.storage.exporter import SegmentExporter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionDecision:
    wanted_through: int  # last offset the limits want gone (-1: nothing)
    pruned_through: int  # last offset actually pruned (-1: nothing)
    waiting_for_export: bool


def _stat_files(files) -> list[tuple[Any, float, int]]:
    out = []
    for f in files:
        try:
            st = os.stat(f.path)
        except FileNotFoundError:
            continue
        out.append((f, st.st_mtime, st.st_size))
    return out


def choose_prune_through(stats: list[tuple[Any, float, int]], limits: LocalRetention, now: float) -> int:
    """Last offset of the longest oldest-first run of rotated files the limits want gone (-1: none)."""
    stats = sorted(stats, key=lambda s: s[0].first_offset)
    total = sum(size for _f, _mtime, size in stats)
    through = -1
    for f, mtime, size in stats:
        too_old = now - mtime > limits.max_age_s
        too_big = total > limits.max_bytes
        if not (too_old or too_big):
            break
        through = f.last_offset
        total -= size
    return through


class RetentionEnforcer:
    def __init__(
        self, topic: str, wal: Any, exporter: SegmentExporter, limits: LocalRetention, *, export_before_prune: bool
    ) -> None:
        self.topic = topic
        self.wal = wal
        self.exporter = exporter
        self.limits = limits
        self.export_before_prune = export_before_prune
        self.pruned_through = -1

    async def enforce(self, now: float | None = None) -> RetentionDecision:
        files = list(self.wal.rotated_files())
        if not files:
            return RetentionDecision(-1, -1, False)
        stats = await asyncio.to_thread(_stat_files, files)
        wanted = choose_prune_through(stats, self.limits, time.time() if now is None else now)
        if wanted < 0:
            return RetentionDecision(-1, -1, False)
        if wanted > self.exporter.durable_end and self.export_before_prune:
            await self.exporter.export_through(wanted)
        covered = min(wanted, self.exporter.durable_end)
        # Only whole files go, so prune through the last file fully covered by durable segments.
        through = -1
        for f, _mtime, _size in sorted(stats, key=lambda s: s[0].first_offset):
            if f.last_offset <= covered:
                through = f.last_offset
            else:
                break
        waiting = through < wanted
        if waiting:
            log.info(
                "%s: retention wants offsets through %d gone; durable segments cover %d, waiting for export",
                self.topic,
                wanted,
                self.exporter.durable_end,
            )
        if through >= 0:
            await self._prune(through)
            self.pruned_through = through
        return RetentionDecision(wanted, through, waiting)

    async def _prune(self, through: int) -> None:
        # Deletes files and fsyncs the directory: a worker thread (the WAL serialises pruning itself).
        await asyncio.to_thread(self.wal.prune_through, through)

"""Export of WAL history as immutable durable segments.

Order of every export (each step only after the previous one completed)::

    1. data object   <ns>/<topic>/segments/<start>-<end>.dnseg      (atomic put)
    2. sidecar       <ns>/<topic>/segments/<start>-<end>.dnseg.json
    3. metadata      keys.storage_segment(prefix, topic, start)
    4. metadata      keys.storage_segments_cur(prefix, topic)

Metadata is the catalog: the exporter resumes from the end of the last
descriptor there, so an upload interrupted before step 3 is simply redone (the
same range gives the same object names), and a restarted exporter neither
skips nor duplicates a range.  ``reconcile`` removes objects the catalog does
not know (leftovers of an interrupted upload), so listings of the backend
(Spark) never see two segments covering one offset.

What gets exported: each rotated (closed) WAL file's range becomes one segment
(its safe prefix: only whole, checksummed frames, as served by the WAL), and
``export_committed`` also exports the committed tail of the active file (every
offset the sync policy covers, i.e. every acknowledged one) as a segment; the
next export starts right after it, so segments never overlap and never leave a
gap, whatever the file boundaries.  Seal and a graceful close export the
remaining tail up to the last committed offset.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from danube import message_codec
from danube.errors import CorruptFrameError, StorageError
from danube.storage.backends import DurableBackend
from danube.storage.catalog import SegmentCatalog
from danube.storage.segment import DATA_SUFFIX, DESCRIPTOR_SUFFIX, SegmentDescriptor, topic_prefix, write_segment

log = logging.getLogger(__name__)

_READ_STEP = 8 * 1024 * 1024


def _value(obj: Any, name: str) -> Any:
    attr = getattr(obj, name)
    return attr() if callable(attr) else attr


class SegmentExporter:
    """Exports one topic's WAL history; at most one export runs at a time."""

    def __init__(
        self,
        topic: str,
        wal: Any,
        backend: DurableBackend,
        catalog: SegmentCatalog,
        *,
        max_segment_bytes: int = 64 * 1024 * 1024,
        on_exported: Callable[[SegmentDescriptor], None] | None = None,
    ) -> None:
        self.topic = topic
        self.wal = wal
        self.backend = backend
        self.catalog = catalog
        self.max_segment_bytes = max(int(max_segment_bytes), 1)
        self.on_exported = on_exported
        self._lock = asyncio.Lock()
        self.exported_segments = 0
        self.exported_bytes = 0

    @property
    def durable_end(self) -> int:
        """Last offset covered by a published segment (-1: none)."""
        return self.catalog.end_offset

    # ------------------------------------------------------------------ reconciliation

    async def reconcile(self) -> int:
        """Delete objects under the topic's prefix that the catalog does not list; return how many."""
        known = self.catalog.segment_ids()
        infos = await asyncio.to_thread(self.backend.list, topic_prefix(self.topic))
        stale = []
        for info in infos:
            name = info.key.rsplit("/", 1)[-1]
            if name.endswith(DESCRIPTOR_SUFFIX):
                stem = name[: -len(DESCRIPTOR_SUFFIX)]
            elif name.endswith(DATA_SUFFIX):
                stem = name[: -len(DATA_SUFFIX)]
            else:
                continue
            if stem not in known:
                stale.append(info.key)
        # Sidecars first: a data object without its sidecar is already invisible to readers.
        stale.sort(key=lambda k: not k.endswith(DESCRIPTOR_SUFFIX))
        for key in stale:
            log.warning("%s: removing %s left by an interrupted export", self.topic, key)
            await asyncio.to_thread(self.backend.delete, key)
        return len(stale)

    # ------------------------------------------------------------------ export

    def _rotated_ends(self) -> list[int]:
        files = sorted(self.wal.rotated_files(), key=lambda f: f.first_offset)
        return [f.last_offset for f in files if f.last_offset > self.durable_end and f.last_offset >= f.first_offset]

    async def export_rotated(self) -> list[SegmentDescriptor]:
        """Export every rotated WAL file not yet covered by durable segments."""
        async with self._lock:
            out: list[SegmentDescriptor] = []
            for end in self._rotated_ends():
                out += await self._export_until(end)
            return out

    def committed_offset(self) -> int:
        """Highest offset a producer may have been acknowledged for (covered by the sync policy)."""
        wal = self.wal
        return min(_value(wal, "durable_offset"), _value(wal, "next_offset") - 1)

    def pending(self) -> bool:
        """Committed offsets not yet in durable history."""
        return self.committed_offset() > self.durable_end

    async def export_committed(self) -> list[SegmentDescriptor]:
        """Export everything committed: rotated files, then the active file's committed tail."""
        return await self.export_through(self.committed_offset())

    async def export_through(self, last_offset: int) -> list[SegmentDescriptor]:
        """Export everything up to ``last_offset`` (inclusive): rotated files first, then the tail."""
        async with self._lock:
            out: list[SegmentDescriptor] = []
            for end in self._rotated_ends():
                if end <= last_offset:
                    out += await self._export_until(end)
            if last_offset > self.durable_end:
                out += await self._export_until(last_offset)
            return out

    async def _export_until(self, end: int) -> list[SegmentDescriptor]:
        out = []
        while self.durable_end < end:
            start = self.durable_end + 1
            wal_first = _value(self.wal, "first_offset")
            if start < wal_first:
                if len(self.catalog):
                    raise StorageError(
                        f"{self.topic}: offsets {start}..{wal_first - 1} are neither durable nor in the local "
                        f"WAL; refusing to export with a gap",
                        retriable=False,
                    )
                start = wal_first  # an empty catalog starts at the WAL's first offset
            if start > end:
                break
            # The WAL serves concurrent readers on any thread: read and validate off the event loop.
            data, last = await asyncio.to_thread(self._collect, start, end)
            desc = await asyncio.to_thread(write_segment, self.backend, self.topic, data)
            if desc.start_offset != start or desc.end_offset != last:
                raise StorageError(
                    f"{self.topic}: exported segment {desc.segment_id} does not match the "
                    f"range {start}..{last} read from the WAL",
                    retriable=False,
                )
            await self.catalog.publish(desc)
            self.exported_segments += 1
            self.exported_bytes += desc.size
            log.debug("%s: exported segment %s (%d bytes)", self.topic, desc.segment_id, desc.size)
            if self.on_exported is not None:
                self.on_exported(desc)
            out.append(desc)
        return out

    def _collect(self, start: int, end: int) -> tuple[bytes, int]:
        """Frames ``start``.. (at most ``end``, about ``max_segment_bytes``) read from the WAL, checked."""
        parts: list[bytes] = []
        size = 0
        pos = start
        while pos <= end and size < self.max_segment_bytes:
            chunk = self.wal.read_frames(pos, min(self.max_segment_bytes - size, _READ_STEP))
            if not len(chunk):
                break
            try:
                count, first, last = message_codec.validate(chunk, pos, True)
            except CorruptFrameError as exc:
                raise StorageError(
                    f"{self.topic}: WAL frames at offset {pos} failed validation before export: {exc}", retriable=False
                ) from exc
            if last > end:
                chunk = memoryview(chunk)[: message_codec.find_offset(chunk, end + 1)]
                last = end
            parts.append(bytes(chunk))
            size += len(chunk)
            pos = last + 1
        if pos == start:
            raise StorageError(
                f"{self.topic}: the WAL returned no frames at offset {start} (expected up to {end})", retriable=True
            )
        return b"".join(parts), pos - 1

"""The durable-history catalog of one topic: SegmentDescriptors in metadata plus ``segments/cur``.

Metadata is the authority on which segments exist (objects in the backend
without a metadata descriptor are leftovers of an interrupted upload).  A
descriptor is written only after its data object and sidecar are complete, and
``segments/cur`` only after the descriptor, so a crash between any two steps
leaves either nothing or a complete segment behind.
"""

from __future__ import annotations

import bisect
import json
import logging

from danube.errors import StorageError
from danube.metadata import keys
from danube.metadata.store import MetadataStore
from danube.storage.segment import SegmentDescriptor

log = logging.getLogger(__name__)


class SegmentCatalog:
    def __init__(
        self, metadata: MetadataStore, prefix: str, topic: str, segments: list[SegmentDescriptor] | None = None
    ) -> None:
        self.metadata = metadata
        self.prefix = prefix
        self.topic = topic
        self._segments: list[SegmentDescriptor] = []
        self._starts: list[int] = []
        for desc in segments or []:
            self._append(desc)

    # ------------------------------------------------------------------ loading

    @classmethod
    async def load(cls, metadata: MetadataStore, prefix: str, topic: str) -> "SegmentCatalog":
        base = keys.storage_segments(prefix, topic)
        cur_key = keys.storage_segments_cur(prefix, topic)
        descs: list[SegmentDescriptor] = []
        cur_start = None
        for kv in await metadata.get_prefix(base):
            if kv.key == cur_key:
                try:
                    cur_start = int(json.loads(kv.value)["start"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise StorageError(f"unreadable {cur_key}: {kv.value[:80]!r}", retriable=False) from exc
                continue
            try:
                desc = SegmentDescriptor.from_json(kv.value)
            except (ValueError, TypeError) as exc:
                raise StorageError(f"unreadable segment descriptor {kv.key}: {exc}", retriable=False) from exc
            descs.append(desc)
        descs.sort(key=lambda d: d.start_offset)
        catalog = cls(metadata, prefix, topic)
        for desc in descs:
            if catalog._segments and desc.start_offset != catalog.end_offset + 1:
                raise StorageError(
                    f"durable history of {topic} is not contiguous: segment {desc.segment_id} follows "
                    f"{catalog._segments[-1].segment_id}",
                    retriable=False,
                )
            catalog._append(desc)
        last = catalog.last
        if last is not None and cur_start != last.start_offset:
            # A crash between a descriptor write and the cur update: the descriptor is complete, so
            # the pointer catches up (it never moves backwards).
            if cur_start is None or cur_start < last.start_offset:
                log.info(
                    "%s: segments/cur %s behind the last descriptor %s; advancing it", topic, cur_start, last.segment_id
                )
                await catalog._write_cur(last.start_offset)
        return catalog

    # ------------------------------------------------------------------ queries

    def _append(self, desc: SegmentDescriptor) -> None:
        self._segments.append(desc)
        self._starts.append(desc.start_offset)

    @property
    def segments(self) -> list[SegmentDescriptor]:
        return list(self._segments)

    @property
    def last(self) -> SegmentDescriptor | None:
        return self._segments[-1] if self._segments else None

    @property
    def start_offset(self) -> int | None:
        """First offset held durably, or None when the catalog is empty."""
        return self._segments[0].start_offset if self._segments else None

    @property
    def end_offset(self) -> int:
        """Last offset held durably (inclusive); -1 when the catalog is empty."""
        return self._segments[-1].end_offset if self._segments else -1

    def __len__(self) -> int:
        return len(self._segments)

    def find(self, offset: int) -> int:
        """Index of the segment holding ``offset``, or -1."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset > self._segments[i].end_offset:
            return -1
        return i

    def at(self, index: int) -> SegmentDescriptor:
        return self._segments[index]

    def segment_ids(self) -> set[str]:
        return {d.segment_id for d in self._segments}

    # ------------------------------------------------------------------ publishing

    async def publish(self, desc: SegmentDescriptor) -> None:
        """Record an uploaded segment: its descriptor, then ``segments/cur``."""
        if self._segments and desc.start_offset != self.end_offset + 1:
            raise StorageError(
                f"segment {desc.segment_id} of {self.topic} does not follow durable end {self.end_offset}",
                retriable=False,
            )
        key = keys.storage_segment(self.prefix, self.topic, desc.start_offset)
        # Only if no broker published a segment starting here: an owner that lost the topic without
        # knowing it (cut off, lease expired) must not overwrite the history the next owner writes
        # from the same offset (with tail exports every interval, that window is a live one).
        if not await self.metadata.put_if_version(key, desc.to_json(), 0):
            raise StorageError(
                f"{self.topic}: a segment starting at offset {desc.start_offset} was published "
                f"by another broker; this broker no longer owns the topic's history",
                retriable=False,
            )
        self._append(desc)
        await self._write_cur(desc.start_offset)

    async def _write_cur(self, start: int) -> None:
        await self.metadata.put_json(
            keys.storage_segments_cur(self.prefix, self.topic), {"start": keys.offset20(start)}
        )

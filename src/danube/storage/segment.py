"""Durable segments: immutable objects of raw frames plus their SegmentDescriptor.

Layout under a backend (see docs/internals.md)::

    <ns>/<topic>/segments/<start:020d>-<end:020d>.dnseg        raw danube-frames-v1 frames
    <ns>/<topic>/segments/<start:020d>-<end:020d>.dnseg.json   SegmentDescriptor (JSON)

The data object is written before its sidecar, so a sidecar always describes a
complete object; a data object without a sidecar is an unfinished upload and is
ignored by every reader.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import asdict, dataclass, field

import xxhash

from danube import message_codec
from danube.errors import CorruptFrameError, SegmentCorruptError, StorageError
from danube.metadata.keys import split_topic
from danube.storage.backends import DurableBackend

FORMAT = "danube-frames-v1"
DATA_SUFFIX = ".dnseg"
DESCRIPTOR_SUFFIX = ".dnseg.json"
DEFAULT_INDEX_EVERY = 64 * 1024
_PUBLISH_TIME = struct.Struct("<Q")


@dataclass
class SegmentDescriptor:
    segment_id: str
    topic: str
    start_offset: int
    end_offset: int  # inclusive
    record_count: int
    size: int
    etag: str  # xxh3-128 of the content, hex
    created_at: int  # ms since the epoch
    min_publish_time: int
    max_publish_time: int
    offset_index: list[list[int]] = field(default_factory=list)  # [[offset, byte_position], ...]
    completed: bool = True
    format: str = FORMAT

    @property
    def data_key(self) -> str:
        return segment_key(self.topic, self.start_offset, self.end_offset)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> "SegmentDescriptor":
        data = json.loads(raw)
        if data.get("format") != FORMAT:
            raise StorageError(f"segment format {data.get('format')!r} is not {FORMAT}", retriable=False)
        return cls(**data)

    def position_for(self, offset: int) -> tuple[int, int]:
        """``(byte_position, offset_there)`` of the last index entry at or before ``offset``."""
        best = (0, self.start_offset)
        for off, pos in self.offset_index:
            if off > offset:
                break
            best = (pos, off)
        return best


def topic_prefix(topic: str) -> str:
    ns, name = split_topic(topic)
    return f"{ns}/{name}/segments/"


def segment_key(topic: str, start: int, end: int) -> str:
    return f"{topic_prefix(topic)}{start:020d}-{end:020d}{DATA_SUFFIX}"


def content_etag(data) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def describe_frames(
    topic: str, data, *, created_at: int | None = None, index_every: int = DEFAULT_INDEX_EVERY
) -> SegmentDescriptor:
    """Validate ``data`` (consecutive whole frames) and build its descriptor."""
    count, end_pos, first, last, reason, index = message_codec.scan(data, 0, -1, index_every)
    if count == 0 or end_pos != len(data) or reason not in (message_codec.SCAN_END,):
        raise CorruptFrameError(
            "segment content is not a whole run of consecutive frames",
            position=end_pos,
            offset=None,
            expected_crc=None,
            actual_crc=None,
        )
    mv = memoryview(data).cast("B")
    times = [_PUBLISH_TIME.unpack_from(mv, p + message_codec.HEADER_SIZE)[0] for p in message_codec.frame_positions(mv)]
    start, end = first, last
    return SegmentDescriptor(
        segment_id=f"{start:020d}-{end:020d}",
        topic=topic,
        start_offset=start,
        end_offset=end,
        record_count=count,
        size=len(data),
        etag=content_etag(data),
        created_at=int(time.time() * 1000) if created_at is None else created_at,
        min_publish_time=min(times),
        max_publish_time=max(times),
        offset_index=[[o, p] for o, p in index],
    )


def write_segment(backend: DurableBackend, topic: str, data, **kwargs) -> SegmentDescriptor:
    """Upload the frames as a segment: data object first, then the sidecar descriptor."""
    desc = describe_frames(topic, data, **kwargs)
    backend.put(desc.data_key, data)
    backend.put(desc.data_key[: -len(DATA_SUFFIX)] + DESCRIPTOR_SUFFIX, desc.to_json())
    return desc


def list_segments(backend: DurableBackend, prefix: str = "") -> list[SegmentDescriptor]:
    """Descriptors of every complete segment under ``prefix`` (e.g. ``topic_prefix(t)``), by topic and offset."""
    out = []
    for info in backend.list(prefix):
        if info.key.endswith(DESCRIPTOR_SUFFIX):
            out.append(SegmentDescriptor.from_json(backend.get(info.key)))
    return sorted(out, key=lambda d: (d.topic, d.start_offset))


def read_segment(backend: DurableBackend, desc: SegmentDescriptor, *, verify: bool = True) -> bytes:
    """The whole segment; with ``verify`` its etag and every frame checksum are checked."""
    data = backend.get(desc.data_key)
    if verify:
        verify_segment(desc, data)
    return data


def verify_segment(desc: SegmentDescriptor, data) -> None:
    if len(data) != desc.size:
        raise SegmentCorruptError(
            "segment size differs from its descriptor",
            segment_id=desc.segment_id,
            offset=desc.start_offset,
            expected=desc.size,
            actual=len(data),
        )
    actual = content_etag(data)
    if actual != desc.etag:
        offset = None
        try:
            message_codec.validate(data, desc.start_offset, True)
        except CorruptFrameError as exc:
            offset = exc.offset if exc.offset is not None else desc.start_offset
        raise SegmentCorruptError(
            "segment etag mismatch",
            segment_id=desc.segment_id,
            offset=offset if offset is not None else desc.start_offset,
            expected=desc.etag,
            actual=actual,
        )

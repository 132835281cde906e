"""Which bytes of which segments a read needs: options, catalog, pruning, splits.

Everything here runs on the driver and only touches descriptors (sidecars or
the metadata catalog): a segment excluded by the offset or time range is never
opened.  A segment no larger than ``maxPartitionBytes`` becomes one partition
that reads the whole object and checks its etag; a larger one is split on its
offset index into byte ranges, each checked frame by frame (CRC32C, offset
sequence and the index's offsets at both ends), since an etag covers only a
whole object.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
from dataclasses import dataclass, field
from typing import Mapping

from danube.errors import InvalidArgumentError, StorageError
from danube.metadata import keys
from danube.storage import segment as seg
from danube.storage.backends import DurableBackend, backend_from_url

DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
S3_OPTION_NAMES = {
    "endpoint": "endpoint",
    "region": "region",
    "access_key": "access_key",
    "accesskey": "access_key",
    "secret_key": "secret_key",
    "secretkey": "secret_key",
}


# ---------------------------------------------------------------- options


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items() if v is not None}


def parse_time_ms(value: str | int, name: str) -> int:
    """Milliseconds since the epoch from an integer (ms) or an ISO-8601 string (UTC unless it says)."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgumentError(
            f"option {name}={value!r}: expected milliseconds since the epoch "
            "or an ISO-8601 time such as 2024-05-01T12:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    return int(parsed.timestamp() * 1000)


def _int_option(opts: dict, name: str, default: int | None = None, minimum: int | None = None) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"option {name}={value}: must be ≥ {minimum}")
    return value


def _bool_option(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"option {name}={raw!r}: expected true or false")


@dataclass(frozen=True)
class BackendSpec:
    """Enough to rebuild the backend on an executor (picklable; no client objects)."""

    url: str
    s3: tuple = ()

    def open(self) -> DurableBackend:
        return (
            backend_from_url(self.url, **dict(self.s3)) if self.url.startswith("s3://") else backend_from_url(self.url)
        )


def backend_spec(opts: dict) -> BackendSpec:
    url = opts.get("path") or opts.get("root")
    if not url:
        raise InvalidArgumentError(
            "the danube data source needs a path: .load(<durable root or s3://bucket/prefix>) or .option('path', ...)"
        )
    s3 = tuple(sorted((S3_OPTION_NAMES[k], v) for k, v in opts.items() if k in S3_OPTION_NAMES))
    return BackendSpec(str(url), s3)


def _wal_root(value: str | None) -> str | None:
    if not value:
        return None
    path = value[7:] if value.startswith("file://") else value
    if not os.path.isdir(path):
        raise InvalidArgumentError(
            f"option walRoot={value!r}: no directory there (the broker's storage.local_wal_root, e.g. <data_dir>/wal)"
        )
    return os.path.abspath(path)


@dataclass(frozen=True)
class ReadOptions:
    backend: BackendSpec
    topic: str | None
    metadata: str | None
    metadata_prefix: str
    start_offset: int | None
    end_offset: int | None
    start_time_ms: int | None
    end_time_ms: int | None
    max_partition_bytes: int
    batch_bytes: int
    verify: bool
    min_partitions: int | None = None
    pack_segments: bool = False
    wal_root: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ReadOptions":
        opts = _lower(options)
        topic = opts.get("topic") or None
        if topic is not None:
            keys.split_topic(topic)  # validates
        metadata = opts.get("metadata") or None
        if metadata and not topic:
            raise InvalidArgumentError("option metadata (the catalog) needs option topic")
        start_time = parse_time_ms(opts["starttime"], "startTime") if opts.get("starttime") else None
        end_time = parse_time_ms(opts["endtime"], "endTime") if opts.get("endtime") else None
        parsed = cls(
            backend=backend_spec(opts),
            topic=topic,
            metadata=metadata,
            metadata_prefix=opts.get("metadataprefix", ""),
            start_offset=_int_option(opts, "startOffset", None, 0),
            end_offset=_int_option(opts, "endOffset", None, 0),
            start_time_ms=start_time,
            end_time_ms=end_time,
            max_partition_bytes=_int_option(opts, "maxPartitionBytes", DEFAULT_MAX_PARTITION_BYTES, 1),
            batch_bytes=_int_option(opts, "batchBytes", DEFAULT_BATCH_BYTES, 1),
            verify=_bool_option(opts, "verify", True),
            min_partitions=_int_option(opts, "minPartitions", None, 1),
            pack_segments=_bool_option(opts, "packSegments", False),
            wal_root=_wal_root(opts.get("walroot")),
        )
        if (
            parsed.start_offset is not None
            and parsed.end_offset is not None
            and parsed.end_offset < parsed.start_offset
        ):
            raise InvalidArgumentError(f"endOffset {parsed.end_offset} is before startOffset {parsed.start_offset}")
        if start_time is not None and end_time is not None and end_time < start_time:
            raise InvalidArgumentError(f"endTime ({end_time} ms) is before startTime ({start_time} ms)")
        return parsed


# ---------------------------------------------------------------- catalog


def catalog_descriptors(metadata_path: str, prefix: str, topic: str) -> list[seg.SegmentDescriptor]:
    """Segment descriptors of ``topic`` from the metadata store (``keys.storage_segment``)."""
    from danube.metadata.embedded import EmbeddedMetadataStore

    if not os.path.isfile(metadata_path):
        raise InvalidArgumentError(f"option metadata={metadata_path!r}: no metadata database there")

    async def fetch():
        store = EmbeddedMetadataStore(metadata_path)
        try:
            return await store.get_prefix(keys.storage_segments(prefix, topic))
        finally:
            await store.close()

    cur_key = keys.storage_segments_cur(prefix, topic)
    out = []
    for kv in asyncio.run(fetch()):
        if kv.key == cur_key:
            continue
        try:
            out.append(seg.SegmentDescriptor.from_json(kv.value))
        except (ValueError, TypeError) as exc:
            raise StorageError(
                f"metadata key {kv.key} does not hold a SegmentDescriptor: {exc}", retriable=False
            ) from exc
    return sorted(out, key=lambda d: d.start_offset)


def list_descriptors(options: ReadOptions, backend: DurableBackend) -> list[seg.SegmentDescriptor]:
    if options.metadata:
        return catalog_descriptors(options.metadata, options.metadata_prefix, options.topic)
    prefix = seg.topic_prefix(options.topic) if options.topic else ""
    return seg.list_segments(backend, prefix)


# ---------------------------------------------------------------- pruning and splitting


@dataclass
class SegmentRead:
    """One input partition: bytes [byte_start, byte_end) of one segment and the rows wanted from them."""

    topic: str
    segment_id: str
    data_key: str
    etag: str
    size: int
    byte_start: int
    byte_end: int
    first_offset: int  # offset of the frame at byte_start
    last_offset: int  # offset of the last frame before byte_end
    whole: bool  # the whole object: its etag is checked
    row_start_offset: int | None
    row_end_offset: int | None
    start_time_ms: int | None
    end_time_ms: int | None
    batch_bounds: list[tuple[int, int]] = field(default_factory=list)  # (byte_position, offset) chunk starts
    source: str = "durable"  # or "wal": a WAL file under ReadOptions.wal_root (danube.spark.walfiles)


def _index(desc: seg.SegmentDescriptor) -> list[tuple[int, int]]:
    """(offset, position) entries, always starting at the first frame."""
    idx = [(int(o), int(p)) for o, p in desc.offset_index]
    if not idx or idx[0][1] != 0:
        idx.insert(0, (desc.start_offset, 0))
    return idx


def _chunk_bounds(entries: list[tuple[int, int]], byte_end: int, batch_bytes: int) -> list[tuple[int, int]]:
    """Subset of index entries (position, offset) starting decode chunks of about ``batch_bytes``."""
    bounds: list[tuple[int, int]] = []
    for off, pos in entries:
        if pos >= byte_end:
            break
        if not bounds or pos - bounds[-1][0] >= batch_bytes:
            bounds.append((pos, off))
    return bounds


def split_bytes(options: ReadOptions, total_bytes: int) -> int:
    """Largest partition: ``maxPartitionBytes``, lowered so that ``minPartitions`` partitions exist."""
    if options.min_partitions is None or total_bytes <= 0:
        return options.max_partition_bytes
    return max(1, min(options.max_partition_bytes, -(-total_bytes // options.min_partitions)))


def plan(options: ReadOptions, descriptors: list[seg.SegmentDescriptor]) -> list[SegmentRead]:
    """The segment reads of a read, in (topic, offset) order; excluded segments are dropped here.

    A segment larger than :func:`split_bytes` is cut on its offset index into several
    reads; :func:`pack` then groups small reads into input partitions.
    """
    selected: list[tuple[seg.SegmentDescriptor, int, int]] = []
    covered: dict[str, int] = {}  # topic → highest offset already planned (overlapping re-exports)
    for desc in sorted(descriptors, key=lambda d: (d.topic, d.start_offset, -d.end_offset)):
        if options.topic and desc.topic != options.topic:
            continue
        lo = desc.start_offset
        hi = desc.end_offset + 1  # exclusive
        if options.start_offset is not None:
            lo = max(lo, options.start_offset)
        if options.end_offset is not None:
            hi = min(hi, options.end_offset)
        if desc.topic in covered:
            lo = max(lo, covered[desc.topic] + 1)
        if lo >= hi:
            continue
        if options.start_time_ms is not None and desc.max_publish_time < options.start_time_ms:
            continue
        if options.end_time_ms is not None and desc.min_publish_time >= options.end_time_ms:
            continue
        covered[desc.topic] = max(covered.get(desc.topic, -1), hi - 1)
        selected.append((desc, lo, hi))
    limit = split_bytes(options, sum(desc.size for desc, _lo, _hi in selected))
    reads: list[SegmentRead] = []
    for desc, lo, hi in selected:
        row_lo = lo if lo > desc.start_offset else None
        row_hi = hi if hi <= desc.end_offset else None
        common = dict(
            topic=desc.topic,
            segment_id=desc.segment_id,
            data_key=desc.data_key,
            etag=desc.etag,
            size=desc.size,
            row_start_offset=row_lo,
            row_end_offset=row_hi,
            start_time_ms=options.start_time_ms,
            end_time_ms=options.end_time_ms,
        )
        index = _index(desc)
        if desc.size <= limit:
            reads.append(
                SegmentRead(
                    byte_start=0,
                    byte_end=desc.size,
                    first_offset=desc.start_offset,
                    last_offset=desc.end_offset,
                    whole=True,
                    batch_bounds=_chunk_bounds(index, desc.size, options.batch_bytes),
                    **common,
                )
            )
            continue
        # large segment: only the index intervals holding [lo, hi), cut into pieces of about ``limit`` bytes
        start_i = max(i for i, (off, _p) in enumerate(index) if off <= lo)
        end_i = next((i for i, (off, _p) in enumerate(index) if off >= hi), len(index))
        piece: list[tuple[int, int]] = []
        for i in range(start_i, end_i):
            off, pos = index[i]
            if piece and pos - piece[0][1] >= limit:
                reads.append(_piece(piece, index[i], desc, options, common))
                piece = []
            piece.append((off, pos))
        if piece:
            stop = index[end_i] if end_i < len(index) else (desc.end_offset + 1, desc.size)
            reads.append(_piece(piece, stop, desc, options, common))
    return reads


def plan_all(
    options: ReadOptions, backend: DurableBackend, descriptors: list[seg.SegmentDescriptor] | None = None
) -> list[SegmentRead]:
    """Every read of a query: durable segments, then (``walRoot``) the WAL files' offsets after them."""
    if descriptors is None:
        descriptors = list_descriptors(options, backend)
    reads = plan(options, descriptors)
    if options.wal_root:
        from danube.spark.walfiles import plan_wal

        ends: dict[str, int] = {}
        for desc in descriptors:
            ends[desc.topic] = max(ends.get(desc.topic, -1), desc.end_offset)
        reads += plan_wal(options, ends)
    return reads


def pack(options: ReadOptions, reads: list[SegmentRead]) -> list[list[SegmentRead]]:
    """Input partitions: one per segment read by default; with ``packSegments``, consecutive
    reads grouped up to :func:`split_bytes` bytes each.

    Every Spark task has a fixed cost (scheduling, a Python worker round trip, the
    worker's ``gc.collect()`` between tasks: tens of milliseconds), so a topic of many small
    segments reads faster several to a task, as Spark's file sources pack small files.
    It is opt-in so that a partition keeps meaning one segment (or one piece of a large one)
    unless asked otherwise.  ``minPartitions`` keeps enough partitions for the cluster's cores.
    """
    if not options.pack_segments:
        return [[read] for read in reads]
    limit = split_bytes(options, sum(r.byte_end - r.byte_start for r in reads))
    groups: list[list[SegmentRead]] = []
    size = 0
    for read in reads:
        n = read.byte_end - read.byte_start
        if groups and size + n <= limit:
            groups[-1].append(read)
            size += n
        else:
            groups.append([read])
            size = n
    return groups


def _piece(entries, stop, desc, options, common) -> SegmentRead:
    stop_offset, stop_pos = stop
    first_offset, first_pos = entries[0]
    return SegmentRead(
        byte_start=first_pos,
        byte_end=stop_pos,
        first_offset=first_offset,
        last_offset=stop_offset - 1,
        whole=False,
        batch_bounds=_chunk_bounds(entries, stop_pos, options.batch_bytes),
        **common,
    )

"""Executor side of a read: one :class:`~danube.spark.planning.SegmentRead` → Arrow batches.

Kept free of Spark so the benchmark and the tests can run it directly.  Every
failure to trust the bytes is a :class:`~danube.errors.SegmentCorruptError`
naming the segment and the offset where the damage starts.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Iterator

import numpy as np
import pyarrow as pa

from danube.errors import CorruptFrameError, FrameFormatError, SegmentCorruptError, StorageError
from danube.spark.arrow import COLUMNS, filter_batch, frames_to_batch
from danube.spark.planning import SegmentRead
from danube.storage import segment as seg
from danube.storage.backends import DurableBackend, FilesystemBackend


def _check_sequence(read: SegmentRead, offsets: pa.Array, expected_first: int) -> None:
    if len(offsets) == 0:
        raise SegmentCorruptError("segment range holds no frames", segment_id=read.segment_id, offset=expected_first)
    arr = offsets.to_numpy(zero_copy_only=False)
    if arr[0] != expected_first:
        raise SegmentCorruptError(
            "frame offset differs from the segment index",
            segment_id=read.segment_id,
            offset=expected_first,
            expected=expected_first,
            actual=int(arr[0]),
        )
    if len(arr) > 1 and not bool((np.diff(arr) == 1).all()):
        bad = int(np.nonzero(np.diff(arr) != 1)[0][0]) + 1
        raise SegmentCorruptError(
            "frame offsets are not consecutive",
            segment_id=read.segment_id,
            offset=int(arr[bad - 1]) + 1,
            expected=int(arr[bad - 1]) + 1,
            actual=int(arr[bad]),
        )


@contextlib.contextmanager
def _segment_bytes(backend: DurableBackend, read: SegmentRead):
    """The partition's bytes: a read-only mmap slice for files (no copy, ~3x faster than
    read() on large segments), a ranged GET otherwise."""
    if not isinstance(backend, FilesystemBackend):
        yield backend.get(read.data_key, read.byte_start, read.byte_end)
        return
    path = os.path.normpath(os.path.join(backend.root, read.data_key))
    if not path.startswith(backend.root + os.sep):
        raise StorageError(f"key {read.data_key!r} escapes the storage root", retriable=False)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < read.byte_end or size == 0:
                yield backend.get(read.data_key, read.byte_start, read.byte_end)  # short: reported below
                return
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError as exc:
        raise StorageError(f"segment data {read.data_key} not found in {backend.describe()}", retriable=False) from exc
    view = memoryview(mapped)[read.byte_start : read.byte_end]
    try:
        yield view
    finally:
        view.release()
        try:
            mapped.close()
        except BufferError:  # a slice is still referenced (e.g. by a traceback): leave it to the GC
            pass


def read_batches(
    read: SegmentRead, backend: DurableBackend, *, verify: bool = True, columns: tuple[str, ...] = COLUMNS
) -> Iterator[pa.RecordBatch]:
    """Decode one segment read into RecordBatches (one per ~batch_bytes chunk) of ``columns``, rows filtered."""
    with _segment_bytes(backend, read) as data, memoryview(data) as view:
        yield from _decode(read, view, verify, columns)


def read_partition(
    reads: list[SegmentRead],
    backend: DurableBackend,
    *,
    verify: bool = True,
    columns: tuple[str, ...] = COLUMNS,
    wal_backend: DurableBackend | None = None,
) -> Iterator[pa.RecordBatch]:
    """An input partition (see ``planning.pack``): its segment reads one after the other
    (WAL file reads from ``wal_backend``, a directory backend on the WAL root)."""
    for read in reads:
        source = backend
        if read.source != "durable":
            if wal_backend is None:
                raise StorageError(f"{read.segment_id}: a WAL file read without a WAL root", retriable=False)
            source = wal_backend
        yield from read_batches(read, source, verify=verify, columns=columns)


def _decode(read: SegmentRead, data, verify: bool, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    if len(data) != read.byte_end - read.byte_start:
        raise SegmentCorruptError(
            "segment is shorter than its descriptor",
            segment_id=read.segment_id,
            offset=read.first_offset,
            expected=read.byte_end - read.byte_start,
            actual=len(data),
        )
    if read.whole and verify:
        desc = seg.SegmentDescriptor(
            segment_id=read.segment_id,
            topic=read.topic,
            start_offset=read.first_offset,
            end_offset=read.last_offset,
            record_count=read.last_offset - read.first_offset + 1,
            size=read.size,
            etag=read.etag,
            created_at=0,
            min_publish_time=0,
            max_publish_time=0,
        )
        seg.verify_segment(desc, data)
    mv = data
    # offsets are always checked against the index; publish times are needed to filter on them
    time_filtered = read.start_time_ms is not None or read.end_time_ms is not None
    built = columns
    for needed in ("offset", "publish_time") if time_filtered else ("offset",):
        if needed not in built:
            built = built + (needed,)
    bounds = read.batch_bounds or [(read.byte_start, read.first_offset)]
    starts = [pos - read.byte_start for pos, _ in bounds] + [len(data)]
    expected_next = read.first_offset
    for i, (pos, index_offset) in enumerate(bounds):
        if index_offset != expected_next:
            raise SegmentCorruptError(
                "segment index is inconsistent with its frames",
                segment_id=read.segment_id,
                offset=expected_next,
                expected=expected_next,
                actual=index_offset,
            )
        chunk_end_offset = bounds[i + 1][1] if i + 1 < len(bounds) else read.last_offset + 1
        if read.row_end_offset is not None and index_offset >= read.row_end_offset:
            return  # the rest is past the range (a whole segment was still verified by its etag)
        if read.row_start_offset is not None and chunk_end_offset <= read.row_start_offset:
            expected_next = chunk_end_offset  # wholly before the range: skip decoding
            continue
        chunk = mv[starts[i] : starts[i + 1]]
        try:
            batch = frames_to_batch(read.topic, chunk, built)
            chunk.release()
        except (CorruptFrameError, FrameFormatError, pa.ArrowInvalid) as exc:
            offset = getattr(exc, "offset", None)
            raise SegmentCorruptError(
                f"corrupt frame ({exc})",
                segment_id=read.segment_id,
                offset=offset if offset is not None else expected_next,
                expected=getattr(exc, "expected_crc", None),
                actual=getattr(exc, "actual_crc", None),
            ) from exc
        offsets = batch.column("offset")
        _check_sequence(read, offsets, expected_next)
        last = offsets[-1].as_py()
        if last + 1 != chunk_end_offset:
            raise SegmentCorruptError(
                "frames do not match the segment index",
                segment_id=read.segment_id,
                offset=last + 1,
                expected=chunk_end_offset - 1,
                actual=last,
            )
        expected_next = chunk_end_offset
        batch = filter_batch(
            batch,
            start_offset=read.row_start_offset,
            end_offset=read.row_end_offset,
            start_time_ms=read.start_time_ms,
            end_time_ms=read.end_time_ms,
        )
        if built != columns:
            batch = batch.select(list(columns))  # zero-copy
        if batch.num_rows:
            yield batch
    if expected_next != read.last_offset + 1:
        raise SegmentCorruptError(
            "segment ends before its last offset",
            segment_id=read.segment_id,
            offset=expected_next,
            expected=read.last_offset,
            actual=expected_next - 1,
        )

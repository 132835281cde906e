"""Executor side of a read: one :class:`~danube.spark.planning.SegmentRead` → Arrow batches.

Kept free of Spark so the benchmark and the tests can run it directly.  Every
failure to trust the bytes is a :class:`~danube.errors.SegmentCorruptError`
naming the segment and the offset where the damage starts.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from danube import frames
from danube.errors import CorruptFrameError, FrameFormatError, SegmentCorruptError
from danube.spark.arrow import columns_to_batch, filter_batch
from danube.spark.planning import SegmentRead
from danube.storage import segment as seg
from danube.storage.backends import DurableBackend


def _check_sequence(read: SegmentRead, offsets: list[int], expected_first: int) -> None:
    if not offsets:
        raise SegmentCorruptError("segment range holds no frames", segment_id=read.segment_id,
                                  offset=expected_first)
    if offsets[0] != expected_first:
        raise SegmentCorruptError("frame offset differs from the segment index", segment_id=read.segment_id,
                                  offset=expected_first, expected=expected_first, actual=offsets[0])
    if offsets[-1] - offsets[0] != len(offsets) - 1 or \
            (len(offsets) > 1 and not bool((np.diff(np.asarray(offsets, dtype=np.int64)) == 1).all())):
        arr = np.asarray(offsets, dtype=np.int64)
        bad = int(np.nonzero(np.diff(arr) != 1)[0][0]) + 1 if len(arr) > 1 else 0
        raise SegmentCorruptError("frame offsets are not consecutive", segment_id=read.segment_id,
                                  offset=int(arr[bad - 1]) + 1, expected=int(arr[bad - 1]) + 1,
                                  actual=int(arr[bad]))


def read_batches(read: SegmentRead, backend: DurableBackend, *, verify: bool = True) -> Iterator[pa.RecordBatch]:
    """Decode the partition's bytes into RecordBatches (one per ~batch_bytes chunk), rows filtered."""
    data = backend.get(read.data_key, read.byte_start, read.byte_end)
    if len(data) != read.byte_end - read.byte_start:
        raise SegmentCorruptError("segment is shorter than its descriptor", segment_id=read.segment_id,
                                  offset=read.first_offset, expected=read.byte_end - read.byte_start,
                                  actual=len(data))
    if read.whole and verify:
        desc = seg.SegmentDescriptor(segment_id=read.segment_id, topic=read.topic,
                                     start_offset=read.first_offset, end_offset=read.last_offset,
                                     record_count=read.last_offset - read.first_offset + 1, size=read.size,
                                     etag=read.etag, created_at=0, min_publish_time=0, max_publish_time=0)
        seg.verify_segment(desc, data)
    mv = memoryview(data)
    bounds = read.batch_bounds or [(read.byte_start, read.first_offset)]
    starts = [pos - read.byte_start for pos, _ in bounds] + [len(data)]
    expected_next = read.first_offset
    for i, (pos, index_offset) in enumerate(bounds):
        if index_offset != expected_next:
            raise SegmentCorruptError("segment index is inconsistent with its frames",
                                      segment_id=read.segment_id, offset=expected_next,
                                      expected=expected_next, actual=index_offset)
        chunk_end_offset = bounds[i + 1][1] if i + 1 < len(bounds) else read.last_offset + 1
        if read.row_end_offset is not None and index_offset >= read.row_end_offset:
            return  # the rest is past the range (a whole segment was still verified by its etag)
        if read.row_start_offset is not None and chunk_end_offset <= read.row_start_offset:
            expected_next = chunk_end_offset  # wholly before the range: skip decoding
            continue
        chunk = mv[starts[i]:starts[i + 1]]
        try:
            cols = frames.decode_columns(chunk)
        except (CorruptFrameError, FrameFormatError) as exc:
            offset = getattr(exc, "offset", None)
            raise SegmentCorruptError(
                f"corrupt frame ({exc})", segment_id=read.segment_id,
                offset=offset if offset is not None else expected_next,
                expected=getattr(exc, "expected_crc", None), actual=getattr(exc, "actual_crc", None),
            ) from exc
        offsets = cols["offset"]
        _check_sequence(read, offsets, expected_next)
        if offsets[-1] + 1 != chunk_end_offset:
            raise SegmentCorruptError("frames do not match the segment index", segment_id=read.segment_id,
                                      offset=offsets[-1] + 1, expected=chunk_end_offset - 1, actual=offsets[-1])
        expected_next = chunk_end_offset
        batch = columns_to_batch(read.topic, cols)
        batch = filter_batch(batch, start_offset=read.row_start_offset, end_offset=read.row_end_offset,
                             start_time_ms=read.start_time_ms, end_time_ms=read.end_time_ms)
        if batch.num_rows:
            yield batch
    if expected_next != read.last_offset + 1:
        raise SegmentCorruptError("segment ends before its last offset", segment_id=read.segment_id,
                                  offset=expected_next, expected=read.last_offset, actual=expected_next - 1)

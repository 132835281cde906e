"""A broker's local WAL files as read input: the history not yet in durable segments.

In ``local`` mode a topic's history is exported lazily (when retention needs the space, at a
seal), so most of it, the newest part always, is only in the WAL files under
``storage.local_wal_root``.  With the ``walRoot`` option the data source reads those too: per
topic, every offset after the end of its durable segments comes from the WAL files, each file's
safe prefix (the whole, checksummed frames a restarting broker would keep; the preallocated
zeros after them are not read).  Meant for a stopped broker's data directory: a running broker
may rotate or prune a file while a job reads it.
"""

from __future__ import annotations

import mmap
import os

from danube import _native, message_codec
from danube.errors import StorageError
from danube.metadata.keys import is_valid_name
from danube.spark.planning import ReadOptions, SegmentRead, _chunk_bounds
from danube.wal.files import list_segment_files

_walfile = _native.load("walfile")
SOURCE = "wal"


def wal_topics(wal_root: str) -> list[str]:
    """``/ns/topic`` of every topic directory under ``wal_root`` (set-aside copies are hidden names)."""
    out = []
    try:
        namespaces = sorted(os.listdir(wal_root))
    except FileNotFoundError:
        return []
    for ns in namespaces:
        ns_dir = os.path.join(wal_root, ns)
        if not is_valid_name(ns) or not os.path.isdir(ns_dir):
            continue
        for name in sorted(os.listdir(ns_dir)):
            if is_valid_name(name) and os.path.isdir(os.path.join(ns_dir, name)):
                out.append(f"/{ns}/{name}")
    return out


def _scan(path: str, index_every: int) -> tuple[int, int, int, int, list] | None:
    """``(count, end_pos, first, last, index)`` of a WAL file's safe prefix; None when it holds no frame."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= _walfile.FILE_HEADER_SIZE:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            count, end_pos, first, last, _reason, index = message_codec.scan(
                view, _walfile.FILE_HEADER_SIZE, -1, index_every
            )
    if count == 0:
        return None
    return count, end_pos, first, last, [(int(o), int(p)) for o, p in index]


def plan_wal(options: ReadOptions, durable_ends: dict[str, int]) -> list[SegmentRead]:
    """Reads of the WAL files' offsets after each topic's durable end (``durable_ends``: topic →
    last durable offset), within the options' offset range; publish times are filtered per row."""
    root = os.path.abspath(options.wal_root)
    topics = [options.topic] if options.topic else wal_topics(root)
    reads: list[SegmentRead] = []
    for topic in topics:
        ns, name = topic.strip("/").split("/", 1)
        directory = os.path.join(root, ns, name)
        if not os.path.isdir(directory):
            continue
        expected = durable_ends.get(topic, -1) + 1  # the next offset the history needs
        known = topic in durable_ends  # (a topic with no durable segment may start anywhere)
        for _seq, path in list_segment_files(directory):
            found = _scan(path, options.batch_bytes)
            if found is None:
                continue
            count, end_pos, first, last, index = found
            if last < expected:
                continue
            if first > expected and known:
                raise StorageError(
                    f"{topic}: offsets {expected}..{first - 1} are neither in durable segments "
                    f"nor in the WAL files under {directory}",
                    retriable=False,
                )
            lo, hi = max(first, expected), last + 1
            expected, known = last + 1, True
            if options.start_offset is not None:
                lo = max(lo, options.start_offset)
            if options.end_offset is not None:
                hi = min(hi, options.end_offset)
            if lo >= hi:
                continue
            reads.append(
                SegmentRead(
                    topic=topic,
                    segment_id=f"wal {ns}/{name}/{os.path.basename(path)}",
                    data_key=os.path.relpath(path, root),
                    etag="",
                    size=end_pos,
                    byte_start=_walfile.FILE_HEADER_SIZE,
                    byte_end=end_pos,
                    first_offset=first,
                    last_offset=last,
                    whole=False,
                    row_start_offset=lo if lo > first else None,
                    row_end_offset=hi if hi <= last else None,
                    start_time_ms=options.start_time_ms,
                    end_time_ms=options.end_time_ms,
                    batch_bounds=_chunk_bounds(index, end_pos, options.batch_bytes),
                    source=SOURCE,
                )
            )
    return reads

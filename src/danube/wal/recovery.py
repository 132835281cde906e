"""Opening a WAL directory: find the files, trust or scan them, trim a bad tail.

Files whose header is all zero were made ahead of need and never used (or their
header never reached the disk, in which case nothing in them was reported
durable): they are deleted first, so they never count as the newest file.
Rotated files the checkpoint describes (same size on disk) are trusted and
indexed lazily on first read.  Every other file is scanned with the codec's
``scan`` and anything after its last whole, valid frame is zeroed; a rotated
file the checkpoint does not list yet (the process died before the background
thread finished it) is trimmed and synced here.  The newest file becomes the
active file again unless it was sealed (then a new one is created).  Offsets
must continue from file to file; a gap or an overlap means lost or foreign files
and opening fails rather than guessing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from danube import _native, message_codec
from danube.errors import WalError
from danube.wal.checkpoint import Checkpoint, read_checkpoint
from danube.wal.files import list_segment_files, segment_file_name
from danube.wal.options import SyncPolicy, WalOptions

if TYPE_CHECKING:
    # the API both twins of the WAL file share (walfile.pyi), whichever _native loads
    from danube._core.walfile import SegmentFile

_walfile = _native.load("walfile")
log = logging.getLogger("danube.wal")


@dataclass
class RecoveryReport:
    """What opening found: files scanned, bytes zeroed after the last good frame."""

    scanned_files: list[str] = field(default_factory=list)
    trimmed: list[tuple[str, int, int]] = field(default_factory=list)  # (path, position, bytes zeroed)
    removed_empty: list[str] = field(default_factory=list)
    checkpoint_found: bool = False


@dataclass
class RecoveredLog:
    rotated: list[SegmentFile]  # read-only, oldest first
    active: SegmentFile  # writable
    checkpoint: Checkpoint
    report: RecoveryReport
    changed: bool = True  # the checkpoint on disk differs from ``checkpoint`` (write it)


def recover(directory: str, options: WalOptions) -> RecoveredLog:
    report = RecoveryReport()
    ckpt = read_checkpoint(directory)
    report.checkpoint_found = ckpt is not None
    if ckpt is None:
        ckpt = Checkpoint()
    files = []
    for seq, path in list_segment_files(directory):
        if _never_written(path):
            report.removed_empty.append(path)
            os.unlink(path)
        else:
            files.append((seq, path))
    segments: list[SegmentFile] = []
    index_every = options.index_every_bytes
    try:
        for i, (seq, path) in enumerate(files):
            is_last = i == len(files) - 1
            known = ckpt.rotated.get(seq)
            seg = None
            if known is not None and not is_last and os.path.getsize(path) == known[2]:
                seg, _ = _walfile.SegmentFile.open(
                    path, index_every=index_every, writable=False, trusted_count=known[1] - known[0] + 1
                )
            else:
                seg, (reason, trimmed) = _walfile.SegmentFile.open(path, index_every=index_every, writable=True)
                report.scanned_files.append(path)
                if seg is not None and trimmed:
                    report.trimmed.append((path, seg.write_pos, trimmed))
                    log.warning(
                        "WAL %s: zeroed %d bytes after the last good frame at position %d "
                        "(offset %d; scan stopped: %s)",
                        path,
                        trimmed,
                        seg.write_pos,
                        seg.next_offset,
                        _REASONS.get(reason, reason),
                    )
            if seg is None:
                report.removed_empty.append(path)
                os.unlink(path)
                continue
            if seg.count == 0 and not is_last:
                seg.delete()
                report.removed_empty.append(path)
                continue
            if segments and seg.first_offset != segments[-1].next_offset and seg.count:
                prev = segments[-1]
                raise WalError(
                    f"WAL files do not continue: {prev.path} ends before offset {prev.next_offset}, "
                    f"{seg.path} starts at {seg.first_offset}"
                )
            if not is_last and seg.writable:
                seg.seal(sync=True)
            segments.append(seg)
    except BaseException:
        for seg in segments:
            seg.close()
        raise

    active = None
    if segments and segments[-1].writable and segments[-1].write_pos < segments[-1].map_size:
        active = segments.pop()
    elif segments and segments[-1].writable:
        segments[-1].seal(sync=False)  # exactly full: treat as rotated
    rotated = segments
    next_seq = max([ckpt.next_seq] + [s.seq + 1 for s in rotated] + ([active.seq + 1] if active else []))

    if active is not None:
        next_offset = active.next_offset
    elif rotated:
        next_offset = rotated[-1].next_offset
    else:
        next_offset = ckpt.first_offset
    log_empty = all(s.count == 0 for s in rotated) and (active is None or active.count == 0)
    if log_empty and options.initial_offset is not None:
        next_offset = options.initial_offset
    if active is not None and active.count == 0 and active.first_offset != next_offset:
        active.delete()
        active = None
    if active is None:
        path = os.path.join(directory, segment_file_name(next_seq))
        active = _walfile.SegmentFile.create(
            path,
            next_seq,
            next_offset,
            options.max_file_bytes,
            index_every=index_every,
            reserve=options.initial_file_bytes,
            read_around=options.sync is not SyncPolicy.NEVER,
        )
        next_seq += 1

    found = ckpt if report.checkpoint_found else None
    ckpt = Checkpoint(
        first_offset=rotated[0].first_offset if rotated else active.first_offset,
        next_seq=next_seq,
        rotated={s.seq: (s.first_offset, s.last_offset, s.write_pos) for s in rotated},
    )
    return RecoveredLog(rotated=rotated, active=active, checkpoint=ckpt, report=report, changed=ckpt != found)


def _never_written(path: str) -> bool:
    """A segment file whose header is all zero (or missing): a spare that was never used."""
    with open(path, "rb") as f:
        head = f.read(_walfile.FILE_HEADER_SIZE)
    return len(head) < _walfile.FILE_HEADER_SIZE or not any(head)


_REASONS = {
    message_codec.SCAN_END: "end of file",
    message_codec.SCAN_ZERO: "end of data",
    message_codec.SCAN_TORN: "torn frame",
    message_codec.SCAN_CORRUPT: "corrupt frame",
}

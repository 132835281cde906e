"""Segment file naming, listing and directory durability."""

from __future__ import annotations

import os
from typing import NamedTuple

from danube import _native

_walfile = _native.load("walfile")

CHECKPOINT_NAME = "wal.ckpt"
LOCK_NAME = "wal.lock"
segment_file_name = _walfile.segment_file_name
parse_segment_file_name = _walfile.parse_segment_file_name


class WalFileInfo(NamedTuple):
    """A rotated (closed) segment file: its frames, from ``FILE_HEADER_SIZE`` to ``size``,
    hold offsets ``first_offset..last_offset`` and never change again."""

    path: str
    seq: int
    first_offset: int
    last_offset: int
    size: int

    @property
    def data_start(self) -> int:
        """Byte position of the first frame (the file header comes before it)."""
        return _walfile.FILE_HEADER_SIZE


def list_segment_files(directory: str) -> list[tuple[int, str]]:
    """``(seq, path)`` of every segment file in ``directory``, oldest first."""
    out = []
    for name in os.listdir(directory):
        seq = parse_segment_file_name(name)
        if seq is not None:
            out.append((seq, os.path.join(directory, name)))
    out.sort()
    return out


def fsync_directory(directory: str) -> None:
    """Make created, renamed and deleted names in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

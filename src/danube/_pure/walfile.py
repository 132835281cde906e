"""Pure-Python twin of ``danube._core.walfile``: WAL segment files and the log writer.

Split as the compiled module is (``_core/walfile.pyx`` includes ``_core/wal/segment.pyx``
and ``_core/wal/writer.pyx``):

- ``danube/_pure/wal/segment.py``: ``SegmentFile``, one segment file -- file header codec,
  shared mapping, sparse index, recovery.  Its docstring describes the segment file byte
  by byte (the one description of that layout);
- ``danube/_pure/wal/writer.py``: ``LogWriter``, the single writer.

This module gives them the compiled module's names.  It is pure on its own: it uses
``danube._pure.frame``, never the compiled codec, so ``DANUBE_NO_EXTENSIONS=1`` and a
build without a compiler run the same code.
"""

from __future__ import annotations

from danube._pure.wal.segment import (
    FILE_HEADER_SIZE,
    FILE_MAGIC,
    FILE_VERSION,
    SegmentFile,
    decode_file_header,
    encode_file_header,
    now_ms,
    parse_segment_file_name,
    preallocate,
    rearm_many,
    segment_file_name,
)
from danube._pure.wal.writer import LogWriter

__all__ = [
    "FILE_HEADER_SIZE",
    "FILE_MAGIC",
    "FILE_VERSION",
    "LogWriter",
    "SegmentFile",
    "decode_file_header",
    "encode_file_header",
    "now_ms",
    "parse_segment_file_name",
    "preallocate",
    "rearm_many",
    "segment_file_name",
]

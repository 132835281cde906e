# C-level contract of danube._core.walfile, one module built from two parts
# (walfile.pyx includes wal/segment.pyx and wal/writer.pyx, as uvloop's loop
# includes handles/); each part's declarations are in the .pxd beside it.
# Byte layout of a segment file: the docstring of danube/_pure/wal/segment.py.

from libc.stdint cimport int64_t, uint64_t

from danube._core.frame cimport IndexEntry, Piece
from danube._core.ring cimport FrameRing

include "wal/segment.pxd"
include "wal/writer.pxd"

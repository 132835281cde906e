# cython: language_level=3, cdivision=True
"""WAL segment files and the log writer, compiled (pure twin: ``danube/_pure/walfile.py``).

One extension module built from two source files, included at the end of this
one as uvloop builds its loop from ``handles/``; the pure twin is split the
same way, and ``walfile.pxd`` includes the two parts' declarations:

- ``wal/segment.pyx`` (twin ``_pure/wal/segment.py``): ``SegmentFile``, one
  segment file -- file header codec, shared mapping, sparse offset -> position
  index, recovery scan and trim;
- ``wal/writer.pyx`` (twin ``_pure/wal/writer.py``): ``LogWriter``, the single
  writer -- offsets, room and rotation, the pwrite scratch buffer, prefaulting,
  publishing to the ring.

Byte layouts, each described in one place: the segment file at the top of
``danube/_pure/wal/segment.py``; the frames in it at the top of
``danube/_pure/frame.py``.  Frames are encoded only by ``frame.pxd``'s
``write_frame`` and walked with its field positions and ``le.pxd``'s loads.

This file holds what both parts use: imports, system calls, the clock.  The GIL
is held for the small per-record path and released for batch encodes, copies,
checksums and fdatasync of 64 KiB and more.
"""

import errno
import mmap
import os
import struct

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from posix.types cimport off_t
from libc.errno cimport EINTR, EINVAL, EIO, errno as c_errno
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME

from danube._core.frame cimport (
    CheckedFrames, FRAME_BODY_FIXED_SIZE, FRAME_BODY_LEN_AT, FRAME_FIXED_SIZE, FRAME_FLAG_HAS_KEY, FRAME_HEADER_SIZE,
    FRAME_MAX_BODY, FRAME_OK, IndexEntry, Piece, ScanResult, ValidateResult, piece_body_len,
    raise_validate_error, scan_frames, stamp_frames, validate_frames, write_frame,
)
from danube._core.le cimport ld32
from danube._core.ring cimport FrameRing

from danube._core import frame as _frame
from danube.errors import CorruptFrameError, CorruptStoredFrameError, FrameFormatError, WalClosedError, WalError

cdef extern from "<unistd.h>" nogil:
    int fdatasync(int fd)
    ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset)

cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t pwritev(int fd, const iovec* iov, int iovcnt, off_t offset)

cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MADV_POPULATE_WRITE
    #define MADV_POPULATE_WRITE 23
    #endif
    """
    int madvise(void* addr, size_t length, int advice) nogil
    int MADV_POPULATE_WRITE
    int MADV_DONTNEED
    int MADV_RANDOM
    int MADV_NORMAL

cdef extern from "<fcntl.h>" nogil:
    int posix_fadvise(int fd, off_t offset, off_t length, int advice)
    int POSIX_FADV_DONTNEED

DEF NOGIL_BYTES = 65536         # below this, releasing and retaking the GIL costs more than it frees
cdef Py_ssize_t _PAGE = mmap.PAGESIZE
cdef bint _populate_write_ok = True   # cleared when the kernel lacks MADV_POPULATE_WRITE (< 5.14)


cdef inline int64_t _now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


def now_ms():
    return _now_ms()


include "wal/segment.pyx"
include "wal/writer.pyx"

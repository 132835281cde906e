# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""WAL segment files and the log writer (compiled; pure twin: ``danube/_pure/walfile.py``).

Segment file layout ("danube-wal-v1")
=====================================

A WAL directory holds segment files named ``wal-<seq:020d>.log`` (``seq``
counts up from 1) and the checkpoint ``wal.ckpt`` (see ``danube/wal/checkpoint.py``).
A segment file is preallocated to its capacity (``posix_fallocate``, else
``ftruncate``), mapped with ``mmap`` and written through the mapping.  All
integers are little-endian::

    file header (64 bytes)
      0   8 bytes  magic        b"DNBWAL\\x00\\x01"
      8   u32      version      1
      12  u32      header_size  64
      16  u64      seq          the number in the file name
      24  u64      first_offset offset of the first frame this file holds (or will hold)
      32  u64      created_ms   creation time, ms since the Unix epoch (drives age rotation)
      40  20 bytes reserved     zero
      60  u32      header_crc   CRC32C of bytes [0, 60)

    frames (from byte 64)
      whole frames in the "danube-frames-v1" format (``danube/_pure/frame.py``),
      offsets consecutive from first_offset, nothing between them

    end of data
      the first all-zero 16-byte frame header (preallocated space is zero), or
      the end of the file for a rotated (sealed) file, which is truncated to
      exactly header + frames

Writing: frames are copied (or encoded) into the mapping at the write
position, so they are in the page cache, and survive a crash of the process,
as soon as ``append`` returns; ``sync()`` (``fdatasync``) makes them survive a
crash of the machine.  A frame is visible to readers only after it has been
completely written (the writer publishes ``next_offset`` last).

Recovery: ``SegmentFile.open`` scans the frames with the codec's ``scan``,
keeps every whole, valid frame in offset sequence and zeroes everything after
the last one (a torn write, a corrupt frame, garbage), so the next append
continues right after the last good frame.  The sparse offset -> position
index (one entry at the first frame, then one every ``index_every`` bytes) is
rebuilt by the same scan.

Why mmap and not pwrite (``python bench/wal_io.py``, this 2-core box, loaded):
one 138-byte frame per write costs a system call with pwrite (73 MB/s) and a
copy with the mapping (184 MB/s, and far more from C, where the per-record
path runs); at 64 KiB and more the two are within the noise of the machine.
The mapping also lets readers take zero-copy views of stored frames.

Compiled specifics: small appends are encoded straight into the mapping (one
write of every byte, the CRC computed over bytes still in cache; under
sync=never the pages ahead are faulted in writable 4 MiB at a time with
MADV_POPULATE_WRITE); batches of 16 KiB and more are encoded into a 256 KiB
cache-warm scratch buffer and written with pwrite (same page cache, so the
mapping sees them at once; no zero-fill and page_mkwrite fault per fresh page).
Files are not MAP_POPULATEd (that read-faulted the whole file at open and at
each rotation).  The GIL is held for the small per-record path and released
for batch encodes, copies, checksums and fdatasync of 64 KiB and more.
"""

import errno
import mmap
import os
import struct
import time

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t
from posix.types cimport off_t
from libc.errno cimport EINTR, EINVAL, errno as c_errno
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME

from danube._core.frame cimport (
    FRAME_HEADER_SIZE as _FHS, FRAME_MAX_BODY, FRAME_OK, IndexEntry, ScanResult, ValidateResult,
    crc32c_update, raise_validate_error, scan_frames, stamp_frames, validate_frames,
)
from danube._core.ring cimport FrameRing

from danube._core import frame as _frame
from danube.errors import CorruptFrameError, FrameFormatError, WalClosedError, WalError

cdef extern from "<unistd.h>" nogil:
    int fdatasync(int fd)
    ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset)

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

cdef extern from "<fcntl.h>" nogil:
    int posix_fadvise(int fd, off_t offset, off_t length, int advice)
    int POSIX_FADV_DONTNEED

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline uint32_t danube_wal_ld32(const unsigned char *p) {
        uint32_t v; memcpy(&v, p, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    static inline void danube_wal_st64(unsigned char *p, uint64_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        memcpy(p, &v, 8);
    }
    static inline void danube_wal_st32(unsigned char *p, uint32_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        memcpy(p, &v, 4);
    }
    static inline void danube_wal_st16(unsigned char *p, uint16_t v) {
        p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    }
    """
    uint32_t ld32 "danube_wal_ld32"(const unsigned char* p) noexcept nogil
    void st64 "danube_wal_st64"(unsigned char* p, uint64_t v) noexcept nogil
    void st32 "danube_wal_st32"(unsigned char* p, uint32_t v) noexcept nogil
    void st16 "danube_wal_st16"(unsigned char* p, uint16_t v) noexcept nogil

FILE_MAGIC = b"DNBWAL\x00\x01"
FILE_VERSION = 1
FILE_HEADER_SIZE = 64
FRAME_HEADER_SIZE = 16
DEF HEADER = 64
DEF NOGIL_BYTES = 65536
DEF PWRITE_MIN_BYTES = 16384    # batches this big go through pwrite (see LogWriter)
DEF SCRATCH_BYTES = 262144      # the pwrite staging buffer: stays in L2
_FILE_HEADER = struct.Struct("<8sIIQQQ")
_U32 = struct.Struct("<I")
cdef Py_ssize_t _PAGE = mmap.PAGESIZE
cdef bint _populate_write_ok = True   # cleared when the kernel lacks MADV_POPULATE_WRITE (< 5.14)

cdef object _encode_record = _frame.encode_record
cdef object _encode_payloads = _frame.encode_payloads


def segment_file_name(seq):
    return f"wal-{seq:020d}.log"


def parse_segment_file_name(str name):
    """The sequence number of a segment file name, or None for any other name."""
    if len(name) == 28 and name.startswith("wal-") and name.endswith(".log") and name[4:24].isdigit():
        return int(name[4:24])
    return None


cdef inline int64_t _now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


def now_ms():
    return _now_ms()


def encode_file_header(seq, first_offset, created_ms):
    head = _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, FILE_HEADER_SIZE, seq, first_offset, created_ms)
    head += bytes(60 - len(head))
    return head + _U32.pack(_frame.crc32c(head))


def decode_file_header(buf, path=None):
    """``(seq, first_offset, created_ms)`` of a segment file header; raises on a bad header."""
    mv = memoryview(buf).cast("B")
    if len(mv) < FILE_HEADER_SIZE:
        raise CorruptFrameError("WAL file header truncated", position=0, offset=None,
                                expected_crc=None, actual_crc=None, path=path)
    magic, version, header_size, seq, first_offset, created_ms = _FILE_HEADER.unpack_from(mv, 0)
    (stored,) = _U32.unpack_from(mv, 60)
    actual = _frame.crc32c(mv[:60])
    if magic != FILE_MAGIC:
        raise CorruptFrameError("not a danube WAL file (bad magic)", position=0, offset=None,
                                expected_crc=None, actual_crc=None, path=path)
    if stored != actual:
        raise CorruptFrameError("WAL file header checksum mismatch", position=0, offset=None,
                                expected_crc=stored, actual_crc=actual, path=path)
    if version != FILE_VERSION or header_size != FILE_HEADER_SIZE:
        raise CorruptFrameError(f"unsupported WAL file version {version}", position=0, offset=None,
                                expected_crc=None, actual_crc=None, path=path)
    return seq, first_offset, created_ms


def preallocate(int fd, Py_ssize_t size):
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


cdef _release(mm):
    """Close a mapping unless readers still hold views of it (then it dies with the last view)."""
    if mm is not None:
        try:
            mm.close()
        except BufferError:
            pass


cdef int _sync_fd(int fd) except -1:
    cdef int rc
    with nogil:
        rc = fdatasync(fd)
    if rc != 0:
        err = c_errno
        raise OSError(err, os.strerror(err))
    return 0


cdef class SegmentFile:
    """One segment file: header, frames, sparse index; written through a shared mapping."""

    def __cinit__(self):
        self._fd = -1
        self._has_view = False
        self._index = NULL
        self._index_len = 0
        self._index_cap = 0
        self._last_indexed = -(1 << 62)

    def __dealloc__(self):
        if self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False
        free(self._index)

    cdef int _map(self, Py_ssize_t size, bint writable) except -1:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # no MAP_POPULATE: it read-faults the whole file (~1 s for 256 MiB, measured) at
        # open and at every rotation, and still leaves one write fault per page; the writer
        # populates a window ahead of itself instead (LogWriter.prefault_bytes)
        mm = mmap.mmap(self._fd, size, mmap.MAP_SHARED, prot)
        PyObject_GetBuffer(mm, &self._view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self._has_view = True
        self._mm = mm
        self.base = <unsigned char*>self._view.buf
        self.capacity = size
        return 0

    cdef int _unmap(self) except -1:
        mm, self._mm = self._mm, None
        if self._has_view:
            self._has_view = False
            PyBuffer_Release(&self._view)
        self.base = NULL
        _release(mm)
        return 0

    cdef int _add_index(self, uint64_t offset, Py_ssize_t pos) except -1:
        cdef IndexEntry* grown
        cdef Py_ssize_t cap
        if self._index_len == self._index_cap:
            cap = self._index_cap * 2 if self._index_cap else 64
            grown = <IndexEntry*>realloc(self._index, cap * sizeof(IndexEntry))
            if grown == NULL:
                raise MemoryError()
            self._index = grown
            self._index_cap = cap
        self._index[self._index_len].offset = offset
        self._index[self._index_len].position = pos
        self._index_len += 1
        self._last_indexed = pos
        return 0

    cdef int _index_batch(self, const unsigned char* data, Py_ssize_t pos, Py_ssize_t n) except -1:
        """Index the frames about to be published at ``pos``, reading their lengths from
        ``data`` (a copy of the same bytes: walking the mapping right after a pwrite
        would fault its pages in, and read ahead into the unwritten rest of the file)."""
        cdef Py_ssize_t every = self.index_every, p = 0
        cdef uint64_t off
        if self.count == 0 or (every and pos + n - self._last_indexed > every):
            off = self.first_offset + self.count
            while p < n:
                if self._last_indexed < 0 or (every and pos + p - self._last_indexed >= every):
                    self._add_index(off, pos + p)
                p += 16 + ld32(data + p + 12)
                off += 1
        return 0

    cdef int _index_sizes(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t count, const Py_ssize_t* lens,
                          Py_ssize_t fixed) except -1:
        """``_index_batch`` for frames of ``fixed + lens[i]`` bytes."""
        cdef Py_ssize_t every = self.index_every, p = pos, i
        cdef uint64_t off
        if self.count == 0 or (every and pos + n - self._last_indexed > every):
            off = self.first_offset + self.count
            for i in range(count):
                if self._last_indexed < 0 or (every and p - self._last_indexed >= every):
                    self._add_index(off + i, p)
                p += fixed + lens[i]
        return 0

    # ------------------------------------------------------------ open / create

    @classmethod
    def create(cls, str path, seq, first_offset, Py_ssize_t capacity, *, created_ms=None,
               Py_ssize_t index_every=65536):
        cdef SegmentFile seg = SegmentFile.__new__(SegmentFile)
        capacity = max(capacity, HEADER + 16)
        created_ms = _now_ms() if created_ms is None else created_ms
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        seg._fd = fd
        try:
            preallocate(fd, capacity)
            seg._map(capacity, True)
            memcpy(seg.base, PyBytes_AS_STRING(encode_file_header(seq, first_offset, created_ms)), HEADER)
        except BaseException:
            seg.close()
            raise
        seg._init_empty(path, seq, first_offset, created_ms, index_every, False)
        return seg

    cdef int _init_empty(self, str path, object seq, uint64_t first_offset, int64_t created_ms,
                         Py_ssize_t index_every, bint spare) except -1:
        """State of a freshly created, still empty writable file."""
        self.path = path
        self.seq = seq
        self.first_offset = first_offset
        self.created_ms = created_ms
        self.write_pos = HEADER
        self._valid_end = HEADER
        self._prefaulted = 0
        self.count = 0
        self.writable = True
        self.index_every = index_every
        self._indexed = True
        self._trimmed = False
        self.spare = spare
        return 0

    @classmethod
    def create_spare(cls, str path, seq, Py_ssize_t capacity, *, Py_ssize_t index_every=65536):
        """A preallocated file with an all-zero header, to become the active file later
        (``activate``); recovery deletes it while its header is still zero."""
        cdef SegmentFile seg = SegmentFile.__new__(SegmentFile)
        capacity = max(capacity, HEADER + 16)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        seg._fd = fd
        try:
            preallocate(fd, capacity)
            seg._map(capacity, True)
        except BaseException:
            seg.close()
            raise
        seg._init_empty(path, seq, 0, 0, index_every, True)
        return seg

    def populate(self, Py_ssize_t end):
        """Take the write faults of ``[0, end)`` now (a spare, on a background thread), so the
        writer's first stores into the file do not: one MADV_POPULATE_WRITE, else a store
        per page.  The pages hold zeros, as before."""
        global _populate_write_ok
        cdef Py_ssize_t off = 0
        cdef int rc = -1
        end = min(end, self.capacity)
        if self.base == NULL or not self.spare or end <= self._prefaulted:
            return
        if _populate_write_ok:
            with nogil:
                rc = madvise(self.base, end, MADV_POPULATE_WRITE)
            if rc != 0 and c_errno == EINVAL:
                _populate_write_ok = False
        if rc != 0:
            while off < end:  # a spare is all zeros: storing a zero changes nothing but the fault
                (<volatile unsigned char*>self.base)[off] = 0
                off += _PAGE
        self._prefaulted = end

    def activate(self, uint64_t first_offset, created_ms=None):
        """Make a spare the next active file: write its header (into the mapping, no system call)."""
        if not self.spare or self.base == NULL:
            raise WalError(f"segment {self.path} is not an unused spare")
        created_ms = _now_ms() if created_ms is None else created_ms
        memcpy(self.base, PyBytes_AS_STRING(encode_file_header(self.seq, first_offset, created_ms)), HEADER)
        self.first_offset = first_offset
        self.created_ms = created_ms
        self.spare = False

    @classmethod
    def open(cls, str path, *, Py_ssize_t index_every=65536, bint writable=False, trusted_count=None):
        """Open an existing file (see the pure twin for the contract)."""
        cdef SegmentFile seg = SegmentFile.__new__(SegmentFile)
        cdef ScanResult res
        cdef IndexEntry* index = NULL
        cdef Py_ssize_t index_len = 0, size, end, last, rc
        cdef uint64_t first
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        seg._fd = fd
        seg.path = path
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, FILE_HEADER_SIZE, 0)
            if len(head) < FILE_HEADER_SIZE or not any(head):
                seg.close()
                return None, (_frame.SCAN_ZERO, 0)
            seq, first_offset, created_ms = decode_file_header(head, path)
            seg._map(size, writable)
        except BaseException:
            seg.close()
            raise
        seg.seq = seq
        seg.first_offset = first_offset
        seg.created_ms = created_ms
        seg.index_every = index_every
        if trusted_count is not None:
            seg.write_pos = size
            seg._valid_end = size
            seg.count = trusted_count
            seg.writable = False
            seg._indexed = False
            return seg, (_frame.SCAN_END, 0)
        first = first_offset
        with nogil:
            rc = scan_frames(seg.base, size, HEADER, 1, first, index_every, &res, &index, &index_len)
        if rc < 0:
            seg.close()
            raise MemoryError()
        seg._index = index
        seg._index_len = seg._index_cap = index_len
        if index_len:
            seg._last_indexed = index[index_len - 1].position
        seg._indexed = True
        end = res.end_pos
        trimmed = 0
        if res.reason != 0:
            last = size
            with nogil:
                while last > end and last - 8 >= end and (<uint64_t*>(seg.base + last - 8))[0] == 0 \
                        and ((last & 7) == 0):
                    last -= 8
                while last > end and seg.base[last - 1] == 0:
                    last -= 1
            trimmed = last - end
            if trimmed:
                if writable:
                    memset(seg.base + end, 0, trimmed)
                    seg._mm.flush(end - end % mmap.PAGESIZE, trimmed + end % mmap.PAGESIZE)
                else:
                    os.pwrite(fd, bytes(trimmed), end)
                    os.fdatasync(fd)
        seg.write_pos = end
        seg._valid_end = end
        seg.count = res.count
        seg.writable = writable
        return seg, (res.reason, trimmed)

    # ------------------------------------------------------------ state

    @property
    def next_offset(self):
        return self.first_offset + self.count

    @property
    def last_offset(self):
        return <int64_t>(self.first_offset + self.count) - 1

    @property
    def room(self):
        return self.capacity - self.write_pos

    @property
    def closed(self):
        return self._mm is None

    def fileno(self):
        return self._fd

    def index_entries(self):
        self._ensure_index()
        return [(self._index[i].offset, self._index[i].position) for i in range(self._index_len)]

    # ------------------------------------------------------------ writing

    def write_frames(self, data, Py_ssize_t count):
        """Copy ``count`` whole stamped frames at the write position; return their position."""
        cdef Py_buffer view
        cdef Py_ssize_t pos = self.write_pos
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if self.base == NULL or not self.writable:
                raise WalError(f"segment {self.path} is not writable")
            if view.len > self.capacity - pos:
                raise WalError(f"segment {self.path} has {self.capacity - pos} bytes free, {view.len} needed")
            memcpy(self.base + pos, view.buf, view.len)
            self._index_batch(<const unsigned char*>view.buf, pos, view.len)
            self.write_pos = pos + view.len
            self._valid_end = self.write_pos
            self.count += count
        finally:
            PyBuffer_Release(&view)
        return pos

    def drop_cache(self, Py_ssize_t start, Py_ssize_t end):
        """Drop the file's pages in ``[start, end)`` (whole pages inside it) from this process's
        mapping and from the OS page cache; return the bytes covered.

        The bytes stay what they were: a shared file mapping keeps dirty data when its page
        table entries go (``MADV_DONTNEED``), ``POSIX_FADV_DONTNEED`` drops only clean pages,
        and the next read faults them back in from the file.  The madvise runs with the GIL
        held, so the mapping cannot be unmapped under it (``_unmap`` clears ``base`` first,
        under the GIL); the fadvise only needs the descriptor.  Raises OSError when the
        kernel refuses either call."""
        cdef Py_ssize_t first = (max(start, 0) + _PAGE - 1) // _PAGE * _PAGE   # (cdivision: no negative %)
        cdef Py_ssize_t stop = min(end, self.capacity)
        cdef int rc = 0
        cdef int fd = self._fd
        stop -= stop % _PAGE
        if stop <= first or self.base == NULL or fd < 0:
            return 0
        if madvise(self.base + first, <size_t>(stop - first), MADV_DONTNEED) != 0:
            err = c_errno
            raise OSError(err, f"madvise(MADV_DONTNEED) of {self.path} [{first}, {stop}): {os.strerror(err)}")
        with nogil:
            rc = posix_fadvise(fd, <off_t>first, <off_t>(stop - first), POSIX_FADV_DONTNEED)
        if rc != 0 and rc != errno.EBADF:   # EBADF: closed meanwhile (pruned); nothing left to drop
            raise OSError(rc, f"posix_fadvise(DONTNEED) of {self.path} [{first}, {stop}): {os.strerror(rc)}")
        return stop - first

    def view(self, Py_ssize_t start, Py_ssize_t end):
        if self._mm is None:
            raise WalClosedError(f"segment {self.path} is closed")
        return memoryview(self._mm)[start:end]

    def sync(self):
        if self._fd >= 0:
            _sync_fd(self._fd)

    def trim(self, *, bint sync):
        """Cut the preallocated tail (the file ends at the last frame), then fdatasync if
        ``sync``: the first half of ``seal``, which a background thread runs apart."""
        if self._fd < 0:
            raise WalClosedError(f"segment {self.path} is closed")
        os.ftruncate(self._fd, self.write_pos)
        if sync:
            _sync_fd(self._fd)
        self._trimmed = True

    def seal(self, *, bint sync):
        """Trim the preallocated tail (unless ``trim`` did) and reopen read-only (rotation)."""
        if self._mm is None:
            return
        if not self._trimmed:
            self.trim(sync=sync)
        # map the read-only view before dropping the writable one: concurrent readers
        # must never see the segment without a mapping
        cdef Py_buffer old_view = self._view
        old_mm = self._mm
        self._has_view = False
        self._map(self.write_pos, False)
        self.writable = False
        PyBuffer_Release(&old_view)
        _release(old_mm)

    def close(self):
        self._unmap()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self):
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------ reading

    cdef int _ensure_index(self) except -1:
        cdef ScanResult res
        cdef IndexEntry* index = NULL
        cdef Py_ssize_t index_len = 0, rc
        if self._indexed:
            return 0
        if self.base == NULL:
            raise WalClosedError(f"segment {self.path} is closed")
        with nogil:
            rc = scan_frames(self.base, self.capacity, HEADER, 1, self.first_offset, self.index_every,
                             &res, &index, &index_len)
        if rc < 0:
            raise MemoryError()
        free(self._index)
        self._index = index
        self._index_len = self._index_cap = index_len
        if index_len:
            self._last_indexed = index[index_len - 1].position
        self._valid_end = res.end_pos
        self._indexed = True
        return 0

    cdef Py_ssize_t _position_of(self, uint64_t offset) except -2:
        cdef Py_ssize_t lo = 0, hi, mid, pos, end
        cdef uint64_t off
        self._ensure_index()
        hi = self._index_len
        if hi == 0 or self._index[0].offset > offset:
            return -1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._index[mid].offset <= offset:
                lo = mid
            else:
                hi = mid
        pos = self._index[lo].position
        off = self._index[lo].offset
        end = self._valid_end
        while off < offset:
            if pos + 16 > end:
                return -1
            pos += 16 + ld32(self.base + pos + 12)
            off += 1
        return pos if pos + 16 <= end else -1

    def position_of(self, uint64_t offset):
        """Byte position of the frame holding ``offset`` (which this file must hold)."""
        return self._position_of(offset)

    def read_frames(self, uint64_t offset, Py_ssize_t max_bytes, uint64_t limit_offset):
        """Whole, validated frames from ``offset`` (at least one, then up to ``max_bytes``),
        stopping before ``limit_offset``; a zero-copy view of the mapping."""
        cdef Py_ssize_t pos, p, nxt, end_limit
        cdef uint64_t off, stop
        cdef const unsigned char* base
        cdef ValidateResult res
        cdef int status
        if self._mm is None:
            raise WalClosedError(f"segment {self.path} is closed")
        pos = self._position_of(offset)
        if pos < 0:
            self._raise_corrupt(offset)
        end_limit = self._valid_end
        stop = min(limit_offset, self.first_offset + self.count)
        p = pos
        off = offset
        while off < stop and p + 16 <= end_limit:
            nxt = p + 16 + ld32(self.base + p + 12)
            if nxt > end_limit or (nxt - pos > max_bytes and off > offset):
                break
            p = nxt
            off += 1
        if p == pos:
            self._raise_corrupt(offset)
        # the view is taken first: its export keeps this mapping alive (mmap.close fails while
        # it exists) should a background thread seal the file while the GIL is released below
        out = memoryview(self._mm)[pos:p]
        base = self.base
        if p - pos >= NOGIL_BYTES:
            with nogil:
                status = validate_frames(base + pos, p - pos, 1, offset, True, &res)
        else:
            status = validate_frames(base + pos, p - pos, 1, offset, True, &res)
        if status != FRAME_OK:
            try:
                raise_validate_error(status, &res, offset)
            except (CorruptFrameError, FrameFormatError) as exc:
                raise CorruptFrameError(f"corrupt WAL data: {exc}", position=pos + res.error_pos,
                                        offset=getattr(exc, "offset", offset),
                                        expected_crc=getattr(exc, "expected_crc", None),
                                        actual_crc=getattr(exc, "actual_crc", None), path=self.path) from exc
        return out

    def _raise_corrupt(self, offset):
        raise CorruptFrameError("WAL file is corrupt before the requested offset", position=self._valid_end,
                                offset=offset, expected_crc=None, actual_crc=None, path=self.path)


# ---------------------------------------------------------------- the writer


cdef void _encode_into(unsigned char* out, Py_ssize_t count, const char** ptrs, const Py_ssize_t* lens,
                       uint64_t first, uint64_t pt, uint64_t pid, unsigned char flag,
                       const char* kp, Py_ssize_t klen) noexcept nogil:
    """Encode ``count`` frames sharing everything but the payload, back to back at ``out``."""
    cdef Py_ssize_t i, plen, body_len
    for i in range(count):
        plen = lens[i]
        body_len = 22 + klen + plen
        st64(out, first + i)
        st32(out + 12, <uint32_t>body_len)
        st64(out + 16, pt)
        st64(out + 24, pid)
        out[32] = flag
        out[33] = 0
        st16(out + 34, 0)
        st16(out + 36, <uint16_t>klen)
        if klen:
            memcpy(out + 38, kp, klen)
        memcpy(out + 38 + klen, ptrs[i], plen)
        st32(out + 8, crc32c_update(0, out + 12, 4 + body_len))
        out += 16 + body_len


cdef int _pwrite_all(int fd, const unsigned char* p, Py_ssize_t n, Py_ssize_t pos) noexcept nogil:
    """Write all of ``p[0:n]`` at ``pos``; 0 or an errno."""
    cdef Py_ssize_t done
    while n > 0:
        done = pwrite(fd, p, <size_t>n, <off_t>pos)
        if done < 0:
            if c_errno == EINTR:
                continue
            return c_errno
        p += done
        n -= done
        pos += done
    return 0


cdef int _encode_pwrite(int fd, Py_ssize_t pos, unsigned char* scratch, Py_ssize_t scratch_cap,
                        Py_ssize_t count, const char** ptrs, const Py_ssize_t* lens, uint64_t first,
                        uint64_t pt, uint64_t pid, unsigned char flag, const char* kp,
                        Py_ssize_t klen) noexcept nogil:
    """Encode the frames into the (cache-warm) scratch buffer a piece at a time and pwrite
    each piece at ``pos``; 0 or an errno.  Every frame fits the scratch buffer."""
    cdef Py_ssize_t i = 0, j, fill, size
    cdef int err
    while i < count:
        j = i
        fill = 0
        while j < count:
            size = 38 + klen + lens[j]
            if fill + size > scratch_cap:
                break
            fill += size
            j += 1
        _encode_into(scratch, j - i, ptrs + i, lens + i, first + i, pt, pid, flag, kp, klen)
        err = _pwrite_all(fd, scratch, fill, pos)
        if err:
            return err
        pos += fill
        i = j
    return 0


cdef int _stamp_copy(unsigned char* dest, unsigned char* src, Py_ssize_t n, bint src_writable,
                     uint64_t first) noexcept nogil:
    """Stamp the caller's buffer when writable (it sees its offsets), copy it into the log,
    else stamp the log's copy only."""
    cdef Py_ssize_t count, error_pos
    cdef uint32_t error_len
    cdef int status = FRAME_OK
    if src_writable:
        status = stamp_frames(src, n, first, &count, &error_pos, &error_len)
        if status != FRAME_OK:
            return status
    memcpy(dest, src, n)
    if not src_writable:
        status = stamp_frames(dest, n, first, &count, &error_pos, &error_len)
    return status


cdef int _raise_errno(int err) except -1:
    raise OSError(err, os.strerror(err))


cdef class LogWriter:
    """The single writer of a log (contract: the pure twin's docstring).

    Compiled specifics.  Small appends are encoded straight into the file mapping
    (one store of every byte; with ``prefault_bytes`` the pages ahead are faulted in
    writable in one system call per window).  Batches of ``PWRITE_MIN_BYTES`` and
    more are encoded into a small cache-warm scratch buffer and written with
    ``pwrite``: a full-page write needs neither the read-fault (zero fill) nor the
    write-fault (page_mkwrite) a store through a shared mapping takes on each fresh
    page -- measured 3 GB/s against 0.8 GB/s (faults) and 1.6-1.9 GB/s (populated
    ahead) into a preallocated ext4 file.  Both land in the same page cache, so the
    mapping (readers, the ring) sees the bytes as soon as ``pwrite`` returns.
    """

    def __cinit__(self):
        self._scratch = NULL
        self._scratch_cap = 0

    def __dealloc__(self):
        free(self._scratch)

    def __init__(self, SegmentFile segment, FrameRing ring, rotate, *, max_file_age_s=None,
                 producer_id=0):
        self.segment = segment
        self.ring = ring
        self._rotate = rotate
        self.max_file_age_ms = None if max_file_age_s is None else int(max_file_age_s * 1000)
        self.producer_id = producer_id
        self.next_offset = segment.first_offset + segment.count
        self.armed = False
        self.on_append = None
        self.closed = False
        self.prefault_bytes = 0
        self._deadline_ms = self._deadline_for(segment)

    cdef int64_t _deadline_for(self, SegmentFile segment) except? -1:
        if self.max_file_age_ms is None:
            return <int64_t>1 << 62
        return segment.created_ms + <int64_t>self.max_file_age_ms

    def set_segment(self, SegmentFile segment):
        if segment.first_offset + segment.count != self.next_offset:
            raise WalError(f"new segment starts at {segment.next_offset}, log continues at {self.next_offset}")
        self.segment = segment
        self._deadline_ms = self._deadline_for(segment)

    def close(self):
        self.closed = True

    def rotation_due(self):
        return self.segment.count > 0 and _now_ms() >= self._deadline_ms

    cdef int _room_for(self, Py_ssize_t n, int64_t now) except -1:
        cdef SegmentFile seg = self.segment
        if self.closed:
            raise WalClosedError("the WAL is closed")
        if n > seg.capacity - seg.write_pos or (seg.count and now >= self._deadline_ms):
            self._rotate(n)
            seg = self.segment
            if n > seg.capacity - seg.write_pos:
                raise WalError(f"rotation left {seg.capacity - seg.write_pos} bytes free, {n} needed")
        return 0

    cdef inline int _mapped_write(self, SegmentFile seg, Py_ssize_t n) except -1:
        """About to store ``n`` bytes at the write position through the mapping."""
        if self.prefault_bytes and seg.write_pos + n > seg._prefaulted:
            self._prefault(seg, seg.write_pos + n)
        return 0

    cdef int _prefault(self, SegmentFile seg, Py_ssize_t end) except -1:
        """Fault ``[_prefaulted, end + prefault_bytes)`` in writable, in one system call.

        A shared file mapping otherwise takes a write fault (ext4 page_mkwrite) on the
        first store to every 4 KiB page: measured 0.8 GB/s for 138-byte frames, against
        1.6-1.9 GB/s with 1-4 MiB windows populated ahead.  The populated pages are dirty
        zeros until overwritten, so only sync=never uses it (a sync would write them).
        Advisory: any failure just leaves the faults to the stores.
        """
        global _populate_write_ok
        cdef Py_ssize_t start = max(seg._prefaulted, seg.write_pos)
        cdef Py_ssize_t stop = min(end + self.prefault_bytes, seg.capacity)
        cdef int rc
        start -= start % _PAGE
        if not _populate_write_ok or seg.base == NULL or not seg.writable or stop <= start:
            return 0
        seg._prefaulted = stop
        with nogil:
            rc = madvise(seg.base + start, stop - start, MADV_POPULATE_WRITE)
        if rc != 0 and c_errno == EINVAL:
            _populate_write_ok = False
        return 0

    cdef unsigned char* _scratch_for(self, Py_ssize_t need) except NULL:
        """The scratch buffer, at least ``need`` (and SCRATCH_BYTES) bytes."""
        cdef unsigned char* p
        need = max(need, SCRATCH_BYTES)
        if self._scratch_cap < need:
            p = <unsigned char*>realloc(self._scratch, need)
            if p == NULL:
                raise MemoryError()
            self._scratch = p
            self._scratch_cap = need
        return self._scratch

    cdef int _trim_scratch(self) except -1:
        """Give back a scratch buffer a huge frame grew."""
        if self._scratch_cap > 4 * SCRATCH_BYTES:
            free(self._scratch)
            self._scratch = NULL
            self._scratch_cap = 0
        return 0

    cdef int _publish(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t count,
                      const unsigned char* data) except -1:
        """The frames at ``pos`` are written (``data``: a copy of them to index from, NULL
        when already indexed): index, make visible, cache, wake."""
        cdef SegmentFile seg = self.segment
        cdef uint64_t first = self.next_offset
        if data != NULL:
            seg._index_batch(data, pos, n)
        seg.write_pos = pos + n
        seg._valid_end = pos + n
        seg.count += count
        self.ring.append_ref(seg._mm, pos, n, first, count)
        self.next_offset = first + count
        if self.armed:
            self.armed = False
            self.on_append()
        return 0

    cdef int _write_bytes(self, const unsigned char* src, Py_ssize_t n) except -1:
        """Write ``n`` bytes of frames at the write position (room already made)."""
        cdef SegmentFile seg = self.segment
        cdef Py_ssize_t pos = seg.write_pos
        cdef int err = 0
        if n >= PWRITE_MIN_BYTES:
            with nogil:
                err = _pwrite_all(seg._fd, src, n, pos)
            if err:
                _raise_errno(err)
        else:
            self._mapped_write(seg, n)
            memcpy(seg.base + pos, src, n)
        return 0

    def _write_encoded(self, data, Py_ssize_t count, int64_t now):
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t pos
        self._room_for(n, now)
        pos = self.segment.write_pos
        self._write_bytes(<const unsigned char*>PyBytes_AS_STRING(data), n)
        self._publish(pos, n, count, <const unsigned char*>PyBytes_AS_STRING(data))

    def append(self, payload, *, key=None, attributes=None, publish_time=None):
        """Append one record; return its offset."""
        cdef Py_buffer view
        cdef bint has_view = False
        cdef const char* p
        cdef const char* kp = NULL
        cdef Py_ssize_t plen, klen = 0, body_len, n, pos
        cdef int64_t now = _now_ms()
        cdef uint64_t pt, offset = self.next_offset
        cdef unsigned char* out
        cdef SegmentFile seg
        if attributes:
            frame = _encode_record(payload, offset=offset, publish_time=now if publish_time is None else publish_time,
                                   producer_id=self.producer_id, key=key, attributes=attributes)
            self._write_encoded(frame, 1, now)
            return offset
        pt = now if publish_time is None else publish_time
        if key is not None:
            key_b = (<str?>key).encode("utf-8")
            kp = PyBytes_AS_STRING(key_b)
            klen = PyBytes_GET_SIZE(key_b)
            if klen > 0xFFFF:
                raise FrameFormatError("routing key longer than 65535 bytes")
        if PyBytes_CheckExact(payload):
            p = PyBytes_AS_STRING(payload)
            plen = PyBytes_GET_SIZE(payload)
        else:
            PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
            has_view = True
            p = <const char*>view.buf
            plen = view.len
        try:
            body_len = 22 + klen + plen
            if body_len > FRAME_MAX_BODY:
                raise FrameFormatError(f"record body of {body_len} bytes exceeds {FRAME_MAX_BODY}")
            n = 16 + body_len
            self._room_for(n, now)
            seg = self.segment
            pos = seg.write_pos
            if n >= PWRITE_MIN_BYTES:
                self._append_large(p, plen, offset, pt, kp, klen)
            else:
                self._mapped_write(seg, n)
                out = seg.base + pos
                st64(out, offset)
                st32(out + 12, <uint32_t>body_len)
                st64(out + 16, pt)
                st64(out + 24, self.producer_id)
                out[32] = 1 if kp != NULL else 0
                out[33] = 0
                st16(out + 34, 0)
                st16(out + 36, <uint16_t>klen)
                if klen:
                    memcpy(out + 38, kp, klen)
                memcpy(out + 38 + klen, p, plen)
                st32(out + 8, crc32c_update(0, out + 12, 4 + body_len))
            seg._index_sizes(pos, n, 1, &plen, 38 + klen)
        finally:
            if has_view:
                PyBuffer_Release(&view)
        self._publish(pos, n, 1, NULL)
        return offset

    cdef int _append_large(self, const char* p, Py_ssize_t plen, uint64_t offset, uint64_t pt,
                           const char* kp, Py_ssize_t klen) except -1:
        cdef Py_ssize_t n = 38 + klen + plen
        cdef unsigned char* scratch = self._scratch_for(n)
        cdef int err
        cdef SegmentFile seg = self.segment
        cdef unsigned char flag = 1 if kp != NULL else 0
        with nogil:
            err = _encode_pwrite(seg._fd, seg.write_pos, scratch, self._scratch_cap, 1, &p, &plen,
                                 offset, pt, self.producer_id, flag, kp, klen)
        self._trim_scratch()
        if err:
            _raise_errno(err)
        return 0

    def append_payloads(self, payloads, *, key=None, attributes=None, publish_time=None):
        """Append payloads sharing key, attributes and publish time; return ``(first, last)``."""
        cdef tuple items
        cdef Py_ssize_t count, i, total, klen = 0, plen, pos, biggest = 0
        cdef const char** ptrs
        cdef Py_ssize_t* lens
        cdef const char* kp = NULL
        cdef int64_t now = _now_ms()
        cdef uint64_t pt, first = self.next_offset
        cdef uint64_t pid = self.producer_id
        cdef unsigned char* scratch
        cdef unsigned char flag
        cdef int err = 0
        cdef int fd
        cdef SegmentFile seg
        items = payloads if type(payloads) is tuple else tuple(payloads)
        count = len(items)
        if count == 0:
            raise ValueError("append_payloads needs at least one payload")
        if attributes:
            data = _encode_payloads(items, base_offset=first, publish_time=now if publish_time is None else publish_time,
                                    producer_id=self.producer_id, key=key, attributes=attributes)
            self._write_encoded(data, count, now)
            return first, first + count - 1
        pt = now if publish_time is None else publish_time
        if key is not None:
            key_b = (<str?>key).encode("utf-8")
            kp = PyBytes_AS_STRING(key_b)
            klen = PyBytes_GET_SIZE(key_b)
            if klen > 0xFFFF:
                raise FrameFormatError("routing key longer than 65535 bytes")
        flag = 1 if kp != NULL else 0
        for i in range(count):
            if not PyBytes_CheckExact(items[i]):
                items = tuple([x if PyBytes_CheckExact(x) else bytes(memoryview(x)) for x in items])
                break
        ptrs = <const char**>malloc(count * sizeof(char*))
        lens = <Py_ssize_t*>malloc(count * sizeof(Py_ssize_t))
        if ptrs == NULL or lens == NULL:
            free(ptrs)
            free(lens)
            raise MemoryError()
        try:
            total = 0
            for i in range(count):
                x = items[i]
                ptrs[i] = PyBytes_AS_STRING(x)
                plen = PyBytes_GET_SIZE(x)
                lens[i] = plen
                if 22 + klen + plen > FRAME_MAX_BODY:
                    raise FrameFormatError(f"record body of {22 + klen + plen} bytes exceeds {FRAME_MAX_BODY}")
                if plen > biggest:
                    biggest = plen
                total += 38 + klen + plen
            self._room_for(total, now)
            seg = self.segment
            pos = seg.write_pos
            if total >= PWRITE_MIN_BYTES:
                scratch = self._scratch_for(38 + klen + biggest)
                fd = seg._fd
                if total >= NOGIL_BYTES:
                    with nogil:
                        err = _encode_pwrite(fd, pos, scratch, self._scratch_cap, count, ptrs, lens,
                                             first, pt, pid, flag, kp, klen)
                else:
                    err = _encode_pwrite(fd, pos, scratch, self._scratch_cap, count, ptrs, lens,
                                         first, pt, pid, flag, kp, klen)
                self._trim_scratch()
                if err:
                    _raise_errno(err)
            else:
                self._mapped_write(seg, total)
                _encode_into(seg.base + pos, count, ptrs, lens, first, pt, pid, flag, kp, klen)
            seg._index_sizes(pos, total, count, lens, 38 + klen)
        finally:
            free(ptrs)
            free(lens)
        self._publish(pos, total, count, NULL)
        return first, first + count - 1

    def append_frames(self, buf):
        """Validate a frame batch, stamp it with the next offsets and append it; ``(first, last)``."""
        cdef Py_buffer view
        cdef bint writable = True
        cdef ValidateResult res
        cdef int status = FRAME_OK, err = 0
        cdef Py_ssize_t n, pos, count, error_pos
        cdef uint32_t error_len
        cdef uint64_t first
        cdef unsigned char* src
        cdef unsigned char* scratch
        cdef SegmentFile seg
        try:
            PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
        except BufferError:
            writable = False
            PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            n = view.len
            src = <unsigned char*>view.buf
            if n >= NOGIL_BYTES:
                with nogil:
                    status = validate_frames(src, n, 0, 0, False, &res)
            else:
                status = validate_frames(src, n, 0, 0, False, &res)
            if status != FRAME_OK:
                raise_validate_error(status, &res, -1)
            if res.count == 0:
                raise ValueError("append_frames needs at least one frame")
            self._room_for(n, _now_ms())
            first = self.next_offset
            seg = self.segment
            pos = seg.write_pos
            if n >= PWRITE_MIN_BYTES:
                if writable:
                    # the caller sees its offsets; the stamped bytes go out in one pwrite
                    with nogil:
                        status = stamp_frames(src, n, first, &count, &error_pos, &error_len)
                        if status == FRAME_OK:
                            err = _pwrite_all(seg._fd, src, n, pos)
                else:
                    scratch = self._scratch_for(n)
                    with nogil:
                        memcpy(scratch, src, n)
                        status = stamp_frames(scratch, n, first, &count, &error_pos, &error_len)
                        if status == FRAME_OK:
                            err = _pwrite_all(seg._fd, scratch, n, pos)
                    self._trim_scratch()
            else:
                self._mapped_write(seg, n)
                status = _stamp_copy(seg.base + pos, src, n, writable, first)
            if status != FRAME_OK:
                raise FrameFormatError(f"cannot stamp offsets from {first} (status {status})")
            if err:
                _raise_errno(err)
            seg._index_batch(src, pos, n)  # the lengths stamping does not change
        finally:
            PyBuffer_Release(&view)
        self._publish(pos, n, res.count, NULL)
        return first, first + res.count - 1

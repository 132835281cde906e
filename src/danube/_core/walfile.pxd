# C-level contract of danube._core.walfile.  Byte layout of a segment file: the
# comment block at the top of walfile.pyx (identical to danube/_pure/walfile.py).

from libc.stdint cimport int64_t, uint64_t

from danube._core.frame cimport IndexEntry
from danube._core.ring cimport FrameRing


cdef class SegmentFile:
    cdef readonly str path
    cdef int _fd
    cdef object _mm                 # the mmap.mmap object (readers' views keep it alive)
    cdef Py_buffer _view            # our own export of _mm: base pointer for writes
    cdef bint _has_view
    cdef unsigned char* base
    cdef readonly object seq
    cdef readonly uint64_t first_offset
    cdef readonly int64_t created_ms
    cdef readonly Py_ssize_t write_pos
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t capacity
    cdef readonly bint writable
    cdef readonly Py_ssize_t index_every
    cdef IndexEntry* _index
    cdef Py_ssize_t _index_len
    cdef Py_ssize_t _index_cap
    cdef Py_ssize_t _last_indexed
    cdef bint _indexed
    cdef Py_ssize_t _valid_end
    cdef Py_ssize_t _prefaulted     # bytes from 0 already faulted in writable (MADV_POPULATE_WRITE)
    cdef bint _trimmed              # trim() cut the preallocated tail already
    cdef readonly bint spare        # created by create_spare, header still zero until activate()

    cdef int _map(self, Py_ssize_t size, bint writable) except -1
    cdef int _unmap(self) except -1
    cdef int _init_empty(self, str path, object seq, uint64_t first_offset, int64_t created_ms,
                         Py_ssize_t index_every, bint spare) except -1
    cdef int _add_index(self, uint64_t offset, Py_ssize_t pos) except -1
    cdef int _index_batch(self, const unsigned char* data, Py_ssize_t pos, Py_ssize_t n) except -1
    cdef int _index_sizes(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t count, const Py_ssize_t* lens,
                          Py_ssize_t fixed) except -1
    cdef int _ensure_index(self) except -1
    cdef Py_ssize_t _position_of(self, uint64_t offset) except -2


cdef class LogWriter:
    cdef readonly SegmentFile segment
    cdef readonly FrameRing ring
    cdef object _rotate
    cdef public object on_append
    cdef public bint armed
    cdef readonly bint closed
    cdef readonly uint64_t next_offset
    cdef public uint64_t producer_id
    cdef readonly object max_file_age_ms
    cdef int64_t _deadline_ms
    cdef unsigned char* _scratch    # pwrite staging buffer (SCRATCH_BYTES, cache-warm)
    cdef Py_ssize_t _scratch_cap
    cdef public Py_ssize_t prefault_bytes   # fault in this much ahead of the write position (0: off)

    cdef int64_t _deadline_for(self, SegmentFile segment) except? -1
    cdef int _room_for(self, Py_ssize_t n, int64_t now) except -1
    cdef int _mapped_write(self, SegmentFile seg, Py_ssize_t n) except -1
    cdef int _prefault(self, SegmentFile seg, Py_ssize_t end) except -1
    cdef unsigned char* _scratch_for(self, Py_ssize_t need) except NULL
    cdef int _trim_scratch(self) except -1
    cdef int _write_bytes(self, const unsigned char* src, Py_ssize_t n) except -1
    cdef int _append_large(self, const char* p, Py_ssize_t plen, uint64_t offset, uint64_t pt,
                           const char* kp, Py_ssize_t klen) except -1
    cdef int _publish(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t count,
                      const unsigned char* data) except -1

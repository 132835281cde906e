# Declaration of LogWriter, implemented in wal/writer.pyx; part of
# walfile.pxd (included there, which cimports what it needs).

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
    cdef readonly bint last_stored          # the last append was stored through the mapping, not pwritten
    cdef public Py_ssize_t prefault_bytes   # fault in this much ahead of the write position (0: off)

    cdef int64_t _deadline_for(self, SegmentFile segment) except? -1
    cdef int _room_for(self, Py_ssize_t n, int64_t now) except -1
    cdef int _mapped_write(self, SegmentFile seg, Py_ssize_t n) except -1
    cdef int _prefault(self, SegmentFile seg, Py_ssize_t end) except -1
    cdef unsigned char* _scratch_for(self, Py_ssize_t need) except NULL
    cdef int _trim_scratch(self) except -1
    cdef int _write_bytes(self, const unsigned char* src, Py_ssize_t n) except -1
    cdef int _append_large(self, Piece* piece, uint64_t offset) except -1
    cdef int _publish(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t count,
                      const unsigned char* data) except -1

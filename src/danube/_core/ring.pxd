# C-level contract of danube._core.ring (cimported by walfile's LogWriter).
# Semantics and layout: the docstring of danube/_pure/ring.py.

from libc.stdint cimport uint32_t, uint64_t


cdef class _Span:
    cdef Py_buffer src              # our export of the source (keeps a mapping mapped)
    cdef bint has_src
    cdef const unsigned char* data  # src.buf + start: the span's first frame
    cdef Py_ssize_t start           # position of data in the source
    cdef Py_ssize_t used            # bytes of whole frames referenced
    cdef Py_ssize_t exports         # live buffer exports (reader views)
    cdef uint64_t first_offset
    cdef uint64_t next_offset
    cdef uint64_t* batch_first      # first offset of every appended batch, malloc'd
    cdef Py_ssize_t* batch_pos      # its position relative to data, malloc'd
    cdef Py_ssize_t nbatches
    cdef Py_ssize_t cap
    cdef int _add_batch(self, uint64_t first, Py_ssize_t pos) except -1


cdef class FrameRing:
    cdef readonly Py_ssize_t capacity_bytes
    cdef readonly Py_ssize_t chunk_bytes
    cdef list _spans                # of _Span, oldest first
    cdef Py_ssize_t _size
    cdef uint64_t _first
    cdef uint64_t _next

    # References n bytes of whole stamped frames at source[pos:pos + n] (no copy) holding
    # count consecutive offsets from first.  The bytes must never change afterwards.
    cdef int append_ref(self, object source, Py_ssize_t pos, Py_ssize_t n, uint64_t first,
                        Py_ssize_t count) except -1
    cdef int _reset(self, uint64_t next_offset) except -1
    cdef int _evict(self) except -1
    cdef _Span _frame_at(self, uint64_t offset, Py_ssize_t* batch, Py_ssize_t* start)
    cdef tuple _read(self, uint64_t offset, Py_ssize_t max_bytes)

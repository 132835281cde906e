# C-level contract of danube._core.ring (cimported by walfile's LogWriter).
# Semantics and layout: the docstring of danube/_pure/ring.py.

from libc.stdint cimport uint32_t, uint64_t


cdef class _Chunk:
    cdef unsigned char* data        # malloc'd; exported read-only through the buffer protocol
    cdef Py_ssize_t exports         # live buffer exports (reader views)
    cdef Py_ssize_t size
    cdef Py_ssize_t used
    cdef uint64_t first_offset
    cdef Py_ssize_t* positions      # start of every frame, malloc'd
    cdef Py_ssize_t count
    cdef Py_ssize_t cap
    cdef int _grow(self, Py_ssize_t need) except -1
    cdef Py_ssize_t frame_end(self, Py_ssize_t i) noexcept


cdef class FrameRing:
    cdef readonly Py_ssize_t capacity_bytes
    cdef readonly Py_ssize_t chunk_bytes
    cdef list _chunks               # of _Chunk, oldest first
    cdef list _spare                # evicted chunks no reader holds a view of, for reuse
    cdef Py_ssize_t _size
    cdef uint64_t _first
    cdef uint64_t _next

    # Copies n bytes of whole stamped frames holding offsets from first; returns the count.
    cdef Py_ssize_t append_raw(self, const unsigned char* p, Py_ssize_t n, uint64_t first) except -1
    cdef int _reset(self, uint64_t next_offset) except -1
    cdef int _evict(self) except -1
    cdef _Chunk _new_chunk(self, Py_ssize_t n, uint64_t first)

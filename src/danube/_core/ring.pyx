# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cache of the newest frames, bounded in bytes, with zero-copy reads by offset.

Layout and semantics: the docstring of ``danube/_pure/ring.py`` (the pure twin,
which must return the same bytes for the same calls).  In short: a list of
chunks filled with whole frames, a batch never split across chunks, whole
chunks dropped from the front when over capacity and never reused, so a
memoryview handed to a reader stays valid and unchanged while it holds it.

Thread safety comes from the GIL: every method runs without releasing it and
without calling back into Python while the ring is inconsistent.
"""

from cpython.buffer cimport (PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_FillInfo, PyObject_GetBuffer,
                             PyBuffer_Release)
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

HEADER_SIZE = 16
DEFAULT_CHUNK_BYTES = 1 << 20

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline uint32_t danube_ring_ld32(const unsigned char *p) {
        uint32_t v; memcpy(&v, p, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    """
    uint32_t ld32 "danube_ring_ld32"(const unsigned char* p) noexcept nogil

cdef object _EMPTY = memoryview(b"")

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(object o)

# Evicted chunks kept for reuse.  Reuse is only safe when no reader holds a view
# (no buffer exports, no other reference); it spares a 1 MiB allocation, its
# zeroing and its page faults per chunk, which dominated batch appends.
DEF MAX_SPARE = 2


cdef class _Chunk:
    def __cinit__(self, Py_ssize_t size, uint64_t first_offset):
        # not zeroed: only bytes below ``used`` are ever exposed
        self.data = <unsigned char*>malloc(size if size > 0 else 1)
        if self.data == NULL:
            raise MemoryError()
        self.exports = 0
        self.size = size
        self.used = 0
        self.first_offset = first_offset
        self.count = 0
        self.cap = 256
        self.positions = <Py_ssize_t*>malloc(self.cap * sizeof(Py_ssize_t))
        if self.positions == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.positions)
        free(self.data)

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("ring chunks are read-only")
        PyBuffer_FillInfo(view, self, self.data, self.used, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1

    cdef int _grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap = self.cap
        cdef Py_ssize_t* p
        while cap < need:
            cap *= 2
        p = <Py_ssize_t*>realloc(self.positions, cap * sizeof(Py_ssize_t))
        if p == NULL:
            raise MemoryError()
        self.positions = p
        self.cap = cap
        return 0

    cdef Py_ssize_t frame_end(self, Py_ssize_t i) noexcept:
        cdef Py_ssize_t p = self.positions[i]
        return p + 16 + ld32(self.data + p + 12)


cdef class FrameRing:
    """Newest frames in memory, bounded by ``capacity_bytes`` (0 disables the cache)."""

    def __init__(self, Py_ssize_t capacity_bytes, Py_ssize_t chunk_bytes=DEFAULT_CHUNK_BYTES,
                 next_offset=0):
        if capacity_bytes < 0 or chunk_bytes <= 0:
            raise ValueError("capacity_bytes must be >= 0 and chunk_bytes > 0")
        self.capacity_bytes = capacity_bytes
        self.chunk_bytes = min(chunk_bytes, capacity_bytes) if capacity_bytes else chunk_bytes
        self._chunks = []
        self._spare = []
        self._size = 0
        self._first = self._next = next_offset

    @property
    def first_offset(self):
        """Oldest offset held (equals ``next_offset`` when empty)."""
        return self._first

    @property
    def next_offset(self):
        return self._next

    @property
    def size_bytes(self):
        """Bytes of chunk memory held (the quantity bounded by the capacity)."""
        return self._size

    @property
    def chunk_count(self):
        return len(self._chunks)

    cdef int _reset(self, uint64_t next_offset) except -1:
        self._first = self._next = next_offset
        self._chunks = []
        self._size = 0
        return 0

    def reset(self, next_offset):
        """Drop everything; the next append must start at ``next_offset``."""
        self._reset(next_offset)

    cdef Py_ssize_t append_raw(self, const unsigned char* p, Py_ssize_t n, uint64_t first) except -1:
        cdef _Chunk chunk
        cdef Py_ssize_t base, pos, count, i
        if n <= 0:
            return 0
        if first != self._next:
            self._reset(first)
        if self.capacity_bytes == 0:
            count = 0
            pos = 0
            while pos < n:
                pos += 16 + ld32(p + pos + 12)
                count += 1
            self._first = self._next = first + count
            return count
        chunk = self._chunks[len(self._chunks) - 1] if self._chunks else None
        if chunk is None or chunk.size - chunk.used < n:
            chunk = self._new_chunk(n, first)
            self._chunks.append(chunk)
            self._size += chunk.size
        base = chunk.used
        memcpy(chunk.data + base, p, n)
        pos = 0
        count = chunk.count
        while pos < n:
            if count == chunk.cap:
                chunk._grow(count + 1)
            chunk.positions[count] = base + pos
            count += 1
            pos += 16 + ld32(p + pos + 12)
        i = count - chunk.count
        chunk.count = count
        chunk.used = base + n
        self._next = first + i
        if self._size > self.capacity_bytes:
            self._evict()
        return i

    cdef _Chunk _new_chunk(self, Py_ssize_t n, uint64_t first):
        cdef _Chunk chunk
        while self._spare:
            chunk = self._spare.pop()
            if chunk.size >= n and chunk.exports == 0 and Py_REFCNT(chunk) == 1:
                chunk.used = 0
                chunk.count = 0
                chunk.first_offset = first
                return chunk
        return _Chunk(max(self.chunk_bytes, n), first)

    cdef int _evict(self) except -1:
        cdef _Chunk dropped
        while self._size > self.capacity_bytes and len(self._chunks) > 1:
            dropped = self._chunks.pop(0)
            self._first = (<_Chunk>self._chunks[0]).first_offset
            self._size -= dropped.size
            if dropped.size == self.chunk_bytes and len(self._spare) < MAX_SPARE:
                self._spare.append(dropped)
        return 0

    def append(self, frames, first_offset):
        """Copy whole, stamped frames holding offsets from ``first_offset``; return the count."""
        cdef Py_buffer view
        PyObject_GetBuffer(frames, &view, PyBUF_SIMPLE)
        try:
            return self.append_raw(<const unsigned char*>view.buf, view.len, first_offset)
        finally:
            PyBuffer_Release(&view)

    def contains(self, uint64_t offset):
        return self._first <= offset < self._next

    def read(self, uint64_t offset, Py_ssize_t max_bytes):
        """Whole frames from ``offset`` as a memoryview (at least one frame, then up to ``max_bytes``).

        ``None`` when the ring does not hold ``offset``; an empty view at ``next_offset``.
        """
        cdef list chunks = self._chunks
        cdef Py_ssize_t lo, hi, mid, nchunks, index, last_index, start
        cdef _Chunk chunk
        if offset == self._next:
            return _EMPTY
        if offset < self._first or offset > self._next:
            return None
        nchunks = len(chunks)
        # newest chunk first: live readers almost always want it
        chunk = chunks[nchunks - 1]
        if offset < chunk.first_offset:
            lo, hi = 0, nchunks - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if (<_Chunk>chunks[mid]).first_offset <= offset:
                    lo = mid
                else:
                    hi = mid - 1
            chunk = chunks[lo]
        index = <Py_ssize_t>(offset - chunk.first_offset)
        if index >= chunk.count:
            return None
        last_index = chunk.count
        start = chunk.positions[index]
        lo, hi = index + 1, last_index
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chunk.frame_end(mid - 1) - start <= max_bytes:
                lo = mid
            else:
                hi = mid - 1
        return memoryview(chunk)[start:chunk.frame_end(lo - 1)]


def count_frames(buf):
    """Number of frames in a buffer of whole frames (lengths trusted)."""
    cdef Py_buffer view
    cdef Py_ssize_t pos = 0, count = 0
    cdef const unsigned char* p
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char*>view.buf
        while pos + 16 <= view.len:
            pos += 16 + ld32(p + pos + 12)
            count += 1
        return count
    finally:
        PyBuffer_Release(&view)

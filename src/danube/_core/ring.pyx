# cython: language_level=3, cdivision=True
"""Cache of the newest frames, bounded in bytes, with zero-copy reads by offset.

Layout and semantics: the docstring of ``danube/_pure/ring.py`` (the pure twin,
which must return the same bytes for the same calls).  In short: a list of
spans, each referencing (never copying) a contiguous run of whole frames in a
source buffer -- for the WAL, the segment's file mapping the frames were just
written to -- with one entry per appended batch; whole spans dropped from the
front when over capacity.  A span keeps its source exported (so a mapping
stays mapped) while it or a reader's view of it lives, and the referenced
bytes never change, so a memoryview handed to a reader stays valid and
unchanged while it holds it.

Thread safety comes from the GIL: every method runs without releasing it and
without calling back into Python while the ring is inconsistent.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_FillInfo, PyObject_GetBuffer, PyBuffer_Release
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc, realloc

from danube._core.frame cimport FIELDS_OK_STATUS, FRAME_BODY_LEN_AT, FRAME_HEADER_SIZE, check_fields_frames
from danube._core.le cimport ld32

HEADER_SIZE = FRAME_HEADER_SIZE
DEFAULT_CHUNK_BYTES = 1 << 20

cdef object _EMPTY = memoryview(b"")


cdef class _Span:
    def __cinit__(self):
        self.has_src = False
        self.exports = 0
        self.nbatches = 0
        self.cap = 16
        self.batch_first = <uint64_t*>malloc(self.cap * sizeof(uint64_t))
        self.batch_pos = <Py_ssize_t*>malloc(self.cap * sizeof(Py_ssize_t))
        if self.batch_first == NULL or self.batch_pos == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.batch_first)
        free(self.batch_pos)
        if self.has_src:
            self.has_src = False
            PyBuffer_Release(&self.src)

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("ring spans are read-only")
        PyBuffer_FillInfo(view, self, <void*>self.data, self.used, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1

    cdef int _add_batch(self, uint64_t first, Py_ssize_t pos) except -1:
        cdef Py_ssize_t cap
        cdef uint64_t* f
        cdef Py_ssize_t* p
        if self.nbatches == self.cap:
            cap = self.cap * 2
            f = <uint64_t*>realloc(self.batch_first, cap * sizeof(uint64_t))
            if f == NULL:
                raise MemoryError()
            self.batch_first = f
            p = <Py_ssize_t*>realloc(self.batch_pos, cap * sizeof(Py_ssize_t))
            if p == NULL:
                raise MemoryError()
            self.batch_pos = p
            self.cap = cap
        self.batch_first[self.nbatches] = first
        self.batch_pos[self.nbatches] = pos
        self.nbatches += 1
        return 0


cdef Py_ssize_t _count(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t pos = 0, count = 0
    while pos + FRAME_HEADER_SIZE <= n:
        pos += FRAME_HEADER_SIZE + ld32(p + pos + FRAME_BODY_LEN_AT)
        count += 1
    return count


cdef class FrameRing:
    """Newest frames, bounded by ``capacity_bytes`` referenced (0 disables the cache)."""

    def __init__(self, Py_ssize_t capacity_bytes, Py_ssize_t chunk_bytes=DEFAULT_CHUNK_BYTES,
                 next_offset=0):
        if capacity_bytes < 0 or chunk_bytes <= 0:
            raise ValueError("capacity_bytes must be >= 0 and chunk_bytes > 0")
        self.capacity_bytes = capacity_bytes
        self.chunk_bytes = min(chunk_bytes, capacity_bytes) if capacity_bytes else chunk_bytes
        self._spans = []
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
        """Bytes of frames referenced (the quantity bounded by the capacity)."""
        return self._size

    @property
    def chunk_count(self):
        return len(self._spans)

    cdef int _reset(self, uint64_t next_offset) except -1:
        self._first = self._next = next_offset
        self._spans = []
        self._size = 0
        return 0

    def reset(self, next_offset):
        """Drop everything; the next append must start at ``next_offset``."""
        self._reset(next_offset)

    cdef int append_ref(self, object source, Py_ssize_t pos, Py_ssize_t n, uint64_t first,
                        Py_ssize_t count) except -1:
        cdef _Span span = None
        cdef list spans = self._spans
        if n <= 0:
            return 0
        if first != self._next:
            self._reset(first)
            spans = self._spans
        if self.capacity_bytes == 0:
            self._first = self._next = first + count
            return 0
        if spans:
            span = <_Span>spans[len(spans) - 1]
            if not (<void*>span.src.obj == <void*>source and pos == span.start + span.used
                    and span.used + n <= self.chunk_bytes and pos + n <= span.src.len):
                span = None
        if span is None:
            span = _Span.__new__(_Span)
            PyObject_GetBuffer(source, &span.src, PyBUF_SIMPLE)
            span.has_src = True
            if pos < 0 or pos + n > span.src.len:
                raise ValueError("frames outside the source buffer")
            span.start = pos
            span.data = <const unsigned char*>span.src.buf + pos
            span.used = 0
            span.first_offset = first
            span.next_offset = first
            spans.append(span)
        # readers snapshot the ring's next offset first: publish it last
        span._add_batch(first, span.used)
        span.used += n
        span.next_offset = first + count
        self._size += n
        self._next = first + count
        if self._size > self.capacity_bytes:
            self._evict()
        return 0

    cdef int _evict(self) except -1:
        cdef _Span dropped
        cdef list spans = self._spans
        while self._size > self.capacity_bytes and len(spans) > 1:
            dropped = <_Span>spans[0]
            self._first = (<_Span>spans[1]).first_offset
            del spans[0]
            self._size -= dropped.used
        return 0

    def append(self, frames, first_offset, count=None):
        """Reference all of ``frames`` (whole stamped frames from ``first_offset``, bytes that
        never change); return the frame count."""
        return self.append_from(frames, 0, -1, first_offset, count)

    def append_from(self, source, Py_ssize_t pos, Py_ssize_t n, first_offset, count=None):
        """Reference ``source[pos:pos + n]`` (``n`` -1: to the end), whole stamped frames
        from ``first_offset``; return the frame count (``count`` when given: trusted)."""
        cdef Py_buffer view
        cdef Py_ssize_t c
        PyObject_GetBuffer(source, &view, PyBUF_SIMPLE)
        try:
            if n < 0:
                n = view.len - pos
            if pos < 0 or n < 0 or pos + n > view.len:
                raise ValueError("frames outside the source buffer")
            c = _count(<const unsigned char*>view.buf + pos, n) if count is None else count
        finally:
            PyBuffer_Release(&view)
        self.append_ref(source, pos, n, first_offset, c)
        return c

    def contains(self, uint64_t offset):
        return self._first <= offset < self._next

    cdef _Span _frame_at(self, uint64_t offset, Py_ssize_t* batch, Py_ssize_t* start):
        """The span holding ``offset`` (``_first`` <= offset < ``_next``), with the index of the
        batch it is in and the position of its frame; None when no span holds it."""
        cdef list spans = self._spans
        cdef Py_ssize_t lo, hi, mid, nspans = len(spans), pos
        cdef uint64_t off
        cdef const unsigned char* data
        # newest span first: live readers almost always want it
        cdef _Span span = <_Span>spans[nspans - 1]
        if offset < span.first_offset:
            lo, hi = 0, nspans - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if (<_Span>spans[mid]).first_offset <= offset:
                    lo = mid
                else:
                    hi = mid - 1
            span = <_Span>spans[lo]
        if offset >= span.next_offset:
            return None
        lo, hi = 0, span.nbatches - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if span.batch_first[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        data = span.data
        pos = span.batch_pos[lo]
        off = span.batch_first[lo]
        while off < offset:
            pos += FRAME_HEADER_SIZE + ld32(data + pos + FRAME_BODY_LEN_AT)
            off += 1
        batch[0] = lo
        start[0] = pos
        return span

    cdef tuple _read(self, uint64_t offset, Py_ssize_t max_bytes):
        """``(view, count)``; None when not held."""
        cdef Py_ssize_t lo, hi, mid, nb, b, start, end, nxt, limit
        cdef uint64_t off, stop
        cdef const unsigned char* data
        cdef _Span span
        if offset == self._next:
            return (_EMPTY, 0)
        if offset < self._first or offset > self._next:
            return None
        span = self._frame_at(offset, &b, &start)
        if span is None:
            return None
        stop = span.next_offset
        nb = span.nbatches
        data = span.data
        # whole batches first (their ends are known: no walk over the frames), then frames
        limit = start + max_bytes
        end = start + FRAME_HEADER_SIZE + ld32(data + start + FRAME_BODY_LEN_AT)
        off = offset + 1
        if b + 1 < nb and span.batch_pos[b + 1] <= limit:
            lo, hi = b + 1, nb - 1       # the last batch start within the budget
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if span.batch_pos[mid] <= limit:
                    lo = mid
                else:
                    hi = mid - 1
            end = span.batch_pos[lo]
            off = span.batch_first[lo]
            b = lo - 1
        if b + 1 == nb - 1 and end == span.batch_pos[nb - 1] and span.used <= limit:
            end = span.used            # and the newest batch too
            off = stop
        elif b + 1 == nb and span.used <= limit:
            end = span.used
            off = stop
        while off < stop:
            nxt = end + FRAME_HEADER_SIZE + ld32(data + end + FRAME_BODY_LEN_AT)
            if nxt > limit:
                break
            end = nxt
            off += 1
        return (memoryview(span)[start:end], <Py_ssize_t>(off - offset))

    def read(self, uint64_t offset, Py_ssize_t max_bytes):
        """Whole frames from ``offset`` as a memoryview (at least one frame, then up to ``max_bytes``).

        ``None`` when the ring does not hold ``offset``; an empty view at ``next_offset``.
        """
        got = self._read(offset, max_bytes)
        return None if got is None else got[0]

    def read_counted(self, uint64_t offset, Py_ssize_t max_bytes):
        """``read`` as ``(view, frame count)``; None when the ring does not hold ``offset``."""
        return self._read(offset, max_bytes)

    def read_deliverable(self, uint64_t offset, Py_ssize_t max_messages, Py_ssize_t max_bytes):
        """``(view, count)``: whole frames from ``offset``, at least one, at most ``max_messages``,
        then up to ``max_bytes``, each one a subscriber can decode (``check_fields``); None when
        the ring does not hold ``offset`` (or it is ``next_offset``), ``max_messages`` < 1, or a
        frame of that cut fails the check."""
        cdef Py_ssize_t b, start, end, nxt, limit, count
        cdef Py_ssize_t error_pos = -1
        cdef uint64_t off, stop
        cdef const unsigned char* data
        cdef _Span span
        if max_messages < 1 or offset < self._first or offset >= self._next:
            return None
        span = self._frame_at(offset, &b, &start)
        if span is None:
            return None
        stop = span.next_offset
        data = span.data
        # frame by frame: a delivery is cut by messages as well as bytes
        limit = start + max_bytes
        end = start + FRAME_HEADER_SIZE + ld32(data + start + FRAME_BODY_LEN_AT)
        count = 1
        off = offset + 1
        while off < stop and count < max_messages:
            nxt = end + FRAME_HEADER_SIZE + ld32(data + end + FRAME_BODY_LEN_AT)
            if nxt > limit:
                break
            end = nxt
            off += 1
            count += 1
        if check_fields_frames(data + start, end - start, False, 0, &error_pos) != FIELDS_OK_STATUS:
            return None
        return (memoryview(span)[start:end], count)


def count_frames(buf):
    """Number of frames in a buffer of whole frames (lengths trusted)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        return _count(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)

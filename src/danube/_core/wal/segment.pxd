# Declaration of SegmentFile, implemented in wal/segment.pyx; part of
# walfile.pxd (included there, which cimports what it needs).

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
    cdef readonly Py_ssize_t capacity   # bytes the writer may fill: reserved on disk (<= map_size)
    cdef readonly Py_ssize_t map_size   # bytes mapped (the file's size; beyond capacity a hole)
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
    cdef int _create_space(self, Py_ssize_t size, object reserve) except -1
    cdef int _init_empty(self, str path, object seq, uint64_t first_offset, int64_t created_ms,
                         Py_ssize_t index_every, bint spare) except -1
    cdef int _add_index(self, uint64_t offset, Py_ssize_t pos) except -1
    cdef int _index_batch(self, const unsigned char* data, Py_ssize_t pos, Py_ssize_t n) except -1
    cdef int _index_sizes(self, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t count, const Py_ssize_t* lens,
                          Py_ssize_t fixed) except -1
    cdef int _ensure_index(self) except -1
    cdef int _rearm_range(self, Py_ssize_t ahead, Py_ssize_t* start, Py_ssize_t* stop) except -1
    cdef Py_ssize_t _position_of(self, uint64_t offset) except -2

# The segment file: SegmentFile (file header codec, shared mapping, sparse
# offset -> position index, recovery scan and trim).  Part of danube._core.walfile
# (included by walfile.pyx; declared in wal/segment.pxd); pure twin:
# danube/_pure/wal/segment.py, whose docstring describes the segment file byte by
# byte (the one description) and the contract of every method.
#
# Compiled specifics: files are not MAP_POPULATEd (that read-faulted the whole file
# at open and at each rotation); recovery scans and trims with the GIL released;
# frames are walked with frame.pxd's field positions, never raw offsets.


FILE_MAGIC = b"DNBWAL\x00\x01"
FILE_VERSION = 1
FILE_HEADER_SIZE = 64
DEF HEADER = 64                 # FILE_HEADER_SIZE, for C expressions
_FILE_HEADER = struct.Struct("<8sIIQQQ")
_U32 = struct.Struct("<I")


def segment_file_name(seq):
    return f"wal-{seq:020d}.log"


def parse_segment_file_name(str name):
    """The sequence number of a segment file name, or None for any other name."""
    if len(name) == 28 and name.startswith("wal-") and name.endswith(".log") and name[4:24].isdigit():
        return int(name[4:24])
    return None


def encode_file_header(seq, first_offset, created_ms):
    head = _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, FILE_HEADER_SIZE, seq, first_offset, created_ms)
    head += bytes(60 - len(head))
    return head + _U32.pack(_frame.crc32c(head))


def decode_file_header(buf, path=None):
    """``(seq, first_offset, created_ms)`` of a segment file header; raises on a bad header."""
    mv = memoryview(buf).cast("B")
    if len(mv) < FILE_HEADER_SIZE:
        raise CorruptStoredFrameError("WAL file header truncated", position=0, offset=None,
                                      expected_crc=None, actual_crc=None, path=path)
    magic, version, header_size, seq, first_offset, created_ms = _FILE_HEADER.unpack_from(mv, 0)
    (stored,) = _U32.unpack_from(mv, 60)
    actual = _frame.crc32c(mv[:60])
    if magic != FILE_MAGIC:
        raise CorruptStoredFrameError("not a danube WAL file (bad magic)", position=0, offset=None,
                                      expected_crc=None, actual_crc=None, path=path)
    if stored != actual:
        raise CorruptStoredFrameError("WAL file header checksum mismatch", position=0, offset=None,
                                      expected_crc=stored, actual_crc=actual, path=path)
    if version != FILE_VERSION or header_size != FILE_HEADER_SIZE:
        raise CorruptStoredFrameError(f"unsupported WAL file version {version}", position=0, offset=None,
                                      expected_crc=None, actual_crc=None, path=path)
    return seq, first_offset, created_ms


def preallocate(int fd, Py_ssize_t size):
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


cdef int _reserve_range(int fd, Py_ssize_t start, Py_ssize_t length) except -1:
    """Allocate ``[start, start + length)`` of a file already that long (a hole: zeros);
    a file system without ``posix_fallocate`` leaves it to writeback (as ``preallocate``)."""
    if length <= 0:
        return 0
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    return 0


cdef Py_ssize_t _data_end(int fd, Py_ssize_t start, Py_ssize_t size):
    """End of the last data region in ``[start, size)`` (holes read as zeros and cannot hold a
    torn tail), ``start`` when there is none; ``size`` when the file system cannot tell."""
    cdef Py_ssize_t pos = start, last = start, d, h
    try:
        while pos < size:
            d = os.lseek(fd, pos, os.SEEK_DATA)
            if d >= size:
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            last = min(h, size)
            pos = h
    except OSError as exc:
        if exc.errno != errno.ENXIO:   # ENXIO: no data after pos
            return size
    except AttributeError:             # no SEEK_DATA on this platform
        return size
    return last


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
        self.map_size = size
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
                p += FRAME_HEADER_SIZE + ld32(data + p + FRAME_BODY_LEN_AT)
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
               Py_ssize_t index_every=65536, reserve=None, bint read_around=True):
        cdef SegmentFile seg = SegmentFile.__new__(SegmentFile)
        capacity = max(capacity, HEADER + FRAME_HEADER_SIZE)
        created_ms = _now_ms() if created_ms is None else created_ms
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        seg._fd = fd
        try:
            seg._create_space(capacity, reserve)
            if not read_around:
                # the header's store faults its page in without the kernel's read-around, which
                # would fill the file's first megabytes with zero pages the writer's prefault
                # (sync=never) then pays 1.3 us a page to make writable, 0.4 us otherwise
                madvise(seg.base, _PAGE, MADV_RANDOM)
            memcpy(seg.base, PyBytes_AS_STRING(encode_file_header(seq, first_offset, created_ms)), HEADER)
            if not read_around:
                madvise(seg.base, _PAGE, MADV_NORMAL)
        except BaseException:
            seg.close()
            raise
        seg._init_empty(path, seq, first_offset, created_ms, index_every, False)
        return seg

    cdef int _create_space(self, Py_ssize_t size, object reserve) except -1:
        """Size a new file and map it: reserved whole (``reserve`` None), or sparse to ``size``
        with only ``[0, reserve)`` allocated, which is then all the writer may fill until
        ``reserve()`` grows it."""
        cdef Py_ssize_t r
        if reserve is None or reserve >= size:
            preallocate(self._fd, size)
            self._map(size, True)
            return 0
        r = max(<Py_ssize_t>reserve, HEADER + FRAME_HEADER_SIZE)
        os.ftruncate(self._fd, size)
        _reserve_range(self._fd, 0, r)
        self._map(size, True)
        self.capacity = r
        return 0

    def reserve(self, Py_ssize_t capacity):
        """Reserve disk up to ``capacity`` bytes (at most the mapped size) for the writer;
        returns the new capacity.  A full disk raises ``WalError`` here, before any store
        could touch an unallocated page (which would be a SIGBUS)."""
        if self.base == NULL or not self.writable:
            raise WalClosedError(f"segment {self.path} is not writable")
        capacity = min(capacity, self.map_size)
        if capacity > self.capacity:
            try:
                _reserve_range(self._fd, self.capacity, capacity - self.capacity)
            except OSError as exc:
                raise WalError(f"segment {self.path}: reserving disk up to {capacity} bytes failed: "
                               f"{exc.strerror}") from exc
            self.capacity = capacity
        return self.capacity

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
    def create_spare(cls, str path, seq, Py_ssize_t capacity, *, Py_ssize_t index_every=65536,
                     reserve=None):
        """A preallocated file with an all-zero header, to become the active file later
        (``activate``); recovery deletes it while its header is still zero.  ``reserve``:
        as ``create``."""
        cdef SegmentFile seg = SegmentFile.__new__(SegmentFile)
        capacity = max(capacity, HEADER + FRAME_HEADER_SIZE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        seg._fd = fd
        try:
            seg._create_space(capacity, reserve)
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

    cdef int _rearm_range(self, Py_ssize_t ahead, Py_ssize_t* start, Py_ssize_t* stop) except -1:
        """1 with ``[start, stop)`` the pages :meth:`rearm` faults in, 0 when there is nothing to do."""
        cdef Py_ssize_t pos = self.write_pos
        if self.base == NULL or not self.writable or not _populate_write_ok or self._mm is None:
            return 0
        if pos % _PAGE == 0 and ahead <= 0:
            return 0  # the write position starts a fresh page: nothing there was written back
        start[0] = pos - pos % _PAGE
        # never past the bytes the writer may fill (beyond them the file may be a hole)
        stop[0] = min(max(pos + ahead, start[0] + 1), self.capacity)
        stop[0] = (stop[0] + _PAGE - 1) // _PAGE * _PAGE
        return 1 if stop[0] > start[0] else 0

    def rearm(self, Py_ssize_t ahead=0):
        """After a sync: take the write fault of the page holding the last frame's end (and of
        those up to ``ahead`` bytes past the write position) now, on the calling thread, so the
        writer's next store there does not; True when done.

        Writeback write-protects every page it cleans, so the first store after each sync into
        a partly filled page faults, and the fault dirties the inode too (a timestamp update in
        the file system's journal): several microseconds, on the event loop, once per log per
        round (``bench/append_after_sync.py``).  A sync thread can take it instead.  No byte
        changes (MADV_POPULATE_WRITE only faults pages in): the page is dirty again, so the next
        sync writes it again -- the writer fills it anyway unless the log goes idle.  Advisory:
        False when the file is not mapped for writing, the kernel lacks MADV_POPULATE_WRITE or
        refuses.  Any thread: the mapping is held by a buffer export while the GIL is released,
        so closing the file meanwhile only defers the unmap."""
        return rearm_many((self,), ahead) == 1

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
            last = _data_end(fd, end, size)   # not the holes: a sparse 64 MiB tail is not read
            with nogil:
                while last > end and last - 8 >= end and (<uint64_t*>(seg.base + last - 8))[0] == 0 \
                        and ((last & 7) == 0):
                    last -= 8
                while last > end and seg.base[last - 1] == 0:
                    last -= 1
            trimmed = last - end
            if trimmed:
                if writable:
                    with nogil:  # the file is not shared yet; a torn tail can be megabytes
                        memset(seg.base + end, 0, last - end)
                    seg._mm.flush(end - end % mmap.PAGESIZE, trimmed + end % mmap.PAGESIZE)
                else:
                    os.pwrite(fd, bytes(trimmed), end)
                    os.fdatasync(fd)
        seg.write_pos = end
        seg._valid_end = end
        seg.count = res.count
        seg.writable = writable
        if writable:
            # what is allocated beyond the data is unknown (a hole after a suspend or a growth in
            # steps): the writer gets the page after its data and reserves more before storing
            seg.capacity = min(size, (end + _PAGE - 1) // _PAGE * _PAGE)
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
            if pos + FRAME_HEADER_SIZE > end:
                return -1
            pos += FRAME_HEADER_SIZE + ld32(self.base + pos + FRAME_BODY_LEN_AT)
            off += 1
        return pos if pos + FRAME_HEADER_SIZE <= end else -1

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
        while off < stop and p + FRAME_HEADER_SIZE <= end_limit:
            nxt = p + FRAME_HEADER_SIZE + ld32(self.base + p + FRAME_BODY_LEN_AT)
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
                raise CorruptStoredFrameError(f"corrupt WAL data: {exc}", position=pos + res.error_pos,
                                              offset=getattr(exc, "offset", offset),
                                              expected_crc=getattr(exc, "expected_crc", None),
                                              actual_crc=getattr(exc, "actual_crc", None), path=self.path) from exc
        return out

    def _raise_corrupt(self, offset):
        raise CorruptStoredFrameError("WAL file is corrupt before the requested offset", position=self._valid_end,
                                      offset=offset, expected_crc=None, actual_crc=None, path=self.path)


def rearm_many(files, Py_ssize_t ahead=0):
    """:meth:`SegmentFile.rearm` of several files (a sync round's logs) with the GIL released once
    for all of them; how many were done.  One release per file meant one wait to get the GIL
    back from a busy event loop per log, between back-to-back rounds (docs/wal.md)."""
    global _populate_write_ok
    cdef Py_ssize_t n = len(files)
    cdef Py_ssize_t k = 0, i, done = 0
    cdef Py_buffer* pins = NULL
    cdef Py_ssize_t* ranges = NULL
    cdef int* errs = NULL
    cdef SegmentFile seg
    if n == 0 or not _populate_write_ok:
        return 0
    pins = <Py_buffer*>malloc(n * sizeof(Py_buffer))
    ranges = <Py_ssize_t*>malloc(2 * n * sizeof(Py_ssize_t))
    errs = <int*>malloc(n * sizeof(int))
    try:
        if pins == NULL or ranges == NULL or errs == NULL:
            raise MemoryError()
        for f in files:
            seg = <SegmentFile?>f
            if k >= n or seg._rearm_range(ahead, &ranges[2 * k], &ranges[2 * k + 1]) == 0:
                continue
            # the buffer export holds the mapping while the GIL is released: a close meanwhile
            # only defers the unmap
            PyObject_GetBuffer(seg._mm, &pins[k], PyBUF_SIMPLE)
            k += 1
        with nogil:
            for i in range(k):
                errs[i] = 0
                if madvise(<unsigned char*>pins[i].buf + ranges[2 * i], ranges[2 * i + 1] - ranges[2 * i],
                           MADV_POPULATE_WRITE) != 0:
                    errs[i] = c_errno
        for i in range(k):
            if errs[i] == 0:
                done += 1
            elif errs[i] == EINVAL:
                _populate_write_ok = False
        return done
    finally:
        for i in range(k):
            PyBuffer_Release(&pins[i])
        free(pins)
        free(ranges)
        free(errs)

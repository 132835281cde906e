# The writer: LogWriter (offsets, room and rotation, the pwrite scratch buffer,
# prefaulting, publishing to the ring).  Part of danube._core.walfile (included by
# walfile.pyx; declared in wal/writer.pxd); pure twin: danube/_pure/wal/writer.py,
# whose docstring is the contract.  Frames are encoded by frame.pxd's write_frame,
# the one frame encoder; this file holds no byte layout of its own.

DEF PWRITE_MIN_BYTES = 16384    # batches this big go through pwrite (see LogWriter)
DEF SCRATCH_BYTES = 262144      # the pwrite staging buffer: stays in L2

cdef object _encode_record = _frame.encode_record
cdef object _encode_payloads = _frame.encode_payloads


cdef inline void _plain_piece(Piece* piece, uint64_t publish_time, uint64_t producer_id,
                              const char* key, Py_ssize_t key_len) noexcept nogil:
    """A record without attributes: key (NULL for none) and the fixed fields; no payload yet."""
    piece.publish_time = publish_time
    piece.producer_id = producer_id
    piece.key = <const unsigned char*>key
    piece.key_len = key_len
    piece.flags = FRAME_FLAG_HAS_KEY if key != NULL else 0
    piece.attrs = NULL
    piece.attrs_len = 0
    piece.attr_count = 0
    piece.payload = NULL
    piece.payload_len = 0


cdef Py_ssize_t _encode_into(unsigned char* out, Piece* piece, Py_ssize_t count, const char** ptrs,
                             const Py_ssize_t* lens, uint64_t first) noexcept nogil:
    """Encode ``count`` frames sharing everything of ``piece`` but the payload, back to back
    at ``out``, offsets from ``first``; returns the bytes written."""
    cdef Py_ssize_t i, written = 0
    for i in range(count):
        piece.payload = <const unsigned char*>ptrs[i]
        piece.payload_len = lens[i]
        written += write_frame(out + written, first + <uint64_t>i, piece)
    return written


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
                        Piece* piece, Py_ssize_t count, const char** ptrs, const Py_ssize_t* lens,
                        uint64_t first) noexcept nogil:
    """Encode the frames (``_encode_into``) into the (cache-warm) scratch buffer a piece at a
    time and pwrite each piece at ``pos``; 0 or an errno.  Every frame fits the scratch buffer."""
    cdef Py_ssize_t i = 0, j, fill
    cdef Py_ssize_t fixed = FRAME_HEADER_SIZE + piece_body_len(piece) - piece.payload_len
    cdef int err
    while i < count:
        j = i
        fill = 0
        while j < count and fill + fixed + lens[j] <= scratch_cap:
            fill += fixed + lens[j]
            j += 1
        _encode_into(scratch, piece, j - i, ptrs + i, lens + i, first + <uint64_t>i)
        err = _pwrite_all(fd, scratch, fill, pos)
        if err:
            return err
        pos += fill
        i = j
    return 0


DEF ZERO_CHUNK = 65536          # _write_zeros: one zero buffer, repeated in an iovec
DEF ZERO_IOVECS = 64            # 4 MiB a system call
cdef unsigned char _ZEROS[ZERO_CHUNK]   # static: stays zero (never written)


cdef int _write_zeros(int fd, Py_ssize_t pos, Py_ssize_t n) noexcept nogil:
    """Write ``n`` zero bytes at ``pos`` (``pwritev`` of one zero buffer, 4 MiB a call);
    0 or an errno."""
    cdef iovec iov[ZERO_IOVECS]
    cdef int cnt
    cdef Py_ssize_t left, done
    while n > 0:
        left = n
        cnt = 0
        while cnt < ZERO_IOVECS and left > 0:
            iov[cnt].iov_base = <void*>_ZEROS
            iov[cnt].iov_len = <size_t>min(left, ZERO_CHUNK)
            left -= <Py_ssize_t>iov[cnt].iov_len
            cnt += 1
        done = pwritev(fd, iov, cnt, <off_t>pos)
        if done < 0:
            if c_errno == EINTR:
                continue
            return c_errno
        if done == 0:
            return EIO
        pos += done
        n -= done
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
        self.last_stored = False
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
        """Fault ``[_prefaulted, end + prefault_bytes)`` in writable, a few system calls for
        the whole window: zeros written into the file there (``pwritev``, 4 MiB a call), then
        the pages mapped writable in one call (MADV_POPULATE_WRITE), with read-ahead off for
        the window meanwhile (MADV_RANDOM, back to MADV_NORMAL after).

        A shared file mapping otherwise takes a write fault (ext4 page_mkwrite) on the
        first store to every 4 KiB page: measured 0.8 GB/s for 138-byte frames, against
        1.6-1.9 GB/s with 1-4 MiB windows populated ahead.  Populating alone still reads
        every page in first (zero-filled, read-ahead running ahead of the writer) and then
        takes the write-fault path: 1.3-1.4 us a page on this VM, 45-50 ns of every 100 B
        append.  The write path makes the pages in bulk, and with read-ahead off mapping
        them is cheap: ~0.4 us a page, ~12 ns an append, once the file's header was stored
        without read-around (``SegmentFile.create(read_around=False)``) (``bench/
        wal_append_ratio.py``; docs/benchmarks.md, "One broker at scale").  Only bytes beyond both the write
        position and the last window are written, and those are zeros already (the writer
        alone stores into the file, never beyond its write position), so no byte of the file
        changes.  The pages are dirty zeros until overwritten, so only sync=never uses it (a
        sync would write them).  Advisory: any failure just leaves the faults to the stores.
        """
        global _populate_write_ok
        cdef Py_ssize_t zstart = max(seg._prefaulted, seg.write_pos)
        cdef Py_ssize_t stop = min(end + self.prefault_bytes, seg.capacity)
        cdef Py_ssize_t start = zstart - zstart % _PAGE
        cdef int rc = 0
        cdef bint populate = _populate_write_ok
        if seg.base == NULL or not seg.writable or seg._fd < 0 or stop <= zstart:
            return 0
        seg._prefaulted = stop
        with nogil:
            if populate:
                madvise(seg.base + start, stop - start, MADV_RANDOM)
            _write_zeros(seg._fd, zstart, stop - zstart)
            if populate:
                rc = madvise(seg.base + start, stop - start, MADV_POPULATE_WRITE)
                if rc != 0:
                    rc = c_errno
                madvise(seg.base + start, stop - start, MADV_NORMAL)
        if rc == EINVAL:
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
        self.last_stored = n < PWRITE_MIN_BYTES  # the one size test every append path makes
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
        cdef Piece piece
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
            _plain_piece(&piece, pt, self.producer_id, kp, klen)
            piece.payload = <const unsigned char*>p
            piece.payload_len = plen
            body_len = piece_body_len(&piece)
            if body_len > FRAME_MAX_BODY:
                raise FrameFormatError(f"record body of {body_len} bytes exceeds {FRAME_MAX_BODY}")
            n = FRAME_HEADER_SIZE + body_len
            self._room_for(n, now)
            seg = self.segment
            pos = seg.write_pos
            if n >= PWRITE_MIN_BYTES:
                self._append_large(&piece, offset)
            else:
                self._mapped_write(seg, n)
                write_frame(seg.base + pos, offset, &piece)
            seg._index_sizes(pos, n, 1, &plen, FRAME_FIXED_SIZE + klen)
        finally:
            if has_view:
                PyBuffer_Release(&view)
        self._publish(pos, n, 1, NULL)
        return offset

    cdef int _append_large(self, Piece* piece, uint64_t offset) except -1:
        """One record of PWRITE_MIN_BYTES or more: encoded in the scratch buffer, pwritten."""
        cdef const char* p = <const char*>piece.payload
        cdef Py_ssize_t plen = piece.payload_len
        cdef unsigned char* scratch = self._scratch_for(FRAME_HEADER_SIZE + piece_body_len(piece))
        cdef int err
        cdef SegmentFile seg = self.segment
        with nogil:
            err = _encode_pwrite(seg._fd, seg.write_pos, scratch, self._scratch_cap, piece, 1, &p, &plen,
                                 offset)
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
        cdef Piece piece
        cdef int err = 0
        cdef int fd
        cdef SegmentFile seg
        items = payloads if type(payloads) is tuple else tuple(payloads)
        count = len(items)
        if count == 0:
            raise ValueError("append_payloads needs at least one payload")
        if attributes:
            data = _encode_payloads(items, base_offset=first,
                                    publish_time=now if publish_time is None else publish_time,
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
        _plain_piece(&piece, pt, pid, kp, klen)
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
                if FRAME_BODY_FIXED_SIZE + klen + plen > FRAME_MAX_BODY:
                    raise FrameFormatError(f"record body of {FRAME_BODY_FIXED_SIZE + klen + plen} bytes "
                                           f"exceeds {FRAME_MAX_BODY}")
                if plen > biggest:
                    biggest = plen
                total += FRAME_FIXED_SIZE + klen + plen
            self._room_for(total, now)
            seg = self.segment
            pos = seg.write_pos
            if total >= PWRITE_MIN_BYTES:
                scratch = self._scratch_for(FRAME_FIXED_SIZE + klen + biggest)
                fd = seg._fd
                if total >= NOGIL_BYTES:
                    with nogil:
                        err = _encode_pwrite(fd, pos, scratch, self._scratch_cap, &piece, count, ptrs, lens,
                                             first)
                else:
                    err = _encode_pwrite(fd, pos, scratch, self._scratch_cap, &piece, count, ptrs, lens,
                                         first)
                self._trim_scratch()
                if err:
                    _raise_errno(err)
            else:
                self._mapped_write(seg, total)
                _encode_into(seg.base + pos, &piece, count, ptrs, lens, first)
            seg._index_sizes(pos, total, count, lens, FRAME_FIXED_SIZE + klen)
        finally:
            free(ptrs)
            free(lens)
        self._publish(pos, total, count, NULL)
        return first, first + count - 1

    def append_frames(self, buf):
        """Validate a frame batch, stamp it with the next offsets and append it; ``(first, last)``.
        A ``CheckedFrames`` (frame.check_batch's checked copy) is not validated again."""
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
            if type(buf) is CheckedFrames and (<CheckedFrames>buf).nbytes == n:
                # validated whole by frame.check_batch, which alone makes one (the publish path)
                res.count = (<CheckedFrames>buf).frame_count
            elif n >= NOGIL_BYTES:
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

# cython: language_level=3
"""Native frame codec: encode, validate, scan, stamp and decode whole batches.

Compiled twin of ``danube._pure.frame`` (same functions, results and errors);
``tests/unit/_core/test_frame_differential.py`` runs the two against each other.

Frame format "danube-frames-v1": described byte by byte at the top of
``danube/_pure/frame.py`` (the one description); the sizes and field positions
as C constants, and the one frame encoder (``write_frame``), are in
``frame.pxd``; the little-endian loads and stores in ``le.pxd``.

Implementation notes: every batch operation is one C loop over the raw buffer;
checksums, validation, scans and stamps of buffers of at least 64 KiB run
without the GIL.  Encoders size the output first and fill it once.
"""

from cpython.buffer cimport (PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_CheckBuffer,
                             PyObject_GetBuffer)
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport uint16_t, uint32_t, uint64_t, UINT64_MAX
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from danube._core.le cimport ld16, ld32, ld64, st64

from danube._pure.frame import Record
from danube.errors import CorruptFrameError, FrameFormatError

cdef extern from "crc32c_impl.h":
    void danube_crc32c_init() noexcept
    uint32_t danube_crc32c_update(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil
    uint32_t danube_crc32c_portable(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil
    uint32_t danube_crc32c_hw(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil
    int danube_crc32c_hw_available() noexcept
    const char* danube_crc32c_implementation() noexcept

cdef extern from *:
    """
    /* A tuple subclass instance with n empty slots, as tuple.__new__(cls, ...)
       builds it, without the argument tuple. */
    static inline PyObject *danube_alloc_tuple(PyObject *type, Py_ssize_t n) {
        return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    }
    """
    object danube_alloc_tuple(object type, Py_ssize_t n)

danube_crc32c_init()

cdef object _Record = Record
if not (isinstance(Record, type) and issubclass(Record, tuple)):
    raise ImportError("danube._pure.frame.Record must be a tuple subclass")

HEADER_SIZE = FRAME_HEADER_SIZE
BODY_FIXED_SIZE = FRAME_BODY_FIXED_SIZE
MIN_BODY = FRAME_MIN_BODY
MAX_BODY = FRAME_MAX_BODY
FLAG_HAS_KEY = FRAME_FLAG_HAS_KEY

SCAN_END = 0  # the buffer ended exactly on a frame boundary
SCAN_ZERO = 1  # an all-zero header: end of written data in a preallocated file
SCAN_TORN = 2  # the buffer ends inside a frame (need more bytes)
SCAN_CORRUPT = 3  # bad checksum, bad length or broken offset sequence

# Below this many bytes, releasing and retaking the GIL costs more than it frees.
cdef Py_ssize_t NOGIL_BYTES = 64 * 1024

cdef object _U64_MAX = 0xFFFFFFFFFFFFFFFF


# ---------------------------------------------------------------- CRC32C

cdef uint32_t crc32c_update(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil:
    return danube_crc32c_update(crc, p, n)


def crc32c(data, uint32_t value=0):
    """CRC32C of ``data`` (any buffer); ``value`` continues a previous result."""
    cdef Py_buffer view
    cdef uint32_t crc
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len >= NOGIL_BYTES:
            with nogil:
                crc = danube_crc32c_update(value, <const unsigned char*>view.buf, <size_t>view.len)
        else:
            crc = danube_crc32c_update(value, <const unsigned char*>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def crc32c_implementation():
    """``"sse4.2"`` or ``"slicing-by-8"`` (``DANUBE_CRC32C=portable`` forces the latter)."""
    return danube_crc32c_implementation().decode("ascii")


def _crc32c_with(str implementation, data, uint32_t value=0):
    """CRC32C by a named implementation (``"sse4.2"`` or ``"slicing-by-8"``), for tests."""
    cdef Py_buffer view
    cdef uint32_t crc
    if implementation == "sse4.2":
        if not danube_crc32c_hw_available():
            raise ValueError("this CPU has no SSE4.2")
    elif implementation != "slicing-by-8":
        raise ValueError(f"unknown CRC32C implementation {implementation!r}")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if implementation == "sse4.2":
            crc = danube_crc32c_hw(value, <const unsigned char*>view.buf, <size_t>view.len)
        else:
            crc = danube_crc32c_portable(value, <const unsigned char*>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


# ---------------------------------------------------------------- checking (C level)

cdef inline int check_layout(const unsigned char* body, uint32_t body_len) noexcept nogil:
    cdef unsigned char flags = body[BODY_FLAGS_AT]
    cdef uint16_t attr_count = ld16(body + BODY_ATTR_COUNT_AT)
    cdef uint16_t key_len = ld16(body + BODY_KEY_LEN_AT)
    cdef uint64_t p, end = body_len
    cdef uint16_t _attr
    if (flags & ~FRAME_FLAG_HAS_KEY) or body[BODY_RESERVED_AT]:
        return FRAME_BAD_FLAGS
    if not (flags & FRAME_FLAG_HAS_KEY) and key_len:
        return FRAME_KEY_WITHOUT_FLAG
    p = FRAME_BODY_FIXED_SIZE + <uint64_t>key_len
    if p > end:
        return FRAME_KEY_OVERRUN
    for _attr in range(attr_count):
        if p + 2 > end:
            return FRAME_ATTRS_OVERRUN
        p += 2 + <uint64_t>ld16(body + p)
        if p + 4 > end:
            return FRAME_ATTRS_OVERRUN
        p += 4 + <uint64_t>ld32(body + p)
        if p > end:
            return FRAME_ATTRS_OVERRUN
    return FRAME_OK


cdef int check_frame(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos,
                     FrameInfo* info) noexcept nogil:
    cdef const unsigned char* h
    if n - pos < FRAME_HEADER_SIZE:
        return FRAME_TORN
    h = buf + pos
    info.offset = ld64(h + FRAME_OFFSET_AT)
    info.stored_crc = ld32(h + FRAME_CRC_AT)
    info.body_len = ld32(h + FRAME_BODY_LEN_AT)
    if info.body_len < FRAME_MIN_BODY or info.body_len > FRAME_MAX_BODY:
        return FRAME_BAD_LENGTH
    if n - pos - FRAME_HEADER_SIZE < <Py_ssize_t>info.body_len:
        return FRAME_TORN
    info.actual_crc = danube_crc32c_update(0, h + FRAME_BODY_LEN_AT, 4 + <size_t>info.body_len)
    if info.actual_crc != info.stored_crc:
        return FRAME_BAD_CRC
    return check_layout(h + FRAME_HEADER_SIZE, info.body_len)


cdef int raise_frame_error(int status, Py_ssize_t pos, const FrameInfo* info) except -1:
    if status == FRAME_TORN:
        raise CorruptFrameError("batch ends inside a frame", position=pos, offset=None,
                                expected_crc=None, actual_crc=None)
    if status == FRAME_BAD_LENGTH:
        raise CorruptFrameError(f"invalid body length {info.body_len}", position=pos,
                                offset=info.offset, expected_crc=info.stored_crc, actual_crc=None)
    if status == FRAME_BAD_CRC:
        raise CorruptFrameError("checksum mismatch", position=pos, offset=info.offset,
                                expected_crc=info.stored_crc, actual_crc=info.actual_crc)
    if status == FRAME_BAD_FLAGS:
        raise FrameFormatError(f"unknown flags at position {pos} (offset {info.offset})")
    if status == FRAME_KEY_WITHOUT_FLAG:
        raise FrameFormatError(f"key length without key flag at position {pos} (offset {info.offset})")
    if status == FRAME_KEY_OVERRUN:
        raise FrameFormatError(f"routing key overruns the frame at position {pos} (offset {info.offset})")
    if status == FRAME_ATTRS_OVERRUN:
        raise FrameFormatError(f"attributes overrun the frame at position {pos} (offset {info.offset})")
    raise SystemError(f"unexpected frame status {status}")


cdef int validate_frames(const unsigned char* buf, Py_ssize_t n, int expect_first,
                         uint64_t expected_first, bint check_sequence,
                         ValidateResult* out) noexcept nogil:
    cdef Py_ssize_t pos = 0
    cdef int status
    out.count = 0
    out.first = 0
    out.last = 0
    out.error_pos = 0
    while pos < n:
        status = check_frame(buf, n, pos, &out.info)
        if status != FRAME_OK:
            out.error_pos = pos
            return status
        if out.count == 0:
            out.first = out.info.offset
            if expect_first == 2 or (expect_first == 1 and out.info.offset != expected_first):
                out.error_pos = pos
                return FRAME_BAD_FIRST_OFFSET
        elif check_sequence and (out.last == UINT64_MAX or out.info.offset != out.last + 1):
            out.error_pos = pos
            return FRAME_BAD_SEQUENCE
        out.last = out.info.offset
        out.count += 1
        pos += FRAME_HEADER_SIZE + out.info.body_len
    return FRAME_OK


cdef int raise_validate_error(int status, const ValidateResult* res,
                              object expected_first_offset) except -1:
    cdef uint64_t offset = res.info.offset
    if status == FRAME_BAD_FIRST_OFFSET:
        raise CorruptFrameError(f"first offset {offset}, expected {expected_first_offset}",
                                position=res.error_pos, offset=offset, expected_crc=None,
                                actual_crc=None)
    if status == FRAME_BAD_SEQUENCE:
        raise CorruptFrameError(f"offset {offset} does not follow {res.last}", position=res.error_pos,
                                offset=offset, expected_crc=None, actual_crc=None)
    return raise_frame_error(status, res.error_pos, &res.info)


cdef Py_ssize_t scan_frames(const unsigned char* buf, Py_ssize_t n, Py_ssize_t start,
                            int expect_first, uint64_t expected_first,
                            Py_ssize_t index_every, ScanResult* out,
                            IndexEntry** index, Py_ssize_t* index_len) noexcept nogil:
    cdef Py_ssize_t pos = start, last_indexed = -1, capacity = 0
    cdef IndexEntry* entries = NULL
    cdef IndexEntry* grown
    cdef FrameInfo info
    cdef int status
    out.count = 0
    out.first = 0
    out.last = 0
    out.reason = 0
    if index != NULL:
        index[0] = NULL
        index_len[0] = 0
    while pos < n:
        if n - pos >= FRAME_HEADER_SIZE and ld64(buf + pos) == 0 and ld64(buf + pos + 8) == 0:  # 16 zero bytes
            out.reason = 1
            break
        status = check_frame(buf, n, pos, &info)
        if status == FRAME_TORN:
            out.reason = 2
            break
        if status != FRAME_OK:
            out.reason = 3
            break
        if out.count == 0:
            if expect_first == 2 or (expect_first == 1 and info.offset != expected_first):
                out.reason = 3
                break
            out.first = info.offset
        elif out.last == UINT64_MAX or info.offset != out.last + 1:
            out.reason = 3
            break
        if index != NULL and (out.count == 0 or (index_every != 0 and pos - last_indexed >= index_every)):
            if index_len[0] == capacity:
                capacity = 16 if capacity == 0 else capacity * 2
                grown = <IndexEntry*>realloc(entries, capacity * sizeof(IndexEntry))
                if grown == NULL:
                    free(entries)
                    index_len[0] = 0
                    return -1
                entries = grown
                index[0] = entries
            entries[index_len[0]].offset = info.offset
            entries[index_len[0]].position = pos
            index_len[0] += 1
            last_indexed = pos
        out.last = info.offset
        out.count += 1
        pos += FRAME_HEADER_SIZE + info.body_len
    out.end_pos = pos
    return out.count


cdef int count_frames(const unsigned char* buf, Py_ssize_t n, Py_ssize_t* count,
                      Py_ssize_t* error_pos, uint32_t* error_len) noexcept nogil:
    """The length walk of stamp_offsets: frames end exactly at n."""
    cdef Py_ssize_t pos = 0
    cdef uint32_t body_len
    count[0] = 0
    while pos < n:
        if n - pos < FRAME_HEADER_SIZE:
            error_pos[0] = pos
            return FRAME_TORN
        body_len = ld32(buf + pos + FRAME_BODY_LEN_AT)
        if body_len < FRAME_MIN_BODY or n - pos - FRAME_HEADER_SIZE < <Py_ssize_t>body_len:
            error_pos[0] = pos
            error_len[0] = body_len
            return FRAME_BAD_LENGTH
        count[0] += 1
        pos += FRAME_HEADER_SIZE + body_len
    return FRAME_OK


cdef int stamp_frames(unsigned char* buf, Py_ssize_t n, uint64_t base, Py_ssize_t* count,
                      Py_ssize_t* error_pos, uint32_t* error_len) noexcept nogil:
    cdef Py_ssize_t pos = 0
    cdef uint64_t next_offset = base
    cdef int status = count_frames(buf, n, count, error_pos, error_len)
    if status != FRAME_OK:
        return status
    if count[0] > 0 and base > UINT64_MAX - <uint64_t>(count[0] - 1):
        return FRAME_OFFSET_OVERFLOW
    while pos < n:
        st64(buf + pos + FRAME_OFFSET_AT, next_offset)
        next_offset += 1
        pos += FRAME_HEADER_SIZE + ld32(buf + pos + FRAME_BODY_LEN_AT)
    return FRAME_OK


cdef int expectation(object expected_first_offset, uint64_t* value) except -1:
    """0: none (negative), 1: *value must match, 2: beyond u64, nothing matches."""
    if expected_first_offset < 0:
        return 0
    if expected_first_offset > _U64_MAX:
        return 2
    value[0] = expected_first_offset
    return 1


cdef int check_start(Py_ssize_t start, str name) except -1:
    if start < 0:
        raise ValueError(f"{name} must not be negative, got {start}")
    return 0


# ---------------------------------------------------------------- validate / scan / stamp

def validate(buf, expected_first_offset=-1, check_sequence=False):
    """Validate a whole batch in one call: ``(count, first_offset, last_offset)``.

    Checks every length and checksum; with ``check_sequence`` offsets must be
    consecutive, and with ``expected_first_offset >= 0`` start there.
    An empty buffer gives ``(0, -1, -1)``.  Raises ``CorruptFrameError`` (or
    ``FrameFormatError`` for a bad body layout).
    """
    cdef Py_buffer view
    cdef ValidateResult res
    cdef uint64_t expected = 0
    cdef int expect = expectation(expected_first_offset, &expected)
    cdef bint sequence = bool(check_sequence)
    cdef int status
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len >= NOGIL_BYTES:
            with nogil:
                status = validate_frames(<const unsigned char*>view.buf, view.len, expect, expected,
                                         sequence, &res)
        else:
            status = validate_frames(<const unsigned char*>view.buf, view.len, expect, expected,
                                     sequence, &res)
    finally:
        PyBuffer_Release(&view)
    if status != FRAME_OK:
        raise_validate_error(status, &res, expected_first_offset)
    if res.count == 0:
        return 0, -1, -1
    return res.count, res.first, res.last


def scan(buf, Py_ssize_t start=0, expected_first_offset=-1, Py_ssize_t index_every=0):
    """Scan for recovery; never raises on bad data.

    Returns ``(count, end_pos, first_offset, last_offset, reason, index)`` where
    ``end_pos`` is the end of the last whole valid frame, ``reason`` one of the
    ``SCAN_*`` constants and ``index`` a list of ``(offset, position)`` pairs,
    one at the first frame and then one whenever at least ``index_every`` bytes
    (0 = never) have passed since the previous entry.
    """
    cdef Py_buffer view
    cdef ScanResult res
    cdef IndexEntry* entries = NULL
    cdef Py_ssize_t entry_count = 0, i, scanned
    cdef uint64_t expected = 0
    cdef int expect
    check_start(start, "start")
    expect = expectation(expected_first_offset, &expected)
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len - start >= NOGIL_BYTES:
            with nogil:
                scanned = scan_frames(<const unsigned char*>view.buf, view.len, start, expect, expected,
                                      index_every, &res, &entries, &entry_count)
        else:
            scanned = scan_frames(<const unsigned char*>view.buf, view.len, start, expect, expected,
                                  index_every, &res, &entries, &entry_count)
    finally:
        PyBuffer_Release(&view)
    if scanned < 0:
        raise MemoryError()
    try:
        index = [(entries[i].offset, entries[i].position) for i in range(entry_count)]
    finally:
        free(entries)
    if res.count == 0:
        return 0, res.end_pos, -1, -1, res.reason, index
    return res.count, res.end_pos, res.first, res.last, res.reason, index


def stamp_offsets(buf, base_offset):
    """Write consecutive offsets from ``base_offset`` into a writable batch; return the count.

    Only headers are touched; lengths are checked first, so a bad batch is left
    unchanged (the checksums are not: validate first).
    """
    cdef Py_buffer view
    cdef Py_ssize_t count = 0, error_pos = 0
    cdef uint32_t error_len = 0
    cdef uint64_t base = 0
    cdef bint base_in_range = 0 <= base_offset <= _U64_MAX
    cdef int status
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    except BufferError:
        raise TypeError("stamp_offsets needs a writable buffer") from None
    try:
        if base_in_range:
            base = base_offset
            if view.len >= NOGIL_BYTES:
                with nogil:
                    status = stamp_frames(<unsigned char*>view.buf, view.len, base, &count,
                                          &error_pos, &error_len)
            else:
                status = stamp_frames(<unsigned char*>view.buf, view.len, base, &count,
                                      &error_pos, &error_len)
        else:
            status = count_frames(<const unsigned char*>view.buf, view.len, &count, &error_pos,
                                  &error_len)
            if status == FRAME_OK and count > 0:
                status = FRAME_OFFSET_OVERFLOW
    finally:
        PyBuffer_Release(&view)
    if status == FRAME_TORN:
        raise FrameFormatError(f"batch ends inside a header at position {error_pos}")
    if status == FRAME_BAD_LENGTH:
        raise FrameFormatError(f"invalid body length {error_len} at position {error_pos}")
    if status == FRAME_OFFSET_OVERFLOW:
        raise OverflowError(f"offsets {base_offset}..{base_offset + count - 1} do not fit in u64")
    return count


# ---------------------------------------------------------------- navigation

cdef list positions_list(const unsigned char* buf, Py_ssize_t n):
    cdef Py_ssize_t pos = 0
    cdef uint32_t body_len
    cdef list out = []
    while pos + FRAME_HEADER_SIZE <= n:
        body_len = ld32(buf + pos + FRAME_BODY_LEN_AT)
        if body_len < FRAME_MIN_BODY or n - pos - FRAME_HEADER_SIZE < <Py_ssize_t>body_len:
            raise FrameFormatError(f"invalid body length {body_len} at position {pos}")
        out.append(pos)
        pos += FRAME_HEADER_SIZE + body_len
    return out


def frame_positions(buf):
    """Start position of every frame (lengths trusted; validate first)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        return positions_list(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


def frames_within(buf, Py_ssize_t max_messages, Py_ssize_t max_bytes):
    """``(end, count)``: the longest prefix of whole frames within both limits, always at least
    one frame when the buffer starts with one (a delivery's cut: no list of positions)."""
    cdef Py_buffer view
    cdef Py_ssize_t pos = 0, nxt, n, count = 0
    cdef const unsigned char* b
    cdef uint32_t body_len
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>view.buf
        n = view.len
        while count < max_messages and pos + FRAME_HEADER_SIZE <= n:
            body_len = ld32(b + pos + FRAME_BODY_LEN_AT)
            if body_len < FRAME_MIN_BODY or n - pos - FRAME_HEADER_SIZE < <Py_ssize_t>body_len:
                raise FrameFormatError(f"invalid body length {body_len} at position {pos}")
            nxt = pos + FRAME_HEADER_SIZE + body_len
            if count and nxt > max_bytes:
                break
            pos = nxt
            count += 1
        return pos, count
    finally:
        PyBuffer_Release(&view)


def find_offset(buf, offset, Py_ssize_t start=0):
    """Byte position of the frame holding ``offset`` (searching from ``start``), or -1."""
    cdef Py_buffer view
    cdef Py_ssize_t pos = start, n, found = -1
    cdef const unsigned char* b
    cdef uint64_t wanted, off
    cdef uint32_t body_len
    check_start(start, "start")
    if offset < 0 or offset > _U64_MAX:
        return -1
    wanted = offset
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    b = <const unsigned char*>view.buf
    n = view.len
    while pos <= n - FRAME_HEADER_SIZE:
        off = ld64(b + pos + FRAME_OFFSET_AT)
        body_len = ld32(b + pos + FRAME_BODY_LEN_AT)
        if body_len < FRAME_MIN_BODY or off > wanted:
            break
        if off == wanted:
            found = pos
            break
        pos += FRAME_HEADER_SIZE + body_len
    PyBuffer_Release(&view)
    return found


def routing_keys(buf):
    """The routing key of every frame (for key-shared dispatch; lengths trusted)."""
    cdef Py_buffer view
    cdef const unsigned char* b
    cdef Py_ssize_t body, key_end, n
    cdef list out
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>view.buf
        n = view.len
        positions = positions_list(b, n)
        out = []
        for pos in positions:
            body = <Py_ssize_t>pos + FRAME_HEADER_SIZE
            if b[body + BODY_FLAGS_AT] & FRAME_FLAG_HAS_KEY:
                key_end = min(body + FRAME_BODY_FIXED_SIZE + ld16(b + body + BODY_KEY_LEN_AT), n)
                out.append(PyUnicode_DecodeUTF8(<char*>b + body + FRAME_BODY_FIXED_SIZE,
                                                key_end - body - FRAME_BODY_FIXED_SIZE, NULL))
            else:
                out.append(None)
        return out
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------- decoding

cdef inline void put_item(object record, Py_ssize_t i, object value) noexcept:
    Py_INCREF(value)  # PyTuple_SET_ITEM steals a reference
    PyTuple_SET_ITEM(record, i, value)


cdef object make_record(uint64_t offset, uint64_t publish_time, uint64_t producer_id,
                        object key, object attributes, object payload):
    # What tuple.__new__(Record, (...)) does, minus the argument tuple and the call.
    record = danube_alloc_tuple(_Record, 6)
    put_item(record, 0, offset)
    put_item(record, 1, publish_time)
    put_item(record, 2, producer_id)
    put_item(record, 3, key)
    put_item(record, 4, attributes)
    put_item(record, 5, payload)
    return record


cdef object decode_body(object mv, const unsigned char* buf, Py_ssize_t pos, const FrameInfo* info):
    """The Record of a checked frame; the payload is a slice of ``mv``."""
    cdef const unsigned char* body = buf + pos + FRAME_HEADER_SIZE
    cdef Py_ssize_t end = pos + FRAME_HEADER_SIZE + info.body_len
    cdef unsigned char flags = body[BODY_FLAGS_AT]
    cdef uint16_t attr_count = ld16(body + BODY_ATTR_COUNT_AT)
    cdef uint16_t key_len = ld16(body + BODY_KEY_LEN_AT)
    cdef Py_ssize_t p = FRAME_BODY_FIXED_SIZE
    cdef uint16_t _attr, name_len
    cdef uint32_t value_len
    cdef dict attrs = {}
    key = None
    if flags & FRAME_FLAG_HAS_KEY:
        key = PyUnicode_DecodeUTF8(<char*>body + p, key_len, NULL)
    p += key_len
    for _attr in range(attr_count):
        name_len = ld16(body + p)
        name = PyUnicode_DecodeUTF8(<char*>body + p + 2, name_len, NULL)
        p += 2 + name_len
        value_len = ld32(body + p)
        attrs[name] = PyUnicode_DecodeUTF8(<char*>body + p + 4, value_len, NULL)
        p += 4 + value_len
    return make_record(info.offset, ld64(body + BODY_PUBLISH_TIME_AT), ld64(body + BODY_PRODUCER_ID_AT), key, attrs,
                       byte_slice(mv, pos + FRAME_HEADER_SIZE + p, end - pos - FRAME_HEADER_SIZE - p))


cdef inline object byte_slice(object mv, Py_ssize_t start, Py_ssize_t length):
    """``mv[start:start + length]`` for a 1-D byte memoryview and an in-range slice.

    A new view of the same exporter with its window narrowed, as memoryview's own
    slicing does, without building the slice object and index ints (a third of
    the per-record decode cost).
    """
    out = PyMemoryView_FromObject(mv)
    cdef Py_buffer* view = PyMemoryView_GET_BUFFER(out)
    view.buf = <char*>view.buf + start
    view.len = length
    view.shape[0] = length
    return out


cdef inline object byte_view(buf):
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


def decode_frame(buf, Py_ssize_t pos=0):
    """Decode the frame at ``pos``: ``(record, next_pos)``, or ``(None, pos)`` if more bytes are needed."""
    cdef FrameInfo info
    cdef Py_buffer* view
    cdef int status
    check_start(pos, "pos")
    mv = byte_view(buf)
    view = PyMemoryView_GET_BUFFER(mv)
    status = check_frame(<const unsigned char*>view.buf, view.len, pos, &info)
    if status == FRAME_TORN:
        return None, pos
    if status != FRAME_OK:
        raise_frame_error(status, pos, &info)
    return (decode_body(mv, <const unsigned char*>view.buf, pos, &info),
            pos + FRAME_HEADER_SIZE + info.body_len)


def iter_records(buf):
    """Iterate the records of a whole batch; payloads are memoryviews into ``buf``."""
    cdef FrameInfo info
    cdef Py_buffer* view
    cdef Py_ssize_t pos = 0
    cdef int status
    mv = byte_view(buf)
    view = PyMemoryView_GET_BUFFER(mv)
    while pos < view.len:
        status = check_frame(<const unsigned char*>view.buf, view.len, pos, &info)
        if status != FRAME_OK:
            raise_frame_error(status, pos, &info)
        yield decode_body(mv, <const unsigned char*>view.buf, pos, &info)
        pos += FRAME_HEADER_SIZE + info.body_len


def decode_batch(buf):
    """Every record of a whole batch as a list; payloads are memoryviews into ``buf``."""
    cdef FrameInfo info
    cdef Py_buffer* view
    cdef Py_ssize_t pos = 0
    cdef int status
    cdef list out = []
    mv = byte_view(buf)
    view = PyMemoryView_GET_BUFFER(mv)
    while pos < view.len:
        status = check_frame(<const unsigned char*>view.buf, view.len, pos, &info)
        if status != FRAME_OK:
            raise_frame_error(status, pos, &info)
        out.append(decode_body(mv, <const unsigned char*>view.buf, pos, &info))
        pos += FRAME_HEADER_SIZE + info.body_len
    return out


def decode_columns(buf):
    """Decode a whole batch column-wise (for Arrow/Spark): one list per field.

    Keys: offset, publish_time, producer_id, routing_key, attributes, payload
    (payloads as ``bytes``).  Validates every frame like :func:`iter_records`.
    """
    cdef FrameInfo info
    cdef Py_buffer view
    cdef const unsigned char* b
    cdef const unsigned char* body
    cdef Py_ssize_t pos = 0, p, end
    cdef int status
    cdef uint16_t _attr, attr_count, key_len, name_len
    cdef uint32_t value_len
    cdef list offsets = [], times = [], producers = [], keys = [], attributes = [], payloads = []
    cdef dict attrs
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>view.buf
        while pos < view.len:
            status = check_frame(b, view.len, pos, &info)
            if status != FRAME_OK:
                raise_frame_error(status, pos, &info)
            body = b + pos + FRAME_HEADER_SIZE
            end = info.body_len
            attr_count = ld16(body + BODY_ATTR_COUNT_AT)
            key_len = ld16(body + BODY_KEY_LEN_AT)
            p = FRAME_BODY_FIXED_SIZE
            key = None
            if body[BODY_FLAGS_AT] & FRAME_FLAG_HAS_KEY:
                key = PyUnicode_DecodeUTF8(<char*>body + p, key_len, NULL)
            p += key_len
            attrs = {}
            for _attr in range(attr_count):
                name_len = ld16(body + p)
                name = PyUnicode_DecodeUTF8(<char*>body + p + 2, name_len, NULL)
                p += 2 + name_len
                value_len = ld32(body + p)
                attrs[name] = PyUnicode_DecodeUTF8(<char*>body + p + 4, value_len, NULL)
                p += 4 + value_len
            offsets.append(info.offset)
            times.append(ld64(body + BODY_PUBLISH_TIME_AT))
            producers.append(ld64(body + BODY_PRODUCER_ID_AT))
            keys.append(key)
            attributes.append(attrs)
            payloads.append(PyBytes_FromStringAndSize(<char*>body + p, end - p))
            pos += FRAME_HEADER_SIZE + info.body_len
    finally:
        PyBuffer_Release(&view)
    return {"offset": offsets, "publish_time": times, "producer_id": producers,
            "routing_key": keys, "attributes": attributes, "payload": payloads}


# ---------------------------------------------------------------- encoding

cdef class _Pins:
    """Keeps alive every object and buffer export an encode reads from."""
    cdef list objects
    cdef Py_buffer* views
    cdef Py_ssize_t view_count
    cdef Py_ssize_t view_capacity

    def __cinit__(self):
        self.objects = []
        self.views = NULL
        self.view_count = 0
        self.view_capacity = 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.view_count):
            PyBuffer_Release(&self.views[i])
        free(self.views)

    cdef int payload(self, object obj, const unsigned char** ptr, Py_ssize_t* length) except -1:
        """Pointer and length of a bytes-like payload (TypeError otherwise)."""
        cdef Py_buffer* grown
        if PyBytes_CheckExact(obj):
            ptr[0] = <const unsigned char*>PyBytes_AS_STRING(obj)
            length[0] = PyBytes_GET_SIZE(obj)
            return 0
        if not PyObject_CheckBuffer(obj):
            # bytes(5) would silently store five zero bytes: refuse anything that is not bytes-like
            raise TypeError(f"payload must be a bytes-like object, not {type(obj).__name__}")
        if self.view_count == self.view_capacity:
            self.view_capacity = 8 if self.view_capacity == 0 else self.view_capacity * 2
            grown = <Py_buffer*>realloc(self.views, self.view_capacity * sizeof(Py_buffer))
            if grown == NULL:
                raise MemoryError()
            self.views = grown
        # bytes() copies non-contiguous buffers; PyBUF_SIMPLE refuses them: copy those too
        try:
            PyObject_GetBuffer(obj, &self.views[self.view_count], PyBUF_SIMPLE)
        except BufferError:
            obj = bytes(obj)
            self.objects.append(obj)
            ptr[0] = <const unsigned char*>PyBytes_AS_STRING(obj)
            length[0] = PyBytes_GET_SIZE(obj)
            return 0
        ptr[0] = <const unsigned char*>self.views[self.view_count].buf
        length[0] = self.views[self.view_count].len
        self.view_count += 1
        return 0


cdef int body_prefix(_Pins pins, object publish_time, object producer_id, object key,
                     object attributes, Piece* piece) except -1:
    """Fills everything of a Piece but the payload, raising like the pure twin."""
    cdef Py_ssize_t key_len = 0
    cdef const char* key_utf8
    piece.flags = 0
    piece.key = NULL
    piece.key_len = 0
    if key is not None:
        if type(key) is str:
            key_utf8 = PyUnicode_AsUTF8AndSize(key, &key_len)
            pins.objects.append(key)
            piece.key = <const unsigned char*>key_utf8
        else:
            key_bytes = key.encode("utf-8")
            pins.objects.append(key_bytes)
            piece.key = <const unsigned char*>PyBytes_AS_STRING(key_bytes)
            key_len = PyBytes_GET_SIZE(key_bytes)
        piece.key_len = key_len
        piece.flags = FRAME_FLAG_HAS_KEY
        if key_len > 0xFFFF:
            raise FrameFormatError("routing key longer than 65535 bytes")
    attrs = attributes or {}
    if len(attrs) > 0xFFFF:
        raise FrameFormatError("more than 65535 attributes")
    piece.attr_count = len(attrs)
    piece.publish_time = publish_time
    piece.producer_id = producer_id
    piece.attrs = NULL
    piece.attrs_len = 0
    if piece.attr_count:
        section = bytearray()
        for name, value in attrs.items():
            name_b = str(name).encode("utf-8")
            value_b = str(value).encode("utf-8")
            if len(name_b) > 0xFFFF:
                raise FrameFormatError("attribute name longer than 65535 bytes")
            if len(value_b) > 0xFFFFFFFF:
                raise FrameFormatError("attribute value longer than 4294967295 bytes")
            section += len(name_b).to_bytes(2, "little")
            section += name_b
            section += len(value_b).to_bytes(4, "little")
            section += value_b
        section = bytes(section)
        pins.objects.append(section)
        piece.attrs = <const unsigned char*>PyBytes_AS_STRING(section)
        piece.attrs_len = PyBytes_GET_SIZE(section)
    return 0


cdef int check_body_size(const Piece* piece) except -1:
    cdef Py_ssize_t body_len = piece_body_len(piece)
    if body_len > FRAME_MAX_BODY:
        raise FrameFormatError(f"record body of {body_len} bytes exceeds {FRAME_MAX_BODY}")
    return 0


cdef int check_offsets(object base_offset, Py_ssize_t count) except -1:
    if count and (base_offset < 0 or base_offset + count - 1 > _U64_MAX):
        raise OverflowError(f"offsets {base_offset}..{base_offset + count - 1} do not fit in u64")
    return 0


def encode_record(payload, *, offset=0, publish_time=0, producer_id=0, key=None, attributes=None):
    """Encode one record as one frame."""
    cdef _Pins pins = _Pins()
    cdef Piece piece
    body_prefix(pins, publish_time, producer_id, key, attributes, &piece)
    pins.payload(payload, &piece.payload, &piece.payload_len)
    check_body_size(&piece)
    check_offsets(offset, 1)
    out = PyBytes_FromStringAndSize(NULL, FRAME_HEADER_SIZE + piece_body_len(&piece))
    write_frame(<unsigned char*>PyBytes_AS_STRING(out), <uint64_t>offset, &piece)
    return out


cdef object write_pieces(const Piece* pieces, Py_ssize_t count, Py_ssize_t total, object base_offset):
    """One bytes object holding every piece as a frame, offsets consecutive from ``base_offset``."""
    cdef Py_ssize_t i, written = 0
    cdef uint64_t base
    cdef unsigned char* dst
    check_offsets(base_offset, count)
    base = base_offset
    out = PyBytes_FromStringAndSize(NULL, total)
    dst = <unsigned char*>PyBytes_AS_STRING(out)
    if total >= NOGIL_BYTES:
        with nogil:
            for i in range(count):
                written += write_frame(dst + written, base + <uint64_t>i, &pieces[i])
    else:
        for i in range(count):
            written += write_frame(dst + written, base + <uint64_t>i, &pieces[i])
    return out


def encode_payloads(payloads, *, base_offset=0, publish_time=0, producer_id=0, key=None,
                    attributes=None):
    """Encode payloads sharing publish time, producer, key and attributes (the fast path)."""
    cdef _Pins pins = _Pins()
    cdef Piece shared
    cdef Piece* pieces = NULL
    cdef Py_ssize_t count, i, total = 0
    items = payloads if type(payloads) is tuple else tuple(payloads)
    count = len(items)
    if count == 0:
        return b""
    body_prefix(pins, publish_time, producer_id, key, attributes, &shared)
    pieces = <Piece*>malloc(count * sizeof(Piece))
    if pieces == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            pieces[i] = shared
            pins.payload(items[i], &pieces[i].payload, &pieces[i].payload_len)
            check_body_size(&pieces[i])
            total += FRAME_HEADER_SIZE + piece_body_len(&pieces[i])
        return write_pieces(pieces, count, total, base_offset)
    finally:
        free(pieces)


def encode_records(records, *, base_offset=0):
    """Encode records given as ``(publish_time, producer_id, key, attributes, payload)`` tuples."""
    cdef _Pins pins = _Pins()
    cdef Piece* pieces = NULL
    cdef Py_ssize_t count, i, total = 0
    items = records if type(records) is tuple else tuple(records)
    count = len(items)
    if count == 0:
        return b""
    pieces = <Piece*>malloc(count * sizeof(Piece))
    if pieces == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            publish_time, producer_id, key, attributes, payload = items[i]
            body_prefix(pins, publish_time, producer_id, key, attributes, &pieces[i])
            pins.payload(payload, &pieces[i].payload, &pieces[i].payload_len)
            check_body_size(&pieces[i])
            total += FRAME_HEADER_SIZE + piece_body_len(&pieces[i])
        return write_pieces(pieces, count, total, base_offset)
    finally:
        free(pieces)


# ---------------------------------------------------------------- fields delivery needs

# What a subscriber will decode, checked once per batch on publish (and per delivery,
# so records stored before this check existed cannot stall a subscription): routing
# key, attribute names and values are UTF-8, the producer id is the publisher's.
# Field positions: frame.pxd (the layout: top of _pure/frame.py).

FIELDS_OK = FIELDS_OK_STATUS
FIELDS_BAD_LAYOUT = FIELDS_BAD_LAYOUT_STATUS
FIELDS_KEY_NOT_UTF8 = FIELDS_KEY_NOT_UTF8_STATUS
FIELDS_ATTR_NAME_NOT_UTF8 = FIELDS_ATTR_NAME_NOT_UTF8_STATUS
FIELDS_ATTR_VALUE_NOT_UTF8 = FIELDS_ATTR_VALUE_NOT_UTF8_STATUS
FIELDS_WRONG_PRODUCER = FIELDS_WRONG_PRODUCER_STATUS


cdef inline bint utf8_valid(const unsigned char* s, Py_ssize_t n) noexcept nogil:
    """Exactly what bytes.decode("utf-8") accepts: no overlong forms, no surrogates,
    nothing above U+10FFFF."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c, c1
    while i < n:
        while i + 8 <= n and (ld64(s + i) & 0x8080808080808080ULL) == 0:
            i += 8  # ASCII, eight bytes at a time
        if i >= n:
            break
        c = s[i]
        if c < 0x80:
            i += 1
        elif c < 0xC2:
            return False  # a continuation byte, or an overlong two-byte form
        elif c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False  # overlong, or a surrogate
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
                return False
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
                return False  # overlong, or above U+10FFFF
            i += 4
        else:
            return False
    return True


cdef int check_body_fields(const unsigned char* body, uint64_t body_len, bint check_producer,
                           uint64_t producer_id) noexcept nogil:
    cdef uint64_t attr_count = ld16(body + BODY_ATTR_COUNT_AT)
    cdef uint64_t key_len = ld16(body + BODY_KEY_LEN_AT)
    cdef uint64_t p, name_len, value_len, pid
    cdef uint64_t _attr
    # the layout first (lengths), so the text checks below stay inside the body
    if check_layout(body, <uint32_t>body_len) != FRAME_OK:
        return FIELDS_BAD_LAYOUT_STATUS
    if check_producer:
        pid = ld64(body + BODY_PRODUCER_ID_AT)
        if pid != producer_id and pid != 0:
            return FIELDS_WRONG_PRODUCER_STATUS
    if not utf8_valid(body + FRAME_BODY_FIXED_SIZE, <Py_ssize_t>key_len):
        return FIELDS_KEY_NOT_UTF8_STATUS
    p = FRAME_BODY_FIXED_SIZE + key_len
    for _attr in range(attr_count):
        name_len = ld16(body + p)
        if not utf8_valid(body + p + 2, <Py_ssize_t>name_len):
            return FIELDS_ATTR_NAME_NOT_UTF8_STATUS
        p += 2 + name_len
        value_len = ld32(body + p)
        if not utf8_valid(body + p + 4, <Py_ssize_t>value_len):
            return FIELDS_ATTR_VALUE_NOT_UTF8_STATUS
        p += 4 + value_len
    return FIELDS_OK_STATUS


cdef int check_fields_frames(const unsigned char* buf, Py_ssize_t n, bint check_producer,
                             uint64_t producer_id, Py_ssize_t* error_pos) noexcept nogil:
    cdef Py_ssize_t pos = 0
    cdef uint64_t body_len
    cdef int status
    while pos < n:
        error_pos[0] = pos
        if n - pos < FRAME_HEADER_SIZE:
            return FIELDS_BAD_LAYOUT_STATUS
        body_len = ld32(buf + pos + FRAME_BODY_LEN_AT)
        if body_len < FRAME_MIN_BODY or <uint64_t>(n - pos - FRAME_HEADER_SIZE) < body_len:
            return FIELDS_BAD_LAYOUT_STATUS
        status = check_body_fields(buf + pos + FRAME_HEADER_SIZE, body_len, check_producer, producer_id)
        if status != FIELDS_OK_STATUS:
            return status
        pos += FRAME_HEADER_SIZE + <Py_ssize_t>body_len
    error_pos[0] = -1
    return FIELDS_OK_STATUS


def check_fields(buf, producer_id=None):
    """``(position, reason)`` of the first frame a subscriber could not decode, or
    ``(-1, FIELDS_OK)``: routing key, attribute names and values must be UTF-8 and, with
    ``producer_id``, every frame must carry that producer id or 0 (the encoders' default:
    not set).  Lengths are checked (a frame that does not hold together is
    FIELDS_BAD_LAYOUT); checksums are not (``validate`` does that).  One pass, no Python
    object per record."""
    cdef Py_buffer view
    cdef bint check_producer = producer_id is not None
    cdef uint64_t expected = 0
    cdef Py_ssize_t error_pos = -1
    cdef int status
    if check_producer:
        if producer_id < 0 or producer_id > _U64_MAX:
            raise OverflowError(f"producer_id {producer_id} does not fit in u64")
        expected = producer_id
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        status = check_fields_frames(<const unsigned char*>view.buf, view.len, check_producer,
                                     expected, &error_pos)
    finally:
        PyBuffer_Release(&view)
    return error_pos, status


# ---------------------------------------------------------------- check once (the publish path)

cdef class CheckedFrames(bytearray):
    """A batch ``check_batch`` checked whole (see frame.pxd and ``check_batch``)."""

    def __cinit__(self, *args, **kwargs):
        # check_batch allocates one without this (tp_alloc: the fields are C values, zeroed)
        raise TypeError("CheckedFrames are made by check_batch only")


cdef object _checked_copy(const unsigned char* buf, Py_ssize_t n, uint64_t producer_id, int* status,
                          ValidateResult* res):
    """check_batch's work on ``n`` bytes at ``buf``: the CheckedFrames, or None with the
    failure in ``status`` and ``res`` when a length, checksum or layout is bad."""
    cdef Py_ssize_t error_pos = -1
    cdef int problem = FIELDS_OK_STATUS
    cdef CheckedFrames out
    if n >= NOGIL_BYTES:
        with nogil:
            status[0] = validate_frames(buf, n, 0, 0, False, res)
            if status[0] == FRAME_OK:
                problem = check_fields_frames(buf, n, True, producer_id, &error_pos)
    else:
        status[0] = validate_frames(buf, n, 0, 0, False, res)
        if status[0] == FRAME_OK:
            problem = check_fields_frames(buf, n, True, producer_id, &error_pos)
    if status[0] != FRAME_OK:
        return None
    out = <CheckedFrames>danube_alloc_tuple(CheckedFrames, 0)  # (tp_alloc: the bare object)
    PyByteArray_Resize(out, n)
    memcpy(PyByteArray_AS_STRING(out), buf, n)
    out.frame_count = res.count
    out.nbytes = n
    out.producer_id = producer_id
    out.fields_position = error_pos
    out.fields_problem = problem
    return out


cdef object checked_copy(const unsigned char* buf, Py_ssize_t n, uint64_t producer_id):
    cdef ValidateResult res
    cdef int status
    return _checked_copy(buf, n, producer_id, &status, &res)


def check_batch(buf, uint64_t producer_id):
    """A writable copy of a producer's batch (a :class:`CheckedFrames`), checked once for all
    the publish path asks of it: every length, checksum and layout exactly as :func:`validate`
    checks them (raising what it raises), then the fields as :func:`check_fields` checks them
    for ``producer_id``, whose result is kept on the copy (``fields_position``,
    ``fields_problem``) for the broker to act on at its turn.  The WAL appends the copy
    without validating its frames again; anything else is validated there as before."""
    cdef Py_buffer view
    cdef ValidateResult res
    cdef int status = FRAME_OK
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        out = _checked_copy(<const unsigned char*>view.buf, view.len, producer_id, &status, &res)
        if out is None:
            raise_validate_error(status, &res, -1)
    finally:
        PyBuffer_Release(&view)
    return out

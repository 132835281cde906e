# cython: language_level=3
"""Frames → Arrow column buffers in two C passes, no per-record Python objects.

Input: a buffer of whole frames in the "danube-frames-v1" layout (documented at
the top of danube/_pure/frame.py; field positions from frame.pxd).  Every frame is
checked with ``frame.check_frame`` (length, CRC32C, body layout) before any of
its bytes are used.

Output: a dict of ``bytearray`` buffers laid out as Arrow expects (little-endian):

    count           int      number of frames n
    offset          n × i64  frame offsets
    publish_us      n × i64  publish_time in microseconds (ms × 1000)
    producer_id     n × i64  producer ids (> INT64_MAX is a FrameFormatError)
    key_validity    ⌈n/8⌉    validity bitmap of routing_key (bit i set = key present)
    key_nulls       int      rows without a key
    key_offsets     (n+1) × i32, key_data      routing keys (UTF-8, as stored)
    attr_offsets    (n+1) × i32                attribute entries per row (map offsets)
    name_offsets    (m+1) × i32, name_data     attribute names
    value_offsets   (m+1) × i32, value_data    attribute values
    payload_offsets (n+1) × i32, payload_data  payloads

Strings are copied as stored; callers validate UTF-8 on the Arrow arrays.
The pure-Python twin is danube/_pure/arrowcols.py.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from danube._core.frame cimport (
    BODY_ATTR_COUNT_AT,
    BODY_FLAGS_AT,
    BODY_KEY_LEN_AT,
    BODY_PRODUCER_ID_AT,
    BODY_PUBLISH_TIME_AT,
    FRAME_BODY_FIXED_SIZE,
    FRAME_BODY_LEN_AT,
    FRAME_FLAG_HAS_KEY,
    FRAME_HEADER_SIZE,
    FRAME_OFFSET_AT,
    FRAME_OK,
    FrameInfo,
    check_frame,
    raise_frame_error,
)
from danube._core.le cimport ld16, ld32, ld64

from danube.errors import FrameFormatError

cdef int64_t MAX_I32 = 2147483647
cdef uint64_t MAX_I64 = 9223372036854775807
cdef uint64_t MAX_MS = 9223372036854775  # publish_time × 1000 must fit an i64

# Pass-1 failures that are not frame errors
cdef enum:
    COLS_OK = 0
    COLS_FRAME_ERROR = 1
    COLS_TOO_LARGE = 2
    COLS_PRODUCER_RANGE = 3
    COLS_TIME_RANGE = 4


cdef struct Totals:
    Py_ssize_t count
    Py_ssize_t attrs
    int64_t key_bytes
    int64_t name_bytes
    int64_t value_bytes
    int64_t payload_bytes
    Py_ssize_t error_pos
    int status          # check_frame status when COLS_FRAME_ERROR
    FrameInfo info


cdef int measure(const unsigned char* b, Py_ssize_t n, Totals* t) noexcept nogil:
    """Pass 1: check every frame, count rows, attributes and bytes per column."""
    cdef Py_ssize_t pos = 0, p, end
    cdef const unsigned char* body
    cdef uint16_t _attr, attr_count, key_len, name_len
    cdef uint32_t value_len
    cdef int status
    while pos < n:
        status = check_frame(b, n, pos, &t.info)
        if status != FRAME_OK:
            t.error_pos = pos
            t.status = status
            return COLS_FRAME_ERROR
        body = b + pos + FRAME_HEADER_SIZE
        end = t.info.body_len
        attr_count = ld16(body + BODY_ATTR_COUNT_AT)
        key_len = ld16(body + BODY_KEY_LEN_AT)
        if ld64(body + BODY_PRODUCER_ID_AT) > MAX_I64:
            t.error_pos = pos
            return COLS_PRODUCER_RANGE
        if ld64(body + BODY_PUBLISH_TIME_AT) > MAX_MS:
            t.error_pos = pos
            return COLS_TIME_RANGE
        p = FRAME_BODY_FIXED_SIZE + key_len
        t.key_bytes += key_len
        for _attr in range(attr_count):
            name_len = ld16(body + p)
            t.name_bytes += name_len
            p += 2 + name_len
            value_len = ld32(body + p)
            t.value_bytes += value_len
            p += 4 + value_len
        t.attrs += attr_count
        t.payload_bytes += end - p
        t.count += 1
        pos += FRAME_HEADER_SIZE + t.info.body_len
    if (t.key_bytes > MAX_I32 or t.name_bytes > MAX_I32 or t.value_bytes > MAX_I32
            or t.payload_bytes > MAX_I32 or t.attrs > MAX_I32):
        return COLS_TOO_LARGE
    return COLS_OK


cdef struct Out:
    int64_t* offset
    int64_t* publish_us
    int64_t* producer
    unsigned char* key_validity
    int32_t* key_offsets
    char* key_data
    int32_t* attr_offsets
    int32_t* name_offsets
    char* name_data
    int32_t* value_offsets
    char* value_data
    int32_t* payload_offsets
    char* payload_data


cdef void fill(const unsigned char* b, Py_ssize_t n, Out* o) noexcept nogil:
    """Pass 2: copy every field into its column (frames already checked by pass 1)."""
    cdef Py_ssize_t pos = 0, row = 0, p, end, attr = 0
    cdef const unsigned char* body
    cdef uint16_t _attr, attr_count, key_len, name_len
    cdef uint32_t value_len, body_len
    cdef int32_t key_at = 0, name_at = 0, value_at = 0, payload_at = 0
    o.key_offsets[0] = 0
    o.attr_offsets[0] = 0
    o.name_offsets[0] = 0
    o.value_offsets[0] = 0
    o.payload_offsets[0] = 0
    while pos < n:
        body = b + pos + FRAME_HEADER_SIZE
        body_len = ld32(b + pos + FRAME_BODY_LEN_AT)
        end = body_len
        o.offset[row] = <int64_t>ld64(b + pos + FRAME_OFFSET_AT)
        o.publish_us[row] = <int64_t>ld64(body + BODY_PUBLISH_TIME_AT) * 1000
        o.producer[row] = <int64_t>ld64(body + BODY_PRODUCER_ID_AT)
        attr_count = ld16(body + BODY_ATTR_COUNT_AT)
        key_len = ld16(body + BODY_KEY_LEN_AT)
        if body[BODY_FLAGS_AT] & FRAME_FLAG_HAS_KEY:
            o.key_validity[row >> 3] |= <unsigned char>(1 << (row & 7))
            memcpy(o.key_data + key_at, body + FRAME_BODY_FIXED_SIZE, key_len)
            key_at += key_len
        o.key_offsets[row + 1] = key_at
        p = FRAME_BODY_FIXED_SIZE + key_len
        for _attr in range(attr_count):
            name_len = ld16(body + p)
            memcpy(o.name_data + name_at, body + p + 2, name_len)
            name_at += name_len
            p += 2 + name_len
            value_len = ld32(body + p)
            memcpy(o.value_data + value_at, body + p + 4, value_len)
            value_at += value_len
            p += 4 + value_len
            attr += 1
            o.name_offsets[attr] = name_at
            o.value_offsets[attr] = value_at
        o.attr_offsets[row + 1] = <int32_t>attr
        memcpy(o.payload_data + payload_at, body + p, end - p)
        payload_at += <int32_t>(end - p)
        o.payload_offsets[row + 1] = payload_at
        row += 1
        pos += FRAME_HEADER_SIZE + body_len


cdef bytearray _alloc(Py_ssize_t size):
    # at least one byte so the pointer is valid; the length is trimmed afterwards
    cdef bytearray out = PyByteArray_FromStringAndSize(NULL, size if size > 0 else 1)
    if size == 0:
        del out[:]
    return out


cdef char* _ptr(bytearray b) noexcept:
    return PyByteArray_AS_STRING(b)


def decode_arrow_buffers(buf):
    """Column buffers of a whole frame batch (see the module docstring)."""
    cdef Py_buffer view
    cdef Totals t
    cdef Out o
    cdef int status
    memset(&t, 0, sizeof(Totals))
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            status = measure(<const unsigned char*>view.buf, view.len, &t)
        if status == COLS_FRAME_ERROR:
            raise_frame_error(t.status, t.error_pos, &t.info)
        if status == COLS_PRODUCER_RANGE:
            raise FrameFormatError(f"producer id above 2^63-1 at position {t.error_pos} cannot be a Spark long")
        if status == COLS_TIME_RANGE:
            raise FrameFormatError(f"publish_time at position {t.error_pos} is beyond the timestamp range")
        if status == COLS_TOO_LARGE:
            raise FrameFormatError("a column of this batch exceeds 2 GiB; decode smaller batches")
        n = t.count
        m = t.attrs
        offset = _alloc(8 * n)
        publish_us = _alloc(8 * n)
        producer = _alloc(8 * n)
        key_validity = _alloc((n + 7) // 8)
        key_offsets = _alloc(4 * (n + 1))
        key_data = _alloc(t.key_bytes)
        attr_offsets = _alloc(4 * (n + 1))
        name_offsets = _alloc(4 * (m + 1))
        name_data = _alloc(t.name_bytes)
        value_offsets = _alloc(4 * (m + 1))
        value_data = _alloc(t.value_bytes)
        payload_offsets = _alloc(4 * (n + 1))
        payload_data = _alloc(t.payload_bytes)
        o.offset = <int64_t*>_ptr(offset)
        o.publish_us = <int64_t*>_ptr(publish_us)
        o.producer = <int64_t*>_ptr(producer)
        o.key_validity = <unsigned char*>_ptr(key_validity)
        o.key_offsets = <int32_t*>_ptr(key_offsets)
        o.key_data = _ptr(key_data)
        o.attr_offsets = <int32_t*>_ptr(attr_offsets)
        o.name_offsets = <int32_t*>_ptr(name_offsets)
        o.name_data = _ptr(name_data)
        o.value_offsets = <int32_t*>_ptr(value_offsets)
        o.value_data = _ptr(value_data)
        o.payload_offsets = <int32_t*>_ptr(payload_offsets)
        o.payload_data = _ptr(payload_data)
        memset(o.key_validity, 0, (n + 7) // 8)
        with nogil:
            fill(<const unsigned char*>view.buf, view.len, &o)
    finally:
        PyBuffer_Release(&view)
    return {
        "count": n, "offset": offset, "publish_us": publish_us, "producer_id": producer,
        "key_validity": key_validity, "key_nulls": n - _popcount(key_validity, n),
        "key_offsets": key_offsets, "key_data": key_data,
        "attr_offsets": attr_offsets, "name_offsets": name_offsets, "name_data": name_data,
        "value_offsets": value_offsets, "value_data": value_data,
        "payload_offsets": payload_offsets, "payload_data": payload_data,
    }


cdef Py_ssize_t _popcount(bytearray bitmap, Py_ssize_t n) noexcept:
    cdef const unsigned char* p = <const unsigned char*>PyByteArray_AS_STRING(bitmap)
    cdef Py_ssize_t i, ones = 0
    for i in range(n):
        if p[i >> 3] & (1 << (i & 7)):
            ones += 1
    return ones

# cython: boundscheck=False, wraparound=False, cdivision=True
"""Avro binary payload checks against a compiled program (``danube.schema.avro_program``),
without decoding into objects: the batch lane's payload validation (docs/schema-registry.md).

Same functions and results as the twin ``danube._pure.avrocheck``:
``check_payload(prog, payload) -> -1 | bad position`` and
``check_frames(prog, frames) -> (-1, -1) | (bad frame index, position in its payload)``;
``check_attribute(frames, name, value) -> -1 | index of the first frame without it``.
Frames must already have passed ``danube.message_codec.validate``.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t, uint8_t
from libc.string cimport memcmp

from danube._core.frame cimport (
    BODY_ATTR_COUNT_AT, BODY_KEY_LEN_AT, FRAME_BODY_FIXED_SIZE, FRAME_BODY_LEN_AT, FRAME_HEADER_SIZE,
)
from danube._core.le cimport ld16, ld32

cdef enum:
    OP_NULL = 0
    OP_BOOLEAN = 1
    OP_INT = 2
    OP_LONG = 3
    OP_FLOAT = 4
    OP_DOUBLE = 5
    OP_BYTES = 6
    OP_STRING = 7
    OP_FIXED = 8
    OP_ENUM = 9
    OP_UNION = 10
    OP_ARRAY = 11
    OP_MAP = 12
    OP_RECORD = 13
    MAX_DEPTH = 256
    ZERO_WIDTH_ITEMS = 1048576


cdef struct Cursor:
    const uint8_t* buf
    Py_ssize_t pos
    Py_ssize_t end
    Py_ssize_t bad        # first bad position, -1 while fine


cdef inline bint _fail(Cursor* c, Py_ssize_t at) noexcept nogil:
    if c.bad < 0:
        c.bad = at
    return False


cdef inline bint _varint(Cursor* c, int max_bytes, int64_t* out) noexcept nogil:
    cdef uint64_t acc = 0
    cdef int shift = 0
    cdef int _i
    cdef uint8_t b
    for _i in range(max_bytes):
        if c.pos >= c.end:
            return _fail(c, c.pos)
        b = c.buf[c.pos]
        c.pos += 1
        acc |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = <int64_t>(acc >> 1) ^ -(<int64_t>(acc & 1))
            return True
        shift += 7
    return _fail(c, c.pos)


cdef bint _utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0
    cdef uint8_t b
    cdef int need, k
    cdef unsigned int cp
    while i < n:
        b = s[i]
        if b < 0x80:
            i += 1
            continue
        if 0xC2 <= b <= 0xDF:
            need = 1
            cp = b & 0x1F
        elif 0xE0 <= b <= 0xEF:
            need = 2
            cp = b & 0x0F
        elif 0xF0 <= b <= 0xF4:
            need = 3
            cp = b & 0x07
        else:
            return False
        if i + need >= n:
            return False
        for k in range(1, need + 1):
            b = s[i + k]
            if (b & 0xC0) != 0x80:
                return False
            cp = (cp << 6) | (b & 0x3F)
        if need == 2 and (cp < 0x800 or (0xD800 <= cp <= 0xDFFF)):
            return False
        if need == 3 and (cp < 0x10000 or cp > 0x10FFFF):
            return False
        i += need + 1
    return True


cdef bint _check(const int32_t* prog, Py_ssize_t plen, int32_t node, Cursor* c, int depth) noexcept nogil:
    cdef int32_t op
    cdef int64_t v, count, ignored
    cdef Py_ssize_t start, n, _i, k
    cdef int32_t child
    if depth > MAX_DEPTH:
        return _fail(c, c.pos)
    op = OP_STRING if node < 0 else prog[node]
    start = c.pos
    if op == OP_NULL:
        return True
    if op == OP_BOOLEAN:
        if c.pos >= c.end:   # any byte, as fastavro's reader (and Avro's Java one) take it
            return _fail(c, c.pos)
        c.pos += 1
        return True
    if op == OP_INT or op == OP_LONG:   # no 32-bit range check for int: fastavro's reader has none
        return _varint(c, 10, &v)
    if op == OP_FLOAT or op == OP_DOUBLE:
        n = 4 if op == OP_FLOAT else 8
        if c.pos + n > c.end:
            return _fail(c, start)
        c.pos += n
        return True
    if op == OP_BYTES or op == OP_STRING:
        if not _varint(c, 10, &v):
            return False
        if v < 0 or v > c.end - c.pos:
            return _fail(c, start)
        if op == OP_STRING and not _utf8(c.buf + c.pos, <Py_ssize_t>v):
            return _fail(c, c.pos)
        c.pos += <Py_ssize_t>v
        return True
    if op == OP_FIXED:
        n = prog[node + 1]
        if c.pos + n > c.end:
            return _fail(c, start)
        c.pos += n
        return True
    if op == OP_ENUM:
        if not _varint(c, 10, &v):
            return False
        if v < 0 or v >= prog[node + 1]:
            return _fail(c, start)
        return True
    if op == OP_UNION:
        if not _varint(c, 10, &v):
            return False
        if v < 0 or v >= prog[node + 1]:
            return _fail(c, start)
        return _check(prog, plen, prog[node + 2 + v], c, depth + 1)
    if op == OP_ARRAY or op == OP_MAP:
        child = prog[node + 1]
        while True:
            if not _varint(c, 10, &count):
                return False
            if count == 0:
                return True
            if count < 0:
                count = -count
                if not _varint(c, 10, &ignored):
                    return False
            if count > c.end - c.pos + ZERO_WIDTH_ITEMS:
                return _fail(c, c.pos)
            for _i in range(count):
                if op == OP_MAP and not _check(prog, plen, -1, c, depth + 1):
                    return False
                if not _check(prog, plen, child, c, depth + 1):
                    return False
    if op == OP_RECORD:
        n = prog[node + 1]
        for k in range(n):
            if not _check(prog, plen, prog[node + 2 + k], c, depth + 1):
                return False
        return True
    return _fail(c, c.pos)


cdef Py_ssize_t _check_one(const int32_t* prog, Py_ssize_t plen, const uint8_t* buf, Py_ssize_t n) noexcept nogil:
    cdef Cursor c
    c.buf = buf
    c.pos = 0
    c.end = n
    c.bad = -1
    if not _check(prog, plen, 0, &c, 0):
        return c.bad if c.bad >= 0 else c.pos
    return -1 if c.pos == n else c.pos


def check_payload(const int32_t[::1] prog, const uint8_t[::1] payload):
    cdef Py_ssize_t n = payload.shape[0]
    cdef const uint8_t* p = &payload[0] if n else <const uint8_t*>b""
    return _check_one(&prog[0], prog.shape[0], p, n)


def check_frames(const int32_t[::1] prog, const uint8_t[::1] frames):
    cdef Py_ssize_t n = frames.shape[0]
    cdef const uint8_t* buf
    cdef Py_ssize_t pos = 0, body, end, p, index = 0, bad
    cdef uint64_t body_len, attr_count, key_len, name_len, value_len, _a
    if n == 0:
        return -1, -1
    buf = &frames[0]
    with nogil:
        while pos + FRAME_HEADER_SIZE <= n:
            body_len = ld32(buf + pos + FRAME_BODY_LEN_AT)
            body = pos + FRAME_HEADER_SIZE
            end = body + <Py_ssize_t>body_len
            attr_count = ld16(buf + body + BODY_ATTR_COUNT_AT)
            key_len = ld16(buf + body + BODY_KEY_LEN_AT)
            p = body + FRAME_BODY_FIXED_SIZE + <Py_ssize_t>key_len
            for _a in range(attr_count):
                name_len = ld16(buf + p)
                p += 2 + <Py_ssize_t>name_len
                value_len = ld32(buf + p)
                p += 4 + <Py_ssize_t>value_len
            bad = _check_one(&prog[0], prog.shape[0], buf + p, end - p)
            if bad >= 0:
                break
            pos = end
            index += 1
    if pos + FRAME_HEADER_SIZE <= n:
        return index, bad
    return -1, -1


cdef inline bint _same(const uint8_t* a, Py_ssize_t na, const uint8_t* b, Py_ssize_t nb) noexcept nogil:
    return na == nb and (nb == 0 or memcmp(a, b, nb) == 0)


def check_attribute(const uint8_t[::1] frames, const uint8_t[::1] name, const uint8_t[::1] value):
    """Index of the first frame without the attribute ``name`` equal to ``value`` (a batch that
    names its schema must tag every message with it), or -1."""
    cdef Py_ssize_t n = frames.shape[0]
    cdef const uint8_t* buf
    cdef const uint8_t* at
    cdef Py_ssize_t pos = 0, body, p, index = 0
    cdef uint64_t body_len, attr_count, key_len, name_len, value_len, _a
    cdef bint found
    cdef const uint8_t* want_name = &name[0]
    cdef const uint8_t* want_value = &value[0]
    cdef Py_ssize_t want_name_len = name.shape[0], want_value_len = value.shape[0]
    if n == 0:
        return -1
    buf = &frames[0]
    with nogil:
        while pos + FRAME_HEADER_SIZE <= n:
            body_len = ld32(buf + pos + FRAME_BODY_LEN_AT)
            body = pos + FRAME_HEADER_SIZE
            attr_count = ld16(buf + body + BODY_ATTR_COUNT_AT)
            key_len = ld16(buf + body + BODY_KEY_LEN_AT)
            p = body + FRAME_BODY_FIXED_SIZE + <Py_ssize_t>key_len
            found = False
            for _a in range(attr_count):
                name_len = ld16(buf + p)
                at = buf + p + 2
                value_len = ld32(at + name_len)
                if _same(at, <Py_ssize_t>name_len, want_name, want_name_len):
                    found = _same(at + name_len + 4, <Py_ssize_t>value_len, want_value, want_value_len)
                    break
                p += 6 + <Py_ssize_t>name_len + <Py_ssize_t>value_len
            if not found:
                break
            pos = body + <Py_ssize_t>body_len
            index += 1
    return index if pos + FRAME_HEADER_SIZE <= n else -1

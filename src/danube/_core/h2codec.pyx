# cython: language_level=3, cdivision=True, boundscheck=False, wraparound=False
#
# HTTP/2 frames (RFC 9113 sections 4 and 6) and gRPC length-prefixed messages, as the broker's
# own gRPC server (danube/server/h2grpc) reads and writes them.  Byte by byte:
#
# HTTP/2 frame: a 9-byte header, then the payload.
#
#     offset  size  field
#     0       3     payload length L, unsigned big-endian (at most the receiver's
#                   SETTINGS_MAX_FRAME_SIZE; 16384 until the receiver says otherwise)
#     3       1     type: 0 DATA, 1 HEADERS, 2 PRIORITY, 3 RST_STREAM, 4 SETTINGS,
#                   5 PUSH_PROMISE, 6 PING, 7 GOAWAY, 8 WINDOW_UPDATE, 9 CONTINUATION;
#                   other types are passed up and ignored there
#     4       1     flags: 0x01 END_STREAM (DATA, HEADERS) or ACK (SETTINGS, PING),
#                   0x04 END_HEADERS (HEADERS, CONTINUATION), 0x08 PADDED (DATA,
#                   HEADERS), 0x20 PRIORITY (HEADERS)
#     5       4     1 reserved bit (ignored on receipt) + 31-bit stream id, big-endian
#     9       L     payload
#
# Payloads looked into:
#
#     DATA          [1 pad length P, if PADDED] data [P bytes of padding]
#     HEADERS       [1 pad length P, if PADDED] [4 stream dependency + 1 weight, if
#                   PRIORITY] header block fragment (HPACK) [P bytes of padding]
#                   (P must leave at least the pad length byte itself: P < L)
#     CONTINUATION  header block fragment
#     RST_STREAM    4 error code
#     SETTINGS      (2 identifier + 4 value) repeated, all big-endian; empty with ACK
#     PING          8 opaque bytes, echoed back with ACK
#     GOAWAY        4 (reserved bit + last stream id) + 4 error code + debug data
#     WINDOW_UPDATE 4 (reserved bit + 31-bit increment, 1..2^31-1)
#
# gRPC length-prefixed message ("Length-Prefixed-Message" of gRPC over HTTP/2), repeated back
# to back in a stream's DATA payloads (without their padding), split across DATA frames anywhere:
#
#     offset  size  field
#     0       1     compressed flag: bit 0 set = compressed with the stream's grpc-encoding
#                   (refused: this server does not decompress); bits 1-7 reserved, ignored
#     1       4     message length N, unsigned big-endian (at most the receive limit)
#     5       N     the serialized message (protobuf here)
#
# Both parsers work on whole buffers: one call takes every complete frame (or message) at the
# start of a receive buffer and stops at the first incomplete one, whose bytes wait for the next
# read.  A length over its limit is refused from the header alone, before the body arrives, so
# what a peer can make the server buffer is bounded by the limits, not by what it claims.
#
# Semantics are those of the pure twin (danube/_pure/h2codec.py), which owns the error classes:
# the same results, and the same errors with the same messages, for the same bytes
# (tests/unit/_core/test_h2codec_differential.py).  Everything runs with the GIL held; a
# source buffer is exported (so a bytearray cannot be resized) while it is read.

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_FromStringAndSize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t
from libc.string cimport memcpy

from danube._pure.h2codec import CompressedMessage, FrameError, MessageTooLarge

HEADER_SIZE = H2_HEADER_SIZE
PREFIX_SIZE = GRPC_PREFIX_SIZE

DATA = 0
HEADERS = 1
CONTINUATION = 9
PADDED = 0x08
PROTOCOL_ERROR = 0x1
FRAME_SIZE_ERROR = 0x6

cdef enum:
    _HEADERS = 1
    _CONTINUATION = 9
    _PADDED = 0x08
    _PROTOCOL_ERROR = 0x1
    _FRAME_SIZE_ERROR = 0x6
    _MAX_LENGTH = 0xFFFFFF

cdef object _COMPRESSED_TEXT = ("compressed messages are not supported by this server "
                                "(send with grpc-encoding identity)")


cdef inline uint32_t be32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline void put_header(unsigned char* p, Py_ssize_t length, unsigned char kind, unsigned char flags,
                            uint32_t stream_id) noexcept nogil:
    p[0] = <unsigned char>(length >> 16)
    p[1] = <unsigned char>(length >> 8)
    p[2] = <unsigned char>length
    p[3] = kind
    p[4] = flags
    p[5] = <unsigned char>(stream_id >> 24)
    p[6] = <unsigned char>(stream_id >> 16)
    p[7] = <unsigned char>(stream_id >> 8)
    p[8] = <unsigned char>stream_id


# ------------------------------------------------------------------ HTTP/2 frames

cdef Py_ssize_t split_frames(const unsigned char* buf, Py_ssize_t n, Py_ssize_t max_frame_size,
                             long long max_frames, long long max_headers, long long max_header_bytes,
                             list out) except -1:
    cdef Py_ssize_t start = 0
    cdef Py_ssize_t length
    cdef Py_ssize_t payload_start
    cdef const unsigned char* p
    cdef unsigned char kind
    while n - start >= H2_HEADER_SIZE and max_frames > 0:
        p = buf + start
        length = (<Py_ssize_t>p[0] << 16) | (<Py_ssize_t>p[1] << 8) | <Py_ssize_t>p[2]
        if length > max_frame_size:
            raise FrameError(_FRAME_SIZE_ERROR, f"a {length}-byte frame is over the {max_frame_size}-byte limit")
        payload_start = start + H2_HEADER_SIZE
        if n - payload_start < length:
            break
        kind = p[3]
        out.append((kind, p[4], be32(p + 5) & 0x7FFFFFFF,
                    PyBytes_FromStringAndSize(<const char*>buf + payload_start, length)))
        start = payload_start + length
        max_frames -= 1
        if kind == _HEADERS or kind == _CONTINUATION:
            max_header_bytes -= length
            if kind == _HEADERS:
                max_headers -= 1
            if max_headers <= 0 or max_header_bytes <= 0:
                break
    return start


def parse_frames(buffer, Py_ssize_t max_frame_size, long long max_frames=1 << 62, long long max_headers=1 << 62,
                 long long max_header_bytes=1 << 62):
    cdef Py_buffer view
    cdef Py_ssize_t used
    cdef list frames = []
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        used = split_frames(<const unsigned char*>view.buf, view.len, max_frame_size, max_frames, max_headers,
                            max_header_bytes, frames)
    finally:
        PyBuffer_Release(&view)
    return frames, used


cdef int check_length(Py_ssize_t length) except -1:
    if length < 0 or length > _MAX_LENGTH:
        raise OverflowError(f"a frame payload of {length} bytes is outside 0..2^24-1")
    return 0


def frame_header(unsigned char kind, unsigned char flags, uint32_t stream_id, Py_ssize_t length):
    check_length(length)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, H2_HEADER_SIZE)
    put_header(<unsigned char*>PyBytes_AS_STRING(out), length, kind, flags, stream_id)
    return out


def frame(unsigned char kind, unsigned char flags, uint32_t stream_id, payload=b""):
    cdef Py_buffer view
    cdef bytes out
    cdef unsigned char* p
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        check_length(view.len)
        out = PyBytes_FromStringAndSize(NULL, H2_HEADER_SIZE + view.len)
        p = <unsigned char*>PyBytes_AS_STRING(out)
        put_header(p, view.len, kind, flags, stream_id)
        if view.len:
            memcpy(p + H2_HEADER_SIZE, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def unpadded(payload, int flags):
    cdef Py_buffer view
    cdef Py_ssize_t pad
    if not flags & _PADDED:
        return payload
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        if view.len == 0 or (<const unsigned char*>view.buf)[0] >= view.len:
            raise FrameError(_PROTOCOL_ERROR, "the padding is as long as the frame or longer")
        pad = (<const unsigned char*>view.buf)[0]
    finally:
        PyBuffer_Release(&view)
    return payload[1:len(payload) - pad]


def parse_settings(payload):
    cdef Py_buffer view
    cdef Py_ssize_t pos
    cdef const unsigned char* p
    cdef list out = []
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        if view.len % 6:
            raise FrameError(_FRAME_SIZE_ERROR, f"a SETTINGS payload of {view.len} bytes is not a multiple of 6")
        p = <const unsigned char*>view.buf
        for pos in range(0, view.len, 6):
            out.append(((p[pos] << 8) | p[pos + 1], be32(p + pos + 2)))
    finally:
        PyBuffer_Release(&view)
    return out


def parse_u32(payload, what):
    cdef Py_buffer view
    cdef uint32_t value
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        if view.len != 4:
            raise FrameError(_FRAME_SIZE_ERROR, f"a {what} payload must be 4 bytes, got {view.len}")
        value = be32(<const unsigned char*>view.buf)
    finally:
        PyBuffer_Release(&view)
    return value


# ------------------------------------------------------------------ gRPC messages

cdef inline void put_prefix(unsigned char* p, uint32_t length) noexcept nogil:
    p[0] = 0  # not compressed
    p[1] = <unsigned char>(length >> 24)
    p[2] = <unsigned char>(length >> 16)
    p[3] = <unsigned char>(length >> 8)
    p[4] = <unsigned char>length


def message_prefix(uint32_t length):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, GRPC_PREFIX_SIZE)
    put_prefix(<unsigned char*>PyBytes_AS_STRING(out), length)
    return out


def data_header(uint32_t stream_id, Py_ssize_t length):
    if length < 0:
        raise OverflowError(f"a frame payload of {length + GRPC_PREFIX_SIZE} bytes is outside 0..2^24-1")
    check_length(length + GRPC_PREFIX_SIZE)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, H2_HEADER_SIZE + GRPC_PREFIX_SIZE)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    put_header(p, length + GRPC_PREFIX_SIZE, 0, 0, stream_id)
    put_prefix(p + H2_HEADER_SIZE, <uint32_t>length)
    return out


def frame_message(list out, uint32_t stream_id, data, Py_ssize_t stream_window, Py_ssize_t connection_window,
                  Py_ssize_t frame_limit):
    # The length is summed here, not by ``Encoded.length``: a Python property per message sent.
    cdef Py_ssize_t length = 0
    cdef Py_ssize_t total
    cdef bint parts = isinstance(data, tuple)
    cdef bytes header
    cdef unsigned char* p
    if parts:
        for part in <tuple>data:
            length += len(part)
    else:
        length = len(data)
    total = length + GRPC_PREFIX_SIZE
    if total > stream_window or total > connection_window or total > frame_limit:
        return 0
    check_length(total)
    header = PyBytes_FromStringAndSize(NULL, H2_HEADER_SIZE + GRPC_PREFIX_SIZE)
    p = <unsigned char*>PyBytes_AS_STRING(header)
    put_header(p, total, 0, 0, stream_id)
    put_prefix(p + H2_HEADER_SIZE, <uint32_t>length)
    out.append(header)
    if parts:
        out.extend(<tuple>data)
    else:
        out.append(data)
    return total


MAX_FIELDS = 15
cdef object _U64_MAX = 2**64 - 1


cdef Py_ssize_t put_fields(unsigned char* p, tuple fields) except -1:
    # The varint fields into p (room for MAX_FIELDS * 11 bytes); the bytes written.
    cdef Py_ssize_t n = 0
    cdef unsigned long long value
    cdef unsigned char number = 0
    for item in fields:
        number += 1
        if type(item) is not int or item < 0 or item > _U64_MAX:
            raise ValueError(f"field {number}: {item!r} is not a uint64")
        value = item
        if value:
            p[n] = number << 3
            n += 1
            while value >= 0x80:
                p[n] = <unsigned char>((value & 0x7F) | 0x80)
                n += 1
                value >>= 7
            p[n] = <unsigned char>value
            n += 1
    return n


cdef inline int check_fields(tuple fields) except -1:
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"{len(fields)} fields (at most {MAX_FIELDS})")
    return 0


def uint_fields(fields):
    cdef unsigned char buf[15 * 11]
    check_fields(fields)
    return PyBytes_FromStringAndSize(<const char*>buf, put_fields(buf, fields))


def frame_fields(list out, uint32_t stream_id, tuple fields, Py_ssize_t stream_window, Py_ssize_t connection_window,
                 Py_ssize_t frame_limit):
    cdef unsigned char buf[H2_HEADER_SIZE + GRPC_PREFIX_SIZE + 15 * 11]
    check_fields(fields)
    cdef Py_ssize_t length = put_fields(buf + H2_HEADER_SIZE + GRPC_PREFIX_SIZE, fields)
    cdef Py_ssize_t total = length + GRPC_PREFIX_SIZE
    if total > stream_window or total > connection_window or total > frame_limit:
        return 0
    put_header(buf, total, 0, 0, stream_id)
    put_prefix(buf + H2_HEADER_SIZE, <uint32_t>length)
    out.append(PyBytes_FromStringAndSize(<const char*>buf, H2_HEADER_SIZE + total))
    return total


cdef Py_ssize_t split_messages(const unsigned char* buf, Py_ssize_t n, Py_ssize_t limit, list out) except -1:
    cdef Py_ssize_t start = 0
    cdef Py_ssize_t length
    while n - start >= GRPC_PREFIX_SIZE:
        length = be32(buf + start + 1)
        if buf[start] & 0x01:
            raise CompressedMessage(_COMPRESSED_TEXT)
        if length > limit:
            raise MessageTooLarge(length, limit)
        if n - start - GRPC_PREFIX_SIZE < length:
            break
        out.append(PyBytes_FromStringAndSize(<const char*>buf + start + GRPC_PREFIX_SIZE, length))
        start += GRPC_PREFIX_SIZE + length
    return start


cdef class MessageReader:

    def __init__(self, Py_ssize_t limit):
        self._buffer = bytearray()
        self._limit = limit
        self.pending = 0

    def feed(self, data):
        cdef Py_buffer view
        cdef Py_ssize_t used
        cdef Py_ssize_t before
        cdef list messages = []
        if self.pending == 0:
            # The usual case (a unary request in one DATA frame): cut straight from ``data``,
            # keep only an unfinished tail.
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            try:
                used = split_messages(<const unsigned char*>view.buf, view.len, self._limit, messages)
                if used < view.len:
                    self._buffer = PyByteArray_FromStringAndSize(<const char*>view.buf + used, view.len - used)
                    self.pending = view.len - used
            finally:
                PyBuffer_Release(&view)
            return messages
        before = len(self._buffer)
        self._buffer += data
        try:
            PyObject_GetBuffer(self._buffer, &view, PyBUF_SIMPLE)
            try:
                used = split_messages(<const unsigned char*>view.buf, view.len, self._limit, messages)
            finally:
                PyBuffer_Release(&view)
        except BaseException:
            del self._buffer[before:]   # a refused feed leaves the reader as it was
            raise
        if used:
            del self._buffer[:used]
        self.pending = len(self._buffer)
        return messages

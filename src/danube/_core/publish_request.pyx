# cython: language_level=3
"""The batch lane's ``PublishRequest`` read from its protobuf bytes in one call.

The bytes, field by field, and how they are read (as protobuf's upb runtime reads them: last
field wins, unknown fields and other wire types skipped, varints of at most 10 bytes, tags
and lengths of at most 5, groups nested at most 100 deep): the docstring of
``danube/_pure/publish_request.py``, the pure twin, which must give the same fields and
refuse the same bytes (``tests/unit/_core/test_publish_request.py`` runs both against
protobuf).  Here the walk is one C loop; the handler then reads plain attributes instead of
a protobuf message's fields through ``WhichOneof``/``HasField``.

A request naming its producer by id gets its frames checked here, as the lane would check them
for that producer (``frame.check_batch``): ``frames`` is then the checked copy
(``CheckedFrames``), else the bytes (a batch the check refuses, an empty one, or one whose
producer is created by the request), which the lane checks itself and refuses as before.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t

from danube._core.frame cimport checked_copy

from danube.errors import MalformedRequestError
from danube.proto.danube_batch import batch_pb2 as _pb

cdef object _ProducerSpec = _pb.ProducerSpec
cdef uint64_t _MAX_LENGTH = 0x7FFFFFFF
MAX_GROUP_DEPTH = 100
cdef int _MAX_GROUP_DEPTH = 100


cdef class PublishRequest:
    """The fields of one ``PublishRequest`` (see the pure twin's class)."""

    def __init__(self, sequence, producer_id, create, frames, partitioning_version, schema_id,
                 schema_version):
        self.sequence = sequence
        self.producer_id = producer_id
        self.create = create
        self.frames = frames
        self.partitioning_version = partitioning_version
        self.schema_id = schema_id
        self.schema_version = schema_version

    def __repr__(self):
        return (
            f"PublishRequest(sequence={self.sequence}, producer_id={self.producer_id}, "
            f"create={self.create!r}, frames=<{len(self.frames)} bytes>, "
            f"partitioning_version={self.partitioning_version}, schema_id={self.schema_id}, "
            f"schema_version={self.schema_version})"
        )


cdef int _bad(str what, Py_ssize_t pos) except -1:
    raise MalformedRequestError(f"malformed PublishRequest: {what} at byte {pos}")


cdef Py_ssize_t _varint(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, int limit,
                        str what, uint64_t* value) except -1:
    """The position after the varint at ``pos`` (at most ``limit`` bytes); its value (bits
    beyond 64 dropped) in ``value``."""
    cdef uint64_t v = 0
    cdef unsigned int shift = 0
    cdef Py_ssize_t start = pos
    cdef unsigned char b
    while True:
        if pos >= end:
            _bad(f"{what} runs past the end", start)
        if pos - start >= limit:
            _bad(f"{what} longer than {limit} bytes", start)
        b = p[pos]
        pos += 1
        if shift < 64:
            v |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            value[0] = v
            return pos
        shift += 7


cdef Py_ssize_t _tag(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, uint32_t* field,
                     int* wire_type, bint in_group=False) except -1:
    # field number 0: refused in a message, read inside a group being skipped (as upb does)
    cdef uint64_t tag
    cdef Py_ssize_t nxt = _varint(p, pos, end, 5, "tag", &tag)
    if tag > 0xFFFFFFFFu:
        _bad("tag above 2**32", pos)
    if (tag >> 3) == 0 and not in_group:
        _bad("field number 0", pos)
    field[0] = <uint32_t>(tag >> 3)
    wire_type[0] = <int>(tag & 7)
    return nxt


cdef Py_ssize_t _length(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end,
                        Py_ssize_t* start) except -1:
    """The end of the length-delimited value at ``pos``; its start in ``start``."""
    cdef uint64_t length
    cdef Py_ssize_t nxt = _varint(p, pos, end, 5, "length", &length)
    if length > _MAX_LENGTH or length > <uint64_t>(end - nxt):
        _bad(f"length {length} past the end", pos)
    start[0] = nxt
    return nxt + <Py_ssize_t>length


cdef Py_ssize_t _skip(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, uint32_t field,
                      int wire_type, int depth, int max_depth) except -1:
    cdef uint64_t ignored
    cdef Py_ssize_t start
    cdef uint32_t inner
    cdef int inner_type
    if wire_type == 0:
        return _varint(p, pos, end, 10, "varint", &ignored)
    if wire_type == 1 or wire_type == 5:
        if end - pos < (8 if wire_type == 1 else 4):
            _bad("fixed-size value runs past the end", pos)
        return pos + (8 if wire_type == 1 else 4)
    if wire_type == 2:
        return _length(p, pos, end, &start)
    if wire_type == 3:
        if depth >= max_depth:
            _bad(f"groups nested deeper than {max_depth}", pos)
        while True:
            pos = _tag(p, pos, end, &inner, &inner_type, True)
            if inner_type == 4:
                if inner != field:
                    _bad(f"group {field} ended by field {inner}", pos)
                return pos
            pos = _skip(p, pos, end, inner, inner_type, depth + 1, max_depth)
    if wire_type == 4:
        _bad("end of a group never started", pos)
    _bad(f"wire type {wire_type}", pos)
    return -1


cdef int _check_message(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end,
                        int max_depth) except -1:
    cdef uint32_t field
    cdef int wire_type
    while pos < end:
        pos = _tag(p, pos, end, &field, &wire_type)
        pos = _skip(p, pos, end, field, wire_type, 0, max_depth)
    return 0


def parse(data):
    """The fields of the ``PublishRequest`` in ``data`` (bytes or any buffer)."""
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef Py_ssize_t pos = 0, end, start, stop
    cdef uint32_t field
    cdef int wire_type
    cdef uint64_t value
    cdef uint64_t sequence = 0
    cdef uint64_t producer = 0
    cdef Py_ssize_t frames_start = 0, frames_stop = -1  # the last frames field read (-1: none)
    cdef object producer_id = None
    cdef object create = None
    cdef object frames = b""
    cdef object partitioning_version = None
    cdef object schema_id = None
    cdef object schema_version = None
    cdef PublishRequest out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char*>view.buf
        end = view.len
        while pos < end:
            pos = _tag(p, pos, end, &field, &wire_type)
            if wire_type == 0 and (field == 1 or field == 2 or field == 5 or field == 6 or field == 7):
                pos = _varint(p, pos, end, 10, "varint", &value)
                if field == 1:
                    sequence = value
                elif field == 2:
                    producer_id = value
                    producer = value
                    create = None
                elif field == 5:
                    partitioning_version = value
                elif field == 6:
                    schema_id = value
                else:
                    schema_version = <uint32_t>value
            elif wire_type == 2 and (field == 3 or field == 4):
                stop = _length(p, pos, end, &start)
                if field == 4:
                    frames_start = start
                    frames_stop = stop
                else:
                    _check_message(p, start, stop, _MAX_GROUP_DEPTH - 1)
                    if create is None:
                        create = _ProducerSpec()
                        producer_id = None
                    try:
                        create.MergeFromString(PyBytes_FromStringAndSize(<const char*>p + start, stop - start))
                    except Exception as exc:  # protobuf's DecodeError, said as ours
                        _bad(f"create does not parse ({exc})", start)
                pos = stop
            else:
                pos = _skip(p, pos, end, field, wire_type, 0, _MAX_GROUP_DEPTH)
        if frames_stop >= 0:
            frames = None
            if frames_stop > frames_start and producer_id is not None:
                # checked here for the producer that publishes it: one copy, no check_batch call
                frames = checked_copy(p + frames_start, frames_stop - frames_start, producer)
            if frames is None:
                frames = PyBytes_FromStringAndSize(<const char*>p + frames_start, frames_stop - frames_start)
    finally:
        PyBuffer_Release(&view)
    out = PublishRequest.__new__(PublishRequest)
    out.sequence = sequence
    out.producer_id = producer_id
    out.create = create
    out.frames = frames
    out.partitioning_version = partitioning_version
    out.schema_id = schema_id
    out.schema_version = schema_version
    return out

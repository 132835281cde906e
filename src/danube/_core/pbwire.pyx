# cython: language_level=3
"""Protobuf messages written by hand around a buffer the caller shares (never copied), and the
Consume stream's ack requests read from their bytes.

Semantics, and the bytes ``read_ack`` takes, byte by byte: the docstring of
``danube/_pure/pbwire.py`` (the pure twin, which must return the same bytes and read the same
requests for the same calls).  A delivery's fields cost a few C stores here instead of a
protobuf message object per delivery; an ack's, one C walk instead of a protobuf message and
the wrapper objects its fields' reads make.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New
from libc.stdint cimport uint32_t, uint64_t

from danube.proto.danube_batch import batch_pb2 as _pb

cdef object _from_string = _pb.ConsumeRequest.FromString
MAX_ACK_SPAN = 1_000_000
cdef uint64_t _MAX_ACK_SPAN = 1_000_000


cdef extern from "Python.h":
    PyTypeObject PyTuple_Type
    int PyType_IsSubtype(PyTypeObject* a, PyTypeObject* b)
    # (a new reference, its items NULL: safe for the GC until they are set)
    object PyType_GenericAlloc(PyTypeObject* t, Py_ssize_t nitems)
    void _set_item "PyTuple_SET_ITEM"(object p, Py_ssize_t pos, object o)


cdef inline Py_ssize_t _put(unsigned char* p, uint64_t v) noexcept:
    cdef Py_ssize_t n = 0
    while v >= 0x80:
        p[n] = <unsigned char>((v & 0x7F) | 0x80)
        v >>= 7
        n += 1
    p[n] = <unsigned char>v
    return n + 1


cdef inline Py_ssize_t _size(uint64_t v) noexcept:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef int _parts(object out, object frames, uint64_t first, uint64_t last, uint32_t count) except -1:
    """Sets the three parts into ``out`` (a fresh tuple, or tuple subclass, of three NULL items)."""
    cdef unsigned char rest[33]
    cdef unsigned char head[22]
    cdef Py_ssize_t r = 0
    cdef Py_ssize_t h = 0
    cdef Py_ssize_t size = len(frames)
    cdef Py_ssize_t inner
    if first:
        rest[r] = 0x10
        r += 1 + _put(rest + r + 1, first)
    if last:
        rest[r] = 0x18
        r += 1 + _put(rest + r + 1, last)
    if count:
        rest[r] = 0x20
        r += 1 + _put(rest + r + 1, count)
    inner = 1 + _size(<uint64_t>size) + size + r
    head[0] = 0x12
    h = 1 + _put(head + 1, <uint64_t>inner)
    head[h] = 0x0A
    h += 1 + _put(head + h + 1, <uint64_t>size)
    head_bytes = PyBytes_FromStringAndSize(<char*>head, h)
    rest_bytes = PyBytes_FromStringAndSize(<char*>rest, r)
    # (PyTuple_SET_ITEM steals a reference: one each for the tuple)
    Py_INCREF(head_bytes)
    _set_item(out, 0, head_bytes)
    Py_INCREF(frames)
    _set_item(out, 1, frames)
    Py_INCREF(rest_bytes)
    _set_item(out, 2, rest_bytes)
    return 0


def consume_batch(frames, uint64_t first, uint64_t last, uint32_t count):
    out = PyTuple_New(3)
    _parts(out, frames, first, last, count)
    return out


def consume_batch_as(type cls, frames, uint64_t first, uint64_t last, uint32_t count):
    if cls is tuple or not PyType_IsSubtype(<PyTypeObject*>cls, &PyTuple_Type):
        raise TypeError(f"{cls.__name__} is not a subclass of tuple")
    out = PyType_GenericAlloc(<PyTypeObject*>cls, 3)
    _parts(out, frames, first, last, count)
    return out


cdef class AckRequest:
    """A ``ConsumeRequest`` of kind ``ack``, as ``read_ack`` reads it (see the pure twin)."""

    def __init__(self, consumer_id, list ranges, bint checked):
        self.consumer_id = consumer_id
        self.ranges = ranges
        self.checked = checked

    def WhichOneof(self, name):
        if name != "kind":
            raise ValueError(f"ConsumeRequest has no oneof {name!r}")
        return "ack"

    @property
    def ack(self):
        return self

    def __repr__(self):
        return f"AckRequest(consumer_id={self.consumer_id}, ranges={self.ranges!r}, checked={self.checked})"


cdef inline Py_ssize_t _read_varint(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, int limit,
                                    uint64_t* value) noexcept:
    """The position after the varint at ``pos`` (at most ``limit`` bytes, bits past the 64th
    dropped) with its value in ``value``; -1 when it runs past ``end`` or ``limit``."""
    cdef uint64_t v = 0
    cdef unsigned int shift = 0
    cdef Py_ssize_t start = pos
    cdef unsigned char b
    while pos < end and pos - start < limit:
        b = p[pos]
        pos += 1
        if shift < 64:
            v |= (<uint64_t>(b & 0x7F)) << shift
        shift += 7
        if b < 0x80:
            value[0] = v
            return pos
    return -1


cdef inline Py_ssize_t _read_len(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end,
                                 Py_ssize_t* size) noexcept:
    cdef uint64_t v
    pos = _read_varint(p, pos, end, 5, &v)
    if pos < 0 or v > <uint64_t>(end - pos):
        return -1
    size[0] = <Py_ssize_t>v
    return pos


cdef object _read_ack(const unsigned char* p, Py_ssize_t end):
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t size, ack_end, range_end
    cdef uint64_t consumer_id = 0
    cdef uint64_t first, last, v
    cdef unsigned char tag
    cdef bint checked = True
    cdef list ranges = []
    cdef AckRequest request
    if end == 0:
        return None
    while pos < end:
        if p[pos] != 0x22:
            return None
        pos = _read_len(p, pos + 1, end, &size)
        if pos < 0:
            return None
        ack_end = pos + size
        while pos < ack_end:
            tag = p[pos]
            if tag == 0x08:
                pos = _read_varint(p, pos + 1, ack_end, 10, &consumer_id)
                if pos < 0:
                    return None
            elif tag == 0x12:
                pos = _read_len(p, pos + 1, ack_end, &size)
                if pos < 0:
                    return None
                range_end = pos + size
                first = 0
                last = 0
                while pos < range_end:
                    tag = p[pos]
                    if tag != 0x08 and tag != 0x10:
                        return None
                    pos = _read_varint(p, pos + 1, range_end, 10, &v)
                    if pos < 0:
                        return None
                    if tag == 0x08:
                        first = v
                    else:
                        last = v
                ranges.append((first, last))
                if last < first or last - first >= _MAX_ACK_SPAN:
                    checked = False
            else:
                return None
    request = AckRequest.__new__(AckRequest)
    request.consumer_id = consumer_id
    request.ranges = ranges
    request.checked = checked
    return request


def read_ack(data):
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _read_ack(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


def consume_request(data):
    request = read_ack(data)
    if request is None:
        return _from_string(bytes(data))
    return request

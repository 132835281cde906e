# cython: language_level=3
"""Protobuf messages written by hand around a buffer the caller shares (never copied).

Semantics: the docstring of ``danube/_pure/pbwire.py`` (the pure twin, which must return
the same bytes for the same calls).  A delivery's fields cost a few C stores here instead of
a protobuf message object per delivery.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New
from libc.stdint cimport uint32_t, uint64_t


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

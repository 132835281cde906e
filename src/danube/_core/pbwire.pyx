# cython: language_level=3
"""Protobuf messages written by hand around a buffer the caller shares (never copied).

Semantics: the docstring of ``danube/_pure/pbwire.py`` (the pure twin, which must return
the same bytes for the same calls).  A delivery's fields cost a few C stores here instead of
a protobuf message object per delivery.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t


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


def consume_batch(frames, uint64_t first, uint64_t last, uint32_t count):
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
    return (
        PyBytes_FromStringAndSize(<char*>head, h),
        frames,
        PyBytes_FromStringAndSize(<char*>rest, r),
    )

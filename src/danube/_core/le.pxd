# Little-endian loads and stores of unaligned integers (danube/_csrc/danube_le.h),
# as asyncpg's hton.pxd: the only copy, cimported by every module that reads or
# writes frames.  Declarations only: nothing is compiled from this file.
#
#     from danube._core.le cimport ld32, st64

from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef extern from "danube_le.h" nogil:
    uint64_t ld64 "danube_ld64"(const unsigned char* p) noexcept
    uint32_t ld32 "danube_ld32"(const unsigned char* p) noexcept
    uint16_t ld16 "danube_ld16"(const unsigned char* p) noexcept
    void st64 "danube_st64"(unsigned char* p, uint64_t v) noexcept
    void st32 "danube_st32"(unsigned char* p, uint32_t v) noexcept
    void st16 "danube_st16"(unsigned char* p, uint16_t v) noexcept

/* Little-endian loads and stores of unaligned integers: the one copy every
 * compiled module uses (cimported through danube/_core/le.pxd).  Each is one
 * mov on x86 at -O3; a big-endian build swaps the bytes.  */
#ifndef DANUBE_LE_H
#define DANUBE_LE_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define DANUBE_LE_SWAP 1
#else
#define DANUBE_LE_SWAP 0
#endif

static inline uint64_t danube_ld64(const unsigned char *p) {
    uint64_t v; memcpy(&v, p, 8);
#if DANUBE_LE_SWAP
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t danube_ld32(const unsigned char *p) {
    uint32_t v; memcpy(&v, p, 4);
#if DANUBE_LE_SWAP
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint16_t danube_ld16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void danube_st64(unsigned char *p, uint64_t v) {
#if DANUBE_LE_SWAP
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

static inline void danube_st32(unsigned char *p, uint32_t v) {
#if DANUBE_LE_SWAP
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

static inline void danube_st16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

#endif /* DANUBE_LE_H */

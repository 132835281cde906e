/* CRC32C implementations; see crc32c_impl.h.  The zero-shift operator
 * construction follows Mark Adler's public-domain crc32c.c. */
#include "crc32c_impl.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DANUBE_CRC32C_X86 1
#include <nmmintrin.h>
#endif

#define POLY 0x82F63B78u

static uint32_t table8[8][256];
static int initialized = 0;
static int use_hw = 0;

static inline uint64_t load_u64le(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* ------------------------------------------------------------ slicing-by-8 */

static void init_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? (crc >> 1) ^ POLY : crc >> 1;
        table8[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = table8[0][n];
        for (int k = 1; k < 8; k++) {
            crc = table8[0][crc & 0xff] ^ (crc >> 8);
            table8[k][n] = crc;
        }
    }
}

uint32_t danube_crc32c_portable(uint32_t crc_in, const unsigned char *p, size_t n) {
    uint64_t crc = crc_in ^ 0xFFFFFFFFu;
    while (n >= 8) {
        crc ^= load_u64le(p);
        crc = table8[7][crc & 0xff] ^ table8[6][(crc >> 8) & 0xff] ^
              table8[5][(crc >> 16) & 0xff] ^ table8[4][(crc >> 24) & 0xff] ^
              table8[3][(crc >> 32) & 0xff] ^ table8[2][(crc >> 40) & 0xff] ^
              table8[1][(crc >> 48) & 0xff] ^ table8[0][crc >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = table8[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return (uint32_t)crc ^ 0xFFFFFFFFu;
}

/* ------------------------------------------------------------ SSE4.2 */

#ifdef DANUBE_CRC32C_X86

/* Block sizes of the three-stream loops: the long one for big buffers, the
 * shorter ones so a 1 KiB frame still runs mostly interleaved. */
#define BLOCK_LONG 4096
#define BLOCK_MID 256
#define BLOCK_SHORT 64

static uint32_t zeros_long[4][256], zeros_mid[4][256], zeros_short[4][256];

static uint32_t gf2_matrix_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_matrix_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_matrix_times(mat, mat[n]);
}

/* Operator appending len zero bytes to a raw CRC; len is a power of two. */
static void zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = POLY;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_matrix_square(even, odd); /* 2 zero bits */
    gf2_matrix_square(odd, even); /* 4 zero bits */
    do {
        gf2_matrix_square(even, odd);
        len >>= 1;
        if (len == 0) return;
        gf2_matrix_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void make_zeros(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_matrix_times(op, n);
        zeros[1][n] = gf2_matrix_times(op, n << 8);
        zeros[2][n] = gf2_matrix_times(op, n << 16);
        zeros[3][n] = gf2_matrix_times(op, n << 24);
    }
}

static inline uint32_t shift(const uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

#define THREE_WAY(BLOCK, ZEROS)                                                   \
    while (n >= 3 * (BLOCK)) {                                                    \
        uint64_t crc1 = 0, crc2 = 0;                                              \
        const unsigned char *end = p + (BLOCK);                                   \
        do {                                                                      \
            crc0 = _mm_crc32_u64(crc0, load_u64le(p));                            \
            crc1 = _mm_crc32_u64(crc1, load_u64le(p + (BLOCK)));                  \
            crc2 = _mm_crc32_u64(crc2, load_u64le(p + 2 * (BLOCK)));              \
            p += 8;                                                               \
        } while (p < end);                                                        \
        crc0 = shift(ZEROS, (uint32_t)crc0) ^ (uint32_t)crc1;                     \
        crc0 = shift(ZEROS, (uint32_t)crc0) ^ (uint32_t)crc2;                     \
        p += 2 * (BLOCK);                                                         \
        n -= 3 * (BLOCK);                                                         \
    }

__attribute__((target("sse4.2")))
uint32_t danube_crc32c_hw(uint32_t crc_in, const unsigned char *p, size_t n) {
    uint64_t crc0 = crc_in ^ 0xFFFFFFFFu;
    THREE_WAY(BLOCK_LONG, zeros_long)
    THREE_WAY(BLOCK_MID, zeros_mid)
    THREE_WAY(BLOCK_SHORT, zeros_short)
    while (n >= 8) {
        crc0 = _mm_crc32_u64(crc0, load_u64le(p));
        p += 8;
        n -= 8;
    }
    while (n--) crc0 = _mm_crc32_u8((uint32_t)crc0, *p++);
    return (uint32_t)crc0 ^ 0xFFFFFFFFu;
}

int danube_crc32c_hw_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

#else

uint32_t danube_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    return danube_crc32c_portable(crc, p, n);
}

int danube_crc32c_hw_available(void) { return 0; }

#endif

/* ------------------------------------------------------------ dispatch */

void danube_crc32c_init(void) {
    if (initialized) return;
    init_tables();
    const char *forced = getenv("DANUBE_CRC32C");
    int portable = forced != NULL && strcmp(forced, "portable") == 0;
#ifdef DANUBE_CRC32C_X86
    if (danube_crc32c_hw_available()) {
        /* built even when forced portable: tests still call the hardware path */
        make_zeros(zeros_long, BLOCK_LONG);
        make_zeros(zeros_mid, BLOCK_MID);
        make_zeros(zeros_short, BLOCK_SHORT);
        use_hw = !portable;
    }
#else
    (void)portable;
#endif
    initialized = 1;
}

uint32_t danube_crc32c_update(uint32_t crc, const unsigned char *p, size_t n) {
    return use_hw ? danube_crc32c_hw(crc, p, n) : danube_crc32c_portable(crc, p, n);
}

const char *danube_crc32c_implementation(void) { return use_hw ? "sse4.2" : "slicing-by-8"; }

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init/xorout 0xFFFFFFFF).
 *
 * Two implementations, chosen once at run time by danube_crc32c_init():
 *   "sse4.2"       the SSE4.2 crc32 instruction (x86-64 with GCC/Clang), three
 *                  interleaved streams on long inputs, combined with precomputed
 *                  zero-shift tables so one frame's checksum is not latency bound;
 *   "slicing-by-8" a portable table-driven fallback.
 * DANUBE_CRC32C=portable in the environment forces the fallback, so tests can
 * check both paths agree.  No global -march is needed: the hardware functions
 * carry their own target attribute.
 */
#ifndef DANUBE_CRC32C_IMPL_H
#define DANUBE_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Linked into danube._core.frame only (other modules reach CRC32C through its C-API
 * capsule): hidden, so the module calls them directly, not through the PLT. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* Builds the tables and picks the implementation.  Call once (under the GIL)
 * before any other function; calling it again is harmless. */
void danube_crc32c_init(void);

/* Continue a CRC32C: crc is a previous result (0 to start).  Thread safe after
 * init, never touches Python objects (callable without the GIL). */
uint32_t danube_crc32c_update(uint32_t crc, const unsigned char *p, size_t n);

/* The two implementations, for tests.  danube_crc32c_hw must only be called
 * when danube_crc32c_hw_available() is non-zero. */
uint32_t danube_crc32c_portable(uint32_t crc, const unsigned char *p, size_t n);
uint32_t danube_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n);
int danube_crc32c_hw_available(void);

/* "sse4.2" or "slicing-by-8". */
const char *danube_crc32c_implementation(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif

/* CRC-32C (Castagnoli), the checksum TFRecord frames carry.
 *
 * sf_crc32c_extend() uses the CPU's CRC instruction when the running CPU has one
 * (SSE4.2 on x86-64, the ARMv8 CRC extension on aarch64), chosen once at run time,
 * and a table-driven slicing-by-8 version otherwise. Call sf_crc32c_init() once
 * before any other function (it is idempotent, but not meant to race with itself).
 */
#ifndef SHARDFEED_CRC32C_H
#define SHARDFEED_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

void sf_crc32c_init(void);
/* CRC of buf[0:len], continuing from a previous CRC `crc` (0 to start). */
uint32_t sf_crc32c_extend(uint32_t crc, const uint8_t *buf, size_t len);
/* sf_crc32c_extend(crc, src, len) that also copies src[0:len] to dst (not overlapping) in
 * the same pass: each word is loaded once, checksummed and stored. */
uint32_t sf_crc32c_copy(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t len);
/* The same by blocks of 4 KiB: the CRC of a block, then its copy from the cache (for
 * benchmarks and tests; the fallback where there is no fused kernel). */
uint32_t sf_crc32c_copy_blocked(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t len);
/* The same through the table-driven path only (for tests and benchmarks). */
uint32_t sf_crc32c_sw(uint32_t crc, const uint8_t *buf, size_t len);
/* TFRecord's masked CRC of buf[0:len]. */
uint32_t sf_masked_crc32c(const uint8_t *buf, size_t len);
/* Which implementation sf_crc32c_extend uses: "sse4.2", "armv8-crc" or "table". */
const char *sf_crc32c_backend(void);

/* A little-endian uint64 from 8 bytes at p (any alignment). */
static inline uint64_t sf_load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t sf_crc_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

#ifdef __cplusplus
}
#endif
#endif

/* CRC-32C: hardware instruction with run-time dispatch, slicing-by-8 fallback.
 *
 * The hardware paths compute three independent CRCs over three adjacent blocks at once
 * (the instruction has a latency of about 3 cycles and a throughput of 1 per cycle), then
 * combine them by "appending zeros" with precomputed GF(2) shift tables, as in Mark
 * Adler's crc32c.c. One stream alone would run at a third of the possible speed.
 */
#include "crc32c.h"

#include <string.h>

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t table8[8][256];
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];
static int initialized;

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
typedef uint32_t (*crc_copy_fn)(uint32_t, uint8_t *, const uint8_t *, size_t);
static uint32_t crc_sw_raw(uint32_t crc, const uint8_t *buf, size_t len);
static uint32_t crc_copy_plain(uint32_t crc, uint8_t *dst, const uint8_t *buf, size_t len);
static crc_fn crc_impl = crc_sw_raw;
static crc_copy_fn crc_copy_impl = crc_copy_plain;
static const char *crc_name = "table";


/* ---- GF(2) helpers for the shift tables ---- */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* op = the operator that appends `len` zero bytes to a (pre/post-conditioned-free) CRC. */
static void zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    /* each square doubles; the first square below gives one zero byte */
    do {
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void make_shift_table(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t shift_crc(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

/* ---- table-driven slicing-by-8 ---- */

static uint32_t crc_sw_raw(uint32_t crc, const uint8_t *buf, size_t len) {
    while (len && ((uintptr_t)buf & 7)) {
        crc = table8[0][(crc ^ *buf++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w = sf_load_le64(buf) ^ crc;
        crc = table8[7][w & 0xff] ^ table8[6][(w >> 8) & 0xff] ^ table8[5][(w >> 16) & 0xff] ^
              table8[4][(w >> 24) & 0xff] ^ table8[3][(w >> 32) & 0xff] ^ table8[2][(w >> 40) & 0xff] ^
              table8[1][(w >> 48) & 0xff] ^ table8[0][w >> 56];
        buf += 8;
        len -= 8;
    }
    while (len--) crc = table8[0][(crc ^ *buf++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* CRC while copying, without a fused kernel: in blocks small enough that the copy reads
 * them from the first-level cache, where the CRC just left them. */
static uint32_t crc_copy_plain(uint32_t crc, uint8_t *dst, const uint8_t *buf, size_t len) {
    while (len) {
        size_t k = len < 4096 ? len : 4096;
        crc = crc_impl(crc, buf, k);
        memcpy(dst, buf, k);
        buf += k;
        dst += k;
        len -= k;
    }
    return crc;
}

/* ---- x86-64: SSE4.2 crc32 instruction ---- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_X86 1

static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The CRC of buf's whole runs of 3 * block bytes, in three interleaved streams (one stream alone
 * runs at a third of the speed), each run's streams joined by shifting through `zeros`; with
 * dst, every word read is also stored at the same place of dst (inlined with dst NULL, the
 * stores go away). Advances *pbuf, *pdst and *plen past the runs. */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t crc_runs(uint64_t c0, const uint8_t **pbuf,
                                                                                uint8_t **pdst, size_t *plen,
                                                                                size_t block, uint32_t zeros[4][256]) {
    const uint8_t *buf = *pbuf;
    uint8_t *dst = pdst ? *pdst : NULL;
    size_t len = *plen;
    while (len >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = buf + block;
        do {
            uint64_t a = sf_load_le64(buf), b = sf_load_le64(buf + block), c = sf_load_le64(buf + 2 * block);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, c);
            if (dst) {
                st64(dst, a);
                st64(dst + block, b);
                st64(dst + 2 * block, c);
                dst += 8;
            }
            buf += 8;
        } while (buf < end);
        c0 = shift_crc(zeros, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shift_crc(zeros, (uint32_t)c0) ^ (uint32_t)c2;
        buf += 2 * block;
        if (dst) dst += 2 * block;
        len -= 3 * block;
    }
    *pbuf = buf;
    if (pdst) *pdst = dst;
    *plen = len;
    return c0;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw_x86(uint32_t crc, const uint8_t *buf, size_t len) {
    uint64_t c0 = crc;
    while (len && ((uintptr_t)buf & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *buf++);
        len--;
    }
    c0 = crc_runs(c0, &buf, NULL, &len, LONG_BLOCK, shift_long);
    c0 = crc_runs(c0, &buf, NULL, &len, SHORT_BLOCK, shift_short);
    while (len >= 8) {
        c0 = _mm_crc32_u64(c0, sf_load_le64(buf));
        buf += 8;
        len -= 8;
    }
    while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *buf++);
    return (uint32_t)c0;
}

/* crc_hw_x86 that also stores every word it reads at dst: the three streams are loaded
 * once, checksummed and stored, so the bytes cross the memory bus once. */
__attribute__((target("sse4.2"))) static uint32_t crc_copy_hw_x86(uint32_t crc, uint8_t *dst, const uint8_t *buf,
                                                                 size_t len) {
    uint64_t c0 = crc;
    while (len && ((uintptr_t)buf & 7)) {
        *dst++ = *buf;
        c0 = _mm_crc32_u8((uint32_t)c0, *buf++);
        len--;
    }
    c0 = crc_runs(c0, &buf, &dst, &len, LONG_BLOCK, shift_long);
    c0 = crc_runs(c0, &buf, &dst, &len, SHORT_BLOCK, shift_short);
    while (len >= 8) {
        uint64_t a = sf_load_le64(buf);
        c0 = _mm_crc32_u64(c0, a);
        st64(dst, a);
        buf += 8;
        dst += 8;
        len -= 8;
    }
    while (len--) {
        *dst++ = *buf;
        c0 = _mm_crc32_u8((uint32_t)c0, *buf++);
    }
    return (uint32_t)c0;
}
#endif

/* ---- aarch64: ARMv8 CRC extension ---- */

#if defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define HAVE_HW_ARM 1

__attribute__((target("+crc"))) static uint32_t crc_hw_arm(uint32_t crc, const uint8_t *buf, size_t len) {
    uint32_t c0 = crc;
    while (len && ((uintptr_t)buf & 7)) {
        c0 = __builtin_aarch64_crc32cb(c0, *buf++);
        len--;
    }
    while (len >= 3 * SHORT_BLOCK) {
        uint32_t c1 = 0, c2 = 0;
        const uint8_t *end = buf + SHORT_BLOCK;
        do {
            c0 = __builtin_aarch64_crc32cx(c0, sf_load_le64(buf));
            c1 = __builtin_aarch64_crc32cx(c1, sf_load_le64(buf + SHORT_BLOCK));
            c2 = __builtin_aarch64_crc32cx(c2, sf_load_le64(buf + 2 * SHORT_BLOCK));
            buf += 8;
        } while (buf < end);
        c0 = shift_crc(shift_short, c0) ^ c1;
        c0 = shift_crc(shift_short, c0) ^ c2;
        buf += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
    while (len >= 8) {
        c0 = __builtin_aarch64_crc32cx(c0, sf_load_le64(buf));
        buf += 8;
        len -= 8;
    }
    while (len--) c0 = __builtin_aarch64_crc32cb(c0, *buf++);
    return c0;
}
#endif

void sf_crc32c_init(void) {
    if (initialized) return;
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table8[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = table8[0][n];
        for (int k = 1; k < 8; k++) {
            c = table8[0][c & 0xff] ^ (c >> 8);
            table8[k][n] = c;
        }
    }
    make_shift_table(shift_long, LONG_BLOCK);
    make_shift_table(shift_short, SHORT_BLOCK);
#ifdef HAVE_HW_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_impl = crc_hw_x86;
        crc_copy_impl = crc_copy_hw_x86;
        crc_name = "sse4.2";
    }
#endif
#ifdef HAVE_HW_ARM
    if (getauxval(AT_HWCAP) & HWCAP_CRC32) {
        crc_impl = crc_hw_arm;
        crc_name = "armv8-crc";
    }
#endif
    initialized = 1;
}

uint32_t sf_crc32c_extend(uint32_t crc, const uint8_t *buf, size_t len) {
    return crc_impl(crc ^ 0xFFFFFFFFu, buf, len) ^ 0xFFFFFFFFu;
}

uint32_t sf_crc32c_copy(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t len) {
    return crc_copy_impl(crc ^ 0xFFFFFFFFu, dst, src, len) ^ 0xFFFFFFFFu;
}

uint32_t sf_crc32c_copy_blocked(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t len) {
    return crc_copy_plain(crc ^ 0xFFFFFFFFu, dst, src, len) ^ 0xFFFFFFFFu;
}

uint32_t sf_crc32c_sw(uint32_t crc, const uint8_t *buf, size_t len) {
    return crc_sw_raw(crc ^ 0xFFFFFFFFu, buf, len) ^ 0xFFFFFFFFu;
}

uint32_t sf_masked_crc32c(const uint8_t *buf, size_t len) {
    return sf_crc_mask(sf_crc32c_extend(0, buf, len));
}

const char *sf_crc32c_backend(void) { return crc_name; }

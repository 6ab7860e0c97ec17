/* libFuzzer harness: the CRC-while-copy pass (crcfuse.c) and its kernel (sf_crc32c_copy in
 * crc32c.c). Byte 0: options (bit 0: tile the record to past 24 KiB, so the long three-stream
 * blocks run; bit 1: a wrong expected CRC; bits 2-4: the destination's misalignment).
 * Byte 1: number of segments (0..15); then 5 bytes per segment: start (2), length (2), and a
 * flag byte (bit 0: the value lies outside the record, in a separate "default" buffer); the
 * rest is the record. Segments may overlap, repeat, run off the end (clamped) or be empty.
 * Checks: the CRC verdict equals masked_crc32c(record) == want; every segment's bytes arrive
 * at its destination; the 32 guard bytes around each destination stay untouched; the
 * fused kernel, the blocked one and extend agree at any alignment; no read outside the
 * exact-size record and default buffers (ASan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "crcfuse.h"

#define GUARD 32
#define MAXSEG 15

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        sf_crc32c_init();
        init = 1;
    }
    if (size < 2) return 0;
    uint8_t opt = data[0];
    size_t nseg = data[1] % (MAXSEG + 1);
    if (size < 2 + 5 * nseg) return 0;
    const uint8_t *specs = data + 2;
    const uint8_t *body = data + 2 + 5 * nseg;
    size_t blen = size - 2 - 5 * nseg;
    size_t len = blen;
    if ((opt & 1) && blen) {
        while (len < 3 * 8192 + 100) len += blen;
    }
    uint8_t *rec = malloc(len ? len : 1); /* exact size: ASan catches a read past the end */
    uint8_t *dflt = malloc(64);
    if (!rec || !dflt) abort();
    for (size_t i = 0; i < len; i++) rec[i] = body[i % (blen ? blen : 1)] ^ (uint8_t)(i / (blen ? blen : 1));
    for (size_t i = 0; i < 64; i++) dflt[i] = (uint8_t)(i * 7 + 1);

    sf_seg segs[MAXSEG];
    uint8_t *outs[MAXSEG];
    const uint8_t *srcs[MAXSEG];
    size_t ns[MAXSEG];
    for (size_t s = 0; s < nseg; s++) {
        const uint8_t *p = specs + 5 * s;
        size_t start = (size_t)(p[0] | p[1] << 8), n = (size_t)(p[2] | p[3] << 8);
        const uint8_t *src;
        if (p[4] & 1) {
            start %= 64;
            if (n > 64 - start) n = 64 - start;
            src = dflt + start;
        } else {
            if (opt & 1) start *= 7, n *= 5;
            start = len ? start % (len + 1) : 0;
            if (n > len - start) n = len - start;
            src = rec + start;
        }
        outs[s] = malloc(n + 2 * GUARD);
        if (!outs[s]) abort();
        memset(outs[s], 0xA5, n + 2 * GUARD);
        segs[s].src = src;
        segs[s].n = n;
        segs[s].dst = outs[s] + GUARD;
        srcs[s] = src;
        ns[s] = n;
    }
    uint32_t right = sf_masked_crc32c(rec, len);
    uint32_t want = (opt & 2) ? right ^ 0x10u : right;
    int rc = sf_copy_verify_record(rec, len, segs, nseg, want);
    if ((rc == 0) != (want == right)) abort();
    for (size_t s = 0; s < nseg; s++) {
        if (memcmp(outs[s] + GUARD, srcs[s], ns[s])) abort();
        for (size_t g = 0; g < GUARD; g++)
            if (outs[s][g] != 0xA5 || outs[s][GUARD + ns[s] + g] != 0xA5) abort();
        free(outs[s]);
    }
    /* the kernels at an odd source offset and a misaligned destination */
    size_t off = len ? opt % (len < 16 ? len : 16) : 0, mis = (opt >> 2) & 7;
    uint8_t *d1 = malloc(len - off + 8 + 2 * GUARD), *d2 = malloc(len - off + 8 + 2 * GUARD);
    if (!d1 || !d2) abort();
    memset(d1, 0x5A, len - off + 8 + 2 * GUARD);
    memset(d2, 0x5A, len - off + 8 + 2 * GUARD);
    uint32_t seed = (uint32_t)opt * 0x01000193u;
    uint32_t a = sf_crc32c_extend(seed, rec + off, len - off);
    uint32_t b = sf_crc32c_copy(seed, d1 + GUARD + mis, rec + off, len - off);
    uint32_t c = sf_crc32c_copy_blocked(seed, d2 + GUARD + mis, rec + off, len - off);
    if (a != b || a != c || a != sf_crc32c_sw(seed, rec + off, len - off)) abort();
    if (memcmp(d1 + GUARD + mis, rec + off, len - off) || memcmp(d2 + GUARD + mis, rec + off, len - off)) abort();
    for (size_t g = 0; g < GUARD + mis; g++)
        if (d1[g] != 0x5A || d2[g] != 0x5A) abort();
    for (size_t g = GUARD + mis + len - off; g < len - off + 8 + 2 * GUARD; g++)
        if (d1[g] != 0x5A || d2[g] != 0x5A) abort();
    /* the plain check over several records: the first bad one */
    sf_bytes recs[3] = {{rec, len / 3}, {rec + len / 3, len / 3}, {rec + 2 * (len / 3), len - 2 * (len / 3)}};
    uint32_t w[3];
    for (int k = 0; k < 3; k++) w[k] = sf_masked_crc32c(recs[k].p, recs[k].n);
    size_t which = opt % 4; /* 3: none bad */
    if (which < 3) w[which] ^= 1;
    if (sf_first_bad_crc(recs, (const uint8_t *)w, 3) != which) abort();
    free(d1);
    free(d2);
    free(rec);
    free(dflt);
    return 0;
}

/* libFuzzer harness: the gather of shuffle="global" (gatherframes.c, built with
 * -DSF_GATHER_NO_PYTHON). Input: byte 0 options (bit 0 verify CRCs, bit 1 an order that
 * reverses the frames, bit 2 a destination one byte short, bit 3 a second source: the input
 * cut in two at byte 1's fraction); then the source bytes. Frames are found by walking the
 * lengths the source claims (cut to what is left), 16 at most, so every frame's range, stored
 * length and CRCs may be good or bad. Checks: no read or write outside the exact-size source
 * and destination (ASan); a success copies every frame's bytes to its destination and each
 * frame passes its checks, computed here with the table CRC; a failure names a frame that
 * fails the first check the C makes for it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "gatherframes.h"

#define MAXF 16

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = (v << 8) | p[b];
    return v;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t masked_sw(const uint8_t *p, size_t n) { return sf_crc_mask(sf_crc32c_sw(0, p, n)); }

/* what sf_gather_frames must say of one frame */
static int expect(const uint8_t *src, size_t size, int64_t off, int64_t len, int64_t d, size_t dst_len, int verify) {
    if (off < 0 || len < 16 || d < 0 || (uint64_t)len > size || (uint64_t)off > size - (uint64_t)len ||
        (uint64_t)len > dst_len || (uint64_t)d > dst_len - (uint64_t)len)
        return SF_GATHER_RANGE;
    const uint8_t *s = src + off;
    if (rd64(s) != (uint64_t)(len - 16)) return SF_GATHER_MISMATCH;
    if (!verify) return SF_GATHER_OK;
    if (masked_sw(s, 8) != rd32(s + 8)) return SF_GATHER_LENGTH_CRC;
    return masked_sw(s + 12, (size_t)len - 16) == rd32(s + len - 4) ? SF_GATHER_OK : SF_GATHER_DATA_CRC;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sf_crc32c_init();
    if (size < 2) return 0;
    int opt = data[0], verify = opt & 1;
    size_t body = size - 2, cut = (opt & 8) ? body * data[1] / 255 : body;
    /* exact-size copies, so ASan sees any read past them */
    uint8_t *src[2] = {malloc(cut ? cut : 1), malloc(body - cut ? body - cut : 1)};
    if (!src[0] || !src[1]) abort();
    memcpy(src[0], data + 2, cut);
    memcpy(src[1], data + 2 + cut, body - cut);
    size_t lens_[2] = {cut, body - cut};
    int64_t which[MAXF], off[MAXF], len[MAXF], dst_off[MAXF], order[MAXF];
    size_t n = 0, total = 0;
    for (int w = 0; w < ((opt & 8) ? 2 : 1); w++) {
        size_t at = 0;
        while (n < MAXF && at + 8 <= lens_[w]) {
            uint64_t claimed = rd64(src[w] + at) + 16, left = lens_[w] - at;
            int64_t ln = (int64_t)(claimed > left || claimed < 16 ? (left < 16 ? 16 : left) : claimed);
            which[n] = w, off[n] = (int64_t)at, len[n] = ln, dst_off[n] = (int64_t)total;
            total += (size_t)ln;
            at += (size_t)ln;
            n++;
        }
    }
    for (size_t i = 0; i < n; i++) order[i] = (int64_t)(n - 1 - i);
    size_t dst_len = total && (opt & 4) ? total - 1 : total;
    uint8_t *dst = malloc(dst_len ? dst_len : 1);
    if (!dst) abort();
    const uint8_t *srcs[2] = {src[0], src[1]};
    size_t bad = 0;
    int rc = sf_gather_frames(srcs, lens_, 2, which, off, len, dst_off, (opt & 2) ? order : NULL, n, dst, dst_len,
                              verify, &bad);
    if (rc == SF_GATHER_OK) {
        if (bad != n) abort();
        for (size_t k = 0; k < n; k++) {
            if (expect(src[which[k]], lens_[which[k]], off[k], len[k], dst_off[k], dst_len, verify) != SF_GATHER_OK)
                abort();
            if (memcmp(dst + dst_off[k], src[which[k]] + off[k], (size_t)len[k])) abort();
        }
    } else {
        if (bad >= n) abort();
        if (expect(src[which[bad]], lens_[which[bad]], off[bad], len[bad], dst_off[bad], dst_len, verify) != rc)
            abort();
    }
    free(dst);
    free(src[0]);
    free(src[1]);
    return 0;
}

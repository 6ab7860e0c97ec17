#include "crcfuse.h"

#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

static int seg_cmp(const void *a, const void *b) {
    const uint8_t *x = ((const sf_seg *)a)->src, *y = ((const sf_seg *)b)->src;
    return x < y ? -1 : x > y;
}

int sf_copy_verify_record(const uint8_t *rec, size_t len, sf_seg *segs, size_t nseg, uint32_t want) {
    const uint8_t *end = rec + len, *cur = rec;
    uint32_t crc = 0;
    int sorted = 1;
    for (size_t i = 1; i < nseg && sorted; i++) sorted = segs[i - 1].src <= segs[i].src;
    if (!sorted) qsort(segs, nseg, sizeof(sf_seg), seg_cmp);
    for (size_t i = 0; i < nseg; i++) {
        const sf_seg *s = &segs[i];
        if (!s->n) continue;
        /* compared as addresses: in the record and after what the CRC has covered */
        uintptr_t p = (uintptr_t)s->src;
        if (p < (uintptr_t)cur || p > (uintptr_t)end || s->n > (size_t)((uintptr_t)end - p)) {
            memcpy(s->dst, s->src, s->n);
            continue;
        }
        crc = sf_crc32c_extend(crc, cur, (size_t)(s->src - cur));
        crc = sf_crc32c_copy(crc, s->dst, s->src, s->n);
        cur = s->src + s->n;
    }
    crc = sf_crc32c_extend(crc, cur, (size_t)(end - cur));
    return sf_crc_mask(crc) == want ? 0 : -1;
}

size_t sf_first_bad_crc(const sf_bytes *recs, const uint8_t *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, want + 4 * i, 4);
        if (sf_masked_crc32c(recs[i].p, recs[i].n) != w) return i;
    }
    return n;
}

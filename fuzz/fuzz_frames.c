/* libFuzzer harness: the TFRecord framing scanner (frames.c) and CRC-32C (crc32c.c).
 * The first byte picks options; the rest is the buffer to scan. Checks the scanner's
 * invariants: every frame it returns lies inside the buffer, frames are back to back,
 * consumed never passes the end, and the hardware and table CRCs agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        sf_crc32c_init();
        init = 1;
    }
    if (size < 1) return 0;
    uint8_t opt = data[0];
    const uint8_t *buf = data + 1;
    size_t len = size - 1;
    /* copy to an exact-size heap block so ASan catches any read past the end */
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return 0;
    memcpy(copy, buf, len);
    int verify = !(opt & 1);
    uint64_t max_rec = (opt & 2) ? 64 : 0x7FFFFFFFull;
    size_t cap = (opt & 4) ? 3 : len / 16 + 1;
    int64_t *off = malloc(sizeof(int64_t) * cap), *lens = malloc(sizeof(int64_t) * cap);
    sf_scan_result r;
    sf_scan_frames(copy, len, verify, max_rec, off, lens, NULL, cap, &r);
    if (r.count > cap || r.consumed > len) abort();
    size_t expect = 0;
    for (size_t k = 0; k < r.count; k++) {
        if (off[k] < 0 || lens[k] < 0 || (size_t)off[k] != expect + 12) abort();
        if ((size_t)off[k] + (size_t)lens[k] + 4 > len) abort();
        if (verify && sf_masked_crc32c(copy + off[k], (size_t)lens[k]) == 0xFFFFFFFFu) { /* touch */ }
        expect = (size_t)off[k] + (size_t)lens[k] + 4;
    }
    if (expect != r.consumed) abort();
    if (r.error && r.error_offset != r.consumed) abort();
    /* hardware vs table CRC, and incremental == one-shot */
    size_t cut = len ? opt % (len + 1) : 0;
    uint32_t a = sf_crc32c_extend(0, copy, len), b = sf_crc32c_sw(0, copy, len);
    uint32_t c = sf_crc32c_extend(sf_crc32c_extend(0, copy, cut), copy + cut, len - cut);
    if (a != b || a != c) abort();
    free(off);
    free(lens);
    free(copy);
    return 0;
}

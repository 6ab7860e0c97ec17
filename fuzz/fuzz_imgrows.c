/* libFuzzer harness: image-folder rows judged and framed in C (imgrows.c, over imgcheck.c and
 * crc32c.c), the core of _native.image_rows. Input: byte 0 options (bit 0: want PNG, else JPEG;
 * bits 1-2: max_size 0 / 1 / 64 / 65535; bits 3-4: max_pixels -1 / 0 / 4096 / 2^40); byte 1:
 * the source path's length (0-255), byte 2: the label text's length (0-255); then the path
 * bytes, the text bytes, and the rest is the image file (seeds: fuzz/corpus/imgcheck files behind
 * a 3-byte header, fuzz/corpus/imgrows). Checks: the verdict is the same twice; a corrupt file
 * comes with its error; a kept file has a format, a size within the limits; its frame fills the
 * exact-size heap buffer (no byte outside it written or read: ASan), its length and data CRCs
 * check (sf_scan_frames), the record is a valid Example (sf_validate_example) and holds the
 * file's bytes where image/encoded's value belongs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "example_parse.h"
#include "frames.h"
#include "imgrows.h"

static size_t vlen(uint64_t v) {
    size_t k = 1;
    while (v >= 128) {
        v >>= 7;
        k++;
    }
    return k;
}

static uint8_t *put_varint(uint8_t *d, uint64_t v) {
    while (v >= 128) {
        *d++ = (uint8_t)(v | 128);
        v >>= 7;
    }
    *d++ = (uint8_t)v;
    return d;
}

/* the map entry image/class/text = [text], as the caller encodes a label's tail */
static size_t text_entry(uint8_t *d, const uint8_t *text, size_t n) {
    static const char key[] = "image/class/text";
    size_t kl = sizeof key - 1, m = 1 + vlen(n) + n, f = 1 + vlen(m) + m, e = 2 + vlen(kl) + kl + vlen(f) + f;
    uint8_t *s = d;
    *d++ = 0x0a;
    d = put_varint(d, e);
    *d++ = 0x0a;
    d = put_varint(d, kl);
    memcpy(d, key, kl);
    d += kl;
    *d++ = 0x12;
    d = put_varint(d, f);
    *d++ = 0x0a;
    d = put_varint(d, m);
    *d++ = 0x0a;
    d = put_varint(d, n);
    memcpy(d, text, n);
    return (size_t)(d + n - s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        sf_crc32c_init();
        sf_imgcheck_init();
        init = 1;
    }
    if (size < 3) return 0;
    int want = data[0] & 1 ? SF_IMG_PNG : SF_IMG_JPEG;
    static const int64_t sizes[4] = {0, 1, 64, 65535}, pixels[4] = {-1, 0, 4096, (int64_t)1 << 40};
    int64_t max_size = sizes[(data[0] >> 1) & 3], max_pixels = pixels[(data[0] >> 3) & 3];
    size_t uri_n = data[1], text_n = data[2];
    if (size < 3 + uri_n + text_n) return 0;
    const uint8_t *uri = data + 3, *text = uri + uri_n;
    size_t n = size - 3 - uri_n - text_n;
    uint8_t *file = malloc(n ? n : 1); /* exact size: ASan sees any read past it */
    uint8_t *tail = malloc(text_n + 32);
    if (!file || !tail) abort();
    memcpy(file, text + text_n, n);
    size_t tail_n = text_entry(tail, text, text_n);

    sf_imginfo a, b;
    const char *ea, *eb;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    int va = sf_imgrow_judge(file, n, want, max_size, max_pixels, &a, &ea);
    int vb = sf_imgrow_judge(file, n, want, max_size, max_pixels, &b, &eb);
    if (va != vb || ea != eb || (n && memcmp(&a, &b, sizeof a) != 0)) abort();
    if ((va == SF_ROW_CORRUPT) != (ea != NULL)) abort();
    if (va == SF_ROW_EMPTY && n != 0) abort();
    if (va == SF_ROW_KEPT) {
        if (a.format != want || a.width == 0 || a.height == 0 || max_pixels < 0 ||
            (uint64_t)a.width * a.height > (uint64_t)max_pixels)
            abort();
        uint32_t longest = a.width > a.height ? a.width : a.height;
        if (max_size && longest > max_size) abort();
        size_t len = sf_imgrow_record_size(n, a.width, a.height, uri_n, tail_n, want);
        uint8_t *out = malloc(len + 16);
        if (!out) abort();
        uint8_t *end = sf_imgrow_frame(out, file, n, a.width, a.height, uri, uri_n, tail, tail_n, want);
        if (end != out + len + 16) abort();
        int64_t off, flen;
        sf_scan_result res;
        sf_scan_frames(out, len + 16, 1, UINT64_MAX, &off, &flen, NULL, 1, &res);
        if (res.error != SF_FRAME_OK || res.count != 1 || res.consumed != len + 16 || off != 12 ||
            (size_t)flen != len)
            abort();
        sf_error err;
        if (sf_validate_example(out + 12, len, &err) != 0) abort();
        /* image/encoded comes first: Example.features, the entry, its key, the Feature, the list */
        size_t m = 1 + vlen(n) + n, f = 1 + vlen(m) + m, e = 2 + vlen(13) + 13 + vlen(f) + f;
        size_t rec_head = 1; /* the features' size varint: len = 1 + rec_head + size */
        while (rec_head < 11 && vlen(len - 1 - rec_head) != rec_head) rec_head++;
        size_t pos = 12 + 1 + rec_head + 1 + vlen(e) + 2 + vlen(13) + 13 + vlen(f) + 1 + vlen(m) + 1 + vlen(n);
        if (pos + n > len + 12 || (n && memcmp(out + pos, file, n) != 0)) abort();
        free(out);
    }
    free(file);
    free(tail);
    return 0;
}

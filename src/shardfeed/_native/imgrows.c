#include "imgrows.h"

#include <string.h>

#include "crc32c.h"

int sf_imgrow_judge(const uint8_t *p, size_t n, int want, int64_t max_size, int64_t max_pixels,
                    sf_imginfo *info, const char **err) {
    *err = NULL;
    if (n == 0) return SF_ROW_EMPTY;
    const char *e = sf_image_check(p, n, info);
    if (info->format == SF_IMG_UNKNOWN) return SF_ROW_PYTHON; /* Pillow decides */
    if (e != NULL) {
        *err = e;
        return SF_ROW_CORRUPT;
    }
    uint64_t pixels = (uint64_t)info->width * info->height;
    if (max_pixels < 0 || pixels > (uint64_t)max_pixels) return SF_ROW_BOMB;
    int rgb = info->format == SF_IMG_JPEG ? info->components == 3 : info->color_type == 2;
    if (info->format != want || !rgb || (info->flags & (SF_IMGF_UNUSUAL | SF_IMGF_EXIF_UNSURE)) ||
        (info->orientation != 0 && info->orientation != 1))
        return SF_ROW_PYTHON;
    uint32_t longest = info->width > info->height ? info->width : info->height;
    if (max_size != 0 && (int64_t)longest > max_size) return SF_ROW_PYTHON; /* to be resized */
    return SF_ROW_KEPT;
}

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

/* the map entry of a key whose Feature message is flen bytes */
static size_t entry_size(size_t klen, size_t flen) {
    size_t e = 2 + vlen(klen) + klen + vlen(flen) + flen;
    return 1 + vlen(e) + e;
}

static size_t bytes_feature_size(size_t n) {
    size_t m = 1 + vlen(n) + n; /* BytesList */
    return 1 + vlen(m) + m;
}

static size_t int_feature_size(uint64_t v) { return 4 + vlen(v); }

#define K_ENCODED "image/encoded"
#define K_FORMAT "image/format"
#define K_HEIGHT "image/height"
#define K_WIDTH "image/width"
#define K_CHANNELS "image/channels"
#define K_SOURCE "image/source_id"
#define KLEN(k) (sizeof(k) - 1)

static const char *format_name(int want) { return want == SF_IMG_PNG ? "png" : "jpeg"; }

/* the Features message's size: the map entries */
static size_t features_size(size_t n, uint32_t width, uint32_t height, size_t uri_n, size_t tail_n, int want) {
    return entry_size(KLEN(K_ENCODED), bytes_feature_size(n)) +
               entry_size(KLEN(K_FORMAT), bytes_feature_size(strlen(format_name(want)))) +
               entry_size(KLEN(K_HEIGHT), int_feature_size(height)) + entry_size(KLEN(K_WIDTH), int_feature_size(width)) +
               entry_size(KLEN(K_CHANNELS), int_feature_size(3)) + entry_size(KLEN(K_SOURCE), bytes_feature_size(uri_n)) +
               tail_n;
}

size_t sf_imgrow_record_size(size_t n, uint32_t width, uint32_t height, size_t uri_n, size_t tail_n, int want) {
    size_t s = features_size(n, width, height, uri_n, tail_n, want);
    return 1 + vlen(s) + s;
}

static uint8_t *entry_head(uint8_t *d, const char *key, size_t klen, size_t flen) {
    *d++ = 0x0a;
    d = put_varint(d, 2 + vlen(klen) + klen + vlen(flen) + flen);
    *d++ = 0x0a;
    d = put_varint(d, klen);
    memcpy(d, key, klen);
    d += klen;
    *d++ = 0x12;
    return put_varint(d, flen);
}

/* a bytes entry up to its value (the value's n bytes come next) */
static uint8_t *bytes_head(uint8_t *d, const char *key, size_t klen, size_t n) {
    d = entry_head(d, key, klen, bytes_feature_size(n));
    *d++ = 0x0a;
    d = put_varint(d, 1 + vlen(n) + n);
    *d++ = 0x0a;
    return put_varint(d, n);
}

static uint8_t *int_entry(uint8_t *d, const char *key, size_t klen, uint64_t v) {
    d = entry_head(d, key, klen, int_feature_size(v));
    *d++ = 0x1a;
    *d++ = (uint8_t)(vlen(v) + 2);
    *d++ = 0x0a;
    *d++ = (uint8_t)vlen(v);
    return put_varint(d, v);
}

uint8_t *sf_imgrow_frame(uint8_t *dst, const uint8_t *data, size_t n, uint32_t width, uint32_t height,
                         const uint8_t *uri, size_t uri_n, const uint8_t *tail, size_t tail_n, int want) {
    size_t s = features_size(n, width, height, uri_n, tail_n, want), len = 1 + vlen(s) + s;
    for (int b = 0; b < 8; b++) dst[b] = (uint8_t)((uint64_t)len >> (8 * b));
    uint32_t lc = sf_masked_crc32c(dst, 8);
    for (int b = 0; b < 4; b++) dst[8 + b] = (uint8_t)(lc >> (8 * b));
    uint8_t *rec = dst + 12, *d = rec;
    *d++ = 0x0a; /* Example.features */
    d = put_varint(d, s);
    d = bytes_head(d, K_ENCODED, KLEN(K_ENCODED), n);
    uint32_t crc = sf_crc32c_extend(0, rec, (size_t)(d - rec));
    crc = sf_crc32c_copy(crc, d, data, n);
    d += n;
    uint8_t *mark = d;
    const char *fmt = format_name(want);
    size_t fn = strlen(fmt);
    d = bytes_head(d, K_FORMAT, KLEN(K_FORMAT), fn);
    memcpy(d, fmt, fn);
    d += fn;
    d = int_entry(d, K_HEIGHT, KLEN(K_HEIGHT), height);
    d = int_entry(d, K_WIDTH, KLEN(K_WIDTH), width);
    d = int_entry(d, K_CHANNELS, KLEN(K_CHANNELS), 3);
    d = bytes_head(d, K_SOURCE, KLEN(K_SOURCE), uri_n);
    if (uri_n) memcpy(d, uri, uri_n);
    d += uri_n;
    if (tail_n) memcpy(d, tail, tail_n);
    d += tail_n;
    crc = sf_crc_mask(sf_crc32c_extend(crc, mark, (size_t)(d - mark)));
    for (int b = 0; b < 4; b++) d[b] = (uint8_t)(crc >> (8 * b));
    return d + 4;
}

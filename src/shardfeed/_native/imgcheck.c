/* Structural check of JPEG and PNG files (see imgcheck.h). */
#include "imgcheck.h"

#include <string.h>

static uint32_t crc_table[8][256];

void sf_imgcheck_init(void) {
    static int done;
    if (done) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
    done = 1;
}

/* zlib's CRC-32 (PNG chunks), slicing by 8 */
static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t a = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^ crc_table[5][(a >> 16) & 0xFF] ^
            crc_table[4][a >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
            crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int contains(const uint8_t *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0 || n < m) return 0;
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == (uint8_t)needle[0] && memcmp(hay + i, needle, m) == 0) return 1;
    return 0;
}

/* EXIF orientation from a TIFF block t[0..m): 0 = read (orientation set, 0 if absent),
 * -1 = malformed or unusual (the caller cannot be sure what a full reader makes of it). */
static int tiff_orientation(const uint8_t *t, size_t m, int *orientation) {
    int le;
    if (m < 8) return -1;
    if (t[0] == 'I' && t[1] == 'I') le = 1;
    else if (t[0] == 'M' && t[1] == 'M') le = 0;
    else return -1;
#define U16(q) (le ? (uint32_t)(q)[0] | (uint32_t)(q)[1] << 8 : be16(q))
#define U32(q) (le ? (uint32_t)(q)[0] | (uint32_t)(q)[1] << 8 | (uint32_t)(q)[2] << 16 | (uint32_t)(q)[3] << 24 \
                   : be32(q))
    if (U16(t + 2) != 42) return -1;
    uint32_t ifd = U32(t + 4);
    if (ifd < 8 || (size_t)ifd > m || m - ifd < 2) return -1;
    uint32_t count = U16(t + ifd);
    if ((m - ifd - 2) / 12 < count) return -1;
    int found = 0;
    *orientation = 0;
    for (uint32_t k = 0; k < count; k++) {
        const uint8_t *e = t + ifd + 2 + 12 * (size_t)k;
        if (U16(e) != 0x0112) continue;
        if (found || U16(e + 2) != 3 || U32(e + 4) != 1) return -1;
        found = 1;
        *orientation = (int)U16(e + 8);
        if (*orientation == 0) return -1; /* 0 would read as "no tag" */
    }
#undef U16
#undef U32
    return 0;
}

#define FAIL(msg, off)              \
    do {                            \
        info->error_offset = (off); \
        return (msg);               \
    } while (0)

/* The end of the entropy-coded data that starts at i: the offset of the next marker that
 * is not a stuffed 0xFF00 or an RSTn, or n when the data ends first. */
static size_t scan_end(const uint8_t *p, size_t n, size_t i) {
    for (;;) {
        const uint8_t *q = i < n ? memchr(p + i, 0xFF, n - i) : NULL;
        if (q == NULL || (size_t)(q - p) + 1 >= n) return n;
        size_t at = (size_t)(q - p);
        uint8_t b = p[at + 1];
        if (b == 0x00 || (b >= 0xD0 && b <= 0xD7)) i = at + 2;
        else if (b == 0xFF) i = at + 1;
        else return at;
    }
}

static const char *check_jpeg(const uint8_t *p, size_t n, sf_imginfo *info) {
    uint8_t comp_ids[4];
    int ncomp = 0, sof_seen = 0, sos_seen = 0, exif_seen = 0;
    size_t pos = 2;
    info->format = SF_IMG_JPEG;
    info->color_type = -1;
    for (;;) {
        if (pos >= n) FAIL("JPEG truncated: the data ends before the EOI marker", n);
        if (p[pos] != 0xFF) FAIL("JPEG garbled: bytes where a marker should be", pos);
        while (pos < n && p[pos] == 0xFF) pos++; /* fill bytes */
        if (pos >= n) FAIL("JPEG truncated: the data ends before the EOI marker", n);
        uint8_t m = p[pos];
        size_t mpos = pos - 1;
        pos++;
        if (m == 0x00) FAIL("JPEG garbled: an escaped 0xFF outside the image data", mpos);
        if (m == 0xD9) { /* EOI */
            if (!sos_seen) FAIL("JPEG garbled: EOI before any image data (no SOS)", mpos);
            return NULL;
        }
        if (m == 0xD8) FAIL("JPEG garbled: a second SOI marker", mpos);
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue; /* TEM, RSTn: no length */
        if (n - pos < 2) FAIL("JPEG truncated: the data ends inside a segment header", mpos);
        size_t len = be16(p + pos);
        if (len < 2) FAIL("JPEG garbled: a segment length below 2", mpos);
        if (n - pos < len) FAIL("JPEG truncated: a segment runs past the end of the data", mpos);
        const uint8_t *d = p + pos + 2;
        size_t dl = len - 2;
        size_t next = pos + len;
        if ((m >= 0xC0 && m <= 0xCF) && m != 0xC4 && m != 0xC8 && m != 0xCC) { /* SOFn */
            if (sof_seen) FAIL("JPEG garbled: a second frame header (SOF)", mpos);
            sof_seen = 1;
            if (dl < 6) FAIL("JPEG garbled: a frame header (SOF) too short", mpos);
            int nf = d[5];
            if (nf == 0) FAIL("JPEG garbled: a frame with no components", mpos);
            if (dl != 6 + 3 * (size_t)nf) FAIL("JPEG garbled: the frame header's length does not match its components",
                                             mpos);
            info->bit_depth = d[0];
            info->height = be16(d + 1);
            info->width = be16(d + 3);
            info->components = nf;
            if (info->width == 0) FAIL("JPEG garbled: the frame declares width 0", mpos);
            if (info->height == 0) info->flags |= SF_IMGF_UNUSUAL; /* height given by a DNL marker */
            if (m == 0xC2) info->flags |= SF_IMGF_PROGRESSIVE;
            else if (m != 0xC0 && m != 0xC1) info->flags |= SF_IMGF_UNUSUAL;
            if (d[0] != 8) info->flags |= SF_IMGF_UNUSUAL;
            if (nf != 1 && nf != 3 && nf != 4) info->flags |= SF_IMGF_UNUSUAL;
            for (int c = 0; c < nf; c++) {
                const uint8_t *cd = d + 6 + 3 * c;
                int h = cd[1] >> 4, v = cd[1] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4) FAIL("JPEG garbled: a sampling factor outside 1..4", mpos);
                if (cd[2] > 3) FAIL("JPEG garbled: a quantization table number above 3", mpos);
                if (c < 4) comp_ids[c] = cd[0];
            }
            ncomp = nf < 4 ? nf : 4;
        } else if (m == 0xC4) { /* DHT */
            size_t i = 0;
            if (dl == 0) FAIL("JPEG garbled: an empty Huffman table segment", mpos);
            while (i < dl) {
                if (dl - i < 17) FAIL("JPEG garbled: a Huffman table segment too short", mpos);
                if ((d[i] >> 4) > 1 || (d[i] & 15) > 3) FAIL("JPEG garbled: a bad Huffman table class or number", mpos);
                size_t count = 0;
                for (int k = 1; k <= 16; k++) count += d[i + k];
                if (count > 256) FAIL("JPEG garbled: a Huffman table with more than 256 codes", mpos);
                if (dl - i - 17 < count) FAIL("JPEG garbled: a Huffman table runs past its segment", mpos);
                i += 17 + count;
            }
        } else if (m == 0xDB) { /* DQT */
            size_t i = 0;
            if (dl == 0) FAIL("JPEG garbled: an empty quantization table segment", mpos);
            while (i < dl) {
                if ((d[i] >> 4) > 1 || (d[i] & 15) > 3) FAIL("JPEG garbled: a bad quantization table precision or number",
                                                               mpos);
                size_t size = 1 + ((d[i] >> 4) ? 128 : 64);
                if (dl - i < size) FAIL("JPEG garbled: a quantization table runs past its segment", mpos);
                i += size;
            }
        } else if (m == 0xDD) { /* DRI */
            if (dl != 2) FAIL("JPEG garbled: a restart interval segment of the wrong length", mpos);
        } else if (m == 0xE1) { /* APP1: EXIF (first one, as Pillow reads it) or XMP */
            if (dl >= 6 && memcmp(d, "Exif\0\0", 6) == 0) {
                if (!exif_seen) {
                    exif_seen = 1;
                    int o = 0;
                    if (tiff_orientation(d + 6, dl - 6, &o) < 0) info->flags |= SF_IMGF_EXIF_UNSURE;
                    else info->orientation = o;
                }
            } else if (contains(d, dl, "tiff:Orientation")) {
                info->flags |= SF_IMGF_EXIF_UNSURE;
            }
        } else if (m == 0xE2) { /* APP2: a multi-picture (MPO) index makes Pillow open another format */
            if (dl >= 4 && memcmp(d, "MPF\0", 4) == 0) info->flags |= SF_IMGF_UNUSUAL;
        } else if (m == 0xDA) { /* SOS, then entropy-coded data up to the next marker */
            if (!sof_seen) FAIL("JPEG garbled: image data (SOS) before the frame header (SOF)", mpos);
            if (dl < 1) FAIL("JPEG garbled: a scan header (SOS) too short", mpos);
            int ns = d[0];
            if (ns < 1 || ns > 4) FAIL("JPEG garbled: a scan with no or more than 4 components", mpos);
            if (dl != 4 + 2 * (size_t)ns) FAIL("JPEG garbled: the scan header's length does not match its components",
                                             mpos);
            for (int s = 0; s < ns; s++) {
                int ok = 0;
                for (int c = 0; c < ncomp; c++) ok |= comp_ids[c] == d[1 + 2 * s];
                if (!ok && ncomp == info->components) FAIL("JPEG garbled: a scan names a component the frame lacks", mpos);
            }
            sos_seen = 1;
            if (++info->scans > SF_JPEG_MAX_SCANS)
                FAIL("JPEG with more scans than any encoder writes (over 100): each costs a decoder a pass over "
                     "the whole image",
                     mpos);
            next = scan_end(p, n, next);
            if (next >= n) FAIL("JPEG truncated: the data ends inside the image data (no EOI marker)", n);
        }
        pos = next;
    }
}

int sf_jpeg_scans(const uint8_t *p, size_t n, int stop_after, uint32_t *width, uint32_t *height) {
    int scans = 0;
    size_t pos = 2;
    *width = *height = 0;
    while (pos < n && scans <= stop_after) {
        const uint8_t *q = memchr(p + pos, 0xFF, n - pos); /* garbage before a marker: skipped */
        if (q == NULL) break;
        pos = (size_t)(q - p);
        while (pos < n && p[pos] == 0xFF) pos++;
        if (pos >= n) break;
        uint8_t m = p[pos++];
        if (m == 0xD9) break;                                                   /* EOI */
        if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) continue; /* no length */
        if (n - pos < 2) break;
        size_t len = be16(p + pos);
        if (len < 2 || n - pos < len) break;
        if ((m >= 0xC0 && m <= 0xCF) && m != 0xC4 && m != 0xC8 && m != 0xCC && len >= 7 && *width == 0) {
            *height = be16(p + pos + 3);
            *width = be16(p + pos + 5);
        }
        pos += len;
        if (m == 0xDA) {
            scans++;
            pos = scan_end(p, n, pos);
        }
    }
    return scans;
}

static const char *check_png(const uint8_t *p, size_t n, sf_imginfo *info) {
    size_t pos = 8;
    int ihdr = 0, plte = 0, idat_state = 0; /* idat_state: 0 none yet, 1 in IDATs, 2 after them */
    int exif_seen = 0;
    info->format = SF_IMG_PNG;
    for (;;) {
        if (n - pos < 8) FAIL("PNG truncated: the data ends before the IEND chunk", n);
        uint32_t len = be32(p + pos);
        const uint8_t *type = p + pos + 4;
        if (len > 0x7FFFFFFFu) FAIL("PNG garbled: a chunk length above 2**31-1", pos);
        for (int k = 0; k < 4; k++) {
            uint8_t c = type[k];
            if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) FAIL("PNG garbled: a chunk type that is not 4 letters", pos);
        }
        if ((size_t)(n - pos - 8) < (size_t)len + 4) FAIL("PNG truncated: a chunk runs past the end of the data", pos);
        const uint8_t *d = p + pos + 8;
        if (crc32_png(type, (size_t)len + 4) != be32(d + len)) FAIL("PNG corrupt: a chunk's CRC does not match its data",
                                                                   pos);
        if (!ihdr && memcmp(type, "IHDR", 4) != 0) FAIL("PNG garbled: the first chunk is not IHDR", pos);
        if (idat_state == 1 && memcmp(type, "IDAT", 4) != 0) idat_state = 2;
        if (memcmp(type, "IHDR", 4) == 0) {
            if (ihdr) FAIL("PNG garbled: a second IHDR chunk", pos);
            if (len != 13) FAIL("PNG garbled: an IHDR chunk whose length is not 13", pos);
            ihdr = 1;
            info->width = be32(d);
            info->height = be32(d + 4);
            int depth = d[8], ct = d[9];
            info->bit_depth = depth;
            info->color_type = ct;
            if (info->width == 0 || info->height == 0) FAIL("PNG garbled: IHDR declares width or height 0", pos);
            if (info->width > 0x7FFFFFFFu || info->height > 0x7FFFFFFFu)
                FAIL("PNG garbled: IHDR declares a width or height above 2**31-1", pos);
            int ok;
            switch (ct) {
                case 0: ok = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16; info->components = 1; break;
                case 2: ok = depth == 8 || depth == 16; info->components = 3; break;
                case 3: ok = depth == 1 || depth == 2 || depth == 4 || depth == 8; info->components = 3; break;
                case 4: ok = depth == 8 || depth == 16; info->components = 2; break;
                case 6: ok = depth == 8 || depth == 16; info->components = 4; break;
                default: ok = 0;
            }
            if (!ok) FAIL("PNG garbled: IHDR has an invalid colour type and bit depth", pos);
            if (d[10] != 0 || d[11] != 0 || d[12] > 1)
                FAIL("PNG garbled: IHDR has an unknown compression, filter or interlace method", pos);
        } else if (memcmp(type, "PLTE", 4) == 0) {
            if (idat_state) FAIL("PNG garbled: PLTE after the image data", pos);
            if (len == 0 || len % 3 || len > 768) FAIL("PNG garbled: a PLTE chunk of a bad length", pos);
            plte = 1;
        } else if (memcmp(type, "IDAT", 4) == 0) {
            if (idat_state == 2) FAIL("PNG garbled: IDAT chunks that are not consecutive", pos);
            if (info->color_type == 3 && !plte) FAIL("PNG garbled: a palette image without a PLTE chunk", pos);
            idat_state = 1;
        } else if (memcmp(type, "IEND", 4) == 0) {
            if (len != 0) FAIL("PNG garbled: an IEND chunk with data", pos);
            if (!idat_state) FAIL("PNG garbled: IEND before any image data (no IDAT)", pos);
            return NULL;
        } else if (memcmp(type, "tRNS", 4) == 0) {
            info->flags |= SF_IMGF_ALPHA;
        } else if (memcmp(type, "eXIf", 4) == 0) {
            if (!exif_seen) {
                exif_seen = 1;
                int o = 0;
                const uint8_t *t = d;
                size_t tl = len;
                if (tl >= 6 && memcmp(t, "Exif\0\0", 6) == 0) t += 6, tl -= 6;
                if (tiff_orientation(t, tl, &o) < 0) info->flags |= SF_IMGF_EXIF_UNSURE;
                else info->orientation = o;
            }
        } else if (memcmp(type, "tEXt", 4) == 0 || memcmp(type, "zTXt", 4) == 0 || memcmp(type, "iTXt", 4) == 0) {
            static const char *keys[] = {"Raw profile type exif", "XML:com.adobe.xmp"};
            for (int k = 0; k < 2; k++) {
                size_t kl = strlen(keys[k]);
                if (len > kl && memcmp(d, keys[k], kl) == 0 && d[kl] == 0) info->flags |= SF_IMGF_EXIF_UNSURE;
            }
        } else if (type[0] >= 'A' && type[0] <= 'Z') {
            info->flags |= SF_IMGF_UNUSUAL; /* a critical chunk this check does not know */
        }
        pos += 12 + (size_t)len;
    }
}

const char *sf_image_check(const uint8_t *p, size_t n, sf_imginfo *info) {
    memset(info, 0, sizeof *info);
    info->color_type = -1;
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return check_jpeg(p, n, info);
    if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return check_png(p, n, info);
    info->format = SF_IMG_UNKNOWN;
    return NULL;
}

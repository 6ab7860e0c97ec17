/* Structural check of JPEG and PNG files from their headers, without decoding pixels.
 *
 * JPEG: the marker walk SOI .. SOF .. SOS .. EOI, every segment's length checked against
 * the file, the frame and scan headers and the DQT/DHT tables checked for consistency, the
 * entropy-coded data walked to the next marker (byte stuffing and RSTn skipped), EXIF
 * orientation read from the first APP1 "Exif" segment. PNG: signature, IHDR first and
 * valid, every chunk's length and CRC-32, PLTE where the colour type needs it, IDAT
 * present and contiguous, IEND last. Bytes after EOI / IEND are allowed (decoders ignore
 * them). What it does not check: the entropy-coded (JPEG) or deflate (PNG) data itself.
 *
 * Plain C, no allocation, no globals written after sf_imgcheck_init(); thread-safe. */
#ifndef SF_IMGCHECK_H
#define SF_IMGCHECK_H

#include <stddef.h>
#include <stdint.h>

enum { SF_IMG_UNKNOWN = 0, SF_IMG_JPEG = 1, SF_IMG_PNG = 2 };

/* flags: what makes the file something the caller should hand to a full decoder */
#define SF_IMGF_PROGRESSIVE 0x01  /* JPEG progressive (SOF2/6/10/14): informational */
#define SF_IMGF_UNUSUAL 0x02      /* JPEG: not 8-bit Huffman sequential/progressive (arithmetic, lossless,
                                     hierarchical, 12-bit), height from DNL; PNG: nothing */
#define SF_IMGF_EXIF_UNSURE 0x04  /* orientation may come from metadata this check does not read
                                     (malformed EXIF, XMP tiff:Orientation, PNG text-chunk EXIF) */
#define SF_IMGF_ALPHA 0x08        /* PNG with tRNS */

/* The most scans a JPEG may have: every encoder writes one scan (sequential) to a few dozen
 * (progressive: libjpeg's default script 10, mozjpeg's optimized ones about 20), while each
 * scan costs a decoder a pass over the whole image's coefficients, so a small file that
 * repeats a scan thousands of times takes seconds to decode (libjpeg-turbo's advice: limit
 * them, its TJPARAM_SCANLIMIT / djpeg -maxscans). */
#define SF_JPEG_MAX_SCANS 100

typedef struct {
    int format;          /* SF_IMG_JPEG, SF_IMG_PNG, or SF_IMG_UNKNOWN (not a JPEG/PNG signature) */
    uint32_t width, height;
    int components;      /* JPEG: components in the frame (1..4); PNG: channels of the colour type */
    int color_type;      /* PNG colour type (0, 2, 3, 4, 6); JPEG: -1 */
    int bit_depth;       /* JPEG sample precision; PNG bit depth */
    int orientation;     /* EXIF orientation tag value, 0 when there is none */
    int flags;           /* SF_IMGF_* */
    int scans;           /* JPEG: scans (SOS markers) walked */
    size_t error_offset; /* where the error was found (bytes from the start) */
} sf_imginfo;

void sf_imgcheck_init(void);

/* Check the file at p[0..n). Returns NULL when it is well formed (info filled), else a
 * static string saying what is wrong (info->error_offset says where). A file that is
 * neither JPEG nor PNG returns NULL with info->format == SF_IMG_UNKNOWN. */
const char *sf_image_check(const uint8_t *p, size_t n, sf_imginfo *info);

/* A JPEG's scans as a lenient decoder finds them (libjpeg skips bytes that are not a marker
 * where one should be, with a warning), counted up to stop_after + 1; *width and *height from
 * its frame header (0 when it has none). Walks the markers and each scan's entropy-coded data
 * (no decoding); p[0..n) need not be a whole or valid JPEG. */
int sf_jpeg_scans(const uint8_t *p, size_t n, int stop_after, uint32_t *width, uint32_t *height);

#endif

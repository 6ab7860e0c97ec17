/* Image-folder rows converted in C: the common case of a classification conversion (the image
 * file kept as it is, verified by its headers) from the file's bytes to its framed TFRecord
 * record, without Python per row (plain C, no Python, no allocation, thread-safe).
 *
 * The rules are those of shardfeed/convert/images.py (load_image with check="header",
 * _kept_by_header) and the bytes those of shardfeed/formats/example_encode.py (example_pieces
 * of TableConverter.convert's features, in its order):
 *
 *   image/encoded (the file), image/format ("jpeg"/"png"), image/height, image/width,
 *   image/channels (3), image/source_id (the path), then `tail`: the label features' map
 *   entries, encoded by the caller.
 *
 * A row that is anything but plainly kept or plainly discarded (not JPEG/PNG, another format
 * than wanted, to be resized, rotated or made RGB, unusual) is SF_ROW_PYTHON: the caller
 * converts it the general way, which gives the same answer it always did. */
#ifndef SF_IMGROWS_H
#define SF_IMGROWS_H

#include <stddef.h>
#include <stdint.h>

#include "imgcheck.h"

enum {
    SF_ROW_KEPT = 0,    /* framed here */
    SF_ROW_EMPTY = 1,   /* discard: "empty file (0 bytes)" */
    SF_ROW_CORRUPT = 2, /* discard: "corrupt image: <err> (at byte <offset>)" */
    SF_ROW_BOMB = 3,    /* discard: "decompression bomb: WxH = P pixels exceeds max_image_pixels=M" */
    SF_ROW_PYTHON = 4,  /* the general path decides */
};

/* What happens to the file p[0..n) stored as `want` (SF_IMG_JPEG or SF_IMG_PNG) with images
 * at most `max_size` on their longest side (0: no limit) and `max_pixels` pixels: SF_ROW_*.
 * info is filled by sf_image_check (for n > 0); *err is its error (SF_ROW_CORRUPT). */
int sf_imgrow_judge(const uint8_t *p, size_t n, int want, int64_t max_size, int64_t max_pixels,
                    sf_imginfo *info, const char **err);

/* The length of the Example record of a kept row (data: n bytes; uri: the source id, uri_n
 * bytes; tail: tail_n bytes), and of its TFRecord frame (+16). */
size_t sf_imgrow_record_size(size_t n, uint32_t width, uint32_t height, size_t uri_n, size_t tail_n, int want);

/* Write the frame of a kept row at dst (sf_imgrow_record_size(...) + 16 bytes): length, its
 * masked CRC, the record (the data copied and checksummed in one pass), its masked CRC.
 * Returns the end of what was written. */
uint8_t *sf_imgrow_frame(uint8_t *dst, const uint8_t *data, size_t n, uint32_t width, uint32_t height,
                         const uint8_t *uri, size_t uri_n, const uint8_t *tail, size_t tail_n, int want);

#endif

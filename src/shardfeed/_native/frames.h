/* TFRecord framing scan over an in-memory buffer (plain C, no Python).
 *
 * A frame is uint64 LE length | uint32 masked crc32c(length bytes) | data |
 * uint32 masked crc32c(data).
 */
#ifndef SHARDFEED_FRAMES_H
#define SHARDFEED_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define SF_FRAME_OK 0
#define SF_FRAME_LENGTH_CRC 1   /* "length crc" */
#define SF_FRAME_DATA_CRC 2     /* "data crc" */
#define SF_FRAME_ABSURD_LENGTH 3 /* "absurd length" */

typedef struct {
    size_t count;     /* frames written to offsets/lengths */
    size_t consumed;  /* bytes of whole, good frames from the buffer's start */
    int error;        /* SF_FRAME_* */
    size_t error_offset; /* frame start of the failed check (== consumed) */
} sf_scan_result;

/* Scan whole frames in buf[0:len], writing each frame's data start and length, at most
 * `cap` frames. Stops at the first incomplete frame, the first failed check, or before a
 * whole frame that no longer fits in `cap` (its header is checked first, so a bad header
 * is reported even with cap 0); `consumed` is where the next scan should start. Never reads outside
 * buf[0:len]. Checks in the order the Python reader does: length crc (when verify),
 * absurd length (> max_record_bytes), completeness, data crc (when verify).
 * With `crcs` (cap entries), the data crc is not checked but each frame's stored masked
 * data CRC is written there, for a later pass to check (crcfuse.h); the length crc is
 * still checked when verify. */
void sf_scan_frames(const uint8_t *buf, size_t len, int verify, uint64_t max_record_bytes,
                    int64_t *offsets, int64_t *lengths, uint32_t *crcs, size_t cap, sf_scan_result *res);

#endif

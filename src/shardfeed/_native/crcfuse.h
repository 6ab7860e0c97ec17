/* A record's data CRC checked in the pass that copies its values out (plain C, no Python).
 *
 * The framing scan can leave each record's data CRC to the batch parser (it then checks only
 * the 8-byte length CRC and hands out the expected data CRCs). The parser, once it knows where
 * a record's values lie, walks the record once: the bytes between values go through the CRC,
 * the values through a CRC that stores each word at the value's place in the batch buffer
 * (sf_crc32c_copy). So the 114 KB image of an MLPerf record is read from memory once after the
 * page cache, not once for the CRC and again for the copy.
 */
#ifndef SHARDFEED_CRCFUSE_H
#define SHARDFEED_CRCFUSE_H

#include <stddef.h>
#include <stdint.h>

#include "example_parse.h" /* sf_bytes */

typedef struct {
    const uint8_t *src; /* the value's bytes (in the record, or elsewhere: a spec default) */
    size_t n;
    uint8_t *dst;       /* where they go */
} sf_seg;

/* Copy every segment to its dst and check rec[0:len]'s masked CRC-32C against `want`, in one
 * pass over the record. Segments need not be sorted (they are, in place); a segment that is
 * not wholly inside the record, or that overlaps an earlier one, is copied with memcpy and
 * the record's bytes still all go through the CRC exactly once. Every segment is copied even
 * when the CRC fails. Returns 0 when the CRC matches, -1 when not. */
int sf_copy_verify_record(const uint8_t *rec, size_t len, sf_seg *segs, size_t nseg, uint32_t want);

/* The first i < n whose masked CRC-32C differs from want[i] (n native-order uint32 at `want`,
 * any alignment), or n when all match. */
size_t sf_first_bad_crc(const sf_bytes *recs, const uint8_t *want, size_t n);

#endif

#include "frames.h"

#include <string.h>

#include "crc32c.h"

#define SF_SCAN_PREFETCH 4096 /* bytes ahead of the scan asked for */


static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

void sf_scan_frames(const uint8_t *buf, size_t len, int verify, uint64_t max_record_bytes,
                    int64_t *offsets, int64_t *lengths, uint32_t *crcs, size_t cap, sf_scan_result *res) {
    size_t pos = 0, count = 0;
    int error = SF_FRAME_OK;
    /* Each header's place is known only once the previous length is read: a chain of cache
     * misses on a cold mapping. The frames lie end to end, so the bytes some way ahead are
     * asked for before they are needed (every line once; the parser reads them next). */
    size_t ahead = 0;
    while (len - pos >= 12) {
        const uint8_t *h = buf + pos;
        size_t want = pos + SF_SCAN_PREFETCH < len ? pos + SF_SCAN_PREFETCH : len;
        for (ahead = ahead > pos ? ahead : pos; ahead < want; ahead += 64) __builtin_prefetch(buf + ahead);
        uint64_t n = sf_load_le64(h);
        if (verify && sf_masked_crc32c(h, 8) != rd32(h + 8)) {
            error = SF_FRAME_LENGTH_CRC;
            break;
        }
        if (n > max_record_bytes) {
            error = SF_FRAME_ABSURD_LENGTH;
            break;
        }
        /* overflow-safe: n <= len - pos - 16 */
        size_t avail = len - pos;
        if (avail < 16 || n > (uint64_t)(avail - 16)) break; /* incomplete: caller refills */
        if (count == cap) break; /* out of room: the caller grows the arrays and goes on */
        if (crcs) {
            crcs[count] = rd32(h + 12 + n); /* the batch parser checks it */
        } else if (verify && sf_masked_crc32c(h + 12, (size_t)n) != rd32(h + 12 + n)) {
            error = SF_FRAME_DATA_CRC;
            break;
        }
        offsets[count] = (int64_t)(pos + 12);
        lengths[count] = (int64_t)n;
        count++;
        pos += 16 + (size_t)n;
    }
    res->count = count;
    res->consumed = pos;
    res->error = error;
    res->error_offset = pos;
}

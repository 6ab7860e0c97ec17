/* libFuzzer harness: the seeded permutation of shuffle="global" (permute.c). Input: bytes
 * 0-7 the size n (little-endian, cut to 1..4096 when byte 8 is even, to 1..2^62 otherwise),
 * bytes 9-56 the six round keys, 57-64 the first position, 65 the step (1-255); missing bytes
 * are zero. Checks: n <= 4096: the whole order is a bijection of [0, n); larger n: a window of
 * up to 256 positions lands in [0, n), distinct positions give distinct values, and the
 * positions form (an array) gives what the range form gives. The small orders are also planned
 * (sf_plan_window) over files cut by bytes 66 on (a file of 0 records where a byte is odd):
 * each record's file holds it, its offset, length, virtual offset and number are right. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "permute.h"

static uint64_t le64(const uint8_t *d, size_t size, size_t at) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = (v << 8) | (at + b < size ? d[at + b] : 0);
    return v;
}

static void plan_check(const int64_t *ids, uint64_t n, const uint8_t *data, size_t size) {
    int64_t before[65], first[64];
    size_t nfiles = 0;
    before[0] = 0;
    for (size_t at = 66; at < size && nfiles < 63 && (uint64_t)before[nfiles] < n; at++, nfiles++) {
        int64_t cut = data[at] & 1 ? 0 : data[at] / 2 + 1;
        if ((uint64_t)(before[nfiles] + cut) > n) cut = (int64_t)n - before[nfiles];
        before[nfiles + 1] = before[nfiles] + cut;
        first[nfiles] = data[at] % 3 == 0 ? -1 : data[at];
    }
    if (!nfiles || (uint64_t)before[nfiles] < n) { /* the rest in one last file */
        before[nfiles + 1] = (int64_t)n;
        first[nfiles] = 7;
        nfiles++;
    }
    int64_t *offsets = malloc(n * sizeof *offsets), *o = malloc(5 * n * sizeof *o);
    uint32_t *lengths = malloc(n * sizeof *lengths);
    if (!offsets || !o || !lengths) abort();
    for (uint64_t k = 0; k < n; k++) {
        offsets[k] = (int64_t)(k * 40 + 3);
        lengths[k] = (uint32_t)(k % 37 + 1);
    }
    sf_plan_window(ids, n, offsets, lengths, NULL, before, nfiles, first, o, o + n, o + 2 * n, o + 3 * n, o + 4 * n);
    int64_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        int64_t id = ids[i], f = o[i];
        if (f < 0 || (size_t)f >= nfiles || before[f] > id || id >= before[f + 1]) abort();
        if (o[n + i] != offsets[id] || o[2 * n + i] != lengths[id] || o[3 * n + i] != at) abort();
        if (o[4 * n + i] != (first[f] >= 0 ? id - before[f] + first[f] : -1)) abort();
        at += lengths[id];
    }
    free(offsets);
    free(o);
    free(lengths);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int small = size <= 8 || !(data[8] & 1);
    uint64_t n = le64(data, size, 0) % (small ? 4096 : (1ULL << 62)) + 1;
    unsigned bits = 2;
    while (bits < 64 && (n - 1) >> bits) bits++;
    bits += bits % 2;
    unsigned half = bits / 2;
    uint64_t keys[6];
    for (int r = 0; r < 6; r++) keys[r] = le64(data, size, 9 + 8 * (size_t)r);
    int64_t step = size > 65 && data[65] ? data[65] : 1;
    if (small) {
        int64_t *out = malloc(n * sizeof *out);
        uint8_t *seen = calloc(n, 1);
        if (!out || !seen) abort();
        sf_permute(n, half, keys, 6, NULL, 0, 1, n, out);
        for (uint64_t i = 0; i < n; i++) {
            if (out[i] < 0 || (uint64_t)out[i] >= n || seen[out[i]]) abort();
            seen[out[i]] = 1;
        }
        plan_check(out, n, data, size);
        free(out);
        free(seen);
        return 0;
    }
    int64_t first = (int64_t)(le64(data, size, 57) % n);
    size_t count = (size_t)((n - 1 - (uint64_t)first) / (uint64_t)step + 1);
    if (count > 256) count = 256;
    int64_t out[256], again[256], pos[256];
    sf_permute(n, half, keys, 6, NULL, first, step, count, out);
    for (size_t i = 0; i < count; i++) pos[i] = first + (int64_t)i * step;
    sf_permute(n, half, keys, 6, pos, 0, 0, count, again);
    for (size_t i = 0; i < count; i++) {
        if (out[i] < 0 || (uint64_t)out[i] >= n || out[i] != again[i]) abort();
        for (size_t j = 0; j < i; j++)
            if (out[j] == out[i]) abort();
    }
    return 0;
}

/* libFuzzer harness: the seeded permutation of shuffle="global" (permute.c). Input: bytes
 * 0-7 the size n (little-endian, cut to 1..4096 when byte 8 is even, to 1..2^62 otherwise),
 * bytes 9-56 the six round keys, 57-64 the first position, 65 the step (1-255); missing bytes
 * are zero. Checks: n <= 4096: the whole order is a bijection of [0, n); larger n: a window of
 * up to 256 positions lands in [0, n), distinct positions give distinct values, and the
 * positions form (an array) gives what the range form gives. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "permute.h"

static uint64_t le64(const uint8_t *d, size_t size, size_t at) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = (v << 8) | (at + b < size ? d[at + b] : 0);
    return v;
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

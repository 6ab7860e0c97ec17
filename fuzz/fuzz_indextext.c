/* libFuzzer harness: index files parsed in C (indextext.c). Input: the index text; byte 0
 * also picks the capacity (0-63 pairs, or enough for every line). Checks: never reads or
 * writes out of bounds (ASan); every pair written has a length >= 16 and offset + length
 * below 2^63; the count is at most the capacity; the text re-written from the pairs parses
 * to the same pairs; a line of other than two numbers or a foreign byte gives -1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "indextext.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t lines = 1;
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    size_t cap = size && (data[0] & 64) ? (size_t)(data[0] & 63) : lines;
    int64_t *out = malloc((cap ? cap : 1) * 2 * sizeof *out);
    if (!out) abort();
    int64_t n = sf_parse_index((const char *)data, size, out, cap);
    if (n < -1 || (n >= 0 && (size_t)n > cap)) abort();
    int foreign = 0;
    for (size_t i = 0; i < size; i++) foreign |= !(data[i] == ' ' || data[i] == '\n' || (data[i] >= '0' && data[i] <= '9'));
    if (foreign && n >= 0) abort();
    if (n > 0) {
        char *text = malloc((size_t)n * 42 + 1);
        int64_t *again = malloc((size_t)n * 2 * sizeof *again);
        if (!text || !again) abort();
        size_t at = 0;
        for (int64_t k = 0; k < n; k++) {
            if (out[2 * k] < 0 || out[2 * k + 1] < 16 || out[2 * k] > INT64_MAX - out[2 * k + 1]) abort();
            at += (size_t)sprintf(text + at, "%lld %lld\n", (long long)out[2 * k], (long long)out[2 * k + 1]);
        }
        if (sf_parse_index(text, at, again, (size_t)n) != n || memcmp(out, again, (size_t)n * 2 * sizeof *out)) abort();
        free(text);
        free(again);
    }
    free(out);
    return 0;
}

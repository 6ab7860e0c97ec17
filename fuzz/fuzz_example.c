/* libFuzzer harness: the Example and SequenceExample parsers (example_parse.c) with no Python.
 * The first byte picks one of a few specs (bits 0-1: FixedLen/VarLen/Sparse of every dtype,
 * with and without defaults, keys that seed-corpus records use) and, with bit 2 set, parses
 * the batch as SequenceExamples with feature-list columns added; the rest is split at 0xFF
 * 0xFE 0xFD markers into records of one batch. Every record is also validated alone. ASan
 * catches out-of-bounds access; the harness checks output invariants. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "example_parse.h"

#define MAXREC 16
#define MAXCOLS 16

static sf_spec *specs[8]; /* 4..7: the same with feature-list columns, for SequenceExamples */

static const sf_bytes K(const char *s) { sf_bytes b = {(const uint8_t *)s, strlen(s)}; return b; }

static void build_specs(void) {
    static const int64_t d_int[2] = {7, -1};
    static const float d_float[2] = {0.5f, 1.5f};
    static sf_bytes d_bytes[2];
    static sf_bytes ikeys[2];
    static const int64_t isizes[2] = {10, 100};
    d_bytes[0] = K("x");
    d_bytes[1] = K("");
    ikeys[0] = K("idx");
    ikeys[1] = K("idx2");
    for (int v = 0; v < 4; v++) {
        sf_colspec c[12];
        memset(c, 0, sizeof(c));
        int n = 0;
        const char *names[3] = {"a", "b", "c"};
        for (int k = 0; k < 3; k++) { /* a: int64, b: float, c: bytes */
            c[n].col = SF_COL_FIXED;
            c[n].kind = k == 0 ? SF_KIND_INT64 : k == 1 ? SF_KIND_FLOAT : SF_KIND_BYTES;
            c[n].key = (const uint8_t *)names[k];
            c[n].key_len = 1;
            c[n].size = (v & 1) ? 2 : 1;
            c[n].has_default = (v & 2) != 0;
            c[n].default_values = k == 0 ? (const void *)d_int : (const void *)d_float;
            c[n].default_bytes = d_bytes;
            n++;
        }
        const char *vnames[3] = {"ids", "f", "s"};
        for (int k = 0; k < 3; k++) {
            c[n].col = SF_COL_VAR;
            c[n].kind = k == 0 ? SF_KIND_INT64 : k == 1 ? SF_KIND_FLOAT : SF_KIND_BYTES;
            c[n].key = (const uint8_t *)vnames[k];
            c[n].key_len = strlen(vnames[k]);
            n++;
        }
        /* the same key twice, an empty key, and a key no record can hold */
        c[n].col = SF_COL_VAR; c[n].kind = SF_KIND_INT64; c[n].key = (const uint8_t *)"a"; c[n].key_len = 1; n++;
        c[n].col = SF_COL_VAR; c[n].kind = SF_KIND_BYTES; c[n].key = (const uint8_t *)""; c[n].key_len = 0; n++;
        c[n].col = SF_COL_VAR; c[n].kind = SF_KIND_FLOAT; c[n].key = (const uint8_t *)""; c[n].key_len = SIZE_MAX; n++;
        c[n].col = SF_COL_SPARSE;
        c[n].kind = v & 1 ? SF_KIND_FLOAT : SF_KIND_BYTES;
        c[n].key = (const uint8_t *)"val";
        c[n].key_len = 3;
        c[n].nindex = v >= 2 ? 2 : 1;
        c[n].index_keys = ikeys;
        c[n].index_sizes = isizes;
        n++;
        specs[v] = sf_spec_new(c, (size_t)n);
        if (!specs[v]) abort();
        /* feature lists: a required / optional fixed int64 list, float and bytes lists, a
         * key shared with the context, the empty key, a key no record can hold */
        sf_colspec q[MAXCOLS];
        memcpy(q, c, sizeof(c[0]) * (size_t)n);
        int m = n;
        const char *lnames[4] = {"a", "f", "s", ""};
        for (int k = 0; k < 4; k++) {
            memset(&q[m], 0, sizeof(q[m]));
            q[m].col = k == 0 ? SF_COL_SEQ_FIXED : SF_COL_SEQ_VAR;
            q[m].kind = k == 1 ? SF_KIND_FLOAT : k == 2 ? SF_KIND_BYTES : SF_KIND_INT64;
            q[m].key = (const uint8_t *)lnames[k];
            q[m].key_len = strlen(lnames[k]);
            q[m].size = (v & 1) ? 2 : 1;
            q[m].required = (v & 2) != 0;
            m++;
        }
        memset(&q[m], 0, sizeof(q[m]));
        q[m].col = SF_COL_SEQ_FIXED; q[m].kind = SF_KIND_BYTES; q[m].key = (const uint8_t *)""; q[m].key_len = SIZE_MAX;
        q[m].size = 0; m++;
        specs[4 + v] = sf_spec_new(q, (size_t)m);
        if (!specs[4 + v]) abort();
    }
}

static int is_seq_col(size_t ci) { return ci >= 10; }

static size_t col_size(int v, size_t ci) { return ci < 3 ? ((v & 1) ? 2 : 1) : 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!specs[0]) build_specs();
    if (size < 1) return 0;
    int v = data[0] & 3, seq = (data[0] & 4) != 0;
    const sf_spec *spec = specs[v + 4 * seq];
    /* split into records, each copied to its own exact-size heap block */
    sf_bytes recs[MAXREC];
    uint8_t *blocks[MAXREC];
    size_t n = 0, start = 1;
    for (size_t i = 1; i <= size && n < MAXREC; i++) {
        int cut = i == size || (i + 2 < size && data[i] == 0xFF && data[i + 1] == 0xFE && data[i + 2] == 0xFD);
        if (!cut) continue;
        size_t len = i - start;
        blocks[n] = malloc(len ? len : 1);
        if (len) memcpy(blocks[n], data + start, len);
        recs[n].p = blocks[n];
        recs[n].n = len;
        n++;
        start = i + 3;
        i += 2;
    }
    sf_error err;
    for (size_t k = 0; k < n; k++) {
        sf_validate_example(recs[k].p, recs[k].n, &err);
        sf_validate_sequence_example(recs[k].p, recs[k].n, &err);
    }

    size_t ncols = sf_spec_ncols(spec);
    sf_colout outs[MAXCOLS];
    memset(outs, 0, sizeof(outs));
    void *fixed[MAXCOLS] = {0};
    int64_t *splits[MAXCOLS] = {0};
    for (size_t ci = 0; ci < ncols; ci++) {
        if (ci < 3) {
            size_t elem = ci == 2 ? sizeof(sf_bytes) : ci == 0 ? 8 : 4;
            fixed[ci] = malloc(elem * col_size(v, ci) * (n ? n : 1));
            outs[ci].fixed = fixed[ci];
        } else {
            splits[ci] = malloc(sizeof(int64_t) * (n + 1));
            outs[ci].splits = splits[ci];
        }
    }
    int rc = seq ? sf_parse_sequence_batch(spec, recs, n, outs, &err) : sf_parse_batch(spec, recs, n, outs, &err);
    if (rc == 0) {
        for (size_t ci = 3; ci < ncols; ci++) {
            if (is_seq_col(ci)) { /* splits count steps, steps count values */
                const int64_t *st = outs[ci].steps.data;
                size_t ns = outs[ci].steps.len;
                if (ns < 1 || st[0] != 0 || (size_t)st[ns - 1] != outs[ci].values.len) abort();
                for (size_t k = 0; k + 1 < ns; k++)
                    if (st[k] > st[k + 1]) abort();
                if (splits[ci][0] != 0 || (size_t)splits[ci][n] != ns - 1) abort();
                if (ci == 10) /* SEQ_FIXED: every step holds `size` values */
                    for (size_t k = 0; k + 1 < ns; k++)
                        if ((size_t)(st[k + 1] - st[k]) != col_size(v, 0)) abort();
            } else if (splits[ci][0] != 0 || (size_t)splits[ci][n] != outs[ci].values.len) {
                abort();
            }
            for (size_t k = 0; k < n; k++)
                if (splits[ci][k] > splits[ci][k + 1]) abort();
        }
        /* touch every bytes value: ASan checks that they lie inside the records */
        volatile uint8_t sink = 0;
        sf_bytes *fb = fixed[2];
        for (size_t k = 0; k < n * col_size(v, 2); k++)
            for (size_t j = 0; j < fb[k].n; j++) sink ^= fb[k].p[j];
        sf_bytes *vb = outs[5].values.data;
        for (size_t k = 0; k < outs[5].values.len; k++)
            for (size_t j = 0; j < vb[k].n; j++) sink ^= vb[k].p[j];
        if (seq) {
            sf_bytes *lb = outs[12].values.data;
            for (size_t k = 0; k < outs[12].values.len; k++)
                for (size_t j = 0; j < lb[k].n; j++) sink ^= lb[k].p[j];
        }
        (void)sink;
    } else if (err.kind != SF_ERR_DECODE && err.kind != SF_ERR_PARSE) {
        abort(); /* out of memory cannot happen on fuzzer-sized input */
    } else if (err.record >= n) {
        abort();
    }
    sf_out_free(spec, outs);
    for (size_t ci = 0; ci < ncols; ci++) {
        free(fixed[ci]);
        free(splits[ci]);
    }
    for (size_t k = 0; k < n; k++) free(blocks[k]);
    return 0;
}

/* Batched tf.train.Example and tf.train.SequenceExample parsing into flat arrays (plain C,
 * no Python).
 *
 * Semantics are those of the pure-Python reference, shardfeed/formats/example.py
 * (decode rules of shardfeed/formats/wire.py, protobuf merge rules, tf.io.parse_example
 * spec rules). All positions in error messages are byte offsets into the record.
 * A compiled spec (sf_spec) is immutable and may be used by several threads at once;
 * every call allocates its own scratch state.
 */
#ifndef SHARDFEED_EXAMPLE_PARSE_H
#define SHARDFEED_EXAMPLE_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* Feature kinds = Feature field numbers; also the column dtypes. */
#define SF_KIND_NONE 0
#define SF_KIND_BYTES 1
#define SF_KIND_FLOAT 2
#define SF_KIND_INT64 3

#define SF_COL_FIXED 0
#define SF_COL_VAR 1
#define SF_COL_SPARSE 2
/* Feature lists of a SequenceExample (their keys are looked up among the feature lists,
 * not the context): every step holds `size` values / any number of values. */
#define SF_COL_SEQ_FIXED 3
#define SF_COL_SEQ_VAR 4

#define SF_MAX_DEPTH 100
#define SF_MAX_LENGTH 0x7FFFFFFFull

typedef struct {
    const uint8_t *p;
    size_t n;
} sf_bytes;

/* One column of a spec, as given to sf_spec_new (which copies everything). */
typedef struct {
    int col;               /* SF_COL_* */
    int kind;              /* SF_KIND_BYTES/FLOAT/INT64 */
    const uint8_t *key;    /* FIXED/VAR: the feature key; SPARSE: the value key (UTF-8) */
    size_t key_len;        /* SIZE_MAX: a key no record can hold (never matches) */
    size_t size;           /* FIXED: values per record */
    int has_default;       /* FIXED */
    const void *default_values; /* FIXED numeric: `size` int64_t or float */
    const sf_bytes *default_bytes; /* FIXED bytes: `size` values */
    size_t nindex;         /* SPARSE: number of index keys */
    const sf_bytes *index_keys;   /* SPARSE */
    const int64_t *index_sizes;   /* SPARSE: dense size per index key */
    int required;          /* SEQ_FIXED: a record without this feature list is an error */
} sf_colspec;

typedef struct sf_spec sf_spec;

/* Returns NULL on allocation failure (or an impossible spec). */
sf_spec *sf_spec_new(const sf_colspec *cols, size_t ncols);
void sf_spec_free(sf_spec *spec);
size_t sf_spec_ncols(const sf_spec *spec);

typedef struct {
    void *data;
    size_t len, cap, elem;
} sf_vec;

/* Per-column output of one batch. The caller provides `fixed` (FIXED: n*size values of
 * int64_t, float or sf_bytes) and `splits` (VAR, SPARSE and SEQ_*: n+1 int64; VAR and SPARSE:
 * per-record value counts as offsets, SEQ_*: per-record step counts as offsets); the parser
 * fills `values` (VAR, SPARSE, SEQ_*), `index[nindex]` (SPARSE, int64) and `steps` (SEQ_*,
 * int64: 0, then the running value count after each step), which sf_out_free releases.
 * sf_bytes values point into the records or into the spec's default values. */
typedef struct {
    void *fixed;
    int64_t *splits;
    sf_vec values;
    sf_vec *index;
    sf_vec steps;
} sf_colout;

#define SF_ERR_NONE 0
#define SF_ERR_DECODE 1
#define SF_ERR_PARSE 2
#define SF_ERR_NOMEM 3

/* ParseError codes (a, b, c as listed) */
#define SF_P_KIND 1      /* a = where (0 feature, 1 value feature, 2 + d index feature d), b = got, c = want */
#define SF_P_MISSING 2   /* FixedLen without default */
#define SF_P_COUNT 3     /* a = got */
#define SF_P_SPARSE_LEN 4   /* a = index d, b = index count, c = value count */
#define SF_P_SPARSE_RANGE 5 /* a = index d, b = the bad value */
#define SF_P_SEQ_MISSING 6  /* SEQ_FIXED, required, and the record has no such feature list */
#define SF_P_SEQ_KIND 7     /* a = step, b = got, c = want */
#define SF_P_SEQ_COUNT 8    /* SEQ_FIXED: a = step, b = values in it */

typedef struct {
    int kind;       /* SF_ERR_* */
    int code;       /* SF_P_* for SF_ERR_PARSE */
    size_t record;  /* index in the batch */
    size_t column;  /* column index for SF_ERR_PARSE */
    int64_t a, b, c;
    char msg[320];  /* SF_ERR_DECODE: what the reference's DecodeError says */
} sf_error;

/* Parse records[0:n]. Returns 0, or -1 with *err filled (outputs then hold partial data
 * that the caller must still release with sf_out_free). `outs` has sf_spec_ncols entries,
 * zero-initialised apart from the caller-provided pointers. */
int sf_parse_batch(const sf_spec *spec, const sf_bytes *records, size_t n, sf_colout *outs, sf_error *err);
void sf_out_free(const sf_spec *spec, sf_colout *outs);

/* Validate one record as a tf.train.Example (every rule of the decoder). 0 or -1. */
int sf_validate_example(const uint8_t *buf, size_t len, sf_error *err);

/* Parse records[0:n] as SequenceExamples: the spec's FIXED/VAR columns read the context,
 * its SEQ_* columns the feature lists. Errors come in the reference's order: the first
 * record that does not decode; else the first context error (record by record, as
 * sf_parse_batch orders them); else the first feature-list error, column by column in
 * spec order, then record, then step. Returns 0 or -1 as sf_parse_batch does. */
int sf_parse_sequence_batch(const sf_spec *spec, const sf_bytes *records, size_t n, sf_colout *outs,
                            sf_error *err);

/* Validate one record as a tf.train.SequenceExample. 0 or -1. */
int sf_validate_sequence_example(const uint8_t *buf, size_t len, sf_error *err);

#endif

/* Batched tf.train.Example and SequenceExample parsing: see example_parse.h.
 *
 * Per record, one pass over the bytes validates everything the reference decoder checks
 * (in the same order, so the first error is the same one with the same message) and, for
 * every map entry whose key is in the spec, records where its Feature's last list run
 * starts and how many values it holds (for a feature list: that, per step). A second pass
 * copies the values of the spec's features straight into the outputs. Nothing is allocated from a length read from the
 * input: outputs grow by values actually present, and every length is checked against
 * the bytes left in its enclosing message before use.
 */
#include "example_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WT_VARINT 0
#define WT_FIXED64 1
#define WT_LEN 2
#define WT_SGROUP 3
#define WT_EGROUP 4
#define WT_FIXED32 5

#if defined(__GNUC__) || defined(__clang__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#endif

/* ------------------------------------------------------------------ the compiled spec */

typedef struct {
    uint8_t *key;
    size_t key_len;
    uint64_t hash;
    long eager_col; /* the one FixedLen column reading this slot, written during the entry
                       pass; -1 when no column or several read it */
    size_t uses;
} slot_def;

typedef struct {
    int col, kind;
    size_t slot; /* FIXED/VAR: the key's slot; SPARSE: the value key's slot */
    size_t size;
    int has_default;
    int required;         /* SEQ_FIXED */
    void *default_values; /* int64/float: size values; bytes: size sf_bytes */
    uint8_t *default_blob;
    size_t nindex;
    size_t *index_slots;
    int64_t *index_sizes;
} col_def;

struct sf_spec {
    size_t ncols;
    col_def *cols;
    size_t *order; /* column indices: FixedLen first, then VarLen, then Sparse */
    size_t *rest;  /* the same without the eager columns */
    size_t nrest, neager;
    size_t nslots;
    slot_def *slots;
    size_t table_mask; /* open addressing: table[h & mask] = slot + 1, 0 empty */
    uint32_t *table;     /* the context's (an Example's) feature keys */
    uint32_t *seq_table; /* a SequenceExample's feature-list keys (another namespace) */
    size_t *seqcols;     /* the SEQ_* column indices, in spec order */
    size_t nseq;
};

static uint64_t hash_key(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static long find_in(const sf_spec *s, const uint32_t *table, const uint8_t *key, size_t len) {
    uint64_t h = hash_key(key, len);
    size_t i = (size_t)h & s->table_mask;
    for (;;) {
        uint32_t t = table[i];
        if (!t) return -1;
        const slot_def *d = &s->slots[t - 1];
        if (d->hash == h && d->key_len == len && memcmp(d->key, key, len) == 0) return (long)(t - 1);
        i = (i + 1) & s->table_mask;
    }
}

static long find_slot(const sf_spec *s, const uint8_t *key, size_t len) { return find_in(s, s->table, key, len); }

/* The slot for `key` in `table` (adding one if new); SIZE_MAX for a never-matching key. */
static size_t add_slot(sf_spec *s, uint32_t *table, const uint8_t *key, size_t len, size_t max_slots) {
    if (len == SIZE_MAX) return SIZE_MAX;
    long f = find_in(s, table, key, len);
    if (f >= 0) return (size_t)f;
    if (s->nslots >= max_slots) return SIZE_MAX - 1; /* cannot happen: sized for all keys */
    slot_def *d = &s->slots[s->nslots];
    d->key = calloc(1, len + 8); /* 8 zero bytes past the key: a word load from it stays inside */
    if (!d->key) return SIZE_MAX - 1;
    memcpy(d->key, key, len);
    d->key_len = len;
    d->hash = hash_key(key, len);
    size_t i = (size_t)d->hash & s->table_mask;
    while (table[i]) i = (i + 1) & s->table_mask;
    table[i] = (uint32_t)(s->nslots + 1);
    return s->nslots++;
}

void sf_spec_free(sf_spec *s) {
    if (!s) return;
    for (size_t i = 0; i < s->ncols; i++) {
        col_def *c = &s->cols[i];
        free(c->default_values);
        free(c->default_blob);
        free(c->index_slots);
        free(c->index_sizes);
    }
    for (size_t i = 0; i < s->nslots; i++) free(s->slots[i].key);
    free(s->cols);
    free(s->order);
    free(s->rest);
    free(s->slots);
    free(s->table);
    free(s->seq_table);
    free(s->seqcols);
    free(s);
}

size_t sf_spec_ncols(const sf_spec *s) { return s->ncols; }

sf_spec *sf_spec_new(const sf_colspec *cols, size_t ncols) {
    size_t max_slots = 0;
    for (size_t i = 0; i < ncols; i++) {
        if (cols[i].col == SF_COL_SPARSE && cols[i].nindex > ((size_t)1 << 20)) return NULL;
        max_slots += 1 + (cols[i].col == SF_COL_SPARSE ? cols[i].nindex : 0);
    }
    if (max_slots > ((size_t)1 << 24)) return NULL;
    sf_spec *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    size_t tsize = 16;
    while (tsize < 2 * max_slots + 2) tsize <<= 1;
    s->table_mask = tsize - 1;
    s->table = calloc(tsize, sizeof(uint32_t));
    s->seq_table = calloc(tsize, sizeof(uint32_t));
    s->seqcols = calloc(ncols ? ncols : 1, sizeof(size_t));
    s->slots = calloc(max_slots ? max_slots : 1, sizeof(slot_def));
    s->cols = calloc(ncols ? ncols : 1, sizeof(col_def));
    s->order = calloc(ncols ? ncols : 1, sizeof(size_t));
    s->rest = calloc(ncols ? ncols : 1, sizeof(size_t));
    if (!s->table || !s->seq_table || !s->seqcols || !s->slots || !s->cols || !s->order || !s->rest) goto fail;
    for (size_t i = 0; i < ncols; i++) {
        const sf_colspec *in = &cols[i];
        col_def *c = &s->cols[i];
        s->ncols = i + 1;
        c->col = in->col;
        c->kind = in->kind;
        if (c->kind < SF_KIND_BYTES || c->kind > SF_KIND_INT64) goto fail;
        int seq = in->col == SF_COL_SEQ_FIXED || in->col == SF_COL_SEQ_VAR;
        c->slot = add_slot(s, seq ? s->seq_table : s->table, in->key, in->key_len, max_slots);
        if (c->slot == SIZE_MAX - 1) goto fail;
        if (in->col == SF_COL_FIXED) {
            c->size = in->size;
            c->has_default = in->has_default;
            if (in->has_default) {
                size_t n = in->size;
                if (c->kind == SF_KIND_BYTES) {
                    size_t total = 0;
                    for (size_t k = 0; k < n; k++) total += in->default_bytes[k].n;
                    sf_bytes *vals = calloc(n ? n : 1, sizeof(sf_bytes));
                    c->default_blob = malloc(total ? total : 1);
                    c->default_values = vals;
                    if (!vals || !c->default_blob) goto fail;
                    size_t off = 0;
                    for (size_t k = 0; k < n; k++) {
                        memcpy(c->default_blob + off, in->default_bytes[k].p, in->default_bytes[k].n);
                        vals[k].p = c->default_blob + off;
                        vals[k].n = in->default_bytes[k].n;
                        off += in->default_bytes[k].n;
                    }
                } else {
                    size_t elem = c->kind == SF_KIND_INT64 ? 8 : 4;
                    if (n > SIZE_MAX / elem) goto fail;
                    c->default_values = malloc(n ? n * elem : 1);
                    if (!c->default_values) goto fail;
                    if (n) memcpy(c->default_values, in->default_values, n * elem);
                }
            }
        } else if (in->col == SF_COL_SPARSE) {
            c->nindex = in->nindex;
            c->index_slots = calloc(in->nindex ? in->nindex : 1, sizeof(size_t));
            c->index_sizes = calloc(in->nindex ? in->nindex : 1, sizeof(int64_t));
            if (!c->index_slots || !c->index_sizes) goto fail;
            for (size_t d = 0; d < in->nindex; d++) {
                c->index_slots[d] = add_slot(s, s->table, in->index_keys[d].p, in->index_keys[d].n, max_slots);
                if (c->index_slots[d] == SIZE_MAX - 1) goto fail;
                c->index_sizes[d] = in->index_sizes[d];
            }
        } else if (seq) {
            c->size = in->size;
            c->required = in->col == SF_COL_SEQ_FIXED && in->required;
            s->seqcols[s->nseq++] = i;
        } else if (in->col != SF_COL_VAR) {
            goto fail;
        }
    }
    for (size_t k = 0; k < s->nslots; k++) s->slots[k].eager_col = -1; /* a slot only index keys read has none */
    for (size_t i = 0; i < ncols; i++) {
        const col_def *c = &s->cols[i];
        if (c->col == SF_COL_SEQ_FIXED || c->col == SF_COL_SEQ_VAR) continue;
        if (c->slot < s->nslots) {
            s->slots[c->slot].uses++;
            s->slots[c->slot].eager_col = (long)i;
        }
        for (size_t dd = 0; dd < c->nindex; dd++)
            if (c->index_slots[dd] < s->nslots) s->slots[c->index_slots[dd]].uses++;
    }
    for (size_t k = 0; k < s->nslots; k++) {
        slot_def *d = &s->slots[k];
        if (d->uses != 1 || d->eager_col < 0 || s->cols[d->eager_col].col != SF_COL_FIXED) d->eager_col = -1;
        else s->neager++;
    }
    size_t no = 0;
    for (int pass = SF_COL_FIXED; pass <= SF_COL_SPARSE; pass++) {
        for (size_t i = 0; i < ncols; i++) {
            if (s->cols[i].col != pass) continue;
            s->order[no++] = i;
            const col_def *c = &s->cols[i];
            if (!(c->slot < s->nslots && s->slots[c->slot].eager_col == (long)i)) s->rest[s->nrest++] = i;
        }
    }
    return s;
fail:
    sf_spec_free(s);
    return NULL;
}

/* ------------------------------------------------------------------ growable vectors */

static int vec_reserve(sf_vec *v, size_t extra) {
    if (extra <= v->cap - v->len) return 0;
    if (extra > SIZE_MAX / 2 / v->elem - v->len) return -1;
    size_t need = v->len + extra;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < need) cap *= 2;
    if (cap > SIZE_MAX / v->elem) return -1;
    void *d = realloc(v->data, cap * v->elem);
    if (!d) return -1;
    v->data = d;
    v->cap = cap;
    return 0;
}

/* ------------------------------------------------------------------ wire primitives
 *
 * Every primitive returns its result by value ({value, next position}); next == 0 means
 * an error, already described in d->err (no valid read ends at position 0). Keeping
 * positions out of memory matters: the whole parse is one chain of dependent reads.
 */

#if defined(__GNUC__) || defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

typedef struct {
    const uint8_t *b; /* the record */
    sf_error *err;
    size_t len; /* the record's length (0: unknown, no entry templates) */
} dec;

typedef struct {
    uint64_t v;
    size_t next;
} rv;

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3), cold))
#endif
static NOINLINE size_t fail(dec *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    d->err->kind = SF_ERR_DECODE;
    vsnprintf(d->err->msg, sizeof(d->err->msg), fmt, ap);
    va_end(ap);
    return 0;
}

static const char *WT_NAMES[6] = {"varint", "fixed64", "length-delimited", "start-group", "end-group", "fixed32"};

static NOINLINE rv varint_slow(dec *d, size_t pos, size_t end) {
    const uint8_t *b = d->b;
    rv r = {0, 0};
    if (pos >= end) {
        fail(d, "truncated varint at byte %zu: message ends at byte %zu", pos, end);
        return r;
    }
    uint8_t c = b[pos];
    uint64_t v = c & 0x7f;
    unsigned shift = 7;
    size_t p = pos + 1;
    if (c >= 0x80) {
        for (;;) {
            if (p >= end) {
                fail(d, "truncated varint starting at byte %zu: message ends at byte %zu", pos, end);
                return r;
            }
            c = b[p++];
            v |= (uint64_t)(c & 0x7f) << shift; /* shift <= 63: bits past 64 drop */
            if (c < 0x80) break;
            shift += 7;
            if (shift >= 70) {
                fail(d, "varint longer than 10 bytes at byte %zu", pos);
                return r;
            }
        }
    }
    r.v = v;
    r.next = p;
    return r;
}

static inline rv rd_varint(dec *d, size_t pos, size_t end) {
    if (LIKELY(pos < end)) {
        uint8_t c = d->b[pos];
        if (LIKELY(c < 0x80)) return (rv){c, pos + 1};
    }
    return varint_slow(d, pos, end);
}

static NOINLINE rv tag_slow(dec *d, size_t pos, size_t end, int allow_field_zero) {
    rv r = varint_slow(d, pos, end);
    if (!r.next) return r;
    if (r.next - pos > 5 || r.v > 0xFFFFFFFFull) {
        r.next = fail(d, "bad tag at byte %zu: a tag must be a varint of at most 5 bytes that fits in 32 bits", pos);
        return r;
    }
    uint32_t field = (uint32_t)(r.v >> 3);
    int wt = (int)(r.v & 7);
    if (field == 0 && !allow_field_zero) r.next = fail(d, "bad tag at byte %zu: field number 0 is illegal", pos);
    else if (wt > 5) r.next = fail(d, "bad wire type %d for field %u at byte %zu", wt, field, pos);
    return r;
}

/* A tag at pos (< end): v = field << 3 | wire type. */
static inline rv rd_tag(dec *d, size_t pos, size_t end) {
    uint8_t c = d->b[pos];
    if (LIKELY(c < 0x80 && c >= 8 && (c & 7) <= 5)) return (rv){c, pos + 1};
    return tag_slow(d, pos, end, 0);
}

/* A tag inside a skipped group, where field number 0 is tolerated (upb and pure-Python
 * protobuf do, and so does the reference). */
static inline rv rd_tag_in_group(dec *d, size_t pos, size_t end) {
    uint8_t c = d->b[pos];
    if (LIKELY(c < 0x80 && (c & 7) <= 5)) return (rv){c, pos + 1};
    return tag_slow(d, pos, end, 1);
}

static NOINLINE rv len_slow(dec *d, size_t pos, size_t end) {
    rv r = varint_slow(d, pos, end);
    if (!r.next) return r;
    if (r.v > (uint64_t)(end - r.next) || r.v > SF_MAX_LENGTH)
        r.next = fail(d, "length %llu at byte %zu runs past the end of the message (%zu bytes left before byte %zu)",
                      (unsigned long long)r.v, pos, end - r.next, end);
    return r;
}

/* A length prefix at pos: v = the length, next = the payload start; payload fits in end. */
static inline rv rd_len(dec *d, size_t pos, size_t end) {
    if (LIKELY(pos < end)) {
        uint8_t c = d->b[pos];
        if (LIKELY(c < 0x80 && c <= end - pos - 1)) return (rv){c, pos + 1};
    }
    return len_slow(d, pos, end);
}

static NOINLINE size_t end_group_err(dec *d, uint32_t field, size_t tag_pos) {
    return fail(d, "unexpected end-group tag for field %u at byte %zu: no group is open", field, tag_pos);
}

static size_t skip_group(dec *d, size_t pos, size_t end, uint32_t field, int depth);

/* Skip the value of a field whose tag ended at pos; returns the next position or 0. */
static NOINLINE size_t skip_field(dec *d, size_t pos, size_t end, uint32_t field, int wt, int depth) {
    rv r;
    switch (wt) {
        case WT_VARINT:
            return rd_varint(d, pos, end).next;
        case WT_LEN:
            r = rd_len(d, pos, end);
            return r.next ? r.next + (size_t)r.v : 0;
        case WT_FIXED32:
        case WT_FIXED64: {
            size_t size = wt == WT_FIXED32 ? 4 : 8;
            if (end - pos < size)
                return fail(d, "truncated %s field %u at byte %zu: needs %zu bytes, %zu left", WT_NAMES[wt], field, pos,
                            size, end - pos);
            return pos + size;
        }
        case WT_SGROUP:
            return skip_group(d, pos, end, field, depth);
        case WT_EGROUP:
            return fail(d, "unexpected end-group tag for field %u at byte %zu: no group is open", field, pos - 1);
        default:
            return fail(d, "bad wire type %d for field %u near byte %zu", wt, field, pos);
    }
}

static size_t skip_group(dec *d, size_t pos, size_t end, uint32_t field, int depth) {
    uint32_t open[SF_MAX_DEPTH + 2];
    int nopen = 1;
    size_t start = pos;
    open[0] = field;
    if (depth - 1 < 0) return fail(d, "message nested deeper than %d levels at byte %zu", SF_MAX_DEPTH, pos);
    while (nopen) {
        if (pos >= end)
            return fail(d, "group (field %u) opened before byte %zu is never closed: message ends at byte %zu",
                        open[nopen - 1], start, end);
        size_t tag_pos = pos;
        rv t = rd_tag_in_group(d, pos, end);
        if (!t.next) return 0;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (wt == WT_EGROUP) {
            if (f != open[nopen - 1])
                return fail(d, "end-group tag for field %u at byte %zu does not match the open group (field %u)", f,
                            tag_pos, open[nopen - 1]);
            nopen--;
        } else if (wt == WT_SGROUP) {
            if (depth - 1 - nopen < 0 || nopen >= SF_MAX_DEPTH + 1)
                return fail(d, "message nested deeper than %d levels at byte %zu", SF_MAX_DEPTH, tag_pos);
            open[nopen++] = f;
        } else {
            pos = skip_field(d, pos, end, f, wt, 0);
            if (!pos) return 0;
        }
    }
    return pos;
}

/* wire.decode_packed_varints decodes payloads up to this size one varint at a time (and its
 * error messages then say "message ends"), longer ones vectorized ("packed field ends"). */
#define PACKED_SEQ_MAX 96

/* Validate packed varints in [start, stop) as wire.decode_packed_varints does; count them.
 * Returns the count, or SIZE_MAX on error. */
static size_t check_packed_varints(dec *d, size_t start, size_t stop) {
    const uint8_t *b = d->b;
    size_t n = stop - start;
    if (n == 0) return 0;
    if (b[stop - 1] < 0x80) {
        /* well-formed payloads (every varint ends, none longer than 10 bytes) are counted by
         * their last bytes; any other goes the exact way below, for the reference's error */
        size_t c = 0, run = 0, bad = 0;
        for (size_t i = start; i < stop; i++) {
            size_t cont = b[i] >> 7;
            c += cont ^ 1;
            run = cont ? run + 1 : 0;
            bad |= run >= 10;
        }
        if (!bad) return c;
    }
    if (n <= PACKED_SEQ_MAX) {
        size_t pos = start, count = 0;
        while (pos < stop) {
            rv r = rd_varint(d, pos, stop);
            if (!r.next) return SIZE_MAX;
            pos = r.next;
            count++;
        }
        return count;
    }
    if (b[stop - 1] >= 0x80) {
        size_t first = 0;
        for (size_t i = stop; i > start; i--) {
            if (b[i - 1] < 0x80) {
                first = i - start;
                break;
            }
        }
        fail(d, "truncated varint starting at byte %zu: packed field ends at byte %zu", start + first, stop);
        return SIZE_MAX;
    }
    size_t c = 0, run = 0;
    for (size_t i = start; i < stop; i++) {
        if (b[i] < 0x80) {
            c++;
            run = 0;
        } else if (++run >= 10) {
            /* at least 11 bytes (it is terminated: the last byte is < 0x80) */
            fail(d, "varint longer than 10 bytes at byte %zu", i + 1 - run);
            return SIZE_MAX;
        }
    }
    return c;
}

/* CPython's UTF-8 decoder's verdict: NULL if valid, else its error reason. */
static const char *utf8_error(const uint8_t *s, size_t n) {
    const uint8_t *end = s + n;
    while (s < end) {
        uint8_t c = *s;
        if (c < 0x80) {
            s++;
            continue;
        }
        if (c < 0xC2 || c > 0xF4) return "invalid start byte";
        size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F;
        else if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
        size_t have = (size_t)(end - s);
        if (have < 2) return "unexpected end of data";
        if (s[1] < lo || s[1] > hi) return "invalid continuation byte";
        for (size_t k = 2; k < need; k++) {
            if (have <= k) return "unexpected end of data";
            if (s[k] < 0x80 || s[k] > 0xBF) return "invalid continuation byte";
        }
        s += need;
    }
    return NULL;
}

/* ------------------------------------------------------------------ per-call state */

/* Where values are: a packed payload (or one bytes value), one varint, or one fixed32. */
#define CH_PACKED 0
#define CH_VARINT 1
#define CH_F32 2

typedef struct {
    size_t start, n;
    size_t type;
} chunk_t;

typedef struct {
    int kind;         /* the Feature's oneof kind so far */
    size_t count;     /* values in the current run of that kind */
    size_t run_chunk; /* the run's first chunk */
} feat_sum;

typedef struct {
    size_t gen; /* record index + 1 when the slot was set in the current record */
    feat_sum sum;
    size_t chunk_end;
    size_t done; /* == gen when its eager column's values are already written */
} slot_state;

/* One step of a feature list: a Feature, as a slot's is kept. */
typedef struct {
    feat_sum sum;
    size_t chunk_end;
} step_t;

/* A feature list of the spec in the current record: its last entry's steps. */
typedef struct {
    size_t gen; /* record index + 1 when set in the current record */
    size_t first, end;
} list_state;

#define PRED_MAX 1024

/* An entry's encoding up to its values, as fast_entry found it at one entry position of a
 * record: when the next record's entry at that position starts with the same bytes (tag,
 * length, key, Feature and list headers, the one value's header), it has the same structure,
 * key, kind and value count, so its values are taken from the same offset without parsing.
 * Only for entries of a key no column reads, or whose FixedLen column they fill exactly
 * with one value chunk (a bytes value, or a packed float/int64 payload). */
#define TMPL_MAX 64
#define TMPL_BYTES 32
typedef struct {
    uint64_t w[4], m[4]; /* the header's bytes (little-endian words) and their masks */
    uint32_t total;      /* the entry's bytes from its tag; 0: no template here */
    uint32_t vo, vn;     /* the values: offset from the tag, length */
    int32_t slot;        /* -1: a key no column reads */
    int32_t kind;
} tmpl_t;

typedef struct {
    const sf_spec *spec;
    slot_state *slots;
    list_state *lists; /* by slot, for the feature-list keys */
    chunk_t *chunks;
    size_t nchunks, chunk_cap;
    step_t *steps;
    size_t nsteps, step_cap;
    uint32_t pred[PRED_MAX]; /* slot + 1 seen at this entry position in the previous record */
    tmpl_t tmpl[TMPL_MAX];   /* the entry seen at this position in an earlier record */
    size_t entry_no;
    size_t gen;
    sf_colout *outs;   /* where eager columns write (NULL: validation only) */
    size_t done_count; /* eager columns written for the current record */
} state;

static void extract_run(const state *st, const uint8_t *b, const feat_sum *sum, size_t chunk_end, void *out);
static size_t kind_elem(int kind);
static inline uint32_t load_le32(const uint8_t *p);
static inline size_t decode_varints(const uint8_t *b, size_t a, size_t z, int64_t *out, size_t room);

/* An entry for `slot` is complete: it replaces any earlier entry with the same key (the
 * last one wins), and its FixedLen column is written now when it fits. */
static inline void entry_done(state *st, const uint8_t *b, long slot, const feat_sum *sum) {
    slot_state *ss = &st->slots[slot];
    int was_done = ss->done == st->gen;
    ss->gen = st->gen;
    ss->sum = *sum;
    ss->chunk_end = st->nchunks;
    long ec = st->spec->slots[slot].eager_col;
    if (ec >= 0 && st->outs) {
        const col_def *c = &st->spec->cols[ec];
        if (sum->kind == c->kind && sum->count == c->size) {
            extract_run(st, b, &ss->sum, ss->chunk_end,
                        (char *)st->outs[ec].fixed + (st->gen - 1) * c->size * kind_elem(c->kind));
            if (!was_done) st->done_count++;
            ss->done = st->gen;
            return;
        }
    }
    if (was_done) {
        st->done_count--;
        ss->done = 0;
    }
}

static NOINLINE int chunks_grow(state *st) {
    size_t cap = st->chunk_cap ? st->chunk_cap * 2 : 512;
    chunk_t *p = realloc(st->chunks, cap * sizeof(chunk_t));
    if (!p) return -1;
    st->chunks = p;
    st->chunk_cap = cap;
    return 0;
}

static inline int push_chunk(state *st, dec *d, size_t start, size_t n, size_t type) {
    if (UNLIKELY(st->nchunks == st->chunk_cap) && chunks_grow(st)) {
        d->err->kind = SF_ERR_NOMEM;
        return -1;
    }
    chunk_t *c = &st->chunks[st->nchunks++];
    c->start = start;
    c->n = n;
    c->type = type;
    return 0;
}

/* A list message [pos, end) of `kind`: validate, count into s->count, note its chunks. */
static int check_list(state *st, dec *d, size_t pos, size_t end, int kind, int depth, feat_sum *s) {
    while (pos < end) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t field = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (field == 1) {
            if (wt == WT_LEN) {
                rv l = rd_len(d, pos, end);
                if (!l.next) return -1;
                size_t a = l.next, n = (size_t)l.v;
                if (kind == SF_KIND_BYTES) {
                    s->count++;
                } else if (kind == SF_KIND_FLOAT) {
                    if (n % 4) {
                        fail(d, "packed float field at byte %zu has %zu bytes, not a multiple of 4", a, n);
                        return -1;
                    }
                    s->count += n / 4;
                } else {
                    size_t c = check_packed_varints(d, a, a + n);
                    if (c == SIZE_MAX) return -1;
                    s->count += c;
                }
                if (push_chunk(st, d, a, n, CH_PACKED)) return -1;
                pos = a + n;
                continue;
            }
            if (wt == WT_VARINT && kind == SF_KIND_INT64) {
                rv r = rd_varint(d, pos, end);
                if (!r.next) return -1;
                if (push_chunk(st, d, pos, r.next - pos, CH_VARINT)) return -1;
                s->count++;
                pos = r.next;
                continue;
            }
            if (wt == WT_FIXED32 && kind == SF_KIND_FLOAT) {
                if (end - pos < 4) {
                    fail(d, "truncated float at byte %zu: needs 4 bytes, %zu left", pos, end - pos);
                    return -1;
                }
                if (push_chunk(st, d, pos, 4, CH_F32)) return -1;
                s->count++;
                pos += 4;
                continue;
            }
        }
        if (wt == WT_EGROUP) return end_group_err(d, field, tag_pos), -1;
        pos = skip_field(d, pos, end, field, wt, depth);
        if (!pos) return -1;
    }
    return 0;
}

/* A Feature message [pos, end), merged into *s. */
static int check_feature(state *st, dec *d, size_t pos, size_t end, int depth, feat_sum *s) {
    while (pos < end) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t field = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (wt == WT_LEN && field >= 1 && field <= 3) {
            rv l = rd_len(d, pos, end);
            if (!l.next) return -1;
            if (s->kind != (int)field) { /* oneof: another kind replaces, the same kind merges */
                s->kind = (int)field;
                s->count = 0;
                s->run_chunk = st->nchunks;
            }
            if (check_list(st, d, l.next, l.next + (size_t)l.v, (int)field, depth - 1, s)) return -1;
            pos = l.next + (size_t)l.v;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, field, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, end, field, wt, depth);
            if (!pos) return -1;
        }
    }
    return 0;
}

static inline int key_eq(const uint8_t *a, const uint8_t *b, size_t n) {
    while (n >= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
        a += 8;
        b += 8;
        n -= 8;
    }
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

/* The key of the entry at this position in the previous record (the common case: every
 * record of a file holds the same keys in the same order) is tried first. `avail`: bytes
 * that may be read from `key` (at least len); with 8 or more, a key of up to 8 bytes is
 * compared as one masked word (slot keys are zero-padded by 8 bytes). */
static inline long lookup_key(state *st, const uint8_t *key, size_t len, size_t avail) {
    const sf_spec *s = st->spec;
    size_t e = st->entry_no;
    if (LIKELY(e < PRED_MAX) && st->pred[e]) {
        const slot_def *d = &s->slots[st->pred[e] - 1];
        if (d->key_len == len) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            if (len <= 8 && avail >= 8) {
                uint64_t x, y;
                memcpy(&x, key, 8);
                memcpy(&y, d->key, 8);
                uint64_t m = len == 8 ? ~0ull : (1ull << (8 * len)) - 1;
                if (((x ^ y) & m) == 0) return (long)(st->pred[e] - 1);
            } else
#endif
            if (key_eq(d->key, key, len)) {
                return (long)(st->pred[e] - 1);
            }
        }
    }
    long f = find_slot(s, key, len);
    if (e < PRED_MAX) st->pred[e] = f >= 0 ? (uint32_t)(f + 1) : 0;
    return f;
}

/* One map entry [pos, end) at depth budget `depth` (98 for Example). */
static int check_entry(state *st, dec *d, size_t pos, size_t end, int depth) {
    long slot = -1;
    int key_seen = 0;
    feat_sum sum = {SF_KIND_NONE, 0, 0};
    size_t first_chunk = st->nchunks;
    while (pos < end) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (wt == WT_LEN && (f == 1 || f == 2)) {
            rv l = rd_len(d, pos, end);
            if (!l.next) return -1;
            size_t a = l.next, b = l.next + (size_t)l.v;
            if (f == 1) {
                key_seen = 1;
                slot = lookup_key(st, d->b + a, b - a, b - a);
                if (slot < 0) {
                    const char *why = utf8_error(d->b + a, b - a);
                    if (why) return fail(d, "feature name at byte %zu is not valid UTF-8 (%s)", a, why), -1;
                }
            } else {
                if (check_feature(st, d, a, b, depth - 1, &sum)) return -1;
            }
            pos = b;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, end, f, wt, depth);
            if (!pos) return -1;
        }
    }
    if (!key_seen) slot = lookup_key(st, (const uint8_t *)"", 0, 0);
    st->entry_no++;
    if (slot < 0) {
        st->nchunks = first_chunk; /* not a spec feature: validated, then forgotten */
        return 0;
    }
    entry_done(st, d->b, slot, &sum);
    return 0;
}

/* A length varint of 1 or 2 bytes at p (< e), for the fast path; 0 when it is longer. */
static inline int short_len(const uint8_t *b, size_t p, size_t e, size_t *n, size_t *start) {
    uint8_t c = b[p];
    if (c < 0x80) {
        *n = c;
        *start = p + 1;
        return 1;
    }
    if (p + 1 >= e || b[p + 1] >= 0x80) return 0;
    *n = (size_t)(c & 0x7f) | ((size_t)b[p + 1] << 7);
    *start = p + 2;
    return 1;
}

/* An entry for `slot` whose values fast_entry already wrote to its eager column's row: as
 * entry_done, without chunks (a done entry's values are never read again). */
static inline void entry_direct(state *st, long slot, const feat_sum *sum) {
    slot_state *ss = &st->slots[slot];
    ss->gen = st->gen;
    ss->sum = *sum;
    ss->chunk_end = st->nchunks;
    if (ss->done != st->gen) {
        st->done_count++;
        ss->done = st->gen;
    }
}

/* The common encoding of an entry, handled without the generic loops: key field, then one
 * value field holding nothing or exactly one list (one packed chunk, or bytes values),
 * all with short lengths that fill their messages exactly. Returns 1 when handled, 0 to
 * fall back to check_entry (nothing changed but, at most, the row of the key's eager
 * column, which the record's own values, a default or an error replace later), -1 on an
 * error (the same first error the generic path finds: everything before it was checked to
 * be well formed). When the key has an eager FixedLen column (one column reads it) and the
 * values are of its kind and fill it exactly, they are written to the column's row here,
 * in the one pass over them (no chunks, no extract_run). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SF_TEMPLATES 1
/* Remember the entry [tpos, e) whose one value chunk is [vs, vs + vn) at its position. */
static inline void tmpl_learn(state *st, const dec *d, size_t tpos, size_t e, size_t vs, size_t vn, long slot,
                              int kind) {
    size_t no = st->entry_no;
    size_t hl = vs - tpos;
    if (no >= TMPL_MAX || hl > TMPL_BYTES || d->len < TMPL_BYTES || tpos > d->len - TMPL_BYTES) return;
    tmpl_t *t = &st->tmpl[no];
    for (int k = 0; k < 4; k++) {
        memcpy(&t->w[k], d->b + tpos + 8 * k, 8);
        size_t have = hl > 8u * k ? hl - 8u * k : 0;
        t->m[k] = have >= 8 ? ~0ull : (1ull << (8 * have)) - 1;
        t->w[k] &= t->m[k];
    }
    t->total = (uint32_t)(e - tpos);
    t->vo = (uint32_t)hl;
    t->vn = (uint32_t)vn;
    t->slot = (int32_t)slot;
    t->kind = kind;
}
#else
#define SF_TEMPLATES 0
#endif

static inline int fast_entry(state *st, dec *d, size_t tpos, size_t a, size_t e) {
    const uint8_t *b = d->b;
    size_t kn, ks, vn, vs;
    if (e - a < 4 || b[a] != 0x0A || !short_len(b, a + 1, e, &kn, &ks)) return 0;
    if (kn > e - ks || e - ks - kn < 2) return 0;
    size_t ke = ks + kn;
    if (b[ke] != 0x12 || !short_len(b, ke + 1, e, &vn, &vs) || vs > e || vn != e - vs) return 0;
    long slot = lookup_key(st, b + ks, kn, e - ks);
    const col_def *ec = NULL; /* the eager column the values may go straight to */
    void *dst = NULL;
    if (slot < 0) {
        const char *why = utf8_error(b + ks, kn);
        if (why) return fail(d, "feature name at byte %zu is not valid UTF-8 (%s)", ks, why), -1;
    } else if (st->outs) {
        long c = st->spec->slots[slot].eager_col;
        if (c >= 0) {
            ec = &st->spec->cols[c];
            dst = (char *)st->outs[c].fixed + (st->gen - 1) * ec->size * kind_elem(ec->kind);
        }
    }
    feat_sum sum = {SF_KIND_NONE, 0, 0};
    size_t first_chunk = st->nchunks;
    int direct = 0;
    if (vn) {
        uint8_t t = b[vs];
        size_t ln, ls;
        if ((t != 0x0A && t != 0x12 && t != 0x1A) || vn < 2 || !short_len(b, vs + 1, e, &ln, &ls) || ls > e ||
            ln != e - ls)
            return 0;
        int kind = t >> 3;
        sum.kind = kind;
        sum.run_chunk = first_chunk;
        direct = ec && ec->kind == kind;
        size_t p = ls;
        if (kind == SF_KIND_BYTES) {
            if (direct) {
                sf_bytes *o = dst;
                size_t room = ec->size;
                while (p < e) {
                    size_t n, s;
                    if (b[p] != 0x0A || p + 1 >= e || !short_len(b, p + 1, e, &n, &s) || s > e || n > e - s)
                        goto fallback;
                    if (sum.count < room) {
                        o[sum.count].p = b + s;
                        o[sum.count].n = n;
                    }
                    sum.count++;
                    p = s + n;
                }
                if (sum.count != room) goto fallback; /* the generic path keeps the values as chunks */
#if SF_TEMPLATES
                if (room == 1) tmpl_learn(st, d, tpos, e, (size_t)(o[0].p - b), o[0].n, slot, kind);
#endif
            } else {
                while (p < e) {
                    size_t n, s;
                    if (b[p] != 0x0A || p + 1 >= e || !short_len(b, p + 1, e, &n, &s) || s > e || n > e - s)
                        goto fallback;
                    if (push_chunk(st, d, s, n, CH_PACKED)) return -1;
                    sum.count++;
                    p = s + n;
                }
            }
        } else if (p < e) {
            size_t n, s;
            if (b[p] != 0x0A || p + 1 >= e || !short_len(b, p + 1, e, &n, &s) || s > e || n != e - s) goto fallback;
            if (kind == SF_KIND_FLOAT) {
                if (n % 4) return fail(d, "packed float field at byte %zu has %zu bytes, not a multiple of 4", s, n), -1;
                sum.count = n / 4;
                direct = direct && sum.count == ec->size;
                if (direct) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
                    for (size_t i = 0; i < sum.count; i++) {
                        uint32_t u = load_le32(b + s + 4 * i);
                        memcpy((float *)dst + i, &u, 4);
                    }
#else
                    memcpy(dst, b + s, n);
#endif
                }
            } else {
                size_t c = check_packed_varints(d, s, s + n);
                if (c == SIZE_MAX) return -1;
                sum.count = c;
                direct = direct && c == ec->size;
                if (direct) decode_varints(b, s, s + n, dst, c);
            }
            if (!direct && push_chunk(st, d, s, n, CH_PACKED)) return -1;
#if SF_TEMPLATES
            if (n && (direct || slot < 0)) tmpl_learn(st, d, tpos, e, s, n, slot, kind);
#endif
        } else {
            direct = direct && ec->size == 0; /* an empty list */
        }
    }
    st->entry_no++;
    if (slot < 0) {
        st->nchunks = first_chunk;
        return 1;
    }
    if (direct) entry_direct(st, slot, &sum);
    else entry_done(st, b, slot, &sum);
    return 1;
fallback:
    st->nchunks = first_chunk;
    return 0;
}

#if SF_TEMPLATES
/* The entry at pos by its position's template: 1 when taken (pos moved past it), 0 when it
 * does not match (nothing changed), -1 on an error (the one fast_entry would give). */
static inline int tmpl_entry(state *st, dec *d, size_t *at, size_t end) {
    size_t pos = *at, no = st->entry_no;
    if (no >= TMPL_MAX || d->len < TMPL_BYTES || pos > d->len - TMPL_BYTES) return 0;
    const tmpl_t *t = &st->tmpl[no];
    if (!t->total || t->total > end - pos) return 0;
    const uint8_t *b = d->b;
    uint64_t x[4];
    memcpy(x, b + pos, 32);
    if (((x[0] & t->m[0]) ^ t->w[0]) | ((x[1] & t->m[1]) ^ t->w[1]) | ((x[2] & t->m[2]) ^ t->w[2]) |
        ((x[3] & t->m[3]) ^ t->w[3]))
        return 0;
    size_t s = pos + t->vo, n = t->vn;
    feat_sum sum = {t->kind, 1, st->nchunks};
    if (t->kind == SF_KIND_INT64) {
        size_t c = check_packed_varints(d, s, s + n);
        if (c == SIZE_MAX) return -1;
        sum.count = c;
    } else if (t->kind == SF_KIND_FLOAT) {
        sum.count = n / 4;
    }
    if (t->slot >= 0) {
        long ci = st->spec->slots[t->slot].eager_col;
        const col_def *c = &st->spec->cols[ci];
        if (sum.count != c->size) return 0; /* int64 varints of other lengths: the general path */
        char *dst = (char *)st->outs[ci].fixed + (st->gen - 1) * c->size * kind_elem(c->kind);
        if (t->kind == SF_KIND_BYTES) {
            sf_bytes *o = (sf_bytes *)dst;
            o->p = b + s;
            o->n = n;
        } else if (t->kind == SF_KIND_FLOAT) {
            memcpy(dst, b + s, n);
        } else {
            decode_varints(b, s, s + n, (int64_t *)dst, sum.count);
        }
        entry_direct(st, t->slot, &sum);
    }
    st->entry_no++;
    *at = pos + t->total;
    return 1;
}
#endif

static int check_features(state *st, dec *d, size_t pos, size_t end, int depth) {
    while (pos < end) {
#if SF_TEMPLATES
        int tr = tmpl_entry(st, d, &pos, end);
        if (tr > 0) continue;
        if (tr < 0) return -1;
#endif
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (f == 1 && wt == WT_LEN) {
            rv l = rd_len(d, pos, end);
            if (!l.next) return -1;
            size_t a = l.next, e = l.next + (size_t)l.v;
            int r = fast_entry(st, d, tag_pos, a, e);
            if (r < 0 || (r == 0 && check_entry(st, d, a, e, depth - 1))) return -1;
            pos = e;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, end, f, wt, depth);
            if (!pos) return -1;
        }
    }
    return 0;
}

static int check_example(state *st, dec *d, size_t len) {
    size_t pos = 0;
    while (pos < len) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, len);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (f == 1 && wt == WT_LEN) {
            rv l = rd_len(d, pos, len);
            if (!l.next) return -1;
            if (check_features(st, d, l.next, l.next + (size_t)l.v, SF_MAX_DEPTH - 1)) return -1;
            pos = l.next + (size_t)l.v;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, len, f, wt, SF_MAX_DEPTH);
            if (!pos) return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ SequenceExample
 *
 * SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
 * FeatureLists { map<string, FeatureList> feature_list = 1; }  FeatureList { repeated Feature feature = 1; }
 * Depth budgets as the reference's: feature lists 99, entry 98, list 97, Feature 96.
 */

static NOINLINE int steps_grow(state *st) {
    size_t cap = st->step_cap ? st->step_cap * 2 : 256;
    step_t *p = realloc(st->steps, cap * sizeof(step_t));
    if (!p) return -1;
    st->steps = p;
    st->step_cap = cap;
    return 0;
}

/* A FeatureList [pos, end): every Feature is one step (pushed, whatever its key turns out to be). */
static int check_feature_list(state *st, dec *d, size_t pos, size_t end, int depth) {
    while (pos < end) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (f == 1 && wt == WT_LEN) {
            rv l = rd_len(d, pos, end);
            if (!l.next) return -1;
            feat_sum sum = {SF_KIND_NONE, 0, st->nchunks};
            if (check_feature(st, d, l.next, l.next + (size_t)l.v, depth - 1, &sum)) return -1;
            if (UNLIKELY(st->nsteps == st->step_cap) && steps_grow(st)) {
                d->err->kind = SF_ERR_NOMEM;
                return -1;
            }
            step_t *s = &st->steps[st->nsteps++];
            s->sum = sum;
            s->chunk_end = st->nchunks;
            pos = l.next + (size_t)l.v;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, end, f, wt, depth);
            if (!pos) return -1;
        }
    }
    return 0;
}

/* One FeatureLists map entry [pos, end). A value field twice appends to one list (a
 * repeated field merges); the entry's steps are kept only when its final key is wanted. */
static int check_list_entry(state *st, dec *d, size_t pos, size_t end, int depth) {
    long slot = -1;
    int key_seen = 0;
    size_t first_step = st->nsteps, first_chunk = st->nchunks;
    while (pos < end) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (wt == WT_LEN && (f == 1 || f == 2)) {
            rv l = rd_len(d, pos, end);
            if (!l.next) return -1;
            size_t a = l.next, b = l.next + (size_t)l.v;
            if (f == 1) {
                key_seen = 1;
                slot = find_in(st->spec, st->spec->seq_table, d->b + a, b - a);
                if (slot < 0) {
                    const char *why = utf8_error(d->b + a, b - a);
                    if (why) return fail(d, "feature name at byte %zu is not valid UTF-8 (%s)", a, why), -1;
                }
            } else if (check_feature_list(st, d, a, b, depth - 1)) {
                return -1;
            }
            pos = b;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, end, f, wt, depth);
            if (!pos) return -1;
        }
    }
    if (!key_seen) slot = find_in(st->spec, st->spec->seq_table, (const uint8_t *)"", 0);
    if (slot < 0) { /* validated, then forgotten */
        st->nsteps = first_step;
        st->nchunks = first_chunk;
        return 0;
    }
    list_state *q = &st->lists[slot]; /* a later entry with the same key replaces this one, whole */
    q->gen = st->gen;
    q->first = first_step;
    q->end = st->nsteps;
    return 0;
}

static int check_feature_lists(state *st, dec *d, size_t pos, size_t end, int depth) {
    while (pos < end) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, end);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (f == 1 && wt == WT_LEN) {
            rv l = rd_len(d, pos, end);
            if (!l.next) return -1;
            if (check_list_entry(st, d, l.next, l.next + (size_t)l.v, depth - 1)) return -1;
            pos = l.next + (size_t)l.v;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, end, f, wt, depth);
            if (!pos) return -1;
        }
    }
    return 0;
}

/* Context (field 1) as an Example's features, feature lists (field 2); each may repeat and
 * merges, in byte order, so the first error is the reference's. */
static int check_sequence_example(state *st, dec *d, size_t len) {
    size_t pos = 0;
    while (pos < len) {
        size_t tag_pos = pos;
        rv t = rd_tag(d, pos, len);
        if (!t.next) return -1;
        uint32_t f = (uint32_t)(t.v >> 3);
        int wt = (int)(t.v & 7);
        pos = t.next;
        if (wt == WT_LEN && (f == 1 || f == 2)) {
            rv l = rd_len(d, pos, len);
            if (!l.next) return -1;
            size_t a = l.next, e = l.next + (size_t)l.v;
            if (f == 1 ? check_features(st, d, a, e, SF_MAX_DEPTH - 1) : check_feature_lists(st, d, a, e, SF_MAX_DEPTH - 1))
                return -1;
            pos = e;
        } else if (wt == WT_EGROUP) {
            return end_group_err(d, f, tag_pos), -1;
        } else {
            pos = skip_field(d, pos, len, f, wt, SF_MAX_DEPTH);
            if (!pos) return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ value extraction */

static inline uint32_t quiet_nan(uint32_t bits) {
    /* an unpacked float goes through a Python float in the reference: NaNs come back quiet */
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) bits |= 0x00400000u;
    return bits;
}

static inline uint32_t load_le32(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    u = __builtin_bswap32(u);
#endif
    return u;
}

/* Decode validated varints in [a, z) into out; at most `room`. Returns how many. */
static inline size_t decode_varints(const uint8_t *b, size_t a, size_t z, int64_t *out, size_t room) {
    size_t w = 0;
    while (a < z && w < room) {
        uint8_t c = b[a++];
        uint64_t v = c & 0x7f;
        unsigned sh = 7;
        while ((c & 0x80) && a < z) {
            c = b[a++];
            if (sh < 64) v |= (uint64_t)(c & 0x7f) << sh;
            sh += 7;
        }
        out[w++] = (int64_t)v;
    }
    return w;
}

/* Copy the values of a Feature's last run (kind already checked) into out[0:count]. */
static void extract_run(const state *st, const uint8_t *b, const feat_sum *sum, size_t chunk_end, void *out) {
    size_t room = sum->count, w = 0;
    const chunk_t *ch = st->chunks + sum->run_chunk, *end = st->chunks + chunk_end;
    switch (sum->kind) {
        case SF_KIND_FLOAT: {
            float *o = out;
            for (; ch < end && w < room; ch++) {
                if (ch->type == CH_PACKED) {
                    size_t k = ch->n / 4;
                    if (k > room - w) k = room - w;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
                    for (size_t i = 0; i < k; i++) {
                        uint32_t u = load_le32(b + ch->start + 4 * i);
                        memcpy(o + w + i, &u, 4);
                    }
#else
                    if (k == 1) memcpy(o + w, b + ch->start, 4);
                    else memcpy(o + w, b + ch->start, k * 4);
#endif
                    w += k;
                } else {
                    uint32_t u = quiet_nan(load_le32(b + ch->start));
                    memcpy(o + w, &u, 4);
                    w++;
                }
            }
            break;
        }
        case SF_KIND_INT64: {
            int64_t *o = out;
            for (; ch < end && w < room; ch++) w += decode_varints(b, ch->start, ch->start + ch->n, o + w, room - w);
            break;
        }
        case SF_KIND_BYTES: {
            sf_bytes *o = out;
            for (; ch < end && w < room; ch++) {
                o[w].p = b + ch->start;
                o[w].n = ch->n;
                w++;
            }
            break;
        }
    }
}

static inline void extract_slot(const state *st, const uint8_t *b, const slot_state *ss, void *out) {
    extract_run(st, b, &ss->sum, ss->chunk_end, out);
}

/* ------------------------------------------------------------------ the batch */

static int perr(sf_error *err, int code, size_t rec, size_t col, int64_t a, int64_t b, int64_t c) {
    err->kind = SF_ERR_PARSE;
    err->code = code;
    err->record = rec;
    err->column = col;
    err->a = a;
    err->b = b;
    err->c = c;
    err->msg[0] = 0;
    return -1;
}

/* The slot's state in this record if it holds a kind, NULL if absent or kindless. */
static inline const slot_state *present(const state *st, size_t slot) {
    if (slot >= st->spec->nslots) return NULL;
    const slot_state *ss = &st->slots[slot];
    if (ss->gen != st->gen || ss->sum.kind == SF_KIND_NONE) return NULL;
    return ss;
}

static size_t kind_elem(int kind) {
    return kind == SF_KIND_BYTES ? sizeof(sf_bytes) : kind == SF_KIND_INT64 ? 8 : 4;
}

static int nomem(sf_error *err) {
    err->kind = SF_ERR_NOMEM;
    return -1;
}

static inline void begin_record(state *st, size_t i, sf_error *err) {
    st->gen = i + 1;
    st->nchunks = 0;
    st->nsteps = 0;
    st->entry_no = 0;
    st->done_count = 0;
    err->record = i;
}

/* The (context) columns of record i, after its entry pass: checked, then copied out. */
static int finish_record(state *st, const uint8_t *b, size_t i, sf_colout *outs, sf_error *err) {
    const sf_spec *spec = st->spec;
    /* FixedLen columns, then VarLen, then Sparse: the reference's order of checks. When
     * every eager column was written during the entry pass, only the others are left. */
    const size_t *order = spec->order;
    size_t ncheck = spec->ncols;
    if (st->done_count == spec->neager) {
        order = spec->rest;
        ncheck = spec->nrest;
    }
    for (size_t oi = 0; oi < ncheck; oi++) {
        size_t ci = order[oi];
        const col_def *c = &spec->cols[ci];
        sf_colout *o = &outs[ci];
        const slot_state *ss = present(st, c->slot);
        if (UNLIKELY(ss && ss->sum.kind != c->kind))
            return perr(err, SF_P_KIND, i, ci, c->col == SF_COL_SPARSE ? 1 : 0, ss->sum.kind, c->kind);
        if (c->col == SF_COL_FIXED) {
            size_t elem = kind_elem(c->kind);
            char *dst = (char *)o->fixed + i * c->size * elem;
            if (!ss) {
                if (!c->has_default) return perr(err, SF_P_MISSING, i, ci, 0, 0, 0);
                if (c->size) memcpy(dst, c->default_values, c->size * elem);
                continue;
            }
            if (UNLIKELY(ss->sum.count != c->size)) return perr(err, SF_P_COUNT, i, ci, (int64_t)ss->sum.count, 0, 0);
            if (ss->done != st->gen) extract_slot(st, b, ss, dst);
        } else if (c->col == SF_COL_VAR) {
            size_t cnt = ss ? ss->sum.count : 0;
            if (cnt) {
                if (vec_reserve(&o->values, cnt)) return nomem(err);
                extract_slot(st, b, ss, (char *)o->values.data + o->values.len * o->values.elem);
                o->values.len += cnt;
            }
            o->splits[i + 1] = (int64_t)o->values.len;
        } else {
            size_t cnt = ss ? ss->sum.count : 0;
            for (size_t dd = 0; dd < c->nindex; dd++) {
                const slot_state *xs = present(st, c->index_slots[dd]);
                if (xs && xs->sum.kind != SF_KIND_INT64)
                    return perr(err, SF_P_KIND, i, ci, 2 + (int64_t)dd, xs->sum.kind, SF_KIND_INT64);
                size_t xc = xs ? xs->sum.count : 0;
                if (xc != cnt) return perr(err, SF_P_SPARSE_LEN, i, ci, (int64_t)dd, (int64_t)xc, (int64_t)cnt);
                if (!xc) continue;
                sf_vec *v = &o->index[dd];
                if (vec_reserve(v, xc)) return nomem(err);
                int64_t *ix = (int64_t *)v->data + v->len;
                extract_slot(st, b, xs, ix);
                int64_t lo = ix[0], hi = ix[0];
                for (size_t k = 1; k < xc; k++) {
                    if (ix[k] < lo) lo = ix[k];
                    if (ix[k] > hi) hi = ix[k];
                }
                if (lo < 0 || hi >= c->index_sizes[dd])
                    return perr(err, SF_P_SPARSE_RANGE, i, ci, (int64_t)dd, lo < 0 ? lo : hi, 0);
                v->len += xc;
            }
            if (cnt) {
                if (vec_reserve(&o->values, cnt)) return nomem(err);
                extract_slot(st, b, ss, (char *)o->values.data + o->values.len * o->values.elem);
                o->values.len += cnt;
            }
            o->splits[i + 1] = (int64_t)o->values.len;
        }
    }
    return 0;
}

static int parse_record(state *st, const uint8_t *b, size_t len, size_t i, sf_colout *outs, sf_error *err) {
    dec d = {b, err, len};
    begin_record(st, i, err);
    if (check_example(st, &d, len)) return -1;
    return finish_record(st, b, i, outs, err);
}

/* Feature-list column ci of record i: every step checked (kind, and count for SEQ_FIXED)
 * in step order; with `collect`, its values and step ends appended to `o`. */
static int finish_list(state *st, const uint8_t *b, size_t i, size_t ci, sf_colout *o, int collect, sf_error *err) {
    const col_def *c = &st->spec->cols[ci];
    const list_state *q = c->slot < st->spec->nslots ? &st->lists[c->slot] : NULL;
    if (!q || q->gen != st->gen) {
        if (c->required) return perr(err, SF_P_SEQ_MISSING, i, ci, 0, 0, 0);
    } else {
        int fixed = c->col == SF_COL_SEQ_FIXED;
        for (size_t j = q->first; j < q->end; j++) {
            const step_t *s = &st->steps[j];
            if (s->sum.kind != SF_KIND_NONE && s->sum.kind != c->kind)
                return perr(err, SF_P_SEQ_KIND, i, ci, (int64_t)(j - q->first), s->sum.kind, c->kind);
            size_t cnt = s->sum.kind == SF_KIND_NONE ? 0 : s->sum.count;
            if (fixed && cnt != c->size) return perr(err, SF_P_SEQ_COUNT, i, ci, (int64_t)(j - q->first), (int64_t)cnt, 0);
            if (!collect) continue;
            if (cnt) {
                if (vec_reserve(&o->values, cnt)) return nomem(err);
                extract_run(st, b, &s->sum, s->chunk_end, (char *)o->values.data + o->values.len * o->values.elem);
                o->values.len += cnt;
            }
            if (vec_reserve(&o->steps, 1)) return nomem(err);
            ((int64_t *)o->steps.data)[o->steps.len++] = (int64_t)o->values.len;
        }
    }
    if (collect) o->splits[i + 1] = (int64_t)(o->steps.len - 1);
    return 0;
}

static state *state_new(const sf_spec *spec) {
    state *st = calloc(1, sizeof(state));
    if (!st) return NULL;
    st->spec = spec;
    st->slots = calloc(spec->nslots ? spec->nslots : 1, sizeof(slot_state));
    st->lists = calloc(spec->nslots ? spec->nslots : 1, sizeof(list_state));
    if (!st->slots || !st->lists) {
        free(st->slots);
        free(st->lists);
        free(st);
        return NULL;
    }
    return st;
}

static void state_free(state *st) {
    if (!st) return;
    free(st->chunks);
    free(st->steps);
    free(st->slots);
    free(st->lists);
    free(st);
}

/* Output set-up shared by both batch parsers; -1 when out of memory. */
static int outs_init(const sf_spec *spec, sf_colout *outs) {
    for (size_t ci = 0; ci < spec->ncols; ci++) {
        const col_def *c = &spec->cols[ci];
        sf_colout *o = &outs[ci];
        if (c->col == SF_COL_FIXED) continue;
        o->values.elem = kind_elem(c->kind);
        o->splits[0] = 0;
        if (c->col == SF_COL_SPARSE && c->nindex) {
            o->index = calloc(c->nindex, sizeof(sf_vec));
            if (!o->index) return -1;
            for (size_t dd = 0; dd < c->nindex; dd++) o->index[dd].elem = 8;
        }
        if (c->col == SF_COL_SEQ_FIXED || c->col == SF_COL_SEQ_VAR) {
            o->steps.elem = 8;
            if (vec_reserve(&o->steps, 1)) return -1;
            ((int64_t *)o->steps.data)[o->steps.len++] = 0;
        }
    }
    return 0;
}

int sf_parse_batch(const sf_spec *spec, const sf_bytes *records, size_t n, sf_colout *outs, sf_error *err) {
    int rc = 0;
    memset(err, 0, sizeof(*err));
    state *st = state_new(spec);
    if (!st) return nomem(err);
    st->outs = outs;
    if (outs_init(spec, outs)) {
        state_free(st);
        return nomem(err);
    }
    for (size_t i = 0; i < n; i++) {
        if (parse_record(st, records[i].p, records[i].n, i, outs, err)) {
            rc = -1;
            break;
        }
    }
    state_free(st);
    return rc;
}

void sf_out_free(const sf_spec *spec, sf_colout *outs) {
    for (size_t ci = 0; ci < spec->ncols; ci++) {
        sf_colout *o = &outs[ci];
        free(o->values.data);
        o->values.data = NULL;
        free(o->steps.data);
        o->steps.data = NULL;
        if (o->index) {
            for (size_t dd = 0; dd < spec->cols[ci].nindex; dd++) free(o->index[dd].data);
            free(o->index);
            o->index = NULL;
        }
    }
}

int sf_validate_example(const uint8_t *buf, size_t len, sf_error *err) {
    memset(err, 0, sizeof(*err));
    sf_spec *spec = sf_spec_new(NULL, 0);
    state *st = spec ? state_new(spec) : NULL;
    int rc;
    if (!st) {
        rc = nomem(err);
    } else {
        dec d = {buf, err, len};
        rc = check_example(st, &d, len);
    }
    state_free(st);
    sf_spec_free(spec);
    return rc;
}

int sf_parse_sequence_batch(const sf_spec *spec, const sf_bytes *records, size_t n, sf_colout *outs,
                            sf_error *err) {
    memset(err, 0, sizeof(*err));
    state *st = state_new(spec);
    if (!st) return nomem(err);
    st->outs = outs;
    if (outs_init(spec, outs)) {
        state_free(st);
        return nomem(err);
    }
    /* The reference decodes every record before it checks any against the spec, then
     * checks the context (record by record), then each feature list (column by column).
     * So after the first spec error the rest is still decoded, and only an error that the
     * reference would meet earlier replaces it: a decoding error anywhere, a context error
     * after a feature-list one, a feature-list error in an earlier column. */
    sf_error best, e;
    int have = 0; /* 0: none, 1: a context error, 2: a feature-list error in column seqcols[best_k] */
    size_t best_k = SIZE_MAX;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = records[i].p;
        dec d = {b, err, records[i].n};
        begin_record(st, i, err);
        if (check_sequence_example(st, &d, records[i].n)) {
            rc = -1;
            break;
        }
        if (have == 1) continue;
        memset(&e, 0, sizeof(e));
        if (finish_record(st, b, i, outs, &e)) {
            if (e.kind == SF_ERR_NOMEM) {
                *err = e;
                rc = -1;
                break;
            }
            best = e;
            have = 1;
            continue;
        }
        for (size_t k = 0; k < spec->nseq && k < best_k; k++) {
            size_t ci = spec->seqcols[k];
            if (finish_list(st, b, i, ci, &outs[ci], have == 0, &e)) {
                if (e.kind == SF_ERR_NOMEM) {
                    *err = e;
                    rc = -1;
                    goto out;
                }
                best = e;
                have = 2;
                best_k = k;
                break;
            }
        }
    }
out:
    if (!rc && have) {
        *err = best;
        rc = -1;
    }
    state_free(st);
    return rc;
}

int sf_validate_sequence_example(const uint8_t *buf, size_t len, sf_error *err) {
    memset(err, 0, sizeof(*err));
    sf_spec *spec = sf_spec_new(NULL, 0);
    state *st = spec ? state_new(spec) : NULL;
    int rc;
    if (!st) {
        rc = nomem(err);
    } else {
        dec d = {buf, err, len};
        rc = check_sequence_example(st, &d, len);
    }
    state_free(st);
    sf_spec_free(spec);
    return rc;
}

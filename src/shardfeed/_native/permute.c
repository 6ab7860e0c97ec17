/* The seeded permutation of pipeline/permute.py in C: see permute.h. SF_PERMUTE_NO_PYTHON
 * leaves the binding out (the fuzz harness links the C alone). */
#ifndef SF_PERMUTE_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
#include <stdint.h>
#include <string.h>

#include "permute.h"

static inline uint64_t mix(uint64_t x) { /* SplitMix64's finalizer */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Positions are walked LANES at a time, each lane an independent chain of rounds, so the
 * multiplies of one lane overlap the others' (one position's rounds are a serial chain of
 * about 12 cycles each; eight chains keep the multiplier busy): 3-4x the rate of one
 * position after another, the same values. A lane whose value lands past n walks again
 * in the next step; a lane done takes the next position. */
#define LANES 8

void sf_permute(uint64_t n, unsigned half, const uint64_t *keys, size_t rounds, const int64_t *positions,
                int64_t first, int64_t step, size_t count, int64_t *out) {
    uint64_t mask = (half >= 64) ? ~0ULL : ((1ULL << half) - 1);
    uint64_t left[LANES], right[LANES];
    size_t at[LANES];
    size_t next = 0, live = 0;
    for (size_t l = 0; l < LANES; l++) {
        at[l] = SIZE_MAX;
        left[l] = right[l] = 0;
        if (next < count) {
            uint64_t x = positions ? (uint64_t)positions[next] : (uint64_t)(first + (int64_t)next * step);
            left[l] = x >> half;
            right[l] = x & mask;
            at[l] = next++;
            live++;
        }
    }
    while (live) {
        for (size_t r = 0; r < rounds; r++) {
            uint64_t k = keys[r];
            for (size_t l = 0; l < LANES; l++) { /* idle lanes compute too: no branch in here */
                uint64_t t = left[l] ^ (mix(right[l] ^ k) & mask);
                left[l] = right[l];
                right[l] = t;
            }
        }
        for (size_t l = 0; l < LANES; l++) {
            if (at[l] == SIZE_MAX) continue;
            uint64_t y = (left[l] << half) | right[l];
            if (y < n) { /* cycle walking: a value past n goes round again, as it is */
                out[at[l]] = (int64_t)y;
                if (next < count) {
                    uint64_t x = positions ? (uint64_t)positions[next] : (uint64_t)(first + (int64_t)next * step);
                    y = x;
                    at[l] = next++;
                } else {
                    at[l] = SIZE_MAX;
                    live--;
                    continue;
                }
            }
            left[l] = y >> half;
            right[l] = y & mask;
        }
    }
}

#define PLAN_AHEAD 16

void sf_plan_window(const int64_t *ids, size_t count, const int64_t *offsets, const uint32_t *lengths32,
                    const int64_t *lengths64, const int64_t *before, size_t nfiles, const int64_t *first,
                    int64_t *files, int64_t *offs, int64_t *lens, int64_t *virt, int64_t *numbers) {
    int64_t at = 0;
    for (size_t i = 0; i < count; i++) {
        if (i + PLAN_AHEAD < count) { /* the ids are all over the index: its entries asked for ahead */
            int64_t ahead = ids[i + PLAN_AHEAD];
            __builtin_prefetch(offsets + ahead);
            __builtin_prefetch(lengths32 ? (const void *)(lengths32 + ahead) : (const void *)(lengths64 + ahead));
        }
        int64_t id = ids[i];
        size_t lo = 0, hi = nfiles; /* the last f < nfiles with before[f] <= id */
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (before[mid] <= id) lo = mid;
            else hi = mid;
        }
        int64_t len = lengths32 ? (int64_t)lengths32[id] : lengths64[id];
        files[i] = (int64_t)lo;
        offs[i] = offsets[id];
        lens[i] = len;
        virt[i] = at;
        at += len;
        numbers[i] = first[lo] >= 0 ? id - before[lo] + first[lo] : -1;
    }
}

#ifndef SF_PERMUTE_NO_PYTHON
PyObject *sf_py_plan_window(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b[10];
    memset(b, 0, sizeof b);
    PyObject *o[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO:plan_window", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9]))
        return NULL;
    PyObject *result = NULL;
    int got = 0;
    for (; got < 10; got++) {
        int flags = got >= 5 ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT : PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
        if (PyObject_GetBuffer(o[got], &b[got], flags) < 0) goto done;
    }
    size_t count = (size_t)b[0].len / 8, n_offsets = (size_t)b[1].len / 8;
    size_t isz = (size_t)b[2].itemsize, nfiles = (size_t)b[4].len / 8;
    int ok = b[0].itemsize == 8 && b[1].itemsize == 8 && (isz == 4 || isz == 8) && b[3].itemsize == 8 &&
             b[4].itemsize == 8 && (size_t)b[2].len / isz == n_offsets && (size_t)b[3].len / 8 == nfiles + 1 &&
             nfiles >= 1;
    for (int k = 5; k < 10 && ok; k++) ok = b[k].itemsize == 8 && (size_t)b[k].len / 8 == count;
    const int64_t *ids = b[0].buf, *before = b[3].buf;
    ok = ok && before[0] == 0 && (size_t)before[nfiles] == n_offsets;
    for (size_t f = 0; f < nfiles && ok; f++) ok = before[f] <= before[f + 1];
    for (size_t i = 0; i < count && ok; i++) ok = ids[i] >= 0 && (size_t)ids[i] < n_offsets;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "plan_window: ids (int64, each in [0, len(offsets))), offsets int64, "
                                          "lengths uint32/int64 as long, before int64 (0 .. len(offsets), one more "
                                          "than first), outputs int64 as long as ids");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    sf_plan_window(ids, count, b[1].buf, isz == 4 ? b[2].buf : NULL, isz == 8 ? b[2].buf : NULL, before, nfiles,
                   b[4].buf, b[5].buf, b[6].buf, b[7].buf, b[8].buf, b[9].buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return result;
}

PyObject *sf_py_permute(PyObject *self, PyObject *args) {
    Py_buffer out, keys, pos = {0};
    unsigned long long n;
    unsigned half;
    long long first, step;
    PyObject *positions = Py_None;
    if (!PyArg_ParseTuple(args, "w*KIy*LL|O", &out, &n, &half, &keys, &first, &step, &positions)) return NULL;
    PyObject *result = NULL;
    size_t count = (size_t)out.len / sizeof(int64_t);
    if (half < 1 || half > 32 || keys.len % sizeof(uint64_t) || out.len % sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "permute: half must be in [1, 32], keys uint64, out int64");
        goto done;
    }
    if (positions != Py_None) {
        if (PyObject_GetBuffer(positions, &pos, PyBUF_C_CONTIGUOUS) < 0) goto done;
        if ((size_t)pos.len != count * sizeof(int64_t)) {
            PyErr_SetString(PyExc_ValueError, "permute: positions (int64) must be as long as out");
            goto done;
        }
    }
    const int64_t *p = positions != Py_None ? (const int64_t *)pos.buf : NULL;
    /* a position outside [0, n), or n past the network's domain, would walk forever */
    int bad = half < 32 && n > (1ULL << (2 * half));
    if (p) {
        for (size_t i = 0; i < count && !bad; i++) bad = p[i] < 0 || (uint64_t)p[i] >= n;
    } else if (count) {
        long long last;
        bad = bad || step < 0 || first < 0 || (uint64_t)first >= n ||
              __builtin_mul_overflow((long long)(count - 1), step, &last) ||
              __builtin_add_overflow(first, last, &last) || (uint64_t)last >= n;
    }
    if (bad) {
        PyErr_Format(PyExc_IndexError, "permute: positions must be in [0, %llu) and n within 2**%u", n, 2 * half);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    sf_permute((uint64_t)n, half, (const uint64_t *)keys.buf, (size_t)keys.len / sizeof(uint64_t), p,
               (int64_t)first, (int64_t)step, count, (int64_t *)out.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    if (pos.obj) PyBuffer_Release(&pos);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&out);
    return result;
}
#endif

/* The seeded permutation of pipeline/permute.py in C: see permute.h. SF_PERMUTE_NO_PYTHON
 * leaves the binding out (the fuzz harness links the C alone). */
#ifndef SF_PERMUTE_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
#include <stdint.h>

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

#ifndef SF_PERMUTE_NO_PYTHON
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

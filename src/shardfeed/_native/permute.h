/* The seeded permutation of pipeline/permute.py, a window at a time: a balanced Feistel
 * network over 2 * half bits with SplitMix64 rounds, cycle-walked into [0, n). The same
 * (n, keys) give exactly the order of the Python reference, which stays the fallback. */
#ifndef SF_PERMUTE_H
#define SF_PERMUTE_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = p[positions[i]] (positions != NULL) or p[first + i * step], i < count. The
 * caller checks every position is in [0, n) and 1 <= half <= 32. Pure C: no GIL needed. */
void sf_permute(uint64_t n, unsigned half, const uint64_t *keys, size_t rounds, const int64_t *positions,
                int64_t first, int64_t step, size_t count, int64_t *out);

#ifdef Py_PYTHON_H
/* permute(out, n, half, keys, first, step, positions=None) -> None: the binding of
 * sf_permute (out: writable int64 buffer; keys: uint64 buffer; positions: int64 buffer of
 * out's length, or None for the range first, first + step, ...); runs without the GIL. */
PyObject *sf_py_permute(PyObject *self, PyObject *args);
#endif

#endif

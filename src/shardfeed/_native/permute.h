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

/* A global shuffle's window planned in one pass: for each record id (each in [0, before[nfiles])),
 * its file (the last f with before[f] <= id: files[i]), frame offset (offsets[id]), length
 * (lengths32 or lengths64 [id]), the virtual offset of its data in the window (the lengths before
 * it summed) and its number in its file (id - before[f] + first[f], or -1 where first[f] < 0).
 * The caller checks the ids. Pure C: no GIL needed. */
void sf_plan_window(const int64_t *ids, size_t count, const int64_t *offsets, const uint32_t *lengths32,
                    const int64_t *lengths64, const int64_t *before, size_t nfiles, const int64_t *first,
                    int64_t *files, int64_t *offs, int64_t *lens, int64_t *virt, int64_t *numbers);

#ifdef Py_PYTHON_H
/* plan_window(ids, offsets, lengths, before, first, files, offs, lens, virtual, numbers) -> None:
 * the binding of sf_plan_window (lengths uint32 or int64; the last five written, each as long as
 * ids); runs without the GIL. */
PyObject *sf_py_plan_window(PyObject *self, PyObject *args);

/* permute(out, n, half, keys, first, step, positions=None) -> None: the binding of
 * sf_permute (out: writable int64 buffer; keys: uint64 buffer; positions: int64 buffer of
 * out's length, or None for the range first, first + step, ...); runs without the GIL. */
PyObject *sf_py_permute(PyObject *self, PyObject *args);
#endif

#endif

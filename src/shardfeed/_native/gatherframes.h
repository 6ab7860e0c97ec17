/* A window of a global shuffle gathered into one frame buffer, each frame checked as it is
 * copied (plain C; the Python binding is in gatherframes.c unless SF_GATHER_NO_PYTHON).
 *
 * Frame k (a TFRecord frame: uint64 LE length | uint32 masked crc32c(length) | data |
 * uint32 masked crc32c(data)) lies in source srcs[which[k]] at byte src_off[k], len[k]
 * bytes long (data plus 16 bytes of framing), and goes to dst + dst_off[k]. */
#ifndef SHARDFEED_GATHERFRAMES_H
#define SHARDFEED_GATHERFRAMES_H

#include <stddef.h>
#include <stdint.h>

#define SF_GATHER_OK 0
#define SF_GATHER_LENGTH_CRC 1 /* the stored length's CRC does not match */
#define SF_GATHER_DATA_CRC 2   /* the data's CRC does not match */
#define SF_GATHER_MISMATCH 3   /* the stored length is not the one the index gives */
#define SF_GATHER_RANGE 4      /* the frame is not inside its source, or not inside dst */

/* Copy the n frames in the order `order` (a permutation of [0, n), say sorted by source and
 * offset for locality; NULL: 0 .. n-1), checking each: its range, its stored length against
 * len[k] - 16 and, when `verify`, both CRCs (the data's computed in the copy). Stops at the
 * first frame that fails (in the order copied): *bad is its index k and its SF_GATHER_* code
 * is returned; SF_GATHER_OK with *bad == n when every frame is good. Never reads or writes
 * outside the buffers given. */
int sf_gather_frames(const uint8_t *const *srcs, const size_t *src_lens, size_t nsrc, const int64_t *which,
                     const int64_t *src_off, const int64_t *len, const int64_t *dst_off, const int64_t *order,
                     size_t n, uint8_t *dst, size_t dst_len, int verify, size_t *bad);

#ifdef Py_PYTHON_H
/* gather_frames(size, dst_offsets, sources, which, src_offsets, lengths, order, verify) ->
 * (buffer, bad, code): the binding of sf_gather_frames, into a new (pooled when large) uint8
 * array of `size` bytes; runs without the GIL. */
PyObject *sf_py_gather_frames(PyObject *self, PyObject *args);
#endif

#endif

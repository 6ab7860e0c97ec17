/* The gather of a global shuffle's window: see gatherframes.h. SF_GATHER_NO_PYTHON leaves the
 * binding out (the fuzz harness links the C alone). */
#ifndef SF_GATHER_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bufpool.h"
#endif
#include <stdint.h>
#include <string.h>

#include "crc32c.h"
#include "gatherframes.h"

static inline uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = (v << 8) | p[b];
    return v;
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int one(const uint8_t *const *srcs, const size_t *src_lens, size_t nsrc, int64_t w, int64_t so, int64_t ln,
               int64_t d, uint8_t *dst, size_t dst_len, int verify) {
    if (w < 0 || (uint64_t)w >= nsrc || so < 0 || ln < 16 || d < 0) return SF_GATHER_RANGE;
    size_t size = src_lens[w];
    if ((uint64_t)ln > size || (uint64_t)so > size - (uint64_t)ln) return SF_GATHER_RANGE;
    if ((uint64_t)ln > dst_len || (uint64_t)d > dst_len - (uint64_t)ln) return SF_GATHER_RANGE;
    const uint8_t *s = srcs[w] + so;
    uint8_t *o = dst + d;
    size_t data = (size_t)ln - 16;
    if (le64(s) != (uint64_t)data) return SF_GATHER_MISMATCH;
    if (!verify) {
        memcpy(o, s, (size_t)ln);
        return SF_GATHER_OK;
    }
    if (sf_masked_crc32c(s, 8) != le32(s + 8)) return SF_GATHER_LENGTH_CRC;
    memcpy(o, s, 12);
    uint32_t crc = sf_crc32c_copy(0, o + 12, s + 12, data);
    memcpy(o + 12 + data, s + 12 + data, 4);
    return sf_crc_mask(crc) == le32(s + 12 + data) ? SF_GATHER_OK : SF_GATHER_DATA_CRC;
}

#define PREFETCH_HEADERS 8     /* frames ahead whose first line is asked for */
#define PREFETCH_BYTES 2048    /* of the next frame, the bytes asked for */

static inline void prefetch(const uint8_t *const *srcs, const size_t *src_lens, size_t nsrc, const int64_t *which,
                            const int64_t *src_off, const int64_t *len, size_t k, int64_t upto) {
    int64_t w = which[k], so = src_off[k], ln = len[k] < upto ? len[k] : upto;
    if (w < 0 || (uint64_t)w >= nsrc || so < 0 || ln < 1 || (uint64_t)so >= src_lens[w] ||
        (uint64_t)ln > src_lens[w] - (uint64_t)so)
        return; /* the copy reports it */
    for (int64_t b = 0; b < ln; b += 64) __builtin_prefetch(srcs[w] + so + b, 0, 0);
}

int sf_gather_frames(const uint8_t *const *srcs, const size_t *src_lens, size_t nsrc, const int64_t *which,
                     const int64_t *src_off, const int64_t *len, const int64_t *dst_off, const int64_t *order,
                     size_t n, uint8_t *dst, size_t dst_len, int verify, size_t *bad) {
    if (order)
        for (size_t i = 0; i < n; i++)
            if (order[i] < 0 || (uint64_t)order[i] >= n) {
                *bad = i;
                return SF_GATHER_RANGE;
            }
    for (size_t i = 0; i < n; i++) {
        size_t k = order ? (size_t)order[i] : i;
        /* the frames are far apart (a random read): ask for the ones copied next now, so their
         * cache and TLB misses overlap this copy instead of following it */
        if (PREFETCH_HEADERS && i + PREFETCH_HEADERS < n) prefetch(srcs, src_lens, nsrc, which, src_off, len,
                                               order ? (size_t)order[i + PREFETCH_HEADERS] : i + PREFETCH_HEADERS, 64);
        if (PREFETCH_HEADERS && i + 1 < n) prefetch(srcs, src_lens, nsrc, which, src_off, len, order ? (size_t)order[i + 1] : i + 1,
                                PREFETCH_BYTES);
        int rc = one(srcs, src_lens, nsrc, which[k], src_off[k], len[k], dst_off[k], dst, dst_len, verify);
        if (rc != SF_GATHER_OK) {
            *bad = k;
            return rc;
        }
    }
    *bad = n;
    return SF_GATHER_OK;
}

#ifndef SF_GATHER_NO_PYTHON
#define MAX_SOURCES 4096

/* gather_frames(size, dst_offsets, sources, which, src_offsets, lengths, order, verify) ->
 * (buffer, bad, code): a new uint8 array of `size` bytes (pooled when large) holding the
 * frames (gatherframes.h), the index of the first bad frame (n when none) and its code. The
 * offsets, lengths and which: int64 buffers of n items; order: one too, or None. */
PyObject *sf_py_gather_frames(PyObject *self, PyObject *args) {
    Py_ssize_t size;
    Py_buffer doff, wh, soff, lens, ord = {0};
    PyObject *sources, *order_obj;
    int verify;
    if (!PyArg_ParseTuple(args, "ny*O!y*y*y*Op:gather_frames", &size, &doff, &PyTuple_Type, &sources, &wh, &soff,
                          &lens, &order_obj, &verify))
        return NULL;
    PyObject *result = NULL, *arr = NULL;
    Py_buffer out = {0};
    Py_ssize_t nsrc = PyTuple_GET_SIZE(sources), held = 0;
    Py_buffer *views = PyMem_Calloc(nsrc ? (size_t)nsrc : 1, sizeof(Py_buffer));
    const uint8_t **ptrs = PyMem_Calloc(nsrc ? (size_t)nsrc : 1, sizeof(uint8_t *));
    size_t *sizes = PyMem_Calloc(nsrc ? (size_t)nsrc : 1, sizeof(size_t));
    Py_ssize_t n = lens.len / (Py_ssize_t)sizeof(int64_t);
    if (!views || !ptrs || !sizes) {
        PyErr_NoMemory();
        goto done;
    }
    if (size < 0 || nsrc > MAX_SOURCES || lens.len % (Py_ssize_t)sizeof(int64_t) || doff.len != lens.len ||
        wh.len != lens.len || soff.len != lens.len) {
        PyErr_SetString(PyExc_ValueError, "gather_frames: size >= 0, at most 4096 sources, and offsets, which and "
                                          "lengths int64 arrays of one length");
        goto done;
    }
    if (order_obj != Py_None) {
        if (PyObject_GetBuffer(order_obj, &ord, PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (ord.len != lens.len) {
            PyErr_SetString(PyExc_ValueError, "gather_frames: order (int64) must be as long as lengths");
            goto done;
        }
    }
    for (; held < nsrc; held++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(sources, held), &views[held], PyBUF_SIMPLE) < 0) goto done;
        ptrs[held] = views[held].buf;
        sizes[held] = (size_t)views[held].len;
    }
    arr = sf_pool_array((size_t)size);
    if (!arr || PyObject_GetBuffer(arr, &out, PyBUF_WRITABLE) < 0) goto done;
    size_t bad = 0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = sf_gather_frames(ptrs, sizes, (size_t)nsrc, wh.buf, soff.buf, lens.buf, doff.buf,
                            ord.obj ? ord.buf : NULL, (size_t)n, out.buf, (size_t)out.len, verify, &bad);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("Oni", arr, (Py_ssize_t)bad, code);
done:
    if (out.obj) PyBuffer_Release(&out);
    Py_XDECREF(arr);
    for (Py_ssize_t k = 0; k < held; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(ptrs);
    PyMem_Free(sizes);
    if (ord.obj) PyBuffer_Release(&ord);
    PyBuffer_Release(&doff);
    PyBuffer_Release(&wh);
    PyBuffer_Release(&soff);
    PyBuffer_Release(&lens);
    return result;
}
#endif

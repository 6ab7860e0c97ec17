/* shardfeed._native: Python bindings of the native core (CRC-32C, framing scan, Example
 * and SequenceExample batch parsing). The work itself is plain C (crc32c.c, frames.c, example_parse.c) and
 * runs with the GIL released. The friendly API, argument checks and error messages live
 * in shardfeed/formats/native.py; this module is private.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifndef _WIN32
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#endif

#define PY_ARRAY_UNIQUE_SYMBOL shardfeed_native_ARRAY_API
#include <numpy/arrayobject.h>

#include "bufpool.h"
#include "crc32c.h"
#include "crcfuse.h"
#include "example_encode.h"
#include "example_parse.h"
#include "frames.h"
#include "gatherframes.h"
#include "imgcheck.h"
#include "imgrows.h"
#include "packbytes.h"
#include "permute.h"
#include "indextext.h"
#include "mapfile.h"
#include "resample.h"

#define GIL_FREE_BYTES 16384 /* below this, releasing the GIL costs more than it saves */

/* ------------------------------------------------------------------ CRC */

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned long long value = 0;
    if (!PyArg_ParseTuple(args, "y*|K:crc32c", &view, &value)) return NULL;
    if (value > 0xFFFFFFFFull) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "crc32c: value must be a CRC in 0 .. 2**32-1");
        return NULL;
    }
    uint32_t crc;
    if (view.len >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS crc = sf_crc32c_extend((uint32_t)value, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = sf_crc32c_extend((uint32_t)value, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *py_masked_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc;
    if (view.len >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS crc = sf_masked_crc32c(view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = sf_masked_crc32c(view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* frame_records(records, pooled=False) -> bytes: every record framed as TFRecord writes it
 * (8-byte little-endian length, its masked CRC, the data, the data's masked CRC), one after
 * the other. A record is a bytes-like object or a list/tuple of them (its pieces, joined here:
 * each byte is copied once, into the output, and checksummed in the same pass). pooled: the
 * output is a uint8 array from the recycled buffer pool (bufpool.h) instead of bytes, so a
 * writer handed chunk after chunk of megabytes copies into pages already mapped. */
static void frame_release(Py_buffer *views, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
}

static PyObject *py_frame_records(PyObject *self, PyObject *args) {
    PyObject *arg;
    int pooled = 0;
    if (!PyArg_ParseTuple(args, "O|p:frame_records", &arg, &pooled)) return NULL;
    PyObject *seq = PySequence_Fast(arg, "frame_records: records must be a list or tuple");
    if (seq == NULL) return NULL;
    Py_ssize_t nrec = PySequence_Fast_GET_SIZE(seq);
    PyObject **recs = PySequence_Fast_ITEMS(seq);
    Py_ssize_t nparts = 0;
    for (Py_ssize_t r = 0; r < nrec; r++)
        nparts += (PyList_Check(recs[r]) || PyTuple_Check(recs[r])) ? PySequence_Fast_GET_SIZE(recs[r]) : 1;
    /* per record: its first view and its view count, then the views */
    Py_ssize_t *first = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * nrec + 1));
    Py_buffer *views = PyMem_Malloc(sizeof(Py_buffer) * (size_t)(nparts ? nparts : 1));
    if (first == NULL || views == NULL) {
        PyMem_Free(first);
        PyMem_Free(views);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t nv = 0;
    size_t total = 0;
    for (Py_ssize_t r = 0; r < nrec; r++) {
        PyObject *rec = recs[r];
        int multi = PyList_Check(rec) || PyTuple_Check(rec);
        Py_ssize_t k = multi ? PySequence_Fast_GET_SIZE(rec) : 1;
        first[2 * r] = nv;
        first[2 * r + 1] = k;
        size_t len = 0;
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *part = multi ? PySequence_Fast_GET_ITEM(rec, j) : rec;
            if (PyObject_GetBuffer(part, &views[nv], PyBUF_SIMPLE) < 0) {
                PyErr_Format(PyExc_TypeError, "frame_records: record %zd, piece %zd is not bytes-like (%.80s)", r, j,
                             Py_TYPE(part)->tp_name);
                frame_release(views, nv);
                PyMem_Free(first);
                Py_DECREF(seq);
                return NULL;
            }
            len += (size_t)views[nv].len;
            nv++;
        }
        total += len + 16;
    }
    PyObject *out = NULL;
    if (total <= (size_t)PY_SSIZE_T_MAX)
        out = pooled ? sf_pool_array(total) : PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        frame_release(views, nv);
        PyMem_Free(first);
        Py_DECREF(seq);
        return NULL;
    }
    uint8_t *dst = pooled ? (uint8_t *)PyArray_DATA((PyArrayObject *)out) : (uint8_t *)PyBytes_AS_STRING(out);
    PyThreadState *ts = total >= GIL_FREE_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < nrec; r++) {
        Py_buffer *v = views + first[2 * r];
        Py_ssize_t k = first[2 * r + 1];
        uint64_t len = 0;
        for (Py_ssize_t j = 0; j < k; j++) len += (uint64_t)v[j].len;
        for (int b = 0; b < 8; b++) dst[b] = (uint8_t)(len >> (8 * b));
        uint32_t lc = sf_masked_crc32c(dst, 8);
        for (int b = 0; b < 4; b++) dst[8 + b] = (uint8_t)(lc >> (8 * b));
        dst += 12;
        uint32_t crc = 0;
        for (Py_ssize_t j = 0; j < k; j++) {
            crc = sf_crc32c_copy(crc, dst, (const uint8_t *)v[j].buf, (size_t)v[j].len);
            dst += v[j].len;
        }
        crc = sf_crc_mask(crc);
        for (int b = 0; b < 4; b++) dst[b] = (uint8_t)(crc >> (8 * b));
        dst += 4;
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    frame_release(views, nv);
    PyMem_Free(first);
    Py_DECREF(seq);
    return out;
}

static PyObject *py_crc_backend(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(sf_crc32c_backend());
}

/* ------------------------------------------------------------------ framing scan */

/* scan_frames(buf, verify, max_rec, defer) -> (offsets, lengths, consumed, error, error_offset)
 * and, with defer (and verify), a sixth item: each frame's stored masked data CRC (uint32),
 * its data CRC left unchecked for the batch parser (parse_batch's crcs). */
/* first_lost(buffer, offsets, lengths, every=False) -> int: the first record buffer[offsets[k] :
 * offsets[k] + lengths[k]] with a byte past where its map stopped being its file's (the file
 * truncated while mapped: map_file's guard), or -1; -1 at once while no map alive has lost
 * its file. every=True: an int64 array of every such record instead (empty:
 * none). Call it after the records' bytes were read. */
static PyObject *py_first_lost(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *offsets_obj, *lengths_obj;
    int every = 0;
    if (!PyArg_ParseTuple(args, "OOO|p:first_lost", &buf_obj, &offsets_obj, &lengths_obj, &every)) return NULL;
    if (!sf_guard_any_lost()) {
        if (!every) return PyLong_FromLong(-1);
        npy_intp zero = 0;
        return PyArray_SimpleNew(1, &zero, NPY_INT64);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyArrayObject *offs = (PyArrayObject *)PyArray_FROMANY(offsets_obj, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY);
    PyArrayObject *lens = offs ? (PyArrayObject *)PyArray_FROMANY(lengths_obj, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY) : NULL;
    PyObject *result = NULL;
    if (offs && lens) {
        npy_intp n = PyArray_SIZE(offs) < PyArray_SIZE(lens) ? PyArray_SIZE(offs) : PyArray_SIZE(lens);
        const int64_t *o = PyArray_DATA(offs), *l = PyArray_DATA(lens);
        sf_bytes *recs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(sf_bytes));
        if (!recs) {
            PyErr_NoMemory();
        } else {
            npy_intp k = 0;
            for (; k < n; k++) {
                if (o[k] < 0 || l[k] < 0 || o[k] > view.len || l[k] > view.len - o[k]) break;
                recs[k].p = (const uint8_t *)view.buf + o[k];
                recs[k].n = (size_t)l[k];
            }
            uint8_t *flags = every ? PyMem_Calloc((size_t)(n ? n : 1), 1) : NULL;
            if (k < n) {
                PyErr_Format(PyExc_IndexError, "first_lost: record %zd lies outside the buffer", (Py_ssize_t)k);
            } else if (every && !flags) {
                PyErr_NoMemory();
            } else if (!every) {
                size_t first = sf_guard_first_lost(recs, (size_t)n);
                result = PyLong_FromSsize_t(first < (size_t)n ? (Py_ssize_t)first : -1);
            } else {
                sf_guard_lost(recs, (size_t)n, flags);
                npy_intp count = 0;
                for (npy_intp i = 0; i < n; i++) count += flags[i];
                result = PyArray_SimpleNew(1, &count, NPY_INT64);
                if (result) {
                    int64_t *out = PyArray_DATA((PyArrayObject *)result);
                    for (npy_intp i = 0; i < n; i++)
                        if (flags[i]) *out++ = i;
                }
            }
            PyMem_Free(flags);
            PyMem_Free(recs);
        }
    }
    Py_XDECREF(offs);
    Py_XDECREF(lens);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *py_scan_frames(PyObject *self, PyObject *args) {
    Py_buffer view;
    int verify = 1, defer = 0;
    unsigned long long max_rec = 0x7FFFFFFFull;
    if (!PyArg_ParseTuple(args, "y*|pKp:scan_frames", &view, &verify, &max_rec, &defer)) return NULL;
    defer = defer && verify;
    const uint8_t *buf = view.buf;
    size_t len = (size_t)view.len;
    /* every frame is at least 16 bytes: this bounds the output by the buffer size */
    size_t max_frames = len / 16;
    size_t cap = max_frames < 4096 ? max_frames : 4096;
    int64_t *off = NULL, *lens = NULL;
    uint32_t *crcs = NULL;
    size_t count = 0, pos = 0;
    int error = 0, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        if (count == cap && cap < max_frames) {
            size_t ncap = cap * 2 < max_frames ? cap * 2 : max_frames;
            int64_t *o2 = realloc(off, (ncap ? ncap : 1) * sizeof(int64_t));
            if (o2) off = o2;
            int64_t *l2 = o2 ? realloc(lens, (ncap ? ncap : 1) * sizeof(int64_t)) : NULL;
            if (l2) lens = l2;
            uint32_t *c2 = l2 && defer ? realloc(crcs, (ncap ? ncap : 1) * sizeof(uint32_t)) : NULL;
            if (c2) crcs = c2;
            if (!o2 || !l2 || (defer && !c2)) {
                nomem = 1;
                break;
            }
            cap = ncap;
        }
        if (!off) {
            off = malloc(sizeof(int64_t) * (cap ? cap : 1));
            lens = malloc(sizeof(int64_t) * (cap ? cap : 1));
            crcs = defer ? malloc(sizeof(uint32_t) * (cap ? cap : 1)) : NULL;
            if (!off || !lens || (defer && !crcs)) {
                nomem = 1;
                break;
            }
        }
        sf_scan_result r;
        sf_scan_frames(buf + pos, len - pos, verify, max_rec, off + count, lens + count, crcs ? crcs + count : NULL,
                       cap - count, &r);
        for (size_t k = 0; k < r.count; k++) off[count + k] += (int64_t)pos;
        count += r.count;
        pos += r.consumed;
        if (r.error) {
            error = r.error;
            break;
        }
        if (count < cap || cap >= max_frames) break; /* incomplete frame, or the end */
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (nomem) {
        free(off);
        free(lens);
        free(crcs);
        return PyErr_NoMemory();
    }
    npy_intp dims[1] = {(npy_intp)count};
    PyObject *po = PyArray_SimpleNew(1, dims, NPY_INT64);
    PyObject *pl = PyArray_SimpleNew(1, dims, NPY_INT64);
    PyObject *pc = defer ? PyArray_SimpleNew(1, dims, NPY_UINT32) : NULL;
    if (!po || !pl || (defer && !pc)) {
        Py_XDECREF(po);
        Py_XDECREF(pl);
        Py_XDECREF(pc);
        free(off);
        free(lens);
        free(crcs);
        return NULL;
    }
    if (count) {
        memcpy(PyArray_DATA((PyArrayObject *)po), off, count * sizeof(int64_t));
        memcpy(PyArray_DATA((PyArrayObject *)pl), lens, count * sizeof(int64_t));
        if (pc) memcpy(PyArray_DATA((PyArrayObject *)pc), crcs, count * sizeof(uint32_t));
    }
    free(off);
    free(lens);
    free(crcs);
    if (pc) return Py_BuildValue("NNninN", po, pl, (Py_ssize_t)pos, error, (Py_ssize_t)pos, pc);
    return Py_BuildValue("NNnin", po, pl, (Py_ssize_t)pos, error, (Py_ssize_t)pos);
}

/* ------------------------------------------------------------------ compiled spec */

typedef struct {
    PyObject_HEAD
    sf_spec *spec;
    PyObject *columns; /* the tuple it was built from */
} CompiledSpecObject;

static void cs_dealloc(CompiledSpecObject *self) {
    sf_spec_free(self->spec);
    Py_XDECREF(self->columns);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* key: bytes, or None for a key no record can hold */
static int get_key(PyObject *o, const uint8_t **p, size_t *n) {
    if (o == Py_None) {
        *p = (const uint8_t *)"";
        *n = SIZE_MAX;
        return 0;
    }
    if (!PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "CompiledSpec: keys must be bytes or None");
        return -1;
    }
    *p = (const uint8_t *)PyBytes_AS_STRING(o);
    *n = (size_t)PyBytes_GET_SIZE(o);
    return 0;
}

/* columns: sequence of (col, kind, key, size, default, index_keys, index_sizes) with
 * default None, a contiguous int64/float32 array of `size` values, or a list of bytes;
 * for a SEQ_FIXED column `default` says whether the feature list is required (a bool). */
static int cs_init(CompiledSpecObject *self, PyObject *args, PyObject *kwds) {
    PyObject *cols;
    if (!PyArg_ParseTuple(args, "O:CompiledSpec", &cols)) return -1;
    if (self->spec) { /* batches being parsed (a ParsePool's) read it: never replaced */
        PyErr_SetString(PyExc_RuntimeError, "CompiledSpec is already initialised");
        return -1;
    }
    PyObject *tup = PySequence_Tuple(cols);
    if (!tup) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(tup);
    sf_colspec *cs = PyMem_Calloc(n ? n : 1, sizeof(sf_colspec));
    PyObject *keep = PyList_New(0); /* temporaries alive until sf_spec_new copied them */
    int rc = -1;
    if (!cs || !keep) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(tup, i);
        int col, kind;
        PyObject *key, *dflt, *ikeys, *isizes;
        Py_ssize_t size;
        if (!PyArg_ParseTuple(t, "iiOnOOO", &col, &kind, &key, &size, &dflt, &ikeys, &isizes)) goto done;
        sf_colspec *c = &cs[i];
        c->col = col;
        c->kind = kind;
        if (size < 0) {
            PyErr_SetString(PyExc_ValueError, "CompiledSpec: negative size");
            goto done;
        }
        c->size = (size_t)size;
        if (get_key(key, &c->key, &c->key_len)) goto done;
        if (col == SF_COL_SEQ_FIXED) {
            c->required = PyObject_IsTrue(dflt);
            if (c->required < 0) goto done;
        }
        if (col == SF_COL_FIXED && dflt != Py_None) {
            c->has_default = 1;
            if (kind == SF_KIND_BYTES) {
                PyObject *seq = PySequence_Fast(dflt, "CompiledSpec: bytes default must be a sequence");
                if (!seq || PyList_Append(keep, seq) < 0) {
                    Py_XDECREF(seq);
                    goto done;
                }
                Py_DECREF(seq);
                if (PySequence_Fast_GET_SIZE(seq) != size) {
                    PyErr_SetString(PyExc_ValueError, "CompiledSpec: default has the wrong number of values");
                    goto done;
                }
                sf_bytes *vals = PyMem_Calloc(size ? size : 1, sizeof(sf_bytes));
                PyObject *cap = vals ? PyCapsule_New(vals, NULL, NULL) : NULL;
                if (!cap) {
                    PyMem_Free(vals);
                    goto done;
                }
                /* the capsule has no destructor: free `vals` after sf_spec_new below */
                if (PyList_Append(keep, cap) < 0) {
                    Py_DECREF(cap);
                    PyMem_Free(vals);
                    goto done;
                }
                Py_DECREF(cap);
                for (Py_ssize_t k = 0; k < size; k++) {
                    PyObject *b = PySequence_Fast_GET_ITEM(seq, k);
                    if (!PyBytes_Check(b)) {
                        PyErr_SetString(PyExc_TypeError, "CompiledSpec: bytes default values must be bytes");
                        goto done;
                    }
                    vals[k].p = (const uint8_t *)PyBytes_AS_STRING(b);
                    vals[k].n = (size_t)PyBytes_GET_SIZE(b);
                }
                c->default_bytes = vals;
            } else {
                int typ = kind == SF_KIND_INT64 ? NPY_INT64 : NPY_FLOAT32;
                PyObject *arr = PyArray_FROMANY(dflt, typ, 0, 0, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
                if (!arr || PyList_Append(keep, arr) < 0) {
                    Py_XDECREF(arr);
                    goto done;
                }
                Py_DECREF(arr);
                if (PyArray_SIZE((PyArrayObject *)arr) != size) {
                    PyErr_SetString(PyExc_ValueError, "CompiledSpec: default has the wrong number of values");
                    goto done;
                }
                c->default_values = PyArray_DATA((PyArrayObject *)arr);
            }
        }
        if (col == SF_COL_SPARSE) {
            PyObject *ks = PySequence_Fast(ikeys, "CompiledSpec: index keys must be a sequence");
            PyObject *ss = ks ? PyArray_FROMANY(isizes, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST) : NULL;
            if (ks) {
                PyList_Append(keep, ks);
                Py_DECREF(ks);
            }
            if (ss) {
                PyList_Append(keep, ss);
                Py_DECREF(ss);
            }
            if (!ks || !ss) goto done;
            Py_ssize_t nk = PySequence_Fast_GET_SIZE(ks);
            if (PyArray_SIZE((PyArrayObject *)ss) != nk) {
                PyErr_SetString(PyExc_ValueError, "CompiledSpec: one size per index key");
                goto done;
            }
            sf_bytes *keys = PyMem_Calloc(nk ? nk : 1, sizeof(sf_bytes));
            PyObject *cap = keys ? PyCapsule_New(keys, NULL, NULL) : NULL;
            if (!cap) {
                PyMem_Free(keys);
                goto done;
            }
            if (PyList_Append(keep, cap) < 0) {
                Py_DECREF(cap);
                PyMem_Free(keys);
                goto done;
            }
            Py_DECREF(cap);
            for (Py_ssize_t k = 0; k < nk; k++) {
                if (get_key(PySequence_Fast_GET_ITEM(ks, k), &keys[k].p, &keys[k].n)) goto done;
            }
            c->nindex = (size_t)nk;
            c->index_keys = keys;
            c->index_sizes = PyArray_DATA((PyArrayObject *)ss);
        }
    }
    sf_spec *spec = sf_spec_new(cs, (size_t)n);
    if (!spec) {
        PyErr_SetString(PyExc_ValueError, "CompiledSpec: invalid column description (or out of memory)");
        goto done;
    }
    sf_spec_free(self->spec);
    self->spec = spec;
    Py_XSETREF(self->columns, tup);
    tup = NULL;
    rc = 0;
done:
    if (keep) {
        Py_ssize_t kn = PyList_GET_SIZE(keep);
        for (Py_ssize_t k = 0; k < kn; k++) {
            PyObject *o = PyList_GET_ITEM(keep, k);
            if (PyCapsule_CheckExact(o)) PyMem_Free(PyCapsule_GetPointer(o, NULL));
        }
        Py_DECREF(keep);
    }
    PyMem_Free(cs);
    Py_XDECREF(tup);
    return rc;
}

static PyObject *cs_columns(CompiledSpecObject *self, void *closure) {
    if (!self->columns) Py_RETURN_NONE;
    Py_INCREF(self->columns);
    return self->columns;
}

static PyGetSetDef cs_getset[] = {
    {"columns", (getter)cs_columns, NULL, "the column descriptions it was built from", NULL},
    {NULL},
};

static PyTypeObject CompiledSpecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfeed._native.CompiledSpec",
    .tp_basicsize = sizeof(CompiledSpecObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A feature spec compiled for the native parser (immutable, thread-safe).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)cs_init,
    .tp_dealloc = (destructor)cs_dealloc,
    .tp_getset = cs_getset,
};

/* ------------------------------------------------------------------ batch parse */

#define SF_RELEASE_GIL_BYTES (4u << 20)

/* One `bytes` value, as PyBytes_FromStringAndSize makes it, inline: the object-array form
 * makes one per value (26 a record for CTR data), with the GIL held. Values of 0 and 1
 * bytes keep CPython's shared objects; the struct layout is that of CPython 3.8-3.13. */
#if !defined(Py_LIMITED_API) && !defined(Py_TRACE_REFS) && PY_VERSION_HEX >= 0x03080000 && PY_VERSION_HEX < 0x030E0000
#define SF_INLINE_BYTES 1
#endif
#ifdef SF_INLINE_BYTES
/* A new bytes object's hash: not computed yet (ob_shash is deprecated, still there until 3.14). */
static inline void bytes_unhashed(PyBytesObject *op) {
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    op->ob_shash = -1;
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
}
#endif

static inline PyObject *new_bytes(const uint8_t *p, size_t n) {
#ifdef SF_INLINE_BYTES
    if (n > 1 && n <= (size_t)PY_SSIZE_T_MAX - offsetof(PyBytesObject, ob_sval) - 1) {
        PyBytesObject *op = (PyBytesObject *)PyObject_Malloc(offsetof(PyBytesObject, ob_sval) + n + 1);
        if (!op) return PyErr_NoMemory();
        PyObject_InitVar((PyVarObject *)op, &PyBytes_Type, (Py_ssize_t)n);
        bytes_unhashed(op);
        char *d = op->ob_sval;
        if (n <= 16 && n >= 8) { /* short values (categorical strings): two overlapping words, no call */
            uint64_t a, b;
            memcpy(&a, p, 8);
            memcpy(&b, p + n - 8, 8);
            memcpy(d, &a, 8);
            memcpy(d + n - 8, &b, 8);
        } else {
            memcpy(d, p, n);
        }
        d[n] = 0;
        return (PyObject *)op;
    }
#endif
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
}

/* ------------------------------------------- large bytes objects made off the GIL
 *
 * A `bytes` object over 512 bytes (an image, an audio clip) is not pymalloc's: PyObject_Malloc
 * hands it to PyMem_RawMalloc, which needs no GIL, and PyObject_Free hands it back to
 * PyMem_RawFree. So a parse thread can make such objects itself, copy included, as
 * PyObject_Malloc would have, and the thread that takes the batch only puts them in their
 * arrays. That holds while the object domain is pymalloc (or malloc) and neither domain is
 * hooked (debug hooks, tracemalloc: a non-NULL ctx): checked on every batch against the
 * allocators seen when Python turned this on (formats/native.py: only under the default
 * PYTHONMALLOC, pymalloc or malloc, outside development mode). Not in builds whose object
 * header or reference counts differ (free-threaded, Py_TRACE_REFS, Py_REF_DEBUG). One visible
 * difference: these blocks are not counted in sys.getallocatedblocks(), which goes down by one
 * as each is freed. */
#if defined(SF_INLINE_BYTES) && !defined(Py_GIL_DISABLED) && !defined(Py_REF_DEBUG)
#define SF_OFF_GIL_BYTES 1
#endif
#define SF_OFF_GIL_MIN 512 /* values this long or longer: their objects are over pymalloc's 512 bytes */

static int off_gil_on = 0;
static PyMemAllocatorEx off_gil_obj, off_gil_raw; /* the allocators seen when it was turned on */

/* set_large_objects_off_gil(on) -> bool: turn it on (when this build and the allocators allow)
 * or off; whether it is on now. */
static PyObject *py_set_large_objects_off_gil(PyObject *self, PyObject *arg) {
    int want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
    off_gil_on = 0;
#ifdef SF_OFF_GIL_BYTES
    if (want) {
        PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &off_gil_obj);
        PyMem_GetAllocator(PYMEM_DOMAIN_RAW, &off_gil_raw);
        off_gil_on = off_gil_obj.ctx == NULL && off_gil_raw.ctx == NULL;
    }
#endif
    return PyBool_FromLong(off_gil_on);
}

/* Whether this batch may make its large objects off the GIL (called with the GIL); if so, the
 * raw allocator to make them with, as it is now (unhooked). The run calls it directly: through
 * PyMem_RawMalloc it would meet whatever hook is installed meanwhile (tracemalloc's takes the
 * GIL, and crashed when tracing stopped under it); an object made by it is freed by
 * PyObject_Free through the raw domain's free, which any later hook passes on to it. */
static int off_gil_ok(PyMemAllocatorEx *raw) {
    if (!off_gil_on) return 0;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyRefTracer_GetTracer(NULL) != NULL) return 0; /* it would not see these objects made */
#endif
    PyMemAllocatorEx o;
    PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &o);
    PyMem_GetAllocator(PYMEM_DOMAIN_RAW, raw);
    return o.ctx == NULL && raw->ctx == NULL && o.malloc == off_gil_obj.malloc && o.free == off_gil_obj.free &&
           raw->malloc == off_gil_raw.malloc && raw->free == off_gil_raw.free;
}

/* A column's large values as objects made off the GIL (NULL entries: made with the GIL). */
/* what a column is to the runs that make or copy out its values (SF_COL_FIXED is 0) */
#define BYTES_NONE 0
#define BYTES_FIXED 1
#define BYTES_VAR 2

typedef struct {
    PyObject **objs;
    size_t count;
} made_col;

#ifdef SF_OFF_GIL_BYTES
static PyObject *raw_bytes(const uint8_t *p, size_t n, const PyMemAllocatorEx *raw) {
    PyBytesObject *op = (PyBytesObject *)raw->malloc(raw->ctx, offsetof(PyBytesObject, ob_sval) + n + 1);
    if (!op) return NULL;
    /* what PyObject_InitVar does in these builds, without its hooks (which want the GIL) */
    op->ob_base.ob_base.ob_refcnt = 1;
    op->ob_base.ob_base.ob_type = &PyBytes_Type;
    op->ob_base.ob_size = (Py_ssize_t)n;
    bytes_unhashed(op);
    memcpy(op->ob_sval, p, n);
    op->ob_sval[n] = 0;
    return (PyObject *)op;
}
#endif

/* Free what is left of a made column (objects no array holds): no GIL needed. */
static void made_drop(made_col *m, const PyMemAllocatorEx *raw) {
    if (!m->objs) return;
    for (size_t k = 0; k < m->count; k++)
        if (m->objs[k]) raw->free(raw->ctx, m->objs[k]);
    free(m->objs);
    m->objs = NULL;
}

/* glibc's heap, the first time a batch makes large values' objects: each batch of large
 * records allocates its values (a 100 KB value each), and frees them when the batch goes; by
 * default glibc hands a heap top over 128 KiB back to the kernel at every free (and maps
 * values over 128 KiB one by one until its adaptive thresholds have grown), so every batch
 * faulted its values' pages in afresh: half the time of reading 100 KB records. Set here to
 * what glibc's adaptive thresholds reach at most by themselves (values up to 32 MiB from the
 * heap, 64 MiB of free heap top kept), once, unless the user has set glibc's malloc
 * parameters (MALLOC_*_ or GLIBC_TUNABLES) or SHARDFEED_MALLOC_TUNING=0. */
static void heap_tuned_once(void) {
#ifdef __GLIBC__
    static int done = 0;
    if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL)) return;
    const char *off = getenv("SHARDFEED_MALLOC_TUNING");
    const char *tun = getenv("GLIBC_TUNABLES");
    if ((off && strcmp(off, "0") == 0) || getenv("MALLOC_TRIM_THRESHOLD_") || getenv("MALLOC_MMAP_THRESHOLD_") ||
        getenv("MALLOC_TOP_PAD_") || getenv("MALLOC_MMAP_MAX_") || (tun && strstr(tun, "glibc.malloc.")))
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

/* Ready a column for its large objects made off the GIL (no GIL held): 1 when it has a large
 * value (its table allocated), else 0 (none; on running out of memory too: made with the GIL
 * later, which raises MemoryError then). */
static int made_begin(made_col *m, const sf_bytes *vals, size_t count) {
#ifdef SF_OFF_GIL_BYTES
    size_t k = 0;
    while (k < count && vals[k].n < SF_OFF_GIL_MIN) k++;
    if (k == count) return 0;
    heap_tuned_once();
    m->objs = calloc(count, sizeof(PyObject *));
    if (!m->objs) return 0;
    m->count = count;
    return 1;
#else
    (void)m;
    (void)vals;
    (void)count;
    return 0;
#endif
}

/* The large objects of values lo..hi of a column made ready (no GIL held); on running out of
 * memory, the column's are dropped (made with the GIL later). */
static void made_range(made_col *m, const sf_bytes *vals, size_t lo, size_t hi, const PyMemAllocatorEx *raw) {
#ifdef SF_OFF_GIL_BYTES
    if (!m->objs) return;
    for (size_t k = lo; k < hi; k++) {
        if (vals[k].n < SF_OFF_GIL_MIN) continue;
        if (!(m->objs[k] = raw_bytes(vals[k].p, vals[k].n, raw))) {
            made_drop(m, raw);
            return;
        }
    }
#else
    (void)m;
    (void)vals;
    (void)lo;
    (void)hi;
    (void)raw;
#endif
}

/* Make a column's large objects off the GIL (no GIL held). None when it has no large value; on
 * running out of memory, none (made with the GIL later, which raises MemoryError then). */
static void made_fill(made_col *m, const sf_bytes *vals, size_t count, const PyMemAllocatorEx *raw) {
    if (made_begin(m, vals, count)) made_range(m, vals, 0, count, raw);
}

static PyObject *bytes_array(const sf_bytes *vals, size_t count, int as_buffer, npy_intp rows, npy_intp cols,
                             int fixed, made_col *made) {
    if (as_buffer) {
        size_t total = 0;
        for (size_t k = 0; k < count; k++) total += vals[k].n;
        npy_intp dn = (npy_intp)total, on = (npy_intp)count + 1;
        PyObject *data = sf_pool_array((size_t)dn);
        PyObject *offs = data ? PyArray_SimpleNew(1, &on, NPY_INT64) : NULL;
        if (!offs) {
            Py_XDECREF(data);
            return NULL;
        }
        uint8_t *d = PyArray_DATA((PyArrayObject *)data);
        int64_t *o = PyArray_DATA((PyArrayObject *)offs);
        size_t pos = 0;
        o[0] = 0;
        /* Releasing the GIL costs a reacquire, which waits out another thread's Python work
         * (up to the switch interval) when parse threads contend: only for large copies. */
        PyThreadState *ts = total >= SF_RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
        for (size_t k = 0; k < count; k++) {
            if (vals[k].n) memcpy(d + pos, vals[k].p, vals[k].n);
            pos += vals[k].n;
            o[k + 1] = (int64_t)pos;
        }
        if (ts) PyEval_RestoreThread(ts);
        return Py_BuildValue("NN", data, offs);
    }
    npy_intp dims[2] = {fixed ? rows : (npy_intp)count, cols};
    PyObject *arr = PyArray_SimpleNew(fixed ? 2 : 1, dims, NPY_OBJECT);
    if (!arr) return NULL;
    PyObject **items = PyArray_DATA((PyArrayObject *)arr);
    PyObject **ready = made && made->objs && made->count == count ? made->objs : NULL;
    for (size_t k = 0; k < count; k++) {
        PyObject *b;
        if (ready && ready[k]) {
            b = ready[k];
            ready[k] = NULL; /* the array holds it now */
        } else {
            /* The values lie in records a batch apart, out of cache by now: ask for them ahead
             * (about 7% of the time of a batch of CTR records went to these misses). */
            if (k + 16 < count) __builtin_prefetch(vals[k + 16].p);
            b = new_bytes(vals[k].p, vals[k].n);
            if (!b) {
                Py_DECREF(arr);
                return NULL;
            }
        }
        Py_XSETREF(items[k], b);
    }
    return arr;
}

static PyObject *vec_array(const sf_vec *v, int kind, int as_buffer, made_col *made) {
    if (kind == SF_KIND_BYTES) return bytes_array(v->data, v->len, as_buffer, 0, 0, 0, made);
    npy_intp n = (npy_intp)v->len;
    PyObject *arr = PyArray_SimpleNew(1, &n, kind == SF_KIND_INT64 ? NPY_INT64 : NPY_FLOAT32);
    if (arr && v->len) memcpy(PyArray_DATA((PyArrayObject *)arr), v->data, v->len * v->elem);
    return arr;
}

/* The buffer-form bytes columns of a batch whose values are copied in the records' CRC
 * pass (crcfuse.h): FIXED and VAR bytes columns. `data`/`offs` are the arrays handed out. */
typedef struct {
    const sf_bytes *vals;
    size_t count;      /* values in the column */
    size_t size;       /* FIXED: values per record; 0 for VAR */
    const int64_t *splits; /* VAR: per-record value offsets */
    PyObject *data, *offs;
    uint8_t *dst;  /* where the values go: data's bytes */
    int64_t *offp; /* their offsets: offs's (or, made off the GIL, raw memory that offs takes over) */
} fused_col;

/* Allocate a fused column's arrays and its offsets (with the GIL). 0 or -1. */
static int fused_alloc(fused_col *f) {
    size_t total = 0;
    for (size_t k = 0; k < f->count; k++) total += f->vals[k].n;
    npy_intp on = (npy_intp)f->count + 1;
    f->data = sf_pool_array(total);
    f->offs = f->data ? PyArray_SimpleNew(1, &on, NPY_INT64) : NULL;
    if (!f->offs) return -1;
    int64_t *o = PyArray_DATA((PyArrayObject *)f->offs);
    size_t pos = 0;
    o[0] = 0;
    for (size_t k = 0; k < f->count; k++) {
        pos += f->vals[k].n;
        o[k + 1] = (int64_t)pos;
    }
    f->dst = PyArray_DATA((PyArrayObject *)f->data);
    f->offp = o;
    return 0;
}

#define FUSE_MIN_BYTES 4096 /* a record's values below this: CRC the record whole, then copy */

/* Copy the fused columns' values of records[0:n] and check each record's CRC against want,
 * one pass over each record (no GIL needed). Returns n, or the first record whose CRC fails
 * (the copy stops there). segs: room for the most values one record can hold. */
static size_t fused_pass(const sf_bytes *recs, size_t n, const uint8_t *want, fused_col *fc, size_t nfc, sf_seg *segs) {
    for (size_t k = 0; k < n; k++) {
        size_t nseg = 0, values = 0;
        for (size_t c = 0; c < nfc; c++) {
            fused_col *f = &fc[c];
            size_t lo = f->splits ? (size_t)f->splits[k] : k * f->size;
            size_t hi = f->splits ? (size_t)f->splits[k + 1] : lo + f->size;
            uint8_t *d = f->dst;
            const int64_t *o = f->offp;
            for (size_t v = lo; v < hi; v++) {
                segs[nseg].src = f->vals[v].p;
                segs[nseg].n = f->vals[v].n;
                segs[nseg].dst = d + o[v];
                values += f->vals[v].n;
                nseg++;
            }
        }
        uint32_t w;
        memcpy(&w, want + 4 * k, 4);
        if (values < FUSE_MIN_BYTES) {
            /* small values (CTR features): one CRC over the whole record, cache-hot, then the
             * copies; a CRC split at every short value costs twice the CPU */
            if (sf_masked_crc32c(recs[k].p, recs[k].n) != w) return k;
            for (size_t i = 0; i < nseg; i++)
                if (segs[i].n) memcpy(segs[i].dst, segs[i].src, segs[i].n);
        } else if (sf_copy_verify_record(recs[k].p, recs[k].n, segs, nseg, w)) {
            return k;
        }
    }
    return n;
}

/* parse_batch(spec, records, offsets, lengths, bytes_as_buffer, crcs=None, which=None) -> (columns, error)
 * records: a sequence of bytes-like (offsets None), or one buffer holding the records at
 * offsets[i]:offsets[i]+lengths[i], or a tuple of buffers with record i in records[which[i]]. columns: one entry per spec column:
 *   FIXED numeric: array (n, size); FIXED bytes: object array (n, size) or (data, offsets)
 *   VAR: (values, splits); SPARSE: (values, splits, [index arrays]);
 *   SEQ_*: (values, record step splits, step value splits).
 * error: None, or (kind, code, record, column, a, b, c, message) with kind "decode",
 * "parse", or "type" (a record of a type that is not bytes-like; message = type name).
 * parse_sequence_batch: the same for SequenceExamples; a type error there comes before a
 * parse error in an earlier record (the reference decodes every record first).
 * crcs (with offsets only): each record's stored masked data CRC (n uint32, what
 * scan_frames hands out when it defers them): every record's CRC is checked here, for
 * buffer-form FIXED/VAR bytes columns in the pass that copies the values out; error
 * ("crc", 0, record, ...) for the first record whose CRC fails, ahead of a decode or
 * parse error of that record or a later one. */
/* One batch parse, in three phases: pjob_prepare (GIL), pjob_run (no GIL: the parse and the
 * CRCs), pjob_finish (GIL: the result). parse_batch runs them in a row, releasing the GIL
 * around the run; a ParsePool runs the run on its own threads. */
typedef struct {
    CompiledSpecObject *cso; /* held: its spec and columns stay alive while a pool thread parses */
    PyObject *columns;       /* held */
    const sf_spec *spec;
    size_t ncols;
    int sequence, as_buffer, fuse;
    PyObject *whicha, *tup, *keep, *offs, *lens, *type_err_name;
    Py_buffer *views; /* held views keep the records' buffers alive and unmoved */
    Py_ssize_t nviews, views_held;
    Py_buffer view, crcv;
    int have_view, have_crcs;
    const uint8_t *want;
    sf_bytes *recs;
    sf_colout *outs;
    PyObject **fixed_arrays;
    fused_col *fc;
    size_t nfc;
    sf_seg *segs;
    made_col *made; /* object-form bytes columns whose large values the run makes (off the GIL) */
    PyMemAllocatorEx raw; /* what it makes them with (off_gil_ok) */
    /* buffer form on a pool: the values are copied out by the run, into one block made here */
    PyObject *fblock; /* a uint8 array of the records' total length, or NULL */
    uint8_t *fbase;
    size_t flen;
    int *fcol;     /* per column: BYTES_FIXED or BYTES_VAR for a FixedLen or VarLen bytes column, else BYTES_NONE */
    size_t *fsize; /* per column: FIXED values per record */
    int prefused;  /* the run copied the values out (fc, segs and the offsets are raw memory) */
    size_t n, type_err_at;
    /* the run's outcome */
    sf_error err;
    int rc;
    size_t crc_bad; /* the first record whose data CRC fails; n: none */
    /* crcs=True: each record's data lies in its TFRecord frame (length and length CRC in the
     * 12 bytes before it, the data CRC in the 4 after): the run checks the frame's head and
     * reads the stored data CRCs into frame_want, which then serves as the crcs */
    int frames;
    uint8_t *frame_want;
    uint8_t *packed; /* the small object-form values, packed by the run (pjob_pack_small), or NULL */
} pjob;

/* Frame heads of records in their frames (crcs=True): each record's length field must be its
 * length and the field's masked CRC the one stored; the stored data CRC of every record goes
 * into want. The first record whose head fails; n: none. Frames ahead are prefetched whole
 * (the records of a global shuffle lie all over the page cache): the CRC and the parse that
 * follow find a batch's records in the cache (a batch of small records fits in L2). */
#define FRAME_AHEAD 16             /* frames prefetched ahead of the one checked */
#define FRAME_PREFETCH_MAX 8192    /* of a frame, the bytes asked for (the rest streams in) */
static size_t frame_heads(const sf_bytes *recs, size_t n, uint8_t *want) {
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        if (i + FRAME_AHEAD < n) { /* the whole frame: the CRC and the parse read it next */
            const uint8_t *f = recs[i + FRAME_AHEAD].p - 12;
            size_t fl = recs[i + FRAME_AHEAD].n + 16;
            if (fl > FRAME_PREFETCH_MAX) fl = FRAME_PREFETCH_MAX;
            /* into L2 (prefetcht2): a frame of a batch of 1 KB records measured 5-10% faster
             * than into L1, which holds only a few of the frames in flight */
            for (size_t b = 0; b < fl; b += 64) __builtin_prefetch(f + b, 0, 1);
            __builtin_prefetch(f + recs[i + FRAME_AHEAD].n + 12, 0, 1);
        }
        const uint8_t *h = recs[i].p - 12;
        uint64_t len;
        uint32_t lc;
        memcpy(&len, h, 8);
        memcpy(&lc, h + 8, 4);
        memcpy(want + 4 * i, recs[i].p + recs[i].n, 4);
        if (bad == n && (len != (uint64_t)recs[i].n || sf_masked_crc32c(h, 8) != lc)) bad = i;
    }
    return bad;
}

/* How many columns the CRC pass copies out. */
static size_t fused_count(const pjob *j) {
    size_t nfc = 0;
    for (size_t ci = 0; ci < j->ncols; ci++) nfc += j->fcol[ci] != BYTES_NONE;
    return nfc;
}

static pjob *pjob_new(void) {
    pjob *j = PyMem_Calloc(1, sizeof(pjob));
    if (!j) PyErr_NoMemory();
    return j;
}

/* Everything a batch parse does with the GIL before the parse: the arguments read, the
 * records located, the output columns allocated. 0, or -1 with an exception set. */
static int pjob_prepare(pjob *j, PyObject *args, int sequence, int pooled) {
    PyObject *records, *offsets_obj, *lengths_obj;
    PyObject *crcs_obj = Py_None, *which_obj = Py_None;
    CompiledSpecObject *cso;
    j->sequence = sequence;
    j->type_err_at = SIZE_MAX;
    if (!PyArg_ParseTuple(args, sequence ? "O!OOO|pOO:parse_sequence_batch" : "O!OOO|pOO:parse_batch",
                          &CompiledSpecType, &cso, &records, &offsets_obj, &lengths_obj, &j->as_buffer, &crcs_obj,
                          &which_obj))
        return -1;
    if (!cso->spec) {
        PyErr_SetString(PyExc_ValueError, "CompiledSpec is not initialised");
        return -1;
    }
    Py_INCREF(cso);
    j->cso = cso;
    j->spec = cso->spec;
    j->columns = cso->columns;
    Py_INCREF(j->columns);
    j->ncols = sf_spec_ncols(j->spec);

    if (offsets_obj == Py_None) {
        j->tup = PySequence_Tuple(records);
        if (!j->tup) return -1;
        j->n = (size_t)PyTuple_GET_SIZE(j->tup);
        j->recs = PyMem_Calloc(j->n ? j->n : 1, sizeof(sf_bytes));
        j->keep = PyList_New(0);
        if (!j->recs || !j->keep) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < j->n; i++) {
            PyObject *r = PyTuple_GET_ITEM(j->tup, i);
            if (!PyBytes_Check(r)) {
                if (PyByteArray_Check(r) || PyMemoryView_Check(r)) {
                    PyObject *b = PyBytes_FromObject(r); /* a copy: it cannot change under us */
                    if (!b || PyList_Append(j->keep, b) < 0) {
                        Py_XDECREF(b);
                        return -1;
                    }
                    Py_DECREF(b);
                    r = b;
                } else {
                    j->type_err_at = i;
                    j->type_err_name = PyUnicode_FromString(Py_TYPE(r)->tp_name);
                    if (!j->type_err_name) return -1;
                    j->n = i;
                    break;
                }
            }
            j->recs[i].p = (const uint8_t *)PyBytes_AS_STRING(r);
            j->recs[i].n = (size_t)PyBytes_GET_SIZE(r);
        }
    } else {
        /* one buffer; or a tuple of buffers, record i in records[which[i]] (a batch whose
         * records lie in two mapped files: no copy to join them) */
        int several = PyTuple_Check(records);
        if (several != (which_obj != Py_None)) {
            PyErr_SetString(PyExc_ValueError, "records: a tuple of buffers goes with `which`, one buffer without");
            return -1;
        }
        if (several) {
            j->nviews = PyTuple_GET_SIZE(records);
            j->views = PyMem_Calloc(j->nviews ? (size_t)j->nviews : 1, sizeof(Py_buffer));
            if (!j->views) {
                PyErr_NoMemory();
                return -1;
            }
            for (; j->views_held < j->nviews; j->views_held++)
                if (PyObject_GetBuffer(PyTuple_GET_ITEM(records, j->views_held), &j->views[j->views_held], PyBUF_SIMPLE) < 0)
                    return -1;
            j->whicha = PyArray_FROMANY(which_obj, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY);
            if (!j->whicha) return -1;
        } else {
            if (PyObject_GetBuffer(records, &j->view, PyBUF_SIMPLE) < 0) return -1;
            j->have_view = 1;
        }
        j->offs = PyArray_FROMANY(offsets_obj, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY);
        j->lens = j->offs ? PyArray_FROMANY(lengths_obj, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY) : NULL;
        if (!j->lens) return -1;
        j->n = (size_t)PyArray_SIZE((PyArrayObject *)j->offs);
        if ((size_t)PyArray_SIZE((PyArrayObject *)j->lens) != j->n ||
            (j->whicha && (size_t)PyArray_SIZE((PyArrayObject *)j->whicha) != j->n)) {
            PyErr_SetString(PyExc_ValueError, "offsets, lengths (and which) must have the same length");
            return -1;
        }
        const int64_t *o = PyArray_DATA((PyArrayObject *)j->offs), *l = PyArray_DATA((PyArrayObject *)j->lens);
        const int64_t *wh = j->whicha ? PyArray_DATA((PyArrayObject *)j->whicha) : NULL;
        j->recs = PyMem_Calloc(j->n ? j->n : 1, sizeof(sf_bytes));
        if (!j->recs) {
            PyErr_NoMemory();
            return -1;
        }
        int frames = crcs_obj == Py_True;
        for (size_t i = 0; i < j->n; i++) {
            if (wh && (wh[i] < 0 || wh[i] >= (int64_t)j->nviews)) {
                PyErr_Format(PyExc_ValueError, "record %zu: buffer %lld of %zd", i, (long long)wh[i], j->nviews);
                return -1;
            }
            const Py_buffer *v = wh ? &j->views[wh[i]] : &j->view;
            uint64_t blen = (uint64_t)v->len;
            if (o[i] < 0 || l[i] < 0 || (uint64_t)o[i] > blen || (uint64_t)l[i] > blen - (uint64_t)o[i]) {
                PyErr_Format(PyExc_ValueError,
                             "record %zu: offset %lld and length %lld are outside the buffer (%lld bytes)", i,
                             (long long)o[i], (long long)l[i], (long long)blen);
                return -1;
            }
            if (frames && (o[i] < 12 || (uint64_t)l[i] + 4 > blen - (uint64_t)o[i])) {
                PyErr_Format(PyExc_ValueError, "record %zu: its frame (offset %lld - 12, length %lld + 16) is outside "
                             "the buffer (%lld bytes)", i, (long long)o[i], (long long)l[i], (long long)blen);
                return -1;
            }
            j->recs[i].p = (const uint8_t *)v->buf + o[i];
            j->recs[i].n = (size_t)l[i];
        }
    }

    if (crcs_obj == Py_True) { /* the stored CRCs are in the frames: read by the run */
        if (offsets_obj == Py_None) {
            PyErr_SetString(PyExc_ValueError, "crcs=True: only with records given as buffers, offsets and lengths");
            return -1;
        }
        j->frames = 1;
        j->frame_want = PyMem_Malloc(j->n ? 4 * j->n : 1);
        if (!j->frame_want) {
            PyErr_NoMemory();
            return -1;
        }
    } else if (crcs_obj != Py_None) {
        if (offsets_obj == Py_None) {
            PyErr_SetString(PyExc_ValueError, "crcs: only with records in one buffer (offsets and lengths)");
            return -1;
        }
        if (PyObject_GetBuffer(crcs_obj, &j->crcv, PyBUF_SIMPLE) < 0) return -1;
        j->have_crcs = 1;
        if ((size_t)j->crcv.len != 4 * j->n) {
            PyErr_Format(PyExc_ValueError, "crcs: %zd bytes for %zu records (4 bytes each)", j->crcv.len, j->n);
            return -1;
        }
    }
    j->want = j->have_crcs ? j->crcv.buf : j->frame_want;
    j->fuse = j->want && j->as_buffer && !j->sequence;

    int make = !j->as_buffer && !j->sequence && off_gil_ok(&j->raw); /* large objects made by the run */
    j->outs = PyMem_Calloc(j->ncols ? j->ncols : 1, sizeof(sf_colout));
    j->fixed_arrays = PyMem_Calloc(j->ncols ? j->ncols : 1, sizeof(PyObject *));
    if (j->fuse || make) { /* the FixedLen and VarLen bytes columns: what the run copies out or makes */
        j->fcol = PyMem_Calloc(j->ncols ? j->ncols : 1, sizeof(int));
        j->fsize = PyMem_Calloc(j->ncols ? j->ncols : 1, sizeof(size_t));
    }
    if (!j->outs || !j->fixed_arrays || ((j->fuse || make) && (!j->fcol || !j->fsize))) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t ci = 0; ci < j->ncols; ci++) {
        PyObject *t = PyTuple_GET_ITEM(j->columns, ci);
        int col = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
        if (j->fcol && kind == SF_KIND_BYTES && (col == SF_COL_FIXED || col == SF_COL_VAR)) {
            j->fcol[ci] = col == SF_COL_FIXED ? BYTES_FIXED : BYTES_VAR;
            j->fsize[ci] = col == SF_COL_FIXED ? (size_t)size : 0;
        }
        if (col == SF_COL_FIXED) {
            if (size && j->n > (size_t)PY_SSIZE_T_MAX / 16 / (size_t)size) {
                PyErr_NoMemory();
                return -1;
            }
            if (kind == SF_KIND_BYTES) {
                j->outs[ci].fixed = PyMem_Malloc((j->n && size ? j->n * (size_t)size : 1) * sizeof(sf_bytes));
                if (!j->outs[ci].fixed) {
                    PyErr_NoMemory();
                    return -1;
                }
            } else {
                npy_intp dims[2] = {(npy_intp)j->n, size};
                j->fixed_arrays[ci] = PyArray_SimpleNew(2, dims, kind == SF_KIND_INT64 ? NPY_INT64 : NPY_FLOAT32);
                if (!j->fixed_arrays[ci]) return -1;
                j->outs[ci].fixed = PyArray_DATA((PyArrayObject *)j->fixed_arrays[ci]);
            }
        } else {
            npy_intp sn = (npy_intp)j->n + 1;
            j->fixed_arrays[ci] = PyArray_SimpleNew(1, &sn, NPY_INT64); /* the splits */
            if (!j->fixed_arrays[ci]) return -1;
            j->outs[ci].splits = PyArray_DATA((PyArrayObject *)j->fixed_arrays[ci]);
            memset(j->outs[ci].splits, 0, (j->n + 1) * sizeof(int64_t));
        }
    }
    if (j->fuse && !fused_count(j)) j->fuse = 0; /* nothing to copy out: the run checks the CRCs */
    if (pooled && j->fuse && j->n) {
        /* the values the run copies out lie inside the records (defaults aside: a batch whose
         * values do not fit is copied out by pjob_finish, as parse_batch does) */
        size_t total = 0;
        for (size_t i = 0; i < j->n; i++) total += j->recs[i].n;
        j->fblock = sf_pool_array(total ? total : 1);
        if (!j->fblock) return -1;
        j->fbase = PyArray_DATA((PyArrayObject *)j->fblock);
        j->flen = total;
    }
    if (make && !(j->made = PyMem_Calloc(j->ncols ? j->ncols : 1, sizeof(made_col)))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Point fc (room for fused_count) at the parsed values of the columns the CRC pass copies out;
 * the most values one record holds in them all (the segments the pass needs). No GIL needed. */
static size_t fused_columns(const pjob *j, fused_col *fc) {
    size_t c = 0, most = 0;
    for (size_t ci = 0; ci < j->ncols; ci++) {
        if (j->fcol[ci] == BYTES_NONE) continue;
        fused_col *f = &fc[c++];
        if (j->fcol[ci] == BYTES_FIXED) {
            f->vals = j->outs[ci].fixed;
            f->size = j->fsize[ci];
            f->count = j->n * f->size;
            most += f->size;
        } else {
            f->vals = j->outs[ci].values.data;
            f->count = j->outs[ci].values.len;
            f->splits = j->outs[ci].splits;
            size_t m = 0;
            for (size_t k = 0; k < j->n; k++) {
                size_t r = (size_t)(f->splits[k + 1] - f->splits[k]);
                if (r > m) m = r;
            }
            most += m;
        }
    }
    return most;
}

static void prefused_free(fused_col *fc, size_t nfc, sf_seg *segs) {
    if (fc)
        for (size_t c = 0; c < nfc; c++) free(fc[c].offp);
    free(fc);
    free(segs);
}

/* The buffer form's copy and CRC pass, in the run (no GIL): the values into the block made by
 * pjob_prepare, their offsets into raw memory. Leaves the job as it was when they do not fit
 * (values from defaults) or memory runs out: pjob_finish then does it as parse_batch does. */
static void pjob_prefuse(pjob *j) {
    size_t nfc = fused_count(j), total = 0;
    fused_col *fc = calloc(nfc ? nfc : 1, sizeof(fused_col));
    if (!fc) return;
    size_t most = fused_columns(j, fc);
    for (size_t c = 0; c < nfc; c++)
        for (size_t k = 0; k < fc[c].count; k++) total += fc[c].vals[k].n;
    sf_seg *segs = total <= j->flen ? malloc((most ? most : 1) * sizeof(sf_seg)) : NULL;
    if (!segs) {
        free(fc);
        return;
    }
    size_t pos = 0;
    for (size_t c = 0; c < nfc; c++) {
        fused_col *f = &fc[c];
        f->dst = j->fbase + pos;
        f->offp = malloc((f->count + 1) * sizeof(int64_t));
        if (!f->offp) {
            prefused_free(fc, nfc, segs);
            return;
        }
        size_t at = 0;
        f->offp[0] = 0;
        for (size_t k = 0; k < f->count; k++) {
            at += f->vals[k].n;
            f->offp[k + 1] = (int64_t)at;
        }
        pos += at;
    }
    j->crc_bad = fused_pass(j->recs, j->n, j->want, fc, nfc, segs);
    j->fc = fc;
    j->nfc = nfc;
    j->segs = segs;
    j->prefused = 1;
}

/* The records' CRCs and the large objects of a batch that parsed, one record after another:
 * its CRC, then its large values' objects, while its bytes are still in the CPU's cache (a
 * CRC pass over the whole batch first left a batch of large records to be read again from
 * memory for the copies). 0 when no column has a large value (nothing done), else 1, with
 * j->crc_bad set (the objects dropped when a CRC fails). No GIL. */
static int pjob_checked_made(pjob *j) {
    int any = 0;
    for (size_t ci = 0; ci < j->ncols; ci++) {
        if (j->fcol[ci] == BYTES_FIXED)
            any |= made_begin(&j->made[ci], j->outs[ci].fixed, j->n * j->fsize[ci]);
        else if (j->fcol[ci] == BYTES_VAR)
            any |= made_begin(&j->made[ci], j->outs[ci].values.data, j->outs[ci].values.len);
    }
    if (!any) return 0;
    for (size_t k = 0; k < j->n; k++) {
        uint32_t w;
        memcpy(&w, j->want + 4 * k, 4);
        if (sf_masked_crc32c(j->recs[k].p, j->recs[k].n) != w) {
            for (size_t ci = 0; ci < j->ncols; ci++) made_drop(&j->made[ci], &j->raw);
            j->crc_bad = k;
            return 1;
        }
        for (size_t ci = 0; ci < j->ncols; ci++) {
            if (j->fcol[ci] == BYTES_FIXED)
                made_range(&j->made[ci], j->outs[ci].fixed, k * j->fsize[ci], (k + 1) * j->fsize[ci], &j->raw);
            else if (j->fcol[ci] == BYTES_VAR)
                made_range(&j->made[ci], j->outs[ci].values.data, (size_t)j->outs[ci].splits[k],
                           (size_t)j->outs[ci].splits[k + 1], &j->raw);
        }
    }
    return 1;
}

/* The small values of a pool job's object-form bytes columns copied into one block, in the
 * order their objects are made in (with the GIL, column after column), and pointed at there:
 * left in records all over memory (a global shuffle's), each column's pass over the batch on
 * the thread that makes the objects missed the cache and the TLB at every value (a third of
 * that thread's time over 1 KB records). The run's thread has just read them. No GIL. */
static void pjob_pack_small(pjob *j) {
#ifdef SF_OFF_GIL_BYTES
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint8_t *at = j->packed;
        for (size_t ci = 0; ci < j->ncols; ci++) {
            sf_bytes *vals;
            size_t count;
            if (j->fcol[ci] == BYTES_FIXED) {
                vals = j->outs[ci].fixed;
                count = j->n * j->fsize[ci];
            } else if (j->fcol[ci] == BYTES_VAR) {
                vals = j->outs[ci].values.data;
                count = j->outs[ci].values.len;
            } else {
                continue;
            }
            for (size_t k = 0; k < count; k++) {
                size_t n = vals[k].n;
                if (!n || n >= SF_OFF_GIL_MIN) continue;
                if (!pass) {
                    total += n;
                    continue;
                }
                memcpy(at, vals[k].p, n);
                vals[k].p = at;
                at += n;
            }
        }
        if (!pass && (!total || !(j->packed = malloc(total)))) return;
    }
#else
    (void)j;
#endif
}

/* The parse itself and the records' CRCs: no GIL, no Python object touched. */
static void pjob_run(pjob *j) {
    int made = 0; /* the large objects made with the CRCs (pjob_checked_made) */
    j->crc_bad = j->n; /* the first record whose data CRC fails; j->n: none */
    size_t head_bad = j->frames ? frame_heads(j->recs, j->n, j->frame_want) : j->n;
    j->rc = j->sequence ? sf_parse_sequence_batch(j->spec, j->recs, j->n, j->outs, &j->err) : sf_parse_batch(j->spec, j->recs, j->n, j->outs, &j->err);
    if (j->want && j->rc && j->err.kind != SF_ERR_NOMEM) {
        /* a record that does not parse may be a damaged one: its CRC (and those before it) first */
        size_t upto = j->err.record < j->n ? j->err.record + 1 : j->n;
        size_t bad = sf_first_bad_crc(j->recs, j->want, upto);
        if (bad < upto) j->crc_bad = bad;
    } else if (j->want && !j->rc && !j->fuse) {
        if (j->made && !j->type_err_name && pjob_checked_made(j)) made = 1;
        else j->crc_bad = sf_first_bad_crc(j->recs, j->want, j->n);
    }
    if (!made && j->made && !j->rc && j->crc_bad == j->n && !j->type_err_name) {
        for (size_t ci = 0; ci < j->ncols; ci++) {
            if (j->fcol[ci] == BYTES_FIXED)
                made_fill(&j->made[ci], j->outs[ci].fixed, j->n * j->fsize[ci], &j->raw);
            else if (j->fcol[ci] == BYTES_VAR)
                made_fill(&j->made[ci], j->outs[ci].values.data, j->outs[ci].values.len, &j->raw);
        }
    }
    if (j->made && !j->rc && j->crc_bad == j->n && !j->type_err_name && head_bad == j->n) pjob_pack_small(j);
    if (j->fblock && !j->rc && !j->type_err_name) pjob_prefuse(j);
    /* a bad frame head is a failed check of that record: reported as a CRC (the reader's
     * reference path then names the check), unless an earlier record does not parse */
    if (head_bad < j->crc_bad && (!j->rc || head_bad <= j->err.record)) j->crc_bad = head_bad;
}

static void raw_capsule_free(PyObject *cap) { free(PyCapsule_GetPointer(cap, NULL)); }

/* A prefused column's arrays (with the GIL): its values, a view of the job's block (which
 * keeps the block alive) or, when the batch's values fill less than half the block (small
 * values in large records), a copy of its own, so that a column kept does not keep the whole
 * batch; and its offsets, an array over the raw memory the run filled (freed with the array).
 * 0, or -1 with an exception set. */
static int prefused_arrays(pjob *j, fused_col *f, int copy) {
    npy_intp len = (npy_intp)f->offp[f->count], on = (npy_intp)f->count + 1;
    if (copy) {
        f->data = sf_pool_array((size_t)len);
        if (!f->data) return -1;
        uint8_t *d = PyArray_DATA((PyArrayObject *)f->data);
        PyThreadState *ts = (size_t)len >= SF_RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
        if (len) memcpy(d, f->dst, (size_t)len);
        if (ts) PyEval_RestoreThread(ts);
    } else {
        f->data = PyArray_New(&PyArray_Type, 1, &len, NPY_UINT8, NULL, f->dst, 0, NPY_ARRAY_CARRAY, NULL);
        if (!f->data) return -1;
        Py_INCREF(j->fblock);
        if (PyArray_SetBaseObject((PyArrayObject *)f->data, j->fblock) < 0) return -1;
    }
    PyObject *cap = PyCapsule_New(f->offp, NULL, raw_capsule_free);
    if (!cap) return -1;
    f->offs = PyArray_New(&PyArray_Type, 1, &on, NPY_INT64, NULL, f->offp, 0, NPY_ARRAY_CARRAY, NULL);
    if (!f->offs) {
        PyCapsule_SetDestructor(cap, NULL); /* the raw memory stays the job's */
        Py_DECREF(cap);
        return -1;
    }
    f->offp = NULL; /* the capsule frees it, with the array */
    return PyArray_SetBaseObject((PyArrayObject *)f->offs, cap);
}

/* Everything after the parse, with the GIL: the fused copy of buffer-form columns, the
 * error or the columns, as parse_batch returns them; NULL with an exception set. */
static PyObject *pjob_finish(pjob *j) {
    PyObject *result = NULL;
    if (j->rc && j->err.kind == SF_ERR_NOMEM) {
        PyErr_NoMemory();
        return result;
    }
    if (j->crc_bad == j->n && j->fuse && !j->rc && !j->type_err_name && !j->prefused) {
        j->nfc = fused_count(j);
        j->fc = PyMem_Calloc(j->nfc ? j->nfc : 1, sizeof(fused_col));
        if (!j->fc) {
            PyErr_NoMemory();
            return result;
        }
        size_t most = fused_columns(j, j->fc);
        for (size_t c = 0; c < j->nfc; c++)
            if (fused_alloc(&j->fc[c]) < 0) return result;
        j->segs = PyMem_Malloc((most ? most : 1) * sizeof(sf_seg));
        if (!j->segs) {
            PyErr_NoMemory();
            return result;
        }
        Py_BEGIN_ALLOW_THREADS
        j->crc_bad = fused_pass(j->recs, j->n, j->want, j->fc, j->nfc, j->segs);
        Py_END_ALLOW_THREADS
    }
    if (j->crc_bad < j->n) {
        result = Py_BuildValue("(O(snnnLLLs))", Py_None, "crc", (Py_ssize_t)0, (Py_ssize_t)j->crc_bad, (Py_ssize_t)0, 0LL,
                               0LL, 0LL, "data crc");
        return result;
    }
    if (j->type_err_name && j->sequence && !(j->rc && j->err.kind == SF_ERR_DECODE)) j->rc = 0; /* reported below */
    if (j->rc) {
        if (j->err.kind == SF_ERR_NOMEM) {
            PyErr_NoMemory();
            return result;
        }
        result = Py_BuildValue("(O(snnnLLLs))", Py_None, j->err.kind == SF_ERR_DECODE ? "decode" : "parse", (Py_ssize_t)j->err.code,
                               (Py_ssize_t)j->err.record, (Py_ssize_t)j->err.column, (long long)j->err.a, (long long)j->err.b,
                               (long long)j->err.c, j->err.msg);
        return result;
    }
    if (j->type_err_name) {
        result = Py_BuildValue("(O(snnnLLLO))", Py_None, "type", (Py_ssize_t)0, (Py_ssize_t)j->type_err_at, (Py_ssize_t)0,
                               0LL, 0LL, 0LL, j->type_err_name);
        return result;
    }
    PyObject *cols_out = PyList_New((Py_ssize_t)j->ncols);
    if (!cols_out) return result;
    size_t fi = 0; /* the next fused column */
    int compact = 0; /* prefused values that fill less than half their block: copied out of it */
    if (j->prefused) {
        size_t used = 0;
        for (size_t c = 0; c < j->nfc; c++) used += (size_t)j->fc[c].offp[j->fc[c].count];
        compact = used < j->flen / 2;
    }
    for (size_t ci = 0; ci < j->ncols; ci++) {
        PyObject *t = PyTuple_GET_ITEM(j->columns, ci);
        int col = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
        PyObject *item = NULL;
        PyObject *fused = NULL; /* (data, offsets) of a fused column */
        if (j->fc && kind == SF_KIND_BYTES && (col == SF_COL_FIXED || col == SF_COL_VAR)) {
            if (j->prefused && prefused_arrays(j, &j->fc[fi], compact) < 0) {
                Py_DECREF(cols_out);
                return result;
            }
            fused = Py_BuildValue("OO", j->fc[fi].data, j->fc[fi].offs);
            fi++;
            if (!fused) {
                Py_DECREF(cols_out);
                return result;
            }
        }
        if (col == SF_COL_FIXED) {
            if (fused) {
                item = fused;
            } else if (kind == SF_KIND_BYTES) {
                item = bytes_array(j->outs[ci].fixed, j->n * (size_t)size, j->as_buffer, (npy_intp)j->n, size, 1,
                                   j->made ? &j->made[ci] : NULL);
            } else {
                item = j->fixed_arrays[ci];
                j->fixed_arrays[ci] = NULL;
            }
        } else {
            PyObject *vals = fused ? fused : vec_array(&j->outs[ci].values, kind, j->as_buffer,
                                                       j->made ? &j->made[ci] : NULL);
            if (vals && col == SF_COL_VAR) {
                item = Py_BuildValue("NO", vals, j->fixed_arrays[ci]);
            } else if (vals && (col == SF_COL_SEQ_FIXED || col == SF_COL_SEQ_VAR)) {
                PyObject *steps = vec_array(&j->outs[ci].steps, SF_KIND_INT64, 0, NULL);
                item = steps ? Py_BuildValue("NON", vals, j->fixed_arrays[ci], steps) : NULL;
                if (!steps) Py_DECREF(vals);
            } else if (vals) {
                size_t nidx = (size_t)PySequence_Size(PyTuple_GET_ITEM(t, 5));
                PyObject *ix = PyList_New((Py_ssize_t)nidx);
                for (size_t d = 0; ix && d < nidx; d++) {
                    PyObject *a = vec_array(&j->outs[ci].index[d], SF_KIND_INT64, 0, NULL);
                    if (!a) {
                        Py_CLEAR(ix);
                        break;
                    }
                    PyList_SET_ITEM(ix, (Py_ssize_t)d, a);
                }
                item = ix ? Py_BuildValue("NON", vals, j->fixed_arrays[ci], ix) : NULL;
                if (!ix) Py_DECREF(vals);
            }
        }
        if (!item) {
            Py_DECREF(cols_out);
            return result;
        }
        PyList_SET_ITEM(cols_out, (Py_ssize_t)ci, item);
    }
    result = Py_BuildValue("NO", cols_out, Py_None);

    return result;
}

/* pjob_finish, and then, once every byte of the records has been read, the truncation
 * guard's word: a record with a byte in a map that reads zeros (its file truncated while
 * the batch was read) fails its check as "truncated data", whatever the columns hold. */
static PyObject *pjob_finish_guarded(pjob *j) {
    PyObject *result = pjob_finish(j);
    if (!result) return result;
    size_t lost = sf_guard_first_lost(j->recs, j->n);
    if (lost >= j->n) return result;
    Py_DECREF(result);
    return Py_BuildValue("(O(snnnLLLs))", Py_None, "crc", (Py_ssize_t)0, (Py_ssize_t)lost, (Py_ssize_t)0, 0LL, 0LL, 0LL,
                         "truncated data");
}

/* Free a job and what it holds (with the GIL), whatever phase it reached. */
static void pjob_free(pjob *j) {
    if (!j) return;
    if (j->outs) {
        sf_out_free(j->spec, j->outs);
        for (size_t ci = 0; ci < j->ncols; ci++) {
            PyObject *t = PyTuple_GET_ITEM(j->columns, ci);
            if (PyLong_AsLong(PyTuple_GET_ITEM(t, 0)) == SF_COL_FIXED &&
                PyLong_AsLong(PyTuple_GET_ITEM(t, 1)) == SF_KIND_BYTES)
                PyMem_Free(j->outs[ci].fixed);
        }
        PyMem_Free(j->outs);
    }
    if (j->fixed_arrays) {
        for (size_t ci = 0; ci < j->ncols; ci++) Py_XDECREF(j->fixed_arrays[ci]);
        PyMem_Free(j->fixed_arrays);
    }
    if (j->fc) {
        for (size_t c = 0; c < j->nfc; c++) {
            Py_XDECREF(j->fc[c].data);
            Py_XDECREF(j->fc[c].offs);
        }
    }
    if (j->prefused) {
        prefused_free(j->fc, j->nfc, j->segs);
    } else {
        PyMem_Free(j->fc);
        PyMem_Free(j->segs);
    }
    Py_XDECREF(j->fblock);
    PyMem_Free(j->fcol);
    PyMem_Free(j->fsize);
    if (j->made) {
        for (size_t ci = 0; ci < j->ncols; ci++) made_drop(&j->made[ci], &j->raw);
        PyMem_Free(j->made);
    }
    if (j->have_crcs) PyBuffer_Release(&j->crcv);
    PyMem_Free(j->frame_want);
    free(j->packed);
    for (Py_ssize_t v = 0; v < j->views_held; v++) PyBuffer_Release(&j->views[v]);
    PyMem_Free(j->views);
    Py_XDECREF(j->whicha);
    PyMem_Free(j->recs);
    if (j->have_view) PyBuffer_Release(&j->view);
    Py_XDECREF(j->offs);
    Py_XDECREF(j->lens);
    Py_XDECREF(j->tup);
    Py_XDECREF(j->keep);
    Py_XDECREF(j->type_err_name);
    Py_XDECREF(j->columns);
    Py_XDECREF(j->cso);
    PyMem_Free(j);
}

static PyObject *parse_common(PyObject *args, int sequence) {
    pjob *j = pjob_new();
    if (!j) return NULL;
    PyObject *result = NULL;
    if (pjob_prepare(j, args, sequence, 0) == 0) {
        Py_BEGIN_ALLOW_THREADS
        pjob_run(j);
        Py_END_ALLOW_THREADS
        result = pjob_finish_guarded(j);
    }
    pjob_free(j);
    return result;
}

static PyObject *py_parse_batch(PyObject *self, PyObject *args) { return parse_common(args, 0); }

static PyObject *py_parse_sequence_batch(PyObject *self, PyObject *args) { return parse_common(args, 1); }

/* ------------------------------------------------------------------ parse pool
 *
 * ParsePool(threads): batches parsed on native threads that never take the GIL. submit()
 * prepares a batch with the GIL (pjob_prepare) and queues it; a pool thread runs the parse
 * and the CRCs (pjob_run); take() builds the oldest batch's result (pjob_finish) in the
 * caller's thread, after waiting for its parse (GIL released), or after parsing it itself
 * when no pool thread has started it. So the caller keeps the GIL and makes every batch's
 * objects (the serial part) while the pool parses the batches behind, and the caller parses
 * too when it has time. Sized one thread fewer than the cores: a third busy thread on two
 * cores took the caller's core away from it about a third of the time. */
typedef struct pslot {
    pjob *job;
    int state; /* 0 queued, 1 running, 2 parsed */
    struct pslot *next;
} pslot;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t work; /* a batch was queued, or stop */
    pthread_cond_t done; /* a batch was parsed */
    pslot *head, *tail;  /* batches not taken yet, in submission order */
    size_t queued;       /* of them, not yet picked up by a thread */
    int nthreads, started, stop, closed, inited;
    int taking; /* a take() is waiting or parsing (GIL released): it frees what close() left */
    int joined; /* close() has joined the threads: nothing is parsed any more */
    pthread_t *threads;
    pid_t pid; /* the process whose threads these are */
    unsigned long long busy_ns; /* time spent parsing, all threads (the caller's too), under mu */
    unsigned long long caller_ns; /* of it, by take()'s caller */
} ParsePoolObject;

/* The oldest batch from `from` on that no thread has started, or NULL (the lock held). */
static pslot *pp_next_queued(ParsePoolObject *p, pslot *from) {
    if (!p->queued) return NULL;
    while (from && from->state != 0) from = from->next;
    return from;
}

/* Parse batch `s` in this thread: called and returns with the lock held, released meanwhile. */
static void pp_parse(ParsePoolObject *p, pslot *s, int caller) {
    struct timespec t0, t1;
    s->state = 1;
    p->queued--;
    pthread_mutex_unlock(&p->mu);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pjob_run(s->job);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_mutex_lock(&p->mu);
    unsigned long long ns = (unsigned long long)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
    p->busy_ns += ns;
    if (caller) p->caller_ns += ns;
    s->state = 2;
    pthread_cond_broadcast(&p->done);
}

static void *pool_thread(void *arg) {
    ParsePoolObject *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->queued) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        pp_parse(p, pp_next_queued(p, p->head), 0);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static int pp_init(ParsePoolObject *p, PyObject *args, PyObject *kw) {
    int n;
    static char *names[] = {"threads", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i:ParsePool", names, &n)) return -1;
    if (p->inited) {
        PyErr_SetString(PyExc_RuntimeError, "ParsePool is already initialised");
        return -1;
    }
    if (n < 1 || n > 256) {
        PyErr_Format(PyExc_ValueError, "threads must be 1 to 256, got %d", n);
        return -1;
    }
    p->threads = PyMem_Calloc((size_t)n, sizeof(pthread_t));
    if (!p->threads) {
        PyErr_NoMemory();
        return -1;
    }
    if (pthread_mutex_init(&p->mu, NULL) || pthread_cond_init(&p->work, NULL) || pthread_cond_init(&p->done, NULL)) {
        PyErr_SetString(PyExc_OSError, "ParsePool: cannot make its lock");
        return -1;
    }
    p->nthreads = n;
    p->pid = getpid();
    p->inited = 1;
    return 0;
}

static int pp_usable(ParsePoolObject *p) {
    if (!p->inited) {
        PyErr_SetString(PyExc_RuntimeError, "ParsePool is not initialised");
        return 0;
    }
    if (p->pid != getpid()) { /* its threads stayed in the parent */
        PyErr_SetString(PyExc_RuntimeError, "a ParsePool cannot be used in a forked child; make one there");
        return 0;
    }
    if (p->closed) {
        PyErr_SetString(PyExc_RuntimeError, "the ParsePool is closed");
        return 0;
    }
    return 1;
}

/* submit(spec, records, offsets, lengths, bytes_as_buffer, crcs=None, which=None): parse_batch's
 * arguments; the batch is parsed behind, take() returns its result. */
static PyObject *pp_submit(ParsePoolObject *p, PyObject *args) {
    if (!pp_usable(p)) return NULL;
    pslot *s = PyMem_Calloc(1, sizeof(pslot));
    pjob *j = s ? pjob_new() : NULL;
    if (!j) {
        PyMem_Free(s);
        return s ? NULL : PyErr_NoMemory();
    }
    if (pjob_prepare(j, args, 0, 1) < 0 || !pp_usable(p)) { /* prepare ran Python code: closed? */
        pjob_free(j);
        PyMem_Free(s);
        return NULL;
    }
    s->job = j;
    if (p->started < p->nthreads) {
        /* the threads take no signal (a Ctrl-C is the main thread's to see): they start with
         * every signal blocked, this thread's mask restored after */
        sigset_t all, before;
        sigfillset(&all);
        /* faults stay deliverable: blocked, a SIGBUS (a shard truncated under its mapping) or a
         * SIGSEGV would kill the process without Python's fault handler seeing it */
        int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};
        for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) sigdelset(&all, faults[k]);
        pthread_sigmask(SIG_SETMASK, &all, &before);
        int failed = 0;
        for (; p->started < p->nthreads; p->started++)
            if (pthread_create(&p->threads[p->started], NULL, pool_thread, p) != 0) {
                failed = 1;
                break;
            }
        pthread_sigmask(SIG_SETMASK, &before, NULL);
        if (failed && !p->started) {
            pjob_free(j);
            PyMem_Free(s);
            PyErr_SetString(PyExc_OSError, "ParsePool: cannot start a thread");
            return NULL;
        }
        p->nthreads = p->started; /* fewer threads than asked: still correct */
    }
    pthread_mutex_lock(&p->mu);
    if (p->tail) p->tail->next = s;
    else p->head = s;
    p->tail = s;
    p->queued++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    Py_RETURN_NONE;
}

static void pp_drop(ParsePoolObject *p);

/* take() -> (columns, error): the oldest submitted batch's result, as parse_batch returns it. */
static PyObject *pp_take(ParsePoolObject *p, PyObject *noargs) {
    if (!pp_usable(p)) return NULL;
    if (p->taking) { /* that take holds the oldest batch (one consumer: see the type's doc) */
        PyErr_SetString(PyExc_RuntimeError, "take: another thread's take() is waiting on this ParsePool");
        return NULL;
    }
    pslot *s = p->head;
    if (!s) {
        PyErr_SetString(PyExc_IndexError, "take: no batch was submitted");
        return NULL;
    }
    /* The GIL is never waited for with the lock held (the lock is held with the GIL only
     * briefly, and pool threads never take the GIL). While the oldest batch is not parsed,
     * this thread parses the oldest one no thread has started (that batch or a later one)
     * rather than wait: the caller's thread is one of the parsers. */
    pthread_mutex_lock(&p->mu);
    int ready = s->state == 2;
    pthread_mutex_unlock(&p->mu);
    if (!ready) {
        p->taking = 1;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&p->mu);
        while (s->state != 2) {
            pslot *q = pp_next_queued(p, s); /* the oldest no thread has started: this one, or one behind */
            if (q) pp_parse(p, q, 1);
            else pthread_cond_wait(&p->done, &p->mu);
        }
        pthread_mutex_unlock(&p->mu);
        Py_END_ALLOW_THREADS
        p->taking = 0;
    }
    pthread_mutex_lock(&p->mu);
    p->head = s->next;
    if (!p->head) p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    PyObject *result = pjob_finish_guarded(s->job);
    pjob_free(s->job);
    PyMem_Free(s);
    if (p->joined) pp_drop(p); /* closed from another thread while this one waited */
    return result;
}

/* Free every batch not taken (with the GIL; no thread is parsing any of them). In a forked
 * child, a batch a parent's thread was parsing at the fork is left as it is (its outputs may be
 * half updated): a leak, not a double free. */
static void pp_drop(ParsePoolObject *p) {
    int child = p->pid != getpid();
    for (pslot *s = p->head; s;) {
        pslot *next = s->next;
        if (!(child && s->state == 1)) {
            pjob_free(s->job);
            PyMem_Free(s);
        }
        s = next;
    }
    p->head = p->tail = NULL;
    p->queued = 0;
}

/* Stop and join the threads (a batch being parsed is finished first), drop every batch not
 * taken: now, or, when another thread's take() is waiting or parsing, once it is done (it
 * parses its batch itself if no thread had started it). Idempotent. */
static void pp_stop(ParsePoolObject *p) {
    if (!p->inited || p->closed) return;
    p->closed = 1;
    if (p->pid == getpid()) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
        Py_BEGIN_ALLOW_THREADS
        for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
        Py_END_ALLOW_THREADS
        /* a take() in another thread may have ended while these were joined: it left the
         * batches to this (it cannot free what a pool thread may still be parsing) */
    } else {
        /* a forked child: the threads are the parent's; the jobs' buffers are copies, freed */
        pthread_mutex_init(&p->mu, NULL);
    }
    p->joined = 1;
    if (!p->taking) pp_drop(p);
}

static PyObject *pp_close(ParsePoolObject *p, PyObject *noargs) {
    pp_stop(p);
    Py_RETURN_NONE;
}

static PyObject *pp_pending(ParsePoolObject *p, void *closure) {
    size_t k = 0;
    for (pslot *s = p->head; s; s = s->next) k++;
    return PyLong_FromSize_t(k);
}

static PyObject *pp_threads(ParsePoolObject *p, void *closure) { return PyLong_FromLong(p->nthreads); }

static void pp_dealloc(ParsePoolObject *p) {
    pp_stop(p);
    if (p->inited && p->pid == getpid()) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
    }
    PyMem_Free(p->threads);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef pp_methods[] = {
    {"submit", (PyCFunction)pp_submit, METH_VARARGS,
     "submit(spec, records, offsets, lengths, bytes_as_buffer, crcs=None, which=None) -> None: parse_batch's "
     "arguments; the batch is parsed on a pool thread."},
    {"take", (PyCFunction)pp_take, METH_NOARGS,
     "take() -> (columns, error): the oldest submitted batch's result, as parse_batch gives it (waits for it)."},
    {"close", (PyCFunction)pp_close, METH_NOARGS, "close() -> None: join the threads, drop batches not taken."},
    {NULL, NULL, 0, NULL},
};

/* (seconds parsing on all threads, of them on take()'s caller) */
static PyObject *pp_busy(ParsePoolObject *p, void *closure) {
    unsigned long long ns = 0, caller = 0;
    (void)closure;
    if (p->inited) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&p->mu);
        ns = p->busy_ns;
        caller = p->caller_ns;
        pthread_mutex_unlock(&p->mu);
        Py_END_ALLOW_THREADS
    }
    return Py_BuildValue("(dd)", (double)ns / 1e9, (double)caller / 1e9);
}

static PyGetSetDef pp_getset[] = {
    {"busy", (getter)pp_busy, NULL, "(seconds spent parsing summed over the threads, of them by take()'s caller)",
     NULL},
    {"pending", (getter)pp_pending, NULL, "batches submitted and not taken yet", NULL},
    {"threads", (getter)pp_threads, NULL, "the pool's threads", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ParsePoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfeed._native.ParsePool",
    .tp_basicsize = sizeof(ParsePoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ParsePool(threads): Example batches parsed on native threads that never take the GIL; results "
              "taken in submission order. Not thread-safe: one consumer thread uses it.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pp_init,
    .tp_dealloc = (destructor)pp_dealloc,
    .tp_methods = pp_methods,
    .tp_getset = pp_getset,
};

static PyObject *validate(PyObject *arg, int (*check)(const uint8_t *, size_t, sf_error *)) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    sf_error err;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = check(view.buf, (size_t)view.len, &err);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    if (!rc) Py_RETURN_NONE;
    if (err.kind == SF_ERR_NOMEM) return PyErr_NoMemory();
    return PyUnicode_FromString(err.msg);
}

/* validate_example(buf) -> None or the DecodeError message (for tests and fuzzing) */
static PyObject *py_validate_example(PyObject *self, PyObject *arg) { return validate(arg, sf_validate_example); }

static PyObject *py_validate_sequence_example(PyObject *self, PyObject *arg) {
    return validate(arg, sf_validate_sequence_example);
}

/* ------------------------------------------------------------------ gather */

/* gather(dst, dst_offsets, src, src_offsets, lengths) -> int: copy n byte ranges
 * src[src_offsets[k] : + lengths[k]] to dst[dst_offsets[k] : + lengths[k]] (the offsets
 * and lengths: int64 buffers of n items each). Every range is checked against both
 * buffers before anything is copied; returns n, or the index of the first range that
 * does not fit (nothing copied then). */
static PyObject *py_gather(PyObject *self, PyObject *args) {
    Py_buffer dst, doff, src, soff, lens;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*:gather", &dst, &doff, &src, &soff, &lens)) return NULL;
    Py_ssize_t n = lens.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t bad = -1;
    if (doff.len != lens.len || soff.len != lens.len || lens.len % (Py_ssize_t)sizeof(int64_t)) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&doff);
        PyBuffer_Release(&src);
        PyBuffer_Release(&soff);
        PyBuffer_Release(&lens);
        PyErr_SetString(PyExc_ValueError, "gather: offsets and lengths must be int64 arrays of one length");
        return NULL;
    }
    const int64_t *d = doff.buf, *s = soff.buf, *l = lens.buf;
    uint64_t total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (l[k] < 0 || d[k] < 0 || s[k] < 0 || (uint64_t)l[k] > (uint64_t)dst.len ||
            (uint64_t)d[k] > (uint64_t)dst.len - (uint64_t)l[k] || (uint64_t)l[k] > (uint64_t)src.len ||
            (uint64_t)s[k] > (uint64_t)src.len - (uint64_t)l[k]) {
            bad = k;
            break;
        }
        total += (uint64_t)l[k];
    }
    if (bad < 0) {
        uint8_t *out = dst.buf;
        const uint8_t *in = src.buf;
        if (total >= GIL_FREE_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t k = 0; k < n; k++) memcpy(out + d[k], in + s[k], (size_t)l[k]);
            Py_END_ALLOW_THREADS
        } else {
            for (Py_ssize_t k = 0; k < n; k++) memcpy(out + d[k], in + s[k], (size_t)l[k]);
        }
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&doff);
    PyBuffer_Release(&src);
    PyBuffer_Release(&soff);
    PyBuffer_Release(&lens);
    return PyLong_FromSsize_t(bad < 0 ? n : bad);
}

/* resample(src, sh, sw, sc, dst, th, tw, dc, scaled_h, scaled_w, top, left, filter) -> None:
 * src (sh x sw x sc uint8, C order) resized to scaled_h x scaled_w as Pillow's resize does,
 * the window at (top, left) of th x tw written to dst (th x tw x dc uint8); see resample.h. */
static PyObject *py_resample(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int sh, sw, sc, th, tw, dc, scaled_h, scaled_w, top, left, filter, rc;
    if (!PyArg_ParseTuple(args, "y*iiiw*iiiiiiii:resample", &src, &sh, &sw, &sc, &dst, &th, &tw, &dc, &scaled_h,
                          &scaled_w, &top, &left, &filter))
        return NULL;
    /* divided, not multiplied: sh * sw * sc of three ints can pass PY_SSIZE_T_MAX and wrap */
    if (sh <= 0 || sw <= 0 || th <= 0 || tw <= 0 || sc <= 0 || dc <= 0 ||
        src.len / sc / sw < sh || dst.len / dc / tw < th) {
        rc = -1;
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = sf_resample(src.buf, sh, sw, sc, dst.buf, th, tw, dc, scaled_h, scaled_w, top, left, filter);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (rc == -2) return PyErr_NoMemory();
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, "resample: bad sizes, channels, window or filter");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* pool_array(nbytes) -> 1-D uint8 array, uninitialised, backed by a recycled block when large
 * (bufpool.h): for batch outputs that would otherwise page-fault in fresh memory. */
static PyObject *py_pool_array(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "pool_array: nbytes must be >= 0");
        return NULL;
    }
    return sf_pool_array((size_t)n);
}

static PyObject *py_resample_backend(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(sf_resample_backend());
}

/* ------------------------------------------------------------------ image headers */

static PyObject *py_image_check(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    sf_imginfo info;
    const char *err;
    if (view.len >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS err = sf_image_check(view.buf, (size_t)view.len, &info);
        Py_END_ALLOW_THREADS
    } else {
        err = sf_image_check(view.buf, (size_t)view.len, &info);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(ikkiiiiizn)", info.format, (unsigned long)info.width, (unsigned long)info.height,
                         info.components, info.color_type, info.bit_depth, info.orientation, info.flags, err,
                         (Py_ssize_t)info.error_offset);
}

static PyObject *py_jpeg_scans(PyObject *self, PyObject *args) {
    Py_buffer view;
    int stop_after;
    if (!PyArg_ParseTuple(args, "y*i:jpeg_scans", &view, &stop_after)) return NULL;
    uint32_t w, h;
    int scans;
    if (view.len >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS scans = sf_jpeg_scans(view.buf, (size_t)view.len, stop_after, &w, &h);
        Py_END_ALLOW_THREADS
    } else {
        scans = sf_jpeg_scans(view.buf, (size_t)view.len, stop_after, &w, &h);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(ikk)", scans, (unsigned long)w, (unsigned long)h);
}

/* ------------------------------------------------------------------ image-folder rows */

/* image_rows(paths, tails, max_sizes, want, max_pixels) -> (frames, results): the rows of a
 * chunk of an image-folder conversion read, judged and framed here (imgrows.h), the GIL
 * released for the files and the framing. paths[i]: the local path of row i (str; its UTF-8 is
 * also the record's image/source_id), or None for a row the general path converts; tails[i]:
 * bytes, the row's label entries; max_sizes[i]: int, 0 for no limit; want: 1 JPEG, 2 PNG.
 * frames: a pooled uint8 array, the frames of the kept rows in row order; results[i]: the
 * record's length (kept), why it is discarded (("empty", 0, 0), ("corrupt", message, byte
 * offset), ("bomb", width, height): convert/images.py words it), or None (the general path
 * decides: not judged here, or a file that could not be read here). */
typedef struct {
    const char *path;
    const uint8_t *tail;
    size_t tail_n, path_n, off, n;
    int64_t max_size;
    int status;
    int read_ok;
    sf_imginfo info;
    const char *err;
} imgrow;

typedef struct {
    uint8_t *p;
    size_t len, cap;
} arena;

static int arena_reserve(arena *a, size_t more) {
    if (a->cap - a->len >= more) return 0;
    size_t cap = a->cap ? a->cap : ((size_t)1 << 20);
    while (cap - a->len < more) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    uint8_t *p = realloc(a->p, cap);
    if (p == NULL) return -1;
    a->p = p;
    a->cap = cap;
    return 0;
}

/* the whole regular file at path appended to the arena; -1 when it cannot be (no file, not a
 * regular file, a read error, out of memory: the general path then says why) */
static int read_file_into(const char *path, arena *a, size_t *off, size_t *n) {
#ifdef _WIN32
    (void)path, (void)a, (void)off, (void)n;
    return -1; /* the general path reads every file */
#else
    /* O_NONBLOCK: a FIFO must not block here; O_NOCTTY: a terminal must not become ours */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 0) {
        close(fd);
        return -1;
    }
    size_t start = a->len, got = 0, want = (size_t)st.st_size + 1; /* +1: see the end at once */
    for (;;) {
        if (arena_reserve(a, got + want) < 0) {
            close(fd);
            a->len = start;
            return -1;
        }
        ssize_t r = read(fd, a->p + start + got, a->cap - start - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            close(fd);
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
        want = 1 << 16; /* a file that grew */
    }
    close(fd);
    a->len = start + got;
    *off = start;
    *n = got;
    return 0;
#endif
}

static PyObject *py_image_rows(PyObject *self, PyObject *args) {
    PyObject *paths, *tails, *sizes;
    int want;
    long long max_pixels;
    if (!PyArg_ParseTuple(args, "O!O!O!iL:image_rows", &PyList_Type, &paths, &PyList_Type, &tails, &PyList_Type,
                          &sizes, &want, &max_pixels))
        return NULL;
    Py_ssize_t nrow = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(tails) != nrow || PyList_GET_SIZE(sizes) != nrow) {
        PyErr_SetString(PyExc_ValueError, "image_rows: paths, tails and max_sizes must have the same length");
        return NULL;
    }
    if (want != SF_IMG_JPEG && want != SF_IMG_PNG) {
        PyErr_Format(PyExc_ValueError, "image_rows: want must be 1 (JPEG) or 2 (PNG), got %d", want);
        return NULL;
    }
    /* our own references: the lists may change while the GIL is released */
    PyObject *held = PyTuple_New(2 * nrow);
    imgrow *rows = PyMem_Calloc(nrow ? (size_t)nrow : 1, sizeof(imgrow));
    if (held == NULL || rows == NULL) {
        Py_XDECREF(held);
        PyMem_Free(rows);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nrow; i++) {
        PyObject *p = PyList_GET_ITEM(paths, i), *t = PyList_GET_ITEM(tails, i), *m = PyList_GET_ITEM(sizes, i);
        imgrow *r = &rows[i];
        Py_INCREF(p);
        Py_INCREF(t);
        PyTuple_SET_ITEM(held, 2 * i, p);
        PyTuple_SET_ITEM(held, 2 * i + 1, t);
        if (!PyBytes_Check(t) || !PyLong_Check(m) || (p != Py_None && !PyUnicode_Check(p))) {
            PyErr_Format(PyExc_TypeError, "image_rows: row %zd: want a str or None path, bytes tail and int max_size", i);
            goto fail;
        }
        r->max_size = PyLong_AsLongLong(m);
        if (r->max_size == -1 && PyErr_Occurred()) goto fail;
        r->tail = (const uint8_t *)PyBytes_AS_STRING(t);
        r->tail_n = (size_t)PyBytes_GET_SIZE(t);
        r->status = SF_ROW_PYTHON;
        if (p == Py_None) continue;
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(p, &len);
        if (u == NULL) { /* not encodable (a surrogate-escaped name): the general path says so */
            PyErr_Clear();
            continue;
        }
        if (len == 0 || strlen(u) != (size_t)len) continue; /* empty, or an embedded NUL */
        r->path = u;
        r->path_n = (size_t)len;
    }
    arena a = {NULL, 0, 0};
    size_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nrow; i++) {
        imgrow *r = &rows[i];
        if (r->path == NULL) continue;
        r->read_ok = read_file_into(r->path, &a, &r->off, &r->n) == 0;
    }
    for (Py_ssize_t i = 0; i < nrow; i++) {
        imgrow *r = &rows[i];
        if (!r->read_ok) continue;
        r->status = sf_imgrow_judge(a.p + r->off, r->n, want, r->max_size, max_pixels, &r->info, &r->err);
        if (r->status == SF_ROW_KEPT)
            total += sf_imgrow_record_size(r->n, r->info.width, r->info.height, r->path_n, r->tail_n, want) + 16;
    }
    Py_END_ALLOW_THREADS
    PyObject *results = PyList_New(nrow);
    PyObject *out = results != NULL ? sf_pool_array(total) : NULL;
    if (out == NULL) goto fail_arena;
    for (Py_ssize_t i = 0; i < nrow; i++) {
        imgrow *r = &rows[i];
        PyObject *v;
        switch (r->status) {
        case SF_ROW_KEPT:
            v = PyLong_FromSize_t(sf_imgrow_record_size(r->n, r->info.width, r->info.height, r->path_n, r->tail_n, want));
            break;
        /* why a row is discarded; convert/images.py words it, as for the Python path */
        case SF_ROW_EMPTY:
            v = Py_BuildValue("(sii)", "empty", 0, 0);
            break;
        case SF_ROW_CORRUPT:
            v = Py_BuildValue("(ssn)", "corrupt", r->err, (Py_ssize_t)r->info.error_offset);
            break;
        case SF_ROW_BOMB:
            v = Py_BuildValue("(skk)", "bomb", (unsigned long)r->info.width, (unsigned long)r->info.height);
            break;
        default:
            v = Py_None;
            Py_INCREF(v);
        }
        if (v == NULL) goto fail_arena;
        PyList_SET_ITEM(results, i, v);
    }
    uint8_t *dst = (uint8_t *)PyArray_DATA((PyArrayObject *)out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nrow; i++) {
        imgrow *r = &rows[i];
        if (r->status == SF_ROW_KEPT)
            dst = sf_imgrow_frame(dst, a.p + r->off, r->n, r->info.width, r->info.height, (const uint8_t *)r->path,
                                  r->path_n, r->tail, r->tail_n, want);
    }
    Py_END_ALLOW_THREADS
    free(a.p);
    PyMem_Free(rows);
    Py_DECREF(held);
    return Py_BuildValue("(NN)", out, results);
fail_arena:
    free(a.p);
    Py_XDECREF(results);
    Py_XDECREF(out);
fail:
    PyMem_Free(rows);
    Py_DECREF(held);
    return NULL;
}

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0) -> int: CRC-32C of data, continuing from value."},
    {"masked_crc32c", py_masked_crc32c, METH_O, "masked_crc32c(data) -> int: TFRecord's masked CRC-32C."},
    {"frame_records", py_frame_records, METH_VARARGS,
     "frame_records(records, pooled=False) -> bytes (or a pooled uint8 array): each record (bytes-like, or a "
     "list/tuple of its pieces) in a TFRecord frame"},
    {"crc_backend", py_crc_backend, METH_NOARGS, "crc_backend() -> str: 'sse4.2', 'armv8-crc' or 'table'."},
    {"scan_frames", py_scan_frames, METH_VARARGS,
     "scan_frames(buf, verify_crc=True, max_record_bytes=2**31-1, defer_data_crc=False) -> (offsets, lengths, "
     "consumed, error, error_offset[, crcs])"},
    {"set_large_objects_off_gil", py_set_large_objects_off_gil, METH_O,
     "set_large_objects_off_gil(on) -> bool: parse threads make object-form bytes values of 512 bytes or more "
     "themselves, without the GIL, where this build and the allocators allow; whether it is on now."},
    {"parse_batch", py_parse_batch, METH_VARARGS,
     "parse_batch(spec, records, offsets, lengths, bytes_as_buffer=False, crcs=None, which=None) -> (columns, error)"},
    {"parse_sequence_batch", py_parse_sequence_batch, METH_VARARGS,
     "parse_sequence_batch(spec, records, offsets, lengths, bytes_as_buffer=False, crcs=None, which=None) -> "
     "(columns, error)"},
    {"encode_example", sf_encode_example, METH_VARARGS,
     "encode_example(features, max_copy=-1) -> bytes or None: a tf.train.Example of a dict of common values, "
     "or None where formats/example_encode.py must encode it (or a lone bytes value is over max_copy)"},
    {"validate_example", py_validate_example, METH_O, "validate_example(buf) -> None or a DecodeError message"},
    {"validate_sequence_example", py_validate_sequence_example, METH_O,
     "validate_sequence_example(buf) -> None or a DecodeError message"},
    {"gather", py_gather, METH_VARARGS,
     "gather(dst, dst_offsets, src, src_offsets, lengths) -> int: ranges copied (n), or the first that does not fit"},
    {"gather_frames", sf_py_gather_frames, METH_VARARGS,
     "gather_frames(size, dst_offsets, sources, which, src_offsets, lengths, order, verify) -> (buffer, bad, code): "
     "a global shuffle's frames copied into one buffer, each checked (gatherframes.h)"},
    {"map_file", sf_map_file, METH_O,
     "map_file(path) -> MappedFile or b'': a read-only map of the whole file, keeping no descriptor open"},
    {"first_lost", py_first_lost, METH_VARARGS,
     "first_lost(buffer, offsets, lengths) -> int: the first record past where a truncated file's map is lost, or -1"},
    {"parse_index", sf_py_parse_index, METH_VARARGS,
     "parse_index(out, data) -> int: index file text into int64 pairs (-1: not well formed)"},
    {"plan_window", sf_py_plan_window, METH_VARARGS,
     "plan_window(ids, offsets, lengths, before, first, files, offs, lens, virtual, numbers) -> None: a global "
     "shuffle's window planned in one pass (permute.h)"},
    {"permute", sf_py_permute, METH_VARARGS,
     "permute(out, n, half, keys, first, step, positions=None) -> None: a window of pipeline/permute.py's "
     "permutation (permute.h)"},
    {"pack_bytes", sf_pack_bytes, METH_O,
     "pack_bytes(array) -> (data, offsets), or None when a value is not exactly bytes"},
    {"unpack_bytes", sf_unpack_bytes, METH_VARARGS, "unpack_bytes(data, offsets) -> 1-D object array of bytes"},
    {"pool_info", sf_pool_info, METH_NOARGS,
     "pool_info() -> (blocks, bytes, reused, allocated): the recycled batch-buffer pool"},
    {"pool_clear", sf_pool_clear, METH_NOARGS, "pool_clear() -> None: free the pooled batch buffers"},
    {"pool_trim", sf_pool_trim, METH_O,
     "pool_trim(max_idle) -> (seconds, in_use): free pooled blocks idle max_idle seconds or more; seconds until "
     "the next would be (-1.0: none held), blocks behind live arrays"},
    {"pool_array", py_pool_array, METH_O,
     "pool_array(nbytes) -> uint8 array, uninitialised; large ones backed by a recycled block"},
    {"jpeg_scans", py_jpeg_scans, METH_VARARGS,
     "jpeg_scans(data, stop_after) -> (scans, width, height): a JPEG's scans as a lenient decoder finds them, "
     "counted up to stop_after + 1, and its frame's size (imgcheck.h)"},
    {"image_check", py_image_check, METH_O,
     "image_check(data) -> (format, width, height, components, color_type, bit_depth, orientation, flags, error, "
     "error_offset): the structural check of a JPEG or PNG file (imgcheck.h)"},
    {"image_rows", py_image_rows, METH_VARARGS,
     "image_rows(paths, tails, max_sizes, want, max_pixels) -> (frames, results): image-folder rows read, judged "
     "and framed (imgrows.h)"},
    {"resample", py_resample, METH_VARARGS,
     "resample(src, sh, sw, sc, dst, th, tw, dc, scaled_h, scaled_w, top, left, filter) -> None: Pillow's resize"},
    {"resample_backend", py_resample_backend, METH_NOARGS,
     "resample_backend() -> str: 'avx512vnni', 'avx512', 'avx2', 'sse4.1' or 'scalar'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "shardfeed._native", "shardfeed's native core (private; use shardfeed.formats.native).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    import_array();
    sf_crc32c_init();
    sf_imgcheck_init();
    if (PyType_Ready(&CompiledSpecType) < 0 || PyType_Ready(&ParsePoolType) < 0 || sf_pool_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&CompiledSpecType);
    if (PyModule_AddObject(m, "CompiledSpec", (PyObject *)&CompiledSpecType) < 0) {
        Py_DECREF(&CompiledSpecType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ParsePoolType);
    if (PyModule_AddObject(m, "ParsePool", (PyObject *)&ParsePoolType) < 0) {
        Py_DECREF(&ParsePoolType);
        Py_DECREF(m);
        return NULL;
    }
    if (sf_mapfile_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

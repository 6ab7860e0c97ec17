/* Recycled memory for large batch buffers: see bufpool.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <time.h>

#define PY_ARRAY_UNIQUE_SYMBOL shardfeed_native_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#include "bufpool.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

#define POOL_MIN_BYTES ((size_t)1 << 20)   /* below this, numpy's own allocation is cheap */
#define POOL_MAX_BLOCKS 8                   /* a few batches in flight (prefetch, parse threads) */
#define POOL_MAX_BYTES ((size_t)512 << 20)  /* what the pool may hold while nobody uses it */
#define POOL_GRAIN ((size_t)1 << 16)

typedef struct {
    PyObject_HEAD void *p;
    size_t cap;
} BlockObject;

static struct {
    void *p;
    size_t cap;
    double since; /* monotonic seconds when it came back to the pool */
} pool[POOL_MAX_BLOCKS];
static size_t pool_n, pool_bytes, pool_reused, pool_allocated, pool_out; /* out: blocks behind live arrays */

/* Blocks are mapped in transparent huge pages where the kernel offers them (madvise mode):
 * a fresh 46 MB block then costs 23 page faults instead of 11,000 (the zeroing stays), and
 * the copy into it misses the TLB far less. */
#define HUGE_BYTES ((size_t)2 << 20)

static void *block_alloc(size_t cap) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, cap, MADV_HUGEPAGE); /* advice only: refused or unsupported leaves 4 KiB pages */
    return p;
#else
    return malloc(cap);
#endif
}

static void block_free(void *p, size_t cap) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    munmap(p, cap);
#else
    (void)cap;
    free(p);
#endif
}

/* CLOCK_MONOTONIC, as Python's time.monotonic() on Linux: the idle clock of pooled blocks. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void block_dealloc(BlockObject *self) {
    if (self->p) pool_out--;
    if (self->p && pool_n < POOL_MAX_BLOCKS && pool_bytes + self->cap <= POOL_MAX_BYTES) {
        pool[pool_n].p = self->p;
        pool[pool_n].cap = self->cap;
        pool[pool_n].since = now_s();
        pool_n++;
        pool_bytes += self->cap;
    } else if (self->p) {
        block_free(self->p, self->cap);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfeed._native.Block",
    .tp_basicsize = sizeof(BlockObject),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory behind a batch buffer; back to a small pool when the last array using it dies.",
};

/* The smallest pooled block that holds `need` without wasting more than half of itself. */
static void *take(size_t need, size_t *cap) {
    size_t best = pool_n;
    for (size_t i = 0; i < pool_n; i++)
        if (pool[i].cap >= need && pool[i].cap / 2 <= need && (best == pool_n || pool[i].cap < pool[best].cap))
            best = i;
    if (best == pool_n) return NULL;
    void *p = pool[best].p;
    *cap = pool[best].cap;
    pool_bytes -= pool[best].cap;
    pool[best] = pool[--pool_n];
    pool_reused++;
    return p;
}

PyObject *sf_pool_array(size_t nbytes) {
    npy_intp dims[1] = {(npy_intp)nbytes};
    if (nbytes < POOL_MIN_BYTES) return PyArray_SimpleNew(1, dims, NPY_UINT8);
    size_t cap = 0;
    void *p = take(nbytes, &cap);
    if (!p) {
        /* an eighth more than asked, so the next batch, a little larger, still fits */
        cap = nbytes + nbytes / 8;
        size_t grain = cap >= 4 * HUGE_BYTES ? HUGE_BYTES : POOL_GRAIN;
        cap = (cap + grain - 1) / grain * grain;
        p = block_alloc(cap);
        if (!p) return PyErr_NoMemory();
        pool_allocated++;
    }
    BlockObject *block = PyObject_New(BlockObject, &BlockType);
    if (!block) {
        block_free(p, cap);
        return NULL;
    }
    block->p = p;
    block->cap = cap;
    pool_out++;
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(NPY_UINT8), 1, dims, NULL, p,
                                         NPY_ARRAY_CARRAY, NULL);
    if (!arr || PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)block) < 0) {
        Py_XDECREF(arr);
        if (!arr) Py_DECREF(block); /* SetBaseObject steals the block even when it fails */
        return NULL;
    }
    return arr;
}

PyObject *sf_pool_info(PyObject *self, PyObject *unused) {
    return Py_BuildValue("nnnn", (Py_ssize_t)pool_n, (Py_ssize_t)pool_bytes, (Py_ssize_t)pool_reused,
                         (Py_ssize_t)pool_allocated);
}

PyObject *sf_pool_clear(PyObject *self, PyObject *unused) {
    while (pool_n) {
        pool_n--;
        block_free(pool[pool_n].p, pool[pool_n].cap);
    }
    pool_bytes = 0;
    Py_RETURN_NONE;
}

PyObject *sf_pool_trim(PyObject *self, PyObject *arg) {
    double max_idle = PyFloat_AsDouble(arg);
    if (max_idle == -1.0 && PyErr_Occurred()) return NULL;
    if (!(max_idle >= 0.0)) { /* NaN too */
        PyErr_SetString(PyExc_ValueError, "pool_trim: max_idle must be a number of seconds >= 0");
        return NULL;
    }
    double t = now_s(), next = -1.0;
    for (size_t i = 0; i < pool_n;) {
        double left = pool[i].since + max_idle - t;
        if (left <= 0.0) {
            block_free(pool[i].p, pool[i].cap);
            pool_bytes -= pool[i].cap;
            pool[i] = pool[--pool_n];
            continue;
        }
        if (next < 0.0 || left < next) next = left;
        i++;
    }
    return Py_BuildValue("dn", next, (Py_ssize_t)pool_out);
}

int sf_pool_init(void) { return PyType_Ready(&BlockType); }

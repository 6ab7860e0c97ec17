/* Object arrays of bytes packed into one buffer plus offsets, and back: see packbytes.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define PY_ARRAY_UNIQUE_SYMBOL shardfeed_native_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#include "bufpool.h"
#include "packbytes.h"

PyObject *sf_pack_bytes(PyObject *self, PyObject *arg) {
    if (!PyArray_Check(arg) || PyArray_TYPE((PyArrayObject *)arg) != NPY_OBJECT) {
        PyErr_SetString(PyExc_TypeError, "pack_bytes needs a numpy object array");
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_GETCONTIGUOUS((PyArrayObject *)arg);
    if (!arr) return NULL;
    npy_intp n = PyArray_SIZE(arr);
    PyObject **items = (PyObject **)PyArray_DATA(arr);
    size_t total = 0;
    for (npy_intp k = 0; k < n; k++) {
        if (!items[k] || !PyBytes_CheckExact(items[k])) {
            Py_DECREF(arr);
            Py_RETURN_NONE;
        }
        total += (size_t)PyBytes_GET_SIZE(items[k]);
    }
    npy_intp on = n + 1;
    PyObject *data = sf_pool_array(total);
    PyObject *offs = data ? PyArray_SimpleNew(1, &on, NPY_INT64) : NULL;
    if (!offs) {
        Py_XDECREF(data);
        Py_DECREF(arr);
        return NULL;
    }
    uint8_t *d = PyArray_DATA((PyArrayObject *)data);
    int64_t *o = PyArray_DATA((PyArrayObject *)offs);
    size_t pos = 0;
    o[0] = 0;
    for (npy_intp k = 0; k < n; k++) {
        size_t len = (size_t)PyBytes_GET_SIZE(items[k]);
        memcpy(d + pos, PyBytes_AS_STRING(items[k]), len);
        pos += len;
        o[k + 1] = (int64_t)pos;
    }
    Py_DECREF(arr);
    return Py_BuildValue("NN", data, offs);
}

PyObject *sf_unpack_bytes(PyObject *self, PyObject *args) {
    PyObject *data_obj, *offs_obj;
    if (!PyArg_ParseTuple(args, "OO:unpack_bytes", &data_obj, &offs_obj)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyArrayObject *offs = (PyArrayObject *)PyArray_FROMANY(offs_obj, NPY_INT64, 1, 1, NPY_ARRAY_IN_ARRAY);
    if (!offs) {
        PyBuffer_Release(&view);
        return NULL;
    }
    npy_intp count = PyArray_SIZE(offs) ? PyArray_SIZE(offs) - 1 : 0;
    const int64_t *o = PyArray_DATA(offs);
    PyObject *out = NULL;
    if (PyArray_SIZE(offs) == 0 || o[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0 and hold count + 1 entries");
        goto done;
    }
    for (npy_intp k = 0; k < count; k++) {
        if (o[k + 1] < o[k] || o[k + 1] > (int64_t)view.len) {
            PyErr_Format(PyExc_ValueError, "offsets[%zd] = %lld: outside the %zd bytes of data or decreasing",
                         (Py_ssize_t)(k + 1), (long long)o[k + 1], view.len);
            goto done;
        }
    }
    out = PyArray_SimpleNew(1, &count, NPY_OBJECT);
    if (!out) goto done;
    PyObject **items = (PyObject **)PyArray_DATA((PyArrayObject *)out);
    const char *d = (const char *)view.buf;
    for (npy_intp k = 0; k < count; k++) {
        PyObject *b = PyBytes_FromStringAndSize(d + o[k], (Py_ssize_t)(o[k + 1] - o[k]));
        if (!b) {
            Py_CLEAR(out);
            goto done;
        }
        Py_XSETREF(items[k], b);
    }
done:
    Py_DECREF(offs);
    PyBuffer_Release(&view);
    return out;
}

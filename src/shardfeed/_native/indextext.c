/* Index files parsed in C: see indextext.h. SF_INDEXTEXT_NO_PYTHON leaves the binding out
 * (the fuzz harness links the C alone). */
#ifndef SF_INDEXTEXT_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
#include <stdint.h>

#include "indextext.h"

#define LIMIT ((uint64_t)INT64_MAX) /* offset + length at most this (below 2^63): the Python check */

int64_t sf_parse_index(const char *data, size_t len, int64_t *out, size_t cap) {
    size_t i = 0, pairs = 0;
    uint64_t v[2];
    int have = 0, in_number = 0;
    for (;; i++) {
        char c = i < len ? data[i] : '\n'; /* the text's end closes its last line */
        if (c >= '0' && c <= '9') {
            if (!in_number) {
                if (have == 2) return -1; /* a third number on the line */
                v[have] = 0;
                in_number = 1;
            }
            uint64_t d = (uint64_t)(c - '0');
            if (v[have] > (LIMIT - d) / 10) return -1;
            v[have] = v[have] * 10 + d;
            continue;
        }
        if (in_number) {
            in_number = 0;
            have++;
        }
        if (c == ' ') continue;
        if (c != '\n') return -1;
        if (have == 2) {
            if (v[1] < 16 || v[0] > LIMIT - v[1] || pairs >= cap) return -1;
            out[2 * pairs] = (int64_t)v[0];
            out[2 * pairs + 1] = (int64_t)v[1];
            pairs++;
        } else if (have == 1) {
            return -1;
        }
        have = 0;
        if (i >= len) break;
    }
    return (int64_t)pairs;
}

#ifndef SF_INDEXTEXT_NO_PYTHON
PyObject *sf_py_parse_index(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer out, data;
    if (!PyArg_ParseTuple(args, "w*y*", &out, &data)) return NULL;
    PyObject *result = NULL;
    if (out.len % (Py_ssize_t)(2 * sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "parse_index: out must hold int64 pairs");
        goto done;
    }
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = sf_parse_index((const char *)data.buf, (size_t)data.len, (int64_t *)out.buf,
                       (size_t)out.len / (2 * sizeof(int64_t)));
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(n);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}
#endif

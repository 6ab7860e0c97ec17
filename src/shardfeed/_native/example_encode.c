/* encode_example(features, max_copy=-1) -> bytes or None: a tf.train.Example serialized here, byte for
 * byte as shardfeed/formats/example_encode.py writes it (map entries in the dict's order),
 * for the values a converter makes: ints, floats, str and bytes scalars (numpy's numeric
 * scalars too), numeric numpy arrays, and lists of str/bytes, of ints or of floats. Any
 * other value, or one the Python encoder would refuse (an int outside int64, a str that is
 * not UTF-8), answers None, and the caller encodes in Python, which writes the same bytes or
 * raises its own error naming the feature. So does a lone bytes value longer than
 * `max_copy` (when given): the Python encoder hands such a value (an image) to the framing
 * as a piece of its own, copied once, where this one would copy it twice.
 *
 * Two passes over the dict: the first checks each value and sizes its Feature (every length
 * prefix is known before a byte is written), the second writes into one bytes object of the
 * exact size. No Python code runs between the passes (no __index__, no __float__ of a user's
 * class: only exact types are read, numpy's scalars from their storage, never a subclass),
 * so the dict cannot change and the borrowed references of the first pass stay valid in the
 * second.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL shardfeed_native_ARRAY_API
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>

#include "example_encode.h"

enum {
    K_EMPTY,      /* an empty list: a Feature with no kind */
    K_INT,        /* one int64 */
    K_FLOAT,      /* one float32 */
    K_BYTES,      /* one bytes value (a str as UTF-8) */
    K_INT_ARRAY,  /* a numpy array read as int64 */
    K_FLOAT_ARRAY,
    K_INT_LIST,   /* a list or tuple of ints */
    K_FLOAT_LIST, /* a list or tuple of floats */
    K_BYTES_LIST  /* a list or tuple of str/bytes */
};

typedef struct {
    const char *key;
    Py_ssize_t klen;
    int kind;
    int64_t ival;
    float fval;
    const char *data; /* K_BYTES */
    Py_ssize_t len;
    PyObject *obj;    /* arrays and lists: borrowed */
    Py_ssize_t n;     /* values */
    Py_ssize_t payload; /* packed payload (ints, floats) or BytesList content (bytes) */
    Py_ssize_t flen;  /* the Feature message */
    Py_ssize_t elen;  /* the map entry's content */
} item_t;

#define STACK_ITEMS 32

static inline Py_ssize_t vlen(uint64_t v) {
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *wvar(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* 1 and the value, 0 when `o` is not an int the Python encoder stores as int64 here. Exact
 * types only, numpy's scalars read from their storage: a subclass's __index__ or __float__
 * would run Python code between the passes (and could change the dict being encoded). */
static int exact_int(PyObject *o, int64_t *out) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyBool_Type) {
        *out = o == Py_True;
        return 1;
    }
    if (t == &PyLong_Type) { /* an exact int: no Python code runs */
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        *out = v;
        return 1;
    }
    if (t == &PyBoolArrType_Type) *out = PyArrayScalar_VAL(o, Bool) != 0;
    else if (t == &PyByteArrType_Type) *out = PyArrayScalar_VAL(o, Byte);
    else if (t == &PyUByteArrType_Type) *out = PyArrayScalar_VAL(o, UByte);
    else if (t == &PyShortArrType_Type) *out = PyArrayScalar_VAL(o, Short);
    else if (t == &PyUShortArrType_Type) *out = PyArrayScalar_VAL(o, UShort);
    else if (t == &PyIntArrType_Type) *out = PyArrayScalar_VAL(o, Int);
    else if (t == &PyUIntArrType_Type) *out = PyArrayScalar_VAL(o, UInt);
    else if (t == &PyLongArrType_Type) *out = PyArrayScalar_VAL(o, Long);
    else if (t == &PyLongLongArrType_Type) *out = PyArrayScalar_VAL(o, LongLong);
    else if (t == &PyULongArrType_Type || t == &PyULongLongArrType_Type) {
        unsigned long long u = t == &PyULongArrType_Type ? (unsigned long long)PyArrayScalar_VAL(o, ULong)
                                                         : (unsigned long long)PyArrayScalar_VAL(o, ULongLong);
        if (u > (unsigned long long)INT64_MAX) return 0; /* the Python encoder's range error */
        *out = (int64_t)u;
    } else
        return 0;
    return 1;
}

static int exact_float(PyObject *o, float *out) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyFloat_Type) {
        *out = (float)PyFloat_AS_DOUBLE(o);
        return 1;
    }
    if (t == &PyDoubleArrType_Type) {
        *out = (float)PyArrayScalar_VAL(o, Double);
        return 1;
    }
    if (t == &PyFloatArrType_Type) {
        *out = PyArrayScalar_VAL(o, Float);
        return 1;
    }
    return 0;
}

/* A str's UTF-8 or a bytes object's data; 0 for anything else (or a str with lone
 * surrogates: the Python encoder names the feature in its error). */
static int exact_bytes(PyObject *o, const char **data, Py_ssize_t *len) {
    if (PyBytes_CheckExact(o)) {
        *data = PyBytes_AS_STRING(o);
        *len = PyBytes_GET_SIZE(o);
        return 1;
    }
    if (PyUnicode_CheckExact(o)) {
        *data = PyUnicode_AsUTF8AndSize(o, len);
        if (*data == NULL) {
            PyErr_Clear();
            return 0;
        }
        return 1;
    }
    return 0;
}

/* numpy integer (and bool) arrays read as int64: code = item size, negative for signed
 * types; 0 for a type read elsewhere (uint64 needs the Python encoder's range check). */
static int array_int_code(PyArrayObject *a) {
    int size = (int)PyArray_ITEMSIZE(a);
    if (PyArray_ISBOOL(a)) return 1;
    if (!PyArray_ISINTEGER(a) || (size != 1 && size != 2 && size != 4 && size != 8)) return 0;
    if (PyArray_ISSIGNED(a)) return -size;
    return size == 8 ? 0 : size;
}

/* One value of a numpy integer array (code: array_int_code); read with memcpy, as an array
 * may be unaligned (a view at an odd offset). */
static inline int64_t array_int(const char *p, int code) {
    switch (code) {
    case 1: return *(const uint8_t *)p; /* bool is one byte, 0 or 1 */
    case -1: return *(const int8_t *)p;
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case -2: { int16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    case -4: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

/* Size the value of `it` (its key already set); 0: not a value encoded here (nor a lone
 * bytes value longer than `max_copy`, when that is not negative). */
static int size_value(item_t *it, PyObject *v, Py_ssize_t max_copy) {
    if (exact_int(v, &it->ival)) {
        it->kind = K_INT;
        it->flen = 4 + vlen((uint64_t)it->ival);
        return 1;
    }
    if (exact_float(v, &it->fval)) {
        it->kind = K_FLOAT;
        it->flen = 8;
        return 1;
    }
    if (exact_bytes(v, &it->data, &it->len)) {
        if (max_copy >= 0 && it->len > max_copy) return 0;
        Py_ssize_t m = 1 + vlen((uint64_t)it->len) + it->len;
        it->kind = K_BYTES;
        it->flen = 1 + vlen((uint64_t)m) + m;
        return 1;
    }
    if (PyArray_CheckExact(v)) {
        PyArrayObject *a = (PyArrayObject *)v;
        int type = PyArray_TYPE(a), code;
        if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISNOTSWAPPED(a)) return 0;
        it->obj = v;
        it->n = PyArray_SIZE(a);
        if (type == NPY_FLOAT32 || type == NPY_FLOAT64) {
            it->kind = K_FLOAT_ARRAY;
            it->payload = 4 * it->n;
        } else if ((code = array_int_code(a)) != 0) {
            const char *p = PyArray_BYTES(a);
            Py_ssize_t step = PyArray_ITEMSIZE(a), total = 0;
            for (Py_ssize_t i = 0; i < it->n; i++, p += step) total += vlen((uint64_t)array_int(p, code));
            it->kind = K_INT_ARRAY;
            it->payload = total;
        } else {
            return 0;
        }
        Py_ssize_t inner = it->payload ? 1 + vlen((uint64_t)it->payload) + it->payload : 0;
        it->flen = 1 + vlen((uint64_t)inner) + inner;
        return 1;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        it->obj = v;
        it->n = n;
        if (n == 0) {
            it->kind = K_EMPTY;
            it->flen = 0;
            return 1;
        }
        const char *d;
        Py_ssize_t l, total = 0;
        int64_t iv;
        if (exact_bytes(items[0], &d, &l)) {
            for (Py_ssize_t i = 0; i < n; i++) {
                if (!exact_bytes(items[i], &d, &l)) return 0;
                total += 1 + vlen((uint64_t)l) + l;
            }
            it->kind = K_BYTES_LIST;
            it->payload = total;
            it->flen = 1 + vlen((uint64_t)total) + total;
            return 1;
        }
        if (PyFloat_CheckExact(items[0])) { /* floats only: a mix with ints goes to Python */
            for (Py_ssize_t i = 0; i < n; i++)
                if (!PyFloat_CheckExact(items[i])) return 0;
            it->kind = K_FLOAT_LIST;
            it->payload = 4 * n;
        } else if (PyLong_CheckExact(items[0]) || PyBool_Check(items[0])) {
            for (Py_ssize_t i = 0; i < n; i++) {
                if (!(PyLong_CheckExact(items[i]) || PyBool_Check(items[i])) || !exact_int(items[i], &iv)) return 0;
                total += vlen((uint64_t)iv);
            }
            it->kind = K_INT_LIST;
            it->payload = total;
        } else {
            return 0;
        }
        Py_ssize_t inner = 1 + vlen((uint64_t)it->payload) + it->payload;
        it->flen = 1 + vlen((uint64_t)inner) + inner;
        return 1;
    }
    return 0;
}

static uint8_t *write_floats_head(uint8_t *p, Py_ssize_t payload) {
    *p++ = 0x12; /* Feature.float_list */
    if (payload == 0) {
        *p++ = 0;
        return p;
    }
    p = wvar(p, (uint64_t)(1 + vlen((uint64_t)payload) + payload));
    *p++ = 0x0a; /* FloatList.value, packed */
    return wvar(p, (uint64_t)payload);
}

static uint8_t *write_ints_head(uint8_t *p, Py_ssize_t payload) {
    *p++ = 0x1a; /* Feature.int64_list */
    if (payload == 0) {
        *p++ = 0;
        return p;
    }
    p = wvar(p, (uint64_t)(1 + vlen((uint64_t)payload) + payload));
    *p++ = 0x0a; /* Int64List.value, packed */
    return wvar(p, (uint64_t)payload);
}

static uint8_t *write_value(uint8_t *p, const item_t *it) {
    switch (it->kind) {
    case K_EMPTY:
        return p;
    case K_INT: {
        Py_ssize_t n = vlen((uint64_t)it->ival);
        *p++ = 0x1a;
        *p++ = (uint8_t)(n + 2);
        *p++ = 0x0a;
        *p++ = (uint8_t)n;
        return wvar(p, (uint64_t)it->ival);
    }
    case K_FLOAT:
        *p++ = 0x12;
        *p++ = 6;
        *p++ = 0x0a;
        *p++ = 4;
        memcpy(p, &it->fval, 4); /* little-endian hosts only: see encode_example's caller */
        return p + 4;
    case K_BYTES: {
        Py_ssize_t m = 1 + vlen((uint64_t)it->len) + it->len;
        *p++ = 0x0a; /* Feature.bytes_list */
        p = wvar(p, (uint64_t)m);
        *p++ = 0x0a; /* BytesList.value */
        p = wvar(p, (uint64_t)it->len);
        memcpy(p, it->data, (size_t)it->len);
        return p + it->len;
    }
    case K_FLOAT_ARRAY: {
        PyArrayObject *a = (PyArrayObject *)it->obj;
        p = write_floats_head(p, it->payload);
        if (PyArray_TYPE(a) == NPY_FLOAT32) {
            memcpy(p, PyArray_DATA(a), (size_t)(4 * it->n));
            return p + 4 * it->n;
        }
        const char *d = PyArray_BYTES(a); /* maybe unaligned: read with memcpy */
        for (Py_ssize_t i = 0; i < it->n; i++, p += 4, d += 8) {
            double x;
            memcpy(&x, d, 8);
            float f = (float)x;
            memcpy(p, &f, 4);
        }
        return p;
    }
    case K_INT_ARRAY: {
        PyArrayObject *a = (PyArrayObject *)it->obj;
        int code = array_int_code(a);
        const char *s = PyArray_BYTES(a);
        Py_ssize_t step = PyArray_ITEMSIZE(a);
        p = write_ints_head(p, it->payload);
        for (Py_ssize_t i = 0; i < it->n; i++, s += step) p = wvar(p, (uint64_t)array_int(s, code));
        return p;
    }
    case K_FLOAT_LIST: {
        PyObject **items = PySequence_Fast_ITEMS(it->obj);
        p = write_floats_head(p, it->payload);
        for (Py_ssize_t i = 0; i < it->n; i++, p += 4) {
            float f = (float)PyFloat_AS_DOUBLE(items[i]);
            memcpy(p, &f, 4);
        }
        return p;
    }
    case K_INT_LIST: {
        PyObject **items = PySequence_Fast_ITEMS(it->obj);
        int64_t v = 0;
        p = write_ints_head(p, it->payload);
        for (Py_ssize_t i = 0; i < it->n; i++) {
            exact_int(items[i], &v); /* checked in the first pass */
            p = wvar(p, (uint64_t)v);
        }
        return p;
    }
    default: { /* K_BYTES_LIST */
        PyObject **items = PySequence_Fast_ITEMS(it->obj);
        const char *d = NULL;
        Py_ssize_t l = 0;
        *p++ = 0x0a; /* Feature.bytes_list */
        p = wvar(p, (uint64_t)it->payload);
        for (Py_ssize_t i = 0; i < it->n; i++) {
            exact_bytes(items[i], &d, &l); /* checked (and the UTF-8 cached) in the first pass */
            *p++ = 0x0a;
            p = wvar(p, (uint64_t)l);
            memcpy(p, d, (size_t)l);
            p += l;
        }
        return p;
    }
    }
}

PyObject *sf_encode_example(PyObject *self, PyObject *args) {
    PyObject *features;
    Py_ssize_t max_copy = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "O|n:encode_example", &features, &max_copy)) return NULL;
#if PY_BIG_ENDIAN
    Py_RETURN_NONE; /* floats are copied as the host holds them: little-endian only */
#else
    if (!PyDict_CheckExact(features)) Py_RETURN_NONE;
    Py_ssize_t count = PyDict_GET_SIZE(features);
    item_t stack[STACK_ITEMS];
    item_t *items = stack;
    if (count > STACK_ITEMS) {
        items = (item_t *)PyMem_Malloc(sizeof(item_t) * (size_t)count);
        if (items == NULL) return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t pos = 0, i = 0, total = 0;
    PyObject *key, *value;
    while (PyDict_Next(features, &pos, &key, &value)) {
        if (i >= count) { /* cannot happen (no Python code runs here); never written past the array */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        item_t *it = &items[i++];
        memset(it, 0, sizeof(*it));
        if (!PyUnicode_CheckExact(key) || (it->key = PyUnicode_AsUTF8AndSize(key, &it->klen)) == NULL ||
            !size_value(it, value, max_copy)) {
            PyErr_Clear();
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        it->elen = 1 + vlen((uint64_t)it->klen) + it->klen + 1 + vlen((uint64_t)it->flen) + it->flen;
        total += 1 + vlen((uint64_t)it->elen) + it->elen;
    }
    result = PyBytes_FromStringAndSize(NULL, 1 + vlen((uint64_t)total) + total);
    if (result == NULL) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(result);
    *p++ = 0x0a; /* Example.features */
    p = wvar(p, (uint64_t)total);
    for (Py_ssize_t j = 0; j < i; j++) {
        const item_t *it = &items[j];
        *p++ = 0x0a; /* Features.feature: a map entry */
        p = wvar(p, (uint64_t)it->elen);
        *p++ = 0x0a; /* the entry's key */
        p = wvar(p, (uint64_t)it->klen);
        memcpy(p, it->key, (size_t)it->klen);
        p += it->klen;
        *p++ = 0x12; /* the entry's value: a Feature */
        p = wvar(p, (uint64_t)it->flen);
        p = write_value(p, it);
    }
done:
    if (items != stack) PyMem_Free(items);
    return result;
#endif
}

/* A tf.train.Example encoded in C for the common values (example_encode.c). */
#ifndef SHARDFEED_EXAMPLE_ENCODE_H
#define SHARDFEED_EXAMPLE_ENCODE_H

#include <Python.h>

/* encode_example(features: dict, max_copy=-1) -> bytes, or None where the Python encoder
 * must do it. */
PyObject *sf_encode_example(PyObject *self, PyObject *args);

#endif

/* Object arrays of bytes, packed into one buffer plus offsets and back: what crosses a
 * process boundary instead of one pickled object per value. Both need the GIL. */
#ifndef SF_PACKBYTES_H
#define SF_PACKBYTES_H

#include <Python.h>

/* pack_bytes(array) -> (data uint8 array, offsets int64 array of count + 1), or None when
 * a value is not exactly `bytes` (a subclass, str, None...): the caller pickles those. */
PyObject *sf_pack_bytes(PyObject *self, PyObject *arg);

/* unpack_bytes(data, offsets) -> 1-D object array of count `bytes`: value k is
 * data[offsets[k]:offsets[k + 1]]. ValueError when the offsets do not fit the data. */
PyObject *sf_unpack_bytes(PyObject *self, PyObject *args);

#endif

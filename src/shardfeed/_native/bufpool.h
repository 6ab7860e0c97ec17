/* Recycled memory for large batch buffers (the buffer form of bytes columns).
 *
 * A fresh multi-megabyte numpy array comes from mmap: the kernel zeroes and maps every page
 * on first touch, which costs more than the copy that fills it (MLPerf's 114 KB image records
 * in batches of 400: about 40% of the time went to clear_page and page faults). Arrays made
 * here are backed by blocks that go back to a small pool when the last array using them dies,
 * so the next batch is copied into memory that is already mapped. The pool outlives a pass (the
 * next pass starts warm); shardfeed/formats/bufpool.py frees blocks left idle (pool_trim), on
 * request, at exit and in a forked child (pool_clear). Every function here needs the GIL (the
 * pool is guarded by it).
 */
#ifndef SF_BUFPOOL_H
#define SF_BUFPOOL_H

#include <Python.h>

/* A new 1-D uint8 array of `nbytes` (uninitialised). Large arrays are backed by a pooled block
 * (the array's base is the block object); small ones are plain numpy arrays. NULL with an
 * exception set on failure. */
PyObject *sf_pool_array(size_t nbytes);

/* pool_info() -> (blocks held, bytes held, blocks reused, blocks allocated): for tests and stats. */
PyObject *sf_pool_info(PyObject *self, PyObject *unused);

/* pool_clear() -> None: free every pooled block (memory back to the system). */
PyObject *sf_pool_clear(PyObject *self, PyObject *unused);

/* pool_trim(max_idle) -> (float, int): free every pooled block that has been idle (back in the
 * pool, not taken again) for max_idle seconds or more; gives the seconds until the next one held
 * would reach max_idle (-1.0 when the pool is empty) and how many blocks live arrays hold (they
 * come back to the pool when those die). */
PyObject *sf_pool_trim(PyObject *self, PyObject *arg);

int sf_pool_init(void); /* 0, or -1 with an exception set: once, at module import */

#endif

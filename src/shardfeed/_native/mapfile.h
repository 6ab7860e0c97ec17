/* Read-only maps of whole files that keep no file descriptor open. */
#ifndef SF_MAPFILE_H
#define SF_MAPFILE_H

#include <Python.h>

#include "example_parse.h"

/* The MappedFile type (added to the module as "MappedFile"); 0 or -1 with an exception. */
int sf_mapfile_init(PyObject *module);

/* map_file(path) -> MappedFile (a read-only buffer of the file's bytes, unmapped when its last
 * reference and view are gone) or b"" for an empty file. The descriptor it opened is closed
 * at once, so a process can hold thousands of maps under the usual limit of 1,024 open files
 * (Python's mmap keeps a duplicate of it open for its whole life). OSError as open() raises. */
PyObject *sf_map_file(PyObject *self, PyObject *path);

/* The first of recs[0..n) with a byte past where its map stopped being the file's (the file
 * was truncated while mapped: its new end), or n (at once while no map alive has lost its
 * file). Any thread, no GIL needed; call it after the records' bytes were read,
 * while the maps they lie in are alive. */
size_t sf_guard_first_lost(const sf_bytes *recs, size_t n);

/* sf_guard_first_lost, and every such record's flags[k] set to 1 (flags NULL: the first only). */
size_t sf_guard_lost(const sf_bytes *recs, size_t n, uint8_t *flags);

/* Whether a map alive now has lost its file (pages past a truncated file's end). */
int sf_guard_any_lost(void);

#endif

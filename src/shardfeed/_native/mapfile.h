/* Read-only maps of whole files that keep no file descriptor open. */
#ifndef SF_MAPFILE_H
#define SF_MAPFILE_H

#include <Python.h>

/* The MappedFile type (added to the module as "MappedFile"); 0 or -1 with an exception. */
int sf_mapfile_init(PyObject *module);

/* map_file(path) -> MappedFile (a read-only buffer of the file's bytes, unmapped when its last
 * reference and view are gone) or b"" for an empty file. The descriptor it opened is closed
 * at once, so a process can hold thousands of maps under the usual limit of 1,024 open files
 * (Python's mmap keeps a duplicate of it open for its whole life). OSError as open() raises. */
PyObject *sf_map_file(PyObject *self, PyObject *path);

#endif

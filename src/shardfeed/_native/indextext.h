/* Index files (one "offset length" line per record, formats/index.py) parsed in one pass. */
#ifndef SF_INDEXTEXT_H
#define SF_INDEXTEXT_H

#include <stddef.h>
#include <stdint.h>

/* Parse data[0..len) into out (offset, length pairs, at most cap pairs): lines of two
 * decimal numbers separated by spaces, blank lines skipped. Returns the pairs written, or
 * -1 when the text is anything else (another character, a line of one or three numbers, an
 * offset + length at or past 2^63, a length under 16, more than cap lines): the caller then
 * finds and names the line. Pure C: no GIL needed. */
int64_t sf_parse_index(const char *data, size_t len, int64_t *out, size_t cap);

#ifdef Py_PYTHON_H
/* parse_index(out, data) -> int: the binding (out: a writable int64 buffer of 2 * cap
 * values); runs without the GIL. */
PyObject *sf_py_parse_index(PyObject *self, PyObject *args);
#endif

#endif

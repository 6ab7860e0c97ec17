/* Read-only maps of whole files without a file descriptor held: see mapfile.h. */
#define PY_SSIZE_T_CLEAN
#include "mapfile.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    void *addr;
    Py_ssize_t len;
} MappedFileObject;

static void mf_dealloc(MappedFileObject *self) {
    if (self->addr) munmap(self->addr, (size_t)self->len); /* no view is left: each holds a reference */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int mf_getbuffer(MappedFileObject *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->addr, self->len, 1, flags);
}

static Py_ssize_t mf_length(MappedFileObject *self) { return self->len; }

/* madvise(option, start, length): what mmap.mmap.madvise does (start a multiple of the page
 * size; the range clipped to the map). */
static PyObject *mf_madvise(MappedFileObject *self, PyObject *args) {
    int option;
    Py_ssize_t start, length;
    if (!PyArg_ParseTuple(args, "inn:madvise", &option, &start, &length)) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (start < 0 || start > self->len || length < 0 || (page > 0 && start % page)) {
        PyErr_SetString(PyExc_ValueError, "madvise: start must be a page-aligned offset inside the map, length >= 0");
        return NULL;
    }
    if (length > self->len - start) length = self->len - start;
    if (length && madvise((char *)self->addr + start, (size_t)length, option) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef mf_methods[] = {
    {"madvise", (PyCFunction)mf_madvise, METH_VARARGS, "madvise(option, start, length) -> None: as mmap.madvise"},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs mf_as_buffer = {(getbufferproc)mf_getbuffer, NULL};
static PySequenceMethods mf_as_sequence = {.sq_length = (lenfunc)mf_length};

static PyTypeObject MappedFileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfeed._native.MappedFile",
    .tp_basicsize = sizeof(MappedFileObject),
    .tp_dealloc = (destructor)mf_dealloc,
    .tp_as_buffer = &mf_as_buffer,
    .tp_as_sequence = &mf_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = mf_methods,
    .tp_doc = "A read-only map of a whole file (shardfeed._native.map_file): a buffer, its len() the file's size.",
};

PyObject *sf_map_file(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *bytes_path = NULL;
    if (!PyUnicode_FSConverter(arg, &bytes_path)) return NULL;
    const char *path = PyBytes_AS_STRING(bytes_path);
    int fd;
    Py_BEGIN_ALLOW_THREADS
    fd = open(path, O_RDONLY | O_CLOEXEC);
    Py_END_ALLOW_THREADS
    if (fd < 0) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
        Py_DECREF(bytes_path);
        return NULL;
    }
    Py_DECREF(bytes_path);
    struct stat st;
    void *addr = MAP_FAILED;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    if (fstat(fd, &st) < 0) {
        err = errno;
    } else if (st.st_size > 0) {
        addr = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED) err = errno;
    }
    close(fd); /* the map stays valid without it */
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
    }
    if (st.st_size == 0) return PyBytes_FromStringAndSize(NULL, 0);
    MappedFileObject *m = PyObject_New(MappedFileObject, &MappedFileType);
    if (!m) {
        munmap(addr, (size_t)st.st_size);
        return NULL;
    }
    m->addr = addr;
    m->len = (Py_ssize_t)st.st_size;
    return (PyObject *)m;
}

int sf_mapfile_init(PyObject *module) {
    if (PyType_Ready(&MappedFileType) < 0) return -1;
    Py_INCREF(&MappedFileType);
    if (PyModule_AddObject(module, "MappedFile", (PyObject *)&MappedFileType) < 0) {
        Py_DECREF(&MappedFileType);
        return -1;
    }
    return 0;
}

/* Read-only maps of whole files without a file descriptor held: see mapfile.h. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include "mapfile.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the truncation guard ------------------------------------------------------------
 * A page of a MAP_SHARED file map past the file's end faults with SIGBUS (BUS_ADRERR): a
 * shard truncated while a pass reads it would kill the process. Each map is entered in a
 * table the signal handler can read (atomics, no lock, no allocation); a SIGBUS at an
 * address inside one replaces the map from the faulting page to its end with zero pages
 * (mmap MAP_FIXED of anonymous memory: one system call, no user-space lock), notes the
 * lowest such page in the entry and returns, so the access reads zeros. Any other SIGBUS
 * goes to the handler that was there before (Python's faulthandler, or the default action).
 *
 * Zeros are never data: whoever reads records out of a map asks sf_guard_first_lost (or
 * first_lost from Python) once the bytes are read, and a record with a byte past the
 * point the map was lost from fails its check as "truncated data". That point is the
 * file's new end when the file at the map's path is still the one mapped (the kernel zeroes
 * the tail of the page holding the new end without a fault), else the map's start. */
#define GUARD_SLOTS 16384

typedef struct {
    _Atomic uintptr_t start; /* 0: free (an entry being filled has end 0: matches nothing) */
    _Atomic uintptr_t end;
    _Atomic uintptr_t lost;  /* the lowest page replaced by zeros, 0 if none */
    _Atomic uintptr_t from;  /* the address from which the map is known lost (resolved from lost), 0: not yet */
    const char *path;        /* set before the entry is published, freed after it is removed */
    dev_t dev;
    ino_t ino;
} GuardSlot;

static GuardSlot guard_slots[GUARD_SLOTS];
static atomic_int guard_hint;
static atomic_int guard_lost_maps; /* entries with pages replaced by zeros now */
static struct sigaction previous_bus;
static int guard_state; /* 0: not yet, 1: installed, -1: off (SHARDFEED_SIGBUS_GUARD=0 or sigaction failed) */
static uintptr_t page_mask;

static atomic_int guard_chaining; /* in the handler before ours now */
static atomic_int guard_chained;  /* a signal went to the handler before ours once */

/* The default action, as without any handler: the fault repeats (or the signal sent is
 * raised again) once the handler returns. */
static void guard_default(int sig, siginfo_t *info) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (!info || info->si_code <= 0) raise(sig);
}

/* A SIGBUS that is not ours: to the handler that was there before ours. A handler that
 * hands the signal back (Python's faulthandler restores the one before it, ours, and raises
 * the signal again; another may call ours) ends in the default action, not in a loop. */
static void guard_chain(int sig, siginfo_t *info, void *uctx) {
    int sent = !info || info->si_code <= 0;
    if (atomic_fetch_add(&guard_chaining, 1) > 0 || (sent && atomic_load(&guard_chained))) {
        atomic_fetch_sub(&guard_chaining, 1);
        guard_default(sig, info);
        return;
    }
    atomic_store(&guard_chained, 1);
    if (previous_bus.sa_flags & SA_SIGINFO) {
        if (previous_bus.sa_sigaction) previous_bus.sa_sigaction(sig, info, uctx);
        else guard_default(sig, info);
    } else if (previous_bus.sa_handler != SIG_DFL && previous_bus.sa_handler != SIG_IGN) {
        previous_bus.sa_handler(sig);
    } else {
        guard_default(sig, info);
    }
    atomic_fetch_sub(&guard_chaining, 1);
}

static void guard_handler(int sig, siginfo_t *info, void *uctx) {
    if (info && info->si_code == BUS_ADRERR) {
        uintptr_t a = (uintptr_t)info->si_addr;
        for (int i = 0; i < GUARD_SLOTS; i++) {
            uintptr_t s = atomic_load(&guard_slots[i].start);
            if (!s || a < s) continue;
            uintptr_t e = atomic_load(&guard_slots[i].end);
            if (a >= e) continue;
            uintptr_t page = a & page_mask;
            if (mmap((void *)page, e - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
                break;
            uintptr_t cur = 0;
            if (atomic_compare_exchange_strong(&guard_slots[i].lost, &cur, page)) atomic_fetch_add(&guard_lost_maps, 1);
            while (page < cur && !atomic_compare_exchange_weak(&guard_slots[i].lost, &cur, page)) {
            }
            atomic_store(&guard_slots[i].from, 0); /* resolved again */
            return;
        }
    }
    guard_chain(sig, info, uctx);
}

/* Put the handler in place, first in line (the caller holds the GIL): at the first map, and
 * again at a later one when another was installed over it since (faulthandler.enable(), a
 * library's crash reporter), which is then the one before it. */
static void guard_install(void) {
    if (guard_state < 0) return;
    if (guard_state == 0) {
        const char *env = getenv("SHARDFEED_SIGBUS_GUARD");
        if (env && strcmp(env, "0") == 0) {
            guard_state = -1;
            return;
        }
        long page = sysconf(_SC_PAGESIZE);
        page_mask = ~(uintptr_t)((page > 0 ? page : 4096) - 1);
    }
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == guard_handler) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous_bus) == 0) guard_state = 1;
    else if (guard_state == 0) guard_state = -1;
}

/* The entry of [addr, addr + len) (a map of the file at path, st), or -1 when the guard is
 * off, the table is full or memory is short. */
static int guard_add(void *addr, Py_ssize_t len, const char *path, const struct stat *st) {
    guard_install();
    if (guard_state != 1) return -1;
    char *copy = strdup(path);
    if (!copy) return -1;
    int h = atomic_load(&guard_hint);
    for (int k = 0; k < GUARD_SLOTS; k++) {
        int i = (h + k) % GUARD_SLOTS;
        uintptr_t expected = 0;
        if (atomic_load(&guard_slots[i].start) == 0 &&
            atomic_compare_exchange_strong(&guard_slots[i].start, &expected, (uintptr_t)addr)) {
            guard_slots[i].path = copy;
            guard_slots[i].dev = st->st_dev;
            guard_slots[i].ino = st->st_ino;
            atomic_store(&guard_slots[i].lost, 0);
            atomic_store(&guard_slots[i].from, 0);
            atomic_store(&guard_slots[i].end, (uintptr_t)addr + (uintptr_t)len);
            atomic_store(&guard_hint, (i + 1) % GUARD_SLOTS);
            return i;
        }
    }
    free(copy);
    return -1;
}

static void guard_remove(int i) {
    if (i < 0) return;
    atomic_store(&guard_slots[i].end, 0);
    if (atomic_exchange(&guard_slots[i].lost, 0)) atomic_fetch_sub(&guard_lost_maps, 1);
    atomic_store(&guard_slots[i].from, 0);
    free((void *)guard_slots[i].path);
    guard_slots[i].path = NULL;
    atomic_store(&guard_slots[i].start, 0);
}

/* The address from which entry i (lost pages, its map alive: the caller holds a record of
 * it) reads wrong bytes: the file's new end while its path still names the file mapped,
 * else the map's start; 0 when nothing is lost. */
static uintptr_t guard_lost_from(int i) {
    uintptr_t lost = atomic_load(&guard_slots[i].lost);
    if (!lost) return 0;
    uintptr_t from = atomic_load(&guard_slots[i].from);
    if (from) return from;
    uintptr_t start = atomic_load(&guard_slots[i].start);
    from = start;
    struct stat st;
    if (guard_slots[i].path && stat(guard_slots[i].path, &st) == 0 && st.st_dev == guard_slots[i].dev &&
        st.st_ino == guard_slots[i].ino && st.st_size >= 0)
        from = start + (uintptr_t)st.st_size;
    if (from > lost) from = lost;
    atomic_store(&guard_slots[i].from, from);
    return from;
}

/* The first record of recs[0..n) with a byte past where its map is lost, or n; with flags,
 * every such record's flag set to 1 (the others left as they are). */
size_t sf_guard_lost(const sf_bytes *recs, size_t n, uint8_t *flags) {
    if (!atomic_load(&guard_lost_maps)) return n; /* no map has lost its file now: nothing to look at */
    size_t first = n;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        if (!atomic_load(&guard_slots[i].lost)) continue;
        uintptr_t s = atomic_load(&guard_slots[i].start), e = atomic_load(&guard_slots[i].end), from = 0;
        for (size_t k = 0; k < (flags ? n : first); k++) {
            uintptr_t p = (uintptr_t)recs[k].p;
            if (p < s || p >= e) continue;
            if (!from) from = guard_lost_from(i); /* a record of it is here: the map is alive */
            if (from && p + recs[k].n + 4 > from) { /* its data or the data CRC after it (a frame's) */
                if (k < first) first = k;
                if (!flags) break;
                flags[k] = 1;
            }
        }
    }
    return first;
}

size_t sf_guard_first_lost(const sf_bytes *recs, size_t n) { return sf_guard_lost(recs, n, NULL); }

int sf_guard_any_lost(void) { return atomic_load(&guard_lost_maps) > 0; }

typedef struct {
    PyObject_HEAD
    void *addr;
    Py_ssize_t len;
    int guard; /* its entry in guard_slots, or -1 */
} MappedFileObject;

static void mf_dealloc(MappedFileObject *self) {
    if (self->addr) {
        guard_remove(self->guard); /* before the range can be mapped again */
        munmap(self->addr, (size_t)self->len); /* no view is left: each holds a reference */
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* lost_from: the byte from which the map's bytes are not the file's (it was truncated while
 * mapped: its new end, or 0 when the path names another file now), or None. */
static PyObject *mf_lost_from(MappedFileObject *self, void *closure) {
    (void)closure;
    if (self->guard < 0) Py_RETURN_NONE;
    uintptr_t from = guard_lost_from(self->guard);
    if (!from) Py_RETURN_NONE;
    return PyLong_FromSsize_t((Py_ssize_t)(from - (uintptr_t)self->addr));
}

static PyObject *mf_guarded(MappedFileObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->guard >= 0);
}

static PyGetSetDef mf_getset[] = {
    {"lost_from", (getter)mf_lost_from, NULL,
     "The byte offset from which this map reads zeros because the file was truncated while mapped, or None", NULL},
    {"guarded", (getter)mf_guarded, NULL, "Whether a SIGBUS in this map is answered with zero pages", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

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
    .tp_getset = mf_getset,
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
        Py_DECREF(bytes_path);
        errno = err;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, arg);
    }
    if (st.st_size == 0) {
        Py_DECREF(bytes_path);
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    MappedFileObject *m = PyObject_New(MappedFileObject, &MappedFileType);
    if (!m) {
        Py_DECREF(bytes_path);
        munmap(addr, (size_t)st.st_size);
        return NULL;
    }
    m->addr = addr;
    m->len = (Py_ssize_t)st.st_size;
    char *full = realpath(path, NULL); /* the file, whatever the working directory is later */
    m->guard = guard_add(addr, m->len, full ? full : path, &st);
    free(full);
    Py_DECREF(bytes_path);
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

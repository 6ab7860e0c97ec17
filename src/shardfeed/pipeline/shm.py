"""Elements through shared memory: numpy data in a slot, only the structure pickled.

:func:`encode` pickles an element (dicts, tuples, ``BytesBuffer``, ``RaggedColumn``...)
with every numpy array taken out of the pickle: numeric arrays, and object arrays whose
values are all ``bytes`` (packed as one buffer plus offsets). What stays in the pickle is
the structure, scalars, strings and object arrays of other values (small, by the way
batches are made). :func:`write` copies the arrays into a slot (one copy, in the
producer). :func:`decode` gives them to the consumer either as views of the slot (no
copy: every view hangs from one :class:`SlotLease`, whose end hands the slot back) or
copied out into arrays the consumer owns (a second copy, the slot free at once).
"""

from __future__ import annotations

import functools
import io
import math
import mmap
import os
import pickle
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ..formats.native import BytesBuffer, pack_bytes
from ..formats.spec import RaggedColumn

ALIGN = 64  # each array starts on a cache line
_NUMERIC = "a"
_BYTES = "b"  # a bytes column inside the element's structure: made into objects as it is decoded
_LAZY = "B"  # a value of a dict element: made into objects when first read (see LazyBatch)


class BytesObjects:
    """A bytes column the child parsed as one buffer (``bytes_as="buffer"``) where the
    consumer asked for objects: it crosses as buffer plus offsets and becomes the object
    array of ``shape`` that ``bytes_as="object"`` gives, on the consumer's side."""

    __slots__ = ("buffer", "shape")

    def __init__(self, buffer: BytesBuffer, shape: tuple) -> None:
        self.buffer, self.shape = buffer, shape


def _taken(obj: Any, lazy: bool) -> tuple[str, Any] | None:
    """What an element's pickle leaves out of itself for the slot: ``(kind, payload)`` for a
    numeric array, or an object array of ``bytes`` (or a :class:`BytesObjects`) packed as one
    buffer plus offsets (``lazy``: a dict element's value, made into objects when first read);
    None for anything that stays in the pickle."""
    t = type(obj)
    if t is BytesObjects:
        packed, shape = obj.buffer, obj.shape
    elif t is np.ndarray:
        if not obj.dtype.hasobject:
            return _NUMERIC, obj
        packed = pack_bytes(obj) if obj.size else None  # natively, one buffer plus offsets
        if packed is None:
            return None  # other object arrays (str, mixed, empty) travel in the pickle
        shape = obj.shape
    else:
        return None
    return (_LAZY if lazy else _BYTES), (shape, packed.offsets, packed.data)


class _Encoder(pickle.Pickler):
    def __init__(self, file: io.BytesIO, top: set[int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays: list[tuple[str, Any]] = []
        self.taken: list[int] = []  # id() of each object taken out, in order
        self.top = top  # ids of a dict element's values: its bytes columns are made into objects lazily

    def persistent_id(self, obj: Any) -> Any:
        got = _taken(obj, id(obj) in self.top)
        if got is None:
            return None
        self.arrays.append(got)
        self.taken.append(id(obj))
        return len(self.arrays) - 1


def align(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


_ARRAYISH = (np.ndarray, BytesObjects)
_RAGGED_FIELDS = ("values", "row_splits")
_FLAT_KEPT = 64  # signatures of flat batches whose pickled structure is kept
_flat: dict[tuple, tuple[bytes, tuple]] = {}  # signature -> (structure, where each array is)


def _flat_signature(x: dict) -> tuple | None:
    """What a flat batch's pickled structure depends on: its keys, in order, and the kind of
    each value (an array, or a :class:`RaggedColumn` of two); None for any other element,
    whose structure is pickled every time."""
    sig: list[Any] = []
    ids: list[int] = []
    for k, v in x.items():
        if type(k) is not str:
            return None
        t = type(v)
        if t in _ARRAYISH:
            sig.append((k, t))
            ids.append(id(v))
        elif t is RaggedColumn and tuple(v.__dict__) == _RAGGED_FIELDS and type(v.values) in _ARRAYISH \
                and type(v.row_splits) in _ARRAYISH:
            sig.append((k, t, type(v.values), type(v.row_splits)))
            ids += (id(v), id(v.values), id(v.row_splits))
        else:
            return None
    if len(set(ids)) != len(ids):  # one object in two places: pickled once, then as a reference
        return None
    return tuple(sig)


def _flat_paths(x: dict, taken: list[int]) -> tuple | None:
    """Where each array the pickler took out of ``x`` lies, ``(key, field or None)`` in the
    order taken; None unless the pickler took every array of ``x`` (an empty object array,
    say, stays in the pickle: a structure that holds it describes no other batch)."""
    where: dict[int, tuple] = {}
    for k, v in x.items():
        if type(v) is RaggedColumn:
            for f in _RAGGED_FIELDS:
                where[id(getattr(v, f))] = (k, f)
        else:
            where[id(v)] = (k, None)
    paths = tuple(where.get(i) for i in taken)
    return None if None in paths or len(set(paths)) != len(where) else paths


def _layout(arrays: list) -> tuple[list, int]:
    layout: list[tuple] = []
    pos = 0
    for kind, a in arrays:
        if kind == _NUMERIC:
            dt = a.dtype
            layout.append((kind, pos, dt.str if dt.kind in "biufc" else dt, a.shape))
            pos = align(pos + a.nbytes)
        else:
            shape, offsets, data = a
            data_at = align(pos + offsets.nbytes)
            layout.append((kind, pos, shape, len(offsets), data_at, data.nbytes))
            pos = align(data_at + data.nbytes)
    return layout, pos


def encode(x: Any) -> tuple[bytes, list, list, int]:
    """``(structure, arrays, layout, size)``: the pickled structure, the arrays to write,
    where each goes in a slot, and the slot bytes they need. A numeric array's dtype travels
    as its ``str`` when that names it exactly (a dtype object costs microseconds to unpickle).
    A flat batch (a dict of arrays and ragged columns) whose keys and kinds of value are those
    of one seen before reuses that one's pickled structure: the same bytes, without running
    the pickler (about 30 us of the child's time a CTR batch)."""
    sig = _flat_signature(x) if type(x) is dict else None
    kept = _flat.get(sig) if sig is not None else None
    if kept is not None:
        structure, paths = kept
        arrays = []
        for k, f in paths:
            got = _taken(x[k] if f is None else getattr(x[k], f), f is None)
            if got is None:  # an object array that does not pack (it would travel in the pickle)
                break
            arrays.append(got)
        else:
            layout, size = _layout(arrays)
            return structure, arrays, layout, size
    f = io.BytesIO()
    enc = _Encoder(f, {id(v) for v in x.values()} if type(x) is dict else set())
    enc.dump(x)
    structure = f.getvalue()
    if sig is not None:
        paths = _flat_paths(x, enc.taken)
        if paths is not None and len(_flat) < _FLAT_KEPT:
            _flat[sig] = (structure, paths)
    layout, size = _layout(enc.arrays)
    return structure, enc.arrays, layout, size


def write(buf: memoryview, arrays: list, layout: list) -> None:
    """Copy ``arrays`` into ``buf`` where ``layout`` says."""
    for (kind, a), where in zip(arrays, layout):
        if kind == _NUMERIC:
            if a.size:
                dst = np.ndarray(a.shape, a.dtype, buffer=buf, offset=where[1])
                dst[...] = a
                del dst
        else:
            _, offsets, data = a
            buf[where[1]:where[1] + offsets.nbytes] = offsets.tobytes()
            buf[where[4]:where[4] + data.nbytes] = data


class _Pinned(np.ndarray):
    """A view of a slot's mapping under a type of its own: numpy makes a view of a view the
    view of its base (base collapsing), except across a change of type. A lease on this,
    not on the mapping, stays the base of every array made on it."""


def pinned_view(mapping: np.ndarray) -> np.ndarray:
    """The view of ``mapping`` that leases are made on (make one per mapping)."""
    return mapping.view(_Pinned)


class SlotLease(np.ndarray):
    """The root of every array that views one element in a slot: numpy keeps it alive while
    any of them (or anything built on them without a copy: a slice, ``torch.from_numpy``)
    is, and when the last goes ``release`` runs, in whichever thread dropped it. It is a
    view of the slot's mapping itself (an ``ndarray`` subclass: the element's arrays are
    made straight on it, and it keeps the mapping, and so the memory, alive even past
    close); ``pinned``: :func:`pinned_view` of the mapping, made once. ``interface`` is
    accepted for callers of the version that needed it."""

    __slots__ = ("_release",)

    def __new__(cls, mapping: np.ndarray, release: Callable[[], None], interface: dict | None = None,
                pinned: np.ndarray | None = None) -> "SlotLease":
        lease = (pinned_view(mapping) if pinned is None else pinned).view(cls)
        lease._release = release
        return lease

    def __del__(self) -> None:
        # a view of a lease made by numpy (none is made here: arrays are made on it with
        # ``np.ndarray``) has no ``_release`` and releases nothing
        release, self._release = getattr(self, "_release", None), None
        if release is not None:
            release()


@functools.lru_cache(maxsize=64)
def _dtype(name: str) -> np.dtype:
    return np.dtype(name)


class LazyBytes:
    """A bytes column on its way to being an object array: ``root`` (the slot's lease, or a
    copy) and where its offsets and data lie in it (its layout entry), made into objects by
    :class:`LazyBatch` when first read; or, with ``root`` None, the marker of a plan
    (:class:`~shardfeed.pipeline.shm_plan.Plan`), whose ``where`` is its kind and where its
    numbers start in the :class:`LazyBatch`'s. A plan makes one per column once and puts the
    same ones in every batch of its layout (nothing is made per column on the trainer's side)."""

    __slots__ = ("root", "where")

    def __init__(self, root: np.ndarray | None, where: tuple) -> None:
        self.root, self.where = root, where

    def objects(self, batch: Any = None) -> np.ndarray:
        if self.root is None:  # a plan's marker: (kind, where its numbers start) in the batch's numbers
            return _array(batch._root, _entry(self.where[0], batch._numbers, self.where[1]))
        return _array(self.root, self.where)


class LazyBatch(dict):
    """A batch (a ``dict``) whose bytes columns become numpy object arrays of ``bytes`` when
    first read, so a consumer that never reads one never pays for a Python object per
    value. Every way of reading a value (``b[k]``, ``get``, ``items``, ``values``, ``pop``,
    ``dict(b)``, ``{**b}``, ``==``, ``repr``, pickle, copy) sees the object arrays; only
    ``dict``'s own methods called on it unbound (``dict.values(b)``) see the buffers.
    ``copy.copy`` gives a batch of the same kind whose columns are made when read."""

    # set by a Plan: the slot's lease as an array, and the numbers of the layout, for the
    # bytes columns' markers it shares between batches
    __slots__ = ("_root", "_numbers")

    def __getitem__(self, key: Any) -> Any:
        v = dict.__getitem__(self, key)
        if type(v) is LazyBytes:
            v = v.objects(self)
            dict.__setitem__(self, key, v)
        return v

    def _make_all(self) -> None:
        for k in [k for k, v in dict.items(self) if type(v) is LazyBytes]:
            self[k]  # noqa: B018 - made and stored by __getitem__

    def __iter__(self) -> Any:  # defined here so dict(b) and {**b} read the values through __getitem__
        return dict.__iter__(self)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def values(self) -> Any:
        self._make_all()
        return dict.values(self)

    def items(self) -> Any:
        self._make_all()
        return dict.items(self)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            self[key]  # noqa: B018
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple:
        self._make_all()
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else dict.setdefault(self, key, default)

    def copy(self) -> dict:
        return dict(self.items())

    def __copy__(self) -> "LazyBatch":
        # copy.copy (DataLoader's default_convert copies every dict batch, then sets each
        # value read from the original): a batch of its own over the same columns, its
        # unread ones still unmade, instead of __reduce__'s plain dict with every one made
        c = LazyBatch()
        dict.update(c, dict.items(self))  # unbound: the raw values, markers included
        for name in LazyBatch.__slots__:
            if hasattr(self, name):
                setattr(c, name, getattr(self, name))
        return c

    def __reduce__(self) -> Any:  # pickles (and copies) as the plain dict it stands for
        return dict, (dict(self.items()),)

    def __repr__(self) -> str:
        self._make_all()
        return dict.__repr__(self)

    def __eq__(self, other: object) -> bool:
        self._make_all()
        if isinstance(other, LazyBatch):
            other._make_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __or__(self, other: Any) -> Any:
        return dict(self.items()) | other

    def __ror__(self, other: Any) -> Any:
        return other | dict(self.items())

    __hash__ = None  # type: ignore[assignment]


def decode(mapping: np.ndarray, structure: bytes, layout: list, lease: SlotLease | None = None) -> Any:
    """The element :func:`encode` described, from ``mapping`` (the slot as a uint8 array):
    its numeric arrays, and a dict element's bytes columns as buffer plus offsets (a
    :class:`LazyBatch`), are views of the slot hanging from ``lease`` when one is given
    (writable; the slot must not be reused until the lease is gone), else copies. One
    ``ndarray`` call per numeric array: this runs on the trainer's side for every element."""
    arrays: list[Any] = []
    root = lease if lease is not None else mapping
    lazy = False
    for where in layout:
        kind = where[0]
        if kind == _NUMERIC:
            _, pos, dtype, shape = where
            a = np.ndarray(shape, _dtype(dtype) if type(dtype) is str else dtype, root, pos)
            arrays.append(a if lease is not None else a.copy())
        elif kind == _LAZY:
            lazy = True
            if lease is not None:
                arrays.append(LazyBytes(root, where))
            else:  # a copy of its offsets and data, the slot free at once
                kind, pos, shape, count, data_at, size = where
                region = mapping[pos:data_at + size].copy()
                arrays.append(LazyBytes(region, (kind, 0, shape, count, data_at - pos, size)))
        else:  # bytes objects own their memory: each value is copied out of the slot (natively)
            _, pos, shape, count, data_at, size = where
            packed = BytesBuffer(mapping[data_at:data_at + size], np.ndarray(count, np.int64, mapping, pos))
            arrays.append(packed.to_numpy().reshape(shape))
    u = pickle.Unpickler(io.BytesIO(structure))
    u.persistent_load = arrays.__getitem__  # C-level: no Python call per array
    x = u.load()
    return LazyBatch(x) if lazy else x


def _entry(kind: tuple, numbers: Sequence[int], i: int) -> tuple:
    """The layout entry of ``kind`` whose numbers start at ``numbers[i]``."""
    if kind[0] == _NUMERIC:
        return (_NUMERIC, numbers[i], kind[1], tuple(numbers[i + 1:i + 1 + kind[2]]))
    n = kind[1]
    return (kind[0], numbers[i], tuple(numbers[i + 1:i + 1 + n]), *numbers[i + 1 + n:i + 4 + n])


def _array(root: np.ndarray, where: tuple) -> np.ndarray:
    """The array of one layout entry (numeric: a view of ``root``; bytes: objects, copied out)."""
    if where[0] == _NUMERIC:
        _, pos, dtype, shape = where
        return np.ndarray(shape, _dtype(dtype) if type(dtype) is str else dtype, root, pos)
    _, pos, shape, count, data_at, size = where
    data = np.ndarray(size, np.uint8, root, data_at)  # not root[...]: a slice of a lease would be a lease
    return BytesBuffer(data, np.ndarray(count, np.int64, root, pos)).to_numpy().reshape(shape)


def views_slot(layout: list) -> bool:
    """Whether :func:`decode` with a lease leaves anything viewing the slot."""
    return any(w[0] == _LAZY or (w[0] == _NUMERIC and math.prod(w[3])) for w in layout)


def map_segment(name: str) -> np.ndarray:
    """The existing segment ``name`` mapped into this process, as a writable uint8 array.
    The mapping is its own (not a ``SharedMemory``'s, whose ``close()`` fails while views
    exist): it lives as long as any array built on it, and the segment's memory with it,
    after the name is unlinked too."""
    path = os.path.join("/dev/shm", name)
    if os.path.isdir("/dev/shm"):
        fd = os.open(path, os.O_RDWR)
    else:  # POSIX without /dev/shm (macOS): the call SharedMemory itself makes
        import _posixshmem  # noqa: PLC0415

        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        m = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return np.frombuffer(m, np.uint8)


def slot_name(token: str, slot: int, gen: int) -> str:
    """The shared-memory name of generation ``gen`` of ``slot`` of the ring ``token``: known to
    both sides, so the consumer can remove a segment whose announcement a dying child never sent."""
    return f"sf_{token}_{slot}_{gen}"


def attach(name: str) -> shared_memory.SharedMemory:
    """Open the existing segment ``name``."""
    return shared_memory.SharedMemory(name=name, create=False)


def create(name: str, size: int) -> shared_memory.SharedMemory:
    """A new segment ``name`` of at least ``size`` bytes."""
    return shared_memory.SharedMemory(name=name, create=True, size=max(1, size))


def unlink_quietly(name: str) -> bool:
    """Remove the segment ``name`` if it exists; True when it did."""
    try:
        shm = attach(name)
    except FileNotFoundError:
        return False
    shm.close()
    try:
        shm.unlink()
    except FileNotFoundError:
        return False
    return True

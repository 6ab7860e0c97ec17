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

import io
import mmap
import os
import pickle
from collections.abc import Callable
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ..formats.native import BytesBuffer, pack_bytes

ALIGN = 64  # each array starts on a cache line
_NUMERIC = "a"
_BYTES = "b"


class _Encoder(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays: list[tuple[str, Any]] = []

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not np.ndarray:
            return None
        if not obj.dtype.hasobject:
            self.arrays.append((_NUMERIC, obj))
            return len(self.arrays) - 1
        packed = pack_bytes(obj) if obj.size else None  # natively, one buffer plus offsets
        if packed is not None:
            self.arrays.append((_BYTES, (obj.shape, packed.offsets, packed.data)))
            return len(self.arrays) - 1
        return None  # other object arrays (str, mixed, empty) travel in the pickle


class _Decoder(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, arrays: list) -> None:
        super().__init__(file)
        self.arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        return self.arrays[pid]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def encode(x: Any) -> tuple[bytes, list, list, int]:
    """``(structure, arrays, layout, size)``: the pickled structure, the arrays to write,
    where each goes in a slot, and the slot bytes they need."""
    f = io.BytesIO()
    enc = _Encoder(f)
    enc.dump(x)
    layout: list[tuple] = []
    pos = 0
    for kind, a in enc.arrays:
        if kind == _NUMERIC:
            layout.append((kind, pos, a.dtype, a.shape))
            pos = _align(pos + a.nbytes)
        else:
            shape, offsets, data = a
            data_at = _align(pos + offsets.nbytes)
            layout.append((kind, pos, shape, len(offsets), data_at, data.nbytes))
            pos = _align(data_at + data.nbytes)
    return f.getvalue(), enc.arrays, layout, pos


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


class SlotLease:
    """The root of every array that views one element in a slot: numpy keeps it alive while
    any of them (or anything built on them without a copy: a slice, ``torch.from_numpy``)
    is, and when the last goes ``release`` runs, in whichever thread dropped it."""

    __slots__ = ("__array_interface__", "_mapping", "_release", "__weakref__")

    def __init__(self, mapping: np.ndarray, release: Callable[[], None], interface: dict | None = None) -> None:
        self._mapping = mapping  # keeps the mapping (and so the memory) alive, even past close
        # ``mapping.__array_interface__`` (a new dict each time: pass one made once per mapping)
        self.__array_interface__ = interface or mapping.__array_interface__
        self._release: Callable[[], None] | None = release

    def __del__(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def decode(mapping: np.ndarray, structure: bytes, layout: list, lease: SlotLease | None = None) -> Any:
    """The element :func:`encode` described, from ``mapping`` (the slot as a uint8 array):
    its numeric arrays are views of the slot hanging from ``lease`` when one is given
    (writable; the slot must not be reused until the lease is gone), else copies."""
    arrays: list[Any] = []
    root = np.asarray(lease) if lease is not None else mapping  # its base is the lease
    for where in layout:
        if where[0] == _NUMERIC:
            _, pos, dtype, shape = where
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if nbytes:
                a = root[pos:pos + nbytes].view(dtype).reshape(shape)
                arrays.append(a if lease is not None else a.copy())
            else:
                arrays.append(np.empty(shape, dtype))
        else:  # bytes objects own their memory: each value is copied out of the slot (natively)
            _, pos, shape, count, data_at, size = where
            packed = BytesBuffer(mapping[data_at:data_at + size], mapping[pos:pos + count * 8].view(np.int64))
            arrays.append(packed.to_numpy().reshape(shape))
    return _Decoder(io.BytesIO(structure), arrays).load()


def views_slot(layout: list) -> bool:
    """Whether :func:`decode` with a lease leaves any array viewing the slot."""
    return any(w[0] == _NUMERIC and int(np.prod(w[3], dtype=np.int64)) for w in layout)


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

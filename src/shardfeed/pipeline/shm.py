"""Elements through shared memory: numpy data in a slot, only the structure pickled.

:func:`encode` pickles an element (dicts, tuples, ``BytesBuffer``, ``RaggedColumn``...)
with every numpy array taken out of the pickle: numeric arrays, and object arrays whose
values are all ``bytes`` (packed as one buffer plus offsets). What stays in the pickle is
the structure, scalars, strings and object arrays of other values (small, by the way
batches are made). :func:`write` copies the arrays into a slot (one copy, in the
producer); :func:`decode` copies them out of it into arrays the consumer owns (one copy),
so the slot can be reused at once and the consumer's arrays stay valid for as long as it
keeps them.
"""

from __future__ import annotations

import io
import pickle
from multiprocessing import shared_memory
from typing import Any

import numpy as np

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
        values = obj.ravel().tolist()
        if values and all(type(v) is bytes for v in values):
            data = b"".join(values)
            offsets = np.zeros(len(values) + 1, np.int64)
            np.cumsum([len(v) for v in values], out=offsets[1:])
            self.arrays.append((_BYTES, (obj.shape, offsets, data)))
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
            layout.append((kind, pos, shape, len(offsets), data_at, len(data)))
            pos = _align(data_at + len(data))
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
            buf[where[4]:where[4] + len(data)] = data


def decode(buf: memoryview, structure: bytes, layout: list) -> Any:
    """The element :func:`encode` described, its arrays copied out of ``buf``."""
    arrays: list[Any] = []
    for where in layout:
        if where[0] == _NUMERIC:
            _, pos, dtype, shape = where
            n = int(np.prod(shape, dtype=np.int64))
            if n:
                arrays.append(np.frombuffer(buf, dtype, n, pos).reshape(shape).copy())
            else:
                arrays.append(np.empty(shape, dtype))
        else:
            _, pos, shape, count, data_at, size = where
            o = np.frombuffer(buf, np.int64, count, pos).tolist()
            data = bytes(buf[data_at:data_at + size])
            out = np.empty(count - 1, object)
            out[:] = [data[o[k]:o[k + 1]] for k in range(count - 1)]
            arrays.append(out.reshape(shape))
    return _Decoder(io.BytesIO(structure), arrays).load()


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

"""The PyTorch dataset class, at module level so that spawned DataLoader workers can
unpickle it. Imported only by :func:`shardfeed.adapters.torch.to_torch` (it imports torch)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch.utils.data
from torch.utils.data._utils.collate import default_convert

from ..pipeline.dataset import Dataset
from .torch import buffers_in_worker, objects_in_main, pack_for_transfer, pipeline_for_worker, reader_index


class ShardfeedIterableDataset(torch.utils.data.IterableDataset):
    """Iterates this reader's share of a shardfeed pipeline (see :mod:`shardfeed.adapters.torch`).

    ``state_dict()`` is the state of the pass in progress in this process (a DataLoader
    worker's own, under ``StatefulDataLoader``); ``load_state_dict(state)`` makes the next
    pass resume there."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self._it: Any = None
        self._resume: Mapping[str, Any] | None = None
        self._reader: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        # A generator's body starts at the first next(): its caller is the worker's fetcher.
        whole = torch.utils.data.get_worker_info() is not None and _converts_batches_whole(
            sys._getframe(0).f_back, self)
        source, spec = buffers_in_worker(self.dataset) if whole else (self.dataset, None)
        ds, index, count = pipeline_for_worker(source, self.rank, self.world_size)
        resume, self._resume = self._resume, None
        if resume is not None:
            _check_reader(resume.get("reader"), index, count, self.world_size)
        it = ds.iter_from_state(resume["pipeline"]) if resume and resume.get("pipeline") else iter(ds)
        self._it, self._reader = it, (index, count)
        try:
            if torch.utils.data.get_worker_info() is None:
                yield from it
            elif whole:  # pickled to the main process, where default_convert's output is made
                for element in it:
                    yield for_default_convert(pack_for_transfer(objects_in_main(element, spec) if spec else element))
            else:  # each element is pickled to the main process: bytes columns as one buffer
                for element in it:
                    yield pack_for_transfer(element)
        finally:
            it.close()

    def state_dict(self) -> dict:
        """Where this process's pass is: ``{"reader": [index, count], "pipeline": state}``."""
        if self._it is None:
            if self._resume is not None:
                return dict(self._resume)
            return {"reader": list(reader_index(self.rank, self.world_size)), "pipeline": None}
        return {"reader": list(self._reader or ()), "pipeline": self._it.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next pass from ``state`` (from :meth:`state_dict`). Raises
        ``ValueError`` at once for a state another reader saved (another DataLoader worker,
        rank or number of them): under ``StatefulDataLoader`` each worker loads its own state
        when it starts, so the error reaches the main process before the loader's own checks."""
        if not isinstance(state, Mapping) or "pipeline" not in state:
            raise ValueError(f"not a shardfeed dataset state: {str(state)[:200]}")
        index, count = reader_index(self.rank, self.world_size)
        _check_reader(state.get("reader"), index, count, self.world_size)
        self._resume = dict(state)

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_it"] = None  # a live pass (threads, files) does not travel to workers
        return d

    def __repr__(self) -> str:
        return f"ShardfeedIterableDataset({self.dataset!r}, rank={self.rank}, world_size={self.world_size})"


def _check_reader(saved: Any, index: int, count: int, world_size: int) -> None:
    """Refuse a state saved by reader ``saved`` (``[index, count]`` among all DataLoader
    workers of all ranks) in reader ``index`` of ``count``, naming workers and ranks."""
    if saved is None or [int(x) for x in saved] == [index, count]:
        return

    def who(i: int, c: int) -> str:
        if c % max(1, world_size):  # saved by another number of ranks: its workers are not known
            return f"reader {i} of {c}"
        workers = max(1, c // max(1, world_size))
        return f"DataLoader worker {i % workers} of {workers} on rank {i // workers} of {c // workers}"

    si, sc = int(saved[0]), int(saved[1])
    workers = max(1, count // max(1, world_size))
    raise ValueError(f"this state was saved by {who(si, sc)} (reader {si} of {sc}), but this DataLoader has "
                     f"{workers} workers and this is {who(index, count)} (reader {index} of {count}): resume with "
                     "the num_workers and the ranks it was saved with (each worker resumes its own state)")



# numpy dtypes whose arrays default_convert turns into tensors of the same values
_TORCH_DTYPES = {np.dtype(t): getattr(torch, n) for t, n in [
    (np.bool_, "bool"), (np.uint8, "uint8"), (np.int8, "int8"), (np.int16, "int16"), (np.int32, "int32"),
    (np.int64, "int64"), (np.float16, "float16"), (np.float32, "float32"), (np.float64, "float64"),
    (np.complex64, "complex64"), (np.complex128, "complex128")]}
_ALIGN = 64
IN_BAND_BYTES = 4 << 20
"""A batch whose numeric arrays hold fewer bytes than this goes through the worker's pipe
with the rest of its pickle; a larger one as tensors on one shared-memory storage."""
LARGE_BATCH_BYTES = 1 << 20
"""A batch whose numeric arrays hold this many bytes or more makes the main process warn
(once) that ``to_torch(num_workers=N)`` hands batches over at less cost."""
_warned = False


def _warn_large(nbytes: int, num_workers: int) -> None:
    """Say once per process that DataLoader workers cost more than ``to_torch(num_workers=)``
    for batches this large (called in the main process, where a batch is unpickled)."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(f"DataLoader(num_workers={num_workers}) hands each {nbytes / 1e6:.1f} MB batch of to_torch() to "
                  "the main process through PyTorch's worker queue (a pickle, or a fresh shared-memory segment per "
                  "batch), which can cost more than reading it; to_torch(num_workers="
                  f"{num_workers}) in DataLoader(num_workers=0) runs its own reader processes that hand batches over "
                  "through reusable shared-memory slots (docs/pipeline.md, Adapters)", UserWarning, stacklevel=2)


class _Noted:
    """An element (already what ``default_convert`` makes) that warns in the main process
    when unpickled there: see :func:`_warn_large`."""

    __slots__ = ("value", "nbytes", "num_workers")

    def __init__(self, value: Any, nbytes: int, num_workers: int) -> None:
        self.value, self.nbytes, self.num_workers = value, nbytes, num_workers

    def __reduce__(self) -> Any:
        return _noted_value, (self.value, self.nbytes, self.num_workers)


def _noted_value(value: Any, nbytes: int, num_workers: int) -> Any:
    _warn_large(nbytes, num_workers)
    return value


def _converts_batches_whole(frame: Any, dataset: Any) -> bool:
    """Whether the DataLoader worker that iterates ``dataset`` hands each element whole to
    PyTorch's ``default_convert`` (``batch_size=None`` and no ``collate_fn`` of the user's),
    so that :func:`for_default_convert` may stand in for it. ``frame`` is the one that called
    ``next`` on the pass: the worker's fetcher's ``fetch``. Anything else (a user's collate,
    auto-collation, another fetcher) answers False, and elements go as they are."""
    fetcher = frame.f_locals.get("self") if frame is not None else None
    return (getattr(fetcher, "dataset", None) is dataset and getattr(fetcher, "auto_collation", True) is False
            and getattr(fetcher, "collate_fn", None) is default_convert)


def _numeric(x: Any) -> bool:
    return type(x) is np.ndarray and x.ndim > 0 and x.dtype in _TORCH_DTYPES and x.dtype.isnative


def _visit(x: Any, fn: Any, hit: Any = _numeric) -> Any:
    """``x`` with ``fn`` applied to each leaf ``hit`` accepts (a numeric array) among the
    values of its dicts and the items of its tuples and named tuples (where
    ``default_convert`` looks)."""
    if type(x) is dict:
        return {k: _visit(v, fn, hit) for k, v in x.items()}
    if isinstance(x, tuple) and (type(x) is tuple or hasattr(x, "_fields")):
        items = [_visit(v, fn, hit) for v in x]
        return tuple(items) if type(x) is tuple else type(x)(*items)
    return fn(x) if hit(x) else x


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> Any:
        return _Slot, (self.index,)


class _InBand:
    """A batch on its way from a worker: ``skeleton`` (the element, its numeric arrays
    replaced by :class:`_Slot`) and their bytes in one buffer. ``default_convert`` passes it
    by; the main process unpickles it as ``default_convert(element)`` would have been."""

    __slots__ = ("skeleton", "base", "layout")

    def __init__(self, skeleton: Any, base: np.ndarray, layout: list) -> None:
        self.skeleton, self.base, self.layout = skeleton, base, layout

    def __reduce__(self) -> Any:
        return _from_band, (self.skeleton, self.base, self.layout)


def _from_band(skeleton: Any, base: np.ndarray, layout: list) -> Any:
    if not base.flags.writeable:  # torch wants writable arrays; a pickle may give a read-only one
        base = base.copy()
    arrays = [torch.from_numpy(base[o:o + dt.itemsize * int(np.prod(shape))].view(dt).reshape(shape))
              for o, dt, shape in layout]
    return default_convert(_visit(skeleton, lambda slot: arrays[slot.index], lambda x: type(x) is _Slot))


def for_default_convert(element: Any) -> Any:
    """What a DataLoader worker yields in place of ``element`` when PyTorch's
    ``default_convert`` is next (see :func:`_converts_batches_whole`), so that its numeric
    arrays reach the main process as one buffer instead of one tensor each. ``default_convert``
    makes each array a tensor whose storage the worker then moves into shared memory and hands
    over as a file descriptor, over a fresh connection: for a CTR batch of 15 numeric columns
    that cost more than reading and parsing it. Small batches (under :data:`IN_BAND_BYTES`)
    travel in the pipe with the rest of the pickle and become the same tensors in the main
    process; larger ones as tensors that are views of one shared-memory storage (one
    descriptor)."""
    parts: list[np.ndarray] = []
    _visit(element, parts.append)
    nbytes = sum(a.nbytes for a in parts)
    info = torch.utils.data.get_worker_info()
    global _warned
    large = nbytes >= LARGE_BATCH_BYTES and info is not None and info.id == 0 and not _warned
    if large:  # the main process warns once (worker 0's first large batch; none from here after it)
        _warned = True
    if not parts or (len(parts) == 1 and nbytes >= IN_BAND_BYTES):  # one segment either way: PyTorch's
        return _Noted(default_convert(element), nbytes, info.num_workers) if large else element
    offsets, total = [], 0
    for a in parts:
        offsets.append(total)
        total += -(-a.nbytes // _ALIGN) * _ALIGN
    shared = total >= IN_BAND_BYTES
    base_t = torch.empty(total, dtype=torch.uint8).share_memory_() if shared else None
    flat = base_t.numpy() if base_t is not None else np.empty(total, np.uint8)
    slots = iter(range(len(parts)))

    def place(a: np.ndarray) -> Any:
        i = next(slots)
        o, n = offsets[i], a.nbytes
        np.copyto(flat[o:o + n].view(a.dtype).reshape(a.shape), a)
        if base_t is not None:
            return base_t[o:o + n].view(_TORCH_DTYPES[a.dtype]).view(a.shape)
        return _Slot(i)

    converted = _visit(element, place)
    if shared:
        return _Noted(converted, nbytes, info.num_workers) if large else converted
    band = _InBand(converted, flat, [(o, a.dtype, a.shape) for o, a in zip(offsets, parts)])
    return _Noted(band, nbytes, info.num_workers) if large else band

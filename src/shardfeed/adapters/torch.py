"""PyTorch: a shardfeed dataset as a ``torch.utils.data.IterableDataset``.

Each DataLoader worker of each ``torch.distributed`` rank reads its own part of the data,
reader ``rank * num_workers + worker_id`` of ``world_size * num_workers``. The split is
made on the source's spans (whole files, or record ranges through index files) through the
declared hook ``Dataset._split``, so each reader fetches only its own bytes; a source that
cannot split (an in-memory list, say) has its elements dealt round robin just above it.
Shuffling, parsing and batching happen per reader after the split.

The rank and world size are captured when :func:`to_torch` is called in the rank's main
process, and travel with the dataset to its workers: spawned workers (the default on
macOS, and for jobs started with ``torch.multiprocessing.spawn``) cannot see
``torch.distributed``. The dataset class lives at module level so it pickles; with
spawn/forkserver workers the pipeline (its map functions included) must be picklable, and
the script needs a ``__main__`` guard.

``state_dict()``/``load_state_dict()`` follow ``torchdata``'s ``StatefulDataLoader``
protocol: each worker saves the state of its own pipeline and resumes from it.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import numpy as np

from ..formats.native import BytesBuffer, pack_bytes
from ..formats.spec import BYTES, FixedLen, RaggedColumn
from ..pipeline.batch import bytes_as_buffers
from ..pipeline.dataset import Dataset
from ..pipeline.slicing import split_near_source
from ..pipeline.tree import tree_map
from ..registry import require


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= slice_id < slice_count, got slice_id={rank}, slice_count={world_size}")
        return int(rank), int(world_size)
    if (rank is None) != (world_size is None):
        raise ValueError("give both slice_id and slice_count, or neither (then they come from torch.distributed "
                         "or the RANK/WORLD_SIZE environment variables)")
    from ..distributed.ranks import resolve_slice  # noqa: PLC0415

    return resolve_slice()


def reader_index(rank: int = 0, world_size: int = 1) -> tuple[int, int]:
    """``(index, count)`` of the calling reader among all DataLoader workers of all ranks."""
    from torch.utils.data import get_worker_info  # noqa: PLC0415

    info = get_worker_info()
    wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * nw + wid, world_size * nw


def split_for_reader(ds: Dataset, index: int, count: int, threads: int | None = None) -> Dataset:
    """``ds`` with its source replaced by reader ``index`` of ``count``'s share (see
    :func:`~shardfeed.pipeline.slicing.split_near_source`); ``ds`` itself for one reader
    with no thread cap."""
    if count == 1 and threads is None:
        return ds
    return split_near_source(ds, index, count, threads)


shard_near_source = split_for_reader  # the earlier name
"""The earlier name of :func:`split_for_reader`."""


class _PackedBytesArray(np.ndarray):
    """An object array of ``bytes`` that pickles as one buffer plus offsets and unpickles
    as a plain object array. A DataLoader worker sends each batch to the main process
    through a pipe: pickled value by value, a batch's bytes columns cost both processes
    more than reading and parsing it (26 values a record in CTR data)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain = np.asarray(self)
        packed = pack_bytes(plain)
        if packed is None:
            return plain.__reduce_ex__(protocol)
        return _unpack_bytes, (packed.data, packed.offsets, plain.shape)


def _unpack_bytes(data: np.ndarray, offsets: np.ndarray, shape: tuple) -> np.ndarray:
    return BytesBuffer(data, offsets).to_numpy().reshape(shape)


def _pack_leaf(x: Any) -> Any:
    if type(x) is np.ndarray and x.dtype == object and x.size:
        return x.view(_PackedBytesArray)
    if isinstance(x, RaggedColumn) and type(x.values) is np.ndarray and x.values.dtype == object:
        return dataclasses.replace(x, values=x.values.view(_PackedBytesArray))
    if type(x) is tuple:  # (features, label) and the like; named tuples (BytesBuffer) stay whole
        return tuple(_pack_leaf(v) for v in x)
    return x


def pack_for_transfer(element: Any) -> Any:
    """``element`` with each object array of its tree (and a :class:`RaggedColumn`'s
    object values) viewed as one that pickles packed: what a DataLoader worker yields.
    Nothing is copied until it is pickled; in the main process it is plain numpy again."""
    return tree_map(_pack_leaf, element, sequences=())


class _BytesInTransit:
    """A bytes column that a DataLoader worker parsed as one buffer, on its way to the main
    process, where it unpickles as the object array that ``bytes_as="object"`` gives."""

    __slots__ = ("buffer", "shape")

    def __init__(self, buffer: BytesBuffer, shape: tuple) -> None:
        self.buffer, self.shape = buffer, shape

    def __reduce__(self) -> Any:
        return _unpack_bytes, (self.buffer.data, self.buffer.offsets, self.shape)


def buffers_in_worker(ds: Dataset) -> tuple[Dataset, Any]:
    """``(pipeline, spec)``: :func:`~shardfeed.pipeline.batch.bytes_as_buffers` of a
    worker's pipeline, whose batches are pickled anyway (the objects are made in the main
    process: :func:`objects_in_main`)."""
    return bytes_as_buffers(ds)


def objects_in_main(batch: Any, spec: Any) -> Any:
    """A batch of :func:`buffers_in_worker`'s pipeline with each bytes column wrapped to
    unpickle as its object form: what ``bytes_as="object"`` would have given."""
    out = dict(batch)
    for name, s in spec.items():
        col = out.get(name)
        if getattr(s, "dtype", None) != BYTES:
            continue
        if isinstance(s, FixedLen) and isinstance(col, BytesBuffer):
            out[name] = _BytesInTransit(col, (len(col) // s.size, *s.shape))
        elif isinstance(col, RaggedColumn) and isinstance(col.values, BytesBuffer):
            out[name] = dataclasses.replace(col, values=_BytesInTransit(col.values, (len(col.values),)))
    return out


def _torch_dataset_class() -> type:
    from ._torch_dataset import ShardfeedIterableDataset  # noqa: PLC0415 - imports torch

    return ShardfeedIterableDataset


def to_torch(ds: Dataset, slice_id: int | None = None, slice_count: int | None = None, *,
             num_workers: int = 0, buffer_size: int | None = None,
             rank: int | None = None, world_size: int | None = None) -> Any:
    """A ``torch.utils.data.IterableDataset`` over ``ds``, split across DataLoader workers
    and distributed ranks without duplicates, each reader fetching only its share.
    ``slice_id``/``slice_count`` (which rank of how many: the word every shardfeed reader
    uses) default to ``torch.distributed``'s rank and world size when it is initialized,
    else ``RANK``/``WORLD_SIZE`` and the like, else 0/1; they are fixed here, in the calling
    process. ``rank``/``world_size`` are accepted as the older spelling (a
    ``DeprecationWarning``). Raises ``ImportError`` with an install hint when PyTorch is
    missing.

    ``num_workers=N`` (N >= 1): N reader processes of its own, each reading the share a
    DataLoader worker would and handing its batches over through reusable shared-memory
    slots (:mod:`shardfeed.adapters.torch_workers`): ``buffer_size`` batches ahead per worker,
    or by default as many as fit in 64 MiB per worker, 4 to 16 of them (a worker that may run
    ahead rides out the moments the other processes hold the cores); batches come one from each
    worker in turn, numeric arrays as tensors sharing the slot's memory. Use it with
    ``DataLoader(..., batch_size=None, num_workers=0)`` or directly; ``close()`` stops the
    processes. The pipeline must pickle (``TypeError`` names what does not)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"to_torch num_workers must be an int >= 0 (0: read in this process, or in the "
                         f"DataLoader's workers), got {num_workers!r}")
    if rank is not None or world_size is not None:
        if slice_id is not None or slice_count is not None:
            raise ValueError("give slice_id/slice_count (or the older rank/world_size), not both")
        warnings.warn("to_torch(rank=, world_size=) is now to_torch(slice_id=, slice_count=)", DeprecationWarning,
                      stacklevel=3)
        slice_id, slice_count = rank, world_size
    require("torch", what="to_torch")
    cls = _torch_dataset_class()
    r, w = _rank_and_world(slice_id, slice_count)
    if num_workers:
        from .torch_workers import ShardfeedWorkersDataset  # noqa: PLC0415 - imports torch

        return ShardfeedWorkersDataset(ds, r, w, num_workers, buffer_size)
    return cls(ds, r, w)


def worker_threads(num_workers: int) -> int | None:
    """Threads each of ``num_workers`` reader processes may use: the cores shared out."""
    if num_workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // num_workers)


def pipeline_for_worker(ds: Dataset, rank: int, world_size: int) -> tuple[Dataset, int, int]:
    """The pipeline the calling DataLoader worker (or main process) iterates."""
    index, count = reader_index(rank, world_size)
    from torch.utils.data import get_worker_info  # noqa: PLC0415

    info = get_worker_info()
    threads = worker_threads(info.num_workers) if info is not None else None
    return split_for_reader(ds, index, count, threads), index, count


__all__ = ["to_torch", "reader_index", "split_for_reader", "shard_near_source", "pipeline_for_worker",
           "pack_for_transfer", "buffers_in_worker", "objects_in_main"]

"""``to_torch(num_workers=N)``: DataLoader-style reader processes on the ``in_subprocess``
transport. Imported only by :func:`shardfeed.adapters.torch.to_torch` (it imports torch).

Worker ``k`` of ``N`` on rank ``r`` of ``R`` is reader ``r * N + k`` of ``R * N``, the
share a DataLoader worker ``k`` reads (split on the source's spans, below every stage), and
runs that pipeline in an ``in_subprocess`` child: its batches cross through reusable
shared-memory slots, not PyTorch's worker queue (a pickle, or a fresh shared-memory segment
per batch). The main process takes one batch from each worker in turn, 0, 1, ..., skipping
a worker that has ended (what a DataLoader does with an ``IterableDataset``), so the order
is deterministic and each record comes once a pass. Numeric arrays become tensors with
``torch.from_numpy``: views of the slot, which goes back to its child when the last tensor
(or array) on it is gone. The children, and their slots, serve every pass (epoch) of the
dataset until :meth:`ShardfeedWorkersDataset.close`, the dataset's garbage collection, or
interpreter exit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch.utils.data
from torch.utils.data._utils.collate import default_convert

from ..pipeline.dataset import Dataset
from ..pipeline.round_robin import RoundRobinDataset
from ..pipeline.stats import PipelineStats
from .torch import split_for_reader, worker_threads

WORKER_SLOTS = 16
"""Batches a worker may have in the main process's slots at once, by default..."""
WORKER_SLOT_BYTES = 64 << 20
"""... as far as they fit in this many bytes (at least 4 batches, however large). Measured on
2 cores shared by 3 processes, a CTR batch of 1,024 records: 4 slots a worker 0.85-1.1M
records/s, 16 slots 1.2-2.2M in the same runs, under load (a worker that may run further
ahead rides out the time slices the other processes hold the cores for)."""


def workers_pipeline(ds: Dataset, rank: int, world_size: int, num_workers: int,
                     buffer_size: int | None) -> RoundRobinDataset:
    """The round robin of ``num_workers`` ``in_subprocess`` readers of rank ``rank``'s share
    (``buffer_size``: slots a worker; ``None``: :data:`WORKER_SLOTS` within :data:`WORKER_SLOT_BYTES`)."""
    count = world_size * num_workers
    threads = worker_threads(num_workers)
    readers = []
    for k in range(num_workers):
        reader = split_for_reader(ds, rank * num_workers + k, count, threads).in_subprocess(
            WORKER_SLOTS if buffer_size is None else buffer_size)
        if buffer_size is None:
            reader.slot_bytes = WORKER_SLOT_BYTES  # type: ignore[attr-defined]
        readers.append(reader)
    names = [f"to_torch worker {k} of {num_workers} (reader {rank * num_workers + k} of {count})"
             for k in range(num_workers)]
    return RoundRobinDataset(readers, names)


def _leaf(v: Any) -> Any:
    if type(v) is np.ndarray:
        if v.dtype.kind in "biufc" and v.dtype.isnative:
            return torch.from_numpy(v)  # a view: the tensor keeps the array, and so the slot
        return v if v.dtype.kind in "OUS" else default_convert(v)
    if isinstance(v, np.generic):
        return default_convert(v)
    return to_tensors(v)


def to_tensors(x: Any) -> Any:
    """``x`` with its numeric numpy arrays as tensors sharing their memory (where
    DataLoader's ``default_convert`` looks: dict values, tuple and list items); object
    arrays, ragged columns and buffers stay as they are. A dict is changed in place: a
    batch from ``in_subprocess`` keeps its bytes columns unmade until read."""
    if isinstance(x, dict):
        for k, v in list(dict.items(x)):  # unbound: a lazy batch's bytes columns stay buffers
            t = _leaf(v)
            if t is not v:
                dict.__setitem__(x, k, t)
        return x
    if type(x) is tuple or type(x) is list:
        return type(x)(_leaf(v) for v in x)
    if type(x) is np.ndarray or isinstance(x, np.generic):
        return _leaf(x)
    return x


class ShardfeedWorkersDataset(torch.utils.data.IterableDataset):
    """``num_workers`` reader processes of this rank's share, dealt round robin (see the
    module docstring). Iterate it directly or through ``DataLoader(..., batch_size=None,
    num_workers=0)``; ``state_dict()``/``load_state_dict()`` as ``to_torch()``'s; ``stats()``
    of the latest pass (each worker's stages, then a ``subprocess`` stage per worker);
    ``close()`` stops the children (also a ``with`` block's end)."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int, num_workers: int,
                 buffer_size: int | None) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.buffer_size = buffer_size
        self._pipeline: RoundRobinDataset | None = None
        self._it: Any = None
        self._resume: Mapping[str, Any] | None = None

    def _readers(self) -> RoundRobinDataset:
        if self._pipeline is None:  # made once: its children serve every pass
            self._pipeline = workers_pipeline(self.dataset, self.rank, self.world_size, self.num_workers,
                                              self.buffer_size)
        return self._pipeline

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(f"to_torch(num_workers={self.num_workers}) starts its own reader processes and cannot "
                               "run inside a DataLoader worker: use DataLoader(ds, batch_size=None, num_workers=0), "
                               "or iterate it directly")
        pipeline = self._readers()
        resume, self._resume = self._resume, None
        it = pipeline.iter_from_state(resume["pipeline"]) if resume and resume.get("pipeline") else iter(pipeline)
        self._it = it
        try:
            for x in it:
                yield to_tensors(x)
        finally:
            it.close()

    def state_dict(self) -> dict:
        """Where the pass in progress is: ``{"reader": [slice_id, slice_count], "num_workers": N,
        "pipeline": state}`` (every worker's position, and whose turn is next)."""
        head = {"reader": [self.rank, self.world_size], "num_workers": self.num_workers}
        if self._it is None:
            if self._resume is not None:
                return dict(self._resume)
            return {**head, "pipeline": None}
        return {**head, "pipeline": self._it.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next pass from ``state`` (from :meth:`state_dict`). Raises ``ValueError``
        for a state of another rank or another number of workers (each worker resumes its
        own share)."""
        if not isinstance(state, Mapping) or "pipeline" not in state or "num_workers" not in state:
            raise ValueError(f"not a state of to_torch(num_workers=...): {str(state)[:200]}")
        saved = (list(state.get("reader") or [self.rank, self.world_size]), int(state["num_workers"]))
        if saved != ([self.rank, self.world_size], self.num_workers):
            raise ValueError(f"this state was saved by rank {saved[0][0]} of {saved[0][1]} with "
                             f"to_torch(num_workers={saved[1]}), and this is rank {self.rank} of {self.world_size} "
                             f"with to_torch(num_workers={self.num_workers}): resume with the ranks and num_workers "
                             "it was saved with")
        self._resume = dict(state)

    def stats(self) -> PipelineStats:
        """Statistics of the latest pass: each worker's stages (as it sent them) and its
        ``subprocess`` stage (``child_pid``, ``zero_copy``, ``copied_out``, ``held_slots``),
        the ``round_robin`` stage (``given``: batches per worker), the consumer's wait."""
        return self._pipeline.stats() if self._pipeline is not None else PipelineStats()

    def close(self) -> None:
        """Stop the pass in progress and every worker process, and remove their shared
        memory; idempotent. A later pass starts new ones."""
        it, self._it = self._it, None
        if it is not None:
            it.close()
        if self._pipeline is not None:
            self._pipeline.close()

    def __enter__(self) -> "ShardfeedWorkersDataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_it"] = d["_pipeline"] = None  # processes and a live pass stay with this process
        return d

    def __repr__(self) -> str:
        return (f"ShardfeedWorkersDataset({self.dataset!r}, rank={self.rank}, world_size={self.world_size}, "
                f"num_workers={self.num_workers})")


__all__ = ["ShardfeedWorkersDataset", "to_tensors", "workers_pipeline"]

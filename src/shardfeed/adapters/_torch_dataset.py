"""The PyTorch dataset class, at module level so that spawned DataLoader workers can
unpickle it. Imported only by :func:`shardfeed.adapters.torch.to_torch` (it imports torch)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch.utils.data

from ..pipeline.dataset import Dataset
from .torch import pack_for_transfer, pipeline_for_worker


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
        ds, index, count = pipeline_for_worker(self.dataset, self.rank, self.world_size)
        resume, self._resume = self._resume, None
        if resume is not None and resume.get("reader") not in (None, [index, count]):
            raise ValueError(f"this state was saved by reader {resume['reader']} (index, count), not by "
                             f"reader {[index, count]}: resume with the same number of workers and ranks")
        it = ds.iter_from_state(resume["pipeline"]) if resume and resume.get("pipeline") else iter(ds)
        self._it, self._reader = it, (index, count)
        try:
            if torch.utils.data.get_worker_info() is None:
                yield from it
            else:  # each element is pickled to the main process: bytes columns as one buffer
                for element in it:
                    yield pack_for_transfer(element)
        finally:
            it.close()

    def state_dict(self) -> dict:
        """Where this process's pass is: ``{"reader": [index, count], "pipeline": state}``."""
        if self._it is None:
            return dict(self._resume) if self._resume is not None else {"reader": None, "pipeline": None}
        return {"reader": list(self._reader or ()), "pipeline": self._it.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next pass from ``state`` (from :meth:`state_dict`)."""
        if not isinstance(state, Mapping) or "pipeline" not in state:
            raise ValueError(f"not a shardfeed dataset state: {str(state)[:200]}")
        self._resume = dict(state)

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_it"] = None  # a live pass (threads, files) does not travel to workers
        return d

    def __repr__(self) -> str:
        return f"ShardfeedIterableDataset({self.dataset!r}, rank={self.rank}, world_size={self.world_size})"

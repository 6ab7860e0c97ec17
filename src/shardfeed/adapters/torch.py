"""PyTorch: a shardfeed dataset as a ``torch.utils.data.IterableDataset``.

Each DataLoader worker of each ``torch.distributed`` rank iterates its own part of the
data: the elements of the first stage above the source are dealt round-robin over
``world_size * num_workers`` readers (reader ``rank * num_workers + worker_id``), so no
element is seen twice and none is lost; shuffling, parsing and batching after that point
happen per reader. Use ``DataLoader(ds.to_torch(), batch_size=None, num_workers=...)``
when the dataset already batches. With spawn/forkserver workers, the dataset (its map
functions included) must be picklable, and the script needs a ``__main__`` guard.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

from ..pipeline.dataset import Dataset, UnaryDataset


def reader_index(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(index, count)`` of the calling reader among all DataLoader workers of all ranks."""
    import torch.distributed as dist  # noqa: PLC0415
    from torch.utils.data import get_worker_info  # noqa: PLC0415

    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    info = get_worker_info()
    wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * nw + wid, world_size * nw


def shard_near_source(ds: Dataset, index: int, count: int) -> Dataset:
    """``ds`` with ``.shard(index, count)`` inserted just above its source, when the chain
    has one upstream per stage (so records are dealt before they are parsed or shuffled);
    otherwise ``ds.shard(index, count)``."""
    if count == 1:
        return ds
    chain = []
    node = ds
    while isinstance(node, UnaryDataset):
        chain.append(node)
        node = node.parent
    if not chain:
        return ds.shard(index, count)
    rebuilt = node.shard(index, count)
    for stage in reversed(chain):
        clone = copy.copy(stage)
        clone.__dict__.pop("_passes", None)
        clone.__dict__.pop("_last_stats", None)
        clone.parent = rebuilt
        rebuilt = clone
    return rebuilt


def to_torch(ds: Dataset, rank: int | None = None, world_size: int | None = None) -> Any:
    """A ``torch.utils.data.IterableDataset`` over ``ds``, split across DataLoader workers
    and distributed ranks without duplicates. ``rank``/``world_size`` default to
    ``torch.distributed``'s when it is initialized, else 0/1. Raises ``ImportError`` with
    an install hint when PyTorch is missing."""
    try:
        import torch.utils.data  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("to_torch needs PyTorch: pip install torch") from exc

    class ShardfeedIterableDataset(torch.utils.data.IterableDataset):
        def __init__(self) -> None:
            self.dataset = ds

        def __iter__(self) -> Iterator[Any]:
            index, count = reader_index(rank, world_size)
            it = iter(shard_near_source(self.dataset, index, count))
            try:
                yield from it
            finally:
                it.close()

        def __repr__(self) -> str:
            return f"ShardfeedIterableDataset({self.dataset!r})"

    return ShardfeedIterableDataset()

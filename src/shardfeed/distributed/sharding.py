"""Static sharding: which files, record ranges or row ranges each worker reads.

Every worker computes the same plan for all ranks (no communication), then keeps its own
part. By file, when the files do not divide evenly among the workers, one of the three
strategies of the PAI/Whale documentation applies:

- ``"shuffle"`` (their default): no split; every worker reads the whole list, in its own
  seeded order. The only choice when there are fewer files than workers.
- ``"uneven"``: split anyway; some workers get one file more
  (``WHALE_UNBALANCED_IO_SLICING=True``).
- ``"drop"``: split evenly and leave the remaining files out (``WHALE_DROP_LAST_FILES=True``).

By record (through index files) or by row (tables, through row counts) the split is exact
to one record: ``"uneven"`` (default; sizes differ by at most one) or ``"drop"`` (every
worker gets ``total // workers``).

Uneven splits leave some ranks with more batches than others, and collective training
(all-reduce) then hangs at the end of the epoch: :func:`equal_counts` gives the per-rank
record count that makes every rank yield the same number of batches (``"pad"``: repeat
records up to the largest share; ``"min"``: stop at the smallest).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..pipeline.ranges import split_ranges
from ..tables.urls import is_table_url
from .items import RowCounter, Units, WorkItem, apply_prefix, count_units, row_counter_of
from .ranks import resolve_slice

logger = logging.getLogger(__name__)

STRATEGIES = ("shuffle", "uneven", "drop")
"""The ``strategy`` values for files that do not divide evenly among workers: ``"shuffle"``
(every worker reads every file, in its own seeded order), ``"uneven"`` (some workers get
one file more), ``"drop"`` (the remaining files are left out)."""
BY = ("file", "record", "row")
EQUAL_STEPS = (None, "pad", "min")


def _truthy(v: str | None) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def default_strategy(env: Mapping[str, str] | None = None) -> str:
    """The file strategy the environment asks for (Whale's variables), else ``"shuffle"``.
    ``WHALE_UNBALANCED_IO_SLICING`` wins over ``WHALE_DROP_LAST_FILES``, as in Whale."""
    env = os.environ if env is None else env
    if _truthy(env.get("WHALE_UNBALANCED_IO_SLICING")):
        return "uneven"
    if _truthy(env.get("WHALE_DROP_LAST_FILES")):
        return "drop"
    return "shuffle"


def _check(by: str, strategy: str | None) -> str:
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, got {by!r}")
    if strategy is None:
        return default_strategy() if by == "file" else "uneven"
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "shuffle" and by != "file":
        raise ValueError("strategy='shuffle' (every worker reads everything) applies to by='file'; "
                         "by record or row use 'uneven' (sizes differ by one) or 'drop'")
    return strategy


def plan_shards(
    works: Iterable[str],
    slice_count: int,
    *,
    by: str = "file",
    strategy: str | None = None,
    seed: int = 0,
    prefix: str | None = None,
    row_counts: Mapping[str, int] | RowCounter | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[list[WorkItem]]:
    """The items of every rank: ``plan[rank]``. Deterministic for the same arguments.

    ``by="file"``: whole works, round robin (rank ``r`` gets works ``r, r+n, ...``), or the
    ``strategy`` when they do not divide evenly. ``by="record"``/``"row"``: the records
    (through ``<file>.idx`` index files) or rows (``row_counts``) of all works in order,
    cut into ``slice_count`` contiguous ranges. Raises ``ValueError`` for a split that
    would leave a rank with nothing (fewer files than ranks), naming the fix.
    """
    if isinstance(slice_count, bool) or not isinstance(slice_count, int) or slice_count < 1:
        raise ValueError(f"slice_count must be a positive int, got {slice_count!r}")
    strategy = _check(by, strategy)
    urls = apply_prefix(works, prefix)
    n = len(urls)
    if by == "file":
        if n % slice_count == 0 or strategy != "shuffle" and n >= slice_count:
            keep = n if strategy != "drop" else n - n % slice_count
            if keep < n:
                logger.warning("strategy 'drop': %d of %d files are left out so %d workers get %d each",
                               n - keep, n, slice_count, keep // slice_count)
            return [[WorkItem(u, "rows" if is_table_url(u) else "file") for u in urls[r:keep:slice_count]]
                    for r in range(slice_count)]
        if strategy != "shuffle":
            raise ValueError(f"{n} files cannot be split among {slice_count} workers without leaving some "
                             "with none: use strategy='shuffle' (every worker reads all files in its own "
                             "order) or by='record' (needs index files)")
        plan = []
        for r in range(slice_count):
            mine = [WorkItem(u, "rows" if is_table_url(u) else "file") for u in urls]
            random.Random(f"{seed}:shard:{r}").shuffle(mine)
            plan.append(mine)
        return plan
    units = Units(row_counter_of(row_counts), storage_options)
    sizes = [units.size(u) for u in urls]
    total = sum(sizes)
    if strategy == "drop":
        each = total // slice_count
        bounds = [(r * each, (r + 1) * each) for r in range(slice_count)]
    else:
        bounds = split_ranges(total, slice_count)
        bounds += [(total, total)] * (slice_count - len(bounds))
    plan = []
    for lo, hi in bounds:
        mine, base = [], 0
        for u, size in zip(urls, sizes):
            a, b = max(lo, base), min(hi, base + size)
            if a < b:
                mine.append(units.item(u, a - base, b - base))
            base += size
        plan.append(mine)
    return plan


def shard_works(
    works: Iterable[str],
    slice_id: int | None = None,
    slice_count: int | None = None,
    **kwargs: Any,
) -> list[WorkItem]:
    """This rank's items of :func:`plan_shards` (``slice_id``/``slice_count`` from the
    environment when not given, see :func:`~shardfeed.distributed.ranks.resolve_slice`)."""
    slice_id, slice_count = resolve_slice(slice_id, slice_count)
    return plan_shards(works, slice_count, **kwargs)[slice_id]


def plan_sizes(plan: Sequence[Sequence[WorkItem]], row_counts: Mapping[str, int] | RowCounter | None = None,
               storage_options: Mapping[str, Any] | None = None) -> list[int]:
    """Records (or rows) of every rank of a plan. Whole files are counted through their
    index files, or by reading them when they have none."""
    counter = row_counter_of(row_counts)
    cache: dict[str, int] = {}

    def size(it: WorkItem) -> int:
        if it.size is not None:
            return it.size
        if it.work not in cache:
            cache[it.work] = count_units(it.work, counter, storage_options, scan=True)
        return cache[it.work]

    return [sum(size(it) for it in items) for items in plan]


def equal_counts(sizes: Sequence[int], mode: str | None) -> int | None:
    """How many records every rank yields so that all yield the same number: the largest
    share (``"pad"``, repeating records) or the smallest (``"min"``); ``None``: unchanged.
    Raises ``ValueError`` when padding a rank that has no records at all."""
    if mode not in EQUAL_STEPS:
        raise ValueError(f"equal_steps must be None, 'pad' or 'min', got {mode!r}")
    if mode is None:
        return None
    if mode == "min":
        return min(sizes)
    if max(sizes) > 0 and min(sizes) == 0:
        raise ValueError(f"equal_steps='pad' cannot pad a rank that has no records (shares: {list(sizes)}); "
                         "use equal_steps='min' or fewer ranks")
    return max(sizes)

"""Splitting training input among workers: static shards and a shared work queue.

- :func:`plan_shards` / :func:`shard_works` / :func:`read_shard`: each worker's fixed part
  (files, record ranges, row ranges), with the uneven-split strategies and equal steps.
- :class:`WorkQueue`: elastic sharing (fast workers take more), leases, checkpoints,
  metrics; backends in-process, SQLite file, Redis.
"""

from .backend import QueueBackend, default_backend_url, open_queue_backend
from .items import WorkItem
from .ranks import resolve_slice
from .reading import iter_item_records, read_queue, read_shard
from .sharding import STRATEGIES, default_strategy, equal_counts, plan_shards, plan_sizes, shard_works
from .workqueue import WorkQueue, WorkQueueMismatchError, epoch_order

open_backend = open_queue_backend  # the earlier name (tables have open_table_backend)

__all__ = [
    "QueueBackend", "STRATEGIES", "WorkItem", "WorkQueue", "WorkQueueMismatchError", "default_backend_url",
    "default_strategy", "epoch_order", "equal_counts", "iter_item_records", "open_queue_backend", "plan_shards",
    "plan_sizes", "read_queue",
    "read_shard", "resolve_slice", "shard_works",
]

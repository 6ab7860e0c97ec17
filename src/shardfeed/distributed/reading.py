"""Reading work items into the pipeline: the distributed layer's span providers.

Work items (whole files or record ranges) become :class:`~shardfeed.pipeline.spans.Span`
s, and the one TFRecord source (:mod:`shardfeed.pipeline.records`) reads them: a static
shard (:func:`read_shard`, a :class:`~shardfeed.pipeline.spans.StaticSpans` of the rank's
plan) or what a worker takes off a :class:`WorkQueue` (:class:`QueueSpans`, which
``sf.read_tfrecord(queue, ...)`` uses).

The queue's provider and when it acknowledges an item live in
:mod:`shardfeed.distributed.queue_spans`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..deprecation import renamed_argument
from ..formats.spec import FeatureSpec
from ..formats.tfrecord import ReadStats
from ..pipeline.records import TFRecordSource
from ..pipeline.sources import SourceDataset
from ..pipeline.spans import StaticSpans
from ..pipeline.userfn import stop_error
from ..storage.urls import mask
from .items import RowCounter, WorkItem
from .queue_spans import TAKE_SLICE_S, QueueSpans, item_span  # noqa: F401 - TAKE_SLICE_S: its old home
from .ranks import resolve_slice
from .sharding import equal_counts, plan_shards, plan_sizes

if TYPE_CHECKING:
    from ..pipeline.dataset import Dataset
    from .workqueue import WorkQueue

logger = logging.getLogger(__name__)

OpenItem = Callable[[WorkItem], Iterator[Any]]

_NONE = object()

def iter_item_records(
    item: WorkItem,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    open_item: OpenItem | None = None,
) -> Iterator[Any]:
    """The serialized records of one item: a whole TFRecord file or a record range (rows
    of a table item through ``open_item``). Acknowledging is the caller's business."""
    if open_item is not None or item.kind == "rows":
        if open_item is None:
            item_span(item)  # raises, naming the fix
        yield from _open_rows(open_item, item)  # type: ignore[arg-type]
        return
    span = item_span(item, storage_options)
    src = TFRecordSource(StaticSpans([span]), None, compression, verify_crc, on_corrupt, storage_options, None)
    it = iter(src)
    try:
        yield from it
    finally:
        it.close()


def _open_rows(open_item: OpenItem, item: WorkItem) -> Iterator[Any]:
    """``iter(open_item(item))``; a ``StopIteration`` out of that call is the function's
    error (PEP 479's rule), not the end of the pass: the reader's caller takes a
    ``StopIteration`` for the end of the data, and the items after it would be lost."""
    try:
        return iter(open_item(item))
    except StopIteration as exc:
        raise stop_error(open_item, f"open_item, for item {mask(item.work)}:", exc) from exc


# -- a fixed list of items (static shards) -----------------------------------------------------
class _CustomItemsReader:
    """Items read by a caller's ``open_item`` (table rows, say); resumes by item and count."""

    bytes_read = 0

    def __init__(self, items: Sequence[WorkItem], open_item: OpenItem, state: Mapping[str, Any] | None) -> None:
        self.items, self.open_item = items, open_item
        self.k = int(state["item"]) if state else 0
        self.delivered = int(state.get("delivered", 0)) if state else 0
        self.it: Iterator[Any] | None = None
        if self.delivered and self.k < len(items):
            self.it = _open_rows(open_item, items[self.k])
            for n in range(self.delivered):
                if next(self.it, _NONE) is _NONE:  # a StopIteration here would end the pass quietly
                    raise ValueError(f"cannot resume: open_item gives {n} rows for item {mask(items[self.k].work)} "
                                     f"now, the state says {self.delivered} were delivered (did the data change?)")

    def __next__(self) -> Any:
        while True:
            if self.it is None:
                if self.k >= len(self.items):
                    raise StopIteration
                self.it, self.delivered = _open_rows(self.open_item, self.items[self.k]), 0
            try:
                x = next(self.it)
            except StopIteration:
                self.close()
                self.k += 1
                continue
            self.delivered += 1
            return x

    def get_state(self) -> dict:
        return {"item": self.k, "delivered": self.delivered}

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()
        self.it = None


class CustomItemsDataset(SourceDataset):
    """What ``open_item`` yields for each of a list of items, in order."""

    kind = "items"

    def __init__(self, items: Sequence[WorkItem], open_item: OpenItem) -> None:
        self.items = list(items)
        self.open_item = open_item
        self.read_stats = ReadStats()

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _CustomItemsReader:
        return _CustomItemsReader(self.items, self.open_item, state)

    def __repr__(self) -> str:
        return f"CustomItemsDataset({len(self.items)} items)"


@renamed_argument("works", "source")
def read_shard(
    source: Iterable[str],
    spec: Mapping[str, FeatureSpec] | None = None,
    *,
    slice_id: int | None = None,
    slice_count: int | None = None,
    by: str = "file",
    strategy: str | None = None,
    seed: int = 0,
    equal_steps: str | None = None,
    prefix: str | None = None,
    row_counts: Mapping[str, int] | RowCounter | None = None,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    open_item: OpenItem | None = None,
    num_parallel_reads: int | None = -1,
    on_error: Any = None,
) -> "Dataset":
    """The records of this worker's static shard of ``source`` (see
    :func:`~shardfeed.distributed.sharding.plan_shards` for ``by``/``strategy``/``seed``),
    read by the TFRecord source over the rank's spans (only this rank's bytes are fetched;
    ``num_parallel_reads`` as in ``sf.read_tfrecord``, default ``AUTOTUNE``).

    ``equal_steps``: ``"pad"`` (repeat this rank's records up to the largest share) or
    ``"min"`` (stop at the smallest), so that every rank yields the same number of
    records, hence of batches, and collective training does not hang at the epoch's end.
    Counting a whole file's records uses its index file, or reads it.
    """
    slice_id, slice_count = resolve_slice(slice_id, slice_count)
    plan = plan_shards(source, slice_count, by=by, strategy=strategy, seed=seed, prefix=prefix,
                       row_counts=row_counts, storage_options=storage_options)
    mine = plan[slice_id]
    ds: Any
    if open_item is not None or any(it.kind == "rows" for it in mine):
        if open_item is None:
            item_span(next(it for it in mine if it.kind == "rows"))  # raises, naming the fix
        ds = CustomItemsDataset(mine, open_item)  # type: ignore[arg-type]
    else:
        indexes: dict[str, Any] = {}
        spans = [item_span(it, storage_options, indexes) for it in mine]
        ds = TFRecordSource(StaticSpans(spans), spec, compression, verify_crc, on_corrupt, storage_options,
                            num_parallel_reads, on_error=on_error)
    if equal_steps is not None:
        sizes = plan_sizes(plan, row_counts, storage_options)
        target = equal_counts(sizes, equal_steps)
        own = sizes[slice_id]
        if target is not None and target != own:
            ds = ds.repeat().take(target) if target > own else ds.take(target)
    return ds


class _QueueItemsReader:
    """The items themselves (or what ``open_item`` makes of them), each acknowledged at its end."""

    bytes_read = 0

    def __init__(self, queue: "WorkQueue", auto_ack: bool, open_item: OpenItem | None) -> None:
        self.q, self.auto_ack, self.open_item = queue, auto_ack, open_item
        self.item: WorkItem | None = None
        self.it: Iterator[Any] | None = None
        self.to_ack: WorkItem | None = None
        self.taken = 0
        self.done = False

    def _take(self) -> bool:
        done, self.to_ack = self.to_ack, None
        item = self.q.ack_and_take(done) if done is not None else self.q.take()
        if item is None:
            self.done = True
            return False
        self.item, self.taken = item, self.taken + 1
        if self.open_item is not None:
            self.it = _open_rows(self.open_item, item)
        return True

    def _finish(self) -> None:
        item, self.item, self.it = self.item, None, None
        if item is not None and self.auto_ack:
            self.to_ack = item

    def __next__(self) -> Any:
        if self.open_item is None:
            self._finish()
            if self.done or not self._take():
                raise StopIteration
            return self.item
        while True:
            if self.item is None and (self.done or not self._take()):
                raise StopIteration
            try:
                return next(self.it)  # type: ignore[arg-type]
            except StopIteration:
                self._finish()

    def get_state(self) -> dict:
        return {"taken": self.taken}

    def close(self) -> None:
        done, self.to_ack = self.to_ack, None
        if done is not None:
            self.q.ack(done)
        item, self.item = self.item, None
        if item is not None:
            try:
                self.q.release(item)
            except Exception:  # noqa: BLE001 - closing goes on; the lease expires anyway
                logger.warning("work queue %r: could not give back item %s", self.q.name, item.id, exc_info=True)


class QueueItemsDataset(SourceDataset):
    """The items a worker takes off ``queue`` until it is drained (see ``WorkQueue.dataset``),
    or, with ``open_item``, what that function yields for each item."""

    kind = "workqueue"

    def __init__(self, queue: "WorkQueue", auto_ack: bool = True, open_item: OpenItem | None = None) -> None:
        self.queue = queue
        self.auto_ack = auto_ack
        self.open_item = open_item
        self.read_stats = ReadStats()

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _QueueItemsReader:
        return _QueueItemsReader(self.queue, self.auto_ack, self.open_item)

    def __repr__(self) -> str:
        return f"{self.queue!r}.dataset()"


@renamed_argument("queue", "source")
def read_queue(
    source: "WorkQueue",
    spec: Mapping[str, FeatureSpec] | None = None,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    open_item: OpenItem | None = None,
    num_parallel_reads: int | None = -1,
    on_error: Any = None,
) -> "Dataset":
    """A dataset of the records of the items this worker takes off ``source``: whole
    TFRecord files or record ranges, read by the TFRecord source (``open_item(item)``
    reads other kinds, such as table row ranges). Parsed with ``spec`` like
    ``sf.read_tfrecord``. Each item is acknowledged after its last record reached the
    consumer of the pass (docs/distributed.md, Leases); its lease is renewed until then."""
    from .workqueue import WorkQueue  # noqa: PLC0415

    if not isinstance(source, WorkQueue):
        raise TypeError(f"read_queue needs a WorkQueue, got {type(source).__name__}")
    if open_item is not None:
        return QueueItemsDataset(source, True, open_item)
    return TFRecordSource(QueueSpans(source, storage_options), spec, compression, verify_crc, on_corrupt,
                          storage_options, num_parallel_reads, on_error=on_error)

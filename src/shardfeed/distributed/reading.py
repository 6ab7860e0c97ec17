"""Reading work items into the pipeline: the records of a file or of a record range, from
a static shard (:func:`read_shard`) or from what a worker takes off a :class:`WorkQueue`
(:func:`read_queue`, which ``sf.read_tfrecord(queue, ...)`` calls).

A queue reader acknowledges an item once its last record was delivered (when the record
after it is asked for, or at the end), renews the item's lease while records flow, stops
an item at once if its lease was lost (another worker now reads it), and gives back the
item it holds when the pass is closed early.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..errors import DecodeError, ParseError
from ..formats.example import parse_single_example
from ..formats.spec import FeatureSpec, normalize_spec
from ..formats.tfrecord import FRAME_OVERHEAD, ON_CORRUPT, ReadStats, TFRecordReader, normalize_compression
from ..pipeline.sources import SourceDataset
from ..storage.urls import mask
from .items import RowCounter, WorkItem, load_index
from .ranks import resolve_slice
from .sharding import equal_counts, plan_shards, plan_sizes

if TYPE_CHECKING:
    from ..pipeline.dataset import Dataset
    from .workqueue import WorkQueue

logger = logging.getLogger(__name__)

OpenItem = Callable[[WorkItem], Iterator[Any]]


class _Options:
    """How records are read and parsed (shared by the item datasets)."""

    def __init__(self, spec: Mapping[str, FeatureSpec] | None, compression: str | None, verify_crc: bool,
                 on_corrupt: str, storage_options: Mapping[str, Any] | None, open_item: OpenItem | None) -> None:
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")
        normalize_compression(compression)
        self.spec = normalize_spec(spec) if spec is not None else None
        self.compression = compression
        self.verify_crc = verify_crc
        self.on_corrupt = on_corrupt
        self.storage_options = storage_options
        self.open_item = open_item
        self.read_stats = ReadStats()


class _ItemCursor:
    """The records of one item, with the byte offset and count of what was delivered."""

    def __init__(self, item: WorkItem, o: _Options, offset: int | None = None, delivered: int = 0) -> None:
        self.item = item
        self.delivered = delivered
        self.reader: TFRecordReader | None = None
        self.custom: Iterator[Any] | None = None
        self.bytes = 0
        if item.kind == "rows" or o.open_item is not None:
            if o.open_item is None:
                raise ValueError(f"{mask(item.work)} is a table item: read it with sf.read_table(queue, ...) "
                                 "or pass open_item=<function item -> rows>")
            self.custom = iter(o.open_item(item))
            for _ in range(delivered):
                next(self.custom)
            self.left = None
            return
        start = item.start or 0
        self.left = None if item.stop is None else item.stop - start - delivered
        if offset is None:
            offset = item.offset if item.offset is not None else (0 if start == 0 else -1)
        if offset == -1:  # a range given without its byte offset: look it up in the index
            index = load_index(item.work, o.storage_options)
            if index is None:
                raise ValueError(f"{mask(item.work)}: a record range needs the file's index (.idx)")
            offset = int(index[start, 0]) if start < len(index) else None
        self.offset = offset or 0
        if offset is None or (self.left is not None and self.left <= 0):
            self.left = 0
            return
        self.reader = TFRecordReader(item.work, o.compression, o.verify_crc, o.on_corrupt, o.storage_options,
                                     start_offset=offset or 0, start_index=start + delivered)

    def next(self) -> Any:
        """The next record, or ``StopIteration`` at the item's end."""
        if self.custom is not None:
            x = next(self.custom)
            self.delivered += 1
            return x
        if self.left == 0 or self.reader is None:
            raise StopIteration
        record = next(self.reader)
        n = len(record) + FRAME_OVERHEAD
        self.offset = self.reader.offset + n
        self.bytes += n
        self.delivered += 1
        if self.left is not None:
            self.left -= 1
        return record

    def close(self, stats: ReadStats) -> None:
        if self.reader is not None:
            self.reader.close()
            stats.merge(self.reader.stats)
            self.reader = None
        close = getattr(self.custom, "close", None)
        if close is not None:
            close()


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
    o = _Options(None, compression, verify_crc, on_corrupt, storage_options, open_item)
    cursor = _ItemCursor(item, o)
    try:
        while True:
            try:
                yield cursor.next()
            except StopIteration:
                return
    finally:
        cursor.close(o.read_stats)


def _parse(record: Any, o: _Options, raw: bool, cursor: _ItemCursor) -> Any:
    if o.spec is None or raw or not isinstance(record, (bytes, bytearray, memoryview)):
        return record
    try:
        return parse_single_example(record, o.spec)
    except (DecodeError, ParseError) as exc:
        exc.add_note(f"in record #{(cursor.item.start or 0) + cursor.delivered - 1} of {mask(cursor.item.work)}")
        raise


# -- a fixed list of items (static shards) -----------------------------------------------------
class _ItemsReader:
    def __init__(self, ds: "ItemsDataset", state: Mapping[str, Any] | None, raw: bool) -> None:
        self.ds, self.raw = ds, raw
        self.k = int(state["item"]) if state else 0
        self.cursor: _ItemCursor | None = None
        if state and self.k < len(ds.items):
            self.cursor = _ItemCursor(ds.items[self.k], ds.o, state.get("offset"), int(state.get("delivered", 0)))
        self.bytes_read = 0

    def __next__(self) -> Any:
        while True:
            if self.cursor is None:
                if self.k >= len(self.ds.items):
                    raise StopIteration
                self.cursor = _ItemCursor(self.ds.items[self.k], self.ds.o)
            before = self.cursor.bytes
            try:
                record = self.cursor.next()
            except StopIteration:
                self.cursor.close(self.ds.o.read_stats)
                self.cursor = None
                self.k += 1
                continue
            self.bytes_read += self.cursor.bytes - before
            return _parse(record, self.ds.o, self.raw, self.cursor)

    def get_state(self) -> dict:
        c = self.cursor
        if c is None:
            return {"item": self.k}
        return {"item": self.k, "delivered": c.delivered, "offset": getattr(c, "offset", None)}

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close(self.ds.o.read_stats)
            self.cursor = None


class ItemsDataset(SourceDataset):
    """The records of a list of items (whole files or record ranges), in order; resumes
    by ``(item, byte offset)``."""

    kind = "items"

    def __init__(self, items: Sequence[WorkItem], o: _Options) -> None:
        self.items = list(items)
        self.o = o
        self.read_stats = o.read_stats

    def _deferred_spec(self) -> Mapping[str, FeatureSpec] | None:
        return self.o.spec

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _ItemsReader:
        return _ItemsReader(self, state, raw)

    def __repr__(self) -> str:
        return f"ItemsDataset({len(self.items)} items)"


def read_shard(
    works: Iterable[str],
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
) -> "Dataset":
    """The records of this worker's static shard of ``works`` (see
    :func:`~shardfeed.distributed.sharding.plan_shards` for ``by``/``strategy``/``seed``).

    ``equal_steps``: ``"pad"`` (repeat this rank's records up to the largest share) or
    ``"min"`` (stop at the smallest), so that every rank yields the same number of
    records, hence of batches, and collective training does not hang at the epoch's end.
    Counting a whole file's records uses its index file, or reads it.
    """
    slice_id, slice_count = resolve_slice(slice_id, slice_count)
    plan = plan_shards(works, slice_count, by=by, strategy=strategy, seed=seed, prefix=prefix,
                       row_counts=row_counts, storage_options=storage_options)
    ds: Any = ItemsDataset(plan[slice_id], _Options(spec, compression, verify_crc, on_corrupt, storage_options,
                                                     open_item))
    if equal_steps is not None:
        sizes = plan_sizes(plan, row_counts, storage_options)
        target = equal_counts(sizes, equal_steps)
        own = sizes[slice_id]
        if target is not None and target != own:
            ds = ds.repeat().take(target) if target > own else ds.take(target)
    return ds


# -- what a worker takes off a queue --------------------------------------------------------------
class _QueueReader:
    """Takes items, yields their records (or the items themselves), acks each at its end."""

    def __init__(self, ds: "QueueItemsDataset | QueueRecordsDataset", raw: bool, records: bool) -> None:
        self.ds, self.raw, self.records = ds, raw, records
        self.q: WorkQueue = ds.queue
        self.item: WorkItem | None = None
        self.cursor: _ItemCursor | None = None
        self.renewed = 0.0
        self.taken = 0
        self.bytes_read = 0
        self.done = False
        self.to_ack: WorkItem | None = None

    def _finish(self, ack: bool) -> None:
        item, self.item = self.item, None
        if self.cursor is not None:
            self.cursor.close(self.ds.o.read_stats)
            self.cursor = None
        if item is not None and ack and self.ds.auto_ack:
            self.to_ack = item  # acknowledged together with the next take: one round trip

    def _take(self) -> bool:
        done, self.to_ack = self.to_ack, None
        item = self.q.ack_and_take(done) if done is not None else self.q.take()
        if item is None:
            self.done = True
            return False
        self.item, self.taken, self.renewed = item, self.taken + 1, time.monotonic()
        if self.records:
            self.cursor = _ItemCursor(item, self.ds.o)
        return True

    def __next__(self) -> Any:
        if not self.records:
            self._finish(ack=True)
            if self.done or not self._take():
                raise StopIteration
            return self.item
        while True:
            if self.item is None and (self.done or not self._take()):
                raise StopIteration
            now = time.monotonic()
            if now - self.renewed > self.q.lease_timeout / 4:
                self.renewed = now
                if not self.q.renew(self.item):
                    logger.warning("work queue %r: lease of item %s (%s) was lost; leaving it to the worker "
                                   "that has it now", self.q.name, self.item.id, mask(self.item.work))
                    self._finish(ack=False)
                    continue
            cursor = self.cursor
            before = cursor.bytes
            try:
                record = cursor.next()
            except StopIteration:
                self._finish(ack=True)
                continue
            self.bytes_read += cursor.bytes - before
            return _parse(record, self.ds.o, self.raw, cursor)

    def get_state(self) -> dict:
        # The queue is the checkpoint (WorkQueue.get_state); a resumed pass takes afresh.
        return {"taken": self.taken}

    def close(self) -> None:
        done, self.to_ack = self.to_ack, None
        if done is not None:
            self.q.ack(done)
        item = self.item
        self._finish(ack=False)
        if item is not None:
            try:
                self.q.release(item)
            except Exception:  # noqa: BLE001 - closing goes on; the lease expires anyway
                logger.warning("work queue %r: could not give back item %s", self.q.name, item.id, exc_info=True)


class QueueItemsDataset(SourceDataset):
    """The items a worker takes off ``queue`` until it is drained (see ``WorkQueue.dataset``)."""

    kind = "workqueue"

    def __init__(self, queue: "WorkQueue", auto_ack: bool = True) -> None:
        self.queue = queue
        self.auto_ack = auto_ack
        self.o = _Options(None, None, True, "raise", None, None)

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _QueueReader:
        return _QueueReader(self, raw, records=False)

    def __repr__(self) -> str:
        return f"{self.queue!r}.dataset()"


class QueueRecordsDataset(SourceDataset):
    """The records of the items a worker takes off ``queue`` (see :func:`read_queue`)."""

    kind = "workqueue_records"
    auto_ack = True

    def __init__(self, queue: "WorkQueue", o: _Options) -> None:
        self.queue = queue
        self.o = o
        self.read_stats = o.read_stats

    def _deferred_spec(self) -> Mapping[str, FeatureSpec] | None:
        return self.o.spec

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _QueueReader:
        return _QueueReader(self, raw, records=True)

    def __repr__(self) -> str:
        return f"read_queue({self.queue!r})"


def read_queue(
    queue: "WorkQueue",
    spec: Mapping[str, FeatureSpec] | None = None,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    open_item: OpenItem | None = None,
) -> QueueRecordsDataset:
    """A dataset of the records of the items this worker takes off ``queue``: whole
    TFRecord files or record ranges (``open_item(item)`` reads other kinds, such as table
    row ranges). Parsed with ``spec`` like ``sf.read_tfrecord``. Each item is acknowledged
    after its last record was delivered; its lease is renewed while records flow."""
    from .workqueue import WorkQueue  # noqa: PLC0415

    if not isinstance(queue, WorkQueue):
        raise TypeError(f"read_queue needs a WorkQueue, got {type(queue).__name__}")
    return QueueRecordsDataset(queue, _Options(spec, compression, verify_crc, on_corrupt, storage_options, open_item))

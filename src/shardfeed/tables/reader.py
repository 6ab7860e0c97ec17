"""``read_table`` / ``TableRecordDataset``: rows of one or more tables as a pipeline source.

Elements are rows: tuples of numpy scalars in the order of the columns read (dicts with
``as_dict=True``). ``.batch(n)`` on this source is done by the reader itself: Arrow record
batches are converted column by column to numpy once, then cut into batches of ``n`` rows
(views, no copy), so ``read_table(...).batch(1024)`` costs about what Arrow's own
``iter_batches`` + ``to_numpy`` costs. ``repeat``, ``shuffle``, ``prefetch``, ``map``
work as on any dataset; a pass resumes from ``{"row": n, ...}`` (the tables and the
slice that saved it are recorded and checked: another reader's state is a ``ValueError``).

Slicing: the tables, one after another (the same table may be listed twice), form one
sequence of ``N`` rows; slice ``i`` of ``k`` is the contiguous range that starts at
``i * (N // k) + min(i, N % k)`` and holds ``N // k`` rows, plus one when ``i < N % k``.
Every row is in exactly one slice; sizes differ by at most one row.

Reading ahead: ``num_threads`` threads (1..64; 0: a quarter of the cores, at least one)
read ranges of rows in turn, each holding up to ``ceil(capacity / num_threads)`` rows
(``capacity`` 0: about 64 MB per thread, counted in bytes as the chunks come, in chunks
sized from the first 256 rows and cut smaller where rows turn out larger; a warning when
a thread's share is above 1 GB). Results are delivered in table order whatever the
number of threads. The threads are a pipeline :class:`~shardfeed.pipeline.workers.WorkerPool`,
each filling its own :class:`~shardfeed.pipeline.workers.ChunkQueue`; an error reaches the
consumer in its place in the order, and ``close()`` stops and joins them.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..deprecation import renamed_argument
from ..errors import ShardfeedError, StorageError
from ..pipeline.dataset import Dataset, positive_int
from ..pipeline.identity import check_state, identity, spans_digest
from ..pipeline.ranges import slice_range
from ..pipeline.sources import SourceDataset
from ..pipeline.workers import ChunkQueue, Closed, WorkerPool
from .backend import TableBackend, open_table_backend
from .convert import ColumnType, column_types, to_numpy
from .urls import parse_table_url, table_urls

logger = logging.getLogger(__name__)

AUTO_BYTES_PER_THREAD = 64 << 20
WARN_BYTES_PER_THREAD = 1 << 30
SAMPLE_ROWS = 256
MAX_CHUNK_ROWS = 1 << 16
_END = object()


def _cols(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    out = [str(c).strip() for c in items if str(c).strip()]
    if not out:
        raise ValueError(f"{name} is empty; give column names separated by commas, or None")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} names a column twice: {out}")
    return out


def count_rows(url: str, storage_options: Mapping[str, Any] | None = None) -> int:
    """Rows of the table at ``url`` (any table URL ``read_table`` takes; partition
    filters in the URL apply). A ``WorkQueue`` or ``plan_shards`` over tables counts
    rows with it when no ``row_counts`` are given."""
    return int(open_table_backend(parse_table_url(url), storage_options).num_rows())


class TableRecordDataset(SourceDataset):
    """Rows of tables (see the module doc). PAI-TF's argument names; ``filenames`` is a
    table URL or a list of them (see :mod:`shardfeed.tables.urls`).

    Raises at construction: ``ValueError`` for bad arguments (both ``selected_cols`` and
    ``excluded_cols``, an unknown column, a ``record_defaults`` count that does not match),
    ``FileNotFoundError`` for a missing table, ``ImportError`` (with the pip command) for
    a missing driver. While reading: :class:`~shardfeed.tables.convert.TableTypeError`
    naming table, column and row for a value of the wrong type or a NULL without default.
    """

    kind = "table"

    def __init__(
        self,
        filenames: str | os.PathLike | Sequence[str | os.PathLike],
        record_defaults: Sequence[Any] | None = None,
        selected_cols: str | Sequence[str] | None = None,
        excluded_cols: str | Sequence[str] | None = None,
        slice_id: int = 0,
        slice_count: int = 1,
        num_threads: int = 0,
        capacity: int = 0,
        *,
        as_dict: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        urls = table_urls(filenames)
        selected, excluded = _cols(selected_cols, "selected_cols"), _cols(excluded_cols, "excluded_cols")
        if selected is not None and excluded is not None:
            raise ValueError("give selected_cols or excluded_cols, not both")
        slice_count = positive_int("slice_count", slice_count)
        if isinstance(slice_id, bool) or not isinstance(slice_id, int) or not 0 <= slice_id < slice_count:
            raise ValueError(f"slice_id must be an int in [0, slice_count={slice_count}), got {slice_id!r}")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or not 0 <= num_threads <= 64:
            raise ValueError(f"num_threads must be an int from 1 to 64, or 0 for automatic, got {num_threads!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a number of rows >= 0 (0: automatic), got {capacity!r}")
        self.urls = urls
        self.storage_options = dict(storage_options or {})
        parsed = [parse_table_url(u) for u in urls]
        cache: dict[str, TableBackend] = {}
        self.backends = [cache.setdefault(p.url, cache.get(p.url) or open_table_backend(p, self.storage_options))
                         for p in parsed]
        schema = self.backends[0].schema()
        names = schema.names
        for name, label in ((selected, "selected_cols"), (excluded, "excluded_cols")):
            unknown = [c for c in name or () if c not in names]
            if unknown:
                raise ValueError(f"{label}: no column(s) {unknown} in {self.backends[0].masked}; "
                                 f"its columns are {names}")
        self.columns = selected if selected is not None else [c for c in names if c not in (excluded or ())]
        if not self.columns:
            raise ValueError("no columns left to read (excluded_cols removes them all)")
        for b in self.backends[1:]:
            missing = [c for c in self.columns if c not in b.schema().names]
            if missing:
                raise ValueError(f"{b.masked} has no column(s) {missing} that {self.backends[0].masked} has")
        self.types: list[ColumnType] = column_types(record_defaults, self.columns)
        self.slice_id, self.slice_count = slice_id, slice_count
        self.num_threads = num_threads or max(1, (os.cpu_count() or 1) // 4)
        self.capacity = capacity
        self.as_dict = bool(as_dict)
        self.batch_size: int | None = None
        self.drop_remainder = False
        self._bytes_per_row: float | None = None
        self._counts: list[int] | None = None

    # -- planning ----------------------------------------------------------------------
    def counts(self) -> list[int]:
        """Rows of each listed table (queried once per pass: :class:`_TableReader` forgets
        them at a pass's start)."""
        if self._counts is None:
            per: dict[int, int] = {}
            self._counts = [per.setdefault(id(b), per.get(id(b)) or b.num_rows()) for b in self.backends]
        return self._counts

    def num_rows(self) -> int:
        """Rows of this dataset's slice."""
        start, stop = slice_range(sum(self.counts()), self.slice_id, self.slice_count)
        return stop - start

    def _ranges(self, skip: int) -> list[tuple[int, int, int | None]]:
        """``(table index, start, stop)`` of the rows this slice still has to deliver."""
        if self.slice_count == 1 and skip == 0 and self.num_threads == 1:
            return [(i, 0, None) for i in range(len(self.backends))]
        counts = self.counts()
        lo, hi = slice_range(sum(counts), self.slice_id, self.slice_count)
        lo += skip
        out, offset = [], 0
        for i, n in enumerate(counts):
            s, e = max(lo, offset), min(hi, offset + n)
            if s < e:
                out.append((i, s - offset, e - offset))
            offset += n
        return out

    def bytes_per_row(self) -> float:
        """Estimated from the first rows of the first table (numpy bytes; strings by length)."""
        if self._bytes_per_row is None:
            total, rows = 0, 0
            for rb in self.backends[0].read(self.columns, 0, SAMPLE_ROWS, SAMPLE_ROWS):
                rows += rb.num_rows
                total += rb.nbytes
            self._bytes_per_row = max(1.0, total / rows) if rows else 64.0
        return self._bytes_per_row

    def _per_thread_rows(self) -> int:
        if self.capacity:
            rows = math.ceil(self.capacity / self.num_threads)
            if rows * self.bytes_per_row() > WARN_BYTES_PER_THREAD:
                logger.warning("read_table: capacity=%d rows holds about %.1f GB per reader thread (%d threads); "
                               "check the setting", self.capacity, rows * self.bytes_per_row() / 1e9,
                               self.num_threads)
            return rows
        return max(1, int(AUTO_BYTES_PER_THREAD / self.bytes_per_row()))

    # -- pipeline hooks ------------------------------------------------------------------
    def batch(self, batch_size: int, drop_remainder: bool = False) -> Dataset:
        """Batches of ``batch_size`` rows, cut by the reader: a tuple (or dict) of numpy
        columns. Only the last batch of a pass may be smaller (none with ``drop_remainder``)."""
        if self.batch_size is not None:
            return super().batch(batch_size, drop_remainder)
        out = copy.copy(self)
        out.__dict__.pop("_passes", None)
        out.batch_size = positive_int("batch_size", batch_size)
        out.drop_remainder = bool(drop_remainder)
        return out

    def identity(self) -> dict[str, Any]:
        """What this reader's states carry for a restore to be checked: its tables, in order,
        and its slice (a row number means the same rows only to the same reader)."""
        return identity(spans_digest([(u, 0, None) for u in self.urls]), [[self.slice_id, self.slice_count]])

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _TableReader:
        if state:  # a state of another slice or other tables would resume at another row without a word
            check_state(state, self.identity())
        return _TableReader(self, int(state["row"]) if state else 0)

    def __repr__(self) -> str:
        extra = f".batch({self.batch_size})" if self.batch_size else ""
        return f"read_table({len(self.urls)} tables, {len(self.columns)} columns){extra}"


def _read_segments(ds: TableRecordDataset, segments: list, q: ChunkQueue, stop: threading.Event,
                   chunk_rows: int, chunk_bytes: int | None = None) -> None:
    """One reader thread's task: its segments' rows, a chunk of columns at a time, into its
    own queue (each segment closed by ``_END``); an error goes into the queue in its place
    in the order. Returns when done, when ``stop`` is set or when the queue is closed.

    ``chunk_bytes`` (the automatic read-ahead, sized from the first rows): the queue counts
    bytes, not chunks, and a chunk more than twice that size cuts the chunks of the rest of
    the segment to fit, read anew from the row it reached (rows far larger than the first
    ones: 16 MB rows after small ones held about 2 GB a thread, the read-ahead's whole depth
    of chunks of the first rows' count; now one such chunk, then chunks that fit)."""
    try:
        for ti, start, stop_row in segments:
            b = ds.backends[ti]
            row = start
            rows = b.read(ds.columns, start, stop_row, chunk_rows)
            try:
                while True:
                    rb = next(rows, None)
                    if rb is None:
                        break
                    cols = [to_numpy(rb.column(j), t, b.masked, c, row)
                            for j, (c, t) in enumerate(zip(ds.columns, ds.types))]
                    row += rb.num_rows
                    q.put((cols, rb.num_rows), 1 if chunk_bytes is None else max(1, rb.nbytes))
                    if stop.is_set():
                        return
                    if chunk_bytes is None or rb.num_rows == 0 or (stop_row is not None and row >= stop_row):
                        continue
                    if rb.nbytes > 2 * chunk_bytes and rb.num_rows > 1:
                        per_row = rb.nbytes / rb.num_rows
                        chunk_rows = max(1, int(chunk_bytes / per_row))
                        logger.debug("read_table: rows of %.0f bytes at row %d of %s: chunks of %d rows now",
                                     per_row, row, b.masked, chunk_rows)
                        rows.close()  # type: ignore[attr-defined]
                        rows = b.read(ds.columns, row, stop_row, chunk_rows)
            except (ShardfeedError, Closed):
                raise
            except Exception as exc:  # a driver's own error (a server gone, a connection cut) names no table
                raise StorageError(f"{b.masked}: reading the table failed at row {row} ({type(exc).__name__}: "
                                   f"{str(exc).strip()}); resume from the pass's last get_state()",
                                   url=b.masked) from exc
            finally:
                try:  # here, not when collected: a driver's cleanup on a dead connection raises
                    rows.close()  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001 - the error that ended the read is the one to see
                    pass
            q.put(_END, 1)
    except Closed:
        return
    except BaseException as exc:  # noqa: BLE001 - carried to the consumer
        try:
            q.put(exc, 1)
        except Closed:
            pass


class _TableReader:
    """Delivers rows or batches in order from the per-thread queues."""

    def __init__(self, ds: TableRecordDataset, skip: int) -> None:
        self.ds = ds
        self.ident = ds.identity()
        self.row = skip
        self.bytes_read = 0
        self.stop = threading.Event()
        if skip == 0:  # each pass reads the tables as they are when it starts (rows added since
            ds._counts = None  # the last pass included), with one reader thread or several
        ranges = ds._ranges(skip)
        per_thread = ds._per_thread_rows()
        batch = ds.batch_size or 1
        chunk = min(MAX_CHUNK_ROWS, per_thread)
        if batch > 1:
            chunk = max(batch, (chunk // batch) * batch)
        n = ds.num_threads
        if n > 1:  # split into segments, handed out in turn
            seg_rows = max(chunk * 4, 1 << 18)
            segs = []
            for ti, s, e in ranges:
                pos = s
                while pos < e:
                    segs.append((ti, pos, min(e, pos + seg_rows)))
                    pos += seg_rows
            ranges = segs
        n = max(1, min(n, len(ranges)))
        chunk_bytes = None
        if ds.capacity:  # rows, as the user counts them
            depth = max(1, per_thread // max(1, chunk))
        else:  # bytes: the first rows' size may not hold further on
            depth = AUTO_BYTES_PER_THREAD
            chunk_bytes = max(1, int(chunk * ds.bytes_per_row()))
        self.queues = [ChunkQueue(depth) for _ in range(n)]
        self.pool = WorkerPool(n, "table-reader")
        self.nseg = len(ranges)
        self.seg = 0
        self.cols: list[np.ndarray] | None = None
        self.pos = 0
        self.len = 0
        for i in range(n):
            self.pool.submit(_read_segments, ds, ranges[i::n], self.queues[i], self.stop, chunk, chunk_bytes)

    def _load(self) -> bool:
        """Make the next chunk current; False at the end of the pass."""
        while self.seg < self.nseg:
            item = self.queues[self.seg % len(self.queues)].get()
            if item is _END:
                self.seg += 1
                continue
            if isinstance(item, BaseException):
                self.close()
                raise item
            self.cols, self.len = item
            self.pos = 0
            self.bytes_read += sum(c.nbytes for c in self.cols)
            return True
        return False

    def _out(self, values: list) -> Any:
        if self.ds.as_dict:
            return dict(zip(self.ds.columns, values))
        return tuple(values)

    def __next__(self) -> Any:
        size = self.ds.batch_size
        if size is None:
            if self.pos >= self.len and not self._load():
                raise StopIteration
            i = self.pos
            self.pos += 1
            self.row += 1
            return self._out([c[i] for c in self.cols])
        pieces, need = [], size
        while need:
            if self.pos >= self.len and not self._load():
                break
            take = min(need, self.len - self.pos)
            pieces.append([c[self.pos:self.pos + take] for c in self.cols])
            self.pos += take
            need -= take
        got = size - need
        if got == 0 or (need and self.ds.drop_remainder):
            raise StopIteration
        self.row += got
        if len(pieces) == 1:
            return self._out(pieces[0])
        return self._out([np.concatenate(parts) for parts in zip(*pieces)])

    def get_state(self) -> dict:
        return {"row": self.row, **self.ident}

    def close(self) -> None:
        """Stop the reader threads and join them (idempotent)."""
        self.stop.set()
        for q in self.queues:
            q.close()  # a thread waiting to put gives up at once
        self.pool.close()


@renamed_argument("tables", "source")
def read_table(
    source: str | os.PathLike | Iterable[str | os.PathLike],
    record_defaults: Sequence[Any] | None = None,
    selected_cols: str | Sequence[str] | None = None,
    excluded_cols: str | Sequence[str] | None = None,
    slice_id: int = 0,
    slice_count: int = 1,
    num_threads: int = 0,
    capacity: int = 0,
    *,
    as_dict: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> TableRecordDataset:
    """Read one or more tables as a pipeline source (see :class:`TableRecordDataset`).

    ``source``: a table URL or a list (Parquet/CSV files on any storage, ``duckdb://``,
    ``postgresql://``, ``odps://``); ``record_defaults``: one type or default per column
    read; ``selected_cols``/``excluded_cols``: ``"a,b"`` or a list; ``slice_id`` of
    ``slice_count``: this worker's contiguous share of the rows; ``num_threads`` reader
    threads (0: auto); ``capacity`` rows read ahead in all (0: about 64 MB per thread).
    """
    return TableRecordDataset(list(source) if not isinstance(source, (str, os.PathLike)) else source,
                              record_defaults, selected_cols, excluded_cols, slice_id, slice_count,
                              num_threads, capacity, as_dict=as_dict, storage_options=storage_options)


__all__ = ["TableRecordDataset", "read_table", "slice_range"]

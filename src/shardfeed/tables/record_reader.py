"""PAI's ``tf.TableRecordReader``: table rows as one delimited string each.

The PAI form (source document 002, the ``trans_csv_*`` example and the WorkQueue page)::

    reader = tf.TableRecordReader(csv_delimiter=";", num_threads=8, capacity=8 * batch_size)
    key, value = reader.read_up_to(filename_queue, batch_size)
    cols = tf.decode_csv(value, record_defaults=record_defaults, field_delim=";")

runs here as::

    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=8, capacity=8 * batch_size)
    keys, values = reader.read_up_to(tables, batch_size)     # a table URL, a list, or a WorkQueue
    cols = sf.decode_csv(values, record_defaults=record_defaults, field_delim=";")

``read_up_to`` returns numpy object arrays of ``str``: ``keys`` name each row
(``"<table>:<row>"``, the row counted in its table), ``values`` hold the row's fields
joined by ``csv_delimiter`` (a NULL is an empty field; numbers as their shortest decimal
text, so ``decode_csv`` gets back the same values). Fewer than ``num_records`` rows come
back only at the end of the input, and empty arrays after it. The reader keeps a place per
input, named by its value: the same table URL (an equal string, built anew for each call
or not) or list of URLs reads on, so ``read`` ends with ``EOFError``; another table or list
is read from its own start, the first keeping its place; a ``WorkQueue``, its producer or
an iterator is named by the object. Threads of a reader not closed that still read ahead
when the interpreter exits are stopped and waited for first (an ``atexit`` hook): one left
inside pyarrow's or DuckDB's C++ code as the interpreter finalizes can abort it. Reading a
typed table with :func:`~shardfeed.tables.reader.read_table` is faster (no joining and
splitting); this reader exists so that PAI scripts run as written.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..deprecation import renamed_argument
from ..storage.urls import mask
from .backend import open_table_backend
from .reader import _cols
from .urls import parse_table_url

logger = logging.getLogger(__name__)

_END = object()
BATCH_ROWS = 4096
EXIT_WAIT_S = 5.0  # how long interpreter exit waits for read-ahead threads to stop

_open_inputs: "weakref.WeakSet[_Input]" = weakref.WeakSet()  # inputs not closed, for exit


class _Item:
    """One table, or a row range of one, being read ahead by a thread into a queue of
    ``(keys, values)`` pieces."""

    def __init__(self, url: str, start: int, stop: int | None, work: Any, depth: int) -> None:
        self.url, self.start, self.stop, self.work = url, start, stop, work
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.pending: collections.deque = collections.deque()  # pieces taken from q, not all returned yet
        self.dropped = threading.Event()  # its lease was lost: its thread stops, no more of its rows go out
        self.renewed = time.monotonic()


class TableRecordReader:
    """Rows of tables as delimited strings, ``num_records`` at a time (see the module doc).

    ``csv_delimiter``: the field separator of the strings; ``selected_cols`` /
    ``excluded_cols`` as in ``read_table`` (``"a,b"`` or a list); ``num_threads``: tables or
    row ranges read at once, ahead of the consumer (0: 1); ``capacity``: rows read ahead
    in all (0: 8 x 4096). A ``WorkQueue`` as the input gives this reader its items one by
    one (row ranges when the queue cut tables into ``num_slices``), each acknowledged once
    its last row was returned; the leases of the items read ahead are renewed while rows
    are returned, and the reader waits for the queue only when it holds no item itself."""

    def __init__(self, csv_delimiter: str = ",", selected_cols: str | Sequence[str] | None = None,
                 excluded_cols: str | Sequence[str] | None = None, num_threads: int = 0, capacity: int = 0,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(csv_delimiter, str) or len(csv_delimiter) != 1:
            raise ValueError(f"csv_delimiter must be one character, got {csv_delimiter!r}")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or not 0 <= num_threads <= 64:
            raise ValueError(f"num_threads must be an int from 1 to 64, or 0 for automatic, got {num_threads!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a number of rows >= 0 (0: automatic), got {capacity!r}")
        self.delimiter = csv_delimiter
        self.selected = _cols(selected_cols, "selected_cols")
        self.excluded = _cols(excluded_cols, "excluded_cols")
        if self.selected is not None and self.excluded is not None:
            raise ValueError("give selected_cols or excluded_cols, not both")
        self.num_threads = num_threads or 1
        self.capacity = capacity or 8 * BATCH_ROWS
        self.storage_options = dict(storage_options or {})
        self._inputs: dict[tuple[str, Any], _Input] = {}
        self._lock = threading.Lock()

    @renamed_argument("tables", "source")
    def read_up_to(self, source: Any, num_records: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``num_records`` rows (fewer at the end, none after it) of ``source`` (a
        table URL, a list of them, an iterator of them, a ``WorkQueue`` or its
        ``input_producer()``): ``(keys, values)``, numpy object arrays of ``str``."""
        if isinstance(num_records, bool) or not isinstance(num_records, int) or num_records < 1:
            raise ValueError(f"num_records must be an int >= 1, got {num_records!r}")
        inp = self._input(source)
        keys: list[np.ndarray] = []
        values: list[np.ndarray] = []
        want = num_records
        while want:
            piece = inp.next_piece(want)
            if piece is None:
                break
            keys.append(piece[0])
            values.append(piece[1])
            want -= len(piece[0])
        if not keys:
            return np.empty(0, dtype=object), np.empty(0, dtype=object)
        return np.concatenate(keys), np.concatenate(values)

    @renamed_argument("tables", "source")
    def read(self, source: Any) -> tuple[str, str]:
        """One row: ``(key, value)``; raises ``EOFError`` after the last one (TensorFlow's
        ``OutOfRangeError``)."""
        keys, values = self.read_up_to(source, 1)
        if not len(keys):
            raise EOFError("no rows left in the input of this TableRecordReader")
        return keys[0], values[0]

    def close(self) -> None:
        """Stop the read-ahead threads (idempotent); items of a queue not read to their end
        are given back to it."""
        with self._lock:
            inputs, self._inputs = list(self._inputs.values()), {}
        for inp in inputs:
            inp.close()

    def __enter__(self) -> "TableRecordReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _input(self, tables: Any) -> "_Input":
        key = _input_key(tables)
        with self._lock:
            inp = self._inputs.get(key)
            if inp is None or (key[0] == "object" and inp.source is not tables):
                inp = _Input(self, tables)
                self._inputs[key] = inp
            return inp


def _is_url(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _url_text(x: Any) -> str:
    return os.fsdecode(os.fspath(x))


def _input_key(source: Any) -> tuple[str, Any]:
    """What names an input of a reader: a table URL by its text, a list or tuple of them by
    their texts in order (an equal string built for each call reads on, as the same object
    does); anything else (a WorkQueue, its producer, an iterator) by identity, which the
    ``_Input`` holding it keeps from being reused."""
    if _is_url(source):
        return ("table", _url_text(source))
    if isinstance(source, (list, tuple)) and all(_is_url(s) for s in source):
        return ("tables", tuple(_url_text(s) for s in source))
    return ("object", id(source))


class _Input:
    """What one reader reads from one input: its items in order, ``num_threads`` of them
    read ahead."""

    def __init__(self, reader: TableRecordReader, source: Any) -> None:
        self.reader = reader
        self.source = source
        # a WorkQueue, or what its input_producer() returns (which names its queue)
        self.queue = source if hasattr(source, "take") and hasattr(source, "ack") else getattr(source, "queue", None)
        self.works: Iterator[Any] | None = None
        if self.queue is None:
            key = _input_key(source)
            # the URLs as named by the key (a list is read as it was when first given)
            self.works = iter([key[1]] if key[0] == "table" else key[1] if key[0] == "tables" else source)
        self.ahead: collections.deque[_Item] = collections.deque()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.done = False
        # while holding items, a take that found nothing is asked again only after the queue's
        # poll interval or once an item is done, not for every piece returned
        self.ask_after = 0.0
        per_item = max(1, reader.capacity // reader.num_threads)
        self.piece_rows = max(1, min(BATCH_ROWS, per_item))
        self.depth = max(1, per_item // self.piece_rows)
        _open_inputs.add(self)

    # -- items --------------------------------------------------------------------------------
    def _take(self) -> _Item | None:
        if self.done:
            return None
        if self.queue is not None:
            # Wait for the queue only when holding nothing: while items read ahead are
            # leased to this reader, a blocking take could wait for those very leases (their
            # threads wait for the consumer, who would wait here). None then only means
            # "nothing at once"; the reader asks again when its items are done.
            holding = bool(self.ahead)
            if holding and time.monotonic() < self.ask_after:
                return None
            item = self.queue.take(block=not holding)
            if item is None:
                self.done = not holding  # a blocking take's None: drained, the end of the input
                self.ask_after = time.monotonic() + getattr(self.queue, "poll_interval", 0.5)
                return None
            if item.kind not in ("rows", "file"):
                raise ValueError(f"work item {mask(item.work)} is {item.kind!r}, not a table: TableRecordReader "
                                 "reads tables")
            return _Item(item.work, item.start or 0, item.stop, item, self.depth)
        try:
            work = next(self.works)  # type: ignore[arg-type]
        except StopIteration:
            self.done = True
            return None
        return _Item(str(work), 0, None, None, self.depth)

    def _fill_ahead(self) -> None:
        self.threads = [t for t in self.threads if t.is_alive()]
        while len(self.ahead) < self.reader.num_threads and not self.done and not self.stop.is_set():
            item = self._take()
            if item is None:
                break
            t = threading.Thread(target=self._read, args=(item,), name="shardfeed-table-record-reader", daemon=True)
            t.start()
            self.threads.append(t)
            self.ahead.append(item)

    def _renew(self) -> None:
        """Renew the leases of the queue's items held (read ahead included) that are due;
        an item whose lease was lost goes to the worker that has it now: no more of its
        rows are returned here."""
        if self.queue is None:
            return
        now = time.monotonic()
        due = self.queue.lease_timeout / 4
        for item in list(self.ahead):
            if item.work is None or now - item.renewed <= due:
                continue
            item.renewed = now
            if not self.queue.renew(item.work):
                logger.warning("work queue %r: lease of item %s (%s) was lost; leaving it to the worker that has "
                               "it now", self.queue.name, item.work.id, mask(item.url))
                item.dropped.set()
                self.ahead.remove(item)
                self.ask_after = 0.0

    def next_piece(self, most: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Up to ``most`` rows of the current item; None at the end of the input."""
        while True:
            self._renew()
            self._fill_ahead()
            if not self.ahead:
                return None
            item = self.ahead[0]
            if not item.pending:
                got = self._get(item)
                if got is None:  # its lease was lost while waiting: it is another worker's now
                    continue
                if got is _END:
                    self.ahead.popleft()
                    if item.work is not None:
                        self.queue.ack(item.work)  # every row of it was returned
                        self.ask_after = 0.0  # a place to read ahead into: ask the queue again
                    continue
                if isinstance(got, BaseException):
                    raise got
                item.pending.append(got)
            keys, values = item.pending[0]
            if len(keys) <= most:
                item.pending.popleft()
                return keys, values
            item.pending[0] = (keys[most:], values[most:])
            return keys[:most], values[:most]

    def _get(self, item: _Item) -> Any:
        """The next piece (or end, or error) of ``item``, waited for in slices of a quarter
        lease with the leases renewed between them: a slow query (a large OFFSET, a locked
        table) must not cost the items this reader holds. None: ``item``'s lease was lost."""
        if self.queue is None or item.work is None:
            return item.q.get()
        while True:
            try:
                return item.q.get(timeout=max(0.01, self.queue.lease_timeout / 4))
            except queue.Empty:
                self._renew()
                if item.dropped.is_set():
                    return None

    def _read(self, item: _Item) -> None:
        """In a thread: the item's rows as strings into its queue (bounded), then the end."""
        r = self.reader
        try:
            backend = open_table_backend(parse_table_url(item.url), r.storage_options)
            try:
                names = backend.schema().names
                for label, cols in (("selected_cols", r.selected), ("excluded_cols", r.excluded)):
                    unknown = [c for c in cols or () if c not in names]
                    if unknown:
                        raise ValueError(f"{label}: no column(s) {unknown} in {backend.masked}; "
                                         f"its columns are {names}")
                columns = r.selected if r.selected is not None else [c for c in names if c not in (r.excluded or ())]
                row = item.start
                name = mask(item.url)
                for rb in backend.read(columns, item.start, item.stop, self.piece_rows):
                    values = _joined(rb, r.delimiter)
                    keys = np.array([f"{name}:{k}" for k in range(row, row + rb.num_rows)], dtype=object)
                    row += rb.num_rows
                    if not self._put(item, (keys, values)):
                        return
            finally:
                backend.close()
            self._put(item, _END)
        except BaseException as exc:  # noqa: BLE001 - raised in the consumer, in order
            self._put(item, exc)

    def _put(self, item: _Item, x: Any) -> bool:
        while not self.stop.is_set() and not item.dropped.is_set():
            try:
                item.q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        self.stop.set()
        _open_inputs.discard(self)
        for t in self.threads:
            t.join()
        if self.queue is not None:
            for item in self.ahead:
                if item.work is not None:
                    self.queue.release(item.work)
        self.ahead.clear()


@atexit.register
def _stop_at_exit() -> None:
    """Stop the read-ahead threads of the readers not closed, and wait for them (up to
    ``EXIT_WAIT_S`` in all), before the interpreter finalizes. They are daemon threads: one
    still inside pyarrow's or DuckDB's C++ code (a record batch reader being torn down at the
    end of a table, a query) when finalization starts is ended by ``pthread_exit`` the moment
    it takes the GIL again, unwinding through C++ frames that may not be unwound, and the
    process dies of SIGABRT ("terminate called without an active exception"). A thread
    sees the stop between pieces, so each ends within one piece's read. The leases of work
    queue items held are not given back here (the queue's backend may be gone already):
    they expire as when a worker is killed."""
    inputs = list(_open_inputs)
    for inp in inputs:
        inp.stop.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    left = 0
    for inp in inputs:
        for t in list(inp.threads):
            t.join(max(0.0, deadline - time.monotonic()))
            left += t.is_alive()
    if left:
        logger.warning("TableRecordReader: %d read-ahead thread(s) still reading after %.0f s at interpreter exit; "
                       "close() readers before exiting", left, EXIT_WAIT_S)


def _joined(rb: Any, delimiter: str) -> np.ndarray:
    """Each row of a record batch as its fields' text joined by ``delimiter`` (NULL: empty)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    if rb.num_rows == 0:
        return np.empty(0, dtype=object)
    cols = []
    for col in rb.columns:
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            col = pc.cast(col, pa.string())
        elif not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            col = pc.cast(col, pa.string())
        cols.append(pc.fill_null(col, ""))
    joined = pc.binary_join_element_wise(*cols, delimiter) if len(cols) > 1 else cols[0]
    out = np.empty(rb.num_rows, dtype=object)
    out[:] = joined.to_pylist()
    return out


__all__ = ["TableRecordReader"]

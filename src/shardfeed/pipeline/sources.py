"""Pipeline sources, and the interface other layers (tables, work queues) plug into.

A source is a :class:`SourceDataset` whose :meth:`~SourceDataset.open` returns a
:class:`SourceReader`: an iterator with ``get_state()`` (a small dict, a cursor) and
``close()``, reopened from such a state to resume. Random-access objects (``len`` and
``[i]``) become sources through :func:`from_list`; any re-iterable through
:func:`from_iterable` (resumed by replaying its prefix).
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

from ..errors import DecodeError, ParseError
from ..formats.example import parse_single_example
from ..formats.spec import FeatureSpec, normalize_spec
from ..formats.chunks import FrameChunk, iter_frame_chunks
from ..formats.tfrecord import FRAME_OVERHEAD, ON_CORRUPT, ReadStats, expand_files, normalize_compression
from .dataset import Dataset, positive_int
from .node import AUTOTUNE, Build, Node


class SourceReader(Protocol):
    """What :meth:`SourceDataset.open` returns."""

    bytes_read: int

    def __next__(self) -> Any: ...

    def get_state(self) -> dict: ...

    def close(self) -> None: ...


class SourceDataset(Dataset):
    """Base class of sources: implement :meth:`open` (and ``kind`` for statistics).

    ``open(state, raw)`` starts reading at ``state`` (``None``: the beginning); ``raw`` is
    true when the consumer accepts serialized records instead of parsed ones (see
    :meth:`Dataset._deferred_spec`); sources without a spec ignore it.
    """

    kind = "source"

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> SourceReader:
        raise NotImplementedError

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return SourceNode(b, self, self.open(state, b.raw))


class SourceNode(Node):
    """Adapts a :class:`SourceReader` to the node contract and counts its bytes."""

    def __init__(self, b: Build, ds: Dataset, reader: SourceReader) -> None:
        super().__init__(b, ds)
        self.reader = reader
        self._bytes = 0
        b.ctx.on_close(self.close)

    def _next(self) -> Any:
        x = next(self.reader)
        n = getattr(self.reader, "bytes_read", 0)
        if n != self._bytes:
            self.stats.bytes += n - self._bytes
            self._bytes = n
        return x

    def get_state(self) -> dict:
        return self.reader.get_state()

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()


# -- in-memory sources -------------------------------------------------------------------
class _ListReader:
    bytes_read = 0

    def __init__(self, items: Any, state: Mapping[str, Any] | None) -> None:
        self.items = items
        self.i = int(state["i"]) if state else 0

    def __next__(self) -> Any:
        i = self.i
        if i >= len(self.items):
            raise StopIteration
        self.i = i + 1
        return self.items[i]

    def get_state(self) -> dict:
        return {"i": self.i}

    def close(self) -> None:
        pass


class ListDataset(SourceDataset):
    """The items of a random-access object (``len`` and ``[i]``), in order."""

    kind = "from_list"

    def __init__(self, items: Any) -> None:
        if not (hasattr(items, "__len__") and hasattr(items, "__getitem__")):
            raise TypeError(f"from_list needs an object with len() and [i], got {type(items).__name__}; "
                            "use from_iterable for iterators and generators")
        self.items = items

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _ListReader:
        return _ListReader(self.items, state)

    def __repr__(self) -> str:
        return f"from_list({len(self.items)} items)"


class _ReplayReader:
    """Reads a fresh iterator; resumes by skipping the ``i`` elements already delivered."""

    bytes_read = 0

    def __init__(self, make: Callable[[], Iterator[Any]], state: Mapping[str, Any] | None) -> None:
        self.it = iter(make())
        self.i = 0
        for _ in range(int(state["i"]) if state else 0):
            next(self.it)
            self.i += 1

    def __next__(self) -> Any:
        x = next(self.it)
        self.i += 1
        return x

    def get_state(self) -> dict:
        return {"i": self.i}

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()


class IterableDataset(SourceDataset):
    """The elements of a re-iterable object, or of the iterator a callable returns."""

    kind = "from_iterable"

    def __init__(self, source: Iterable[Any] | Callable[[], Iterable[Any]]) -> None:
        if isinstance(source, Iterator):
            raise TypeError("from_iterable needs something that can be iterated again for every pass "
                            "(a list, a range, or a zero-argument function returning an iterator), "
                            "got a one-shot iterator; wrap it: from_iterable(lambda: make_iterator())")
        if not callable(source) and not isinstance(source, Iterable):
            raise TypeError(f"from_iterable needs an iterable or a callable, got {type(source).__name__}")
        self.source = source

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _ReplayReader:
        src = self.source
        return _ReplayReader(src if callable(src) and not isinstance(src, Iterable) else (lambda: iter(src)), state)


class IterableNode(SourceNode):
    """For ``Dataset`` subclasses that implement only ``__iter__``."""

    def __init__(self, b: Build, ds: Dataset, make: Callable[[], Iterator[Any]], state: Mapping[str, Any] | None):
        super().__init__(b, ds, _ReplayReader(make, state))


def from_list(items: Any) -> ListDataset:
    """A dataset of the items of a list (or anything with ``len`` and ``[i]``), in order;
    resumes by index."""
    return ListDataset(items)


def from_iterable(source: Iterable[Any] | Callable[[], Iterable[Any]]) -> IterableDataset:
    """A dataset of the elements of a re-iterable object (each pass iterates it again), or
    of what a zero-argument callable returns. Resumes by replaying the prefix. Raises
    ``TypeError`` for a one-shot iterator (it cannot make a second pass)."""
    return IterableDataset(source)


# -- TFRecord ------------------------------------------------------------------------------
RECORD_CHUNK = 1 << 20
"""Bytes of frames found at once when records are handed out one by one: small enough that
several files read in parallel hold little, large enough that the scan's cost vanishes."""
_merge_lock = threading.Lock()  # files of one dataset may be read in several threads


class _TFRecordFilesReader:
    """Records of a list of files, with a ``(file, byte offset)`` cursor.

    Frames are found in large chunks by the fast path (:mod:`shardfeed.formats.chunks`:
    native scan, ``mmap`` for local shards); records are handed out one by one from the
    current chunk."""

    def __init__(self, ds: "TFRecordDataset", files: list[str], state: Mapping[str, Any] | None, raw: bool) -> None:
        self.ds = ds
        self.files = files
        self.parse = ds.spec is not None and not raw
        self.fi = int(state["file"]) if state else 0
        self.offset = int(state["offset"]) if state else 0
        self.chunks: Iterator[FrameChunk] | None = None
        self.stats: ReadStats | None = None
        self.records: list[bytes] = []
        self.ends: list[int] = []
        self.starts: list[int] = []
        self.k = 0
        self.bytes_read = 0

    def __next__(self) -> Any:
        k = self.k
        while k >= len(self.records):
            self._next_chunk()
            k = self.k
        record = self.records[k]
        self.k = k + 1
        end = self.ends[k]
        self.bytes_read += end - self.offset
        self.offset = end
        if not self.parse:
            return record
        try:
            return parse_single_example(record, self.ds.spec)
        except (DecodeError, ParseError) as exc:
            exc.add_note(f"in record at byte offset {self.starts[k]} of {self.files[self.fi]}")
            raise

    def _next_chunk(self) -> None:
        while True:
            if self.chunks is None:
                if self.fi >= len(self.files):
                    raise StopIteration
                ds = self.ds
                self.stats = ReadStats()
                self.chunks = iter_frame_chunks(self.files[self.fi], ds.compression, ds.verify_crc, ds.on_corrupt,
                                                ds.storage_options, stats=self.stats, start_offset=self.offset,
                                                chunk_size=RECORD_CHUNK)
            chunk = next(self.chunks, None)
            if chunk is not None:
                self.records = chunk.records()
                self.starts = chunk.positions.tolist()
                self.ends = (chunk.positions + chunk.lengths + FRAME_OVERHEAD).tolist()
                self.k = 0
                return
            self._finish_file()

    def _finish_file(self) -> None:
        self.close()
        self.fi += 1
        self.offset = 0

    def get_state(self) -> dict:
        return {"file": self.fi, "offset": self.offset}

    def close(self) -> None:
        if self.chunks is not None:
            self.chunks.close()  # type: ignore[attr-defined]
            self.chunks = None
            with _merge_lock:
                self.ds.read_stats.merge(self.stats)
        self.records, self.ends, self.starts, self.k = [], [], [], 0


class TFRecordDataset(SourceDataset):
    """Records of TFRecord files, file after file, in order (or ``num_parallel_reads``
    files at a time, one record from each in turn, read ahead in threads).

    Without ``spec`` each element is the serialized record (``bytes``); with a ``spec``
    (``{name: FixedLen|VarLen|Sparse}``) each element is that record parsed into a dict of
    numpy values, except that a following ``batch`` parses whole batches at once.
    ``read_stats`` (a :class:`~shardfeed.ReadStats`) accumulates what every pass read and
    skipped. Resumes by ``(file, byte offset)``.
    """

    kind = "tfrecord"

    def __init__(
        self,
        files: str | os.PathLike | Iterable[str | os.PathLike],
        spec: Mapping[str, FeatureSpec] | None = None,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: str = "raise",
        storage_options: Mapping[str, Any] | None = None,
        num_parallel_reads: int | None = None,
        _expanded: bool = False,
    ):
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")
        normalize_compression(compression)
        num_parallel_reads = positive_int("num_parallel_reads", num_parallel_reads, allow_autotune=True,
                                          allow_none=True)
        self.files = list(files) if _expanded else expand_files(files, storage_options)
        self.spec = normalize_spec(spec) if spec is not None else None
        self.compression = compression
        self.verify_crc = verify_crc
        self.on_corrupt = on_corrupt
        self.storage_options = storage_options
        self.num_parallel_reads = num_parallel_reads
        self.read_stats = ReadStats()
        self._interleave: Dataset | None = None
        if num_parallel_reads not in (None, 1) and len(self.files) > 1:
            from .interleave import InterleaveDataset  # noqa: PLC0415

            n = min(len(self.files), (os.cpu_count() or 2) * 2 if num_parallel_reads == AUTOTUNE else num_parallel_reads)
            self._interleave = InterleaveDataset(ListDataset(self.files), self._one_file, cycle_length=n,
                                                 block_length=1, num_parallel_calls=n, deterministic=True,
                                                 _spec=self.spec)

    def _one_file(self, url: str) -> "TFRecordDataset":
        one = copy.copy(self)
        one.files = [url]
        one._interleave = None
        return one

    def _deferred_spec(self) -> Mapping[str, FeatureSpec] | None:
        return self.spec

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        if self._interleave is not None:
            return self._interleave._build(b, state)
        return super()._build(b, state)

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _TFRecordFilesReader:
        return _TFRecordFilesReader(self, self.files, state, raw)

    def __repr__(self) -> str:
        return f"TFRecordDataset({len(self.files)} files, spec={'yes' if self.spec else 'no'})"


def read_tfrecord(
    files: str | os.PathLike | Iterable[str | os.PathLike],
    spec: Mapping[str, FeatureSpec] | None = None,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    num_parallel_reads: int | None = None,
) -> TFRecordDataset:
    """Read TFRecord files given as a URL, a glob or a list of them (any storage).

    Yields serialized records, or parsed examples when ``spec`` is given (a following
    ``batch(n)`` parses n records in one call into numpy columns). ``compression`` is
    ``"auto"`` (by file extension), ``None``, ``"GZIP"`` or ``"ZLIB"``; ``on_corrupt`` is
    ``"raise"`` (a :class:`~shardfeed.errors.CorruptRecordError` naming file and byte
    offset) or ``"skip"`` (counted in ``.read_stats``). ``num_parallel_reads`` files are
    read at once in background threads, records taken from each in turn (``AUTOTUNE``:
    twice the cores). Raises ``FileNotFoundError`` at once when a path or glob matches nothing.

    ``files`` may also be a :class:`~shardfeed.WorkQueue`: the dataset then reads the items
    (files or record ranges) this worker takes off the queue, acknowledging each after its
    last record was delivered.
    """
    if hasattr(files, "take") and hasattr(files, "ack"):
        # a WorkQueue; the distributed layer sits above this one, so it is imported here
        from ..distributed.reading import read_queue  # noqa: PLC0415

        if num_parallel_reads not in (None, 1):
            raise ValueError("num_parallel_reads does not apply to a WorkQueue: a worker reads one item at a time")
        return read_queue(files, spec, compression, verify_crc, on_corrupt, storage_options)  # type: ignore[return-value]
    return TFRecordDataset(files, spec, compression, verify_crc, on_corrupt, storage_options, num_parallel_reads)

"""``batch`` and ``unbatch``.

When the upstream dataset hands out serialized Examples for a spec (a TFRecord source
with ``spec=``, possibly through shuffle/shard/take/repeat/prefetch/interleave), ``batch``
asks for the serialized records and parses the whole batch in one
:func:`~shardfeed.formats.parse.parse_batch` call, straight into numpy columns. Other
elements are stacked: dicts and tuples column by column, arrays along a new first axis,
1-D arrays of different lengths into a :class:`~shardfeed.RaggedColumn`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import DecodeError, ParseError
from ..formats.chunks import iter_frame_chunks, rebatch_tagged
from ..formats.parse import parse_batch
from ..formats.tfrecord import FRAME_OVERHEAD, ReadStats
from ..formats.spec import RaggedColumn, SparseColumn
from .dataset import Dataset, UnaryDataset, positive_int
from .node import Build, Node


def stack(elements: list, where: str = "element") -> Any:
    """Stack a list of like-structured elements into one batch."""
    first = elements[0]
    if isinstance(first, Mapping):
        keys = list(first)
        for e in elements:
            if not isinstance(e, Mapping) or e.keys() != first.keys():
                raise ValueError(f"cannot batch: {where}s have different keys ({keys} vs {list(e)})")
        return {k: stack([e[k] for e in elements], f"{where}[{k!r}]") for k in keys}
    if isinstance(first, tuple):
        n = len(first)
        if any(not isinstance(e, tuple) or len(e) != n for e in elements):
            raise ValueError(f"cannot batch: {where}s are tuples of different lengths")
        return tuple(stack([e[i] for e in elements], f"{where}[{i}]") for i in range(n))
    if isinstance(first, (bytes, str)):
        out = np.empty(len(elements), dtype=object)
        out[:] = elements
        return out
    arrays = [np.asarray(e) for e in elements]
    shape = arrays[0].shape
    if all(a.shape == shape for a in arrays):
        return np.stack(arrays)
    if all(a.ndim == 1 for a in arrays):
        lengths = np.array([len(a) for a in arrays], np.int64)
        return RaggedColumn(np.concatenate(arrays), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    raise ValueError(f"cannot batch: {where}s have different shapes ({shape} and "
                     f"{next(a.shape for a in arrays if a.shape != shape)}); pad them in a map first")


def nbytes(batch: Any) -> int:
    """Bytes held by a batch: its numpy arrays, and the bytes/str values of object arrays."""
    if isinstance(batch, np.ndarray):
        if batch.dtype == object and batch.size:  # bytes/str values live outside the array
            flat = batch.ravel()
            sample = flat[:: max(1, flat.size // 16)]  # an estimate: never a pass over every value
            per = sum(len(v) for v in sample if isinstance(v, (bytes, str))) / len(sample)
            return batch.nbytes + int(per * flat.size)
        return batch.nbytes
    if isinstance(batch, Mapping):
        return sum(nbytes(v) for v in batch.values())
    if isinstance(batch, (tuple, list)):
        return sum(nbytes(v) for v in batch)
    if isinstance(batch, RaggedColumn):
        return nbytes(batch.values) + batch.row_splits.nbytes
    if isinstance(batch, SparseColumn):
        return batch.indices.nbytes + batch.values.nbytes
    return 0


class BatchDataset(UnaryDataset):
    kind = "batch"

    def __init__(self, parent: Dataset, batch_size: int, drop_remainder: bool = False,
                 bytes_as: str = "object") -> None:
        super().__init__(parent)
        self.batch_size = positive_int("batch_size", batch_size)
        self.drop_remainder = bool(drop_remainder)
        if bytes_as not in ("object", "buffer"):
            raise ValueError(f"bytes_as must be 'object' or 'buffer', got {bytes_as!r}")
        self.bytes_as = bytes_as

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        from .sources import TFRecordDataset  # noqa: PLC0415 - sources import this module's users

        parent = self.parent
        if type(parent) is TFRecordDataset and parent._interleave is None and parent.spec is not None:
            return _TFRecordBatchNode(b, self, parent, state)
        return _BatchNode(b, self, state)


class _BatchNode(Node):
    def __init__(self, b: Build, ds: BatchDataset, state: Mapping[str, Any] | None) -> None:
        self.spec = ds.parent._deferred_spec()
        self.parent = ds.parent._build(b.but(raw=self.spec is not None), state)
        super().__init__(b, ds, [self.parent])
        self.size = ds.batch_size
        self.drop = ds.drop_remainder
        self.bytes_as = ds.bytes_as

    def _next(self) -> Any:
        parent = self.parent
        items = []
        try:
            for _ in range(self.size):
                items.append(next(parent))
        except StopIteration:
            if not items or self.drop:
                raise
        out = parse_batch(items, self.spec, bytes_as=self.bytes_as) if self.spec is not None else stack(items)
        self.stats.bytes += nbytes(out)
        return out

    def get_state(self) -> dict:
        return self.parent.get_state()

    def close(self) -> None:
        self.parent.close()


class _TFRecordBatchNode(Node):
    """``read_tfrecord(files, spec).batch(n)`` fused: whole batches of frames straight from
    the chunked reader to the batch parser, no per-record step. Its state is the source's
    ``(file, byte offset)`` cursor, so it resumes exactly like the unfused chain."""

    def __init__(self, b: Build, ds: BatchDataset, src: Any, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds)
        self.src = src
        self.bytes_as = ds.bytes_as
        self.fi = int(state["file"]) if state else 0
        self.offset = int(state["offset"]) if state else 0
        self._stats: list[ReadStats] = []
        self._batches = rebatch_tagged(self._chunks(self.fi, self.offset), ds.batch_size, ds.drop_remainder)
        b.ctx.on_close(self.close)

    def _chunks(self, fi: int, offset: int):
        src = self.src
        for i in range(fi, len(src.files)):
            stats = ReadStats()
            self._stats.append(stats)
            for chunk in iter_frame_chunks(src.files[i], src.compression, src.verify_crc, src.on_corrupt,
                                           src.storage_options, stats=stats, start_offset=offset if i == fi else 0):
                yield chunk, i
            self._merge_stats()

    def _next(self) -> Any:
        batch, fi = next(self._batches)
        self.fi = fi
        self.offset = int(batch.positions[-1] + batch.lengths[-1]) + FRAME_OVERHEAD
        try:
            out = parse_batch(batch, self.src.spec, bytes_as=self.bytes_as)
        except (DecodeError, ParseError) as exc:
            if exc.record_index is not None and 0 <= exc.record_index < batch.count:
                exc.add_note(f"in record at byte offset {int(batch.positions[exc.record_index])} "
                             f"of {self.src.files[fi]} (or the file before it, for a batch spanning two)")
            raise
        self.stats.bytes += nbytes(out)
        return out

    def _merge_stats(self) -> None:
        from .sources import _merge_lock  # noqa: PLC0415

        with _merge_lock:
            for st in self._stats:
                self.src.read_stats.merge(st)
        self._stats = []

    def get_state(self) -> dict:
        return {"file": self.fi, "offset": self.offset}

    def close(self) -> None:
        self._batches.close()
        self._merge_stats()


class UnbatchDataset(UnaryDataset):
    kind = "unbatch"

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _UnbatchNode(b.but(raw=False), self, state)


def split(batch: Any) -> list:
    """The rows of a batch (inverse of :func:`stack`)."""
    if isinstance(batch, Mapping):
        cols = {k: split(v) for k, v in batch.items()}
        n = {len(v) for v in cols.values()}
        if len(n) > 1:
            raise ValueError(f"cannot unbatch: columns have different lengths {sorted(n)}")
        return [{k: cols[k][i] for k in cols} for i in range(n.pop() if n else 0)]
    if isinstance(batch, tuple):
        cols = [split(v) for v in batch]
        return list(zip(*cols))
    if isinstance(batch, RaggedColumn):
        return batch.to_list()
    if isinstance(batch, SparseColumn):
        raise TypeError("cannot unbatch a SparseColumn; parse it as VarLen to get a RaggedColumn")
    if isinstance(batch, (np.ndarray, list)):
        return list(batch)
    raise TypeError(f"cannot unbatch a {type(batch).__name__}: expected arrays, dicts or tuples of them")


class _UnbatchNode(Node):
    def __init__(self, b: Build, ds: UnbatchDataset, state: Mapping[str, Any] | None) -> None:
        self.batch_state = state["parent"] if state else None  # upstream state before the current batch
        self.parent = ds.parent._build(b, self.batch_state)
        super().__init__(b, ds, [self.parent])
        self.rows: list = []
        self.i = 0
        skip = int(state["row"]) if state else 0
        if skip:
            self._load()
            self.i = skip

    def _load(self) -> None:
        self.batch_state = self.parent.get_state()
        self.rows = split(next(self.parent))
        self.i = 0

    def _next(self) -> Any:
        while self.i >= len(self.rows):
            self._load()
        x = self.rows[self.i]
        self.i += 1
        return x

    def get_state(self) -> dict:
        if self.i >= len(self.rows):
            return {"parent": self.parent.get_state(), "row": 0}
        return {"parent": self.batch_state, "row": self.i}

    def close(self) -> None:
        self.rows = []
        self.parent.close()

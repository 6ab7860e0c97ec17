"""``batch`` and ``unbatch``.

A parent that can make whole batches itself says so through the declared hook
``Dataset._batch_node`` (the TFRecord source does: frames straight to the batch parser).
Otherwise, when the upstream dataset hands out serialized Examples for a spec (a TFRecord
source with ``spec=``, possibly through shuffle/shard/take/repeat/prefetch/interleave),
``batch`` asks for the serialized records and parses the whole batch in one
:func:`~shardfeed.formats.parse.parse_batch` call, straight into numpy columns. Other
elements are stacked: dicts and tuples column by column, arrays along a new first axis,
1-D arrays of different lengths into a :class:`~shardfeed.RaggedColumn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..formats.parse import parse_batch
from ..formats.spec import BYTES, FixedLen, RaggedColumn, SparseColumn, VarLen
from .dataset import Dataset, UnaryDataset, batches_of, positive_int
from .node import Build, Node
from .skipping import parse_skipping
from .tree import StructureMismatch, keystr, tree_flatten, tree_leaves, tree_map_with_path, tree_unflatten


def stack(elements: list, where: str = "element") -> Any:
    """Stack a list of like-structured elements into one batch."""
    try:
        return tree_map_with_path(lambda path, *leaves: _stack_leaves(list(leaves), where + keystr(path)), *elements)
    except StructureMismatch as e:
        w = where + keystr(e.path)
        if isinstance(e.first, Mapping):
            other = list(e.other) if isinstance(e.other, Mapping) else type(e.other).__name__
            raise ValueError(f"cannot batch: {w}s have different keys ({list(e.first)} vs {other})") from None
        raise ValueError(f"cannot batch: {w}s are tuples of different lengths") from None


def _stack_leaves(elements: list, where: str) -> Any:
    first = elements[0]
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
    return sum(_leaf_nbytes(x) for x in tree_leaves(batch, sequences=(tuple, list)))


def _leaf_nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        if x.dtype == object and x.size:  # bytes/str values live outside the array
            flat = x.ravel()
            sample = flat[:: max(1, flat.size // 16)]  # an estimate: never a pass over every value
            per = sum(len(v) for v in sample if isinstance(v, (bytes, str))) / len(sample)
            return x.nbytes + int(per * flat.size)
        return x.nbytes
    if isinstance(x, RaggedColumn):
        return _leaf_nbytes(x.values) + x.row_splits.nbytes
    if isinstance(x, SparseColumn):
        return x.indices.nbytes + x.values.nbytes
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

    def cardinality(self) -> int | float | None:
        return batches_of(self.parent.cardinality(), self.batch_size, self.drop_remainder)

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        fused = self.parent._batch_node(b, state, self)
        return fused if fused is not None else _BatchNode(b, self, state)


class _BatchNode(Node):
    def __init__(self, b: Build, ds: BatchDataset, state: Mapping[str, Any] | None) -> None:
        self.spec = ds.parent._deferred_spec()
        self.policy = ds.parent._deferred_policy() if self.spec is not None else None
        self.errors = b.ctx.stats.errors
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
        if self.spec is None:
            out = stack(items)
        elif self.policy is None or self.policy.raises:
            out = parse_batch(items, self.spec, bytes_as=self.bytes_as)
        else:
            out, skipped = parse_skipping(items, self.spec, self.bytes_as)
            for k, exc in skipped:  # a handler may stop here
                self.policy.handle(exc, {"stage": "parse", "record_index": k}, self.errors)
            if out is None:  # every record of this batch was skipped
                return self._next()
        self.stats.bytes += nbytes(out)
        return out

    def get_state(self) -> dict:
        return self.parent.get_state()

    def close(self) -> None:
        self.parent.close()


class UnbatchDataset(UnaryDataset):
    kind = "unbatch"

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _UnbatchNode(b.but(raw=False), self, state)


def split(batch: Any) -> list:
    """The rows of a batch (inverse of :func:`stack`)."""
    leaves, treedef = tree_flatten(batch)
    if treedef.kind == "leaf":
        return _split_leaf(batch)
    cols = [_split_leaf(x) for x in leaves]
    n = {len(c) for c in cols}
    if len(n) > 1:
        raise ValueError(f"cannot unbatch: columns have different lengths {sorted(n)}")
    return [tree_unflatten(treedef, [c[i] for c in cols]) for i in range(n.pop() if n else 0)]


def _split_leaf(batch: Any) -> list:
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


def bytes_as_buffers(ds: Dataset) -> tuple[Dataset, Any]:
    """``(chain, spec)``: for a chain that ends in ``batch()`` over parsed TFRecords with
    bytes as objects (FixedLen or VarLen bytes features), the same chain with its bytes
    parsed as buffers, and the spec that says which columns the consumer wants as objects;
    any other chain as it is, and None. A process that hands its batches to another (an
    ``in_subprocess`` child, a DataLoader worker) then never makes a ``bytes`` object per
    value only to pack them again (26 a record for a CTR table)."""
    if type(ds) is not BatchDataset or ds.bytes_as != "object":
        return ds, None
    spec = ds.parent._deferred_spec()
    if not spec:
        return ds, None
    cols = [s for s in spec.values() if getattr(s, "dtype", None) == BYTES]
    if not cols or any(type(s) not in (FixedLen, VarLen) or (type(s) is FixedLen and not s.size) for s in cols):
        return ds, None
    return BatchDataset(ds.parent, ds.batch_size, ds.drop_remainder, "buffer"), spec

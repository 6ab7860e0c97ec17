"""Stages that choose which elements pass, by position: take, skip, shard, repeat."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .dataset import Dataset, UnaryDataset, positive_int
from .node import Build, Node


class _PassNode(Node):
    """A synchronous one-upstream node; serialized records pass through untouched."""

    def __init__(self, b: Build, ds: UnaryDataset, parent_state: Any) -> None:
        self.parent = ds.parent._build(b, parent_state)
        super().__init__(b, ds, [self.parent])

    def close(self) -> None:
        self.parent.close()


class TakeDataset(UnaryDataset):
    kind = "take"

    def __init__(self, parent: Dataset, count: int) -> None:
        super().__init__(parent)
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"take count must be an int, got {count!r}")
        self.count = count  # negative: all

    def cardinality(self) -> int | float | None:
        n = self.parent.cardinality()
        if self.count < 0 or n is None:
            return n
        return min(n, self.count)

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _TakeNode(b, self, state)


class _TakeNode(_PassNode):
    def __init__(self, b: Build, ds: TakeDataset, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds, state["parent"] if state else None)
        self.left = int(state["left"]) if state else ds.count

    def _next(self) -> Any:
        if self.left == 0:
            raise StopIteration
        x = next(self.parent)
        self.left -= 1
        return x

    def get_state(self) -> dict:
        return {"parent": self.parent.get_state(), "left": self.left}


class SkipDataset(UnaryDataset):
    kind = "skip"

    def __init__(self, parent: Dataset, count: int) -> None:
        super().__init__(parent)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"skip count must be an int >= 0, got {count!r}")
        self.count = count

    def cardinality(self) -> int | float | None:
        n = self.parent.cardinality()
        return n if n is None or n == math.inf else max(0, n - self.count)

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _SkipNode(b, self, state)


class _SkipNode(_PassNode):
    def __init__(self, b: Build, ds: SkipDataset, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds, state["parent"] if state else None)
        self.to_skip = int(state["to_skip"]) if state else ds.count

    def _next(self) -> Any:
        while self.to_skip:
            next(self.parent)
            self.to_skip -= 1
        return next(self.parent)

    def get_state(self) -> dict:
        return {"parent": self.parent.get_state(), "to_skip": self.to_skip}


class ShardDataset(UnaryDataset):
    kind = "shard"

    def __init__(self, parent: Dataset, index: int, count: int) -> None:
        super().__init__(parent)
        positive_int("shard count", count)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"shard index must be an int in [0, {count}), got {index!r}")
        self.index = index
        self.count = count

    def cardinality(self) -> int | float | None:
        n = self.parent.cardinality()
        return n if n is None or n == math.inf else len(range(self.index, n, self.count))

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _ShardNode(b, self, state)


class _ShardNode(_PassNode):
    def __init__(self, b: Build, ds: ShardDataset, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds, state["parent"] if state else None)
        self.count = ds.count
        self.pos = int(state["pos"]) if state else 0  # position of the next upstream element
        self.index = ds.index

    def _next(self) -> Any:
        parent = self.parent
        while self.pos % self.count != self.index:
            next(parent)
            self.pos += 1
        x = next(parent)
        self.pos += 1
        return x

    def get_state(self) -> dict:
        return {"parent": self.parent.get_state(), "pos": self.pos}


class RepeatDataset(UnaryDataset):
    kind = "repeat"

    def __init__(self, parent: Dataset, count: int | None = None) -> None:
        super().__init__(parent)
        if count == -1:
            count = None
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"repeat count must be an int >= 0, or None/-1 for forever, got {count!r}")
        self.count = count

    def cardinality(self) -> int | float | None:
        n = self.parent.cardinality()
        if n is None or n == 0:
            return n  # empty passes: nothing, however many
        return math.inf if self.count is None else n * self.count

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _RepeatNode(b, self, state)


EMPTY_EPOCHS_TO_END = 64
"""``repeat()`` (forever) ends after this many epochs in a row gave nothing (a data set that
is empty, or a queue drained): one empty epoch is not enough, since a reader dealt files or
blocks by a shuffle may get only empty ones in one epoch and records in the next. A finite
``repeat(n)`` runs its ``n`` epochs, empty ones included (as tf.data's does)."""


class _RepeatNode(Node):
    def __init__(self, b: Build, ds: RepeatDataset, state: Mapping[str, Any] | None) -> None:
        self.b = b
        self.ds = ds
        self.epoch = int(state["epoch"]) if state else 0
        self.yielded = bool(state["yielded"]) if state else False  # this epoch gave something
        self.empty = int(state.get("empty", 0)) if state else 0  # epochs in a row that gave nothing
        self.parent: Node | None = None
        if ds.count is None or self.epoch < ds.count:
            self.parent = ds.parent._build(b.but(epoch=b.epoch + (self.epoch,)), state["parent"] if state else None)
        super().__init__(b, ds, [self.parent] if self.parent else [])

    def _next(self) -> Any:
        while self.parent is not None:
            try:
                x = next(self.parent)
            except StopIteration:
                self.parent.close()
                self.parent = None
                self.empty = 0 if self.yielded else self.empty + 1
                if self.ds.count is None and self.empty >= EMPTY_EPOCHS_TO_END:
                    break  # empty epoch after empty epoch: repeating forever would never yield
                self.epoch += 1
                self.yielded = False
                if self.ds.count is None or self.epoch < self.ds.count:
                    self.parent = self.ds.parent._build(self.b.but(epoch=self.b.epoch + (self.epoch,)), None)
                continue
            self.yielded = True
            return x
        raise StopIteration

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "yielded": self.yielded, "empty": self.empty,
                "parent": self.parent.get_state() if self.parent is not None else None}

    def close(self) -> None:
        if self.parent is not None:
            self.parent.close()


def split_near_source(ds: Dataset, index: int, count: int, threads: int | None = None) -> Dataset:
    """``ds`` with its source replaced by reader ``index`` of ``count``'s share (split on
    spans, see ``Dataset._split``), or, when the source cannot split, with a ``shard``
    just above the source (elements dealt before they are shuffled or parsed); the
    stages above are copied onto it. ``threads`` caps the source's own threads."""
    import copy  # noqa: PLC0415

    chain = []
    node = ds
    while isinstance(node, UnaryDataset):
        chain.append(node)
        node = node.parent
    split = node._split(index, count, threads)
    if split is None:
        split = node if count == 1 else ShardDataset(node, index, count)
    for stage in reversed(chain):
        clone = copy.copy(stage)
        clone.__dict__.pop("_passes", None)
        clone.__dict__.pop("_last_stats", None)
        clone.parent = split
        split = clone
    return split

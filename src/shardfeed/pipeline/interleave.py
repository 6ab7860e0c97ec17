"""``interleave``: open a dataset per input element and mix several at once.

``cycle_length`` datasets are open at a time; ``block_length`` elements are taken from each
in turn; when one ends, the next input element opens in its slot. With
``num_parallel_calls`` a pool of that many threads reads each open dataset ahead, one
chunk (about a millisecond of reading) at a time, at most one chunk ahead per slot. The
output order is the same with or without threads. The state holds, per slot, the upstream
state before its input element (to reopen it), the slot's dataset state at the start of
its current chunk and how many of the chunk were delivered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from .dataset import Dataset, UnaryDataset, positive_int
from .node import AUTOTUNE, CHUNK_SECONDS, Build, Node
from .userfn import stop_error
from .workers import WorkerPool

MAX_CHUNK = 1024


class InterleaveDataset(UnaryDataset):
    kind = "interleave"

    def __init__(self, parent: Dataset, fn: Callable[[Any], Dataset], cycle_length: int = AUTOTUNE,
                 block_length: int = 1, num_parallel_calls: int | None = None, deterministic: bool = True,
                 _spec: Mapping[str, Any] | None = None) -> None:
        super().__init__(parent)
        if not callable(fn):
            raise TypeError(f"interleave needs a function from element to Dataset, got {type(fn).__name__}")
        self.fn = fn
        self.cycle_length = positive_int("cycle_length", cycle_length, allow_autotune=True)
        self.block_length = positive_int("block_length", block_length)
        self.num_parallel_calls = positive_int("num_parallel_calls", num_parallel_calls, allow_autotune=True,
                                               allow_none=True)
        # order is always deterministic; the flag is accepted for tf.data compatibility
        self.deterministic = deterministic
        self._spec = _spec

    def _deferred_spec(self):
        return self._spec

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _InterleaveNode(b, self, state)


def _read_chunk(child: Node, skip: int, stats: Any) -> tuple[Any, list, bool]:
    """Runs in a pool thread: skip ``skip`` elements, then read about a millisecond's worth."""
    t0 = time.perf_counter()
    for _ in range(skip):
        next(child)
    st = child.get_state()
    items = []
    ended = False
    try:
        while len(items) < MAX_CHUNK:
            items.append(next(child))
            if time.perf_counter() - t0 >= CHUNK_SECONDS:
                break
    except StopIteration:
        ended = True
    stats.add_work(time.perf_counter() - t0)
    return st, items, ended


class _Slot:
    """One open dataset of the cycle; reads ahead through ``pool`` when given."""

    def __init__(self, node: "_InterleaveNode", child: Node, input_state: Any, child_start: Any, skip: int) -> None:
        self.owner = node
        self.child_start = child_start
        self.child = child
        self.input_state = input_state
        self.pool: WorkerPool | None = node.pool
        self.fut: Future | None = None
        self.cur: list = []
        self.pos = 0
        self.cur_state: Any = None
        self.cur_skip = skip
        self.pending_skip = skip
        self.reading_done = False
        self.ended = False
        if self.pool is None:
            for _ in range(skip):
                next(child)
            self.pending_skip = 0
        else:
            self._schedule()

    def _schedule(self) -> None:
        if self.fut is None and not self.reading_done:
            self.fut = self.pool.submit(_read_chunk, self.child, self.pending_skip, self.owner.stats)
            self.pending_skip = 0

    def next(self) -> Any:
        if self.pool is None:
            return next(self.child)
        while self.pos >= len(self.cur):
            if self.ended or (self.reading_done and self.fut is None):
                self.ended = True
                raise StopIteration
            self._schedule()
            fut, self.fut = self.fut, None
            st, items, ended = fut.result()  # a reader's exception is re-raised here
            if ended:
                self.reading_done = True
                self.ended = not items
            else:
                self._schedule()  # read the next chunk while this one is consumed
            self.cur, self.cur_state, self.cur_skip, self.pos = items, st, 0, 0
        x = self.cur[self.pos]
        self.pos += 1
        return x

    def get_state(self) -> dict:
        if self.pool is None:
            return {"input": self.input_state, "child": self.child.get_state(), "skip": 0}
        if self.cur_state is None:  # nothing read yet: the state it was opened at
            return {"input": self.input_state, "child": self.child_start, "skip": self.cur_skip}
        return {"input": self.input_state, "child": self.cur_state, "skip": self.cur_skip + self.pos}

    def close(self) -> None:
        fut = self.fut
        if fut is not None:
            fut.cancel()
            try:
                fut.result()  # let an in-flight read finish before its file is closed
            except BaseException:  # noqa: BLE001 - the slot is going away
                pass
        self.child.close()


class _InterleaveNode(Node):
    def __init__(self, b: Build, ds: InterleaveDataset, state: Mapping[str, Any] | None) -> None:
        self.pb = b.but(raw=False)
        self.parent = ds.parent._build(self.pb, state["parent"] if state else None)
        super().__init__(b, ds, [self.parent])
        self.ds = ds
        cpus = os.cpu_count() or 1
        npc = ds.num_parallel_calls
        self.cycle = ds.cycle_length if ds.cycle_length != AUTOTUNE else (npc if npc not in (None, AUTOTUNE) else cpus)
        self.workers = 0 if npc is None else (self.cycle if npc == AUTOTUNE else min(npc, self.cycle))
        self.child_b = b.but(raw=b.raw and ds._spec is not None, scope=f"interleave{id(ds) % 10000}")
        self.pool: WorkerPool | None = None
        if self.workers:
            self.stats.threaded = True
            self.stats.parallelism = self.workers
        self.slots: list[_Slot | None] = [None] * self.cycle
        self.cur = int(state["cur"]) if state else 0
        self.block = int(state["block"]) if state else 0
        self.inputs_done = bool(state["inputs_done"]) if state else False
        self.started = bool(state["started"]) if state else False
        self.saved_slots = list(state["slots"]) if state and self.started else None
        b.ctx.on_close(self.close)

    def _ensure_started(self) -> None:
        if self.workers and self.pool is None:
            if self.ctx.closed:
                raise RuntimeError("the iterator was closed")
            self.pool = WorkerPool(self.workers, "interleave")
            self.ctx.on_close(self.pool.close)
        if self.saved_slots is not None:
            saved, self.saved_slots = self.saved_slots, None
            for i, st in enumerate(saved):
                if st is not None:
                    self.slots[i] = self._reopen(st)
        elif not self.started:
            self.started = True
            for i in range(self.cycle):
                self.slots[i] = self._open()

    def _child(self, element: Any) -> Dataset:
        fn = self.ds.fn
        try:
            child = fn(element)
        except StopIteration as exc:  # fn's error, not the end of the inputs (userfn.py)
            raise stop_error(fn, "the interleave stage's function", exc) from exc
        if not isinstance(child, Dataset):
            raise TypeError(f"interleave's function must return a shardfeed Dataset, got {type(child).__name__} "
                            f"for element {element!r:.100}")
        return child

    def _open(self) -> _Slot | None:
        if self.inputs_done:
            return None
        input_state = self.parent.get_state()
        try:
            element = next(self.parent)
        except StopIteration:
            self.inputs_done = True
            return None
        child = self._child(element)._build(self.child_b, None)
        return _Slot(self, child, input_state, None, 0)

    def _reopen(self, st: Mapping[str, Any]) -> _Slot:
        p = self.ds.parent._build(self.pb, st["input"])
        try:
            element = next(p)
        finally:
            p.close()
        child = self._child(element)._build(self.child_b, st["child"])
        return _Slot(self, child, st["input"], st["child"], int(st["skip"]))

    def _next(self) -> Any:
        self._ensure_started()
        slots = self.slots
        while True:
            if self.inputs_done and all(s is None for s in slots):
                raise StopIteration
            slot = slots[self.cur]
            if slot is None:
                slot = slots[self.cur] = self._open()
                if slot is None:
                    self._advance()
                    continue
            try:
                x = slot.next()
            except StopIteration:
                slot.close()
                slots[self.cur] = self._open()
                self._advance()
                continue
            self.block += 1
            if self.block >= self.ds.block_length:
                self._advance()
            return x

    def _advance(self) -> None:
        self.cur = (self.cur + 1) % self.cycle
        self.block = 0

    def get_state(self) -> dict:
        if self.saved_slots is not None:
            slots = self.saved_slots
        else:
            slots = [s.get_state() if s is not None else None for s in self.slots]
        return {"parent": self.parent.get_state(), "cur": self.cur, "block": self.block,
                "inputs_done": self.inputs_done, "started": self.started, "slots": slots}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        for i, s in enumerate(self.slots):
            if s is not None:
                s.close()
                self.slots[i] = None
        self.parent.close()

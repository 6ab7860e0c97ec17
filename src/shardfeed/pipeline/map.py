"""``map`` (in the consumer's thread, or in worker threads or processes) and ``filter``.

A parallel map pulls its input in chunks sized to about a millisecond of ``fn`` work
(adapted as it runs), hands each chunk to a worker, and delivers results in input order.
Its state is the upstream state at the start of the chunk being delivered plus how many
of that chunk were delivered, so a resume re-reads one chunk at most and maps nothing twice.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from .dataset import Dataset, UnaryDataset, positive_int
from .frames import FrameRecorder
from .node import AUTOTUNE, CHUNK_SECONDS, Build, Node
from .policy import ErrorPolicy
from .userfn import describe, stop_error
from .workers import WorkerPool

MAX_CHUNK = 1024


class MapDataset(UnaryDataset):
    kind = "map"

    def __init__(self, parent: Dataset, fn: Callable[[Any], Any], num_parallel_calls: int | None = None,
                 deterministic: bool = True, use_processes: bool = False, on_error: Any = "raise") -> None:
        super().__init__(parent)
        if not callable(fn):
            raise TypeError(f"map needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.policy = ErrorPolicy(on_error)
        self.num_parallel_calls = positive_int("num_parallel_calls", num_parallel_calls, allow_autotune=True,
                                               allow_none=True)
        self.deterministic = bool(deterministic)
        self.use_processes = bool(use_processes)
        if self.use_processes:
            from .pickling import why_unpicklable  # noqa: PLC0415 - only processes need it

            why = why_unpicklable(fn)
            if why is not None:
                raise TypeError(f"map(use_processes=True) sends its function to worker processes by pickle, but "
                                f"{why}: give a top-level function of an importable module holding nothing that "
                                "cannot travel (locks, open files, sockets, generators), or use threads "
                                "(num_parallel_calls without use_processes)")

    def cardinality(self) -> int | float | None:
        return self.parent.cardinality() if self.policy.raises else None

    def _order_varies(self) -> bool:
        return not self.deterministic and self._parallel  # outputs as they finish

    def __repr__(self) -> str:
        if self.kind != "map":  # a stage built on map (decode_images): its own arguments, not its function
            return super().__repr__()
        return f"{self.parent!r}.map({describe(self.fn)})"

    def _record_source(self) -> Dataset | None:
        # one output an input, in order, unless fn's failures are skipped; a parallel map
        # above a filter would resume by re-reading elements the filter numbers no more
        if not self.policy.raises or not self.deterministic:
            return None
        if self._parallel and self.parent._filters_records():
            return None
        return self.parent._record_source()

    def _filters_records(self) -> bool:
        return self.parent._filters_records()

    @property
    def _parallel(self) -> bool:
        return self.num_parallel_calls is not None or self.use_processes

    def _records_before(self, state: Mapping[str, Any] | None) -> int:
        if state is None:
            return 0
        if not self._parallel:  # its state is its parent's
            return self.parent._records_before(state)
        return int(state["skip"]) + self.parent._records_before(state["parent"])

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        b = b.but(raw=False)  # fn sees parsed elements
        if self.num_parallel_calls is None and not self.use_processes:
            return _MapNode(b, self, state)
        return _ParallelMapNode(b, self, state)


class _MapNode(Node):
    def __init__(self, b: Build, ds: MapDataset, state: Mapping[str, Any] | None) -> None:
        self.parent = ds.parent._build(b, state)
        self.fn = ds.fn
        self.policy = ds.policy
        self.errors = b.ctx.stats.errors
        self.taken = 0  # inputs taken this pass, for naming the one that failed
        super().__init__(b, ds, [self.parent])

    def _next(self) -> Any:
        fn = self.fn
        if self.policy.raises:
            x = next(self.parent)
            try:
                return fn(x)
            except StopIteration as exc:  # fn's error, not the end of the data (userfn.py)
                raise stop_error(fn, "the map stage's function", exc) from exc
        while True:
            x = next(self.parent)
            self.taken += 1
            try:
                return fn(x)
            except Exception as exc:  # noqa: BLE001 - the policy decides
                if isinstance(exc, StopIteration):
                    err = stop_error(fn, "the map stage's function", exc)
                    err.__cause__ = exc
                    exc = err
                self.policy.handle(exc, {"stage": "map", "element": self.taken - 1}, self.errors)

    def get_state(self) -> dict:
        return self.parent.get_state()

    def close(self) -> None:
        self.parent.close()


class _Failed:
    """In place of a result: ``fn`` raised ``exc`` on that input (a map that skips)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self):
        return (_Failed, (self.exc,))


def _apply(fn: Callable[[Any], Any], items: list, keep_going: bool = False,
           stage: str = "map") -> tuple[list, float]:
    t = time.perf_counter()
    if not keep_going:
        try:
            out = [fn(x) for x in items]
        except StopIteration as exc:  # fn's error: the pool would hand it on as the end of the data
            raise stop_error(fn, f"the {stage} stage's function", exc) from exc
    else:
        out = []
        for x in items:
            try:
                out.append(fn(x))
            except Exception as exc:  # noqa: BLE001 - handed to the policy in order
                if isinstance(exc, StopIteration):
                    err = stop_error(fn, f"the {stage} stage's function", exc)
                    err.__cause__ = exc
                    exc = err
                out.append(_Failed(exc))
    return out, time.perf_counter() - t


class _ProcessPool:
    """A process pool with the :class:`WorkerPool` interface (``fn`` must be picklable)."""

    def __init__(self, n: int) -> None:
        self._ex = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))
        self.size = n

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._ex.submit(fn, *args)

    def close(self) -> None:
        self._ex.shutdown(wait=True, cancel_futures=True)


class _ParallelMapNode(Node):
    def __init__(self, b: Build, ds: MapDataset, state: Mapping[str, Any] | None) -> None:
        self.init_state = state["parent"] if state else None
        self.skip = int(state["skip"]) if state else 0
        self.parent = ds.parent._build(b, self.init_state)
        super().__init__(b, ds, [self.parent])
        n = ds.num_parallel_calls
        self.n = (os.cpu_count() or 1) if n in (None, AUTOTUNE) else n
        self.fn = ds.fn
        self.ds = ds
        self.policy = ds.policy
        self.errors = b.ctx.stats.errors
        self.taken = 0  # inputs taken this pass (submitted)
        self.cur_start = 0
        self.pool: Any = None
        self.pending: collections.deque = collections.deque()
        self.cur: list | None = None
        self.cur_state: Any = None
        self.pos = 0
        self.chunk = 1
        self.exhausted = False
        self.stats.threaded = True
        self.stats.parallelism = self.n

    def _start(self) -> None:
        if self.ctx.closed:
            raise RuntimeError("the iterator was closed")
        self.pool = _ProcessPool(self.n) if self.ds.use_processes else WorkerPool(self.n, "map")
        self.ctx.on_close(self.pool.close)

    def _fill(self) -> None:
        if self.pool is None:
            self._start()
        parent = self.parent
        stop = self.ctx.stop
        while self.skip:  # resuming inside a chunk: those inputs were delivered already
            next(parent)
            self.skip -= 1
        while not self.exhausted and len(self.pending) < 2 * self.n:
            if stop.is_set():  # the pass closed (from another thread): no chunk would fill
                if not self.pending:
                    raise RuntimeError("the iterator was closed")
                break
            st = parent.get_state()
            items = []
            t0 = time.perf_counter()
            try:
                # a chunk is about a millisecond of fn work, and of waiting on the input too
                while len(items) < self.chunk and not stop.is_set():
                    items.append(next(parent))
                    if time.perf_counter() - t0 >= CHUNK_SECONDS:
                        break
            except StopIteration:
                self.exhausted = True
            if items:
                self.pending.append((st, self.pool.submit(_apply, self.fn, items, not self.policy.raises,
                                                          self.ds.kind), self.taken))
                self.taken += len(items)

    def _take_done(self) -> tuple[Any, Future, int]:
        if self.ds.deterministic:
            return self.pending.popleft()
        done, _ = wait([f for _, f, _ in self.pending], return_when=FIRST_COMPLETED)
        for i, (st, f, start) in enumerate(self.pending):
            if f in done:
                del self.pending[i]
                return st, f, start
        raise AssertionError("unreachable")

    def _next(self) -> Any:
        while True:
            cur = self.cur
            if cur is not None and self.pos < len(cur):
                x = cur[self.pos]
                self.pos += 1
                if type(x) is _Failed:
                    self.policy.handle(x.exc, {"stage": "map", "element": self.cur_start + self.pos - 1}, self.errors)
                    continue
                return x
            self._fill()
            if not self.pending:
                raise StopIteration
            st, fut, self.cur_start = self._take_done()
            results, dt = fut.result()  # a worker's exception is re-raised here, traceback kept
            self.stats.work_s += dt
            per = dt / len(results)
            self.chunk = max(1, min(MAX_CHUNK, int(CHUNK_SECONDS / per) if per > 0 else MAX_CHUNK))
            self.cur, self.cur_state, self.pos = results, st, 0
            self._fill()

    def get_state(self) -> dict:
        if not self.ds.deterministic:
            raise ValueError("a map with deterministic=False cannot be resumed exactly; "
                             "use deterministic=True to checkpoint this pipeline")
        if self.cur is None:
            return {"parent": self.init_state, "skip": self.skip}
        return {"parent": self.cur_state, "skip": self.pos}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        for _, f, _ in self.pending:
            f.cancel()
        self.pending.clear()
        self.parent.close()


class FilterDataset(UnaryDataset):
    kind = "filter"

    def __init__(self, parent: Dataset, predicate: Callable[[Any], bool]) -> None:
        super().__init__(parent)
        if not callable(predicate):
            raise TypeError(f"filter needs a callable, got {type(predicate).__name__}")
        self.predicate = predicate

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _FilterNode(b.but(raw=False), self, state)

    def __repr__(self) -> str:
        return f"{self.parent!r}.filter({describe(self.predicate)})"

    def _record_source(self) -> Dataset | None:
        # some of the records, in order: the node tells a shuffle above which (one filter at most)
        return None if self.parent._filters_records() else self.parent._record_source()

    def _filters_records(self) -> bool:
        return True

    def _records_before(self, state: Mapping[str, Any] | None) -> int:
        return self.parent._records_before(state)


class _FilterNode(_MapNode):
    def __init__(self, b: Build, ds: FilterDataset, state: Mapping[str, Any] | None) -> None:
        self.parent = ds.parent._build(b, state)
        self.predicate = ds.predicate
        # a shuffle above restoring by record offsets: where each element let through lies
        rec = b.frames if isinstance(b.frames, FrameRecorder) and b.frames.kept is not None else None
        self.recorder = rec
        self.record = rec.count + ds.parent._records_before(state) if rec is not None else 0
        Node.__init__(self, b, ds, [self.parent])

    def _next(self) -> Any:
        pred = self.predicate
        parent = self.parent
        rec = self.recorder
        if rec is None:
            while True:
                x = next(parent)
                try:
                    keep = pred(x)
                except StopIteration as exc:  # pred's error, not the end of the data (userfn.py)
                    raise stop_error(pred, "the filter stage's predicate", exc) from exc
                if keep:
                    return x
        r = self.record
        try:
            while True:
                x = next(parent)
                r += 1
                try:
                    keep = pred(x)
                except StopIteration as exc:
                    raise stop_error(pred, "the filter stage's predicate", exc) from exc
                if keep:
                    rec.pending.append(r - 1)  # where it lies is looked up in bulk (FrameRecorder.resolve)
                    return x
                if not r & 4095 and not rec.pending:
                    rec.forget_before(r - 1)  # a long run dropped: the chunks passed go
        finally:
            self.record = r

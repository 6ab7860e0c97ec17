"""The iterator contract every stage implements, and the context one pass shares.

A :class:`Node` is one stage of one pass: ``next()`` gives the next element,
``get_state()`` a small dict (cursors, counters, seeds; never buffered data) from which
the same stage, rebuilt by ``Dataset._build(ctx, state, ...)``, yields exactly the
elements that were not yet delivered, in the same order. A node's state describes what it
has *delivered* to its consumer, not what it read ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .stats import PipelineStats, StageStats

logger = logging.getLogger(__name__)

AUTOTUNE = -1
"""Pass as a parallelism or buffer size to let shardfeed choose it (``sf.AUTOTUNE``)."""

DEFAULT_MEMORY_BUDGET = 512 << 20
"""Bytes that AUTOTUNE-sized buffers of one pass may hold together."""

CHUNK_SECONDS = 0.001
"""Work handed between threads at once: about a millisecond of it (a wake costs ~50 us)."""


class Context:
    """What all nodes of one pass share: the stop event, the things to close, the stats."""

    def __init__(self, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> None:
        self.stop = threading.Event()
        self.stats = PipelineStats()
        self.memory_budget = memory_budget
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.closed = False
        # what the consumer got, for sources that act on it (a queue acknowledges items)
        self.delivery_listeners: list[Callable[[Callable[[], Any] | None], None]] = []
        self.consumer_waiting = False  # the consumer is in next(): every element made was taken

    def on_delivered(self, fn: Callable[[Callable[[], Any] | None], None]) -> None:
        """Call ``fn(get_state)`` each time the consumer of the pass got an element, where
        ``get_state()`` makes the root's state as of that element (call it only when needed:
        ``fn`` runs for every element), and ``fn(None)`` once every element was delivered
        (the pass's natural end). Only a pass iterated by a ``PipelineIterator`` in this
        process reports: see :func:`building_context`."""
        self.delivery_listeners.append(fn)

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the pass closes (at once if it already has)."""
        with self._lock:
            if not self.closed:
                self._closers.append(fn)
                return
        fn()

    def close(self) -> None:
        """Stop every thread of the pass and join it; idempotent, never raises."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            closers, self._closers = self._closers, []
        self.stop.set()
        for fn in reversed(closers):
            try:
                fn()
            except Exception:  # noqa: BLE001 - closing must go on
                logger.exception("error while closing a pipeline stage")


_building = threading.local()


def building_context() -> Context | None:
    """The context of the pass a :class:`~shardfeed.pipeline.iterator.PipelineIterator` is
    building in this thread now (None elsewhere): a source opened then may follow delivery."""
    return getattr(_building, "ctx", None)


def set_building_context(ctx: Context | None) -> Context | None:
    """Make ``ctx`` this thread's :func:`building_context`; returns the one it replaces."""
    old = getattr(_building, "ctx", None)
    _building.ctx = ctx
    return old


@dataclass(frozen=True)
class Build:
    """How to build a node: the pass's context; ``raw``: the consumer accepts serialized
    records where the dataset would parse them (a batch parses them all at once);
    ``epoch``: the repetition path, from which seeded stages derive their seeds;
    ``scope``: set for the per-element datasets an interleave opens, so their stats merge;
    ``frames``: for a shuffle over a chain whose elements are a source's records one for one
    (:mod:`shardfeed.pipeline.frames`), what the source does with it: fill a ``FrameRecorder``
    (where each record it hands out lies) or yield a ``Replay``'s records instead of reading."""

    ctx: Context
    raw: bool = False
    epoch: tuple = ()
    scope: str = ""
    frames: Any = None

    def but(self, **changes: Any) -> "Build":
        return replace(self, **changes)


class Node:
    """One stage of one pass. Subclasses implement ``_next`` and ``get_state``."""

    kind = "node"

    def __init__(self, b: Build, ds: Any, upstream: list["Node"] | None = None) -> None:
        self.ctx = ctx = b.ctx
        key = (b.scope, ds.kind) if b.scope else id(ds)
        name = f"{b.scope}/{ds.kind}" if b.scope else ds.kind
        self.stats: StageStats = ctx.stats.stage(key, name)
        for up in upstream or ():
            if up.stats not in self.stats.upstream and up.stats is not self.stats:
                self.stats.upstream.append(up.stats)

    def __iter__(self) -> "Node":
        return self

    def __next__(self) -> Any:
        t = time.perf_counter()
        try:
            x = self._next()
        finally:
            self.stats.inclusive_s += time.perf_counter() - t
        self.stats.elements += 1
        return x

    def _next(self) -> Any:
        raise NotImplementedError

    def get_state(self) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        """Release what this node holds (files, threads); the context calls it too."""

"""One pass over a dataset: owns its threads, measures the consumer, saves and resumes."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import IteratorClosedError
from .deferred import materialize
from .node import Build, Context, set_building_context
from .stats import WAIT_MIN_S, PipelineStats

if TYPE_CHECKING:
    from .dataset import Dataset

STATE_VERSION = 1

_exiting = False
_exit_mark: "weakref.finalize | None" = None
_exit_mark_lock = threading.Lock()


class _Forever:
    """An object that lives as long as the interpreter: its finalizer runs only at exit."""


_FOREVER = _Forever()


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


def _mark_exit_first() -> None:
    """Keep a finalizer that marks the exit as the newest one: at interpreter exit Python
    runs the finalizers newest first, so the mark is set before any pass's own finalizer
    closes it under a thread still reading it (:func:`_park_at_exit`). (An ``atexit`` hook
    of our own would run in an order of its own against multiprocessing's, which must run
    after the passes' children are stopped.)"""
    global _exit_mark
    with _exit_mark_lock:
        if _exit_mark is not None:
            _exit_mark.detach()
        _exit_mark = weakref.finalize(_FOREVER, _mark_exiting)


def _park_at_exit() -> None:
    """A thread that finds its pass closed by the interpreter's exit waits for the end
    instead of raising: only daemon threads run then (the others were joined), and the
    interpreter ends them where they wait. An error there printed "Exception in thread"
    at every exit of a script that reads in a daemon thread, and a quiet end would run its
    code for a finished pass."""
    if _exiting and threading.current_thread() is not threading.main_thread():
        threading.Event().wait()


def _close_holder(holder: list) -> None:
    ctx = holder[0]
    if ctx is not None:
        ctx.close()


class PipelineIterator:
    """Iterator over one pass of a :class:`Dataset`.

    It owns the pass's threads: ``close()`` (idempotent), leaving a ``with`` block, the end
    of the pass, an error, Ctrl-C, garbage collection and interpreter exit all stop and
    join them. An exception raised in any worker is re-raised here with its traceback.
    ``get_state()`` is a small dict; ``set_state(state)`` (or
    ``dataset.iter_from_state(state)``) continues with exactly the elements an
    uninterrupted pass would have yielded next.
    """

    def __init__(self, ds: "Dataset", state: Mapping[str, Any] | None = None) -> None:
        self._ds = ds
        self._holder: list = [None]
        self._finalizer = weakref.finalize(self, _close_holder, self._holder)  # also at interpreter exit
        _mark_exit_first()
        self._start(state)

    def _start(self, state: Mapping[str, Any] | None) -> None:
        if state is not None:
            if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION or "root" not in state:
                raise ValueError(
                    "state must be a dict returned by PipelineIterator.get_state() "
                    f"(version {STATE_VERSION}), got {state!r:.200}")
            self._pass = int(state["pass"])
            root_state = state["root"]
            self._done = bool(state.get("done", False))
        else:
            self._pass = self._ds._next_pass()
            root_state = None
            self._done = False
        self._closer: int | None = None  # the thread that called close(), if one did
        ctx = Context()
        self._holder[0] = ctx
        self._ctx = ctx
        self._ds.__dict__["_last_stats"] = ctx.stats
        old = set_building_context(ctx)  # a source that follows delivery registers with it
        try:
            self._root = self._ds._build(Build(ctx, raw=False, epoch=(self._pass,)), root_state)
        finally:
            set_building_context(old)
        ctx.on_close(self._root.close)

    def __iter__(self) -> "PipelineIterator":
        return self

    def __next__(self) -> Any:
        if self._done or self._ctx.closed:
            if not self._done:
                _park_at_exit()
            closer = self._closer
            if not self._done and closer is not None and closer != threading.get_ident():
                raise IteratorClosedError()  # closed by another thread: say so, never end quietly
            raise StopIteration
        stats = self._ctx.stats
        t = time.perf_counter()
        if stats.started is None:
            stats.started = t
        elif stats.cpu_open:  # a CPU sample of the consumer's own work ends here
            stats.close_cpu_sample(t)
        ctx = self._ctx
        ctx.consumer_waiting = True
        try:
            x = next(self._root)
        except StopIteration:
            if self._ctx.closed:  # closed under us: an end here would hide the records not read
                _park_at_exit()
                raise IteratorClosedError() from None
            self._done = True
            try:
                for fn in self._ctx.delivery_listeners:
                    fn(None)  # every element was delivered
            finally:
                self._ctx.close()
            raise
        except BaseException as exc:
            if self._ctx.closed and not isinstance(exc, KeyboardInterrupt):
                _park_at_exit()
                raise IteratorClosedError() from exc
            # an error (or Ctrl-C) ends the pass: stop the workers before it propagates
            self._ctx.close()
            raise
        finally:
            ctx.consumer_waiting = False
            now = time.perf_counter()
            waited = now - t
            stats.consumer_wait_s += waited
            stats.last = now
            if waited >= WAIT_MIN_S:
                stats.add_wait(waited)
            if now >= stats.cpu_next:  # one sample every CPU_SAMPLE_S: thread_time costs ~1 us
                stats.open_cpu_sample(now)
        stats.consumer_elements += 1
        # what the consumer got, to a source that acts on it (a queue acknowledges items): the
        # root's state as of x (each stage keeps its parent's per element), made only if asked
        for fn in self._ctx.delivery_listeners:
            fn(self._root.get_state)
        return x

    def get_state(self) -> dict:
        """Where this pass is: a small JSON-able dict of cursors, counters and seeds."""
        return {"version": STATE_VERSION, "pass": self._pass, "done": self._done,
                "root": materialize(self._root.get_state())}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``get_state()`` of an iterator over the same dataset)."""
        self._ctx.close()
        self._start(state)

    def stats(self) -> PipelineStats:
        """Per-stage elements, bytes and busy time, consumer wait, and a verdict that names the fix."""
        return self._ctx.stats

    def close(self) -> None:
        """Stop and join this pass's threads (idempotent). A consumer waiting on ``next``
        in another thread gets :class:`IteratorClosedError`, not a quiet end."""
        if not self._ctx.closed:
            self._closer = threading.get_ident()
        self._ctx.close()

    def __enter__(self) -> "PipelineIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PipelineIterator pass={self._pass} over {self._ds!r}>"

"""Threads that pipeline stages own: a small worker pool and a bounded chunk queue.

Work crosses threads in chunks (a list of elements, or one batch), never record by
record: waking a thread on the other core costs tens of microseconds. Every thread is a
daemon that watches a stop event, so ``close()``, garbage collection and interpreter exit
can always stop and join it.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0


class Closed(Exception):
    """Raised by a queue or pool that was closed while a caller waited on it."""


class WorkerPool:
    """``n`` daemon threads running submitted callables; ``close()`` stops and joins them.

    Results and exceptions come back through :class:`concurrent.futures.Future`, so an
    exception raised in a worker is re-raised by ``future.result()`` in the consumer with
    its original traceback.
    """

    def __init__(self, n: int, name: str) -> None:
        if n < 1:
            raise ValueError(f"a worker pool needs at least one thread, got {n}")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=_work, args=(self._tasks,), name=f"shardfeed-{name}-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    @property
    def size(self) -> int:
        return len(self._threads)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise Closed("worker pool is closed")
            self._tasks.put((fut, fn, args))
        return fut

    def close(self) -> None:
        """Cancel queued work, let running tasks finish, join every thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:  # queued work is cancelled, not run
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in self._threads:
                self._tasks.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(JOIN_TIMEOUT_S)
                if t.is_alive():
                    logger.warning("thread %s did not stop within %.0f s", t.name, JOIN_TIMEOUT_S)


def _work(tasks: queue.SimpleQueue) -> None:
    while True:
        item = tasks.get()
        if item is None:
            return
        fut, fn, args = item
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - carried to the consumer
            fut.set_exception(exc)
            del exc
        else:
            fut.set_result(result)
        del fut, fn, args, item


class ChunkQueue:
    """A FIFO of chunks bounded by the number of elements it holds.

    ``put`` blocks while ``limit`` elements or more are queued; ``get`` blocks while it is
    empty. Both give up with :class:`Closed` once ``close()`` was called. Waits are in short
    slices so that Ctrl-C reaches a waiting main thread promptly.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self._items: collections.deque = collections.deque()
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: Any, n: int) -> None:
        with self._cond:
            while self._count >= self.limit and not self._closed:
                self._cond.wait(0.1)
            if self._closed:
                raise Closed("queue closed")
            self._items.append((item, n))
            self._count += n
            self._cond.notify_all()

    def get(self) -> Any:
        with self._cond:
            while not self._items:
                if self._closed:
                    raise Closed("queue closed")
                self._cond.wait(0.1)
            item, n = self._items.popleft()
            self._count -= n
            self._cond.notify_all()
            return item

    def qsize(self) -> int:
        return self._count

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._count = 0
            self._cond.notify_all()

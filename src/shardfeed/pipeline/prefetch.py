"""``prefetch``: produce elements ahead in a background thread.

The thread pulls chunks (about a millisecond of upstream work, at most a quarter of the
buffer) and queues them with the upstream state at each chunk's start; read-ahead
elements (queued, being built, or in the consumer's current chunk) never exceed
``max(buffer_size, 3)``. The consumer's state is that chunk state plus how many elements
of the chunk it took, so it describes what was delivered, never what was read ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from .batch import nbytes
from .dataset import Dataset, UnaryDataset, positive_int
from .node import AUTOTUNE, CHUNK_SECONDS, Build, Node
from .workers import JOIN_TIMEOUT_S, ChunkQueue, Closed

logger = logging.getLogger(__name__)

AUTOTUNE_MAX = 4096
AUTOTUNE_MIN = 2
AUTOTUNE_SHARE = 8  # an autotuned buffer may hold 1/8 of the pass's memory budget
_END = "end"
_ERROR = "error"
_DATA = "data"


class PrefetchDataset(UnaryDataset):
    kind = "prefetch"

    def __init__(self, parent: Dataset, buffer_size: int = AUTOTUNE) -> None:
        super().__init__(parent)
        self.buffer_size = positive_int("prefetch buffer_size", buffer_size, allow_autotune=True)

    def cardinality(self) -> int | float | None:
        return self.parent.cardinality()

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return PrefetchNode(b, self, state)


class PrefetchNode(Node):
    """Also used by interleave to read each open dataset ahead."""

    def __init__(self, b: Build, ds: Dataset, state: Mapping[str, Any] | None, buffer_size: int = AUTOTUNE,
                 parent: Node | None = None) -> None:
        self.init_state = state["parent"] if state else None
        self.init_skip = int(state["skip"]) if state else 0
        self.parent = parent if parent is not None else ds.parent._build(b, self.init_state)
        super().__init__(b, ds, [self.parent])
        size = getattr(ds, "buffer_size", buffer_size)
        self.autotune = size == AUTOTUNE
        self.size = AUTOTUNE_MIN if self.autotune else size
        self.queue = ChunkQueue(1)
        self.max_chunk = set_buffer(self.queue, self.size)
        self.thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # a close from another thread sees no thread or a started one
        self._closing = False
        self.cur: list = []
        self.pos = 0
        self.cur_state: Any = self.init_state
        self.cur_skip = self.init_skip
        self.done = False
        self.stats.threaded = True
        self.stats.includes_upstream = True
        b.ctx.on_close(self.close)

    def _start(self) -> None:
        with self._start_lock:
            if self.ctx.closed or self._closing:
                raise RuntimeError("the iterator was closed")
            t = threading.Thread(target=_produce, args=(self,), name="shardfeed-prefetch", daemon=True)
            t.start()
            self.thread = t

    def _next(self) -> Any:
        while self.pos >= len(self.cur):
            if self.done:
                raise StopIteration
            if self.thread is None:
                self._start()
            self.stats.sample_queue(min(1.0, self.queue.qsize() / self.queue.limit))  # a chunk may overshoot
            try:
                kind, st, payload = self.queue.get()
            except Closed:
                raise RuntimeError("the iterator was closed") from None
            if kind == _DATA:
                self.cur, self.cur_state, self.cur_skip, self.pos = payload, st, 0, 0
            elif kind == _END:
                self.done = True
            else:
                self.done = True
                raise payload  # the producer's exception, with its original traceback
        x = self.cur[self.pos]
        self.pos += 1
        return x

    def get_state(self) -> dict:
        return {"parent": self.cur_state, "skip": self.cur_skip + self.pos}

    def close(self) -> None:
        self.queue.close()
        with self._start_lock:  # a thread being started (by the consumer, now) is joined too
            self._closing = True
            t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(JOIN_TIMEOUT_S)
            if t.is_alive():
                logger.warning("prefetch thread did not stop within %.0f s (upstream blocked?)", JOIN_TIMEOUT_S)
        self.parent.close()
        self.cur = []


def set_buffer(q: ChunkQueue, size: int) -> int:
    """Size the queue and the chunks so that the elements out of upstream's hands and not
    yet delivered (the consumer's chunk, the queue, the chunk being built) stay within
    ``max(size, 3)``. Returns the chunk size."""
    chunk = max(1, size // 4)
    q.limit = max(1, size - 3 * chunk + 1)
    return chunk


def element_bytes(x: Any) -> int:
    """Approximate bytes held by one element (serialized record or numpy structure)."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return len(x)
    return nbytes(x)


def _produce(node: PrefetchNode) -> None:
    """The producer thread: fill the queue until the upstream ends, fails or the pass closes."""
    parent, q, stop, stats = node.parent, node.queue, node.ctx.stop, node.stats
    max_chunk = node.max_chunk
    try:
        for _ in range(node.init_skip):  # resuming: these were delivered before
            next(parent)
        while not stop.is_set():
            st = parent.get_state()
            chunk = []
            t0 = time.perf_counter()
            try:
                while len(chunk) < max_chunk:
                    chunk.append(next(parent))
                    if time.perf_counter() - t0 >= CHUNK_SECONDS:
                        break
            except StopIteration:
                stats.work_s += time.perf_counter() - t0
                if chunk:
                    q.put((_DATA, st, chunk), len(chunk))
                q.put((_END, None, None), 0)
                return
            stats.work_s += time.perf_counter() - t0
            if node.autotune:
                # size the buffer once, to hold at most its share of the memory budget
                node.autotune = False
                per = max(1, sum(element_bytes(x) for x in chunk) // len(chunk))
                q.limit = max(AUTOTUNE_MIN, min(AUTOTUNE_MAX, node.ctx.memory_budget // AUTOTUNE_SHARE // per))
                max_chunk = node.max_chunk
            q.put((_DATA, st, chunk), len(chunk))
    except Closed:
        return
    except BaseException as exc:  # noqa: BLE001 - carried to the consumer
        try:
            q.put((_ERROR, None, exc), 0)
        except Closed:
            pass

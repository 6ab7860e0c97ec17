"""In-process work-queue backend: threads of one process share queues under a lock.

Every ``MemoryBackend`` with the same URL (``"memory"``, ``"memory://space"``) sees the
same queues. This backend is also the reference the others are tested against.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from typing import Any

from ..errors import WorkQueueLostError
from .backend import QueueBackend, empty_counters, gone

_spaces: dict[str, dict[str, "_Queue"]] = {}
_spaces_lock = threading.Lock()


class _Queue:
    def __init__(self, meta: dict) -> None:
        self.meta = copy.deepcopy(meta)
        self.pending: deque[str] = deque()
        self.inflight: dict[str, dict[str, Any]] = {}
        self.next_epoch = 0
        self.counters = empty_counters()
        self.epoch_done: dict[int, int] = {}
        self.workers: dict[str, dict[str, float]] = {}
        self.token = 0
        self.returned: set[str] = set()  # ids handed out, then given back (expired or released)

    def worker(self, w: str, now: float) -> dict[str, float]:
        st = self.workers.get(w)
        if st is None:
            st = self.workers[w] = {"taken": 0, "acked": 0, "first": now, "last": now}
        return st


class MemoryBackend(QueueBackend):
    """Queues in this process's memory, shared by every thread."""

    def __init__(self, url: str = "memory") -> None:
        self.url = url
        space = url.split("://", 1)[1] if "://" in url else ""
        with _spaces_lock:
            self._queues = _spaces.setdefault(space, {})
        self._lock = _spaces_lock  # one lock for all spaces: operations are tiny

    def _q(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            raise WorkQueueLostError(gone(name, self.url))
        return q

    def open(self, name: str, meta: dict) -> tuple[dict, bool]:
        with self._lock:
            q = self._queues.get(name)
            if q is not None:
                return copy.deepcopy(q.meta), False
            self._queues[name] = _Queue(meta)
            return copy.deepcopy(meta), True

    def get_meta(self, name: str) -> dict | None:
        with self._lock:
            q = self._queues.get(name)
            return None if q is None else copy.deepcopy(q.meta)

    def take(self, name: str, worker: str, lease_s: float) -> dict:
        with self._lock:
            q = self._q(name)
            now = time.time()
            expired = sorted((i for i, lease in q.inflight.items() if lease["deadline"] <= now), reverse=True)
            for item_id in expired:
                del q.inflight[item_id]
                q.pending.appendleft(item_id)
                q.returned.add(item_id)
                q.counters["expired"] += 1
            if q.pending:
                item_id = q.pending.popleft()
                if item_id in q.returned:
                    q.returned.discard(item_id)
                    q.counters["redelivered"] += 1
                q.token += 1
                deadline = now + lease_s
                q.inflight[item_id] = {"worker": worker, "token": q.token, "deadline": deadline}
                q.counters["taken"] += 1
                st = q.worker(worker, now)
                st["taken"] += 1
                return {"status": "item", "id": item_id, "token": q.token, "deadline": deadline}
            num_epochs = q.meta.get("num_epochs")
            if num_epochs is None or q.next_epoch < num_epochs:
                return {"status": "need_epoch", "epoch": q.next_epoch}
            if q.inflight:
                soonest = min(lease["deadline"] for lease in q.inflight.values())
                return {"status": "wait", "retry_s": max(0.0, soonest - now)}
            return {"status": "drained"}

    def fill_epoch(self, name: str, epoch: int, order: list[int]) -> bool:
        with self._lock:
            q = self._q(name)
            if q.next_epoch != epoch:
                return False
            q.pending.extend(f"{epoch}:{i}" for i in order)
            q.next_epoch = epoch + 1
            return True

    def ack(self, name: str, item_id: str, token: int, worker: str) -> bool:
        with self._lock:
            q = self._q(name)
            lease = q.inflight.get(item_id)
            if lease is None or lease["token"] != token:
                q.counters["late_acks"] += 1
                return False
            del q.inflight[item_id]
            q.counters["acked"] += 1
            e = int(item_id.split(":", 1)[0])
            q.epoch_done[e] = q.epoch_done.get(e, 0) + 1
            now = time.time()
            st = q.worker(worker, now)
            st["acked"] += 1
            st["last"] = now
            return True

    def renew(self, name: str, item_id: str, token: int, lease_s: float) -> bool:
        with self._lock:
            lease = self._q(name).inflight.get(item_id)
            if lease is None or lease["token"] != token:
                return False
            lease["deadline"] = time.time() + lease_s
            return True

    def release(self, name: str, item_id: str, token: int) -> bool:
        with self._lock:
            q = self._q(name)
            lease = q.inflight.get(item_id)
            if lease is None or lease["token"] != token:
                return False
            del q.inflight[item_id]
            q.pending.appendleft(item_id)
            q.returned.add(item_id)
            q.counters["released"] += 1
            return True

    def snapshot(self, name: str) -> dict | None:
        with self._lock:
            q = self._queues.get(name)
            if q is None:
                return None
            return {"next_epoch": q.next_epoch, "num_epochs": q.meta.get("num_epochs"), "pending": list(q.pending),
                    "inflight": copy.deepcopy(q.inflight),
                    "counters": dict(q.counters), "epoch_done": {str(k): v for k, v in q.epoch_done.items()},
                    "workers": copy.deepcopy(q.workers), "now": time.time()}

    def restore(self, name: str, meta: dict, state: dict, restore_id: str) -> bool:
        with self._lock:
            old = self._queues.get(name)
            if old is not None and old.meta.get("restore_id") == restore_id:
                return False
            q = _Queue(dict(meta, restore_id=restore_id))
            q.pending.extend(state["pending"])
            q.next_epoch = int(state["next_epoch"])
            q.counters.update({k: int(v) for k, v in state.get("counters", {}).items() if k in q.counters})
            q.epoch_done = {int(k): int(v) for k, v in state.get("epoch_done", {}).items()}
            q.token = old.token if old is not None else 0
            self._queues[name] = q
            return True

    def drain(self, name: str) -> int:
        with self._lock:
            q = self._q(name)
            n = len(q.pending)
            q.pending.clear()
            q.meta["num_epochs"] = q.next_epoch
            return n

    def reset(self, name: str) -> bool:
        with self._lock:
            return self._queues.pop(name, None) is not None

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

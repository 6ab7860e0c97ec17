"""The interface every work-queue backend implements, and backends chosen by URL.

A backend stores queues by name. Every method is one atomic step (a lock, a SQLite
transaction, a Redis Lua script), so any number of threads, processes or hosts may call
them at once. Items are addressed by id ``"epoch:index"``; what an item *is* (a file, a
record range) lives in the queue's ``meta`` (JSON), written once by whoever created it.

Queue state, the same in every backend:

- ``pending``: ids not yet taken, in order; expired leases go back to the front.
- ``inflight``: id -> ``{"worker", "token", "deadline"}``; acknowledged ids leave it and
  are never handed out again in that epoch.
- ``next_epoch``: the next epoch whose order is pushed when ``pending`` runs dry.
- counters (``taken``, ``acked``, ``expired``, ``late_acks``, ``released``,
  ``redelivered``: takes of an id handed out before in its epoch, after its lease expired
  or it was released), per-epoch ``done`` counts and per-worker ``{"taken", "acked",
  "first", "last"}``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..storage.urls import mask

COUNTERS = ("taken", "acked", "expired", "late_acks", "released", "redelivered")
ENV_BACKEND = "SHARDFEED_WORKQUEUE_BACKEND"


class QueueBackend(ABC):
    """Atomic operations on named queues. ``url`` is for display (password masked)."""

    url: str = ""

    @abstractmethod
    def open(self, name: str, meta: dict) -> tuple[dict, bool]:
        """Create queue ``name`` with ``meta`` unless it exists; return ``(stored meta, created)``."""

    @abstractmethod
    def get_meta(self, name: str) -> dict | None:
        """The queue's meta, or ``None`` when there is no such queue."""

    @abstractmethod
    def take(self, name: str, worker: str, lease_s: float) -> dict:
        """Reclaim expired leases, then lease the next pending id to ``worker``.

        Returns ``{"status": "item", "id", "token", "deadline"}``, ``{"status":
        "need_epoch", "epoch"}`` (push that epoch's order with :meth:`fill_epoch`, then
        take again), ``{"status": "wait", "retry_s"}`` (nothing pending, leases still out)
        or ``{"status": "drained"}``.
        """

    @abstractmethod
    def fill_epoch(self, name: str, epoch: int, order: list[int]) -> bool:
        """Append ids ``epoch:i`` for ``i`` in ``order`` if ``epoch`` is ``next_epoch``;
        false when another worker already did."""

    @abstractmethod
    def ack(self, name: str, item_id: str, token: int, worker: str) -> bool:
        """Mark a leased id done. False (and ``late_acks`` counted) when the lease is no
        longer ``token``'s: it expired and went back to the queue, or is done already."""

    def ack_and_take(self, name: str, item_id: str, token: int, worker: str, lease_s: float) -> tuple[bool, dict]:
        """:meth:`ack` then :meth:`take`, as ``(acked, take_result)``; backends where each
        call is a round trip override it with a single one."""
        return self.ack(name, item_id, token, worker), self.take(name, worker, lease_s)

    @abstractmethod
    def renew(self, name: str, item_id: str, token: int, lease_s: float) -> bool:
        """Push the lease's deadline to now + ``lease_s``; false when it is no longer held."""

    def renew_unless(self, name: str, item_id: str, token: int, lease_s: float, stop: Callable[[], bool]) -> bool:
        """:meth:`renew`, given up (``ShardfeedError``) instead of waited out once ``stop()``
        is true, in a backend that waits for a lost server to come back (a pass's lease
        renewer whose pass has ended, found waiting out Redis's ``reconnect_s`` into later work)."""
        return self.renew(name, item_id, token, lease_s)

    @abstractmethod
    def release(self, name: str, item_id: str, token: int) -> bool:
        """Give a leased id back to the front of the queue, not done."""

    @abstractmethod
    def snapshot(self, name: str) -> dict | None:
        """``{"next_epoch", "pending", "inflight", "counters", "epoch_done", "workers",
        "now"}`` of the queue, or ``None`` when there is no such queue."""

    @abstractmethod
    def restore(self, name: str, meta: dict, state: dict, restore_id: str) -> bool:
        """Replace the queue (creating it if absent) with ``meta`` and ``state``
        (``next_epoch``, ``pending``, ``counters``, ``epoch_done``), unless a restore
        with the same ``restore_id`` already happened: then false, nothing changes."""

    @abstractmethod
    def drain(self, name: str) -> int:
        """Drop every pending id and every epoch not started; return how many ids were
        dropped. Leases out stay (their workers finish them)."""

    @abstractmethod
    def reset(self, name: str) -> bool:
        """Delete the queue; true when there was one."""

    @abstractmethod
    def names(self) -> list[str]:
        """Names of the queues this backend holds."""

    def close(self) -> None:  # noqa: B027 - an optional hook: backends without connections keep it
        """Release connections (idempotent)."""


def default_backend_url() -> str:
    """``$SHARDFEED_WORKQUEUE_BACKEND``, else a SQLite file under ``~/.cache/shardfeed``."""
    env = os.environ.get(ENV_BACKEND)
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return "sqlite://" + os.path.join(base, "shardfeed", "workqueue.sqlite3")


def sqlite_file_of(url: str) -> str | None:
    """The file a SQLite backend URL names (its options left out), or None for another backend."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite" or (not scheme and url.endswith((".db", ".sqlite", ".sqlite3"))):
        path = url.split("://", 1)[1] if scheme else url
        return os.path.abspath(os.path.expanduser(path.split("?", 1)[0]))
    return None


def open_queue_backend(backend: "str | QueueBackend | None", *, read_only: bool = False) -> QueueBackend:
    """A backend from a URL: ``"memory"`` (threads of this process), ``"sqlite:///path"``
    or a path ending in ``.db``/``.sqlite``/``.sqlite3`` (processes on one host or a
    shared filesystem), ``"redis://[:password@]host:port/db"`` (``rediss://`` for TLS;
    many hosts). ``None``: :func:`default_backend_url`. ``read_only``: only to look (a
    SQLite file is opened read-only; the other backends are read as they are)."""
    if isinstance(backend, QueueBackend):
        return backend
    if backend is None:
        backend = default_backend_url()
    if not isinstance(backend, (str, os.PathLike)):
        raise TypeError(f"backend must be a URL string or a QueueBackend, got {type(backend).__name__}")
    from .. import registry  # noqa: PLC0415 - backends are imported by name, when used

    url = os.fspath(backend)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if url in ("memory", "memory://") or scheme == "memory":
        name, arg = "memory", url
    elif scheme == "sqlite" or (not scheme and url.endswith((".db", ".sqlite", ".sqlite3"))):
        name, arg = "sqlite", url.split("://", 1)[1] if scheme else url
    elif scheme in ("redis", "rediss", "unix"):
        name, arg = "redis", url
    elif scheme and scheme in registry.names("queue"):
        name, arg = scheme, url  # a registered third-party backend, given its URL
    else:
        raise ValueError(f"unknown work-queue backend {mask(url)!r}: use 'memory', 'sqlite:///path/queue.db' "
                         f"or 'redis://host:port/db' (registered: {', '.join(registry.names('queue'))})")
    if name == "sqlite" and read_only:
        return registry.load("queue", name)(arg, read_only=True)
    return registry.load("queue", name)(arg)


open_backend = open_queue_backend  # the earlier name


def split_id(item_id: str) -> tuple[int, int]:
    e, i = item_id.split(":", 1)
    return int(e), int(i)


def empty_counters() -> dict[str, int]:
    return {k: 0 for k in COUNTERS}


def validate_state(state: Any) -> dict:
    if not isinstance(state, dict) or not isinstance(state.get("pending"), list):
        raise ValueError(f"not a work-queue state: {state!r:.200}")
    return state


def gone(name: str, url: str) -> str:
    """What a worker is told when the queue it joined is no longer on its backend."""
    return (f"work queue {name!r} on {url} is gone since this worker joined it (reset, drained and removed, its "
            "file replaced, or a Redis restart without persistence); nothing more is handed out, to keep the "
            "epoch from running again: restore it with WorkQueue.set_state(checkpoint), or start afresh with "
            "`shardfeed queue reset`")

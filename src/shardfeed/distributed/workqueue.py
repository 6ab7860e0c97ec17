"""``WorkQueue``: elastic sharing of work items among workers, to cut the long tail.

Each worker takes the next item when it is done with the last, so fast workers do more and
slow ones less. A taken item is leased: the worker acknowledges it (``ack``) when done,
and if the lease runs out first (the worker died or hung) the item goes back to the front
of the queue for another worker. Every item of every epoch is acknowledged exactly once;
a late acknowledgement is refused and counted.

The first process that opens a queue name on a backend fills it; every other process with
the same arguments joins it. Different arguments under the same name are refused.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from ..errors import ShardfeedError
from ..pipeline.tensorboard import write_scalars
from ..storage.urls import mask
from .backend import QueueBackend, open_queue_backend, split_id
from .items import RowCounter, WorkItem, apply_prefix, digest, make_items, row_counter_of

logger = logging.getLogger(__name__)

STATE_VERSION = 1
_M64 = (1 << 64) - 1


class WorkQueueMismatchError(ShardfeedError, ValueError):
    """A queue or checkpoint was made with other works or arguments than this queue's."""


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of items ``0..n-1`` in ``epoch``: a Fisher-Yates shuffle driven by
    splitmix64 of ``(seed, epoch)``, the same on every platform and version."""
    order = list(range(n))
    if not shuffle:
        return order
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 1) & _M64
    for i in range(n - 1, 0, -1):
        x = (x + 0x9E3779B97F4A7C15) & _M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        z ^= z >> 31
        j = z % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def _diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    parts = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if k == "works":
            parts.append(f"works ({len(va or [])} vs {len(vb or [])} URLs, digest {digest(va)} vs {digest(vb)})")
        else:
            parts.append(f"{k} ({va!r} vs {vb!r})")
    return ", ".join(parts) or "item list (index files or row counts changed)"


class WorkProducer:
    """What :meth:`WorkQueue.input_producer` returns: the work URLs this worker takes, in
    order, each acknowledged when the next is asked for; ``queue`` is the queue itself (a
    reader that knows queues, such as ``TableRecordReader``, takes its items directly)."""

    def __init__(self, queue: "WorkQueue") -> None:
        self.queue = queue
        self._it: Any = None

    def __iter__(self) -> "WorkProducer":
        return self

    def __next__(self) -> str:
        if self._it is None:
            self._it = iter(self.queue)
        return str(next(self._it))


class WorkQueue:
    """A queue of work items (files, tables, or record/row ranges of them) shared by workers.

    ``works``: file or table URLs (``prefix`` is put in front of each). ``num_epochs``
    (``None``: forever) passes over the items, each in a fresh order when ``shuffle``
    (seeded by ``seed``; ``None``: the creator picks one and joiners use it).
    ``num_slices``: split the works into record ranges (through ``<file>.idx`` index
    files) or row ranges (``row_counts``: dict or function url -> rows) so that about that
    many items exist. ``num_clients`` is kept for PAI compatibility (a sizing hint shown in
    the metrics; the queue serves any number of workers). ``backend``: ``"memory"``,
    ``"sqlite:///path.db"``, ``"redis://host:port/db"`` or a backend object (``None``: the
    SQLite default, see :func:`~shardfeed.distributed.backend.default_backend_url`).
    ``lease_timeout``: seconds a taken item stays leased without progress (the readers of
    :mod:`~shardfeed.distributed.queue_spans` renew it while they hold it).

    Raises :class:`WorkQueueMismatchError` when ``name`` exists on the backend with other
    arguments, ``ValueError``/``TypeError`` for bad arguments.
    """

    def __init__(
        self,
        works: Iterable[str],
        num_epochs: int | None = 1,
        shuffle: bool = True,
        seed: int | None = None,
        prefix: str | None = None,
        num_slices: int | None = None,
        num_clients: int = 1,
        name: str = "work_queue",
        backend: str | QueueBackend | None = None,
        lease_timeout: float = 300.0,
        *,
        row_counts: Mapping[str, int] | RowCounter | None = None,
        storage_options: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
        poll_interval: float = 0.5,
    ) -> None:
        for argname, v, none_ok in (("num_epochs", num_epochs, True), ("num_slices", num_slices, True),
                                    ("num_clients", num_clients, False)):
            if (v is None and not none_ok) or (v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                                                  or v < 1)):
                raise ValueError(f"{argname} must be a positive int{' or None' if none_ok else ''}, got {v!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        if not isinstance(name, str) or not name or any(c in name for c in "{}\n"):
            raise ValueError(f"name must be a non-empty string without braces or newlines, got {name!r}")
        if not lease_timeout > 0:
            raise ValueError(f"lease_timeout must be > 0 seconds, got {lease_timeout!r}")
        self.name = name
        self.works = apply_prefix(works, prefix)
        self.num_epochs = num_epochs
        self.shuffle = bool(shuffle)
        self.num_slices = num_slices
        self.num_clients = num_clients
        self.lease_timeout = float(lease_timeout)
        self.poll_interval = float(poll_interval)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._row_counter = row_counter_of(row_counts)
        self._storage_options = storage_options
        self.config = {"works": self.works, "num_epochs": num_epochs, "shuffle": self.shuffle, "seed": seed,
                       "num_slices": num_slices}
        self.digest = digest(self.config)
        self.backend = open_queue_backend(backend)
        self._held: dict[str, WorkItem] = {}
        self._closed = False
        meta = self.backend.get_meta(name)
        if meta is None:
            meta, created = self.backend.open(name, self._new_meta())
            if created:
                logger.info("work queue %r created on %s: %d items, %s epochs", name, self.backend.url,
                            len(meta["items"]), num_epochs)
        self._use_meta(meta)

    # -- construction ----------------------------------------------------------------------
    def _new_meta(self) -> dict:
        items = make_items(self.works, self.num_slices, self._row_counter, self._storage_options)
        seed = self.config["seed"]
        if seed is None:
            seed = secrets.randbits(63)
        item_json = [it.to_json() for it in items]
        return {"version": STATE_VERSION, "digest": self.digest, "config": self.config, "seed": seed,
                "num_epochs": self.num_epochs, "num_clients": self.num_clients, "items": item_json,
                "items_digest": digest(item_json), "created": time.time()}

    def _use_meta(self, meta: dict) -> None:
        if meta.get("digest") != self.digest:
            raise WorkQueueMismatchError(
                f"work queue {self.name!r} on {self.backend.url} was created with other arguments: "
                f"{_diff(meta.get('config', {}), self.config)} (stored vs given); use another name, or clear it "
                f"with `shardfeed queue reset --backend {self.backend.url} --name {self.name}`")
        self._meta = meta
        self.seed = int(meta["seed"])
        self.items = [WorkItem.from_json(d) for d in meta["items"]]

    def __len__(self) -> int:
        """Items per epoch."""
        return len(self.items)

    def __repr__(self) -> str:
        return f"WorkQueue({self.name!r}, {len(self.items)} items, {self.num_epochs} epochs, on {self.backend.url})"

    # -- taking and acknowledging ------------------------------------------------------------
    def take(self, block: bool = True, timeout: float | None = None) -> WorkItem | None:
        """Lease the next item to this worker; ``None`` when the queue is drained (all
        epochs handed out and acknowledged).

        While nothing is pending but leases are out (one may expire and come back), waits
        when ``block`` (up to ``timeout`` seconds, then ``TimeoutError``), else returns
        ``None`` at once. ``str(item)`` is the work's URL.
        """
        return self._take(block, timeout, None)

    def ack_and_take(self, item: WorkItem, block: bool = True, timeout: float | None = None) -> WorkItem | None:
        """:meth:`ack` ``item`` and :meth:`take` the next one, in one round trip to the
        backend where it can (Redis). Returns what :meth:`take` returns."""
        return self._take(block, timeout, item)

    def _take(self, block: bool, timeout: float | None, done: WorkItem | None) -> WorkItem | None:
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = 0.005  # the last leases are usually acknowledged soon: look again quickly at first
        while True:
            if done is not None:
                self._held.pop(done.id, None)
                ok, r = self.backend.ack_and_take(self.name, done.id, done.token, self.worker_id, self.lease_timeout)
                self._log_late(done, ok)
                done = None
            else:
                r = self.backend.take(self.name, self.worker_id, self.lease_timeout)
            status = r["status"]
            if status == "item":
                epoch, index = split_id(r["id"])
                base = self.items[index]
                item = WorkItem(base.work, base.kind, base.start, base.stop, base.offset, base.end, r["id"], epoch,
                                index, int(r["token"]))
                self._held[item.id] = item
                return item
            if status == "need_epoch":
                e = int(r["epoch"])
                self.backend.fill_epoch(self.name, e, epoch_order(len(self.items), self.seed, e, self.shuffle))
                continue
            if status == "drained" or not block:
                return None
            wait = min(max(float(r.get("retry_s", 0.0)), 0.001), backoff, self.poll_interval)
            backoff *= 1.5
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"work queue {self.name!r}: nothing to take for {timeout} s "
                                       "(items are leased to other workers)")
                wait = min(wait, left)
            time.sleep(wait)

    def ack(self, item: WorkItem) -> bool:
        """Mark ``item`` done. False when its lease had expired (another worker has it or
        did it): the acknowledgement is refused and counted as ``late_acks``."""
        self._held.pop(item.id, None)
        ok = self.backend.ack(self.name, item.id, item.token, self.worker_id)
        self._log_late(item, ok)
        return ok

    def _log_late(self, item: WorkItem, ok: bool) -> None:
        if not ok:
            logger.warning("work queue %r: late acknowledgement of item %s (%s) refused; its lease had expired",
                           self.name, item.id, mask(item.work))

    def renew(self, item: WorkItem, stop: Callable[[], bool] | None = None) -> bool:
        """Extend ``item``'s lease by ``lease_timeout``; false when it is no longer held.
        ``stop``: a backend waiting for a lost server gives up once it is true."""
        if stop is not None:
            return self.backend.renew_unless(self.name, item.id, item.token, self.lease_timeout, stop)
        return self.backend.renew(self.name, item.id, item.token, self.lease_timeout)

    def release(self, item: WorkItem) -> bool:
        """Give ``item`` back undone, to the front of the queue."""
        self._held.pop(item.id, None)
        return self.backend.release(self.name, item.id, item.token)

    def __iter__(self):
        """Items until drained, each acknowledged when the next is asked for (one round
        trip for both)."""
        item = self.take()
        while item is not None:
            try:
                yield item
            except GeneratorExit:
                self.release(item)
                raise
            item = self.ack_and_take(item)

    # -- pipeline ------------------------------------------------------------------------------
    def dataset(self, auto_ack: bool = True) -> Any:
        """A pipeline :class:`~shardfeed.Dataset` of the items this worker takes, until the
        queue is drained. With ``auto_ack`` an item is acknowledged when the next one is
        asked for (and the last at the end); otherwise call :meth:`ack` yourself."""
        from .reading import QueueItemsDataset  # noqa: PLC0415

        return QueueItemsDataset(self, auto_ack)

    input_dataset = dataset

    def span_provider(self, storage_options: Mapping[str, Any] | None = None) -> Any:
        """The pipeline's span provider over this queue: ``sf.read_tfrecord(queue, spec)``
        reads the items this worker takes, each acknowledged after its last record."""
        from .reading import QueueSpans  # noqa: PLC0415

        return QueueSpans(self, storage_options)

    def input_producer(self) -> "WorkProducer":
        """PAI's name: an iterator of the work URLs this worker takes (acknowledged as the
        next is asked for); a ``TableRecordReader`` given it reads the queue's items (row
        ranges included) itself."""
        return WorkProducer(self)

    # -- checkpoint ------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """The queue's state, to save with the model checkpoint: items not yet acknowledged
        (leased ones first: they will be read again after a restore), the next epoch,
        counters, and digests of the arguments and of the item list. JSON-able."""
        snap = self.backend.snapshot(self.name)
        if snap is None:
            raise KeyError(f"no work queue named {self.name!r} on {self.backend.url} (was it reset?)")
        inflight = sorted(snap["inflight"], key=split_id)
        return {"version": STATE_VERSION, "name": self.name, "digest": self.digest, "config": self.config,
                "items_digest": self._meta["items_digest"], "seed": self.seed, "next_epoch": snap["next_epoch"],
                "pending": inflight + list(snap["pending"]), "counters": snap["counters"],
                "epoch_done": snap["epoch_done"]}

    def set_state(self, state: Mapping[str, Any], on_mismatch: str = "raise", run_id: str = "") -> bool:
        """Restore the queue from :meth:`get_state` after a restart; every worker may call
        it with the same state, only the first call changes the queue (give another
        ``run_id`` to restore the same state again in a later run).

        A state from other works or arguments raises :class:`WorkQueueMismatchError`, or
        with ``on_mismatch="restart"`` the queue starts afresh from epoch 0. Returns true
        when this call changed the queue.
        """
        if on_mismatch not in ("raise", "restart"):
            raise ValueError(f"on_mismatch must be 'raise' or 'restart', got {on_mismatch!r}")
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION or "pending" not in state:
            raise ValueError(f"not a WorkQueue state (version {STATE_VERSION}): {str(state)[:200]}")
        meta = dict(self._meta)
        meta.pop("restore_id", None)
        mismatch = state.get("digest") != self.digest or state.get("items_digest") != meta["items_digest"]
        if mismatch and on_mismatch == "raise":
            raise WorkQueueMismatchError(
                f"checkpointed work queue state does not match queue {self.name!r}: "
                f"{_diff(state.get('config', {}), self.config)} (checkpoint vs now); restore with the same works "
                "and arguments, or pass on_mismatch='restart' to start afresh")
        if mismatch:
            logger.warning("work queue %r: checkpoint made with other works or arguments; starting afresh", self.name)
            state = {"next_epoch": 0, "pending": [], "counters": {}, "epoch_done": {}}
        else:
            meta["seed"] = int(state["seed"])
        rid = digest({"state": dict(state), "run": run_id, "fresh": mismatch})
        changed = self.backend.restore(self.name, meta, dict(state), rid)
        self._use_meta(dict(meta, restore_id=rid))
        self._held.clear()
        return changed

    # -- metrics ---------------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Items remaining (pending, plus epochs not started), in flight, done; the current
        epoch; ``fraction_full`` (pending / items per epoch, the queue's water level); lease
        expiries, refused late acknowledgements, items given back (``released``) and
        ``redelivered`` (takes of an item handed out before in its epoch: the only items
        whose records may be delivered twice); per worker: taken, acknowledged, in flight
        and ``items_per_s`` (acknowledged per second between its first take and its last
        acknowledgement)."""
        snap = self.backend.snapshot(self.name)
        if snap is None:
            raise KeyError(f"no work queue named {self.name!r} on {self.backend.url}")
        return summarize(self._meta, snap, self.name)

    def drained_but(self, ids: Collection[str]) -> bool:
        """True when nothing is pending or still to come and every leased item is one of
        ``ids``: drained but for them (their holder need not wait for the queue to drain)."""
        snap = self.backend.snapshot(self.name)
        if snap is None:
            raise KeyError(f"no work queue named {self.name!r} on {self.backend.url}")
        m = summarize(self._meta, snap, self.name)
        return m["remaining"] == 0 and set(snap["inflight"]) <= set(ids)

    def may_end(self, ids: Collection[str]) -> bool:
        """True when nothing is pending or still to come and every leased item other than
        ``ids`` is held by a worker whose id sorts at or after this one's. Two workers at the
        end of the work, each holding items whose records wait in its buffers, would wait
        on each other: the one whose id sorts first ends its pass (its items acknowledged
        once delivered), the others go on waiting, and take over its items if it dies."""
        snap = self.backend.snapshot(self.name)
        if snap is None:
            raise KeyError(f"no work queue named {self.name!r} on {self.backend.url}")
        if summarize(self._meta, snap, self.name)["remaining"]:
            return False
        mine = set(ids)
        return all(lease.get("worker", "") >= self.worker_id for i, lease in snap["inflight"].items() if i not in mine)

    def metrics_json(self) -> str:
        return json.dumps(self.metrics(), sort_keys=True)

    def add_summary(self, step: int | None = None, writer: Any = None) -> dict:
        """Write the metrics as TensorBoard scalars under ``<name>/`` (``tf.summary``, with
        ``writer`` or the default writer); return them. Without TensorFlow installed it
        logs a warning and only returns them."""
        m = self.metrics()
        step = m["done"] if step is None else step
        scalars = {k: m[k] for k in ("remaining", "in_flight", "done", "fraction_full", "expired", "late_acks",
                                     "redelivered")}
        for w, st in m["workers"].items():
            if st["items_per_s"] is not None:
                scalars[f"items_per_s/{w}"] = st["items_per_s"]
        write_scalars({f"{self.name}/{k}": v for k, v in scalars.items()}, step, writer=writer,
                      what="add_summary's scalars (use metrics() or metrics_json())", missing_level=logging.WARNING)
        return m

    # -- lifecycle -------------------------------------------------------------------------------
    def reset(self) -> bool:
        """Delete the queue from the backend (all workers' progress); true if it existed."""
        self._held.clear()
        return self.backend.reset(self.name)

    def drain(self) -> int:
        """Drop every pending item and every epoch not started; leased items stay."""
        return self.backend.drain(self.name)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"work queue {self.name!r} is closed")

    def close(self) -> None:
        """Give back the items this worker holds (to the front of the queue) and close the
        backend connection; idempotent."""
        if self._closed:
            return
        self._closed = True
        for item in list(self._held.values()):
            try:
                self.backend.release(self.name, item.id, item.token)
            except Exception:  # noqa: BLE001 - closing goes on; the lease will expire anyway
                logger.warning("work queue %r: could not release item %s", self.name, item.id, exc_info=True)
        self._held.clear()
        self.backend.close()

    def __enter__(self) -> "WorkQueue":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def summarize(meta: Mapping[str, Any], snap: Mapping[str, Any], name: str = "") -> dict:
    """Metrics from a backend snapshot (see :meth:`WorkQueue.metrics`)."""
    n = len(meta["items"])
    num_epochs = snap.get("num_epochs", meta.get("num_epochs"))
    c = snap["counters"]
    pending, inflight = snap["pending"], snap["inflight"]
    live = [split_id(i)[0] for i in list(pending) + list(inflight)]
    epoch = min(live) if live else max(0, snap["next_epoch"] - 1)
    not_started = None if num_epochs is None else max(0, num_epochs - snap["next_epoch"]) * n
    per_worker_inflight: dict[str, int] = {}
    for lease in inflight.values():
        per_worker_inflight[lease["worker"]] = per_worker_inflight.get(lease["worker"], 0) + 1
    workers = {}
    for w, st in snap["workers"].items():
        span = float(st["last"]) - float(st["first"])
        workers[w] = {"taken": int(st["taken"]), "acked": int(st["acked"]), "in_flight": per_worker_inflight.get(w, 0),
                      "items_per_s": (int(st["acked"]) / span) if span > 0 and st["acked"] else None}
    return {
        "name": name, "items_per_epoch": n, "num_epochs": num_epochs, "epoch": epoch,
        "pending": len(pending), "remaining": None if not_started is None else len(pending) + not_started,
        "in_flight": len(inflight), "done": int(c["acked"]),
        "done_in_epoch": int(snap["epoch_done"].get(str(epoch), 0)),
        "fraction_full": (len(pending) / n) if n else 0.0,
        "drained": not pending and not inflight and not_started == 0,
        "expired": int(c["expired"]), "late_acks": int(c["late_acks"]), "released": int(c["released"]),
        "redelivered": int(c.get("redelivered", 0)),
        "taken": int(c["taken"]), "num_clients": meta.get("num_clients"), "workers": workers,
    }

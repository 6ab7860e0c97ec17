"""The span provider of a :class:`WorkQueue`: what a worker takes off the queue, as the spans
the TFRecord source reads (``sf.read_tfrecord(queue, ...)``), and when each item is
acknowledged.

An item is acknowledged once its last record reached the consumer of the pass, not when it
left the source: the pass's iterator reports each element the user took
(:meth:`_QueueStream.on_delivered`), and the pass's state as of that element names the item
it came from. Records in prefetch, map or batch buffers are not delivered yet, and a worker
killed with them loses none: their items go to another worker.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..formats.index import load_index
from ..pipeline.node import building_context
from ..pipeline.spans import Span
from ..storage.urls import mask
from .items import WorkItem

if TYPE_CHECKING:
    from .workqueue import WorkQueue

logger = logging.getLogger(__name__)

TAKE_SLICE_S = 1.0
"""A blocking take waits this long at a time, then checks whether the pass was closed."""
MAX_AWAY_S = 3600.0
"""How long a pass's items keep their leases renewed while the pass shows no sign of life
(its consumer away: an evaluation, a checkpoint; or hung); past it they expire as a dead
worker's do."""
ENDING_LOOK_S = 0.05
"""How often a source whose consumer waits on it at the end of the work asks the queue whether
it may end its pass (:meth:`WorkQueue.may_end`)."""
WAIT_LOOK_S = 0.01
"""At the end of the work, a source holding items not yet delivered looks this often whether
its consumer waits on it (the queue itself is asked every ``poll_interval``)."""


def item_span(item: WorkItem, storage_options: Mapping[str, Any] | None = None,
              indexes: dict[str, Any] | None = None) -> Span:
    """The span of a TFRecord work item: the whole file, or its record range (byte offsets
    from the item, else from the file's index). Raises ``ValueError`` for a table item."""
    if item.kind == "rows":
        raise ValueError(f"{mask(item.work)} is a table item: read it with sf.read_table(queue, ...) "
                         "or pass open_item=<function item -> rows>")
    if item.start is None and item.stop is None:
        return Span(item.work, item.offset or 0, item.end, handle=item)
    start = item.start or 0
    offset, end = item.offset, item.end
    if (offset is None and start > 0) or (end is None and item.stop is not None):
        cache = indexes if indexes is not None else {}
        if item.work not in cache:
            cache[item.work] = load_index(item.work, storage_options)
        index = cache[item.work]
        if index is None:
            raise ValueError(f"{mask(item.work)}: a record range needs the file's index (.idx); "
                             "run `shardfeed index FILES` or sf.build_index(url)")
        n = len(index)
        if offset is None:
            offset = int(index[start, 0]) if start < n else (int(index[-1].sum()) if n else 0)
        if end is None and item.stop is not None:
            stop = min(item.stop, n)
            end = int(index[stop - 1].sum()) if stop > 0 else 0
    return Span(item.work, offset or 0, end, start, item.stop, handle=item)


class _QueueStream:
    """One pass over a queue: spans of the items this worker takes, until it is drained.

    An item whose records all left the source is *finished*; in a pass iterated by a
    :class:`~shardfeed.pipeline.iterator.PipelineIterator` it is acknowledged only once the
    consumer of the pass got its last record, since its last records may still sit in
    prefetch, map or batch buffers: the iterator reports the pass's state as of each element
    the consumer got (:meth:`on_delivered`), whose cursor names the item of that element, and
    every item taken before it was delivered. A finished item's lease is renewed until then;
    a pass closed early (an error, ``close()``) gives it back unacknowledged. A stream opened
    after its pass was built (a later repetition of ``repeat()``, an interleave's child)
    acknowledges an item when it is finished, as does one whose consumer waits on it at the
    end of the work while other workers hold items (:meth:`next_span`)."""

    def __init__(self, provider: "QueueSpans") -> None:
        self.q = provider.queue
        self.storage_options = provider.storage_options
        self.taken = 0
        self.held: dict[str, WorkItem] = {}  # taken, not finished
        self.finished: dict[str, WorkItem] = {}  # finished, not yet known to be delivered
        self.ordinal: dict[str, int] = {}  # item id -> its place among this pass's takes
        self.renewed: dict[str, float] = {}
        self.renew_at = float("inf")  # when the first lease of a finished item is due
        self.done = False
        self.closed = False
        self.indexes: dict[str, Any] = {}
        self.id = f"{os.getpid()}.{next(_STREAM_IDS)}"  # finds this stream's part of a pass's state
        self.lock = threading.Lock()  # the consumer's thread acknowledges, a read-ahead thread takes
        self.delivered_before = 0  # the items taken before this ordinal reached the consumer
        self.renewer: threading.Thread | None = None  # renews the leases while the consumer is away
        self.stopped = threading.Event()
        self.touched = time.monotonic()  # the pass's last sign of life: a take, a read, a delivery
        self.ctx = building_context()
        if self.ctx is not None:
            self.ctx.on_delivered(self.on_delivered)
            self.ctx.on_close(self.close)  # finished items outlive a source that ended before its pass

    def next_span(self, block: bool = True) -> Span | None:
        self.touched = time.monotonic()
        if self.done:
            return None
        item = None
        look = ending = 0.0
        while block and self.finished:
            # This pass's finished items wait for its consumer, who may wait on this very take
            # (a partial batch): when only they are left, the work is done for this pass.
            if self.closed:
                return None
            if time.monotonic() >= look:
                item = self.q.take(block=False)
                if item is not None:
                    break
                with self.lock:
                    mine = [*self.held, *self.finished]
                if self.q.drained_but(mine):
                    self.done = True
                    return None
                look = time.monotonic() + self.q.poll_interval
            if self.ctx is not None and self.ctx.consumer_waiting and time.monotonic() >= ending:
                # Other workers hold items that may come back, and the consumer waits on this
                # take: what this pass holds (a partial batch, elements in a map or a prefetch)
                # goes out only after it, and another worker may wait on this pass in turn.
                # Of such workers the one whose id sorts first ends its pass, its items
                # acknowledged only once their records reached the consumer (acknowledging them
                # here lost them to a kill before that: found from outside, up to 1,389 of 4,000
                # records behind a map); the others wait on, and take its items if it dies.
                if self.q.may_end(mine):
                    self.done = True
                    return None
                ending = time.monotonic() + ENDING_LOOK_S
            # the consumer still takes buffered elements: each acknowledges what it completes
            if time.monotonic() >= self.renew_at:
                self.renew_finished()
            time.sleep(WAIT_LOOK_S)
        if block and item is None and not self.held and not self.finished and _finished_here(self.q):
            # a later repetition of a pass (repeat()) whose earlier one finished what is left:
            # look once, and end at once when that is all, instead of after a take's slice
            item = self.q.take(block=False)
            if item is None and self.q.drained_but(_finished_here(self.q)):
                self.done = True
                return None
        while item is None:
            try:
                # a blocking take waits in slices, so that closing the pass stops it
                item = self.q.take(block=True, timeout=TAKE_SLICE_S) if block else self.q.take(block=False)
                if item is None:
                    self.done = block  # not blocking, None may only mean "nothing free right now"
                    return None
            except TimeoutError:
                if self.closed:
                    return None
                elsewhere = _finished_here(self.q)
                mine = [*self.held, *self.finished, *elsewhere]
                if elsewhere and self.q.drained_but(mine):
                    # what is left is what an earlier repetition of this pass finished, waiting for
                    # its records to reach the consumer (repeat() over a queue): this one is done
                    self.done = True
                    return None
                if elsewhere and self.q.may_end(mine):
                    # a later repetition (no pass context of its own: its source was built after
                    # the pass) whose earlier one holds finished items, beside another worker
                    # that holds its own the same way: the one whose id sorts first ends, as at
                    # the end of a first pass (before, the two waited until a lease ran out, and
                    # the item was read twice; found from outside)
                    self.done = True
                    return None
        with self.lock:
            self.ordinal[item.id] = self.taken
            self.taken += 1
            self.held[item.id] = item
            self.renewed[item.id] = time.monotonic()
            if self.renewer is None:
                self.renewer = threading.Thread(target=self._renew_while_held, name="shardfeed-queue-leases",
                                                daemon=True)
                self.renewer.start()
        return item_span(item, self.storage_options, self.indexes)

    def _renew_while_held(self) -> None:
        """Renew the due leases of the items this pass holds (read ahead, being read, or read
        to their end with records still in buffers) while the consumer is away from the pass:
        an evaluation, a checkpoint or a slow step longer than ``lease_timeout`` between two
        ``next()`` calls let them expire and another take deliver them again (found from
        outside: a worker slower than the lease delivered its own item 59 times). Ends with the
        pass, when the pass is done and holds nothing, or when the pass has shown no sign of
        life (a take, a read, a delivery) for :data:`MAX_AWAY_S` (or ``lease_timeout`` if
        longer): a consumer hung that long lets its items expire and go to other workers, as
        a dead one does (a heartbeat alone would keep them from the others for ever)."""
        term = self.q.lease_timeout / 4
        while not self.stopped.wait(min(term, 1.0)):
            if time.monotonic() - self.touched > max(MAX_AWAY_S, self.q.lease_timeout):
                logger.warning("work queue %r: this worker's pass has taken, read or delivered nothing for %.0f s: "
                               "its leases are left to run out, and its items go to other workers",
                               self.q.name, time.monotonic() - self.touched)
                return
            with self.lock:
                if (self.closed or self.done) and not self.held and not self.finished:
                    return
                now = time.monotonic()
                due = [it for it in self.held.values() if now - self.renewed.get(it.id, now) > term]
                for it in due:
                    self.renewed[it.id] = now
            try:
                for it in due:
                    if self.stopped.is_set():
                        return  # the pass ended meanwhile: its items went back, or were delivered
                    if not self.q.renew(it, stop=self.stopped.is_set):
                        with self.lock:  # due at once: the reader's next keep() finds it lost and stops it
                            self.renewed[it.id] = 0.0
                if self.finished and time.monotonic() >= self.renew_at:
                    self.renew_finished()
            except Exception:  # noqa: BLE001 - the next look tries again; a lease may run out meanwhile
                if self.stopped.is_set():
                    return  # a renewal given up as the pass ended (a server gone): nothing left to keep
                logger.warning("work queue %r: could not renew leases", self.q.name, exc_info=True)

    def get_state(self) -> dict:
        # The queue is the checkpoint (WorkQueue.get_state); a resumed pass takes afresh.
        # Taken just before a span is opened: "taken" is then that span's item's ordinal.
        return {"taken": self.taken, "stream": self.id}

    def finish(self, span: Span) -> None:
        item = span.handle
        with self.lock:
            if self.held.pop(item.id, None) is None:
                return
            # an item taken again by this pass after its lease ran out has no ordinal left (its first
            # take's went when that one was acknowledged or lost): it waits for the pass's end
            if self.ctx is not None and self.ordinal.setdefault(item.id, self.taken) >= self.delivered_before:
                self.finished[item.id] = item  # its last records may still be in buffers above
                self.renew_at = min(self.renew_at, self.renewed[item.id] + self.q.lease_timeout / 4)
                _finished_here(self.q, add=[item.id])
                return
            self.renewed.pop(item.id, None)
            self.ordinal.pop(item.id, None)
        # Now, not with the next take: with read-ahead that take may come only after the
        # next item was delivered, and a worker dying in between would leave two items'
        # records to be delivered again.
        self.q.ack(item)

    def on_delivered(self, state: Callable[[], Any] | None) -> None:
        """The consumer got an element; ``state()`` is the pass's root state as of it (None:
        the pass ended, every element was delivered). Acknowledges the finished items taken
        before the element's item and renews the due leases of the others. Never raises: a
        failed acknowledgement leaves its item to expire and be delivered again."""
        self.touched = time.monotonic()
        if not self.finished:
            return
        try:
            if state is None:
                self.ack_delivered(None)
                return
            root = state()
            upto = _delivered_ordinal(root, self.id)
            if upto is None and _names_a_later_stream(root, self.id):
                # an element of a later repetition of this pass (repeat()) reached the consumer:
                # every record of this one did before it (found from outside: a single worker's
                # repeat() kept this stream's last item leased, the next repetition waited out the
                # lease and delivered the whole queue again)
                self.ack_delivered(None)
                return
            if upto is not None and upto > self.delivered_before:
                self.ack_delivered(upto)
            if self.finished and time.monotonic() >= self.renew_at:
                self.renew_finished()
        except Exception:  # noqa: BLE001 - the element was delivered; its item may repeat
            logger.warning("work queue %r: could not acknowledge delivered items", self.q.name, exc_info=True)

    def ack_delivered(self, upto: int | None) -> None:
        """Acknowledge the finished items taken before ordinal ``upto`` (None: all of them)."""
        with self.lock:
            if upto is None:
                done = list(self.finished.values())
            else:
                self.delivered_before = max(self.delivered_before, upto)
                done = [it for it in self.finished.values() if self.ordinal[it.id] < upto]
            for it in done:
                del self.finished[it.id]
                self.renewed.pop(it.id, None)
                self.ordinal.pop(it.id, None)
        _finished_here(self.q, drop=[it.id for it in done])
        for it in done:
            self.q.ack(it)

    def renew_finished(self) -> None:
        """Renews the due leases of finished items (no record of theirs is read any more)."""
        now = time.monotonic()
        term = self.q.lease_timeout / 4
        with self.lock:
            due = [it for it in self.finished.values() if now - self.renewed.get(it.id, now) > term]
            for it in due:
                self.renewed[it.id] = now
            self.renew_at = min((self.renewed[i] + term for i in self.finished), default=float("inf"))
        for it in due:
            if not self.q.renew(it, stop=self.stopped.is_set):
                logger.warning("work queue %r: lease of item %s (%s) was lost before its last records were "
                               "delivered; the worker that has it now delivers them again", self.q.name, it.id,
                               mask(it.work))
                with self.lock:
                    self.finished.pop(it.id, None)
                    self.renewed.pop(it.id, None)
                    self.ordinal.pop(it.id, None)
                _finished_here(self.q, drop=[it.id])

    def keep(self, span: Span) -> bool:
        """Renews the leases of every held item that is due (items read ahead and finished
        items included); false when ``span``'s item was lost to another worker."""
        now = self.touched = time.monotonic()
        lost = False
        with self.lock:
            due = [it for it in self.held.values() if now - self.renewed.get(it.id, now) > self.q.lease_timeout / 4]
            for it in due:
                self.renewed[it.id] = now
        for item in due:
            if not self.q.renew(item):
                logger.warning("work queue %r: lease of item %s (%s) was lost; leaving it to the worker that has "
                               "it now", self.q.name, item.id, mask(item.work))
                with self.lock:
                    self.held.pop(item.id, None)
                    self.renewed.pop(item.id, None)
                lost = lost or item.id == span.handle.id
        if self.finished and now >= self.renew_at:
            self.renew_finished()
        return not lost and span.handle.id in self.held

    def close(self) -> None:
        """Give back the items taken and not finished; the finished ones too once the pass
        is over (closed early: they were not delivered), not when only this source ended."""
        self.closed = True
        with self.lock:
            back = list(self.held.values())
            self.held = {}
            if self.ctx is None or self.ctx.closed:
                _finished_here(self.q, drop=list(self.finished))
                back += self.finished.values()
                self.finished = {}
            if not self.finished:  # finished items of a source that ended before its pass keep
                self.stopped.set()  # their leases renewed until delivered (repeat(): found from outside)
        for k, item in enumerate(back):
            try:
                self.q.release(item)
            except Exception:  # noqa: BLE001 - closing goes on; the leases expire anyway
                # one wait for a lost server, not one an item (each up to Redis's reconnect_s:
                # a pass holding 10 items closed in 5 minutes with the server gone)
                logger.warning("work queue %r: could not give back item %s%s; their leases run out instead",
                               self.q.name, item.id, f" and {len(back) - k - 1} more" if k + 1 < len(back) else "",
                               exc_info=True)
                break


_STREAM_IDS = itertools.count()
# items that streams of this process finished and await delivery, by queue (the key of the queue,
# item id -> streams holding it): a later repetition's stream waits for none of them
_FINISHED_HERE: dict[tuple, dict[str, int]] = {}
_FINISHED_LOCK = threading.Lock()


def _queue_key(q: Any) -> tuple:
    return (getattr(q.backend, "url", id(q.backend)), q.name)


def _finished_here(q: Any, add: Iterable[str] = (), drop: Iterable[str] = ()) -> list[str]:
    """Items of queue ``q`` finished by this process's streams and awaiting delivery, after
    adding ``add`` and dropping ``drop``."""
    with _FINISHED_LOCK:
        ids = _FINISHED_HERE.setdefault(_queue_key(q), {})
        for i in add:
            ids[i] = ids.get(i, 0) + 1
        for i in drop:
            if ids.get(i, 0) <= 1:
                ids.pop(i, None)
            else:
                ids[i] -= 1
        return list(ids)


def _delivered_ordinal(state: Any, stream_id: str) -> int | None:
    """In a pass's root ``state``: the ordinal of the item of the last element delivered from
    stream ``stream_id`` (a source's cursor ``{"spans": {"taken": n, "stream": id}, ...}``;
    the least where it appears twice). A :class:`~shardfeed.pipeline.deferred.DeferredState`
    (a read position, say, not a delivered one) is not looked into."""
    if isinstance(state, dict):
        spans = state.get("spans")
        if isinstance(spans, dict) and spans.get("stream") == stream_id:
            return int(spans["taken"])
        values: Iterable[Any] = state.values()
    elif isinstance(state, (list, tuple)):
        values = state
    else:
        return None
    found = None
    for v in values:
        if isinstance(v, (dict, list, tuple)):
            n = _delivered_ordinal(v, stream_id)
            if n is not None and (found is None or n < found):
                found = n
    return found


def _names_a_later_stream(state: Any, stream_id: str) -> bool:
    """Whether a pass's root ``state`` names a queue stream of this process opened after
    ``stream_id`` (a later repetition's; a :class:`~shardfeed.pipeline.deferred.DeferredState`
    is not looked into, as in :func:`_delivered_ordinal`)."""
    pid, _, n = stream_id.partition(".")
    if isinstance(state, dict):
        spans = state.get("spans")
        if isinstance(spans, dict) and isinstance(spans.get("stream"), str):
            opid, _, on = spans["stream"].partition(".")
            if opid == pid and on.isdigit() and int(on) > int(n):
                return True
        values: Iterable[Any] = state.values()
    elif isinstance(state, (list, tuple)):
        values = state
    else:
        return False
    return any(_names_a_later_stream(v, stream_id) for v in values if isinstance(v, (dict, list, tuple)))


class QueueSpans:
    """The span provider of a :class:`WorkQueue`: each pass takes items until drained.

    The queue is its own checkpoint (``WorkQueue.get_state``): a reopened pass takes
    afresh, so the provider is not ``replayable``. Several readers of one queue (ranks,
    DataLoader workers) already share the work, so splitting it gives the same provider."""

    replayable = False

    def __init__(self, queue: "WorkQueue", storage_options: Mapping[str, Any] | None = None) -> None:
        self.queue = queue
        self.storage_options = storage_options

    def open(self, state: Any, epoch: tuple) -> _QueueStream:
        return _QueueStream(self)

    def split(self, index: int, count: int, storage_options: Mapping[str, Any] | None = None,
              compression: str | None = "auto", cache: Any = None, on_corrupt: str = "raise") -> "QueueSpans":
        return self

    def __repr__(self) -> str:
        return f"QueueSpans({self.queue!r})"

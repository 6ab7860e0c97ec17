"""``in_subprocess``: the chain above this stage runs in one child process.

Python stages hold the GIL; on threads in the trainer's process they slow the training
loop they feed. This stage moves everything upstream of it into one child started with
``spawn`` (safe with CUDA and threads in the parent). Elements, batches of numpy arrays in
practice, come back through a ring of ``buffer_size`` shared-memory slots: the child
writes an element's arrays into a free slot, then its small pickled structure, and
describes it in a shared control block (:mod:`~shardfeed.pipeline.shm_ring`): while
elements are ready the consumer takes one without a system call, and blocks (on a
semaphore, looking at the child every ``WAIT_TICK_S``) only when the ring is empty. The
consumer hands the arrays on as views of the slot (see :mod:`shardfeed.pipeline.shm`; an
element with the structure and layout kinds of the one before is built from that one's
plan, without unpickling), all hanging from one lease per element, and the slot goes back
to the child, through the control block too, when the last of them is gone: one copy in
all, the child's. When
the consumer already holds all slots but one (it keeps batches: ``list(ds)``), the element
is copied out instead and its slot handed back at once, so the ring never stalls;
``zero_copy=False`` copies every element out. The child waits for a free slot before
writing (backpressure by slot count), so at most ``buffer_size`` elements sit in shared
memory plus one being made in the child; a slot grows (a new segment) when an element does
not fit it.

The child sends, with each element, the upstream state after it, so this stage's state is
what was delivered, never what was read ahead. Parts of a state that cost real work to make
(a shuffle's buffered-record offsets, :mod:`~shardfeed.pipeline.deferred`) are left out of
what it sends: the child keeps the last few elements' full states, and the consumer's
``get_state()`` asks the child for its element's when the state is made, over a pipe of their
own that a thread of the child answers (so it never waits for the element being made);
without an answer (the child has moved too far on, is gone, or a ``get_state`` is already
asking in this thread: a signal handler's) the state is what the child sent, and the shuffle
restores by its anchor rule. And,
at most every ``STATS_EVERY_S`` and at the end, the upstream stages' statistics, which the
consumer's ``stats()`` shows as its own. An exception in the child reaches the consumer
with the child's traceback (the same type when it pickles); a child that dies is one
:class:`SubprocessError` naming the exit code or signal. A pass that ends leaves the child to the
dataset for its next pass (:mod:`~shardfeed.pipeline.process_handle`); ``close()`` or garbage
collection of a pass before its end, Ctrl-C (the child ignores SIGINT; the consumer stops it),
and for a kept child the dataset's ``close()``, its garbage collection and interpreter exit,
stop the child and remove its segments' names; arrays the consumer still holds keep their
memory (its own mapping) until they are gone. A dict element's bytes columns reach the
consumer as buffers and become object arrays when first read (:class:`~shardfeed.pipeline.shm.LazyBatch`).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import pickle
import signal
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..errors import SubprocessError
from . import shm, shm_plan, shm_ring
from .dataset import Dataset, UnaryDataset, positive_int
from .deferred import DeferredState
from .node import Build, Node
from .pickling import check_picklable
from .process_child import STAGE_FIELDS
from .process_handle import WAIT_TICK_S, ChildProcess, Keeper, Release
from .stats import PipelineStats, StageStats

logger = logging.getLogger(__name__)
_keeper_lock = threading.Lock()

STACK_LINES = 60  # of a frozen child's threads' stacks, in the TimeoutError
START_S = 30.0  # added to in_subprocess(timeout=) for the first element: the child's start (imports)


class _RemoteTraceback(Exception):
    """The child's traceback, as the ``__cause__`` of the exception it raised."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


class SubprocessDataset(UnaryDataset):
    kind = "subprocess"

    def __init__(self, parent: Dataset, buffer_size: int = 4, zero_copy: bool = True,
                 timeout: float | None = None) -> None:
        super().__init__(parent)
        self.buffer_size = positive_int("in_subprocess buffer_size", buffer_size)
        if not isinstance(zero_copy, bool):
            raise TypeError(f"in_subprocess zero_copy must be True or False, got {zero_copy!r}")
        self.zero_copy = zero_copy
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError("in_subprocess timeout must be a positive number of seconds (or None: wait as long as "
                             f"the child takes), got {timeout!r}")
        self.timeout = None if timeout is None else float(timeout)
        # a budget of bytes for the elements in the consumer's slots (to_torch's workers: many
        # small batches ahead, a few large ones); None: buffer_size elements, however large
        self.slot_bytes: int | None = None
        check_picklable(parent)

    def cardinality(self) -> int | float | None:
        return self.parent.cardinality()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return SubprocessNode(b, self, state)

    def _keeper(self) -> Keeper:
        """Where this dataset keeps its child between passes (made at the first pass)."""
        with _keeper_lock:
            k = self.__dict__.get("_kept_child")
            if k is None:
                k = self.__dict__["_kept_child"] = Keeper(self)
        return k

    def close(self) -> None:
        """Stop the child kept between passes (if any) and remove its shared memory; a later
        pass starts a new one. Also done when the dataset is garbage-collected and at exit."""
        k = self.__dict__.get("_kept_child")
        if k is not None:
            k.close()
            del self.__dict__["_kept_child"]

    def __getstate__(self) -> dict:
        d = super().__getstate__()
        d.pop("_kept_child", None)  # the child stays with the process that started it
        return d


class SubprocessNode(Node):
    """The consumer's side: starts the child on the first ``next`` and reads the ring."""

    def __init__(self, b: Build, ds: SubprocessDataset, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds, [])
        self.ds = ds
        self.build = b
        self.cur_state: Any = state["parent"] if state else None
        self.slots = ds.buffer_size
        # views of at most this many elements kept, the rest copied out: the child always has a
        # slot to fill (with a budget of slot bytes, it may have fewer than all out: shm_ring)
        self.views_kept = self.slots - 1 if ds.slot_bytes is None else shm_ring.MIN_IN_FLIGHT - 1
        self.zero_copy = ds.zero_copy
        self.child: ChildProcess | None = None  # this pass's; kept by the dataset when the pass ends
        self.cur_ref: int | None = None  # the child's number for the current element's full state
        self.done = False
        self.mapped = -1  # slots mapped when shared_memory_bytes was last set
        self.ended = False  # the child sent the pass's end: it can serve the next pass
        self.closed = False
        self.timeout = ds.timeout  # seconds to wait for one element; None: as long as it takes
        self.heard = False  # the child has sent something (started): the timeout is the element's alone
        self.child_stages: list[StageStats] | None = None
        self.seen_storage: dict[str, float] = {}
        self.seen_errors: dict[str, int] = {}
        self.seen_examples = 0
        self.stats.threaded = True
        self.stats.extra.update(slots=self.slots, shared_memory_bytes=0, zero_copy=0, copied_out=0, held_slots=0,
                                reused_child=0)
        b.ctx.on_close(self.close)

    # -- the child's lifetime ------------------------------------------------------------
    def _start(self) -> None:
        if self.ctx.closed or self.closed:
            raise RuntimeError("the iterator was closed")
        keeper = self.ds._keeper()
        child = keeper.take()
        if child is not None:
            self.heard = True  # started long ago: no start-up allowance
            self.stats.extra["reused_child"] = 1
        else:
            if multiprocessing.current_process().daemon:
                raise SubprocessError("in_subprocess cannot start its child inside a daemonic process (a DataLoader "
                                      "worker, say): use it with DataLoader(num_workers=0), one child per rank")
            try:
                chain = pickle.dumps(self.ds.parent, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - check_picklable names the stage
                check_picklable(self.ds.parent)
                raise
            child = ChildProcess(chain, self.slots, with_stacks=self.timeout is not None, slot_bytes=self.ds.slot_bytes)
        self.child = child
        b = self.build
        child.ring.extra = self.stats.extra
        self.stats.extra["held_slots"] = len(child.ring.held)
        self.stats.extra["child_pid"] = child.proc.pid
        child.start_pass(self._state(), b.epoch, b.scope, self.ctx.memory_budget)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        child, self.child = self.child, None
        if child is not None:
            if self.ended and child.alive():
                self.ds._keeper().give_back(child)  # for the next pass (an epoch, a new iterator)
            else:
                child.close()  # stopped mid-pass, failed, frozen or dead: what it made ahead goes with it

    # -- the consumer's side ------------------------------------------------------------
    def _wait(self, c: ChildProcess) -> None:
        """Block until the child posts a ``ready`` token (taken here), or is gone, or sent
        nothing for ``timeout`` seconds (the semaphore cannot be waited on with the child's
        sentinel: the child is looked at every ``WAIT_TICK_S``)."""
        deadline = None
        if self.timeout is not None:  # the first element also waits for the child to start
            deadline = time.monotonic() + self.timeout + (0.0 if self.heard else START_S)
        ready = c.ready
        while True:
            if self.ctx.closed or c.closed:
                raise RuntimeError("the iterator was closed")
            if ready.acquire(timeout=WAIT_TICK_S):
                return
            if c.exited():
                if ready.acquire(False):  # its last words (an error) came before it went
                    return
                raise self._died()
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timed_out()

    def _timed_out(self) -> TimeoutError:
        """The child sent nothing for ``timeout`` seconds: what it was doing (its threads'
        stacks, which it writes on SIGUSR1), as the error that ends the pass."""
        c = self.child
        assert c is not None
        self.done = c.frozen = True
        pid = c.proc.pid
        stack = ""
        if c.stack_path is not None:
            try:
                os.kill(pid, signal.SIGUSR1)
                for _ in range(20):  # written by the child's signal handler at once (faulthandler)
                    time.sleep(0.05)
                    with open(c.stack_path, encoding="utf-8", errors="replace") as f:
                        got = f.read()
                    if got and got == stack:
                        break
                    stack = got
            except OSError:
                pass
        lines = stack.strip().splitlines()
        where = ("\nIts threads, most recent call first:\n" + "\n".join(lines[:STACK_LINES])
                 + ("\n..." if len(lines) > STACK_LINES else "")) if lines else ""
        return TimeoutError(f"the in_subprocess child process (pid {pid}) sent no element for {self.timeout:g} s "
                            f"(in_subprocess(timeout={self.timeout:g})): the stages above it ({self.ds.parent!r:.200}) "
                            "are stuck, or slower than that for one element; the child is stopped and the elements "
                            "it had not sent are lost (resume from the last get_state() to read them)" + where)

    def _died(self) -> SubprocessError:
        self.done = True
        c = self.child
        assert c is not None
        c.proc.join(1.0)
        code = c.proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name} (exit code {code})"
            except ValueError:
                how = f"killed by signal {-code} (exit code {code})"
        else:
            how = f"exited with code {code}"
        hint = ""
        if code == 1 and not self.heard and c.passes <= 1:
            # nothing heard from a child that never ran a pass: it failed while starting, before
            # it could send its error (spawn runs the main module again in the child first)
            hint = ("; it failed while starting, before it could send its error (printed on its stderr above): most "
                    "often the script that starts it lacks an `if __name__ == \"__main__\":` guard around the code "
                    "that iterates (spawn imports the main module again in the child, which then starts a child "
                    "itself), or the pipeline's functions cannot be imported there")
        return SubprocessError(f"the in_subprocess child process (pid {c.proc.pid}) running the stages above "
                               f"it died: {how}, before the end of the pass; the elements it had not sent are lost "
                               f"(resume from the last get_state() to read them){hint}")

    def _next(self) -> Any:
        if self.done:
            raise StopIteration
        c = self.child
        if c is None:
            self._start()
            c = self.child
            assert c is not None
        if not c.ready.acquire(False):  # an element (or a message) ready: no system call
            self._wait(c)
        self.heard = True
        block = c.block
        self.stats.sample_queue(min(1.0, block.waiting() / self.slots))
        d = block.take()
        if d is not None:
            t = time.perf_counter()
            slot, gen, size, ref, at, lengths, work_s = d
            x = self._element(c, slot, gen, at, lengths)
            self.stats.work_s += work_s + time.perf_counter() - t
            self.stats.bytes += size
            self.cur_ref = ref
            return x
        try:  # the token was for a message on the pipe: the end, or an error
            if not c.conn.poll():
                raise EOFError
            msg = c.conn.recv()
        except EOFError:
            raise self._died() from None
        self.done = True
        self._merge(msg[-1])
        if msg[0] == "end":
            self.ended = True
            raise StopIteration
        _, blob, type_name, text, tb = msg[:5]
        exc = None
        if blob is not None:
            try:
                exc = pickle.loads(blob)
            except Exception:  # noqa: BLE001 - reported as SubprocessError below
                exc = None
        if not isinstance(exc, BaseException):
            exc = SubprocessError(f"the in_subprocess child raised {type_name}: {text}")
        raise exc from _RemoteTraceback(tb)

    def _element(self, c: ChildProcess, slot: int, gen: int, at: int, lengths: tuple) -> Any:
        """The element in ``slot``: views of it while the user holds fewer than all slots
        but one (the slot goes back when the last view goes), else copied out (it goes back
        now), so the child always has a slot to fill. Its structure and layout are compared
        as bytes with the previous element's, whose plan serves when they match; its state
        stays pickled until asked for."""
        mapping, pinned, view = c.slot(slot, gen)
        ln, ls, lk, lt, lp = lengths
        unpack = c.unpackers.get(ln)
        if unpack is None:
            unpack = c.unpackers[ln] = struct.Struct(f"{ln // 8}q").unpack_from
        numbers = unpack(view, at)
        at += ln
        # compared in place with the last plan's (bytes made only for a new plan)
        plan = c.plan = shm_plan.plan(view[at:at + ls], view[at + ls:at + ls + lk], c.plan)
        at += ls + lk
        self.cur_state = _Pickled(bytes(view[at:at + lt]))
        if lp:  # the child's statistics, now and then
            self._merge(pickle.loads(view[at + lt:at + lt + lp]))
        ring, extra = c.ring, self.stats.extra
        if len(c.maps) != self.mapped:  # a slot mapped (or grown) since: say how much is mapped
            self.mapped = len(c.maps)
            extra["shared_memory_bytes"] = c.mapped_bytes()
        if not plan.views(numbers):  # nothing in the slot to view (scalars, bytes objects)
            x = shm.decode(mapping, plan.structure, plan.layout(numbers))
            ring.free(slot)
            extra["zero_copy"] += 1
        elif self.zero_copy and len(ring.held) < self.views_kept:
            ring.hold(slot)
            x = plan.build(mapping, numbers, shm.SlotLease(mapping, Release(ring, slot), pinned=pinned))
            extra["zero_copy"] += 1
        else:
            x = shm.decode(mapping, plan.structure, plan.layout(numbers))
            ring.free(slot)
            extra["copied_out"] += 1
        return x

    def _merge(self, snap: Mapping[str, Any] | None) -> None:
        """Show the child's statistics (cumulative for this pass) as this pass's own."""
        if snap is None:
            return
        stats: PipelineStats = self.ctx.stats
        if self.child_stages is None:
            self.child_stages = [StageStats(d["name"]) for d in snap["stages"]]
            at = stats.stages.index(self.stats)
            stats.stages[at:at] = self.child_stages
            for i, s in enumerate(stats.stages):  # number the stages in pipeline order again
                s.name = f"{i}:{s.name.split(':', 1)[-1]}"
            for s, d in zip(self.child_stages, snap["stages"]):
                s.upstream = [self.child_stages[i] for i in d["upstream"]]
            if self.child_stages:
                self.stats.upstream = [self.child_stages[-1]]
        for s, d in zip(self.child_stages, snap["stages"]):
            for f in STAGE_FIELDS:
                setattr(s, f, d[f])
        for f, v in snap["storage"].items():  # add what is new since the last snapshot
            stats.storage.add(**{f: v - self.seen_storage.get(f, 0)})
        self.seen_storage = dict(snap["storage"])
        for stage, n in snap["errors"]["by_stage"].items():
            stats.errors.by_stage[stage] += n - self.seen_errors.get(stage, 0)
        self.seen_errors = dict(snap["errors"]["by_stage"])
        examples = snap["errors"]["examples"]
        stats.errors.examples.extend(examples[self.seen_examples:])
        self.seen_examples = len(examples)

    def _state(self) -> Any:
        """The upstream state the child sent with the current element (unpickled once, when asked)."""
        s = self.cur_state
        if type(s) is _Pickled:
            s = self.cur_state = pickle.loads(s.blob)
        return s

    def get_state(self) -> dict:
        if self.cur_ref is None:
            return {"parent": self._state()}
        return {"parent": _ChildState(self, self.cur_ref, self._state())}

    @property
    def reading(self) -> int | None:
        """The thread reading an answer from the child now (see :meth:`ChildProcess.ask`)."""
        return self.child.reading if self.child is not None else None

    @reading.setter
    def reading(self, ident: int | None) -> None:
        if self.child is not None:
            self.child.reading = ident

    def _ask(self, ref: int) -> Any:
        """The child's full state number ``ref``, or None (see :meth:`ChildProcess.ask`)."""
        c = self.child
        if c is None or self.closed:
            return None
        return c.ask(ref, self.timeout)


class _Pickled:
    """A state as the child sent it, pickled: most are never asked for."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob


class _ChildState(DeferredState):
    """The in_subprocess stage's upstream state as the child sent it (deferred parts left
    out), made whole by asking the child when the state is kept."""

    __slots__ = ("node", "ref", "sent")

    def __init__(self, node: SubprocessNode, ref: int, sent: Any) -> None:
        self.node, self.ref, self.sent = node, ref, sent

    def value(self) -> Any:
        full = self.node._ask(self.ref)
        return self.sent if full is None else full

    def fallback(self) -> Any:
        return self.sent


__all__ = ["SubprocessDataset", "check_picklable"]

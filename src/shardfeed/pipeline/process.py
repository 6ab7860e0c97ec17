"""``in_subprocess``: the chain above this stage runs in one child process.

Python stages hold the GIL; on threads in the trainer's process they slow the training
loop they feed. This stage moves everything upstream of it into one child started with
``spawn`` (safe with CUDA and threads in the parent). Elements, batches of numpy arrays in
practice, come back through a ring of ``buffer_size`` shared-memory slots: the child
writes an element's arrays into a free slot and sends only its small pickled structure
and the slot's number down a pipe. The consumer hands the arrays on as views of the slot
(see :mod:`shardfeed.pipeline.shm`), all hanging from one lease per element, and the slot
goes back to the child when the last of them is gone: one copy in all, the child's. When
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
:class:`SubprocessError` naming the exit code or signal. ``close()``, garbage collection,
Ctrl-C (the child ignores SIGINT; the consumer stops it) and interpreter exit stop the child
and remove its segments' names; arrays the consumer still holds keep their memory (its own
mapping) until they are gone.
"""

from __future__ import annotations

import collections
import logging
import math
import multiprocessing
import os
import pickle
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import wait
from typing import Any

from ..errors import SubprocessError
from . import shm
from .dataset import Dataset, UnaryDataset, positive_int
from .deferred import DeferredState
from .node import Build, Node
from .pickling import check_picklable
from .process_child import STAGE_FIELDS, child_main
from .stats import PipelineStats, StageStats

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0
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
        check_picklable(parent)

    def cardinality(self) -> int | float | None:
        return self.parent.cardinality()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return SubprocessNode(b, self, state)


class _Ring:
    """What the consumer and the leases of its elements share: the pipe that hands slots
    back to the child and the slots whose arrays the user still holds. A lease ends in
    whichever thread drops its last array (or in the garbage collector, inside any
    allocation, this thread's sends included), so ``free`` never blocks on the lock: a slot
    it cannot send now waits in ``later`` for the next ``flush`` (the consumer flushes before
    and while it waits for an element)."""

    def __init__(self, nslots: int) -> None:
        self.nslots = nslots
        self.ctrl: Any = None
        self.lock = threading.Lock()
        self.held: set[int] = set()
        self.later: collections.deque = collections.deque()
        self.closed = False
        self.extra: dict[str, Any] = {}  # the stage's stats.extra: held_slots kept current

    def hold(self, slot: int) -> None:
        self.held.add(slot)
        self.extra["held_slots"] = len(self.held)

    def free(self, slot: int) -> None:
        self.held.discard(slot)
        self.extra["held_slots"] = len(self.held)
        self.later.append(slot)
        self.flush()

    def flush(self) -> None:
        if not self.lock.acquire(blocking=False):
            return  # another send is under way (maybe this thread's own): it or the next flush sends these
        try:
            while self.later:
                slot = self.later.popleft()
                if not self.closed:
                    self.ctrl.send(("free", slot))
        except (OSError, ValueError, AttributeError):
            pass  # the child is gone (or the consumer closed the pipe): nobody needs the slot
        finally:
            self.lock.release()


class _Release:
    """A lease's end: hand ``slot`` back (a small object, so a lease holds no node)."""

    __slots__ = ("ring", "slot")

    def __init__(self, ring: _Ring, slot: int) -> None:
        self.ring, self.slot = ring, slot

    def __call__(self) -> None:
        self.ring.free(self.slot)


class SubprocessNode(Node):
    """The consumer's side: starts the child on the first ``next`` and reads the ring."""

    def __init__(self, b: Build, ds: SubprocessDataset, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds, [])
        self.ds = ds
        self.build = b
        self.cur_state: Any = state["parent"] if state else None
        self.slots = ds.buffer_size
        self.zero_copy = ds.zero_copy
        self.ring = _Ring(self.slots)
        self.token = f"{os.getpid()}_{secrets.token_hex(4)}"
        self.maps: dict[int, Any] = {}  # slot -> (gen, the segment mapped here as a uint8 array, its interface)
        self.gens = [-1] * self.slots  # the newest generation of each slot announced
        self.proc: Any = None
        self.conn: Any = None  # elements, errors, the end: child -> consumer
        self.ctrl: Any = None  # free slots and stop: consumer -> child
        self.pending: collections.deque = collections.deque()
        self.asks: Any = None  # questions for a full state: consumer -> child
        self.answers: Any = None  # ... and their answers
        self.ask_lock = threading.RLock()
        self.answered: dict[int, Any] = {}  # answers read by a get_state that waited for another
        self.ask_broken = False  # a get_state was interrupted while reading an answer
        self.reading: int | None = None  # the thread reading an answer now (its signal handler must not read too)
        self.cur_ref: int | None = None  # the child's number for the current element's full state
        self.done = False
        self.closed = False
        self.timeout = ds.timeout  # seconds to wait for one element; None: as long as it takes
        self.frozen = False  # the child sent nothing within the timeout: stop it at once on close
        self.heard = False  # the child has sent something (started): the timeout is the element's alone
        self.stack_path: str | None = None  # where the child writes its threads' stacks on SIGUSR1
        self.child_stages: list[StageStats] | None = None
        self.seen_storage: dict[str, float] = {}
        self.seen_errors: dict[str, int] = {}
        self.seen_examples = 0
        self.stats.threaded = True
        self.stats.extra.update(slots=self.slots, shared_memory_bytes=0, zero_copy=0, copied_out=0, held_slots=0)
        self.ring.extra = self.stats.extra
        b.ctx.on_close(self.close)

    # -- the child's lifetime ------------------------------------------------------------
    def _start(self) -> None:
        if self.ctx.closed or self.closed:
            raise RuntimeError("the iterator was closed")
        if multiprocessing.current_process().daemon:
            raise SubprocessError("in_subprocess cannot start its child inside a daemonic process (a DataLoader "
                                  "worker, say): use it with DataLoader(num_workers=0), one child per rank")
        b = self.build
        try:
            payload = pickle.dumps((self.ds.parent, self.cur_state, b.epoch, b.scope, self.ctx.memory_budget),
                                   protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - check_picklable names the stage
            check_picklable(self.ds.parent)
            raise
        if self.timeout is not None:
            fd, self.stack_path = tempfile.mkstemp(prefix=f"sf_{self.token}_", suffix=".stack")
            os.close(fd)
        mp = multiprocessing.get_context("spawn")
        self.conn, child_conn = mp.Pipe(duplex=False)
        child_ctrl, self.ctrl = mp.Pipe(duplex=False)
        child_asks, self.asks = mp.Pipe(duplex=False)
        self.answers, child_answers = mp.Pipe(duplex=False)
        self.proc = mp.Process(target=child_main, args=(child_conn, child_ctrl, payload, self.token, self.slots,
                                                         child_asks, child_answers, self.stack_path),
                               name="shardfeed-subprocess", daemon=True)
        self.proc.start()
        self.ring.ctrl = self.ctrl
        for c in (child_conn, child_ctrl, child_asks, child_answers):
            c.close()
        self.stats.extra["child_pid"] = self.proc.pid

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.ring.closed = True  # leases that end from now on hand nothing back
        proc = self.proc
        if proc is not None:
            with self.ring.lock:  # not in the middle of a lease's send
                try:
                    self.ctrl.send(("stop",))
                except (OSError, ValueError):
                    pass  # the child is gone already
            proc.join(0.5 if self.frozen else JOIN_TIMEOUT_S)  # a frozen child reads no stop message
            if proc.exitcode is None:
                if not self.frozen:
                    logger.warning("in_subprocess child %d did not stop within %.0f s; terminating it", proc.pid,
                                   JOIN_TIMEOUT_S)
                proc.terminate()
                proc.join(2.0)
                if proc.exitcode is None:
                    proc.kill()
                    proc.join()
            proc.close()
            with self.ring.lock:
                for c in (self.conn, self.ctrl):
                    c.close()
            for c in (self.asks, self.answers):  # a get_state waiting in another thread gives up
                c.close()
        self.pending.clear()
        self.maps.clear()  # a mapping the user's arrays still view lives on until they go
        if proc is not None:
            for slot, gen in enumerate(self.gens):
                # the newest announced generation, and the next one: a child that died
                # between making a segment and announcing it leaves it under that name
                for g in (gen, gen + 1):
                    if g >= 0:
                        shm.unlink_quietly(shm.slot_name(self.token, slot, g))
        if self.stack_path is not None:
            try:
                os.unlink(self.stack_path)
            except OSError:
                pass
            self.stack_path = None

    # -- the consumer's side ------------------------------------------------------------
    def _receive(self) -> None:
        """Take every message waiting; block until there is one (or the child is gone, or
        sent nothing for ``timeout`` seconds)."""
        deadline = None
        if self.timeout is not None:  # the first element also waits for the child to start
            deadline = time.monotonic() + self.timeout + (0.0 if self.heard else START_S)
        while True:
            try:
                while self.conn.poll():
                    self.pending.append(self.conn.recv())
                    self.heard = True
            except EOFError:
                if self.pending:
                    return
                raise self._died() from None
            if self.pending:
                return
            if self.ctx.closed:
                raise RuntimeError("the iterator was closed")
            self.ring.flush()  # slots whose arrays another thread dropped meanwhile
            ready = wait([self.conn, self.proc.sentinel], timeout=0.1)
            if ready and self.conn not in ready and not self.conn.poll():
                raise self._died()
            if deadline is not None and not ready and time.monotonic() >= deadline:
                raise self._timed_out()

    def _timed_out(self) -> TimeoutError:
        """The child sent nothing for ``timeout`` seconds: what it was doing (its threads'
        stacks, which it writes on SIGUSR1), as the error that ends the pass."""
        self.done = self.frozen = True
        pid = self.proc.pid
        stack = ""
        if self.stack_path is not None:
            try:
                os.kill(pid, signal.SIGUSR1)
                for _ in range(20):  # written by the child's signal handler at once (faulthandler)
                    time.sleep(0.05)
                    with open(self.stack_path, encoding="utf-8", errors="replace") as f:
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
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name} (exit code {code})"
            except ValueError:
                how = f"killed by signal {-code} (exit code {code})"
        else:
            how = f"exited with code {code}"
        return SubprocessError(f"the in_subprocess child process (pid {self.proc.pid}) running the stages above "
                               f"it died: {how}, before the end of the pass; the elements it had not sent are lost "
                               "(resume from the last get_state() to read them)")

    def _next(self) -> Any:
        if self.done:
            raise StopIteration
        if self.proc is None:
            self._start()
        self.ring.flush()
        if not self.pending:
            self._receive()
        self.stats.sample_queue(min(1.0, len(self.pending) / self.slots))
        msg = self.pending.popleft()
        kind = msg[0]
        if kind == "data":
            _, slot, gen, structure, layout, state, size, work_s, snap, ref = msg
            t = time.perf_counter()
            x = self._decode(slot, gen, structure, layout)
            self.stats.work_s += work_s + time.perf_counter() - t
            self.stats.bytes += size
            self.cur_state, self.cur_ref = state, ref
            if snap is not None:
                self._merge(snap)
            return x
        self.done = True
        self._merge(msg[-1])
        if kind == "end":
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

    def _decode(self, slot: int, gen: int, structure: bytes, layout: list) -> Any:
        """The element in ``slot``: views of it while the user holds fewer than all slots
        but one (the slot goes back when the last view goes), else copied out (it goes back
        now), so the child always has a slot to fill."""
        mapping, interface = self._slot(slot, gen)
        ring, extra = self.ring, self.stats.extra
        if not shm.views_slot(layout):  # nothing in the slot to view (scalars, bytes objects)
            x = shm.decode(mapping, structure, layout)
            ring.free(slot)
            extra["zero_copy"] += 1
        elif self.zero_copy and len(ring.held) < self.slots - 1:
            ring.hold(slot)
            x = shm.decode(mapping, structure, layout, shm.SlotLease(mapping, _Release(ring, slot), interface))
            extra["zero_copy"] += 1
        else:
            x = shm.decode(mapping, structure, layout)
            ring.free(slot)
            extra["copied_out"] += 1
        return x

    def _slot(self, slot: int, gen: int) -> tuple[Any, dict]:
        have = self.maps.get(slot)
        if have is None or have[0] != gen:
            m = shm.map_segment(shm.slot_name(self.token, slot, gen))
            have = self.maps[slot] = (gen, m, m.__array_interface__)  # the old mapping lives on in its views
            self.gens[slot] = max(self.gens[slot], gen)
            self.stats.extra["shared_memory_bytes"] = sum(mm.nbytes for _, mm, _ in self.maps.values())
        return have[1], have[2]

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

    def get_state(self) -> dict:
        if self.cur_ref is None:
            return {"parent": self.cur_state}
        return {"parent": _ChildState(self, self.cur_ref, self.cur_state)}

    def _ask(self, ref: int) -> Any:
        """The child's full state number ``ref`` (its deferred parts made there, by a thread
        that answers while the child makes elements), or None when it no longer has it or is
        gone. Answers to other questions (a get_state inside another: a signal handler's, or
        another thread's) are kept for them."""
        if self.proc is None or self.closed or self.ask_broken or self.reading == threading.get_ident():
            return None
        with self.ask_lock:
            if ref in self.answered:
                return self.answered.pop(ref)
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            try:
                self.asks.send(ref)
                while True:
                    if ref in self.answered:
                        return self.answered.pop(ref)
                    if not self.answers.poll():
                        ready = wait([self.answers, self.proc.sentinel], timeout=1.0)
                        if self.closed or (self.proc.sentinel in ready and not self.answers.poll()):
                            return None  # closing, or the child is gone
                        if not ready:
                            if deadline is not None and time.monotonic() >= deadline:
                                return None  # a frozen child: the state it sent (a late answer is kept)
                            continue
                    self.reading = threading.get_ident()
                    try:
                        got, made = self.answers.recv()
                    finally:
                        self.reading = None
                    if got == ref:
                        return made
                    if len(self.answered) < 64:
                        self.answered[got] = made
            except (EOFError, OSError, ValueError, TypeError):
                return None
            except BaseException:
                self.ask_broken = True  # perhaps in the middle of an answer: the pipe is out of step
                raise


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

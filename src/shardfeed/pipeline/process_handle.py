"""The consumer's handle on one ``in_subprocess`` child: the process, its pipes and its ring.

A handle outlives a pass: when a pass ends (the child sent its end), the stage keeps the
handle (:class:`Keeper`) and the next pass of the same dataset (a new ``iter()``, the next
epoch of a ``repeat()`` after the stage) asks the same child for a pass instead of starting
a process, so its slots (and this side's mappings of them) serve every epoch. A pass closed
before its end stops its child (what it made ahead is dropped with it). The kept child goes
away with the dataset (garbage collection), at interpreter exit, or on ``close()``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import secrets
import selectors
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import wait
from typing import Any

from . import shm, shm_plan, shm_ring
from .process_child import child_main

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0
WAIT_TICK_S = 0.05  # a consumer waiting for an element looks at the child (alive? closed?) this often
IDLE_S = 60.0  # default of idle_seconds()


class Ring:
    """What the consumer and the leases of its elements share: the control block where a
    slot goes back to the child (a count per slot and a ``free`` token: no lock and no
    system call while the child is busy, so a lease may end in any thread, or in the garbage
    collector inside any allocation) and the slots whose arrays the user still holds."""

    def __init__(self, nslots: int, block: shm_ring.ControlBlock, free: Any) -> None:
        self.nslots = nslots
        self.block = block
        self.free_sem: Any = free  # None once the child is closed
        self.held: set[int] = set()
        self.closed = False
        self.extra: dict[str, Any] = {}  # the current pass's stats.extra: held_slots kept current

    def hold(self, slot: int) -> None:
        self.held.add(slot)
        self.extra["held_slots"] = len(self.held)

    def free(self, slot: int) -> None:
        self.held.discard(slot)
        self.extra["held_slots"] = len(self.held)
        sem = self.free_sem
        if self.closed or sem is None:
            return  # the child is gone: nobody needs the slot
        if self.block.hand_back(slot):  # the child sleeps: wake it (else it sees the count itself)
            sem.release()


class Release:
    """A lease's end: hand ``slot`` back (a small object, so a lease holds no node)."""

    __slots__ = ("ring", "slot")

    def __init__(self, ring: Ring, slot: int) -> None:
        self.ring, self.slot = ring, slot

    def __call__(self) -> None:
        self.ring.free(self.slot)


class ChildProcess:
    """One spawned child running ``chain`` pass after pass, and this side of its ring."""

    def __init__(self, chain: Any, slots: int, with_stacks: bool, slot_bytes: int | None = None) -> None:
        self.slots = slots
        self.token = f"{os.getpid()}_{secrets.token_hex(4)}"
        # slot -> (gen, the segment mapped here as a uint8 array, its pinned view, a memoryview)
        self.maps: dict[int, Any] = {}
        self.plan: shm_plan.Plan | None = None  # the last element's (the next one's, most often)
        self.unpackers: dict[int, Any] = {}  # bytes of a layout's numbers -> their struct's unpack_from
        self.gens = [-1] * slots  # the newest generation of each slot announced
        self.frozen = False  # sent nothing within the timeout: stopped at once on close
        self.closed = False
        self.passes = 0
        self.stack_path: str | None = None  # where the child writes its threads' stacks on SIGUSR1
        self.ask_lock = threading.RLock()
        self.answered: dict[int, Any] = {}  # answers read by a get_state that waited for another
        self.ask_broken = False  # a get_state was interrupted while reading an answer
        self.reading: int | None = None  # the thread reading an answer now (its signal handler must not read too)
        if with_stacks:
            fd, self.stack_path = tempfile.mkstemp(prefix=f"sf_{self.token}_", suffix=".stack")
            os.close(fd)
        mp = multiprocessing.get_context("spawn")
        self.ctl_name = f"sf_{self.token}_ctl"
        shm.create(self.ctl_name, shm_ring.block_bytes(slots)).close()  # zeroed; mapped below, and by the child
        try:
            self.block = shm_ring.open_block(self.ctl_name, slots)
            self.ready = mp.Semaphore(0)  # a token per element published and per message on ``conn``
            self.free = mp.Semaphore(0)  # wakes a child sleeping for a free slot (or for the stop)
            self.ring = Ring(slots, self.block, self.free)
            self.ctrl_lock = threading.Lock()
            self.conn, child_conn = mp.Pipe(duplex=False)  # the end of a pass, errors: child -> consumer
            child_ctrl, self.ctrl = mp.Pipe(duplex=False)  # passes and stop: consumer -> child
            child_asks, self.asks = mp.Pipe(duplex=False)  # questions for a full state: consumer -> child
            self.answers, child_answers = mp.Pipe(duplex=False)  # ... and their answers
            self.proc = mp.Process(target=child_main,
                                   args=(child_conn, child_ctrl, chain, self.token, slots,
                                         (self.ctl_name, self.ready, self.free), child_asks, child_answers,
                                         self.stack_path, slot_bytes),
                                   name="shardfeed-subprocess", daemon=True)
            self.proc.start()
        except BaseException:
            shm.unlink_quietly(self.ctl_name)
            raise
        for c in (child_conn, child_ctrl, child_asks, child_answers):
            c.close()
        self.selector = selectors.DefaultSelector()  # made once: one per wait cost more than the rest of next()
        self.selector.register(self.proc.sentinel, selectors.EVENT_READ)

    def exited(self) -> bool:
        """Whether the child process has exited (its sentinel is ready; no waiting)."""
        return bool(self.selector.select(0))

    def alive(self) -> bool:
        if self.closed or self.proc.exitcode is not None:
            return False
        # a process killed while its threads are still being torn down is already a zombie (its
        # leader) but not yet waitable: exitcode says None for a moment, /proc says it is dead
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return True  # no /proc here: the exit code is all there is

    def start_pass(self, state: Any, epoch: Any, scope: Any, budget: Any) -> None:
        """Ask the child for a pass (it runs one at a time: the previous one has ended)."""
        self.passes += 1
        with self.ctrl_lock:
            self.ctrl.send(("start", state, epoch, scope, budget))

    def slot(self, slot: int, gen: int) -> tuple[Any, Any, memoryview]:
        """Generation ``gen`` of ``slot``, mapped here (once per generation): as a uint8
        array, its :func:`~shardfeed.pipeline.shm.pinned_view` (leases are made on it), and
        a memoryview of it."""
        have = self.maps.get(slot)
        if have is None or have[0] != gen:
            m = shm.map_segment(shm.slot_name(self.token, slot, gen))
            # the old mapping lives on in its views
            have = self.maps[slot] = (gen, m, shm.pinned_view(m), memoryview(m))
            self.gens[slot] = max(self.gens[slot], gen)
        return have[1], have[2], have[3]

    def mapped_bytes(self) -> int:
        return sum(have[1].nbytes for have in self.maps.values())

    def close(self) -> None:
        """Stop the child (at once when frozen), remove its segments' names; idempotent."""
        if self.closed:
            return
        self.closed = True
        self.ring.closed = True  # leases that end from now on hand nothing back
        self.ring.free_sem = None
        proc = self.proc
        with self.ctrl_lock:
            try:
                self.ctrl.send(("stop",))
            except (OSError, ValueError):
                pass  # the child is gone already
        self.free.release()  # a child waiting for a slot reads the stop now
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
        with self.ctrl_lock:
            self.ctrl.close()
        for c in (self.conn, self.asks, self.answers):  # a get_state waiting in another thread gives up
            c.close()
        self.selector.close()
        shm.unlink_quietly(self.ctl_name)  # the mappings live on in the ring (leases may still hand back)
        self.maps.clear()  # a mapping the user's arrays still view lives on until they go
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

    def ask(self, ref: int, timeout: float | None) -> Any:
        """The child's full state number ``ref`` (its deferred parts made there, by a thread
        that answers while the child makes elements), or None when it no longer has it or is
        gone. Answers to other questions (a get_state inside another: a signal handler's, or
        another thread's) are kept for them."""
        if self.closed or self.ask_broken or self.reading == threading.get_ident():
            return None
        with self.ask_lock:
            if ref in self.answered:
                return self.answered.pop(ref)
            deadline = None if timeout is None else time.monotonic() + timeout
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


def idle_seconds() -> float:
    """How long a kept child waits for the dataset's next pass before it is stopped:
    ``$SHARDFEED_SUBPROCESS_IDLE_SECONDS`` (default 60; ``inf``: until the dataset goes)."""
    raw = os.environ.get("SHARDFEED_SUBPROCESS_IDLE_SECONDS", "")
    try:
        v = float(raw) if raw else IDLE_S
    except ValueError:
        logger.warning("SHARDFEED_SUBPROCESS_IDLE_SECONDS=%r is not a number of seconds; using %g", raw, IDLE_S)
        v = IDLE_S
    return max(0.0, v)


class Keeper:
    """The child a dataset keeps between passes: at most one, idle (no pass runs on it).
    Stopped when no pass asks for it within :func:`idle_seconds` (a dataset something else
    keeps alive, such as TensorFlow's ``from_generator``, holds no idle process for ever),
    and with the dataset (a ``weakref.finalize``, which also runs at interpreter exit)."""

    def __init__(self, owner: Any) -> None:
        self.lock = threading.Lock()
        self.idle: ChildProcess | None = None
        self.timer: threading.Timer | None = None
        self.closed = False
        weakref.finalize(owner, self.close)

    def take(self) -> ChildProcess | None:
        """The kept child, alive, for a pass; None when there is none."""
        with self.lock:
            c, self.idle = self.idle, None
            t, self.timer = self.timer, None
        if t is not None:
            t.cancel()
        if c is not None and not c.alive():
            c.close()
            return None
        return c

    def give_back(self, c: ChildProcess) -> None:
        """Keep ``c`` (its pass has ended) for the next pass, or stop it when one is kept already."""
        idle = idle_seconds()
        with self.lock:
            if self.idle is None and not self.closed and idle > 0:
                self.idle = c
                if math.isfinite(idle):
                    self.timer = threading.Timer(idle, self._expire, (c,))
                    self.timer.name = "shardfeed-subprocess-idle"
                    self.timer.daemon = True
                    self.timer.start()
                return
        c.close()

    def _expire(self, c: ChildProcess) -> None:
        with self.lock:
            if self.idle is not c:
                return  # taken meanwhile
            self.idle = self.timer = None
        c.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            c, self.idle = self.idle, None
            t, self.timer = self.timer, None
        if t is not None:
            t.cancel()
        if c is not None:
            c.close()


__all__ = ["ChildProcess", "Keeper", "Release", "Ring"]

"""The ``in_subprocess`` child: runs the chain above the stage and fills the shared-memory ring.

Started by :class:`~shardfeed.pipeline.process.SubprocessNode` with ``spawn``; see that module
for the protocol. An element goes into a free slot (its arrays, then its pickled structure,
layout, state and, now and then, statistics) and is described in the control block
(:mod:`~shardfeed.pipeline.shm_ring`), with a ``ready`` token; the consumer hands slots back
there too. On the pipe to the consumer, each with a ``ready`` token: ``("end", stats)``,
``("error", pickled, type, text, traceback, stats)``; from it: ``("start", state, epoch,
scope, memory_budget)`` (a pass: one after another, each after the last one's end, so one
child serves every epoch) and ``("stop",)``; on a pipe pair of their own, a full state's
number and its answer.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import faulthandler
import logging
import os
import pickle
import signal
import threading
import time
import traceback
from typing import Any

from ..errors import SubprocessError
from ..formats.native import BytesBuffer
from ..formats.spec import BYTES, FixedLen, RaggedColumn
from . import shm, shm_plan, shm_ring
from .batch import bytes_as_buffers
from .deferred import materialize
from .node import Build, Context
from .stats import PipelineStats

logger = logging.getLogger(__name__)

WAIT_TICK_S = 0.1  # a child waiting for a free slot reads the consumer's messages (a stop) this often
STATS_EVERY_S = 0.05  # the child sends its statistics at most this often (and at the end)
GROWTH = 1.25  # a slot that is too small is replaced by one this much larger than needed
KEPT_STATES = 8  # full states (deferred parts unmade) the child keeps for the consumer to ask for, beyond the slots
STAGE_FIELDS = ("elements", "bytes", "inclusive_s", "work_s", "parallelism", "threaded", "queue_fill_sum",
                "queue_samples", "mix_share_sum", "mix_batches", "extra")


def _snapshot(stats: PipelineStats) -> dict:
    index = {id(s): i for i, s in enumerate(stats.stages)}
    stages = []
    for s in stats.stages:
        d = {f: getattr(s, f) for f in STAGE_FIELDS}
        d["extra"] = {k: list(v) if isinstance(v, list) else v for k, v in s.extra.items()}
        d["name"] = s.name.split(":", 1)[-1]
        d["upstream"] = [index[id(u)] for u in s.upstream if id(u) in index]
        stages.append(d)
    st = stats.storage
    storage = {f: getattr(st, f) for f in st.FIELDS}
    storage["active_s"] = st.active_s
    return {"stages": stages, "storage": storage, "errors": stats.errors.to_dict()}


def buffers_in_child(ds: Any) -> tuple[Any, Any]:
    """``(chain, spec)``: :func:`~shardfeed.pipeline.batch.bytes_as_buffers` of the chain the
    child runs (its bytes columns reach the consumer as :func:`objects_on_arrival` makes them)."""
    return bytes_as_buffers(ds)


def objects_on_arrival(batch: Any, spec: Any) -> Any:
    """A batch of :func:`buffers_in_child`'s chain with each bytes column marked to arrive as
    the object array ``bytes_as="object"`` gives (made by the consumer when first read)."""
    if type(batch) is not dict:
        return batch
    for name, s in spec.items():
        col = batch.get(name)
        if getattr(s, "dtype", None) != BYTES:
            continue
        if isinstance(s, FixedLen) and isinstance(col, BytesBuffer):
            batch[name] = shm.BytesObjects(col, (len(col) // s.size, *s.shape))
        elif isinstance(col, RaggedColumn) and isinstance(col.values, BytesBuffer):
            batch[name] = dataclasses.replace(col, values=shm.BytesObjects(col.values, (len(col.values),)))
    return batch


def _batch_scheduling() -> None:
    """Run the child (and the threads it starts) under Linux's ``SCHED_BATCH``: the same share
    of the CPU, but a wake of the child (an element's slot handed back, a file read) does not
    preempt the task running on that core, most often the trainer's step; the child runs at
    that core's next scheduling point instead. Beside a trainer whose step holds the GIL for
    2 ms and a busy core, four alternated pairs gave the step 1.03x the trainer alone (median;
    1.06x without). ``SHARDFEED_SUBPROCESS_SCHED_BATCH=0`` leaves the child's policy alone."""
    if os.environ.get("SHARDFEED_SUBPROCESS_SCHED_BATCH") == "0" or not hasattr(os, "SCHED_BATCH"):
        return
    try:  # the threads started before (numpy's BLAS pool) too; those started later inherit it
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except OSError:  # refused (a seccomp profile, say), or the thread is gone: as it was
            pass


def child_main(conn: Any, ctrl: Any, payload: bytes, token: str, nslots: int, ring: tuple[str, Any, Any],
               asks: Any = None, answers: Any = None, stack_path: str | None = None,
               slot_bytes: int | None = None) -> None:
    """Run the upstream chain and fill the ring until the end, an error, or a stop. ``ring``:
    the control block's name and the ``ready`` and ``free`` semaphores. ``slot_bytes``: the
    elements in the consumer's slots at once hold about this many bytes at most (never fewer
    than :data:`~shardfeed.pipeline.shm_ring.MIN_IN_FLIGHT` elements; ``None``: every slot may be in use)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle
    _batch_scheduling()
    stack_file = None
    if stack_path is not None:  # a consumer that gives up waiting asks where we are (C level: even stuck)
        stack_file = open(stack_path, "w")  # noqa: SIM115 - open for the child's whole life
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    segments: list[Any] = [None] * nslots
    gens = [-1] * nslots
    ctl_name, ready, free = ring
    block = shm_ring.open_block(ctl_name, nslots)
    last_kinds: Any = None
    kinds_bytes = b""
    ctx: Context | None = None
    kept: collections.OrderedDict[int, Any] = collections.OrderedDict()  # ref -> full state of an element sent
    kept_lock = threading.Lock()

    def answer_questions() -> None:
        """The consumer's questions for a full state, answered while elements are made (the
        kept states are snapshots: making them here does not touch the pass)."""
        try:
            while True:
                ref = asks.recv()
                with kept_lock:
                    full = kept.get(ref)
                try:
                    made = materialize(full) if full is not None else None
                except Exception:  # noqa: BLE001 - the consumer falls back to the state it has
                    logger.exception("in_subprocess child: making a state's deferred parts failed")
                    made = None
                answers.send((ref, made))
        except (EOFError, OSError, ValueError):
            return  # the consumer is gone or closed the pipes

    if asks is not None:
        threading.Thread(target=answer_questions, name="shardfeed-subprocess-states", daemon=True).start()
    try:
        try:
            ds = pickle.loads(payload)
        except Exception as exc:
            raise SubprocessError(
                f"the child process could not unpickle the chain above in_subprocess ({type(exc).__name__}: "
                f"{exc}): every function in it must be importable in a fresh interpreter (defined in a module or "
                "script file, not in a notebook or an interactive session)") from exc
        ds, objects = buffers_in_child(ds)
        refs = 0
        while True:  # one pass per "start" (an epoch, a new iterator): the process and its slots stay
            start = _take_messages(ctrl, block=True)
            if start is True:
                return
            _, state, epoch, scope, budget = start
            ctx = Context(budget)
            root = ds._build(Build(ctx, raw=False, epoch=epoch, scope=scope), state)
            ctx.on_close(root.close)
            last_stats = time.perf_counter()
            while True:
                if _take_messages(ctrl, block=False):
                    return
                try:
                    x = next(root)
                except StopIteration:
                    conn.send(("end", _snapshot(ctx.stats)))
                    ready.release()
                    ctx.close()
                    ctx = None
                    break  # the consumer may still ask for the last elements' full states, or start a pass
                # deferred parts left out (made for every element they would cost what deferring
                # saves); the full state kept a while, made if the consumer asks for it
                full = root.get_state()
                state = materialize(full, make=False)
                ref = None
                if state is not full:
                    refs += 1
                    ref = refs
                    with kept_lock:
                        kept[ref] = full
                        while len(kept) > nslots + KEPT_STATES:
                            kept.popitem(last=False)
                t = time.perf_counter()
                if objects is not None:
                    x = objects_on_arrival(x, objects)
                structure, arrays, layout, size = shm.encode(x)
                del x
                kinds, numbers = shm_plan.split_layout(layout)
                if kinds != last_kinds:  # the consumer compares bytes: the same kinds, the same bytes
                    last_kinds, kinds_bytes = kinds, pickle.dumps(kinds, protocol=pickle.HIGHEST_PROTOCOL)
                state_bytes = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
                work_s = time.perf_counter() - t
                # backpressure: wait for the consumer to hand a slot back (and, with a budget of
                # bytes, for fewer of them to be in its hands than the budget holds of these)
                limit = None if slot_bytes is None else shm_ring.in_flight_limit(nslots, slot_bytes, size)
                k = _free_slot(block, free, ctrl, limit)
                if k is None:
                    return
                t = time.perf_counter()
                snap = b""
                if t - last_stats >= STATS_EVERY_S:
                    snap, last_stats = pickle.dumps(_snapshot(ctx.stats), protocol=pickle.HIGHEST_PROTOCOL), t
                blobs = (array.array("q", numbers).tobytes(), structure, kinds_bytes, state_bytes, snap)
                at = shm.align(size)
                need = at + sum(len(b) for b in blobs)
                seg = segments[k]
                if seg is None or seg.size < need:
                    new = shm.create(shm.slot_name(token, k, gens[k] + 1), int(need * GROWTH) + 4096)
                    if seg is not None:  # the consumer is done with it: it handed this slot back
                        seg.close()
                        seg.unlink()
                    segments[k] = new
                    gens[k] += 1
                buf = segments[k].buf
                shm.write(buf, arrays, layout)
                del arrays
                pos = at
                for b in blobs:
                    buf[pos:pos + len(b)] = b
                    pos += len(b)
                del buf
                work_s += time.perf_counter() - t
                block.publish(k, gens[k], size, ref, at, tuple(len(b) for b in blobs), work_s)  # type: ignore[arg-type]
                ready.release()
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return  # the consumer is gone
    except BaseException as exc:  # noqa: BLE001 - carried to the consumer
        tb = traceback.format_exc()
        try:
            blob = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(blob)
        except Exception:  # noqa: BLE001 - sent as its type, text and traceback
            blob = None
        try:
            conn.send(("error", blob, f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), tb,
                       _snapshot(ctx.stats) if ctx is not None else None))
            ready.release()
        except (OSError, ValueError):
            pass
    finally:
        if ctx is not None:
            ctx.close()
        for seg in segments:
            if seg is not None:
                seg.close()  # the consumer removes the segments
        for c in (conn, ctrl, asks, answers):
            if c is not None:
                c.close()
        if stack_file is not None:
            faulthandler.unregister(signal.SIGUSR1)
            stack_file.close()


def _take_messages(ctrl: Any, block: bool) -> Any:
    """Read the consumer's messages: True when it asked to stop or is gone, a ``("start",
    ...)`` message when it asks for a pass (it sends one only while no pass runs), else
    False. ``block``: wait for one (a start, between passes)."""
    try:
        if block or ctrl.poll():
            msg = ctrl.recv()
            return True if msg[0] == "stop" else msg
    except (EOFError, OSError):
        return True
    return False


def _free_slot(block: Any, free: Any, ctrl: Any, limit: int | None = None) -> int | None:
    """A slot the consumer has handed back, or None when it asked to stop or is gone
    meanwhile. Blocks on ``free`` (the consumer posts it while this says it sleeps), in
    ticks. It does not poll the counts with short sleeps instead: on a machine with no idle
    core each of those wakes takes the trainer's core from it (its Python step measured
    1.6-2.2x longer beside a busy core, against 1.0-1.1x blocking)."""
    while True:
        k = block.free_slot(limit)
        if k is not None:
            return k
        if _take_messages(ctrl, block=False):
            return None
        block.sleeping(True)
        if block.free_slot(limit) is None:  # none handed back since the word was set
            free.acquire(timeout=WAIT_TICK_S)
        block.sleeping(False)
        while free.acquire(False):  # posts of hand-backs already counted
            pass


__all__ = ["child_main", "STAGE_FIELDS"]

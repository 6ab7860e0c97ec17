"""The local runner: rows converted by a pool of ``read_parallel_num`` threads (default;
Pillow releases the GIL while decoding, resizing and encoding) or processes, shards
written in row order, each committed by one of ``write_parallel_num`` threads.

Rows travel to workers in chunks (never one by one: a hand-off between cores costs more
than a small image) of about ``CHUNK_BYTES`` of records (``chunk_rows``), at most a few
chunks per worker ahead, so memory stays bounded. A worker returns its chunk's records
already framed in one buffer (``convert_rows``); the caller's thread hands it to one
writing thread, which appends it to its shard (one write per chunk) while the next chunk
converts. The caller's thread converts the first chunk itself, and every chunk while rows
cost less than ``INLINE_ROW_SECONDS`` of CPU each (images stored as they are), instead of
the workers: the same chunks, in the same order, so the output is the same either way.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..errors import ShardfeedError
from ..formats.bufpool import pass_closed
from ..progress import progress_bar
from ..storage.urls import parse_url
from .plan import Plan, Shard
from .tasks import make_converter
from .writer import FramedRows, ShardSink, convert_rows, finished_state, remove_staging

logger = logging.getLogger(__name__)

CHUNK_ROWS = 16  # rows of the first chunks
CHUNK_BYTES = 4 << 20  # then as many rows as give about this many bytes of records
MAX_CHUNK_ROWS = 256
WRITES_AHEAD = 2  # chunks waiting for the writing thread at most
# Rows that cost less CPU than this (moving average) are converted by the caller's thread
# (the one that hands chunks to the writing thread): for images stored as they are (tens of microseconds of Python and
# a copy each) the hand-over to worker threads and the GIL traffic between them cost about
# as much as the work. Rows that decode and resize (milliseconds,
# GIL released in Pillow) go to the workers.
INLINE_ROW_SECONDS = 200e-6
_worker_converter: Any = None  # per process, built once by the pool initializer


class ConversionWorkerDied(ShardfeedError, RuntimeError):
    """A process of ``convert(executor="process")`` died mid-job (its pool is broken)."""


def chunk_rows(done_rows: int, done_bytes: int) -> int:
    """Rows in the next chunk: ``CHUNK_ROWS`` until some rows are done, then about
    ``CHUNK_BYTES`` of records at their mean size so far (``CHUNK_ROWS`` to ``MAX_CHUNK_ROWS``
    rows): fewer hand-overs for small records, bounded memory for large ones."""
    if done_rows < CHUNK_ROWS:
        return CHUNK_ROWS
    mean = max(1, done_bytes // done_rows)
    return max(CHUNK_ROWS, min(MAX_CHUNK_ROWS, CHUNK_BYTES // mean))


def _init_process(plan: Plan, storage_options: Mapping[str, Any] | None, parent: int | None = None) -> None:
    global _worker_converter
    _exit_with_parent(parent)
    _worker_converter = make_converter(plan.context(storage_options), plan.has_image)


PARENT_CHECK_S = 1.0
"""How often a conversion worker process looks for its parent."""


WORKER_CHECK_S = 1.0
"""How often the converting process, waiting on a chunk, checks that its worker processes live."""


def _result(fut: Any, pool: Any) -> Any:
    """``fut.result()``, raising :class:`BrokenProcessPool` when a worker process of ``pool``
    has died: a worker killed while it wrote a result leaves part of a message in the result
    pipe, and the executor's thread then waits for the rest for ever, never seeing the death
    (the converting process hung; found by the CI rehearsal, 1 run in 15)."""
    while True:
        try:
            return fut.result(timeout=WORKER_CHECK_S)
        except FuturesTimeout:
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                if proc.exitcode is not None:
                    raise BrokenProcessPool(f"a worker process (pid {proc.pid}) ended with exit code "
                                            f"{proc.exitcode} while the pool was running") from None


def _drop_broken_pool(pool: Any) -> None:
    """Let go of a process pool a worker of which died: its other workers killed, the pool's
    own end of its result pipe closed (so that an executor thread waiting for the rest of a
    message the dead worker began reads the end of the pipe and stops), its shutdown run on a
    daemon thread and waited for a few seconds at most."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        try:
            proc.kill()
            proc.join(timeout=5)
        except (OSError, ValueError, AttributeError):  # gone already, or closed
            pass
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    try:
        if writer is not None:
            writer.close()
    except OSError:
        pass
    done = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "cancel_futures": True},
                            name="shardfeed-convert-pool-shutdown", daemon=True)
    done.start()
    done.join(timeout=5)


def _exit_with_parent(parent: int | None = None) -> None:
    """End this worker process when the process that started it is gone (killed, say): a
    worker blocked writing results nobody reads would otherwise live on, reparented, with
    its semaphores in /dev/shm, for ever (found from outside: after a SIGKILL of the
    converting process, 4 of 4 runs). A daemon thread notices the parent changed.
    ``parent``: the pid of the process that started the pool; a worker whose parent is
    another already (killed while this one imported, which takes seconds) ends at once
    (before, it took the new parent for its own: 3 of 18 kills in the first seconds)."""
    if parent is None:
        parent = os.getppid()
    elif os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="shardfeed-parent-watch", daemon=True).start()


def _timed_convert_rows(converter: Any, rows: list) -> tuple[FramedRows, float]:
    """``convert_rows`` and the CPU seconds the calling thread spent on it."""
    t = time.thread_time()
    framed = convert_rows(converter, rows)
    return framed, time.thread_time() - t


def _convert_chunk_in_process(rows) -> tuple[FramedRows, float]:
    return _timed_convert_rows(_worker_converter, rows)


def pending_shards(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None,
                   resume: bool) -> tuple[list[Shard], dict[str, dict]]:
    """Shards still to write, and the states of those a resumed job may keep."""
    done: dict[str, dict] = {}
    todo: list[Shard] = []
    for shard in plan.shards:
        st = finished_state(plan, shard, output_dir, storage_options) if resume else None
        if st is not None:
            done[plan.shard_name(shard)] = st
        else:
            todo.append(shard)
    if resume and done:
        logger.info("resume: %d of %d shards already written", len(done), len(plan.shards))
    return todo, done


def run_local(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None = None,
              resume: bool = False, progress: bool = True) -> dict[str, dict]:
    """Write every pending shard of ``plan``; returns the states of all shards by name."""
    try:
        return _run_local(plan, output_dir, storage_options, resume, progress)
    finally:
        pass_closed()  # the framed chunks' pooled blocks (none is held any more): given back once idle


def _run_local(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None, resume: bool,
               progress: bool) -> dict[str, dict]:
    todo, states = pending_shards(plan, output_dir, storage_options, resume)
    removed = remove_staging(plan, output_dir, storage_options)  # before this run stages any
    if removed:  # found from outside: a run killed mid-write left its hidden .tmp, and the resumed one kept it
        logger.info("removed %d staging file(s) of shard writes an earlier run did not finish", removed)
    o = plan.options
    total_rows = sum(len(s.rows) for s in todo)
    if not todo:
        return states
    if o.executor == "process":
        ctx = multiprocessing.get_context("spawn")
        pool: Any = ProcessPoolExecutor(o.read_parallel_num, mp_context=ctx, initializer=_init_process,
                                        initargs=(plan, storage_options, os.getpid()))
        def submit(rows: list) -> Any:
            return pool.submit(_convert_chunk_in_process, rows)
    else:
        converter = make_converter(plan.context(storage_options), plan.has_image)
        pool = ThreadPoolExecutor(o.read_parallel_num, thread_name_prefix="shardfeed-convert")
        def submit(rows: list) -> Any:
            return pool.submit(_timed_convert_rows, converter, rows)
    committer = ThreadPoolExecutor(o.write_parallel_num, thread_name_prefix="shardfeed-commit")
    # one thread appends the chunks to their shards, in order, while the next chunk converts
    writer = ThreadPoolExecutor(1, thread_name_prefix="shardfeed-write")
    writes: collections.deque[Future] = collections.deque()
    # a video gives many records: hand videos over one by one so few are held at once
    video = o.model_type == "VIDEO_CLASSIFICATION"
    window = max(4, 4 * o.read_parallel_num)
    inflight: collections.deque[tuple[int, list, Future]] = collections.deque()
    commits: list[Future] = []
    sinks: dict[int, ShardSink] = {}
    closing: list[ShardSink] = []  # shards whose last chunk is handed to the writing thread
    remaining = {si: len(shard.rows) for si, shard in enumerate(todo)}
    si_next, row_next = 0, 0  # where the next chunk starts
    done_rows = done_bytes = 0  # rows converted so far and their framed bytes: the chunk size
    row_cpu: float | None = None  # recent CPU seconds per row (moving average)
    may_inline = o.executor != "process" and not video
    inline_chunks = 0
    start = time.perf_counter()
    bar = progress_bar(total=total_rows, desc="convert", unit="row", disable=not progress)

    failed: list[BaseException] = []  # the writing thread's first failure: it does nothing after
    local = parse_url(output_dir).is_local

    def write_chunk(sink: ShardSink, rows: list, framed: FramedRows) -> None:
        if failed:
            raise RuntimeError("not written: an earlier write failed") from failed[0]
        try:
            sink.add_framed(rows, framed)
        except BaseException as exc:
            failed.append(exc)
            raise

    def commit_shard(sink: ShardSink) -> Future:
        if failed:  # a shard that missed a chunk is never committed
            raise RuntimeError("not committed: an earlier write failed") from failed[0]
        if local:  # a rename and two small files: not worth a hop to another thread
            done: Future = Future()
            done.set_result(sink.commit())
            return done
        return committer.submit(sink.commit)  # uploads: in parallel, while the next shard is written

    def next_rows() -> tuple[int, list]:
        nonlocal si_next, row_next
        si = si_next
        per = 1 if video else chunk_rows(done_rows, done_bytes)
        rows = todo[si].rows[row_next:row_next + per]
        row_next += len(rows)
        if row_next >= len(todo[si].rows):
            si_next, row_next = si_next + 1, 0
        return si, rows

    try:
        while si_next < len(todo) or inflight:
            # the first chunk is converted here, to learn what a row costs (no worker thread
            # starts for a job of cheap rows)
            cheap = may_inline and (row_cpu is None or row_cpu < INLINE_ROW_SECONDS)
            while not cheap and si_next < len(todo) and len(inflight) < window:
                si, rows = next_rows()
                inflight.append((si, rows, submit(rows)))
            if inflight:
                si, rows, fut = inflight.popleft()
                framed, cpu = _result(fut, pool)
            else:  # cheap rows: converted here, in order, without hand-overs
                si, rows = next_rows()
                framed, cpu = _timed_convert_rows(converter, rows)
                inline_chunks += 1
            if rows:
                per_row = cpu / len(rows)
                row_cpu = per_row if row_cpu is None else 0.7 * row_cpu + 0.3 * per_row
            sink = sinks.get(si)
            if sink is None:
                sink = sinks[si] = ShardSink(plan, todo[si], output_dir, storage_options)
            writes.append(writer.submit(write_chunk, sink, rows, framed))
            while len(writes) > WRITES_AHEAD or (writes and writes[0].done()):
                writes.popleft().result()  # a failed write raises here
            done_rows += len(rows)
            done_bytes += len(framed.frames)
            remaining[si] -= len(rows)
            bar.update(len(rows))
            if remaining[si] == 0:  # committed once its writes are done
                closing.append(sinks.pop(si))
                commits.append(writer.submit(commit_shard, closing[-1]))
        for w in writes:
            w.result()
        for f in commits:
            st = f.result().result()
            states[st["file"]] = st
    except BaseException as exc:
        for _, _, f in inflight:
            f.cancel()
        died = exc if isinstance(exc, BrokenProcessPool) else None
        if died is not None:
            _drop_broken_pool(pool)
            pool = None
        # nothing writes or commits when the unfinished shards are dropped (abort leaves a
        # committed shard alone: a resumed job keeps it)
        writer.shutdown(wait=True, cancel_futures=True)
        committer.shutdown(wait=True)
        for sink in [*sinks.values(), *closing]:
            sink.abort()
        if died is not None:
            shards = sorted({plan.shard_name(todo[i]) for i in [*(i for i, _, _ in inflight), *sinks]})
            raise ConversionWorkerDied(
                "a conversion worker process died (killed, or out of memory) while converting rows of "
                f"{', '.join(shards[:4]) or 'the job'}{' ...' if len(shards) > 4 else ''}; the shards committed "
                "so far are kept: run the same conversion again with resume=True to finish it") from died
        raise
    finally:
        bar.close()
        if pool is not None:  # a broken one was let go of above
            pool.shutdown(wait=True, cancel_futures=True)
        writer.shutdown(wait=True)
        committer.shutdown(wait=True)
    elapsed = time.perf_counter() - start
    logger.info("converted %d rows in %.1f s (%.0f rows/s; %d chunks converted by the calling thread)",
                total_rows, elapsed, total_rows / max(elapsed, 1e-9), inline_chunks)
    return states

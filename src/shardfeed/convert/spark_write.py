"""Job 2 of a Spark conversion, the write path: rows placed in their shards (in SQL or a
vectorized Python step), the write tasks' count, and a write task converting, framing and
committing its run of shards (see :mod:`shardfeed.convert.runner_spark`).
"""

from __future__ import annotations

import collections
import json
import pickle
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .options import SPLITS
from .plan import Plan, Shard
from .runner_local import CHUNK_ROWS
from .spark_plan import RowFix
from .tasks import make_converter
from .writer import ShardSink, convert_row, convert_rows, finished_state

WRITE_TASKS_PER_CORE = 4
WRITE_TASK_ROWS = 1024  # rows a write task gets at least, where more tasks than cores would give fewer


def write_tasks(shards: int, cores: int, rows: int) -> int:
    """Spark tasks job 2 writes ``shards`` shards of ``rows`` rows in all with: one per
    executor core at least, more while each keeps ``WRITE_TASK_ROWS`` rows, at most
    ``WRITE_TASKS_PER_CORE`` per core, never more than the shards (each task writes a
    contiguous run of shards). A Python task costs tens of milliseconds of its own (the
    worker handed a task, the function unpickled, the Arrow stream and the converting
    threads set up): one task per 64-image shard spent more than the images took, and 8
    tasks for 5,000 images still paid it 4 times a core; a few tasks per core of a large
    input keep the cores busy to the end of the job."""
    cores = max(1, cores)
    wanted = min(WRITE_TASKS_PER_CORE * cores, max(cores, rows // WRITE_TASK_ROWS))
    return max(1, min(shards, wanted))


# ``conv``: null where ``row`` is a pickled Row the write task converts; 1 where it is the
# row's one record, converted on the map side; 2 where it is a pickled (records, reason,
# row) converted there (a discarded row, or several records)
PLACED = "task int, pos int, part int, row binary, wtask int, conv byte"
_CONVERTERS: dict[str, Any] = {}  # per Python worker: one converter per plan


def _converter(plan: Plan, storage_options: Mapping[str, Any] | None) -> Any:
    conv = _CONVERTERS.get(plan.plan_digest)
    if conv is None:
        _CONVERTERS.clear()
        conv = _CONVERTERS[plan.plan_digest] = make_converter(plan.context(storage_options), plan.has_image)
    return conv


def converts_early(plan: Plan) -> bool:
    """Whether job 2 converts rows on its map side (where the input's partitions are),
    carrying records through the shuffle: for inputs without images, whose records are
    about the size of their rows. A shard is written by one task, so a table converted
    there used one core for a split of one shard (20,000 rows at
    ``num_samples_per_tfrecord=20000``); an image input converts in the write tasks, so
    images are not carried through the shuffle."""
    return not plan.has_image and plan.options.model_type != "VIDEO_CLASSIFICATION"


def _early(plan: Plan, storage_options: Mapping[str, Any] | None, fix: RowFix, parts: Any, blobs: Any
           ) -> tuple[Any, Any]:
    """The ``row`` and ``conv`` columns of rows converted on the map side."""
    import pyarrow as pa

    converter = _converter(plan, storage_options)
    out: list[bytes] = []
    kinds: list[int] = []
    for part, blob in zip(parts.to_pylist(), blobs.to_pylist()):
        row = fix(blob, part)
        records, reason = convert_row(converter, row)
        if records is not None and len(records) == 1:
            out.append(records[0])
            kinds.append(1)
        else:
            out.append(pickle.dumps((records, reason, row), protocol=pickle.HIGHEST_PROTOCOL))
            kinds.append(2)
    return pa.array(out, pa.binary()), pa.array(kinds, pa.int8())


def _place(starts: Any, per: int, task_of: list[Any], group_of: Any, early: tuple | None,
           batches: Iterable[Any]) -> Iterator[Any]:
    """Job 2's map side, vectorized per Arrow batch: each row's shard task (-1: a shard
    already written, dropped), its position in that shard, from its partition's start
    in its split (``starts[part, split]``) and its position there, and the write task
    (``group_of[task]``) that writes the shard. With ``early`` (``(plan, storage_options,
    RowFix)``, see :func:`converts_early`) each kept row is converted here."""
    import numpy as np
    import pyarrow as pa

    for b in batches:
        part = b.column(0).to_numpy()
        split = b.column(1).to_numpy().astype(np.int64)
        g = starts[part, split] + b.column(2).to_numpy()
        shard = g // per
        task = np.full(len(g), -1, np.int32)
        for si, table in enumerate(task_of):
            m = split == si
            if m.any():
                task[m] = table[shard[m]]
        keep = task >= 0
        if not keep.any():
            continue
        idx = pa.array(np.flatnonzero(keep))
        kept = task[keep]
        parts, rows = b.column(0).take(idx), b.column(3).take(idx)
        if early is not None:
            rows, conv = _early(*early, parts, rows)
        else:
            conv = pa.nulls(len(kept), pa.int8())
        yield pa.RecordBatch.from_arrays(
            [pa.array(kept), pa.array((g % per)[keep].astype(np.int32)), parts, rows, pa.array(group_of[kept]), conv],
            names=["task", "pos", "part", "row", "wtask", "conv"])


SQL_PLACE_MAX = 4096  # the most constants (partition starts, shard tasks) job 2's map side places rows with in SQL


def place_in_sql(frame: Any, starts: Any, per: int, task_of: list[Any], group_of: Any) -> Any | None:
    """:func:`_place` as Spark SQL expressions over job 1's cached rows, for rows the
    write tasks convert (an image input): the map side then runs in the executors' JVMs,
    with no Python task per input partition (their start, and an Arrow stream each way,
    cost more than placing a few thousand rows). The starts and the shard-to-task tables
    are array constants in the plan, so None (place them in Python) where they hold more
    than :data:`SQL_PLACE_MAX` values."""
    import numpy as np

    tasks = np.concatenate(task_of)
    if starts.size + tasks.size + len(group_of) > SQL_PLACE_MAX:
        return None
    bases = np.cumsum([0] + [len(t) for t in task_of[:-1]])

    def array(values: Any) -> str:
        return "array(" + ", ".join(f"{int(v)}L" for v in values) + ")"

    g = f"(element_at({array(starts.reshape(-1))}, part * {len(SPLITS)} + split + 1) + pos)"
    at = f"cast(element_at({array(bases)}, split + 1) + {g} div {per} + 1 as int)"  # shard's place in ``tasks``
    task = f"cast(element_at({array(tasks)}, {at}) as int)"
    return (frame.selectExpr(f"{task} as task", f"cast({g} % {per} as int) as pos", "part", "row")
            .where("task >= 0")
            .selectExpr("task", "pos", "part", "row", f"cast(element_at({array(group_of)}, task + 1) as int) as wtask",
                        "cast(null as tinyint) as conv"))


def _chunked(items: Iterable[tuple], per: int) -> Iterator[tuple]:
    """``items`` with each run of ``("row", p, row)`` of one shard gathered into
    ``("rows", [p, ...], [row, ...])`` chunks of at most ``per`` rows (a chunk never spans
    two shards); the other items as they are."""
    ps: list[int] = []
    rows: list[Any] = []
    for it in items:
        if it[0] == "row":
            ps.append(it[1])
            rows.append(it[2])
            if len(rows) >= per:
                yield ("rows", ps, rows)
                ps, rows = [], []
            continue
        if rows:
            yield ("rows", ps, rows)
            ps, rows = [], []
        yield it
    if rows:
        yield ("rows", ps, rows)


def _convert_chunk(converter: Any, it: tuple) -> tuple:
    """A ``("rows", ps, rows)`` chunk with its :class:`~shardfeed.convert.writer.FramedRows`
    appended (the local runner's framed path: records encoded in pieces and framed, CRCs
    included, in one native pass); ``None`` where the rows are not converted (a shard
    already written: its rows are only counted)."""
    if it[0] != "rows":
        return it
    rows = it[2]
    return (*it, None if rows[0] is None else convert_rows(converter, rows))


def _converted(items: Iterable[tuple], converter: Any, threads: int) -> Iterator[tuple]:
    """``items`` (see :func:`_chunked`) in order, each chunk converted
    (:func:`_convert_chunk`) by ``threads`` threads (Pillow releases the GIL while decoding,
    resizing and encoding; a thread reading one image overlaps another's decode), at most a
    few chunks ahead. One thread: converted here, in order."""
    if threads <= 1:
        for it in items:
            yield _convert_chunk(converter, it)
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(threads, thread_name_prefix="shardfeed-spark-convert")
    inflight: collections.deque[Any] = collections.deque()
    try:
        for it in items:
            inflight.append(pool.submit(_convert_chunk, converter, it) if it[0] == "rows" else it)
            while len(inflight) > 4 * threads:
                got = inflight.popleft()
                yield got if isinstance(got, tuple) else got.result()
        while inflight:
            got = inflight.popleft()
            yield got if isinstance(got, tuple) else got.result()
    finally:
        for f in inflight:
            if not isinstance(f, tuple):
                f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def _write_shards(plan: Plan, shards: list[tuple[str, int, int, int]], fix: RowFix, output_dir: str,
                  storage_options: Mapping[str, Any] | None, job: str, resume: bool,
                  batches: Iterable[Any]) -> Iterator[Any]:
    """Job 2's reduce side: the rows of one write task's shards (a contiguous run; where
    Spark lacks ``repartitionById``, maybe several runs), in shard order; each shard is
    converted (unless the map side converted its rows) and committed, or, when an attempt
    of this job (or with ``resume`` an earlier job of the same plan) committed it already,
    its state returned as it is. Rows are converted in chunks, as the local runner's are
    (:func:`~shardfeed.convert.writer.convert_rows`: records framed in one buffer, appended
    with one write), for an image input by ``read_parallel_num`` threads, in order."""
    import pyarrow as pa

    from ..formats.bufpool import pass_closed

    def emit(state: dict) -> Any:
        return pa.RecordBatch.from_arrays([pa.array([json.dumps(state).encode()], pa.binary())], names=["state"])

    def staged() -> Iterator[tuple]:
        """("shard", task, shard, expected, done) where a shard's rows start, then
        ("row", position, row): the row unpickled where its shard is to be written (else
        None), or ("conv", position, row, (records, reason)) for a row converted on the
        map side."""
        current = -1
        done: dict | None = None
        for b in batches:
            for task, p, part, blob, conv in zip(b.column(0).to_pylist(), b.column(1).to_pylist(),
                                                 b.column(2).to_pylist(), b.column(3).to_pylist(),
                                                 b.column(5).to_pylist()):
                if task != current:
                    current = task
                    split, number, count, expected = shards[task]
                    shard = Shard(split, number, count, [])
                    done = finished_state(plan, shard, output_dir, storage_options)
                    if done is not None and not (resume or done.get("job") == job):
                        done = None
                    yield ("shard", task, shard, expected, done)
                if conv is None:
                    yield ("row", p, fix(blob, part) if done is None else None)
                elif conv == 1:
                    yield ("conv", p, None, ([blob], None))
                else:
                    records, reason, row = pickle.loads(blob)
                    yield ("conv", p, row, (records, reason))

    sink: ShardSink | None = None
    done: dict | None = None
    seen = expected = 0
    shard: Shard | None = None

    def finish() -> Any:
        assert shard is not None
        name = plan.shard_name(shard)
        if seen != expected:
            raise RuntimeError(f"shard {name}: job 1 placed {expected} rows in it, job 2 {seen}: the input did not "
                               "read the same rows twice (cache() a DataFrame built with a non-deterministic step, "
                               "or write it out first)")
        if done is not None:
            return emit(done)
        assert sink is not None
        return emit(sink.commit())

    def arrived(ps: list[int]) -> None:
        nonlocal seen
        assert shard is not None
        if ps[0] != seen or ps[-1] != seen + len(ps) - 1:
            due = next((seen + i for i, p in enumerate(ps) if p != seen + i), seen)
            raise RuntimeError(f"shard {plan.shard_name(shard)}: row {ps[due - seen]} of it came where row {due} "
                               "was due: the input did not read the same rows twice")
        seen += len(ps)

    converter = _converter(plan, storage_options)
    threads = plan.options.read_parallel_num if plan.has_image else 1
    per = 1 if plan.options.model_type == "VIDEO_CLASSIFICATION" else CHUNK_ROWS
    try:
        for item in _converted(_chunked(staged(), per), converter, threads):
            if item[0] == "shard":
                if shard is not None:
                    yield finish()
                _, _, shard, expected, done = item
                seen, sink = 0, None
                if done is None:
                    sink = ShardSink(plan, shard, output_dir, storage_options)
                    sink.extra_state["job"] = job
                continue
            if item[0] == "rows":
                _, ps, rows, framed = item
                arrived(ps)
                if sink is not None:
                    sink.add_framed(rows, framed)
                    shard.rows.extend([None] * len(rows))  # type: ignore[union-attr]  # counted by the state
                continue
            _, p, row, result = item
            arrived([p])
            if sink is not None:
                records, reason = result
                sink.add(row, records, reason)
                shard.rows.append(None)  # type: ignore[union-attr]  # counted by the state; no row is kept
        if shard is not None:
            yield finish()
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    finally:
        pass_closed()  # the framed chunks' pooled blocks, given back once idle

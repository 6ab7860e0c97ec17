"""The Spark runner: rows read, converted and written by Spark executors; the driver only
plans and collects per-task states.

Two Spark jobs; rows reach the executors' Python workers as Arrow batches (``mapInArrow``),
never as pickled ``Row`` objects:

1. *read and count*: input files split into about a partition per core
   (:func:`~shardfeed.convert.spark_session.small_input_splits`); each input partition builds its rows once
   (:class:`~shardfeed.convert.sources.RowBuilder`), puts each in its split by the key rule
   (:func:`~shardfeed.convert.plan.key_split`) and leaves them, pickled, with their split
   and their position among the partition's rows of that split, in a DataFrame the
   executors cache (``persist``); its last row is the partition's summary: rows per split,
   the class names it saw, a digest, and the rows that did not parse. The driver sums the
   summaries into the plan: shards of ``num_samples_per_tfrecord`` rows per split,
   numbered in input order exactly as the local runner numbers them (a partition's rows
   start where the previous partitions' rows end), the label map, the plan digest.
2. *write*: from the cached rows, each row's shard and position in it follow from its
   partition's start (for an image input in Spark SQL over the cached rows,
   :func:`~shardfeed.convert.spark_write.place_in_sql`, so that stage runs in the executors' JVMs with no Python task;
   else a vectorized Python step per Arrow batch); ``repartitionById`` gives each write
   task a contiguous run of the shards still to write (a shuffle of rows, not of images;
   a task per executor core, more while each keeps :data:`~shardfeed.convert.spark_write.WRITE_TASK_ROWS` rows, at most
   :data:`~shardfeed.convert.spark_write.WRITE_TASKS_PER_CORE`, since a Python task has a fixed cost of its own), sorted
   by shard and position; a write task converts each shard's rows in chunks with the local
   runner's converter (:mod:`shardfeed.convert.tasks`) and framing
   (:func:`~shardfeed.convert.writer.convert_rows`: a chunk's records framed, CRCs
   included, in one buffer) and writes the shard with
   :class:`~shardfeed.convert.writer.ShardSink`; for an input without images the map side
   converts the rows instead (:func:`~shardfeed.convert.spark_write.converts_early`: a one-shard split is then still
   converted on every core). The write job runs with adaptive execution off (one Spark job
   with two stages, not a job per stage; the session's setting restored after). The input
   is read once (again only where Spark lost cached blocks, with an executor).

Exactly once: a task attempt writes its shard to its own hidden staging file
(:class:`~shardfeed.storage.io.AtomicWriter`) and commits it by an atomic rename, then
the shard's state file; a shard's bytes are a function of the plan, so two attempts (a
retry, a speculative copy) commit the same bytes, and an attempt that finds the state
file already written by this job (or, with ``resume``, by the same plan) returns it
without writing. A killed attempt leaves only its hidden
staging file, which the driver removes at the end. The driver collects the task states
(counts, discards, file names: small) and writes the manifest with
:func:`~shardfeed.convert.writer.finalize`.

Inputs executors read themselves: a ``pyspark.sql.DataFrame``, Parquet, JSON lines and
CSV files or folders (through ``spark.read``), and an image folder, of which the driver
lists only the top level (and the split folders' entries): each job 1 task lists its label
folders (:func:`~shardfeed.convert.sources.folder_layout`). A PAI annotation CSV and an
iTAG manifest are read in byte ranges planned from the file's size
(:func:`~shardfeed.convert.spark_source.annotation_source`): each job 1 task parses the records that start in its range
with the local runner's parser (:class:`~shardfeed.convert.annotations.AnnotationSpan`)
and numbers them within its partition, as a table's. A quoted CSV cell holding a line
break across a range's start is detected after job 1 (a range's records end past the next
range's first line) and job 1 runs again with the file in one task
(:meth:`~shardfeed.convert.spark_source.SparkSource.check_partitions`). Only a pandas DataFrame's rows are built on the
driver and shipped (:func:`~shardfeed.convert.spark_source.rows_source`).

Where Spark recomputes lost cached blocks the input must read the same rows in the same
order again (files do; a DataFrame built with a non-deterministic step, such as
``randomSplit`` or ``repartition(n)`` of uncached data, must be ``cache()``d or written out
first): the write job checks every shard's rows against job 1's count and fails, naming
the shard, when they differ.

The parts: :mod:`~shardfeed.convert.spark_session` (the session, and the settings a
conversion sets on it for a while), :mod:`~shardfeed.convert.spark_source` (what the
executors read, and how a task makes rows of it), :mod:`~shardfeed.convert.spark_plan`
(job 1 and the plan) and :mod:`~shardfeed.convert.spark_write` (job 2, the write path);
this module runs the two jobs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from .options import SPLITS, ConvertOptions
from .plan import Plan
from .spark_plan import RowFix, plan_on_spark
from .spark_session import ADAPTIVE, executor_pythonpath, is_spark_dataframe, session_conf, spark_session
from .spark_source import SparkSource, annotation_source, open_source, rows_source, storage_url
from .spark_write import PLACED, _place, _write_shards, converts_early, place_in_sql, write_tasks
from .writer import remove_staging

logger = logging.getLogger(__name__)


def run_spark(src: SparkSource, options: ConvertOptions, output_dir: str,
              storage_options: Mapping[str, Any] | None = None, resume: bool = False) -> tuple[Plan, dict[str, dict]]:
    """Plan on the cluster and write every pending shard there; returns the plan and all
    shards' states by name (for :func:`~shardfeed.convert.writer.finalize`)."""
    import numpy as np

    from .runner_local import pending_shards

    sp = plan_on_spark(src, options, storage_options)
    try:
        plan = sp.plan
        todo, states = pending_shards(plan, output_dir, storage_options, resume)
        if todo:
            per = plan.rows_per_shard
            # rows each shard gets: per, and the last of a split the rest
            specs = [(s.split, s.index, s.count, min(per, sp.split_rows[s.split] - s.index * per)) for s in todo]
            task_of = [np.full(max(1, -(-sp.split_rows[split] // per)), -1, np.int32) for split in SPLITS]
            for i, s in enumerate(todo):
                task_of[SPLITS.index(s.split)][s.index] = i
            starts = np.array([[so[split] for split in SPLITS] for so in sp.split_offsets], np.int64).reshape(-1, 3)
            shipped = dataclasses.replace(plan, shards=[], discards=[])
            job = uuid.uuid4().hex  # attempts of this job's tasks trust each other's commits
            fix = RowFix(sp.offsets, src.numbered_in_partition, sp.integer_labels)
            early = (shipped, storage_options, fix) if converts_early(plan) else None
            spark = src.frame.sparkSession
            spark.sparkContext.setJobDescription(f"shardfeed convert: write {len(todo)} shards")
            # shard tasks in contiguous runs, one run per write task (a Spark partition)
            n_write = write_tasks(len(todo), spark.sparkContext.defaultParallelism, sum(spec[3] for spec in specs))
            group_of = (np.arange(len(todo), dtype=np.int64) * n_write // len(todo)).astype(np.int32)
            rows = sp.prepared.where("summary is null")
            placed = place_in_sql(rows, starts, per, task_of, group_of) if early is None else None
            if placed is None:
                placed = rows.mapInArrow(lambda it: _place(starts, per, task_of, group_of, early, it), PLACED)
            # one Spark partition per write task, which writes its shards one after another;
            # without repartitionById (Spark < 4.1) a hash of the write task, and a
            # partition may then write several runs
            by_task = (placed.repartitionById(n_write, "wtask") if hasattr(placed, "repartitionById")
                       else placed.repartition(n_write, "wtask"))
            # adaptive execution off for the write job: it would run the shuffle's map stage
            # as a job of its own and plan the rest again after it (a few hundred
            # milliseconds a conversion), for a shuffle whose partitions are fixed
            # (``n_write``) and whose rows are small (paths, or converted records)
            with session_conf(spark, {ADAPTIVE: "false"}):
                written = by_task.sortWithinPartitions("task", "pos").mapInArrow(
                    lambda it: _write_shards(shipped, specs, fix, output_dir, storage_options, job, resume, it),
                    "state binary").collect()
            for r in written:
                st = json.loads(r[0])
                states[st["file"]] = st
            missing = [plan.shard_name(s) for s in todo if plan.shard_name(s) not in states]
            if missing:
                raise RuntimeError(f"the Spark job finished without writing shard(s) {', '.join(missing[:5])}")
    finally:
        sp.prepared.unpersist()
    removed = remove_staging(plan, output_dir, storage_options)
    if removed:
        logger.info("removed %d staging file(s) of task attempts that did not finish", removed)
    return plan, states


# the Spark runner's surface (api.py and users import it from here); its parts live in
# spark_session (the session and its settings), spark_source (what the executors read),
# spark_plan (job 1: the plan) and spark_write (job 2: the write path)
__all__ = ["SparkSource", "annotation_source", "executor_pythonpath", "is_spark_dataframe", "open_source",
           "plan_on_spark", "rows_source", "run_spark", "spark_session", "storage_url"]

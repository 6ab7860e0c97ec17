"""Job 1 of a Spark conversion: read the input, put each row in its split, count, cache the
rows on the executors, and sum the partitions' summaries into the plan (see
:mod:`shardfeed.convert.runner_spark`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .annotations import row_class_names
from .options import SPLITS, ConvertOptions, DiscardRecord, Row
from .plan import (
    SAMPLE_ROWS,
    Plan,
    assign_split,
    finish_plan,
    is_multi_label,
    needs_class_list,
    sample_key,
    shard_layout,
    size_shards,
)
from .schema import Schema, integer_text
from .spark_session import small_input_splits
from .spark_source import SparkSource, _shipped

# what job 1 leaves (cached) for job 2: a partition's rows, each with its split (an index
# into SPLITS) and its position among the partition's rows of that split, pickled; and last,
# one row holding the partition's summary; ``sample`` ranks a row for the size sample
# (:func:`~shardfeed.convert.plan.sample_key`, only with ``bytes_per_tfrecord``)
PREPARED = "part int, split byte, pos long, row binary, sample long, summary binary"
BATCH_ROWS = 4096


def _batch(part: int, splits: list[int], pos: list[int], blobs: list[bytes], samples: list[int] | None,
           summary: bytes | None = None) -> Any:
    import pyarrow as pa

    n = len(blobs) if summary is None else 1
    none = [None] * n
    return pa.RecordBatch.from_arrays(
        [pa.array([part] * n, pa.int32()),
         pa.array(splits if summary is None else none, pa.int8()),
         pa.array(pos if summary is None else none, pa.int64()),
         pa.array(blobs if summary is None else none, pa.binary()),
         pa.array(samples if samples is not None and summary is None else none, pa.int64()),
         pa.array(none if summary is None else [summary], pa.binary())],
        names=["part", "split", "pos", "row", "sample", "summary"])


def _prepare(src: SparkSource, options: ConvertOptions, batches: Iterable[Any]) -> Iterator[Any]:
    """Job 1's task: build the partition's rows once, give each its split, pickle it for
    job 2, and end with the partition's summary (rows per split, class names, labels, a
    digest, the rows that did not parse)."""
    from pyspark import TaskContext

    part = TaskContext.get().partitionId()
    h = hashlib.sha256()
    n, counts, names, multi = 0, [0, 0, 0], set(), False
    labels = all_int = 0
    discards = []
    mt = options.model_type
    split_index = {s: i for i, s in enumerate(SPLITS)}
    splits: list[int] = []
    pos: list[int] = []
    blobs: list[bytes] = []
    sizing = options.bytes_per_tfrecord is not None
    samples: list[int] | None = [] if sizing else None
    info: dict[str, Any] = {}
    for item in src.rows(batches, info):
        n += 1
        if isinstance(item, DiscardRecord):
            h.update(json.dumps([item.row, item.source, item.reason], ensure_ascii=False).encode() + b"\n")
            own = item.source == f"{src.origin}#{item.row}"
            discards.append((item.row, None if own else item.source, item.reason))
            continue
        assign_split(item, options)
        si = split_index[item.split]
        blob = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        h.update(blob)
        splits.append(si)
        pos.append(counts[si])
        blobs.append(blob)
        counts[si] += 1
        if samples is not None:
            samples.append(sample_key(item, options.seed))
        names.update(row_class_names(mt, item))
        multi = multi or (src.annotated and is_multi_label(mt, item))
        if item.label is not None:
            labels += 1
            all_int += integer_text(item.label)
        if len(blobs) >= BATCH_ROWS:
            yield _batch(part, splits, pos, blobs, samples)
            splits, pos, blobs, samples = [], [], [], [] if sizing else None
    if blobs:
        yield _batch(part, splits, pos, blobs, samples)
    summary = {"index": part, "n": n, "counts": dict(zip(SPLITS, counts)), "names": sorted(names), "multi": multi,
               "labels": labels, "int_labels": all_int, "digest": h.hexdigest(), "discards": discards,
               "source": info}
    yield _batch(part, [], [], [], None, pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL))


@dataclass
class RowFix:
    """What a cached row needs before it is converted: its number made global (a table's
    rows are numbered within their partition) and an integer label where the plan found
    every label an integer."""

    offsets: list[int]
    renumber: bool
    integer_labels: bool

    def __call__(self, blob: bytes, part: int) -> Row:
        row = pickle.loads(blob)
        if self.renumber:
            row.number += self.offsets[part]
        if self.integer_labels:
            row.label = int(row.label)
        return row


@dataclass
class SparkPlan:
    """The plan, and where each input partition's rows start (in all, and per split)."""

    plan: Plan
    offsets: list[int]
    split_offsets: list[dict[str, int]]
    split_rows: dict[str, int]
    integer_labels: bool
    prepared: Any = None  # job 1's output, cached on the executors for job 2


def plan_on_spark(src: SparkSource, options: ConvertOptions, storage_options: Mapping[str, Any] | None
                  ) -> SparkPlan:
    """Run job 1 (its output cached on the executors; input files split by
    :func:`~shardfeed.convert.spark_session.small_input_splits`) and build the plan from the partitions' summaries. The
    caller unpersists ``SparkPlan.prepared``."""
    spark = src.frame.sparkSession
    spark.sparkContext.setJobDescription("shardfeed convert: read rows, place them in splits, count")
    ship = _shipped(src)
    with small_input_splits(spark):
        prepared = src.frame.mapInArrow(lambda it: _prepare(ship, options, it), PREPARED).persist()
        try:
            got = prepared.where("summary is not null").select("summary").collect()
            parts = prepared.rdd.getNumPartitions()  # the cached partitions: planned once, in persist
        except BaseException:
            prepared.unpersist()
            raise
    summaries = sorted((pickle.loads(r[0]) for r in got), key=lambda s: s["index"])
    if [s["index"] for s in summaries] != list(range(parts)):
        prepared.unpersist()
        raise RuntimeError(f"job 1 did not summarize each of the input's {parts} partitions once: got summaries of "
                           f"partitions {[s['index'] for s in summaries][:20]}")
    try:
        again = src.check_partitions([s["source"] for s in summaries])
    except BaseException:
        prepared.unpersist()
        raise
    if again is not None:
        prepared.unpersist()
        return plan_on_spark(again, options, storage_options)
    offsets, split_offsets = [], []
    total = numbered = 0  # rows read; numbers used (a manifest's blank lines have one, and no row)
    per_split = dict.fromkeys(SPLITS, 0)
    discards = list(src.driver_discards)
    h = hashlib.sha256()
    for s in summaries:
        offsets.append(numbered)
        split_offsets.append(dict(per_split))
        origin_numbered = src.numbered_in_partition
        for number, source, reason in s["discards"]:
            row = number + numbered if origin_numbered else number
            discards.append(DiscardRecord(row, source or f"{src.origin}#{row}", reason))
        total += s["n"]
        numbered += s["source"].get("numbers", s["n"])
        for k, v in s["counts"].items():
            per_split[k] += v
        h.update(s["digest"].encode() + b"\n")
    for d in src.driver_discards:
        h.update(json.dumps([d.row, d.source, d.reason], ensure_ascii=False).encode() + b"\n")
    labels = sum(s["labels"] for s in summaries)
    integer_labels = src.detect_integer_labels and labels > 0 and labels == sum(s["int_labels"] for s in summaries)
    schema = src.schema
    if integer_labels:
        schema = Schema({c: ("integer label" if t == "string label" else t) for c, t in schema.columns.items()},
                        schema.defaults, schema.separator)
    label_type = schema.label_type if (schema is not None and not src.annotated) else None
    names = None
    if needs_class_list(options.model_type, label_type, src.annotated):
        names = set().union(*(s["names"] for s in summaries)) if summaries else set()
    multi = any(s["multi"] for s in summaries)
    discards.sort(key=lambda d: d.row)
    rows_read = total + len(src.driver_discards) if src.kind == "rows" else total
    plan = finish_plan([], discards, rows_read, schema, options, src.description, "sha256:" + h.hexdigest(), names,
                       multi, storage_options, src.has_image, src.annotated)
    if options.bytes_per_tfrecord is not None:
        # the SAMPLE_ROWS rows of lowest sample key in all partitions (Spark takes each
        # partition's lowest, then theirs), converted here to measure a record
        spark.sparkContext.setJobDescription("shardfeed convert: sample rows to size shards")
        got = prepared.where("sample is not null").orderBy("sample").limit(SAMPLE_ROWS).select("part", "row").collect()
        fix = RowFix(offsets, src.numbered_in_partition, integer_labels)
        sample = [fix(blob, part) for part, blob in got]
        plan.rows_per_shard = size_shards(plan, sample, storage_options)
    plan.shards = shard_layout(per_split, plan.rows_per_shard)
    return SparkPlan(plan, offsets, split_offsets, per_split, integer_labels, prepared)

"""The Spark runner: rows read, converted and written by Spark executors; the driver only
plans and collects per-task states.

Two Spark jobs, both over the input's own partitions:

1. *count*: each partition builds its rows (:class:`~shardfeed.convert.sources.RowBuilder`),
   puts each in its split by the key rule (:func:`~shardfeed.convert.plan.key_split`) and
   returns a summary: rows per split, the class names it saw, a digest, and the rows that
   did not parse. The driver sums the summaries into the plan: shards of
   ``num_samples_per_tfrecord`` rows per split, numbered in input order exactly as the
   local runner numbers them (a partition's rows start where the previous partitions'
   rows end), the label map, the plan digest.
2. *write*: each partition numbers its rows again from those offsets and sends each to its
   shard (a shuffle of rows, not of images: ``partitionBy`` with one partition per shard
   still to write); each shard task sorts its rows, converts them with the local runner's
   converter (:mod:`shardfeed.convert.tasks`, :func:`~shardfeed.convert.writer.convert_row`)
   and writes the shard with :class:`~shardfeed.convert.writer.ShardSink`.

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
CSV files or folders (through ``spark.read``). An image folder, a PAI annotation CSV and
an iTAG manifest are listed / parsed on the driver (small rows: a path and a label) and
their rows handed to the executors, as Spark's own file listing is done on the driver.

The input must read the same rows in the same order both times (files do; a DataFrame
built with a non-deterministic step, such as ``randomSplit`` or ``repartition(n)`` of
uncached data, must be ``cache()``d or written out first): the write job checks every
shard's row count against the count job's and fails, naming the shard, when they differ.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import storage
from ..storage.urls import mask, parse_url
from .annotations import row_class_names
from .options import SPLITS, ConvertOptions, DiscardRecord, Row
from .plan import Plan, Shard, _canon, assign_split, finish_plan, is_multi_label, needs_class_list, shard_layout
from .schema import AUTOML_COLUMNS, Schema, header_matches_automl
from .sources import RowBuilder, _dirname, default_schema, parquet_parts, table_format
from .tasks import make_converter
from .writer import ShardSink, convert_row, finished_state, join

logger = logging.getLogger(__name__)

CORRUPT = "_shardfeed_corrupt_record"
ROWS_PER_SLICE = 10_000  # rows the driver read itself (folder, annotation file) per Spark partition


def _pyspark():
    try:
        import pyspark
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError("runner='spark' needs pyspark: pip install 'shardfeed[spark]'") from exc
    return pyspark, SparkSession


def is_spark_dataframe(obj: Any) -> bool:
    """Whether ``obj`` is a ``pyspark.sql.DataFrame`` (classic or Spark Connect), without importing pyspark."""
    return type(obj).__module__.startswith("pyspark.sql") and hasattr(obj, "rdd") and hasattr(obj, "columns")


def executor_pythonpath() -> str:
    """The driver's import path for the executors' Python workers: its ``PYTHONPATH`` and
    the ``sys.path`` entries outside the interpreter's own prefix (a source checkout, an
    editable install's ``src``), so executors import the same shardfeed and user converters."""
    prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    entries: list[str] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for p in sys.path:
        full = os.path.realpath(p or os.getcwd())
        if os.path.exists(full) and not full.startswith(prefixes) and full not in entries:
            entries.append(full)
    return os.pathsep.join(entries)


_MASTER_FORMS = ("local", "local[", "local-cluster[", "spark://", "yarn", "k8s://", "mesos://")


def _check_master(master: str) -> None:
    if not master.startswith(_MASTER_FORMS):
        raise ValueError(f"spark_master {master!r} is not a Spark master URL: local[N], local-cluster[N,cores,MB], "
                         "spark://host:port, yarn or k8s://https://host:port")
    if master.startswith("spark://"):
        for hostport in master[len("spark://"):].split(","):
            host, _, port = hostport.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"cannot reach the Spark master {master!r} at {hostport}: {exc}") from None


def spark_session(master: str | None = None, app_name: str = "shardfeed-convert") -> Any:
    """The ``SparkSession`` to convert with: the running one (``spark-submit``, Databricks,
    a notebook) when ``master`` is None or names it, else a new one on ``master``
    (default ``local[*]``) whose executors run this interpreter with this process's import
    path (``spark.executorEnv.PYTHONPATH``, see :func:`executor_pythonpath`).

    Raises ``ImportError`` without pyspark, ``RuntimeError`` naming the cause when Java is
    missing or Spark does not start on ``master`` (a wrong URL, an unreachable master),
    ``ValueError`` when another session on another master is running in this process.
    """
    pyspark, SparkSession = _pyspark()
    active = SparkSession.getActiveSession()
    if active is None:
        inst = getattr(SparkSession, "_instantiatedSession", None)
        if inst is not None and getattr(inst.sparkContext, "_jsc", None) is not None:
            active = inst
    if active is not None:
        if master is None or active.sparkContext.master == master:
            return active
        raise ValueError(f"a SparkSession on master {active.sparkContext.master!r} is running in this process; "
                         f"Spark allows one, so spark_master={master!r} cannot start another: leave spark_master "
                         "out to use the running one, or stop it first")
    master = master or "local[*]"
    _check_master(master)
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise RuntimeError("runner='spark' needs Java 17 or newer (Spark runs in a JVM) and found none on PATH "
                           "nor JAVA_HOME: install it (Debian/Ubuntu: apt-get install default-jre-headless; "
                           "scripts/system-deps.sh test does) or set JAVA_HOME")
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    # pyspark starts the executors' Python workers with PYSPARK_PYTHON (default: python3 on PATH)
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app_name).master(master)
               .config("spark.pyspark.python", python)
               .config("spark.executorEnv.PYTHONPATH", executor_pythonpath())
               .config("spark.ui.showConsoleProgress", "false"))
    try:
        return builder.getOrCreate()
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        raise RuntimeError(f"Spark did not start on master {master!r}: {type(exc).__name__}: "
                           f"{' '.join(msg[:3])[:400]}") from exc


# -- what the executors read ----------------------------------------------------------------------------------------

@dataclass
class SparkSource:
    """An input as the executors see it: an RDD of ``{column: cell}`` dicts (``kind="table"``)
    or of :class:`Row` objects the driver built (``kind="rows"``), and how to make rows of it."""

    rdd: Any
    kind: str
    schema: Schema | None
    origin: str
    base: str | None
    description: str
    driver_discards: list[DiscardRecord] = dataclasses.field(default_factory=list)
    annotated: bool = False
    has_image: bool = True
    detect_integer_labels: bool = False

    def rows(self, items: Iterable[Any], offset: int) -> Iterator[Row | DiscardRecord]:
        """Rows (or discard records) of one partition, numbered from ``offset + 1``."""
        if self.kind == "rows":
            yield from items
            return
        builder = RowBuilder(self.schema, self.origin, self.base)
        for i, cells in enumerate(items, start=offset + 1):
            bad = cells.pop(CORRUPT, None)
            if bad is not None:
                found = len(next(csv.reader([bad]), []))
                yield builder.build(i, None, f"expected {len(cells)} cells, found {found}")
                continue
            yield builder.build(i, cells, None)


def _table_source(df: Any, schema: Schema | None, origin: str, base: str | None, description: str) -> SparkSource:
    columns = [c for c in df.columns if c != CORRUPT]
    used = schema or default_schema(columns, "the DataFrame" if origin == "<DataFrame>" else origin)
    absent = [c for c in used.columns if c not in columns]
    if absent:
        raise ValueError(f"{origin}: schema names columns the input lacks: {', '.join(absent)} (columns: {columns})")
    first = columns[0] if columns else None

    def cells(row: Any) -> dict:
        d = row.asDict()
        v = d.get(first)
        if isinstance(v, str) and v.startswith("\ufeff"):  # a BOM Spark's CSV reader kept
            d[first] = v[1:]
        return d

    return SparkSource(df.rdd.map(cells), "table", used, origin, base, description,
                       has_image=used.column_of("image_uri") is not None,
                       detect_integer_labels=schema is None and used.label_type == "string label")


def storage_url(url: str) -> str:
    """``url`` as shardfeed's storage layer opens it: Hadoop's ``s3a://`` / ``s3n://`` are ``s3://``."""
    for hadoop in ("s3a://", "s3n://"):
        if url.startswith(hadoop):
            return "s3://" + url[len(hadoop):]
    return url


def _csv_frame(spark: Any, url: str, schema: Schema | None, storage_options: Mapping[str, Any] | None) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    head = storage.read_bytes(storage_url(url), 0, 64 << 10, storage_options=storage_options)
    head = head.decode("utf-8-sig", "replace")
    first = next((r for r in csv.reader(io.StringIO(head)) if r and any(c.strip() for c in r)), [])
    first = [c.strip() for c in first]
    header = header_matches_automl(first) or (schema is not None and set(schema.columns) <= set(first))
    columns = first if header else (list(schema.columns) if schema is not None else list(AUTOML_COLUMNS))
    struct = StructType([StructField(c, StringType()) for c in columns] + [StructField(CORRUPT, StringType())])
    return (spark.read.schema(struct).option("header", str(bool(header)).lower()).option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT).option("emptyValue", "").csv(url))


def open_source(spark: Any, source: Any, schema: Schema | None, storage_options: Mapping[str, Any] | None,
                is_folder: bool) -> SparkSource:
    """What the executors read for ``source``: a Spark DataFrame, or a URL Spark reads
    (Parquet, JSON lines, CSV; a folder of Parquet parts), or an image folder listed here."""
    if is_spark_dataframe(source):
        return _table_source(source, schema, "<DataFrame>", None,
                             f"Spark DataFrame with columns {list(source.columns)}")
    url = str(source)
    desc = mask(url)
    if is_folder:
        if parquet_parts(storage_url(url), storage_options):
            return _table_source(spark.read.parquet(url), schema, desc, storage_url(url).rstrip("/"), desc)
        if schema is not None:
            raise ValueError("a schema applies to tables; an image folder has no columns")
        from .sources import read_image_folder

        rows, discards, used = read_image_folder(storage_url(url), storage_options)
        return rows_source(spark, rows, discards, used, desc, detect_integer_labels=True)
    fmt = table_format(storage_url(url), storage_options)
    if fmt == "parquet":
        frame = spark.read.parquet(url)
    elif fmt == "json":
        frame = spark.read.json(url)
    else:
        frame = _csv_frame(spark, url, schema, storage_options)
    return _table_source(frame, schema, desc, _dirname(storage_url(url)), desc)


def rows_source(spark: Any, rows: list[Row], discards: list[DiscardRecord], schema: Schema | None,
                description: str, annotated: bool = False, detect_integer_labels: bool = False) -> SparkSource:
    """Rows the driver read (an image folder's files, an annotation file's records), in
    slices of ``ROWS_PER_SLICE`` for the executors."""
    sc = spark.sparkContext
    slices = max(1, min(len(rows) // ROWS_PER_SLICE + 1, 10_000), sc.defaultParallelism if rows else 1)
    has_image = annotated or (schema is not None and schema.column_of("image_uri") is not None)
    return SparkSource(sc.parallelize(rows, slices), "rows", schema, "", None, description, list(discards),
                       annotated, has_image, detect_integer_labels and schema is not None
                       and schema.label_type == "string label")


def _shipped(src: SparkSource) -> SparkSource:
    """What the tasks need of ``src`` (not the RDD, nor the driver's discards)."""
    return dataclasses.replace(src, rdd=None, driver_discards=[])


# -- job 1: count ---------------------------------------------------------------------------------------------------

def _row_digest(h: Any, item: Row | DiscardRecord) -> None:
    if isinstance(item, Row):
        h.update(json.dumps(_canon([item.number, item.origin, item.image_uri, item.split, item.label, item.values,
                                    item.annotation]), ensure_ascii=False, sort_keys=True).encode())
    else:
        h.update(json.dumps([item.row, item.source, item.reason], ensure_ascii=False).encode())
    h.update(b"\n")


def _summarize(src: SparkSource, options: ConvertOptions, index: int, items: Iterable[Any]) -> Iterator[dict]:
    h = hashlib.sha256()
    n, counts, names, multi = 0, dict.fromkeys(SPLITS, 0), set(), False
    labels = all_int = 0
    discards = []
    mt = options.model_type
    for item in src.rows(items, 0):
        n += 1
        _row_digest(h, item)
        if isinstance(item, DiscardRecord):
            own = item.source == f"{src.origin}#{item.row}"
            discards.append((item.row, None if own else item.source, item.reason))
            continue
        assign_split(item, options)
        counts[item.split] += 1
        names.update(row_class_names(mt, item))
        multi = multi or (src.annotated and is_multi_label(mt, item))
        if item.label is not None:
            labels += 1
            all_int += isinstance(item.label, str) and item.label.strip().lstrip("-").isdigit()
    yield {"index": index, "n": n, "counts": counts, "names": sorted(names), "multi": multi,
           "labels": labels, "int_labels": all_int, "digest": h.hexdigest(), "discards": discards}


@dataclass
class SparkPlan:
    """The plan, and where each input partition's rows start (in all, and per split)."""

    plan: Plan
    offsets: list[int]
    split_offsets: list[dict[str, int]]
    split_rows: dict[str, int]
    integer_labels: bool


def plan_on_spark(src: SparkSource, options: ConvertOptions, storage_options: Mapping[str, Any] | None
                  ) -> SparkPlan:
    """Run the count job and build the plan from the partitions' summaries."""
    sc = src.rdd.context
    sc.setJobDescription("shardfeed convert: read and count rows per split")
    ship = _shipped(src)
    summaries = sorted(src.rdd.mapPartitionsWithIndex(lambda i, it: _summarize(ship, options, i, it)).collect(),
                       key=lambda s: s["index"])
    offsets, split_offsets = [], []
    total = 0
    per_split = dict.fromkeys(SPLITS, 0)
    discards = list(src.driver_discards)
    h = hashlib.sha256()
    for s in summaries:
        offsets.append(total)
        split_offsets.append(dict(per_split))
        origin_numbered = src.kind == "table"
        for number, source, reason in s["discards"]:
            row = number + total if origin_numbered else number
            discards.append(DiscardRecord(row, source or f"{src.origin}#{row}", reason))
        total += s["n"]
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
    plan = finish_plan(shard_layout(per_split, options.num_samples_per_tfrecord), discards, rows_read, schema,
                       options, src.description, "sha256:" + h.hexdigest(), names, multi, storage_options,
                       src.has_image, src.annotated)
    return SparkPlan(plan, offsets, split_offsets, per_split, integer_labels)


# -- job 2: write ---------------------------------------------------------------------------------------------------

_CONVERTERS: dict[str, Any] = {}  # per Python worker: one converter per plan


def _converter(plan: Plan, storage_options: Mapping[str, Any] | None) -> Any:
    conv = _CONVERTERS.get(plan.plan_digest)
    if conv is None:
        _CONVERTERS.clear()
        conv = _CONVERTERS[plan.plan_digest] = make_converter(plan.context(storage_options), plan.has_image)
    return conv


def _keyed(src: SparkSource, sp: SparkPlan, pending: Mapping[tuple[str, int], int], index: int,
           items: Iterable[Any]) -> Iterator[tuple[int, tuple[int, Row]]]:
    per = sp.plan.options.num_samples_per_tfrecord
    start = sp.split_offsets[index]
    seen = dict.fromkeys(SPLITS, 0)
    for item in src.rows(items, sp.offsets[index]):
        if isinstance(item, DiscardRecord):
            continue
        if sp.integer_labels:
            item.label = int(item.label)
        assign_split(item, sp.plan.options)
        g = start[item.split] + seen[item.split]
        seen[item.split] += 1
        key = pending.get((item.split, g // per))
        if key is not None:
            yield key, (g % per, item)


def _write_shard(plan: Plan, shards: list[tuple[str, int, int, int]], output_dir: str,
                 storage_options: Mapping[str, Any] | None, job: str, resume: bool, index: int,
                 items: Iterable[Any]) -> Iterator[dict]:
    split, number, count, expected = shards[index]
    placed = sorted((pos_row for _, pos_row in items), key=lambda t: t[0])
    shard = Shard(split, number, count, [row for _, row in placed])
    name = plan.shard_name(shard)
    if len(shard.rows) != expected or [p for p, _ in placed] != list(range(expected)):
        raise RuntimeError(f"shard {name}: the count job placed {expected} rows in it, the write job "
                           f"{len(shard.rows)}: the input did not read the same rows twice (cache() a "
                           "DataFrame built with a non-deterministic step, or write it out first)")
    done = finished_state(plan, shard, output_dir, storage_options)
    if done is not None and (resume or done.get("job") == job):  # another attempt of this task committed it
        yield done
        return
    converter = _converter(plan, storage_options)
    sink = ShardSink(plan, shard, output_dir, storage_options)
    sink.extra_state["job"] = job
    try:
        for row in shard.rows:
            records, reason = convert_row(converter, row)
            sink.add(row, records, reason)
    except BaseException:
        sink.abort()
        raise
    yield sink.commit()


def _remove_staging(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None) -> int:
    """Hidden staging files a killed task attempt left (local output only: object stores
    stage in the writer's memory or local disk, never in the output)."""
    if not parse_url(output_dir).is_local:
        return 0
    prefix = plan.options.prefix
    removed = 0
    for folder in (output_dir, join(output_dir, f".{prefix}-state")):
        path = parse_url(folder).path
        try:
            names = os.listdir(path)
        except OSError:
            continue
        for n in names:
            if n.startswith(f".{prefix}-") and n.endswith(".tmp"):
                try:
                    os.unlink(os.path.join(path, n))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


def run_spark(src: SparkSource, options: ConvertOptions, output_dir: str,
              storage_options: Mapping[str, Any] | None = None, resume: bool = False) -> tuple[Plan, dict[str, dict]]:
    """Plan on the cluster and write every pending shard there; returns the plan and all
    shards' states by name (for :func:`~shardfeed.convert.writer.finalize`)."""
    from .runner_local import pending_shards

    sp = plan_on_spark(src, options, storage_options)
    plan = sp.plan
    todo, states = pending_shards(plan, output_dir, storage_options, resume)
    if todo:
        per = options.num_samples_per_tfrecord
        pending = {(s.split, s.index): i for i, s in enumerate(todo)}
        # rows each shard gets: per, and the last of a split the rest
        specs = [(s.split, s.index, s.count, min(per, sp.split_rows[s.split] - s.index * per)) for s in todo]
        shipped = dataclasses.replace(plan, shards=[], discards=[])
        job = uuid.uuid4().hex  # attempts of this job's tasks trust each other's commits
        sp_shipped = dataclasses.replace(sp, plan=shipped)
        ship = _shipped(src)
        sc = src.rdd.context
        sc.setJobDescription(f"shardfeed convert: write {len(todo)} shards")
        written = (src.rdd.mapPartitionsWithIndex(lambda i, it: _keyed(ship, sp_shipped, pending, i, it))
                   .partitionBy(len(todo), lambda k: k)
                   .mapPartitionsWithIndex(lambda i, it: _write_shard(shipped, specs, output_dir, storage_options,
                                                                      job, resume, i, it))
                   .collect())
        for st in written:
            states[st["file"]] = st
        missing = [plan.shard_name(s) for s in todo if plan.shard_name(s) not in states]
        if missing:
            raise RuntimeError(f"the Spark job finished without writing shard(s) {', '.join(missing[:5])}")
    removed = _remove_staging(plan, output_dir, storage_options)
    if removed:
        logger.info("removed %d staging file(s) of task attempts that did not finish", removed)
    return plan, states


__all__ = ["SparkSource", "executor_pythonpath", "is_spark_dataframe", "open_source", "plan_on_spark",
           "rows_source", "run_spark", "spark_session"]

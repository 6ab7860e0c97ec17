"""The Spark runner: rows read, converted and written by Spark executors; the driver only
plans and collects per-task states.

Two Spark jobs; rows reach the executors' Python workers as Arrow batches (``mapInArrow``),
never as pickled ``Row`` objects:

1. *read and count*: input files split into about a partition per core
   (:func:`small_input_splits`); each input partition builds its rows once
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
   :func:`place_in_sql`, so that stage runs in the executors' JVMs with no Python task;
   else a vectorized Python step per Arrow batch); ``repartitionById`` gives each write
   task a contiguous run of the shards still to write (a shuffle of rows, not of images;
   a task per executor core, more while each keeps :data:`WRITE_TASK_ROWS` rows, at most
   :data:`WRITE_TASKS_PER_CORE`, since a Python task has a fixed cost of its own), sorted
   by shard and position; a write task converts each shard's rows in chunks with the local
   runner's converter (:mod:`shardfeed.convert.tasks`) and framing
   (:func:`~shardfeed.convert.writer.convert_rows`: a chunk's records framed, CRCs
   included, in one buffer) and writes the shard with
   :class:`~shardfeed.convert.writer.ShardSink`; for an input without images the map side
   converts the rows instead (:func:`converts_early`: a one-shard split is then still
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
(:func:`annotation_source`): each job 1 task parses the records that start in its range
with the local runner's parser (:class:`~shardfeed.convert.annotations.AnnotationSpan`)
and numbers them within its partition, as a table's. A quoted CSV cell holding a line
break across a range's start is detected after job 1 (a range's records end past the next
range's first line) and job 1 runs again with the file in one task
(:meth:`SparkSource.check_partitions`). Only a pandas DataFrame's rows are built on the
driver and shipped (:func:`rows_source`).

Where Spark recomputes lost cached blocks the input must read the same rows in the same
order again (files do; a DataFrame built with a non-deterministic step, such as
``randomSplit`` or ``repartition(n)`` of uncached data, must be ``cache()``d or written out
first): the write job checks every shard's rows against job 1's count and fails, naming
the shard, when they differ.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import pickle
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
from .plan import (
    SAMPLE_ROWS,
    Plan,
    Shard,
    assign_split,
    finish_plan,
    is_multi_label,
    needs_class_list,
    sample_key,
    shard_layout,
    size_shards,
)
from .runner_local import CHUNK_ROWS
from .schema import AUTOML_COLUMNS, Schema, automl_schema, header_matches_automl
from .sources import (
    RowBuilder,
    _dirname,
    default_schema,
    folder_item,
    folder_layout,
    folder_part_files,
    parquet_parts,
    table_format,
)
from .tasks import make_converter
from .writer import ShardSink, convert_row, convert_rows, finished_state, join

logger = logging.getLogger(__name__)

CORRUPT = "_shardfeed_corrupt_record"
ROWS_PER_SLICE = 10_000  # rows the driver read itself (a pandas DataFrame) per Spark partition
FOLDERS_PER_SLICE = 8  # an image folder's label folders per Spark partition of job 1


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

# JVM options for the driver and executors of a session this module starts: a conversion is
# a few short Spark jobs whose JVM side (scheduling, reading the input, Arrow batches, the
# shuffle of paths or records) is small next to the Python workers' converting, and the
# JVMs' C2 JIT compiler spent more CPU than that work itself (on local-cluster[2,1,1024],
# the second conversion of 5,000 images: 1.9 s of the JVMs' 3.0 s of CPU in C1/C2
# compiler threads; with C1 only, 0.4 s of 1.3 s). Set as Spark's *default* Java options,
# so a user's ``spark.driver.extraJavaOptions`` / ``spark.executor.extraJavaOptions``
# (e.g. ``-XX:TieredStopAtLevel=4``) come after them and win.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


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
    path (``spark.executorEnv.PYTHONPATH``, see :func:`executor_pythonpath`) and the JIT
    settings of short jobs (:data:`JVM_OPTIONS`, as Spark's default Java options of the
    driver and the executors; ``spark.driver.extraJavaOptions`` /
    ``spark.executor.extraJavaOptions``, which the JVMs read after them, override them).

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
               .config("spark.driver.defaultJavaOptions", JVM_OPTIONS)
               .config("spark.executor.defaultJavaOptions", JVM_OPTIONS)
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
    """An input as the executors see it: a DataFrame whose columns are the input's cells
    (``kind="table"``), one binary column of pickled :class:`Row` objects the driver
    built (``kind="rows"``), an image folder's parts, each listed by the task that reads
    it (``kind="folder"``, :func:`~shardfeed.convert.sources.folder_layout`), or byte
    ranges of an annotation file, each read by the task that gets it (``kind="annotation"``,
    :class:`~shardfeed.convert.annotations.AnnotationSpan`), and how to make rows of it."""

    frame: Any
    kind: str
    schema: Schema | None
    origin: str
    base: str | None
    description: str
    driver_discards: list[DiscardRecord] = dataclasses.field(default_factory=list)
    annotated: bool = False
    has_image: bool = True
    detect_integer_labels: bool = False
    bom_column: str | None = None  # the first column, whose first cell may start with a BOM Spark's CSV reader kept
    with_split: bool = False  # kind="folder": in the split/label/file layout
    storage_options: Mapping[str, Any] | None = None  # kind="folder" / "annotation": to read its files
    annotation_format: str | None = None  # kind="annotation": "csv" (PAI annotation CSV) or "itag"
    model_type: str | None = None  # kind="annotation"
    whole_files: bool = False  # kind="annotation": one range per file (planned again after spans_agree failed)

    def rows(self, batches: Iterable[Any], info: dict[str, Any] | None = None) -> Iterator[Row | DiscardRecord]:
        """Rows (or discard records) of one partition's Arrow batches, numbered from 1
        within the partition (the write job adds the rows of the partitions before it).
        ``info`` receives what the driver checks of an annotation file's ranges (see
        :meth:`check_partitions`)."""
        if self.kind == "annotation":
            yield from self._annotation_rows(batches, {} if info is None else info)
            return
        if self.kind == "rows":
            for batch in batches:
                for blob in batch.column(0).to_pylist():
                    yield pickle.loads(blob)
            return
        if self.kind == "folder":
            yield from self._folder_rows(batches)
            return
        builder = RowBuilder(self.schema, self.origin, self.base)
        first = self.bom_column
        i = 0
        for batch in batches:
            for cells in batch.to_pylist():
                i += 1
                bad = cells.pop(CORRUPT, None)
                if bad is not None:
                    found = len(next(csv.reader([bad]), []))
                    yield builder.build(i, None, f"expected {len(cells)} cells, found {found}")
                    continue
                v = cells.get(first)
                if isinstance(v, str) and v.startswith("\ufeff"):
                    cells[first] = v[1:]
                yield builder.build(i, cells, None)


    def _folder_rows(self, batches: Iterable[Any]) -> Iterator[Row | DiscardRecord]:
        root = self.base or ""
        i = 0
        for batch in batches:
            for entry in batch.to_pylist():
                for rel, uri in folder_part_files(root, tuple(entry["parts"]), entry["folder"], self.storage_options):
                    i += 1
                    yield folder_item(i, rel, uri, self.with_split, self.origin)

    def _annotation_rows(self, batches: Iterable[Any], info: dict[str, Any]) -> Iterator[Row | DiscardRecord]:
        """The records of the partition's byte ranges, numbered on from 1 across them;
        ``info`` gets ``numbers`` (numbers used: lines of a manifest, data records of a
        CSV), ``spans`` (each range's ``start, first, stop``) and ``error`` (a file that
        cannot be read as text, reported by the driver)."""
        from .annotations import AnnotationSpan

        assert self.annotation_format is not None and self.model_type is not None and self.base is not None
        n = 0
        spans = info["spans"] = []
        for batch in batches:
            for entry in batch.to_pylist():
                span = AnnotationSpan(self.base, self.model_type, self.annotation_format, entry["start"],
                                      entry["end"], self.storage_options, first_number=n + 1, origin=self.origin)
                try:
                    yield from span
                except ValueError as exc:
                    info["error"] = str(exc)
                    return
                n += span.numbers
                spans.append((entry["start"], span.first, span.stop))
        info["numbers"] = n

    def check_partitions(self, infos: list[dict[str, Any]]) -> SparkSource | None:
        """After job 1, from each partition's ``info`` (:meth:`rows`): raises the first
        task's error (``ValueError``, naming file and byte offset); for an annotation file
        whose ranges do not agree (a quoted CSV cell holding a line break across a range's
        start, :func:`~shardfeed.convert.annotations.spans_agree`) returns the source to run
        job 1 again with (one range per file), else None."""
        for info in infos:
            if info.get("error"):
                raise ValueError(info["error"])
        if self.kind != "annotation" or self.whole_files:
            return None
        from .annotations import spans_agree

        spans = sorted(span for info in infos for span in info.get("spans", []))
        bad = spans_agree([(first, stop) for _, first, stop in spans])
        if bad is None:
            return None
        logger.warning("%s: a quoted CSV cell holds a line break across byte offset %d, where a Spark task's byte "
                       "range starts; reading the file in one task instead", self.origin, bad)
        spark = self.frame.sparkSession
        return dataclasses.replace(self, frame=_ranges_frame(spark, [(0, None)]), whole_files=True)

    @property
    def numbered_in_partition(self) -> bool:
        """Whether the rows are numbered within their partition (the driver adds the rows of
        the partitions before), not by the driver."""
        return self.kind != "rows"


def _folder_source(spark: Any, url: str, storage_options: Mapping[str, Any] | None) -> SparkSource:
    """An image folder, listed by the executors: the driver lists its top level (and a split
    folder's entries), never its files."""
    from pyspark.sql.types import ArrayType, BooleanType, StringType, StructField, StructType

    root = storage_url(url).rstrip("/")
    with_split, parts = folder_layout(root, storage_options)
    sc = spark.sparkContext
    slices = max(1, min(len(parts), max(2 * sc.defaultParallelism, -(-len(parts) // FOLDERS_PER_SLICE))))
    entries = sc.parallelize([(list(p), d) for p, d in parts], slices)
    struct = StructType([StructField("parts", ArrayType(StringType())), StructField("folder", BooleanType())])
    schema = automl_schema()
    return SparkSource(spark.createDataFrame(entries, struct), "folder", schema, mask(root), root, mask(url),
                       with_split=with_split, storage_options=storage_options,
                       detect_integer_labels=schema.label_type == "string label")


ANNOTATION_MIN_RANGE = 128 << 10  # the smallest byte range of an annotation file a task reads
ANNOTATION_MAX_RANGE = 128 << 20  # Spark's default spark.sql.files.maxPartitionBytes


def _ranges_frame(spark: Any, ranges: list[tuple[int, int | None]]) -> Any:
    """One Spark partition per byte range ``(start, end)`` (``end`` None: to the end)."""
    from pyspark.sql.types import LongType, StructField, StructType

    struct = StructType([StructField("start", LongType(), False), StructField("end", LongType())])
    return spark.createDataFrame(spark.sparkContext.parallelize(ranges, len(ranges)), struct)


def annotation_source(spark: Any, url: str, fmt: str, model_type: str,
                      storage_options: Mapping[str, Any] | None) -> SparkSource:
    """A PAI annotation CSV (``fmt="csv"``) or an iTAG manifest (``"itag"``) read by the
    executors: the driver plans byte ranges from the file's size only (about one per core,
    between :data:`ANNOTATION_MIN_RANGE` and :data:`ANNOTATION_MAX_RANGE` bytes), one Spark
    partition each; a task parses the records that start in its range with the local
    runner's parser (:class:`~shardfeed.convert.annotations.AnnotationSpan`)."""
    from .textspans import plan_ranges

    path = storage_url(url)
    size = storage.size(path, storage_options)
    cores = max(1, spark.sparkContext.defaultParallelism)
    per = min(ANNOTATION_MAX_RANGE, max(ANNOTATION_MIN_RANGE, -(-size // cores)))
    ranges: list[tuple[int, int | None]] = list(plan_ranges(size, per))
    return SparkSource(_ranges_frame(spark, ranges), "annotation", None, mask(url), path, mask(url),
                       annotated=True, storage_options=storage_options, annotation_format=fmt, model_type=model_type)


def _table_source(df: Any, schema: Schema | None, origin: str, base: str | None, description: str) -> SparkSource:
    columns = [c for c in df.columns if c != CORRUPT]
    used = schema or default_schema(columns, "the DataFrame" if origin == "<DataFrame>" else origin)
    absent = [c for c in used.columns if c not in columns]
    if absent:
        raise ValueError(f"{origin}: schema names columns the input lacks: {', '.join(absent)} (columns: {columns})")
    return SparkSource(df, "table", used, origin, base, description,
                       has_image=used.column_of("image_uri") is not None,
                       detect_integer_labels=schema is None and used.label_type == "string label",
                       bom_column=columns[0] if columns else None)


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
        return _folder_source(spark, url, storage_options)
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
    """Rows the driver read (a pandas DataFrame's), in slices of ``ROWS_PER_SLICE`` for the
    executors."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    sc = spark.sparkContext
    slices = max(1, min(len(rows) // ROWS_PER_SLICE + 1, 10_000), sc.defaultParallelism if rows else 1)
    blobs = sc.parallelize([(pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL),) for r in rows], slices)
    frame = spark.createDataFrame(blobs, StructType([StructField("row", BinaryType())]))
    has_image = annotated or (schema is not None and schema.column_of("image_uri") is not None)
    return SparkSource(frame, "rows", schema, "", None, description, list(discards),
                       annotated, has_image, detect_integer_labels and schema is not None
                       and schema.label_type == "string label")


def _shipped(src: SparkSource) -> SparkSource:
    """What the tasks need of ``src`` (not the DataFrame, nor the driver's discards)."""
    return dataclasses.replace(src, frame=None, driver_discards=[])


# -- job 1: read, place in splits, count ----------------------------------------------------------------------------

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
            all_int += isinstance(item.label, str) and item.label.strip().lstrip("-").isdigit()
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


OPEN_COST = "spark.sql.files.openCostInBytes"
MIN_SPLIT_BYTES = 128 << 10  # job 1 splits an input file no finer than this


def byte_size(text: str) -> int:
    """Bytes of a Spark size setting: ``"4194304"``, ``"4MB"``, ``"128k"``..."""
    t = text.strip().lower().rstrip("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}.get(t[-1:], 1)
    return int(t[:-1] if scale > 1 else t or "0") * scale


ADAPTIVE = "spark.sql.adaptive.enabled"


@contextlib.contextmanager
def session_conf(spark: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """Within: the session's SQL ``settings`` set, each restored after (unset where it was
    unset). A setting the session does not let us read or change is left as it is."""
    old: dict[str, str | None] = {}
    try:
        for key, value in settings.items():
            try:
                was = spark.conf.get(key, None)
                spark.conf.set(key, value)
            except Exception:  # a session that refuses it (a locked conf): leave it as it is
                continue
            old[key] = was
        yield
    finally:
        for key, was in old.items():
            if was is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, was)


@contextlib.contextmanager
def small_input_splits(spark: Any) -> Iterator[None]:
    """Within: Spark splits input files for job 1 into about as many partitions as the
    cluster has cores, down to :data:`MIN_SPLIT_BYTES` a split, restoring the session's
    setting after (:func:`session_conf`).

    Spark cuts files into splits of ``min(maxPartitionBytes, max(openCostInBytes,
    (bytes + files * openCostInBytes) / cores))``: with the default 4 MiB
    ``openCostInBytes`` a file under 4 MiB is one split, so a 20,000-row CSV was one job-1
    task on one core while the others waited. Lowering ``openCostInBytes`` for the read
    lets the bytes-per-core term decide (large inputs keep their ``maxPartitionBytes``
    splits). The splits are fixed when the scan is planned (in ``persist``), so a lost
    cached partition is re-read from the same byte range after the setting is restored:
    the same rows in the same order."""
    try:
        old = spark.conf.get(OPEN_COST)
        lower = old is None or byte_size(old) > MIN_SPLIT_BYTES
    except Exception:  # a session whose conf cannot be read or parsed: leave it as it is
        lower = False
    with session_conf(spark, {OPEN_COST: str(MIN_SPLIT_BYTES)} if lower else {}):
        yield


def plan_on_spark(src: SparkSource, options: ConvertOptions, storage_options: Mapping[str, Any] | None
                  ) -> SparkPlan:
    """Run job 1 (its output cached on the executors; input files split by
    :func:`small_input_splits`) and build the plan from the partitions' summaries. The
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


# -- job 2: write ---------------------------------------------------------------------------------------------------

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
    removed = _remove_staging(plan, output_dir, storage_options)
    if removed:
        logger.info("removed %d staging file(s) of task attempts that did not finish", removed)
    return plan, states


__all__ = ["SparkSource", "annotation_source", "executor_pythonpath", "is_spark_dataframe", "open_source",
           "plan_on_spark", "rows_source", "run_spark", "spark_session"]

"""What the executors read: an input (a Spark DataFrame, files Spark reads, an image folder,
byte ranges of an annotation file, rows the driver read) as a :class:`SparkSource`, and how
a task makes rows of its partition (see :mod:`shardfeed.convert.runner_spark`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import pickle
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import storage
from ..storage.urls import mask
from .options import DiscardRecord, Row
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
from .spark_session import is_spark_dataframe

logger = logging.getLogger(__name__)

CORRUPT = "_shardfeed_corrupt_record"
ROWS_PER_SLICE = 10_000  # rows the driver read itself (a pandas DataFrame) per Spark partition
FOLDERS_PER_SLICE = 8  # an image folder's label folders per Spark partition of job 1


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


def _fetch_ordered(plan: Any) -> bool:
    """Whether a physical plan (a JVM ``SparkPlan``) reads a shuffle's output (or an RDD
    whose order Spark does not call determinate), so that its partitions' rows come in the
    order their blocks were fetched, which a recomputation changes."""
    name = plan.getClass().getSimpleName()
    if name in ("ShuffleExchangeExec", "ReusedExchangeExec", "ShuffleQueryStageExec"):
        return True
    if name == "AdaptiveSparkPlanExec":
        return _fetch_ordered(plan.inputPlan())
    if name == "InMemoryTableScanExec":  # a cached DataFrame: a lost block is computed again by its plan
        return _fetch_ordered(plan.relation().cachedPlan())
    if name in ("RDDScanExec", "ExternalRDDScanExec"):
        return plan.rdd().outputDeterministicLevel().toString() != "DETERMINATE"
    children = plan.children()
    return any(_fetch_ordered(children.apply(i)) for i in range(children.size()))


def _orderable(t: Any) -> bool:
    """Whether Spark sorts by a column of type ``t`` (not a map or a variant, nor a struct
    or array holding one)."""
    from pyspark.sql import types as T

    if isinstance(t, T.UserDefinedType):
        return _orderable(t.sqlType())
    if isinstance(t, T.MapType) or type(t).__name__ == "VariantType":
        return False
    if isinstance(t, T.ArrayType):
        return _orderable(t.elementType)
    if isinstance(t, T.StructType):
        return all(_orderable(f.dataType) for f in t.fields)
    return True


def stable_order(df: Any) -> Any:
    """``df``, each partition's rows in an order its content fixes where it reads a shuffle's
    output (``repartition(n)``, a join, an aggregation), else as it is.

    Job 1 numbers a partition's rows in the order they come, and each row's shard and place
    there follow from its number. A shuffle's reader gets its blocks in the order they
    arrive: when an executor dies, Spark computes its partitions again and the same rows come
    in another order, so job 2's map side sent other rows to the same places; Spark, seeing
    a retried map stage's output change, aborts a job whose write tasks have finished ("A
    shuffle map stage with indeterminate output was failed and retried"). Sorted by their
    columns (a map column by its JSON text), the same rows come in the same order, so a
    recomputed partition gives the same output and a lost executor costs a retry. Files and
    a ``parallelize``d collection keep their order (the local runner's); a plan that cannot
    be inspected (Spark Connect) is sorted."""
    from pyspark.sql import functions as F

    try:
        shuffled = _fetch_ordered(df._jdf.queryExecution().executedPlan())
    except Exception:  # not a classic DataFrame (Spark Connect), or a plan node this does not know
        shuffled = True
    if not shuffled or not df.columns:
        return df
    if len(set(df.columns)) < len(df.columns):  # a column named twice cannot be named as a sort key
        logger.warning("the DataFrame reads a shuffle's output but names a column twice (%s): its rows are numbered "
                       "in the order they arrive, which a lost executor can change", df.columns)
        return df
    keys = [df[f.name] if _orderable(f.dataType) else F.to_json(F.struct(df[f.name])) for f in df.schema.fields]
    return df.sortWithinPartitions(*keys)


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
        return _table_source(stable_order(source), schema, "<DataFrame>", None,
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

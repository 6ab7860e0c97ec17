"""``convert``, ``convert_annotations`` and ``read_dataset``: the public face of conversion."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import storage
from ..storage.urls import mask, parse_url
from .annotations import annotation_format, read_annotation_csv, read_itag_manifest
from .options import ConvertOptions, fspath, options_from
from .plan import Plan, make_plan
from .runner_local import run_local  # the default runner, imported with the API (beam and spark when used)
from .schema import Schema, as_schema, integer_text
from .sources import _dirname, parquet_parts, read_dataframe, read_image_folder, read_table_file
from .writer import finalize, join, manifest_url

logger = logging.getLogger(__name__)

RUNNERS = ("local", "beam", "spark", "ray")
_ALIASES = {"num_samples_per_shard": "num_samples_per_tfrecord", "output_prefix": "prefix"}


@dataclass
class ConvertResult:
    """What a conversion wrote: the output location, and the manifest it wrote there."""

    output_dir: str
    manifest: dict[str, Any]

    @property
    def rows_read(self) -> int:
        return self.manifest["counts"]["rows_read"]

    @property
    def records_written(self) -> int:
        return self.manifest["counts"]["records_written"]

    @property
    def rows_converted(self) -> int:
        """Rows that gave records (a video gives one record per clip)."""
        c = self.manifest["counts"]
        return c.get("rows_converted", c["rows_read"] - c["rows_discarded"])

    @property
    def rows_discarded(self) -> int:
        return self.manifest["counts"]["rows_discarded"]

    @property
    def splits(self) -> dict[str, Any]:
        return self.manifest["splits"]

    @property
    def manifest_url(self) -> str:
        return manifest_url(self.output_dir, self.manifest["options"]["prefix"])

    @property
    def discards_url(self) -> str:
        return join(self.output_dir, self.manifest["discard_report"])

    def files(self, split: str) -> list[str]:
        return [join(self.output_dir, s["file"]) for s in self.manifest["splits"].get(split, {}).get("shards", [])]

    def __str__(self) -> str:
        per = ", ".join(f"{k}: {v['records']} records in {len(v['shards'])} shards" for k, v in self.splits.items())
        made = "" if self.rows_converted == self.records_written else f" from {self.rows_converted} rows"
        return (f"{self.rows_read} rows read, {self.records_written} records written{made}, {self.rows_discarded} "
                f"discarded ({per or 'no shards'}) -> {mask(self.output_dir)}")


def _options(options: ConvertOptions | None, kwargs: Mapping[str, Any]) -> ConvertOptions:
    kw = {_ALIASES.get(k, k): v for k, v in kwargs.items()}
    return options_from(options, kw)


def _is_ray_dataset(obj: Any) -> bool:
    return type(obj).__module__.startswith("ray.data") and hasattr(obj, "to_pandas")


def _is_dataframe(obj: Any) -> bool:
    return hasattr(obj, "itertuples") and hasattr(obj, "columns")


def _is_folder(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    parsed = parse_url(url)
    if parsed.is_local:
        return os.path.isdir(parsed.path)
    if url.endswith("/"):
        return True
    if url.lower().endswith((".csv", ".txt", ".tsv")):
        return False
    try:
        storage.size(url, storage_options)
        return False
    except (IsADirectoryError, FileNotFoundError):
        return True


def _integer_labels(rows, schema: Schema) -> Schema:
    """AutoML layout: when every label is an integer, keep the integers as label ids."""
    labels = [r.label for r in rows]
    if not labels or not all(integer_text(v) for v in labels):
        return schema
    for r in rows:
        r.label = int(r.label)
    return Schema({c: ("integer label" if t == "string label" else t) for c, t in schema.columns.items()},
                  schema.defaults, schema.separator)


def _warn_stale(plan: Plan, output_dir: str, storage_options) -> None:
    """Shards with this prefix that the manifest does not list (an older conversion with
    other options) would be read by a plain glob of the folder: say so, never delete them."""
    o = plan.options
    mine = {plan.shard_name(s) for s in plan.shards}
    try:
        names = [u.rsplit("/", 1)[-1] for u in storage.list_dir(output_dir, storage_options)]
    except (OSError, ValueError):
        return
    stale = sorted(n for n in names if n.startswith(o.prefix + "-") and ".tfrecord" in n
                   and not n.endswith(".idx") and n not in mine)
    if stale:
        logger.warning("%s holds %d shard(s) with prefix %r that this conversion did not write (e.g. %s); "
                       "read through the manifest (read_dataset) or remove them", mask(output_dir), len(stale),
                       o.prefix, stale[0])


def table_reread(url: str, files: list[str], counts: list[int], rows, schema: Schema | None,
                 integer_labels: bool) -> dict[str, Any]:
    """How Beam workers read a table's rows again, one task per file: each file's first row
    number and, per split, how many rows of that split come before it."""
    per_file = []
    first = 1
    it = iter(rows)
    row = next(it, None)
    before = dict.fromkeys(("train", "validation", "test"), 0)
    for f, n in zip(files, counts):
        per_file.append({"url": f, "first": first, "before": dict(before)})
        first += n
        while row is not None and row.number < first:
            before[row.split] += 1
            row = next(it, None)
    origin = mask(url)
    if files == [url]:
        base = _dirname(url)
    else:
        base = url.rstrip("/")
        if parse_url(base).is_local:
            base = os.path.abspath(parse_url(base).path)
    return {"files": per_file, "schema": schema, "integer_labels": integer_labels, "origin": origin, "base": base}


def _finish(plan: Plan, output_dir: str, states, storage_options, runner: str) -> ConvertResult:
    manifest = finalize(plan, output_dir, states, storage_options, runner)
    _warn_stale(plan, output_dir, storage_options)
    result = ConvertResult(output_dir, manifest)
    logger.info("%s", result)
    return result


def _run_spark(source: Any, output_dir: str, schema: Schema | None, opts: ConvertOptions, storage_options,
               resume: bool, spark_master: str | None, annotation_format: str | None = None) -> ConvertResult:
    """``runner="spark"``: executors read ``source`` (byte ranges of it, for an annotation
    file of ``annotation_format``), convert and write; see :mod:`shardfeed.convert.runner_spark`."""
    from .runner_spark import (
        annotation_source,
        is_spark_dataframe,
        open_source,
        rows_source,
        run_spark,
        spark_session,
        storage_url,
    )

    if is_spark_dataframe(source):
        spark = source.sparkSession
    else:
        spark = spark_session(spark_master)
    if annotation_format is not None:
        src = annotation_source(spark, fspath(source), annotation_format, opts.model_type, storage_options)
    elif _is_dataframe(source):
        rows, discards, used = read_dataframe(source, schema)
        desc = f"DataFrame with {len(source)} rows and columns {[str(c) for c in source.columns]}"
        src = rows_source(spark, rows, discards, used, desc, detect_integer_labels=schema is None)
    else:
        folder = not is_spark_dataframe(source) and _is_folder(storage_url(fspath(source)), storage_options)
        src = open_source(spark, source if is_spark_dataframe(source) else fspath(source), schema, storage_options,
                          folder)
    plan, states = run_spark(src, opts, output_dir, storage_options, resume=resume)
    return _finish(plan, output_dir, states, storage_options, "spark")


def _run(plan: Plan, output_dir: str, storage_options, runner: str, resume: bool, progress: bool,
         beam_runner: str | None, beam_options, pipeline_options) -> ConvertResult:
    if runner == "local":
        states = run_local(plan, output_dir, storage_options, resume=resume, progress=progress)
    elif runner == "beam":
        from .runner_beam import run_beam

        states = run_beam(plan, output_dir, storage_options, resume=resume, runner=beam_runner,
                          pipeline_options=pipeline_options, beam_options=beam_options)
    elif runner == "ray":
        from .runner_ray import run_ray

        states = run_ray(plan, output_dir, storage_options, resume=resume, progress=progress)
    else:
        raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
    return _finish(plan, output_dir, states, storage_options, runner)


def convert(source: Any, output_dir: str | os.PathLike, *, schema: Schema | Mapping[str, Any] | None = None,
            defaults: Mapping[str, Any] | None = None, runner: str = "local", resume: bool = False,
            storage_options: Mapping[str, Any] | None = None, progress: bool = True,
            beam_runner: str | None = None, beam_options: Mapping[str, Any] | None = None,
            pipeline_options: Any = None, spark_master: str | None = None, options: ConvertOptions | None = None,
            **kwargs: Any) -> ConvertResult:
    """Convert a DataFrame (pandas or Spark), a CSV, Parquet or JSON-lines file (any
    storage URL) or an image folder into sharded, indexed TFRecords under ``output_dir``,
    with a manifest and a discard report.

    Without ``schema`` the input is the AutoML layout ``split,image_uri,label`` (label text
    or integer); a folder is ``split/label/file`` or ``label/file``. ``schema`` maps column
    -> type (see :mod:`shardfeed.convert.schema`), ``defaults`` column -> value for missing
    cells. Other keyword arguments are :class:`ConvertOptions` (PAI names:
    ``max_image_size``, ``test_ratio``, ``num_samples_per_tfrecord``, ``image_format``,
    ``class_list_file``, ``compression``, ``prefix``, ...). ``runner`` is ``"local"``,
    ``"beam"`` (``beam_runner``, ``beam_options`` / ``pipeline_options`` passed to Beam) or
    ``"spark"`` (executors read, convert and write; the running ``SparkSession``, or one
    started on ``spark_master``); a ``pyspark.sql.DataFrame`` source implies ``"spark"``;
    ``"ray"`` converts and writes each shard in a Ray task (a ``ray.data.Dataset`` source
    implies it: its rows are planned in the driver, as a pandas DataFrame's).
    ``resume=True`` keeps shards a previous run of the same plan finished.

    Bad rows never stop the job: they are listed in the discard report. Raises
    ``ValueError`` for a bad option or an input it cannot read as a table at all,
    ``FileNotFoundError`` for a missing input, ``RuntimeError`` when Spark cannot start
    (no Java, a wrong ``spark_master``).
    """
    opts = _options(options, kwargs)
    if opts.model_type not in ("CLASSIFICATION", "SELF_DEFINED"):
        raise ValueError(f"convert() reads tables and folders (model_type CLASSIFICATION or SELF_DEFINED); "
                         f"for {opts.model_type} annotations use convert_annotations()")
    out = fspath(output_dir)
    sch = as_schema(schema, defaults, opts.separator)
    if runner == "spark" or type(source).__module__.startswith("pyspark.sql"):
        return _run_spark(source, out, sch, opts, storage_options, resume, spark_master)
    if _is_ray_dataset(source):  # its rows planned here, like a DataFrame's; converted in Ray tasks
        source, runner = source.to_pandas(), "ray"
    counts: list[int] = []
    files = None
    if _is_dataframe(source):
        rows, discards, used = read_dataframe(source, sch)
        desc = f"DataFrame with {len(source)} rows and columns {[str(c) for c in source.columns]}"
    else:
        url = fspath(source)
        desc = mask(url)
        parts = parquet_parts(url, storage_options) if _is_folder(url, storage_options) else None
        if parts:
            rows, discards, used = read_table_file(url, sch, storage_options, parts=parts, counts=counts)
            files = parts
        elif _is_folder(url, storage_options):
            if sch is not None:
                raise ValueError("a schema applies to tables; an image folder has no columns")
            rows, discards, used = read_image_folder(url, storage_options)
        else:
            rows, discards, used = read_table_file(url, sch, storage_options, counts=counts)
            files = [url]
    integer_labels = False
    if sch is None and used.label_type == "string label":
        integer_labels = (used := _integer_labels(rows, used)).label_type == "integer label"
    has_image = used.column_of("image_uri") is not None
    plan = make_plan(rows, discards, used, opts, desc, storage_options, has_image=has_image)
    if runner == "beam" and files:
        plan.reread = table_reread(url, files, counts, rows, sch, integer_labels)
    return _run(plan, out, storage_options, runner, resume, progress, beam_runner, beam_options, pipeline_options)


def convert_annotations(label_file: str | os.PathLike, output_dir: str | os.PathLike, *, model_type: str,
                        runner: str = "local", resume: bool = False, storage_options: Mapping[str, Any] | None = None,
                        progress: bool = True, beam_runner: str | None = None,
                        beam_options: Mapping[str, Any] | None = None, pipeline_options: Any = None,
                        spark_master: str | None = None, options: ConvertOptions | None = None,
                        **kwargs: Any) -> ConvertResult:
    """Convert a PAI annotation CSV (``id, raw JSON {url}, answer JSON``) or an iTAG
    ``.manifest`` (JSON lines) for ``model_type`` (CLASSIFICATION, DETECTION, SEGMENTATION,
    INSTANCE_SEGMENTATION, TEXT_RECOGNITION, TEXT_DETECTION, TEXT_END2END,
    VIDEO_CLASSIFICATION, SELF_DEFINED with ``converter_class``) into sharded TFRecords;
    options and outputs as :func:`convert`. Rows are split by ``test_ratio`` (seeded by
    ``seed``). Malformed rows are reported and discarded.

    INSTANCE_SEGMENTATION reads polygons (any number of points) and writes boxes, classes
    and one PNG mask per object. VIDEO_CLASSIFICATION reads a video per row (its URL in
    ``url`` / ``data.source``), decodes it with PyAV (``decode_type``, ``sample_fps``,
    ``reshape_size``, ``decode_batch_size``, ``decode_keep_size``) and writes one record per
    clip; an unreadable or truncated video is discarded with the reason. Raises
    ``ImportError`` for VIDEO_CLASSIFICATION without PyAV (``shardfeed[video]``).
    """
    opts = _options(options, {**kwargs, "model_type": model_type})
    url = fspath(label_file)
    fmt = annotation_format(url, storage_options)
    if runner == "spark":  # executors read byte ranges of the file, convert and write
        return _run_spark(url, fspath(output_dir), None, opts, storage_options, resume, spark_master,
                          annotation_format=fmt)
    if fmt == "itag":
        rows, discards = read_itag_manifest(url, opts.model_type, storage_options)
    else:
        rows, discards = read_annotation_csv(url, opts.model_type, storage_options)
    plan = make_plan(rows, discards, None, opts, mask(url), storage_options, has_image=True, annotated=True)
    return _run(plan, fspath(output_dir), storage_options, runner, resume, progress, beam_runner, beam_options,
                pipeline_options)


# reading a converted output lives in .reading (light: `sf.read_converted` imports no conversion code)
from .reading import find_manifest, load_manifest, manifest_spec, read_converted, read_dataset  # noqa: E402,F401

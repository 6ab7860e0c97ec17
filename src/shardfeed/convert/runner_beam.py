"""The Apache Beam runner: the same plan, shards and records as the local runner, with
rows converted in parallel by Beam workers (DirectRunner by default; any runner and
pipeline options are passed through, e.g. DataflowRunner with ``project``/``region``).

Pipeline, for a CSV, Parquet (file or folder of parts) or JSON-lines table: ``Create(source
files) | Reshuffle | read rows (one task per file) | Reshuffle | convert | GroupByKey(shard)
| write shard``: workers read the rows themselves, numbered and placed in shards from
per-file offsets the plan computed, and only file names and offsets leave the driver (the
driver still reads the table once to plan). Other inputs (DataFrames, image folders,
annotation files): ``Create(shard, position, row) | Reshuffle | convert | ...``. Each
shard is written by one worker, atomically, records sorted by their position in the
shard, so its bytes equal the local runner's. The driver then reads the
shards' state files and writes the manifest.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from .plan import Plan, Shard
from .runner_local import pending_shards
from .tasks import make_converter
from .writer import ShardSink, convert_row

logger = logging.getLogger(__name__)


def _beam():
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError as exc:
        raise ImportError("runner='beam' needs Apache Beam: pip install 'shardfeed[beam]'") from exc
    return beam, PipelineOptions


class _ConvertFn:
    """Built lazily on the worker (``setup``), so only the plan is pickled."""

    def __init__(self, plan: Plan, storage_options: Mapping[str, Any] | None):
        self.plan, self.storage_options = plan, storage_options
        self.converter = None

    def __call__(self, item):
        name, pos, row = item
        if self.converter is None:
            self.converter = make_converter(self.plan.context(self.storage_options), self.plan.has_image)
        records, reason = convert_row(self.converter, row)
        return name, (pos, row, records, reason)


class _ReadFileFn:
    """Rows of one source file, read by a worker (``plan.reread``), each keyed by its shard
    and position: numbered on from the rows of the files before it, placed in the split the
    key rule gives it, exactly as the driver's plan placed it."""

    def __init__(self, plan: Plan, pending: Mapping[tuple[str, int], str], storage_options: Mapping[str, Any] | None):
        self.plan, self.pending, self.storage_options = plan, pending, storage_options

    def __call__(self, f):
        from .plan import assign_split
        from .sources import _dirname, read_table_part

        spec = self.plan.reread
        per = self.plan.rows_per_shard
        rows, _, _ = read_table_part(f["url"], spec["schema"], self.storage_options, spec["origin"],
                                     spec["base"] or _dirname(f["url"]), f["first"])
        seen = dict.fromkeys(f["before"], 0)
        for row in rows:
            if spec["integer_labels"]:
                row.label = int(row.label)
            assign_split(row, self.plan.options)
            g = f["before"][row.split] + seen[row.split]
            seen[row.split] += 1
            name = self.pending.get((row.split, g // per))
            if name is not None:
                yield name, g % per, row


class _WriteFn:
    def __init__(self, plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None):
        self.plan, self.output_dir, self.storage_options = plan, output_dir, storage_options
        self.by_name = {plan.shard_name(s): s for s in plan.shards}

    def __call__(self, kv):
        name, items = kv
        items = sorted(items, key=lambda t: t[0])
        shard = self.by_name[name]
        if not shard.rows:  # shipped without its rows: the workers read them
            shard = Shard(shard.split, shard.index, shard.count, [row for _, row, _, _ in items])
        sink = ShardSink(self.plan, shard, self.output_dir, self.storage_options)
        try:
            for _, row, records, reason in items:
                sink.add(row, records, reason)
        except BaseException:
            sink.abort()
            raise
        st = sink.commit()
        return name, st["records"]


def run_beam(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None = None, resume: bool = False,
             runner: str | None = None, pipeline_options: Any = None, beam_options: Mapping[str, Any] | None = None
             ) -> dict[str, dict]:
    """Write every pending shard with a Beam pipeline; returns all shards' states by name.

    ``pipeline_options`` is a ``PipelineOptions`` (used as is) or None; ``beam_options``
    are keyword options for ``PipelineOptions`` (``direct_num_workers=2``,
    ``direct_running_mode="multi_processing"``, ``project=...``); ``runner`` defaults to
    ``DirectRunner``.
    """
    beam, PipelineOptions = _beam()
    todo, states = pending_shards(plan, output_dir, storage_options, resume)
    if not todo:
        return states
    if pipeline_options is None:
        kwargs = dict(beam_options or {})
        kwargs.setdefault("runner", runner or "DirectRunner")
        pipeline_options = PipelineOptions(flags=[], **kwargs)
    elif runner is not None:
        from apache_beam.options.pipeline_options import StandardOptions

        pipeline_options.view_as(StandardOptions).runner = runner
    with beam.Pipeline(options=pipeline_options) as p:
        if plan.reread:  # workers read the source files: only file names and offsets leave the driver
            shipped = dataclasses.replace(plan, shards=[Shard(s.split, s.index, s.count, []) for s in plan.shards],
                                          discards=[])
            pending = {(s.split, s.index): plan.shard_name(s) for s in todo}
            rows = (p
                    | "Files" >> beam.Create(plan.reread["files"], reshuffle=False)
                    | "SpreadFiles" >> beam.Reshuffle()
                    | "ReadRows" >> beam.FlatMap(_ReadFileFn(shipped, pending, storage_options)))
        else:
            shipped = plan
            items = [(plan.shard_name(s), pos, row) for s in todo for pos, row in enumerate(s.rows)]
            rows = p | "Rows" >> beam.Create(items, reshuffle=False)
        _ = (rows
             | "Spread" >> beam.Reshuffle()
             | "Convert" >> beam.Map(_ConvertFn(shipped, storage_options))
             | "ByShard" >> beam.GroupByKey()
             | "WriteShard" >> beam.Map(_WriteFn(shipped, output_dir, storage_options)))
    from .writer import finished_state

    for s in todo:
        st = finished_state(plan, s, output_dir, storage_options)
        if st is None:
            raise RuntimeError(f"the Beam pipeline finished but shard {plan.shard_name(s)} was not written")
        states[plan.shard_name(s)] = st
    return states

"""Shards, their state files, the manifest and the discard report.

Every shard is written atomically (``TFRecordWriter``; with its ``.idx`` index when
uncompressed). After a shard is in place a small state file
``.<prefix>-state/<shard>.json`` records what went into it (records, discarded rows, the
plan digest); ``resume`` trusts a shard only when both are there and the digest matches.
When all shards are done, ``finalize`` builds ``<prefix>-manifest.json`` and
``<prefix>-discards.csv`` from the state files, so an interrupted and resumed job writes
exactly what an uninterrupted one does.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import storage
from .._version import __version__
from ..formats.example import encode_example, example_pieces
from ..formats.native import frame_records
from ..formats.spec import FixedLen, VarLen
from ..formats.tfrecord import TFRecordWriter
from ..storage.urls import parse_url
from .layout import join, manifest_url
from .native_rows import native_image_rows
from .options import Discard, DiscardRecord, Row
from .plan import RUNTIME_OPTIONS, Plan, Shard

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = "shardfeed.convert/1"


def discards_url(output_dir: str, prefix: str) -> str:
    return join(output_dir, f"{prefix}-discards.csv")


def state_url(output_dir: str, plan: Plan, shard: Shard) -> str:
    return join(output_dir, f".{plan.options.prefix}-state/{plan.shard_name(shard)}.json")


def _convert(converter: Any, row: Row, encode: Any) -> tuple[list | None, str | None]:
    try:
        feats = converter.convert(row, row.split)
        if type(feats) is dict or isinstance(feats, Mapping):
            return [encode(feats)], None
        records = [encode(f) for f in feats]
        if not records:
            raise Discard("the converter made no record from this row")
        return records, None
    except Discard as d:
        return None, str(d)
    except ImportError:
        raise  # a missing package (Pillow on a worker) is the environment's fault, not the row's
    except Exception as exc:
        logger.warning("row %s (%s): converter failed", row.number, row.source, exc_info=True)
        return None, f"converter error: {type(exc).__name__}: {str(exc)[:160]}"


def convert_row(converter: Any, row: Row) -> tuple[list[bytes] | None, str | None]:
    """``([record, ...], None)`` for a converted row, ``(None, reason)`` for a discarded one.

    A converter returns one feature dict (one record) or a non-empty list of them (several
    records from one row: the clips of a video).
    """
    return _convert(converter, row, encode_example)


@dataclass
class FramedRows:
    """Rows converted and framed in one piece (:func:`convert_rows`): ``frames`` holds the
    TFRecord frames of all their records in row order; ``rows`` one entry per row, the
    data lengths of its records or ``None`` and the discard reason."""

    frames: Any  # bytes-like: a pooled uint8 array (formats.native.frame_records)
    rows: list[tuple[list[int] | None, str | None]]


def convert_rows(converter: Any, rows: list[Row]) -> FramedRows:
    """:func:`convert_row` of each row, the records framed as the shard file holds them
    (each byte of a record copied once, checksummed in the same pass, GIL released), so
    that the thread writing the shard only appends one buffer. Image-folder rows of the
    common case are read, checked, encoded and framed in C (:mod:`.native_rows`; the same
    bytes), the others here."""
    native = native_image_rows(converter)
    done = native.convert(rows) if native is not None else None
    if done is not None:
        frames, results = done
        if None not in results:  # every row judged in C: kept (its record's length) or discarded
            return FramedRows(frames, [([r], None) if type(r) is int else (None, r) for r in results])
    pieces: list[Any] = []
    out: list[tuple[list[int] | None, str | None]] = []
    view, at = (memoryview(frames), 0) if done is not None else (None, 0)
    for i, row in enumerate(rows):
        if done is not None:
            r = results[i]
            if type(r) is int:  # framed in C: its record joins the others framed once more
                pieces.append(view[at + 12:at + 12 + r])
                at += r + 16
                out.append(([r], None))
                continue
            if r is not None:
                out.append((None, r))
                continue
        records, reason = _convert(converter, row, example_pieces)
        if records is None:
            out.append((None, reason))
            continue
        out.append(([n for _, n in records], None))
        pieces.extend(p for p, _ in records)
    return FramedRows(frame_records(pieces, pooled=True), out)


class ShardSink:
    """Collects one shard's records (in row order) and discards; ``commit`` writes it."""

    def __init__(self, plan: Plan, shard: Shard, output_dir: str, storage_options: Mapping[str, Any] | None):
        self.plan, self.shard, self.output_dir = plan, shard, output_dir
        self.storage_options = storage_options
        self.url = join(output_dir, plan.shard_name(shard))
        compression = plan.options.compression
        self.writer = TFRecordWriter(self.url, compression=compression, index=compression is None,
                                     storage_options=storage_options)
        self.discards: list[DiscardRecord] = []
        self.extra_state: dict[str, Any] = {}  # more to record in the state file (a runner's job id)

    def add(self, row: Row, records: list[bytes] | None, reason: str | None) -> None:
        if records is not None:
            for record in records:
                self.writer.write(record)
        else:
            self.discards.append(DiscardRecord(row.number, row.source, reason or "discarded"))

    def add_framed(self, rows: list[Row], framed: FramedRows) -> None:
        """Add ``rows`` as :func:`convert_rows` converted them (in row order)."""
        lengths = [n for ns, _ in framed.rows if ns is not None for n in ns]
        if lengths:
            self.writer.write_frames(framed.frames, lengths)
        for row, (ns, reason) in zip(rows, framed.rows):
            if ns is None:
                self.discards.append(DiscardRecord(row.number, row.source, reason or "discarded"))

    def commit(self) -> dict[str, Any]:
        self.writer.close()
        state = {"plan_digest": self.plan.plan_digest, "file": self.plan.shard_name(self.shard),
                 "split": self.shard.split, "rows": len(self.shard.rows), "records": self.writer.records,
                 # its size as written: a reader of the manifest tells a shard cut or changed since
                 "bytes": storage.size(self.url, self.storage_options),
                 "discards": [[d.row, d.source, d.reason] for d in self.discards], **self.extra_state}
        storage.write_bytes(state_url(self.output_dir, self.plan, self.shard),
                            json.dumps(state, ensure_ascii=False).encode(), self.storage_options)
        return state

    def abort(self) -> None:
        self.writer.abort()


def write_shard(plan: Plan, shard: Shard, output_dir: str,
                results: Iterable[tuple[Row, list[bytes] | None, str | None]],
                storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Write a shard from ``(row, records, reason)`` in row order; returns its state."""
    sink = ShardSink(plan, shard, output_dir, storage_options)
    try:
        for row, record, reason in results:
            sink.add(row, record, reason)
    except BaseException:
        sink.abort()
        raise
    return sink.commit()


def finished_state(plan: Plan, shard: Shard, output_dir: str, storage_options: Mapping[str, Any] | None
                   ) -> dict[str, Any] | None:
    """The state of a shard written earlier by the same plan, or None if it must be (re)done."""
    url = state_url(output_dir, plan, shard)
    try:
        state = json.loads(storage.read_bytes(url, storage_options=storage_options))
    except (FileNotFoundError, ValueError):
        return None
    if state.get("plan_digest") != plan.plan_digest:
        return None
    if not storage.exists(join(output_dir, plan.shard_name(shard)), storage_options):
        return None
    return state


def spec_to_json(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, s in spec.items():
        if isinstance(s, FixedLen):
            d = s.default
            if isinstance(d, bytes):
                d = {"base64": base64.b64encode(d).decode()}
            out[k] = {"kind": "FixedLen", "dtype": s.dtype, "shape": list(s.shape), "default": d}
        elif isinstance(s, VarLen):
            out[k] = {"kind": "VarLen", "dtype": s.dtype}
        else:
            raise TypeError(f"feature {k!r}: only FixedLen and VarLen specs can go in a manifest, got {s!r}")
    return out


def finalize(plan: Plan, output_dir: str, states: Mapping[str, dict[str, Any]],
             storage_options: Mapping[str, Any] | None, runner: str = "local") -> dict[str, Any]:
    """Write the discard report and the manifest (last, so its presence means done).

    ``options`` in the manifest are those that decide the content; ``runtime`` holds the
    ones that only decide how it was produced (runner, workers).
    """
    o = plan.options
    discards = [[d.row, d.source, d.reason] for d in plan.discards]
    splits: dict[str, Any] = {}
    for shard in plan.shards:
        st = states[plan.shard_name(shard)]
        discards.extend(st["discards"])
        sp = splits.setdefault(shard.split, {"shards": [], "records": 0, "rows": 0})
        sp["shards"].append({"file": st["file"], "records": st["records"], "rows": st["rows"],
                             **({"bytes": st["bytes"]} if "bytes" in st else {})})  # states of older versions lack it
        sp["records"] += st["records"]
        sp["rows"] += st["rows"]
    discards.sort(key=lambda d: d[0])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["row", "source", "reason"])
    w.writerows(discards)
    storage.write_bytes(discards_url(output_dir, o.prefix), buf.getvalue().encode("utf-8"), storage_options)
    written = sum(s["records"] for s in splits.values())
    converted = sum(s["rows"] for s in splits.values()) - (len(discards) - len(plan.discards))
    options = {k: v for k, v in o.to_dict().items() if k not in RUNTIME_OPTIONS}
    runtime = {"runner": runner, **{k: getattr(o, k) for k in RUNTIME_OPTIONS}}
    if not isinstance(options.get("converter_class"), (str, type(None))):
        cls = options["converter_class"]
        options["converter_class"] = f"{cls.__module__}:{cls.__qualname__}"
    manifest = {
        "format": MANIFEST_FORMAT,
        "shardfeed_version": __version__,
        "model_type": o.model_type,
        "source": {"input": plan.source, "digest": plan.source_digest},
        "plan_digest": plan.plan_digest,
        "compression": o.compression,
        "index": o.compression is None,
        "feature_spec": spec_to_json(plan.feature_spec),
        "splits": splits,
        "classes": plan.label_map.names if plan.label_map else None,
        "label_map": plan.label_map.to_dict() if plan.label_map else None,
        "multi_label": plan.multi_label,
        "schema": plan.schema.to_dict() if plan.schema else None,
        "options": options,
        "runtime": runtime,
        "counts": {"rows_read": plan.rows_read, "rows_converted": converted, "records_written": written,
                   "rows_discarded": len(discards)},
        "discard_report": f"{o.prefix}-discards.csv",
    }
    # a bug, never a data problem: every row is converted or discarded, and a converted row
    # gives one record (several only for the clips of a video)
    one_each = o.model_type != "VIDEO_CLASSIFICATION"
    if plan.rows_read != converted + len(discards) or (written != converted if one_each else written < converted):
        raise AssertionError(f"counts do not add up: {plan.rows_read} read, {converted} converted into {written} "
                             f"records, {len(discards)} discarded")
    storage.write_bytes(manifest_url(output_dir, o.prefix),
                        json.dumps(manifest, ensure_ascii=False, indent=1, default=str).encode(), storage_options)
    return manifest


def remove_staging(plan: Plan, output_dir: str, storage_options: Mapping[str, Any] | None) -> int:
    """Remove the hidden staging files of shard writes that did not finish (a task attempt
    killed mid-write, retried elsewhere); returns how many. Local output only: object stores
    stage in the writer's memory or local disk, never in the output."""
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

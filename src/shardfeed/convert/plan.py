"""The plan of a conversion: every input row placed in a split and a shard, before any
image is read.

Shards are fixed by the input alone (``num_samples_per_tfrecord`` rows each, in input
order per split), so a shard is an independent unit of work: runners may do shards in
any order or in parallel, and ``resume`` can skip the ones already written. The same
input and options always give the same plan (and the same ``plan_digest``).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._version import __version__
from .annotations import row_class_names
from .classes import CharTable, LabelMap, build_label_map, load_char_table
from .options import SPLITS, ConvertOptions, DiscardRecord, Row
from .schema import Schema
from .tasks import ConvertContext, make_converter

# options that change how fast a job runs, never what it writes
RUNTIME_OPTIONS = ("read_parallel_num", "write_parallel_num", "executor")


@dataclass
class Shard:
    split: str
    index: int
    count: int
    rows: list[Row]

    def name(self, prefix: str, suffix: str) -> str:
        return f"{prefix}-{self.split}-{self.index:05d}-of-{self.count:05d}{suffix}"


@dataclass
class Plan:
    """What to write: options, schema and label map, shards with their rows, the rows
    discarded while the input was read, and digests of the source and of the plan."""

    options: ConvertOptions
    schema: Schema | None
    label_map: LabelMap | None
    chars: CharTable
    multi_label: bool
    has_image: bool
    shards: list[Shard]
    discards: list[DiscardRecord]
    rows_read: int
    source: str
    source_digest: str
    plan_digest: str = ""
    feature_spec: dict[str, Any] = field(default_factory=dict)
    # where a runner's workers may read the rows again themselves (runner_beam), or None
    reread: dict[str, Any] | None = None
    # input rows per shard: num_samples_per_tfrecord, or fewer for bytes_per_tfrecord
    rows_per_shard: int = 0

    def context(self, storage_options: Mapping[str, Any] | None) -> ConvertContext:
        return ConvertContext(self.options, self.label_map, self.chars, storage_options, self.schema,
                              self.multi_label)

    def shard_name(self, shard: Shard) -> str:
        return shard.name(self.options.prefix, self.options.suffix)

    def splits(self) -> list[str]:
        return [s for s in SPLITS if any(sh.split == s for sh in self.shards)]


_PLAIN = (str, int, bool, type(None))  # exact types _canon returns as they are


def _canon(v: Any) -> Any:
    """``v`` as JSON can hold it, the same for the same value in any runner: floats as
    their ``repr``, numpy scalars as Python's, bytes as hex, other objects as ``str``."""
    t = type(v)
    if t in _PLAIN:  # the common cells first, by exact type (a subclass takes the general path)
        return v
    if t is float:
        return repr(v)
    if t is dict:
        return {str(k): (x if type(x) in _PLAIN else repr(x) if type(x) is float else _canon(x))
                for k, x in v.items()}
    if t is list:
        return [x if type(x) in _PLAIN else _canon(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return repr(float(v))
    if isinstance(v, bytes):
        return v.hex()
    return v if isinstance(v, (str, int, bool)) or v is None else str(v)


def _json_line_encoder() -> Any:
    """A function giving ``json.dumps(v, ensure_ascii=False, sort_keys=True)`` for the
    values :func:`_canon` returns, with the C encoder built once rather than per call
    (``json.dumps`` builds one per call: half the cost of a short row)."""
    from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

    if c_make_encoder is None:  # pragma: no cover - CPython without its _json module
        return json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode
    enc = c_make_encoder(None, json.JSONEncoder().default, encode_basestring, None, ": ", ", ", True, False, True)
    return lambda v: "".join(enc(v, 0))


_DIGEST_ROWS = 4096  # rows hashed per update


_DUMPS: Any = None


def _dumps(v: Any) -> str:
    """``json.dumps(v, ensure_ascii=False, sort_keys=True)`` for what :func:`_canon` returns."""
    global _DUMPS
    if _DUMPS is None:
        _DUMPS = _json_line_encoder()
    return _DUMPS(v)


def _c(x: Any) -> Any:
    return x if type(x) in _PLAIN else _canon(x)


def canon_values(rows: list[Row]) -> list[str]:
    """The canonical JSON of each row's values (``_canon(row.values)``, sorted keys): the
    part of what :func:`source_digest` and :func:`assign_splits` hash that is most of it,
    made once. Both splice it into their JSON lists, which give the same text as encoding
    the whole list (a list's JSON is its items' JSON joined by ", " in brackets)."""
    return [_dumps(_canon(r.values)) if r.values else "" for r in rows]


def _digest_chunk(rows: list[Row], canon: list[str] | None) -> bytes:
    """The lines :func:`source_digest` hashes for ``rows`` (``canon``: their
    :func:`canon_values`, or None), each followed by a newline."""
    dumps = _dumps
    lines = []
    for j, r in enumerate(rows):
        n, o, u, sp, lab = r.number, r.origin, r.image_uri, r.split, r.label
        if canon is not None and r.values:  # the JSON of _canon's list, its values part made once
            head = dumps([_c(n), _c(o), _c(u), _c(sp), _c(lab)])
            lines.append(f"{head[:-1]}, {canon[j]}, {dumps(_c(r.annotation))}]")
            continue
        v = [n, o, u, sp, lab, r.values, r.annotation]
        # a folder's or a plain CSV's row holds plain values only: _canon would return them as they are
        if (r.values or r.annotation is not None or type(n) not in _PLAIN or type(o) not in _PLAIN
                or type(u) not in _PLAIN or type(sp) not in _PLAIN or type(lab) not in _PLAIN):
            v = _canon(v)
        lines.append(dumps(v))
    lines.append("")
    return "\n".join(lines).encode()


def _digest_discards(h: Any, discards: list[DiscardRecord]) -> str:
    for d in discards:
        h.update(json.dumps([d.row, d.source, d.reason], ensure_ascii=False).encode() + b"\n")
    return "sha256:" + h.hexdigest()


def source_digest(rows: list[Row], discards: list[DiscardRecord], canon: list[str] | None = None) -> str:
    """sha256 over what was read from the input (rows and the rows that did not parse):
    per row, the canonical JSON (sorted keys) of ``[number, origin, image_uri, split,
    label, values, annotation]`` and a newline. ``canon``: :func:`canon_values` of ``rows``,
    when the caller has it."""
    h = hashlib.sha256()
    for i in range(0, len(rows), _DIGEST_ROWS):
        h.update(_digest_chunk(rows[i:i + _DIGEST_ROWS], None if canon is None else canon[i:i + _DIGEST_ROWS]))
    return _digest_discards(h, discards)


def digest_and_assign(rows: list[Row], discards: list[DiscardRecord], options: ConvertOptions) -> str:
    """``source_digest(rows, discards)``, then ``assign_splits(rows, ...)`` with ``options``'
    ratio, seed and split key: the same digest and splits, made a chunk of rows at a time
    (each chunk hashed before its own rows get their splits) with the canonical JSON of
    each row's values made once and only one chunk's held at a time."""
    h = hashlib.sha256()
    for i in range(0, len(rows), _DIGEST_ROWS):
        chunk = rows[i:i + _DIGEST_ROWS]
        canon = canon_values(chunk)
        h.update(_digest_chunk(chunk, canon))
        assign_splits(chunk, options.test_ratio, options.seed, options.split_key, canon)
    return _digest_discards(h, discards)


def split_key_value(row: Row, split_key: str | None) -> Any:
    """What decides ``row``'s split: the value of the column ``split_key`` names (a schema
    column, or ``image_uri`` / ``label``), else the row's content (image URI, label as
    text, typed columns, annotation; not its number or origin, so the same row read from a CSV,
    a Parquet file or a DataFrame lands in the same split)."""
    if split_key is None:
        return [row.image_uri, None if row.label is None else str(row.label), row.values, row.annotation]
    if split_key in row.values:
        return row.values[split_key]
    if split_key == "image_uri":
        return row.image_uri
    if split_key == "label":
        return row.label
    raise ValueError(f"split_key {split_key!r} names no column of the input (columns: "
                     f"{', '.join(['image_uri', 'label', *row.values])})")


def key_split(key: Any, test_ratio: float, seed: int) -> str:
    """``"test"`` or ``"train"`` for a row whose split key is ``key``: the row goes to test
    when blake2b(seed, canonical JSON of key), read as a fraction in [0, 1), is below
    ``test_ratio``. A function of the key alone: no other row, no row order, no
    partitioning, no worker count changes it."""
    if test_ratio <= 0.0:
        return "train"
    return _json_key_split(_dumps(_canon(key)), test_ratio, seed)


def _json_key_split(text: str, test_ratio: float, seed: int) -> str:
    """:func:`key_split` of a key whose canonical JSON is ``text``."""
    h = hashlib.blake2b(text.encode(), digest_size=8, key=str(int(seed)).encode()).digest()
    return "test" if int.from_bytes(h, "big") / 2.0 ** 64 < test_ratio else "train"


def assign_split(row: Row, options: ConvertOptions) -> None:
    """Give ``row`` its split when the input had none (see :func:`key_split`)."""
    if row.split is None:
        row.split = key_split(split_key_value(row, options.split_key), options.test_ratio, options.seed)


def assign_splits(rows: list[Row], test_ratio: float, seed: int, split_key: str | None = None,
                  canon: list[Any] | None = None) -> None:
    """Rows without a split go to ``test`` by :func:`key_split` of their split key, the
    rest to ``train``: each row independently, so about (not exactly) ``n * test_ratio``
    of ``n`` rows go to test, and every runner (local, Beam, Spark) puts a row in the
    same split. ``canon``: :func:`canon_values` of ``rows``, when the caller has it."""
    whole_row = canon is not None and split_key is None and test_ratio > 0.0
    for j, r in enumerate(rows):
        if r.split is None:
            if whole_row and r.values:  # the JSON of _canon(split_key_value(r, None)), its values part made once
                head = _dumps([_c(r.image_uri), None if r.label is None else str(r.label)])
                text = f"{head[:-1]}, {canon[j]}, {_dumps(_c(r.annotation))}]"
                r.split = _json_key_split(text, test_ratio, seed)
            else:
                r.split = key_split(split_key_value(r, split_key), test_ratio, seed)


SAMPLE_ROWS = 256  # rows converted to measure the record size for bytes_per_tfrecord


def sample_key(row: Row, seed: int) -> int:
    """Where ``row`` ranks for the size sample (the ``SAMPLE_ROWS`` lowest are taken): a
    signed 64-bit blake2b of its content (as :func:`split_key_value` with no split key),
    so the same rows are sampled on every runner and partitioning."""
    data = json.dumps(_canon(split_key_value(row, None)), ensure_ascii=False, sort_keys=True).encode()
    h = hashlib.blake2b(data, digest_size=8, key=f"size-sample:{int(seed)}".encode()).digest()
    return int.from_bytes(h, "big", signed=True)


def size_shards(plan: Plan, sample: list[Row], storage_options: Mapping[str, Any] | None) -> int:
    """Rows per shard for ``plan``: ``num_samples_per_tfrecord``, or with
    ``bytes_per_tfrecord`` that many bytes over the mean framed size of the records of the
    ``sample`` rows (converted here; discarded rows are not counted), at least 1."""
    o = plan.options
    per = o.num_samples_per_tfrecord
    if o.bytes_per_tfrecord is None or not sample:
        return per
    from .writer import convert_row  # the writer imports this module

    converter = make_converter(plan.context(storage_options), plan.has_image)
    sizes = []
    for row in sample:
        records, _ = convert_row(converter, row)
        if records:
            sizes.append(sum(len(r) + 16 for r in records))  # 16: TFRecord framing per record
    if not sizes:
        return per
    return max(1, min(per, int(o.bytes_per_tfrecord * len(sizes) // sum(sizes))))


def needs_class_list(model_type: str, label_type: str | None, annotated: bool) -> bool:
    """Whether the plan builds a label map from class names found in the data."""
    return (model_type in ("CLASSIFICATION", "VIDEO_CLASSIFICATION", "DETECTION", "INSTANCE_SEGMENTATION",
                           "TEXT_DETECTION", "TEXT_END2END")
            and (annotated or label_type == "string label"))


def is_multi_label(model_type: str, row: Row) -> bool:
    """Whether an annotated row names several classes (multi-label classification)."""
    return (model_type in ("CLASSIFICATION", "VIDEO_CLASSIFICATION") and isinstance(row.annotation, dict)
            and len(row.annotation.get("classes", ())) > 1)


def shard_layout(split_counts: Mapping[str, int], per: int) -> list[Shard]:
    """Shards of ``per`` rows each, per split in SPLITS order, without their rows."""
    shards = []
    for split in SPLITS:
        count = math.ceil(split_counts.get(split, 0) / per)
        shards.extend(Shard(split, i, count, []) for i in range(count))
    return shards


def finish_plan(shards: list[Shard], discards: list[DiscardRecord], rows_read: int, schema: Schema | None,
                options: ConvertOptions, source: str, digest: str, class_names: set[str] | None,
                multi_label: bool, storage_options: Mapping[str, Any] | None = None, has_image: bool = True,
                annotated: bool = False) -> Plan:
    """The plan from what was learnt reading the input (by the driver, or summed over a
    cluster's partitions): the label map from ``class_names`` (None: no label map), the
    feature spec and the plan digest."""
    label_map = None
    if class_names is not None:
        label_map = build_label_map(class_names, options.class_list_file, default_class=options.default_class,
                                    error_class=options.error_class, ignore_class=options.ignore_class,
                                    storage_options=storage_options)
    chars = load_char_table(options.char_replace_map_path, options.default_char_dict_path, storage_options)
    plan = Plan(options, schema if not annotated else None, label_map, chars, multi_label, has_image, shards,
                discards, rows_read, source, digest, rows_per_shard=options.num_samples_per_tfrecord)
    plan.feature_spec = make_converter(plan.context(storage_options), has_image).feature_spec()
    opts = {k: v for k, v in options.to_dict().items() if k not in RUNTIME_OPTIONS}
    plan.plan_digest = "sha256:" + hashlib.sha256(json.dumps(
        _canon([digest, opts, __version__]), sort_keys=True, default=str).encode()).hexdigest()
    return plan


def make_plan(rows: list[Row], discards: list[DiscardRecord], schema: Schema | None, options: ConvertOptions,
              source: str, storage_options: Mapping[str, Any] | None = None, has_image: bool = True,
              annotated: bool = False) -> Plan:
    """Place rows in splits and shards, build the label map and the feature spec."""
    digest = digest_and_assign(rows, discards, options)
    mt = options.model_type
    label_type = schema.label_type if (schema is not None and not annotated) else None
    class_names = None
    if needs_class_list(mt, label_type, annotated):
        class_names = set()
        for r in rows:
            class_names.update(row_class_names(mt, r))
    multi_label = annotated and any(is_multi_label(mt, r) for r in rows)
    plan = finish_plan([], discards, len(rows) + len(discards), schema, options, source, digest, class_names,
                       multi_label, storage_options, has_image, annotated)
    if options.bytes_per_tfrecord is not None:
        sample = heapq.nsmallest(SAMPLE_ROWS, rows, key=lambda r: sample_key(r, options.seed))
        plan.rows_per_shard = size_shards(plan, sample, storage_options)
    per = plan.rows_per_shard
    for split in SPLITS:
        in_split = [r for r in rows if r.split == split]
        count = math.ceil(len(in_split) / per)
        for i in range(count):
            plan.shards.append(Shard(split, i, count, in_split[i * per:(i + 1) * per]))
    return plan

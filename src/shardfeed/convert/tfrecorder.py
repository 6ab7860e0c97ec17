"""Reading what TFRecorder (google/tensorflow-recorder) wrote.

A TFRecorder job folder (``<output_dir>/tfrecorder-<YYYYmmdd-HHMMSS>-<job_label>/``) holds:

- ``train-00000-of-0000N.tfrecord.gz``, ``validation-...``, ``test-...``: GZIP TFRecord
  shards of ``tf.train.Example`` records (``.tfrecord`` without compression), written by
  Beam's ``WriteToTFRecord`` through tf.Transform's ``ExampleProtoCoder``;
- ``discarded-data-00000-of-0000N``: the rows it could not use (bad split value, image
  that would not load), written by Beam's ``WriteToText``: one Python ``repr`` of the row
  dict per line, not TFRecord;
- ``transform_fn/`` (its ``assets/`` hold the label vocabulary, one name per line, line i
  is label id i) and ``transformed_metadata/``: the tf.Transform output.

Every record has ``split`` (bytes), ``image_name`` (bytes), ``image`` (the raw pixels,
row-major height x width x channels uint8, as PIL's ``tobytes()``, base64 with the
URL-safe alphabet ``-_``), ``image_height``, ``image_width``, ``image_channels`` (int64)
and ``label`` (int64: a string label integerised through the vocabulary, or the integer
label as given). :func:`decode_image` turns ``image`` back into a ``(h, w, c)`` array.
"""

from __future__ import annotations

import ast
import base64
import binascii
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import storage
from ..errors import DecodeError
from ..storage.urls import mask
from .layout import join

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test", "discarded-data")
_ALIASES = {"val": "validation", "discard": "discarded-data", "discarded": "discarded-data"}
# Beam's default shard template: <prefix>-SSSSS-of-NNNNN<suffix>; "val" is an early release's prefix
_SHARD = re.compile(r"^(train|validation|val|test|discarded-data)-\d+-of-\d+(\..*)?$")
SAMPLE_RECORDS = 16


@dataclass
class TFRecorderLayout:
    """A TFRecorder job folder: its URL, the TFRecord shards per split, the
    ``discarded-data`` text files, and whether the tf.Transform folders are there."""

    root: str
    splits: dict[str, list[str]] = field(default_factory=dict)
    discarded_text: list[str] = field(default_factory=list)
    transform_fn: bool = False

    def split_names(self) -> list[str]:
        names = [s for s in SPLITS if self.splits.get(s)]
        return names + (["discarded-data"] if self.discarded_text and "discarded-data" not in names else [])


def split_name(split: str) -> str:
    """A split as TFRecorder names its files: ``TRAIN``/``train`` -> ``train``,
    ``val`` -> ``validation``, ``DISCARD`` -> ``discarded-data``."""
    s = str(split).lower()
    return _ALIASES.get(s, s)


def _layout_of(root: str, names: list[str]) -> TFRecorderLayout | None:
    layout = TFRecorderLayout(root)
    for name in names:
        m = _SHARD.match(name)
        if not m:
            continue
        split = split_name(m.group(1))
        if split == "discarded-data" and ".tfrecord" not in name:
            layout.discarded_text.append(join(root, name))
        else:
            layout.splits.setdefault(split, []).append(join(root, name))
    if not any(layout.splits.get(s) for s in SPLITS[:3]):
        return None
    return layout


def find_layout(url: str, storage_options: Mapping[str, Any] | None = None) -> TFRecorderLayout | None:
    """The TFRecorder layout in ``url``: the job folder itself, or the ``output_dir`` it
    was given when that holds exactly one ``tfrecorder-*`` job folder. ``None`` when
    ``url`` is neither.

    Raises ``ValueError`` naming the job folders when ``url`` holds several.
    """
    root = url.rstrip("/") or url
    try:
        listed = storage.list_dir(root, storage_options)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError):
        return None
    if any(u.rstrip("/") == root for u in listed):
        return None  # a file (a listing of a file is the file): one shard, not a job folder
    names = [u.rsplit("/", 1)[-1] for u in listed]
    layout = _layout_of(root, sorted(names))
    if layout is None:
        try:
            found = storage.glob(join(root, "tfrecorder-*/*-of-*"), storage_options)
        except (OSError, ValueError):
            return None
        jobs = sorted({u.rsplit("/", 2)[-2] for u in found if _SHARD.match(u.rsplit("/", 1)[-1])})
        if not jobs:
            return None
        if len(jobs) > 1:
            raise ValueError(f"{mask(root)} holds {len(jobs)} TFRecorder jobs ({', '.join(jobs)}); "
                             f"pass the job folder, e.g. {mask(join(root, jobs[-1]))}")
        root = join(root, jobs[0])
        layout = _layout_of(root, sorted(u.rsplit("/", 1)[-1] for u in found if u.rsplit("/", 2)[-2] == jobs[0]))
        if layout is None:
            return None
    try:
        layout.transform_fn = bool(storage.glob(join(layout.root, "transform_fn/*"), storage_options))
    except (OSError, ValueError):
        layout.transform_fn = False
    return layout


def read_vocabulary(layout: TFRecorderLayout, storage_options: Mapping[str, Any] | None = None) -> list[str] | None:
    """The label names by id, from tf.Transform's vocabulary file under
    ``transform_fn/assets/`` (``None`` without one, or with several)."""
    try:
        files = storage.glob(join(layout.root, "transform_fn/assets/*vocab*"), storage_options)
    except (OSError, ValueError):
        return None
    if len(files) != 1:
        return None
    text = storage.read_bytes(files[0], storage_options=storage_options).decode("utf-8")
    return text.splitlines()


def _value(v: Any) -> Any:
    if isinstance(v, (list, tuple)) and len(v) == 1:
        return v[0]
    if isinstance(v, np.ndarray) and v.shape == (1,):
        return v[0]
    return v


def decode_image(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record with ``image`` (TFRecorder's base64 of raw pixels) decoded into a uint8
    array of shape ``(image_height, image_width, image_channels)``; other fields as they
    are. A record without ``image`` (a discarded row whose image did not load) is returned
    unchanged.

    When the byte count disagrees with ``image_channels`` but is a whole number of
    pixels (TFRecorder calls every mode but ``L`` 3 channels, so an RGBA image holds 4
    bytes a pixel), the channels are taken from the byte count. Raises
    :class:`~shardfeed.errors.DecodeError` for bytes that are not base64 or not a whole
    ``height x width`` image.
    """
    data = _value(record.get("image"))
    if not isinstance(data, (bytes, bytearray)) or "image_height" not in record:
        return dict(record)
    h, w = int(_value(record["image_height"])), int(_value(record["image_width"]))
    c = int(_value(record.get("image_channels", 3)))
    data = bytes(data).strip()
    try:
        raw = base64.b64decode(data + b"=" * (-len(data) % 4), altchars=b"-_", validate=False)
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"TFRecorder image {_value(record.get('image_name'))!r} is not base64 ({exc})") from None
    if h <= 0 or w <= 0 or len(raw) % (h * w):
        raise DecodeError(f"TFRecorder image {_value(record.get('image_name'))!r}: {len(raw)} bytes are not a "
                          f"{h}x{w} image (image_height={h}, image_width={w}, image_channels={c})")
    if len(raw) != h * w * c:
        c = len(raw) // (h * w)
    out = dict(record)
    out["image"] = np.frombuffer(raw, np.uint8).reshape(h, w, c)
    return out


def _literal_rows(url: str, storage_options: Mapping[str, Any] | None) -> Iterator[dict[str, Any]]:
    text = storage.read_bytes(url, storage_options=storage_options).decode("utf-8")
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = ast.literal_eval(line)
        except (ValueError, SyntaxError) as exc:
            raise DecodeError(f"{mask(url)} line {i + 1}: not a row TFRecorder wrote ({exc})") from None
        if not isinstance(row, dict):
            raise DecodeError(f"{mask(url)} line {i + 1}: not a row TFRecorder wrote (a {type(row).__name__})")
        yield row


class DiscardedRows:
    """The rows of TFRecorder's ``discarded-data`` text files, as dicts, re-read on
    every pass (values as TFRecorder held them: bytes, str, int)."""

    def __init__(self, urls: list[str], storage_options: Mapping[str, Any] | None = None):
        self.urls = list(urls)
        self.storage_options = storage_options

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for url in self.urls:
            yield from _literal_rows(url, self.storage_options)

    def count(self) -> int:
        return sum(1 for _ in self)


def sample_records(files: list[str], n: int = SAMPLE_RECORDS,
                   storage_options: Mapping[str, Any] | None = None) -> list[bytes]:
    """Up to ``n`` serialized records from the start of ``files``."""
    from ..formats.tfrecord import TFRecordReader

    out: list[bytes] = []
    for url in files:
        with TFRecordReader(url, compression="auto", storage_options=storage_options) as r:
            for record in r:
                out.append(record)
                if len(out) >= n:
                    return out
    return out


def infer_spec(layout: TFRecorderLayout, split: str, storage_options: Mapping[str, Any] | None = None):
    """The feature spec of ``split``'s records, inferred from a sample of them (of another
    split's when this one is empty: TFRecorder writes the same features to every split);
    ``None`` when no split holds a record."""
    from ..formats.inspect import inspect_records, spec_of

    order = [split] + [s for s in SPLITS if s != split]
    for s in order:
        records = sample_records(layout.splits.get(s, []), storage_options=storage_options)
        if records:
            return spec_of(inspect_records(records))
    return None


def read_split(layout: TFRecorderLayout, split: str, storage_options: Mapping[str, Any] | None = None,
               **read_kwargs: Any):
    """A dataset over one split of a TFRecorder job folder, records parsed with the
    spec :func:`infer_spec` gives and ``image`` decoded by :func:`decode_image`. The text
    ``discarded-data`` report reads as a dataset of its rows.

    Raises ``ValueError`` naming the splits there are when ``split`` has none.
    """
    from ..pipeline import Dataset, read_tfrecord

    name = split_name(split)
    files = layout.splits.get(name, [])
    if not files:
        if name == "discarded-data" and layout.discarded_text:
            if read_kwargs:
                raise ValueError(f"discarded-data is TFRecorder's text report, not TFRecord; "
                                 f"read_tfrecord options ({', '.join(read_kwargs)}) do not apply to it")
            return Dataset.from_iterable(DiscardedRows(layout.discarded_text, storage_options)).map(decode_image)
        have = ", ".join(layout.split_names()) or "none"
        raise ValueError(f"{mask(layout.root)}: TFRecorder wrote no split {split!r} here (splits: {have})")
    spec = infer_spec(layout, name, storage_options)
    ds = read_tfrecord(files, spec=spec, compression="auto", storage_options=storage_options, **read_kwargs)
    return ds.map(decode_image)

"""``inspect_output``: look at what a conversion wrote.

Decodes the first records of each split, writes each image as a PNG with its boxes,
polygons and class names drawn and its segmentation mask blended in, and a CSV with the
other fields of those records, so a person can check a conversion by eye. A TFRecorder
job folder (:mod:`shardfeed.convert.tfrecorder`) is inspected the same way, with its
record counts per split, the schema of a sample and the label vocabulary.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..formats.example import decode_example
from ..formats.tfrecord import TFRecordReader
from .layout import join
from .reading import load_manifest
from .tfrecorder import (
    DiscardedRows,
    TFRecorderLayout,
    decode_image,
    find_layout,
    read_vocabulary,
    sample_records,
    split_name,
)

_PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
            (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


def _text(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        v = [bytes(v)]
    if isinstance(v, np.ndarray):
        return json.dumps(v.tolist())
    if isinstance(v, list):
        out = []
        for b in v:
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                out.append("base64:" + base64.b64encode(b).decode())
        return out[0] if len(out) == 1 else json.dumps(out, ensure_ascii=False)
    return str(v)


def _scalar(feats: Mapping[str, Any], key: str, default: Any = None) -> Any:
    v = feats.get(key)
    if v is None or len(v) == 0:
        return default
    return v[0]


def _picture(feats: Mapping[str, Any]):
    from PIL import Image

    data = _scalar(feats, "image/encoded")
    if data is not None:
        return Image.open(io.BytesIO(data)).convert("RGB")
    pixels = feats.get("image")  # TFRecorder's raw pixels, decoded by decode_image
    if isinstance(pixels, np.ndarray) and pixels.ndim == 3 and pixels.shape[2] in (1, 3, 4):
        return Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).convert("RGB")
    return None


def render(feats: Mapping[str, Any], caption: str | None = None):
    """A PIL image of the record's image with its annotations drawn (None without an
    image); ``caption`` is written on it in place of the record's class text."""
    from PIL import Image, ImageDraw

    im = _picture(feats)
    if im is None:
        return None
    w, h = im.size
    mask = _scalar(feats, "image/segmentation/class/encoded")
    if mask is not None:
        m = np.asarray(Image.open(io.BytesIO(mask)).convert("L").resize((w, h), Image.Resampling.NEAREST))
        colours = np.array([(0, 0, 0)] + _PALETTE * 22, np.uint8)[: 256]
        overlay = Image.fromarray(colours[m])
        im = Image.blend(im, overlay, 0.45)
    labels_all = feats.get("image/object/class/label", np.zeros(0, np.int64))
    for i, m in enumerate(feats.get("image/object/mask") or []):  # instance masks, coloured by class
        inst = np.asarray(Image.open(io.BytesIO(m)).convert("L").resize((w, h), Image.Resampling.NEAREST)) > 0
        colour = _PALETTE[int(labels_all[i]) % len(_PALETTE)] if len(labels_all) > i else _PALETTE[0]
        a = np.asarray(im).copy()
        a[inst] = (0.55 * a[inst] + 0.45 * np.array(colour)).astype(np.uint8)
        im = Image.fromarray(a)
    draw = ImageDraw.Draw(im)
    xmin = feats.get("image/object/bbox/xmin")
    if xmin is not None and len(xmin):
        ymin, xmax, ymax = (feats[f"image/object/bbox/{k}"] for k in ("ymin", "xmax", "ymax"))
        labels = feats.get("image/object/class/label", np.zeros(len(xmin), np.int64))
        texts = feats.get("image/object/class/text") or []
        ignored = feats.get("image/object/ignored", np.zeros(len(xmin), np.int64))
        poly = feats.get("image/object/polygon")
        counts = feats.get("image/object/polygon/num_points")
        counts = [int(c) for c in counts] if counts is not None else [4] * len(xmin)
        starts = np.concatenate([[0], np.cumsum(counts)]) * 2 if counts else [0]
        for i in range(len(xmin)):
            colour = _PALETTE[int(labels[i]) % len(_PALETTE)] if len(labels) > i else _PALETTE[0]
            box = [xmin[i] * w, ymin[i] * h, xmax[i] * w, ymax[i] * h]
            draw.rectangle(box, outline=colour, width=1 if (len(ignored) > i and ignored[i]) else 2)
            if poly is not None and i < len(counts) and len(poly) >= starts[i + 1]:
                pts = [(poly[starts[i] + 2 * j] * w, poly[starts[i] + 2 * j + 1] * h) for j in range(counts[i])]
                draw.polygon(pts, outline=(255, 255, 255))
            if len(texts) > i:
                draw.text((box[0] + 2, box[1] + 1), texts[i].decode("utf-8", "replace"), fill=colour)
    else:
        label = [caption.encode("utf-8")] if caption else (feats.get("image/class/text") or feats.get("image/text"))
        if label:
            draw.text((3, 3), ", ".join(t.decode("utf-8", "replace") for t in label), fill=(255, 255, 0))
    return im


def inspect_output(output_dir: str, out: str, n: int = 8, split: str | None = None, prefix: str | None = None,
                   storage_options: Mapping[str, Any] | None = None, sample: int = 1000) -> dict[str, Any]:
    """Write up to ``n`` decoded samples per split of the conversion in ``output_dir`` to the
    local folder ``out``: ``<split>-<i>.png`` with annotations drawn, and ``samples.csv``
    with their fields (the image bytes left out). Returns a summary dict. A folder without
    a manifest that holds TFRecorder's output goes to :func:`inspect_tfrecorder`
    (``sample`` records for its schema)."""
    try:
        manifest = load_manifest(output_dir, prefix, storage_options)
    except FileNotFoundError:
        layout = None if prefix is not None else find_layout(output_dir, storage_options)
        if layout is None:
            raise
        return inspect_tfrecorder(layout, out, n=n, split=split, sample=sample, storage_options=storage_options)
    os.makedirs(out, exist_ok=True)
    splits = [split.lower()] if split else list(manifest["splits"])
    rows: list[dict[str, str]] = []
    images: list[str] = []
    for sp in splits:
        taken = 0
        for shard in manifest["splits"].get(sp, {}).get("shards", []):
            if taken >= n:
                break
            url = join(output_dir, shard["file"])
            with TFRecordReader(url, compression=manifest["compression"], storage_options=storage_options) as r:
                for record in r:
                    if taken >= n:
                        break
                    feats = decode_example(record)
                    name = f"{sp}-{taken:03d}.png"
                    im = render(feats)
                    if im is not None:
                        im.save(os.path.join(out, name))
                        images.append(name)
                    fields = {"split": sp, "file": shard["file"], "image": name if im is not None else ""}
                    fields.update({k: _text(v) for k, v in feats.items()
                                   if k not in ("image/encoded", "image/segmentation/class/encoded",
                                                "image/object/mask", "video/encoded")})
                    rows.append(fields)
                    taken += 1
    _write_csv(out, rows)
    return {"samples": len(rows), "images": images, "csv": os.path.join(out, "samples.csv"),
            "counts": manifest["counts"], "splits": {k: v["records"] for k, v in manifest["splits"].items()}}


def _write_csv(out: str, rows: list[dict[str, str]]) -> None:
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    with open(os.path.join(out, "samples.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns or ["split"])
        w.writeheader()
        w.writerows(rows)


def _split_records(layout: TFRecorderLayout, split: str, storage_options) -> Any:
    """``(file name, fields)`` of every record of ``split``, in file order: decoded Examples,
    or the rows of the text discard report."""
    files = layout.splits.get(split, [])
    if not files and split == "discarded-data":
        for url in layout.discarded_text:
            for row in DiscardedRows([url], storage_options):
                yield url.rsplit("/", 1)[-1], row
        return
    for url in files:
        with TFRecordReader(url, compression="auto", storage_options=storage_options) as r:
            for record in r:
                yield url.rsplit("/", 1)[-1], decode_example(record)


def _count(layout: TFRecorderLayout, split: str, storage_options) -> int:
    files = layout.splits.get(split, [])
    if not files:
        return DiscardedRows(layout.discarded_text, storage_options).count() if split == "discarded-data" else 0
    n = 0
    for url in files:
        with TFRecordReader(url, compression="auto", storage_options=storage_options) as r:
            for _ in r:
                n += 1
    return n


def _label_name(label: Any, vocab: list[str] | None) -> str | None:
    """The vocabulary's name for an integerised label (``None`` for a label outside it:
    tf.Transform's -1 for a name the train split did not hold, or a text label)."""
    if isinstance(label, (list, np.ndarray)):
        label = label[0] if len(label) == 1 else None
    if vocab and isinstance(label, (int, np.integer)) and 0 <= int(label) < len(vocab):
        return vocab[int(label)]
    return None


def inspect_tfrecorder(layout: TFRecorderLayout, out: str, n: int = 8, split: str | None = None,
                       sample: int = 1000, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`inspect_output` for a TFRecorder job folder: up to ``n`` samples per split
    drawn to ``<split>-<i>.png`` (captioned with the label name from the vocabulary) and
    listed in ``samples.csv``; the summary holds the records per split (counted by reading
    every shard), the schema of up to ``sample`` records (:func:`~shardfeed.formats.inspect.inspect_records`) and the
    label vocabulary."""
    from ..formats.inspect import inspect_records

    os.makedirs(out, exist_ok=True)
    vocab = read_vocabulary(layout, storage_options)
    names = layout.split_names()
    wanted = [split_name(split)] if split else names
    if split and wanted[0] not in names:
        raise ValueError(f"{layout.root}: TFRecorder wrote no split {split!r} here (splits: {', '.join(names)})")
    rows: list[dict[str, str]] = []
    images: list[str] = []
    for sp in wanted:
        taken = 0
        for file, feats in _split_records(layout, sp, storage_options):
            if taken >= n:
                break
            feats = decode_image(feats)
            label_name = _label_name(feats.get("label"), vocab)
            name = f"{sp}-{taken:03d}.png"
            im = render(feats, caption=label_name)
            if im is not None:
                im.save(os.path.join(out, name))
                images.append(name)
            fields = {"split": sp, "file": file, "image": name if im is not None else ""}
            # the record's own split (TRAIN, or what got the row discarded) beside the file's
            fields.update({(f"record_{k}" if k in fields else k): _text(v) for k, v in feats.items() if k != "image"})
            if label_name is not None:
                fields["label_name"] = label_name
            rows.append(fields)
            taken += 1
    _write_csv(out, rows)
    records: list[bytes] = []
    for sp in names:
        if len(records) < sample:
            records += sample_records(layout.splits.get(sp, []), sample - len(records), storage_options)
    return {"layout": "tfrecorder", "root": layout.root, "transform_fn": layout.transform_fn,
            "splits": {sp: _count(layout, sp, storage_options) for sp in names}, "labels": vocab,
            "schema": inspect_records(records), "samples": len(rows), "images": images,
            "csv": os.path.join(out, "samples.csv")}


def is_converted_output(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``url`` is a folder holding a conversion manifest, or TFRecorder's output
    (for ``shardfeed inspect``)."""
    from .api import find_manifest

    try:
        find_manifest(url, storage_options=storage_options)
        return True
    except Exception:  # noqa: BLE001 - not a folder, several manifests, unreachable: not one
        pass
    try:
        return find_layout(url, storage_options) is not None
    except ValueError:  # several TFRecorder jobs: inspect_output says which to pick
        return True
    except Exception:  # noqa: BLE001 - unreachable: not one
        return False


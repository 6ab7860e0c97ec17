"""``inspect_output``: look at what a conversion wrote.

Decodes the first records of each split, writes each image as a PNG with its boxes,
polygons and class names drawn and its segmentation mask blended in, and a CSV with the
other fields of those records, so a person can check a conversion by eye.
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
from .api import load_manifest
from .writer import join

_PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
            (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


def _text(v: Any) -> str:
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


def render(feats: Mapping[str, Any]):
    """A PIL image of the record's image with its annotations drawn (None without an image)."""
    from PIL import Image, ImageDraw

    data = _scalar(feats, "image/encoded")
    if data is None:
        return None
    im = Image.open(io.BytesIO(data)).convert("RGB")
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
        label = feats.get("image/class/text") or feats.get("image/text")
        if label:
            draw.text((3, 3), ", ".join(t.decode("utf-8", "replace") for t in label), fill=(255, 255, 0))
    return im


def inspect_output(output_dir: str, out: str, n: int = 8, split: str | None = None, prefix: str | None = None,
                   storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write up to ``n`` decoded samples per split of the conversion in ``output_dir`` to the
    local folder ``out``: ``<split>-<i>.png`` with annotations drawn, and ``samples.csv``
    with their fields (the image bytes left out). Returns a summary dict."""
    manifest = load_manifest(output_dir, prefix, storage_options)
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
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    with open(os.path.join(out, "samples.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns or ["split"])
        w.writeheader()
        w.writerows(rows)
    return {"samples": len(rows), "images": images, "csv": os.path.join(out, "samples.csv"),
            "counts": manifest["counts"], "splits": {k: v["records"] for k, v in manifest["splits"].items()}}


def is_converted_output(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``url`` is a folder holding a conversion manifest (for ``shardfeed inspect``)."""
    from .api import find_manifest

    try:
        find_manifest(url, storage_options=storage_options)
        return True
    except Exception:  # noqa: BLE001 - not a folder, several manifests, unreachable: not one
        return False


"""Per-model-type converters: a row in, a dict of Example features out.

A converter has ``feature_spec() -> {key: FixedLen | VarLen}`` and
``convert(row, context) -> {key: values}``; it raises
:class:`~shardfeed.convert.options.Discard` to drop a row with a reason. Feature keys are
the ones tf.data users expect (``image/encoded``, ``image/class/label``,
``image/object/bbox/xmin`` ...). A ``SELF_DEFINED`` converter is a user class with the
same two methods, named by import path or ``shardfeed.converters`` entry point.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import storage
from ..errors import DecodeError, ParseError
from ..formats.example import encode_example
from ..formats.parse import parse_single_example
from ..formats.spec import FixedLen, VarLen
from ..storage.urls import mask
from .classes import CharTable, LabelMap
from .images import EncodedImage, image_size, load_image, load_mask
from .options import ConvertOptions, Discard, Row
from .polygons import collinear, encode_mask, rasterize
from .schema import Schema

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "shardfeed.converters"

IMAGE_SPEC = {
    "image/encoded": FixedLen("bytes"),
    "image/format": FixedLen("bytes"),
    "image/height": FixedLen("int64"),
    "image/width": FixedLen("int64"),
    "image/channels": FixedLen("int64"),
    "image/source_id": FixedLen("bytes"),
}


@dataclass
class ConvertContext:
    """What a converter may use: options, the label map, OCR char table, storage options."""

    options: ConvertOptions
    label_map: LabelMap | None = None
    chars: CharTable = field(default_factory=CharTable)
    storage_options: Mapping[str, Any] | None = None
    schema: Schema | None = None
    multi_label: bool = False

    def read(self, uri: str, what: str = "image") -> bytes:
        """Bytes at ``uri``; a missing or unreadable file raises :class:`Discard`."""
        try:
            return storage.read_bytes(uri, storage_options=self.storage_options)
        except FileNotFoundError:
            raise Discard(f"{what} not found") from None
        except IsADirectoryError:
            raise Discard(f"{what} path is a directory") from None
        except (OSError, ValueError) as exc:
            raise Discard(f"cannot read {what}: {type(exc).__name__}: {mask(str(exc))[:160]}") from None

    def image(self, row: Row, split: str) -> EncodedImage:
        if not row.image_uri:
            raise Discard("row has no image")
        o = self.options
        return load_image(self.read(row.image_uri), max_size=o.max_size_for(split), image_format=o.image_format,
                          jpeg_quality=o.jpeg_quality, max_pixels=o.max_image_pixels, check=o.image_check)


def image_features(img: EncodedImage, row: Row) -> dict[str, Any]:
    return {
        "image/encoded": img.data,
        "image/format": img.format,
        "image/height": img.height,
        "image/width": img.width,
        "image/channels": 3,
        "image/source_id": row.image_uri or row.key(),
    }


class TableConverter:
    """AutoML tables, user schemas, image folders and PAI/iTAG classification."""

    def __init__(self, ctx: ConvertContext, has_image: bool = True):
        self.ctx = ctx
        self.has_image = has_image
        schema = ctx.schema
        self.label_type = schema.label_type if schema is not None else "string label"
        if ctx.options.model_type == "CLASSIFICATION" and schema is None:
            self.label_type = "string label"
        self._by_label: dict[tuple, Any] = {}  # label value -> labels() result or its Discard
        # the schema's feature columns, as (column, type) pairs: read once, not per row
        self._columns = tuple(schema.feature_columns().items()) if schema is not None else ()

    def feature_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = dict(IMAGE_SPEC) if self.has_image else {}
        if self.label_type is not None:
            kind = VarLen if self.ctx.multi_label else FixedLen
            spec["image/class/label"] = kind("int64")
            if self.label_type == "string label":
                spec["image/class/text"] = kind("bytes")
        if self.ctx.schema is not None:
            spec.update(self.ctx.schema.feature_spec())
        return spec

    def labels(self, row: Row) -> tuple[list[int], list[str]]:
        """(label ids, class texts) of ``row``; the callers never change the lists returned."""
        if self.label_type == "integer label":
            return [int(row.label)], []
        if isinstance(row.annotation, dict):
            return self._labels(row.annotation["classes"])
        key = (type(row.label), row.label)  # a folder or a table has a few labels over many rows
        try:
            hit = self._by_label.get(key)
        except TypeError:  # an unhashable label value
            return self._labels([row.label])
        if hit is None:
            try:
                hit = self._labels([row.label])
            except Discard as d:
                hit = d
            if len(self._by_label) >= 4096:
                self._by_label.clear()
            self._by_label[key] = hit
        if isinstance(hit, Discard):
            raise Discard(str(hit))
        return hit

    def _labels(self, names: list) -> tuple[list[int], list[str]]:
        lm = self.ctx.label_map
        texts = []
        for n in names:
            target = lm.resolve(n)
            if target is None:
                raise Discard(f"label {str(n)[:60]!r} is the error class")
            if target not in texts:
                texts.append(target)
        return [lm.label(t) for t in texts], texts

    def label_features(self, row: Row) -> dict[str, Any]:
        """The label features of ``row`` (``image/class/label``, ``image/class/text``), in the
        order :meth:`convert` puts them after the image's; raises :class:`Discard`."""
        feats: dict[str, Any] = {}
        if self.label_type is not None:
            ids, texts = self.labels(row)
            if self.ctx.multi_label:
                feats["image/class/label"] = np.asarray(ids, np.int64)
                if self.label_type == "string label":
                    feats["image/class/text"] = texts
            else:
                feats["image/class/label"] = ids[0]
                if self.label_type == "string label":
                    feats["image/class/text"] = texts[0]
        return feats

    def convert(self, row: Row, split: str) -> dict[str, Any]:
        feats = self.label_features(row)
        if self.has_image:
            feats = {**image_features(self.ctx.image(row, split), row), **feats}
        values = row.values
        for c, t in self._columns:
            v = values[c]
            if t == "float":
                if type(v) is not float:  # a float is stored as float32 as it is; an int default is not an int64
                    v = np.float32(v)
            elif t == "int list":
                v = np.asarray(v, np.int64)
            elif t == "float list":
                v = np.asarray(v, np.float32)
            feats[c] = v
        return feats


class BoxConverter:
    """DETECTION, TEXT_DETECTION and TEXT_END2END: 4-point polygons to boxes and classes."""

    def __init__(self, ctx: ConvertContext):
        self.ctx = ctx
        self.mt = ctx.options.model_type

    def feature_spec(self) -> dict[str, Any]:
        spec = dict(IMAGE_SPEC)
        for k in ("xmin", "ymin", "xmax", "ymax"):
            spec[f"image/object/bbox/{k}"] = VarLen("float32")
        spec["image/object/polygon"] = VarLen("float32")
        spec["image/object/class/label"] = VarLen("int64")
        spec["image/object/class/text"] = VarLen("bytes")
        spec["image/object/ignored"] = VarLen("int64")
        if self.mt != "DETECTION":
            spec["image/object/direction"] = VarLen("bytes")
            spec["image/direction"] = FixedLen("bytes", default=b"")
        if self.mt == "TEXT_END2END":
            spec["image/object/text"] = VarLen("bytes")
            spec["image/object/text/length"] = VarLen("int64")
            spec["image/object/text/char_ids"] = VarLen("int64")
        return spec

    def _class(self, name: str | None) -> tuple[int, str, int] | None:
        """(label, text, ignored) of an object, or None when it carries the error class."""
        o, lm = self.ctx.options, self.ctx.label_map
        if name is None:
            name = o.default_class or ("text" if self.mt in ("TEXT_DETECTION", "TEXT_END2END") else None)
            if name is None:
                raise Discard("an object has no class and there is no default_class")
        if o.error_class is not None and name == o.error_class:
            return None
        if o.ignore_class is not None and name == o.ignore_class:
            return (lm.index.get(name, -1), name, 1)
        target = lm.resolve(name)
        if target is None:
            return None
        return (lm.label(target), target, 1 if target == o.ignore_class else 0)

    def kept_objects(self, ann: Mapping[str, Any]) -> list[tuple[dict, tuple[int, str, int], str]]:
        """``(object, (label, class text, ignored), text)`` of the objects that do not carry
        the error class, in input order."""
        kept = []
        for obj in ann["objects"]:
            c = self._class(obj.get("class"))
            if c is None:
                continue
            text = obj.get("text") or ""
            if self.mt == "TEXT_END2END":
                text = self.ctx.chars.normalize(text)
            kept.append((obj, c, text))
        return kept

    def box_features(self, img: EncodedImage, row: Row, kept: list) -> dict[str, Any]:
        """Image, normalized boxes (clipped to the image), polygons and classes of ``kept``."""
        W, H = img.original_width, img.original_height
        xs: dict[str, list[float]] = {"xmin": [], "ymin": [], "xmax": [], "ymax": []}
        poly: list[float] = []
        for i, (obj, _, _) in enumerate(kept):
            pts = np.asarray(obj["points"], np.float64)
            px = np.clip(pts[:, 0] / W, 0.0, 1.0)
            py = np.clip(pts[:, 1] / H, 0.0, 1.0)
            x0, x1, y0, y1 = px.min(), px.max(), py.min(), py.max()
            if x1 <= x0 or y1 <= y0:
                raise Discard(f"object {i + 1} has an empty box after clipping to the {W}x{H} image")
            xs["xmin"].append(x0), xs["xmax"].append(x1), xs["ymin"].append(y0), xs["ymax"].append(y1)
            poly.extend(v for p in zip(px, py) for v in p)
        feats = image_features(img, row)
        for k, v in xs.items():
            feats[f"image/object/bbox/{k}"] = np.asarray(v, np.float32)
        feats["image/object/polygon"] = np.asarray(poly, np.float32)
        feats["image/object/class/label"] = np.asarray([c[0] for _, c, _ in kept], np.int64)
        feats["image/object/class/text"] = [c[1] for _, c, _ in kept]
        feats["image/object/ignored"] = np.asarray([c[2] for _, c, _ in kept], np.int64)
        return feats

    def convert(self, row: Row, split: str) -> dict[str, Any]:
        ann = row.annotation
        kept = self.kept_objects(ann)
        feats = self.box_features(self.ctx.image(row, split), row, kept)
        if self.mt != "DETECTION":
            feats["image/object/direction"] = [o.get("direction") or "" for o, _, _ in kept]
            feats["image/direction"] = ann.get("direction") or ""
        if self.mt == "TEXT_END2END":
            texts = [t for _, _, t in kept]
            feats["image/object/text"] = texts
            feats["image/object/text/length"] = np.asarray([len(t) for t in texts], np.int64)
            feats["image/object/text/char_ids"] = np.asarray([i for t in texts for i in self.ctx.chars.ids(t)],
                                                             np.int64)
        return feats


class InstanceSegmentationConverter(BoxConverter):
    """INSTANCE_SEGMENTATION: polygons of any number of points to boxes, classes (class
    options as for DETECTION) and one mask per object.

    Masks are PNG (one channel, 0/1, the stored image's size), as the TensorFlow Object
    Detection API reads them (``image/object/mask``, PNG masks): ``tf.io.decode_png`` in the
    input pipeline decodes them, where COCO RLE would need pycocotools in Python; a 0/1 PNG
    of a mask is about as small as its RLE. Rasterised at pixel centres
    (:mod:`shardfeed.convert.polygons`). A polygon of zero area, or one that covers no pixel
    of the stored image, discards the row with the object named.
    """

    def feature_spec(self) -> dict[str, Any]:
        spec = super().feature_spec()
        spec["image/object/polygon/num_points"] = VarLen("int64")
        spec["image/object/mask"] = VarLen("bytes")
        spec["image/object/mask/format"] = FixedLen("bytes", default=b"png")
        spec["image/object/area"] = VarLen("float32")
        return spec

    def convert(self, row: Row, split: str) -> dict[str, Any]:
        kept = self.kept_objects(row.annotation)
        img = self.ctx.image(row, split)
        feats = self.box_features(img, row, kept)  # discards an object outside the image first
        sx, sy = img.scale
        masks, areas = [], []
        for i, (obj, c, _) in enumerate(kept):
            pts = np.asarray(obj["points"], np.float64)
            if collinear(pts):  # encloses nothing (a self-crossing outline does: its loops, even-odd)
                raise Discard(f"object {i + 1} ({c[1]}) has a degenerate polygon (zero area)")
            m = rasterize(pts * (sx, sy), img.width, img.height)
            area = int(m.sum())
            if area == 0:
                raise Discard(f"object {i + 1} ({c[1]}) covers no pixel of the stored {img.width}x{img.height} image")
            masks.append(encode_mask(m))
            areas.append(area)
        feats["image/object/polygon/num_points"] = np.asarray([len(o["points"]) for o, _, _ in kept], np.int64)
        feats["image/object/mask"] = masks
        feats["image/object/mask/format"] = "png"
        feats["image/object/area"] = np.asarray(areas, np.float32)
        return feats


class VideoClassificationConverter:
    """VIDEO_CLASSIFICATION: a video (any storage URL) decoded with PyAV into clips
    (:mod:`shardfeed.convert.video`), one record per clip with the video's label(s)."""

    def __init__(self, ctx: ConvertContext):
        from .video import _av

        _av()  # no PyAV: say so before the job starts, not once per video
        self.ctx = ctx
        self.labels = TableConverter(ctx, has_image=False)

    def feature_spec(self) -> dict[str, Any]:
        kind = VarLen if self.ctx.multi_label else FixedLen
        return {
            "video/encoded": VarLen("bytes"),
            "video/format": FixedLen("bytes"),
            "video/frame_count": FixedLen("int64"),
            "video/frame/timestamp": VarLen("float32"),
            "video/clip/index": FixedLen("int64"),
            "video/clip/start_time": FixedLen("float32"),
            "video/fps": FixedLen("float32"),
            "video/source_fps": FixedLen("float32"),
            "video/height": FixedLen("int64"),
            "video/width": FixedLen("int64"),
            "video/source_id": FixedLen("bytes"),
            "video/class/label": kind("int64"),
            "video/class/text": kind("bytes"),
        }

    def convert(self, row: Row, split: str) -> list[dict[str, Any]]:
        from .video import decode_video

        if not row.image_uri:
            raise Discard("row has no video")
        ids, texts = self.labels.labels(row)
        o = self.ctx.options
        try:
            f = storage.open_input(row.image_uri, self.ctx.storage_options)
        except FileNotFoundError:
            raise Discard("video not found") from None
        except IsADirectoryError:
            raise Discard("video path is a directory") from None
        except (OSError, ValueError) as exc:
            raise Discard(f"cannot read video: {type(exc).__name__}: {mask(str(exc))[:160]}") from None
        with f:
            v = decode_video(f, decode_type=o.decode_type, sample_fps=o.sample_fps, reshape_size=o.reshape_size,
                             decode_batch_size=o.decode_batch_size, decode_keep_size=o.decode_keep_size,
                             image_format=o.image_format, jpeg_quality=o.jpeg_quality)
        multi = self.ctx.multi_label
        label = np.asarray(ids, np.int64) if multi else ids[0]
        text = texts if multi else texts[0]
        return [{
            "video/encoded": clip.frames,
            "video/format": "png" if o.image_format == "png" else "jpeg",
            "video/frame_count": len(clip.frames),
            "video/frame/timestamp": np.asarray(clip.times, np.float32),
            "video/clip/index": clip.index,
            "video/clip/start_time": np.float32(clip.times[0]),
            "video/fps": np.float32(v.sample_fps),
            "video/source_fps": np.float32(v.source_fps),
            "video/height": v.height,
            "video/width": v.width,
            "video/source_id": row.image_uri,
            "video/class/label": label,
            "video/class/text": text,
        } for clip in v.clips]


class SegmentationConverter:
    """SEGMENTATION: the image plus its class mask (PNG, one channel, class ids)."""

    def __init__(self, ctx: ConvertContext):
        self.ctx = ctx

    def feature_spec(self) -> dict[str, Any]:
        return {**IMAGE_SPEC, "image/segmentation/class/encoded": FixedLen("bytes"),
                "image/segmentation/class/format": FixedLen("bytes")}

    def convert(self, row: Row, split: str) -> dict[str, Any]:
        mask_bytes = self.ctx.read(row.annotation["mask_url"], "mask")
        img = self.ctx.image(row, split)
        try:
            msize = image_size(mask_bytes, self.ctx.options.max_image_pixels)
        except Discard as d:
            raise Discard(f"mask: {d}") from None
        if msize != (img.original_width, img.original_height):
            raise Discard(f"mask is {msize[0]}x{msize[1]} but the image is {img.original_width}x{img.original_height}")
        png = load_mask(mask_bytes, (img.width, img.height), max_pixels=self.ctx.options.max_image_pixels)
        return {**image_features(img, row), "image/segmentation/class/encoded": png,
                "image/segmentation/class/format": "png"}


class TextRecognitionConverter:
    """TEXT_RECOGNITION: a text-line image and its text (after char_replace_map), with
    character ids when a character dictionary is given."""

    def __init__(self, ctx: ConvertContext):
        self.ctx = ctx

    def feature_spec(self) -> dict[str, Any]:
        return {**IMAGE_SPEC, "image/text": FixedLen("bytes"), "image/text/length": FixedLen("int64"),
                "image/text/char_ids": VarLen("int64")}

    def convert(self, row: Row, split: str) -> dict[str, Any]:
        text = self.ctx.chars.normalize(row.annotation["text"])
        ids = self.ctx.chars.ids(text)
        img = self.ctx.image(row, split)
        return {**image_features(img, row), "image/text": text, "image/text/length": len(text),
                "image/text/char_ids": np.asarray(ids, np.int64)}


def load_user_converter(path: Any) -> type:
    """The user converter class named by ``package.module:Class`` (or ``package.module.Class``),
    or by the name of a ``shardfeed.converters`` entry point. Code is never fetched from a URL."""
    if isinstance(path, type):
        return path
    path = str(path).strip()
    if "://" in path:
        raise ValueError(f"converter_class {path!r} is a URL; shardfeed never runs code fetched from a URL. "
                         "Install the converter as a package and give 'package.module:ClassName'")
    if ":" in path or "." in path:
        module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"converter_class {path!r}: cannot import it ({exc})") from None
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == path:
            return ep.load()
    raise ValueError(f"converter_class {path!r}: no such entry point in group {ENTRY_POINT_GROUP!r} "
                     "(or give 'package.module:ClassName')")


class UserConverter:
    """Wraps a SELF_DEFINED converter: ``cls(options: dict)`` with ``feature_spec()`` and
    ``convert(row, context)``; ``row.split`` is the row's final split and ``context`` a
    :class:`ConvertContext` (``context.image(row, row.split)`` loads and resizes the row's
    image, ``context.read(uri)`` reads any URL)."""

    def __init__(self, ctx: ConvertContext):
        self.ctx = ctx
        cls = load_user_converter(ctx.options.converter_class)
        self.impl = cls(dict(ctx.options.converter_options))
        for m in ("feature_spec", "convert"):
            if not callable(getattr(self.impl, m, None)):
                raise TypeError(f"converter {cls.__name__} has no {m}() method")
        self._spec: dict[str, Any] | None = None  # feature_spec(), asked for at the first record

    def feature_spec(self) -> dict[str, Any]:
        return dict(self.impl.feature_spec())

    def convert(self, row: Row, split: str) -> dict[str, Any]:
        """The converter's record(s), each checked against its own ``feature_spec()``: one
        that the manifest's spec cannot read back (a str for an int64 feature, a required
        feature missing, two values for a scalar) discards the row naming the feature,
        instead of a conversion that succeeds and a dataset that fails when read."""
        out = self.impl.convert(row, self.ctx)
        for feats in [out] if isinstance(out, Mapping) else out if isinstance(out, list) else []:
            if isinstance(feats, Mapping):  # anything else: the writer reports it
                self._check(feats)
        return out

    def _check(self, feats: Mapping[str, Any]) -> None:
        spec = self._spec
        if spec is None:
            spec = self._spec = self.feature_spec()
        try:
            parse_single_example(encode_example(feats), spec)
        except (ParseError, DecodeError) as exc:
            raise Discard(f"the converter's record does not fit its feature_spec(): {exc}") from None


def make_converter(ctx: ConvertContext, has_image: bool = True):
    mt = ctx.options.model_type
    if mt == "SELF_DEFINED":
        return UserConverter(ctx)
    if mt in ("DETECTION", "TEXT_DETECTION", "TEXT_END2END"):
        return BoxConverter(ctx)
    if mt == "INSTANCE_SEGMENTATION":
        return InstanceSegmentationConverter(ctx)
    if mt == "VIDEO_CLASSIFICATION":
        return VideoClassificationConverter(ctx)
    if mt == "SEGMENTATION":
        return SegmentationConverter(ctx)
    if mt == "TEXT_RECOGNITION":
        return TextRecognitionConverter(ctx)
    return TableConverter(ctx, has_image)

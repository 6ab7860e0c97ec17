"""Image-folder rows converted in the native core, a chunk per call, without Python per row.

The common case of a classification conversion (``TableConverter`` with an image and no
feature columns, ``image_check="header"``, local files): each image file is read, its
headers checked, and, when it is kept as it is, its Example encoded and framed in C with the
GIL released (``formats.native.image_rows``, ``_native/imgrows.h``). The label features are
encoded here once per label (``TableConverter.label_features``, ``features_entries``), so every
byte is the one the general path (``convert_rows`` over ``TableConverter.convert``) writes.
A row the core does not judge (not a local path, not JPEG/PNG, to be resized, rotated or
made RGB, a file it cannot read, a label that raises) comes back as ``None`` and takes the
general path, which says what it always said. ``SHARDFEED_NATIVE_ROWS=0`` in the
environment sends every row the general way (to compare the two; worker processes inherit it).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from ..formats.example import features_entries
from ..formats.native import image_rows
from .images import bomb_reason, corrupt_reason, empty_reason
from .options import Row
from .tasks import TableConverter

ENV_SWITCH = "SHARDFEED_NATIVE_ROWS"
_TAILS_MAX = 4096
_by_converter: weakref.WeakKeyDictionary[Any, NativeImageRows | None] = weakref.WeakKeyDictionary()


class NativeImageRows:
    """The native path of one ``TableConverter`` (see the module docstring)."""

    def __init__(self, converter: TableConverter):
        o = converter.ctx.options
        self.converter = converter
        self.want = "jpeg" if o.image_format in ("jpg", "jpeg") else "png"
        self.train_size = o.max_size_for("train") or 0
        self.other_size = o.max_size_for("test") or 0
        self.max_pixels = o.max_image_pixels
        self._tails: dict[tuple, bytes | None] = {}  # label -> its features' map entries (None: general path)

    def _tail(self, row: Row) -> bytes | None:
        """The encoded map entries of ``row``'s label features, or None when the general
        path must decide (the label raises, or the row is not one this path knows)."""
        if row.annotation is not None or row.values:
            return None
        label = row.label
        key = (type(label), label)
        try:
            hit = self._tails.get(key, False)
        except TypeError:  # an unhashable label: not cached
            return self._encode(row)
        if hit is False:
            hit = self._encode(row)
            if len(self._tails) >= _TAILS_MAX:
                self._tails.clear()
            self._tails[key] = hit
        return hit  # type: ignore[return-value]

    def _encode(self, row: Row) -> bytes | None:
        try:
            return features_entries(self.converter.label_features(row))
        except Exception:  # noqa: BLE001 - a Discard or a bad label: the general path reports it
            return None

    def convert(self, rows: list[Row]) -> tuple[Any, list] | None:
        """``(frames, results)`` of ``rows`` as ``formats.native.image_rows`` gives them, or
        None when the core is not built."""
        paths: list[str | None] = []
        tails: list[bytes] = []
        sizes: list[int] = []
        train, other = self.train_size, self.other_size
        for row in rows:
            uri = row.image_uri
            tail = self._tail(row)
            if tail is None or not uri or "://" in uri:
                paths.append(None)
                tails.append(b"")
            else:
                paths.append(uri)
                tails.append(tail)
            sizes.append(train if row.split == "train" else other)
        done = image_rows(paths, tails, sizes, self.want, self.max_pixels)
        if done is None:
            return None
        frames, results = done
        return frames, [r if r is None or type(r) is int else self._reason(r) for r in results]

    def _reason(self, judged: tuple) -> str:
        """The discard reason of a row the core refused, worded by :mod:`.images` as the
        Python path words it."""
        what = judged[0]
        if what == "empty":
            return empty_reason()
        if what == "corrupt":
            return corrupt_reason(judged[1], judged[2])
        return bomb_reason(judged[1], judged[2], self.max_pixels)


def native_image_rows(converter: Any) -> NativeImageRows | None:
    """The native path for ``converter``, or None when its rows need the general path."""
    if type(converter) is not TableConverter:  # a subclass may convert otherwise
        return None
    if os.environ.get(ENV_SWITCH, "").strip() in ("0", "false", "no", "off"):
        return None
    try:
        return _by_converter[converter]
    except KeyError:
        pass
    ctx = converter.ctx
    o = ctx.options
    fits = (converter.has_image and o.image_check == "header" and type(o.max_image_pixels) is int
            and (ctx.schema is None or not ctx.schema.feature_columns())
            and all(s is None or type(s) is int for s in (o.max_image_size, o.max_test_image_size)))
    path = NativeImageRows(converter) if fits else None
    _by_converter[converter] = path
    return path

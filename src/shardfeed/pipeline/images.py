"""``decode_images``: a batch's column of encoded images -> one ``(n, H, W, C)`` uint8 array.

JPEGs are decoded by simplejpeg (libjpeg-turbo, the GIL released) when it is installed,
downscaled in the DCT domain when the source is at least twice the target (the smallest of
libjpeg-turbo's M/8 scales of at most 1/2 that still covers the target), then resized exactly:
by the native core's resampler (value for value Pillow's ``Image.resize``, vectorised,
straight into the batch's slot, the GIL released) when it is built, else by Pillow. A JPEG
already at the target size is decoded straight into its slot. Other formats, and JPEGs
simplejpeg refuses (CMYK, YCCK), go through Pillow.
The stage is a parallel ``map`` whose function decodes a whole batch and reports the rows
that failed; the node hands those to the ``on_error`` policy and drops them from every
column, so state, resume and stats are the map's.
"""

from __future__ import annotations

import importlib
import io
import math
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..errors import ImageDecodeError
from ..formats.bufpool import pass_closed
from ..formats.image_damage import MAX_IMAGE_PIXELS, MAX_JPEG_SCANS, bomb_reason, jpeg_damage
from ..formats.native import BytesBuffer, image_check, jpeg_scans
from ..formats.spec import RaggedColumn, SparseColumn
from ..registry import require
from .dataset import Dataset, positive_int
from .map import MapDataset, _ParallelMapNode
from .node import AUTOTUNE, Build, Node
from .policy import ErrorPolicy
from .workers import WorkerPool

RESIZE = ("stretch", "crop")
FILTERS = ("nearest", "box", "bilinear", "hamming", "bicubic", "lanczos")
_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_GRAY_16 = ("I;16", "I;16B", "I;16L", "I;16N", "I")
# the native resampler's filter codes (resample.h); "nearest" is Pillow's own, not a convolution
_NATIVE_FILTERS = {"box": 1, "bilinear": 2, "hamming": 3, "bicubic": 4, "lanczos": 5}
_KEEP_BUFFER_BYTES = 64 << 20  # a thread's decode buffer is kept up to this size


def _size(size: Any) -> tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if (not isinstance(size, (tuple, list)) or len(size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        raise ValueError(f"size must be a positive int or (height, width) of positive ints, got {size!r}")
    return int(size[0]), int(size[1])


def _native_attr(name: str) -> Any:
    """A function of the native core (``resample``: Pillow's resize, value for value;
    ``pool_array``), or None when the core is not built or is an older build without it."""
    try:
        ext = importlib.import_module("shardfeed._native")
    except ImportError:
        return None
    return getattr(ext, name, None)


def _batch_array(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array for a decoded batch: from the native core's pool of
    recycled blocks when it has one (a fresh multi-megabyte array page-faults in every page
    as the decoder first writes it: about 90 us an image at 224x224 here), else numpy's."""
    pool_array = _native_attr("pool_array")
    n = int(np.prod(shape))
    if pool_array is None or n == 0:
        return np.empty(shape, np.uint8)
    return pool_array(n).reshape(shape)


def gray_to_8_bits(a: np.ndarray, mode: str) -> np.ndarray:
    """A 16-bit (or 32-bit int) grey image's values scaled to ``uint8`` over their full
    range, not clipped (clipped, a 16-bit PNG comes out nearly all white): ``0..65535`` for
    Pillow's ``I;16`` modes and for ``I`` holding values above 255, else ``0..255``."""
    if a.dtype.byteorder == ">" or a.dtype.itemsize != 4:
        a = a.astype(np.int64)
    hi = 65535 if mode.startswith("I;16") or (a.size and int(a.max()) > 255) else 255
    return (a.astype(np.float64) * (255.0 / hi)).round().clip(0, 255).astype(np.uint8)


def _simplejpeg() -> Any:
    try:
        import simplejpeg  # noqa: PLC0415
    except ImportError:
        return None
    return simplejpeg


class DecodeImages:
    """Decode ``batch[feature]`` (encoded images, one per row) to a ``(n, H, W, channels)``
    uint8 array; picklable, so it also works in ``map(..., use_processes=True)``.

    ``size``: ``H`` (square) or ``(H, W)`` in pixels. ``resize``: ``"stretch"`` (default:
    scaled to exactly ``(H, W)``, the aspect ratio not kept) or ``"crop"`` (the shorter side
    scaled to fit, keeping the aspect ratio, then the centre ``(H, W)`` cut out).
    ``filter``: Pillow's resampling filter for the exact resize (``"bilinear"`` default,
    antialiased when shrinking; ``"nearest"``, ``"box"``, ``"hamming"``, ``"bicubic"``,
    ``"lanczos"``). ``channels``: 3 (RGB) or 1 (luma, shape ``(n, H, W, 1)``); alpha is
    dropped, EXIF orientation is not applied (as ``tf.io.decode_jpeg``).
    ``fast_dct`` / ``fast_upsample``: libjpeg-turbo's fast integer DCT and its fast chroma
    upsampling (each about 4-5% faster; pixel values change by about 1 on average, up to a
    few units at sharp edges and colour borders); JPEGs through simplejpeg only.
    ``max_image_pixels``: an image whose header declares more pixels is refused before it is
    decoded (a decompression bomb: a file of a few KB can declare 13000x13000, whose progressive
    decode needs 1 GB); the default is Pillow's ``Image.MAX_IMAGE_PIXELS`` (89,478,485), as in
    conversion; ``None`` for no limit. A JPEG with more than 100 scans is refused too (encoders
    write 1 to about 20; each costs a pass over the whole image, so a small file repeating one
    thousands of times would take seconds).

    ``__call__(batch)`` returns the batch with the column replaced and raises
    :class:`ImageDecodeError` naming the feature and row at the first bad image;
    :meth:`decode_batch` instead drops the bad rows from every column and returns them.
    """

    def __init__(self, feature: str, size: Any, resize: str = "stretch", channels: int = 3,
                 filter: str = "bilinear", fast_dct: bool = False, fast_upsample: bool = False,
                 max_image_pixels: int | None = MAX_IMAGE_PIXELS) -> None:
        if not isinstance(feature, str) or not feature:
            raise TypeError(f"feature must be a column name (str), got {feature!r}")
        if resize not in RESIZE:
            raise ValueError(f"resize must be one of {RESIZE}, got {resize!r}")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels!r}")
        if filter not in FILTERS:
            raise ValueError(f"filter must be one of {FILTERS}, got {filter!r}")
        self.feature = feature
        self.size = _size(size)
        self.resize = resize
        self.channels = channels
        self.filter = filter
        self.fast_dct = bool(fast_dct)
        self.fast_upsample = bool(fast_upsample)
        if max_image_pixels is not None:
            max_image_pixels = positive_int("max_image_pixels", max_image_pixels)
        self.max_image_pixels = max_image_pixels
        self._load()

    def _load(self) -> None:
        self.Image = require("PIL.Image", extra="convert", what="decode_images")
        self._sj = _simplejpeg()
        self._resample: Any = _native_attr("resample") if self.filter in _NATIVE_FILTERS else None
        self._local = threading.local()  # each thread's decode buffer

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("Image", "_sj", "_resample", "_local")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._load()

    def __repr__(self) -> str:
        return (f"DecodeImages({self.feature!r}, size={self.size}, resize={self.resize!r}, channels={self.channels}, "
                f"filter={self.filter!r}, max_image_pixels={self.max_image_pixels})")

    def _bomb(self, width: int, height: int) -> None:
        """Raise when ``width x height`` is over ``max_image_pixels``."""
        limit = self.max_image_pixels
        if limit is not None and width * height > limit:
            raise ValueError(bomb_reason(width, height, limit, thousands=True))

    # -- one image -------------------------------------------------------------------
    def _scaled(self, h: int, w: int) -> tuple[int, int]:
        """The size the whole source is scaled to before any crop."""
        th, tw = self.size
        if self.resize == "stretch":
            return th, tw
        s = max(th / h, tw / w)
        return max(th, round(h * s)), max(tw, round(w * s))

    def _finish(self, img: Any, out: np.ndarray) -> None:
        """Resize the PIL image ``img`` to the target (cropping for "crop") into ``out``."""
        th, tw = self.size
        sh, sw = self._scaled(img.height, img.width)
        if (img.height, img.width) != (sh, sw):
            img = img.resize((sw, sh), getattr(self.Image.Resampling, self.filter.upper()))
        if (sh, sw) != (th, tw):
            top, left = (sh - th) // 2, (sw - tw) // 2
            img = img.crop((left, top, left + tw, top + th))
        out[...] = np.asarray(img).reshape(out.shape)

    def _jpeg(self, data: bytes, out: np.ndarray) -> bool:
        """Decode a JPEG with simplejpeg into ``out``; False when simplejpeg refuses it."""
        sj = self._sj
        try:
            h, w, colorspace, _ = sj.decode_jpeg_header(data)
        except ValueError:
            return False
        if colorspace in ("CMYK", "YCCK") or h <= 0 or w <= 0:
            return False
        sh, sw = self._scaled(h, w)
        kw: dict[str, Any] = {"fastdct": self.fast_dct, "fastupsample": self.fast_upsample}
        if h >= 2 * sh and w >= 2 * sw:  # scales of 1/2 and below only (docs/pipeline.md: why)
            kw.update(min_height=sh, min_width=sw, min_factor=2)
            try:
                h, w = sj.decode_jpeg_header(data, min_height=sh, min_width=sw, min_factor=2)[:2]
            except ValueError:
                return False
        gray = self.channels == 1
        try:
            if (h, w) == self.size and self._scaled(h, w) == self.size and out.flags.c_contiguous:
                # already the target size: decoded straight into the batch's slot
                arr = sj.decode_jpeg(data, colorspace="GRAY" if gray else "RGB", buffer=out, **kw)
                if arr.shape[:2] == self.size:
                    return True
            elif self._resample is not None:
                # RGBX: 4-byte pixels, the resampler's vector layout; libjpeg-turbo writes it as fast.
                # Into this thread's buffer, kept between images: a fresh array of a few hundred KB
                # is a fresh mapping, and its page faults cost a third of the decode.
                arr = sj.decode_jpeg(data, colorspace="GRAY" if gray else "RGBX",
                                     buffer=self._buffer(h * w * (1 if gray else 4)), **kw)
                self._resize_native(arr, out)
                return True
            else:
                arr = sj.decode_jpeg(data, colorspace="GRAY" if gray else "RGB", **kw)
        except ValueError as exc:
            if jpeg_damage(str(exc)):  # Pillow would fill the missing part in with grey, without a word
                raise ValueError(f"corrupt JPEG data (libjpeg-turbo: {exc}); decoded leniently, part of it "
                                 "would be grey") from exc
            return False  # Pillow gets a second try, and gives the error when it fails too
        if arr.shape[:2] == self.size:
            out[...] = arr.reshape(out.shape)
        else:
            self._finish(self.Image.fromarray(arr[..., 0] if self.channels == 1 else arr), out)
        return True

    def _buffer(self, nbytes: int) -> np.ndarray:
        """This thread's decode buffer, at least ``nbytes`` long (grown, never shrunk; a
        need above 64 MiB gets a buffer of its own, not kept)."""
        if nbytes > _KEEP_BUFFER_BYTES:
            return np.empty(nbytes, np.uint8)
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < nbytes:
            buf = self._local.buf = np.empty(max(nbytes, 1 << 20), np.uint8)
        return buf

    def _resize_native(self, arr: np.ndarray, out: np.ndarray) -> None:
        """Resize the decoded ``arr`` (H, W, 1 or 4) into ``out`` as :meth:`_finish` does
        with Pillow (the same values), cropping for "crop"."""
        h, w, c = arr.shape
        th, tw = self.size
        sh, sw = self._scaled(h, w)
        top, left = (sh - th) // 2, (sw - tw) // 2
        dst = out if out.flags.c_contiguous else np.empty(out.shape, np.uint8)
        resample = self._resample
        assert resample is not None  # only called when the native core has it
        resample(np.ascontiguousarray(arr), h, w, c, dst, th, tw, self.channels, sh, sw, top, left,
                       _NATIVE_FILTERS[self.filter])
        if dst is not out:
            out[...] = dst

    def _pillow(self, data: bytes, out: np.ndarray) -> None:
        Image = self.Image
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            self._bomb(img.width, img.height)
            mode = "RGB" if self.channels == 3 else "L"
            if img.format == "JPEG":
                sh, sw = self._scaled(img.height, img.width)
                img.draft(mode, (math.ceil(sw), math.ceil(sh)))  # DCT scaling, never below the target
            img.load()
            if img.mode in _GRAY_16:  # 16-bit grey: the range scaled to 8 bits, not clipped (as conversion)
                img = Image.fromarray(gray_to_8_bits(np.asarray(img), img.mode), "L")
            if img.mode != mode:
                if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                    img = img.convert("RGBA" if mode == "RGB" else "LA")  # alpha dropped, not composited
                    img = img.convert(mode)
                else:
                    img = img.convert(mode)
            self._finish(img, out)

    def decode_one(self, data: Any, out: np.ndarray | None = None) -> np.ndarray:
        """One encoded image to an ``(H, W, channels)`` uint8 array (into ``out`` when given)."""
        if out is None:
            out = np.empty((*self.size, self.channels), np.uint8)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"an encoded image must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if data[:3] == _JPEG_MAGIC:  # its frame's size and its scans, before any decoder sees it
            walked = jpeg_scans(data, MAX_JPEG_SCANS)
            if walked is not None:
                scans, width, height = walked
                self._bomb(width, height)
                if scans > MAX_JPEG_SCANS:
                    raise ValueError(f"a JPEG with more than {MAX_JPEG_SCANS} scans (encoders write 1 to about 20; "
                                     "each costs a pass over the whole image): refused as hostile")
        elif data[:8] == _PNG_MAGIC:  # every chunk's CRC and the IEND, which Pillow does not check
            h = image_check(data)
            if h is not None and h.error is not None:
                raise ValueError(f"broken PNG file at byte {h.error_offset:,}: {h.error}")
            if h is not None:
                self._bomb(h.width, h.height)
        if self._sj is not None and data[:3] == _JPEG_MAGIC and self._jpeg(data, out):
            return out
        self._pillow(data, out)
        return out

    # -- one batch -------------------------------------------------------------------
    def _values(self, batch: Any) -> list:
        if not isinstance(batch, Mapping):
            raise TypeError(f"decode_images needs batches that are dicts of columns, got {type(batch).__name__}")
        if self.feature not in batch:
            raise KeyError(f"decode_images: the batch has no feature {self.feature!r} (it has {sorted(batch)})")
        col = batch[self.feature]
        if isinstance(col, BytesBuffer):
            return col.to_list()
        if isinstance(col, np.ndarray) and col.ndim == 2 and col.shape[1] == 1:
            col = col[:, 0]
        if isinstance(col, np.ndarray) and col.ndim != 1:
            raise ValueError(f"decode_images: feature {self.feature!r} must hold one image per row "
                             f"(a FixedLen bytes feature), got shape {col.shape}")
        if isinstance(col, (np.ndarray, list, tuple)):
            return list(col)
        raise TypeError(f"decode_images: feature {self.feature!r} must be a numpy array of bytes, "
                        f"got {type(col).__name__}")

    def _decode_rows(self, values: list, out: np.ndarray, start: int, stop: int,
                     failed: list[ImageDecodeError]) -> None:
        for i in range(start, stop):
            try:
                self.decode_one(values[i], out[i])
            except Exception as exc:  # noqa: BLE001 - reported with its row
                err = ImageDecodeError(f"decode_images: feature {self.feature!r}, row {i} of the batch: "
                                       f"{type(exc).__name__}: {exc}", self.feature, i)
                err.__cause__ = exc
                failed.append(err)

    def _decode_shared(self, values: list, out: np.ndarray, submit: Callable[..., Future],
                       threads: int) -> list[ImageDecodeError]:
        """Rows decoded in chunks claimed by this thread and up to ``threads - 1`` helpers run
        through ``submit``; helpers that have not started when the chunks run out are cancelled."""
        n = len(values)
        size = max(1, -(-n // (4 * threads)))  # about four chunks a thread: the last one waited for is short
        starts = iter(range(0, n, size))
        lock = threading.Lock()

        def work() -> list[ImageDecodeError]:
            failed: list[ImageDecodeError] = []
            while True:
                with lock:
                    start = next(starts, None)
                if start is None:
                    return failed
                self._decode_rows(values, out, start, min(n, start + size), failed)

        helpers = []
        for _ in range(threads - 1):
            try:
                helpers.append(submit(work))
            except Exception:  # noqa: BLE001 - the pool is closing: this thread does the rest
                break
        failed = work()
        for f in helpers:
            if not f.cancel():
                failed += f.result()
        return sorted(failed, key=lambda e: e.index)

    def decode_batch(self, batch: Mapping[str, Any], *, submit: Callable[..., Future] | None = None,
                     threads: int = 1) -> tuple[dict[str, Any], list[ImageDecodeError]]:
        """The batch with ``feature`` decoded, the rows whose image failed dropped from every
        column, and those failures (each naming its row in the input batch). With ``submit``
        (a thread pool's, taking a callable) and ``threads`` > 1, the batch's images are
        shared out in chunks among this thread and ``threads - 1`` tasks given to ``submit``."""
        values = self._values(batch)
        out = _batch_array((len(values), *self.size, self.channels))
        if submit is not None and threads > 1 and len(values) >= 2 * threads:
            failed = self._decode_shared(values, out, submit, threads)
        else:
            failed = []
            self._decode_rows(values, out, 0, len(values), failed)
        result = dict(batch)
        if failed:
            keep = np.setdiff1d(np.arange(len(values)), [e.index for e in failed])
            result = {k: take_rows(v, keep, len(values), k) for k, v in batch.items() if k != self.feature}
            result[self.feature] = out[keep]
        else:
            result[self.feature] = out
        return result, failed

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        result, failed = self.decode_batch(batch)
        if failed:
            raise failed[0]
        return result


def take_rows(col: Any, keep: np.ndarray, n: int, name: str = "") -> Any:
    """Rows ``keep`` (sorted indices) of a batch column of ``n`` rows."""
    if isinstance(col, np.ndarray) and col.ndim >= 1 and len(col) == n:
        return col[keep]
    if isinstance(col, RaggedColumn):
        lengths = col.row_lengths[keep]
        splits = np.zeros(len(keep) + 1, col.row_splits.dtype)
        np.cumsum(lengths, out=splits[1:])
        idx = np.concatenate([np.arange(col.row_splits[i], col.row_splits[i + 1]) for i in keep]) \
            if len(keep) else np.zeros(0, np.int64)
        return RaggedColumn(col.values[idx.astype(np.int64)], splits)
    if isinstance(col, SparseColumn):
        new_row = np.full(n, -1, np.int64)
        new_row[keep] = np.arange(len(keep))
        rows = new_row[col.indices[:, 0]]
        sel = rows >= 0
        indices = col.indices[sel].copy()
        indices[:, 0] = rows[sel]
        shape = col.dense_shape.copy()
        shape[0] = len(keep)
        return SparseColumn(indices, col.values[sel], shape)
    if isinstance(col, BytesBuffer):
        vals = col.to_list()
        o = np.zeros(len(keep) + 1, np.int64)
        np.cumsum([len(vals[i]) for i in keep], out=o[1:])
        return BytesBuffer(np.frombuffer(b"".join(vals[i] for i in keep), np.uint8), o)
    if isinstance(col, (list, tuple)) and len(col) == n:
        return type(col)(col[i] for i in keep)
    raise TypeError(f"decode_images: cannot drop rows from column {name!r} of type {type(col).__name__}")


def decode_images(batch: Mapping[str, Any], feature: str, size: Any, resize: str = "stretch", channels: int = 3,
                  filter: str = "bilinear", fast_dct: bool = False, fast_upsample: bool = False,
                  max_image_pixels: int | None = MAX_IMAGE_PIXELS) -> dict[str, Any]:
    """The function form of :meth:`Dataset.decode_images` for one batch: ``batch`` with
    ``feature`` decoded to one ``(n, H, W, channels)`` uint8 array. Raises
    :class:`ImageDecodeError` naming the feature and the row of the first bad image.
    Arguments as :class:`DecodeImages`."""
    return DecodeImages(feature, size, resize, channels, filter, fast_dct, fast_upsample, max_image_pixels)(batch)


class DecodeImagesDataset(MapDataset):
    kind = "decode_images"

    def __init__(self, parent: Dataset, decoder: DecodeImages, num_parallel_calls: int | None = AUTOTUNE,
                 on_error: Any = "raise") -> None:
        num_parallel_calls = positive_int("num_parallel_calls", num_parallel_calls, allow_autotune=True,
                                          allow_none=True)
        # the map itself raises (a batch that is not a dict of columns is the call's error);
        # bad images are reported by decode_batch and judged by image_policy in the node
        super().__init__(parent, decoder.decode_batch, AUTOTUNE if num_parallel_calls is None else num_parallel_calls,
                         deterministic=True, on_error="raise")
        self.decoder = decoder
        self.image_policy = ErrorPolicy(on_error)

    def cardinality(self) -> int | float | None:
        return self.parent.cardinality() if self.image_policy.raises else None

    def _record_source(self) -> Dataset | None:
        # an element whose every image failed is dropped under on_error="skip"
        return super()._record_source() if self.image_policy.raises else None

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _DecodeImagesNode(b.but(raw=False), self, state)


class _DecodeImagesNode(_ParallelMapNode):
    """The map over batches, each batch's images shared out among its map thread and the
    node's ``n - 1`` helper threads (so one batch in flight still keeps every thread busy)."""

    def __init__(self, b: Build, ds: DecodeImagesDataset, state: Mapping[str, Any] | None) -> None:
        super().__init__(b, ds, state)
        self.image_policy = ds.image_policy
        self.feature = ds.decoder.feature
        self.decoder = ds.decoder
        self.helpers: WorkerPool | None = None
        self.fn = self._decode
        self.ctx.on_close(pass_closed)  # the pooled batch arrays stay warm until idle (bufpool.py)

    def _start(self) -> None:
        super()._start()
        if self.n > 1:
            self.helpers = WorkerPool(self.n - 1, "decode_images")
            self.ctx.on_close(self.helpers.close)

    def _decode(self, batch: Any) -> tuple[dict[str, Any], list[ImageDecodeError]]:
        helpers = self.helpers
        if helpers is None:
            return self.decoder.decode_batch(batch)
        return self.decoder.decode_batch(batch, submit=helpers.submit, threads=self.n)

    def _next(self) -> Any:
        while True:
            batch, failed = super()._next()
            element = self.cur_start + self.pos - 1
            for err in failed:
                self.image_policy.handle(err, {"stage": "decode_images", "feature": self.feature,
                                               "record_index": err.index, "element": element}, self.errors)
            if len(batch[self.feature]) or not failed:
                return batch  # a batch that lost every row is dropped, not delivered empty


__all__ = ["DecodeImages", "DecodeImagesDataset", "ImageDecodeError", "decode_images", "take_rows"]

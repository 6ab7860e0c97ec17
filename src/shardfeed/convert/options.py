"""What a conversion is told (``ConvertOptions``, PAI option names kept) and the unit it
works on (``Row``), plus ``Discard``, the exception a converter raises to drop a row."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..formats.image_damage import MAX_IMAGE_PIXELS

MODEL_TYPES = (
    "CLASSIFICATION", "DETECTION", "SEGMENTATION", "TEXT_RECOGNITION", "TEXT_DETECTION",
    "TEXT_END2END", "INSTANCE_SEGMENTATION", "VIDEO_CLASSIFICATION", "SELF_DEFINED",
)
SPLITS = ("train", "validation", "test")
IMAGE_FORMATS = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png"}
IMAGE_CHECKS = ("header", "decode")


class Discard(Exception):
    """Raised while converting a row to drop it; the message is the reason in the report."""


@dataclass(slots=True)  # a plan holds every row of its input: no __dict__ each
class Row:
    """One input row: where it came from and what it says, before any image is read.

    ``number`` is 1-based within ``origin`` (data rows of a CSV, not counting a header;
    lines of a manifest; files of a folder in sorted order). ``split`` is ``None`` when the
    input has no split for it (then ``test_ratio`` decides). ``values`` holds typed columns
    (user schema) and ``annotation`` what an annotation parser made of the answer.
    """

    number: int
    origin: str
    image_uri: str | None = None
    split: str | None = None
    label: Any = None
    values: dict[str, Any] = field(default_factory=dict)
    annotation: Any = None

    @property
    def source(self) -> str:
        """What the discard report names: the image URI, or the input file and row."""
        return self.image_uri or f"{self.origin}#{self.number}"

    def key(self) -> str:
        return f"{self.origin}#{self.number}"


@dataclass
class DiscardRecord:
    """One line of the discard report."""

    row: int
    source: str
    reason: str


@dataclass
class ConvertOptions:
    """Options of a conversion. Names follow PAI's ``convert_param_config`` where one exists.

    ``image_check``: how an image whose bytes are stored as they are (no resize, no
    rotation, already RGB in ``image_format``) is verified: ``"header"`` (default) walks its
    JPEG markers or PNG chunks (CRCs included) natively and takes the size from its header,
    without decoding pixels; ``"decode"`` decodes it fully (about 100 times the CPU; also
    catches damage inside the compressed image data, which the header check cannot see).
    Images that must change are decoded either way. See :mod:`shardfeed.convert.images`.
    ``max_image_size`` / ``max_test_image_size``: longest side in pixels (aspect kept, never
    upscaled; the test size applies to the validation and test splits and defaults to
    ``max_image_size``). ``image_format``: ``"jpg"`` or ``"png"``. ``test_ratio``: share of
    rows without a split that go to ``test``: a row goes there when a hash (seeded by
    ``seed``) of its ``split_key`` column (default: of its content) falls below the ratio,
    so the count is about, not exactly, ``round(n * test_ratio)``, and the same on every
    runner and any partitioning.
    ``num_samples_per_tfrecord``: input rows per shard (a shard holds fewer records when
    rows of it are discarded; for VIDEO_CLASSIFICATION it counts videos, and a shard holds
    every clip of its videos). ``bytes_per_tfrecord``: about how many bytes a shard should
    hold (``None``: no target): rows per shard become ``bytes_per_tfrecord`` divided by the
    mean size of a record, measured by converting a sample of up to 256 rows chosen by a
    hash of their content (the same sample on every runner and partitioning), capped at
    ``num_samples_per_tfrecord``; every shard of the conversion then has that many rows (the
    last of a split fewer). ``compression``: ``None`` or ``"GZIP"`` (index files only
    for uncompressed shards).

    VIDEO_CLASSIFICATION only (PAI names and defaults): ``decode_type`` 1 intra frames only,
    2 key frames only, 3 without bidirectional frames, 4 all (default); ``sample_fps`` frames
    kept per second (5.0); ``reshape_size`` shorter side of the frames in pixels, aspect kept
    (224; ``None`` keeps the decoded size); ``decode_batch_size`` frames per clip (10);
    ``decode_keep_size`` frames a clip shares with the previous one (0). See
    :mod:`shardfeed.convert.video`.
    """

    model_type: str = "CLASSIFICATION"
    class_list_file: str | None = None
    default_class: str | None = None
    error_class: str | None = None
    ignore_class: str | None = None
    test_ratio: float = 0.0
    seed: int = 0
    split_key: str | None = None
    max_image_size: int | None = None
    max_test_image_size: int | None = None
    image_format: str = "jpg"
    image_check: str = "header"
    jpeg_quality: int = 90
    max_image_pixels: int = MAX_IMAGE_PIXELS  # Pillow's own default bomb limit (formats.image_damage)
    read_parallel_num: int = 2
    write_parallel_num: int = 1
    num_samples_per_tfrecord: int = 256
    bytes_per_tfrecord: int | None = None
    compression: str | None = None
    prefix: str = "data"
    char_replace_map_path: str | None = None
    default_char_dict_path: str | None = None
    converter_class: str | None = None
    converter_options: dict[str, Any] = field(default_factory=dict)
    separator: str = ";"
    executor: str = "thread"
    decode_type: int = 4
    sample_fps: float = 5.0
    reshape_size: int | None = 224
    decode_batch_size: int = 10
    decode_keep_size: int = 0

    def __post_init__(self) -> None:
        self.model_type = str(self.model_type).upper()
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {', '.join(MODEL_TYPES)}; got {self.model_type!r}")
        fmt = str(self.image_format).lower()
        if fmt not in IMAGE_FORMATS:
            raise ValueError(f"image_format must be 'jpg' or 'png', got {self.image_format!r}")
        self.image_format = "jpg" if IMAGE_FORMATS[fmt] == "jpeg" else "png"
        if self.image_check not in IMAGE_CHECKS:
            raise ValueError(f"image_check must be 'header' (verify kept images by their structure) or 'decode' "
                             f"(decode every kept image), got {self.image_check!r}")
        if not 0.0 <= float(self.test_ratio) < 1.0:
            raise ValueError(f"test_ratio must be in [0, 1), got {self.test_ratio!r}")
        self.test_ratio = float(self.test_ratio)
        for name in ("max_image_size", "max_test_image_size"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name} must be a positive int (pixels of the longest side) or None, got {v!r}")
        if self.max_test_image_size is None:
            self.max_test_image_size = self.max_image_size
        for name in ("read_parallel_num", "write_parallel_num", "num_samples_per_tfrecord"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        q = self.jpeg_quality
        if not isinstance(q, int) or isinstance(q, bool) or not 1 <= q <= 100:
            # checked here, not by the encoder: a bad value discarded every resized image as "corrupt"
            raise ValueError(f"jpeg_quality must be an int from 1 to 100 (JPEG quality of re-encoded images), "
                             f"got {q!r}")
        if self.separator is not None and (not isinstance(self.separator, str) or not self.separator):
            raise ValueError(f"separator must be a non-empty str (between a list cell's items) or None (items "
                             f"split at runs of whitespace), got {self.separator!r}")
        b = self.bytes_per_tfrecord
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"bytes_per_tfrecord must be a positive int (bytes a shard should hold) or None, "
                             f"got {b!r}")
        if self.compression is not None:
            c = str(self.compression).upper()
            if c in ("", "NONE"):
                self.compression = None
            elif c in ("GZIP", "ZLIB"):
                self.compression = c
            else:
                raise ValueError(f"compression must be None, 'GZIP' or 'ZLIB', got {self.compression!r}")
        self._check_video()
        if self.executor not in ("thread", "process"):
            raise ValueError(f"executor must be 'thread' or 'process', got {self.executor!r}")
        if not self.prefix or "/" in self.prefix:
            raise ValueError(f"prefix must be a non-empty file name prefix without '/', got {self.prefix!r}")
        if self.model_type == "SELF_DEFINED" and not self.converter_class:
            raise ValueError("model_type SELF_DEFINED needs converter_class: an import path "
                             "'package.module:ClassName' or the name of a 'shardfeed.converters' entry point")

    def _check_video(self) -> None:
        if self.decode_type not in (1, 2, 3, 4) or isinstance(self.decode_type, bool):
            raise ValueError(f"decode_type must be 1 (intra only), 2 (keyframes only), 3 (without bidirectional "
                             f"frames) or 4 (decode all), got {self.decode_type!r}")
        try:
            fps = float(self.sample_fps)
        except (TypeError, ValueError):
            fps = float("nan")
        if not fps > 0 or fps == float("inf"):
            raise ValueError(f"sample_fps must be a positive number of frames per second, got {self.sample_fps!r}")
        self.sample_fps = fps
        if self.reshape_size is not None and (not isinstance(self.reshape_size, int) or self.reshape_size < 1):
            raise ValueError(f"reshape_size must be a positive int (pixels of the shorter side) or None, "
                             f"got {self.reshape_size!r}")
        if not isinstance(self.decode_batch_size, int) or self.decode_batch_size < 1:
            raise ValueError("decode_batch_size must be a positive int (frames per clip), "
                             f"got {self.decode_batch_size!r}")
        if (not isinstance(self.decode_keep_size, int) or not 0 <= self.decode_keep_size < self.decode_batch_size):
            raise ValueError(f"decode_keep_size must be an int in [0, decode_batch_size={self.decode_batch_size}) "
                             f"(frames shared by consecutive clips), got {self.decode_keep_size!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def max_size_for(self, split: str) -> int | None:
        return self.max_image_size if split == "train" else self.max_test_image_size

    @property
    def suffix(self) -> str:
        return {None: ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zz"}[self.compression]


def options_from(options: ConvertOptions | None, overrides: Mapping[str, Any]) -> ConvertOptions:
    """``options`` with ``overrides`` applied (unknown names raise ``TypeError`` naming them)."""
    base = options.to_dict() if options is not None else {}
    known = set(ConvertOptions.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown conversion option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    base.update({k: v for k, v in overrides.items()})
    return ConvertOptions(**base)


def fspath(url: Any) -> str:
    return os.fspath(url) if isinstance(url, os.PathLike) else str(url)

"""The ``Dataset`` chain: sources and stages that stream records to training.

The names load on first use (PEP 562): ``sf.read_tfrecord`` imports the read path, not the
CSV, image, text, mixing or telemetry stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

# `mix` names both a submodule and its function: imported now so that the name is the function
# whichever way the submodule gets loaded later (it needs only what the read path loads anyway)
from .mix import mix

if TYPE_CHECKING:
    from .csv import CsvError, decode_csv, read_csv
    from .dataset import Dataset
    from .images import DecodeImages, decode_images
    from .iterator import PipelineIterator
    from .node import AUTOTUNE
    from .records import ReadOptions, TFRecordDataset, TFRecordSource, read_tfrecord
    from .remedy import Remedy
    from .sources import SourceDataset, SourceReader, from_iterable, from_list
    from .spans import Span, SpanProvider, SpanStream, StaticSpans, split_spans
    from .state import check_resume_everywhere
    from .stats import PipelineStats, StageStats
    from .telemetry import MetricsServer, OtelMetrics, otel_metrics, serve_metrics
    from .text import TextStreamError, read_text

_MODULES: dict[str, tuple[str, ...]] = {
    "csv": ("CsvError", "decode_csv", "read_csv"),
    "dataset": ("Dataset",),
    "images": ("DecodeImages", "decode_images"),
    "iterator": ("PipelineIterator",),
    "node": ("AUTOTUNE",),
    "records": ("ReadOptions", "TFRecordDataset", "TFRecordSource", "read_tfrecord"),
    "remedy": ("Remedy",),
    "sources": ("SourceDataset", "SourceReader", "from_iterable", "from_list"),
    "spans": ("Span", "SpanProvider", "SpanStream", "StaticSpans", "split_spans"),
    "state": ("check_resume_everywhere",),
    "stats": ("PipelineStats", "StageStats"),
    "telemetry": ("MetricsServer", "OtelMetrics", "otel_metrics", "serve_metrics"),
    "text": ("TextStreamError", "read_text"),
}
__getattr__, __dir__ = lazy_names(__name__, _MODULES, globals())

__all__ = [
    "AUTOTUNE", "CsvError", "Dataset", "PipelineIterator", "PipelineStats", "SourceDataset", "SourceReader",
    "StageStats", "TFRecordDataset", "TFRecordSource", "ReadOptions", "Span", "SpanProvider", "SpanStream",
    "StaticSpans", "split_spans", "check_resume_everywhere", "from_iterable", "from_list", "mix", "decode_csv",
    "read_csv",
    "read_text", "TextStreamError", "read_tfrecord", "DecodeImages", "decode_images", "Remedy", "MetricsServer",
    "OtelMetrics",
    "otel_metrics", "serve_metrics",
]

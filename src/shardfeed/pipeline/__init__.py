"""The ``Dataset`` chain: sources and stages that stream records to training."""

from .csv import CsvError, decode_csv, read_csv
from .dataset import Dataset
from .images import DecodeImages, decode_images
from .iterator import PipelineIterator
from .mix import mix
from .node import AUTOTUNE
from .records import ReadOptions, TFRecordDataset, TFRecordSource, read_tfrecord
from .remedy import Remedy
from .sources import SourceDataset, SourceReader, from_iterable, from_list
from .spans import Span, SpanProvider, SpanStream, StaticSpans, split_spans
from .state import check_resume_everywhere
from .stats import PipelineStats, StageStats
from .telemetry import MetricsServer, OtelMetrics, otel_metrics, serve_metrics
from .text import read_text

__all__ = [
    "AUTOTUNE", "CsvError", "Dataset", "PipelineIterator", "PipelineStats", "SourceDataset", "SourceReader",
    "StageStats", "TFRecordDataset", "TFRecordSource", "ReadOptions", "Span", "SpanProvider", "SpanStream",
    "StaticSpans", "split_spans", "check_resume_everywhere", "from_iterable", "from_list", "mix", "decode_csv",
    "read_csv",
    "read_text", "read_tfrecord", "DecodeImages", "decode_images", "Remedy", "MetricsServer", "OtelMetrics",
    "otel_metrics", "serve_metrics",
]

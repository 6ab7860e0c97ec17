"""The ``Dataset`` chain: sources and stages that stream records to training."""

from .csv import CsvError, read_csv
from .dataset import Dataset
from .iterator import PipelineIterator
from .node import AUTOTUNE
from .sources import SourceDataset, SourceReader, TFRecordDataset, from_iterable, from_list, read_tfrecord
from .state import check_resume_everywhere
from .stats import PipelineStats, StageStats
from .text import read_text

__all__ = [
    "AUTOTUNE", "CsvError", "Dataset", "PipelineIterator", "PipelineStats", "SourceDataset", "SourceReader",
    "StageStats", "TFRecordDataset", "check_resume_everywhere", "from_iterable", "from_list", "read_csv",
    "read_text", "read_tfrecord",
]

"""The ``Dataset`` chain: sources and stages that stream records to training."""

from .dataset import Dataset
from .sources import TFRecordDataset, read_tfrecord

__all__ = ["Dataset", "TFRecordDataset", "read_tfrecord"]

"""shardfeed: feed ML training from object storage and tables without making the
accelerator wait, and turn raw data into sharded TFRecords.

The public surface is what ``__all__`` lists; everything else is an implementation detail.
"""

from __future__ import annotations

from ._version import __version__
from .convert import (
    ConvertOptions,
    ConvertResult,
    convert,
    convert_annotations,
    load_manifest,
    read_converted,
    read_dataset,
)
from .distributed import (
    WorkItem,
    WorkQueue,
    WorkQueueMismatchError,
    plan_shards,
    read_queue,
    read_shard,
    resolve_slice,
    shard_works,
)
from .errors import (
    CorruptRecordError,
    DecodeError,
    ImageDecodeError,
    IteratorClosedError,
    ParseError,
    ShardfeedError,
    StorageError,
    SubprocessError,
    WorkQueueLostError,
)
from .formats.example import (
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
)
from .formats.index import IndexedTFRecord, build_index, read_index
from .formats.parse import parse_example, parse_single_example
from .formats.sequence import parse_sequence_example, parse_single_sequence_example
from .formats.spec import FixedLen, FixedLenSequence, RaggedColumn, Sparse, SparseColumn, VarLen
from .formats.tfrecord import ReadStats, TFRecordReader, TFRecordWriter, read_records, write_records
from .pai import PaiFlags, pai_flags
from .pipeline import (
    AUTOTUNE,
    CsvError,
    Dataset,
    DecodeImages,
    PipelineIterator,
    PipelineStats,
    SourceDataset,
    TFRecordDataset,
    decode_csv,
    decode_images,
    from_iterable,
    from_list,
    mix,
    read_csv,
    read_text,
    read_tfrecord,
)
from .pipeline.telemetry import otel_metrics, serve_metrics
from .storage import retry_stats
from .transforms import (
    csv_id2dense,
    csv_id2sparse,
    csv_kv2dense,
    csv_kv2sparse,
    csv_to_dense,
    trans_csv_id2dense,
    trans_csv_id2sparse,
    trans_csv_kv2dense,
    trans_csv_kv2sparse,
    trans_csv_to_dense,
)

# Table support needs pyarrow (the `tables` extra): imported on first use, so that
# `import shardfeed` needs only numpy, fsspec and a CRC package.
_LAZY = {name: "tables" for name in
         ("TableRecordDataset", "TableRecordReader", "TableTypeError", "TableWriter", "WriterConflictError",
          "read_table")}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    try:
        mod = importlib.import_module(f".{module}", __name__)
    except ImportError as exc:
        raise ImportError(f"shardfeed.{name} needs the table extras: pip install 'shardfeed[tables]' ({exc})") from exc
    value = getattr(mod, name)
    globals()[name] = value
    return value


def native_available() -> bool:
    """Whether the C core (framing, CRC, batched Example parsing) is built and in use."""
    from .formats import native  # noqa: PLC0415

    return native.native_available()


def native_info() -> str:
    """Which parsing path is active, and why (for ``shardfeed --version`` and bug reports)."""
    from .formats import native  # noqa: PLC0415

    return native.native_info()


__all__ = [
    "__version__", "CorruptRecordError", "DecodeError", "IteratorClosedError", "ParseError", "ShardfeedError",
    "StorageError", "SubprocessError", "WorkQueueLostError", "ImageDecodeError", "DecodeImages", "decode_images",
    "decode_example", "decode_sequence_example", "encode_example", "encode_sequence_example",
    "parse_example", "parse_single_example", "parse_sequence_example", "parse_single_sequence_example",
    "FixedLenSequence", "IndexedTFRecord", "build_index", "read_index",
    "FixedLen", "VarLen", "Sparse", "RaggedColumn", "SparseColumn", "ReadStats", "TFRecordReader",
    "TFRecordWriter", "read_records", "write_records", "Dataset", "TFRecordDataset", "read_tfrecord",
    "AUTOTUNE", "CsvError", "PipelineIterator", "PipelineStats", "SourceDataset", "from_iterable", "from_list",
    "mix", "decode_csv", "read_csv", "read_text", "PaiFlags", "pai_flags", "TableRecordReader", "WorkItem",
    "WorkQueue", "WorkQueueMismatchError", "plan_shards", "read_queue",
    "read_shard", "resolve_slice", "shard_works", "TableRecordDataset", "TableTypeError", "TableWriter",
    "WriterConflictError", "read_table", "csv_id2dense", "csv_id2sparse", "csv_kv2dense", "csv_kv2sparse",
    "csv_to_dense", "trans_csv_id2dense", "trans_csv_id2sparse", "trans_csv_kv2dense", "trans_csv_kv2sparse",
    "trans_csv_to_dense", "ConvertOptions", "ConvertResult", "convert", "convert_annotations", "load_manifest",
    "read_converted", "read_dataset",
    "retry_stats", "native_available", "native_info", "serve_metrics", "otel_metrics",
]

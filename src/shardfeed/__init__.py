"""shardfeed: feed ML training from object storage and tables without making the
accelerator wait, and turn raw data into sharded TFRecords.

The public surface is what ``__all__`` lists; everything else is an implementation detail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from ._version import __version__

if TYPE_CHECKING:  # what the names are, for type checkers and IDEs; at run time they load on first use
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
        TextStreamError,
        TFRecordDataset,
        decode_csv,
        decode_images,
        from_iterable,
        from_list,
        read_csv,
        read_text,
        read_tfrecord,
    )
    from .pipeline.mix import mix
    from .pipeline.telemetry import otel_metrics, serve_metrics
    from .storage import retry_stats
    from .tables import (
        TableRecordDataset,
        TableRecordReader,
        TableTypeError,
        TableWriter,
        WriterConflictError,
        read_table,
    )
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

# Each public name and the module that defines it, imported on first use (PEP 562): `import shardfeed`
# costs only numpy-free bookkeeping, and `sf.read_tfrecord` loads the read path alone, not the
# conversion stack, tables or the distributed backends (docs/troubleshooting.md: import time).
_MODULES: dict[str, tuple[str, ...]] = {
    "convert": (
        "ConvertOptions", "ConvertResult", "convert", "convert_annotations", "load_manifest", "read_converted",
        "read_dataset"
    ),
    "distributed": (
        "WorkItem", "WorkQueue", "WorkQueueMismatchError", "plan_shards", "read_queue", "read_shard",
        "resolve_slice", "shard_works"
    ),
    "errors": (
        "CorruptRecordError", "DecodeError", "ImageDecodeError", "IteratorClosedError", "ParseError",
        "ShardfeedError", "StorageError", "SubprocessError", "WorkQueueLostError"
    ),
    "formats.example": ("decode_example", "decode_sequence_example", "encode_example", "encode_sequence_example"),
    "formats.index": ("IndexedTFRecord", "build_index", "read_index"),
    "formats.parse": ("parse_example", "parse_single_example"),
    "formats.sequence": ("parse_sequence_example", "parse_single_sequence_example"),
    "formats.spec": ("FixedLen", "FixedLenSequence", "RaggedColumn", "Sparse", "SparseColumn", "VarLen"),
    "formats.tfrecord": ("ReadStats", "TFRecordReader", "TFRecordWriter", "read_records", "write_records"),
    "pai": ("PaiFlags", "pai_flags"),
    "pipeline": (
        "AUTOTUNE", "CsvError", "Dataset", "DecodeImages", "PipelineIterator", "PipelineStats", "SourceDataset",
        "TextStreamError", "TFRecordDataset", "decode_csv", "decode_images", "from_iterable", "from_list", "mix",
        "read_csv", "read_text", "read_tfrecord"
    ),
    "pipeline.telemetry": ("otel_metrics", "serve_metrics"),
    "storage": ("retry_stats",),
    "transforms": (
        "csv_id2dense", "csv_id2sparse", "csv_kv2dense", "csv_kv2sparse", "csv_to_dense", "trans_csv_id2dense",
        "trans_csv_id2sparse", "trans_csv_kv2dense", "trans_csv_kv2sparse", "trans_csv_to_dense"
    ),
    "tables": (
        "TableRecordDataset", "TableRecordReader", "TableTypeError", "TableWriter", "WriterConflictError",
        "read_table"
    ),
}
# `sf.ray`: the Ray Data adapter (shardfeed.adapters.ray), a module of its own; the
# subpackages as attributes (`sf.pipeline.Span`), loaded on first use as the names are
# (`sf.convert` is the function; its package is `shardfeed.convert`)
_SUBPACKAGES = ("adapters", "distributed", "formats", "pipeline", "storage", "tables", "transforms")
__getattr__, __dir__ = lazy_names(__name__, _MODULES, globals(), extras={"tables": "tables"},
                                  submodules={"ray": "adapters.ray", **{p: p for p in _SUBPACKAGES}})


def native_available() -> bool:
    """Whether the C core (framing, CRC, batched Example parsing) is built and in use."""
    from .formats import native  # noqa: PLC0415

    return native.native_available()


def native_info() -> str:
    """Which parsing path is active, and why (for ``shardfeed --version`` and bug reports)."""
    from .formats import native  # noqa: PLC0415

    return native.native_info()


# `df.shardfeed` (and TFRecorder's `df.tensorflow`) whenever pandas is imported, without importing
# pandas or the conversion stack now
from .convert.pandas_accessor import install as _install_pandas_accessor  # noqa: E402

_install_pandas_accessor()
# loading the `convert` subpackage bound its module to the name `convert`; the public name is the
# function, resolved on first use like the others (the subpackage stays importable by its path)
del globals()["convert"]

__all__ = [
    "__version__", "CorruptRecordError", "DecodeError", "IteratorClosedError", "ParseError", "ShardfeedError",
    "StorageError", "SubprocessError", "WorkQueueLostError", "ImageDecodeError", "DecodeImages", "decode_images",
    "decode_example", "decode_sequence_example", "encode_example", "encode_sequence_example",
    "parse_example", "parse_single_example", "parse_sequence_example", "parse_single_sequence_example",
    "FixedLenSequence", "IndexedTFRecord", "build_index", "read_index",
    "FixedLen", "VarLen", "Sparse", "RaggedColumn", "SparseColumn", "ReadStats", "TFRecordReader",
    "TFRecordWriter", "read_records", "write_records", "Dataset", "TFRecordDataset", "read_tfrecord",
    "AUTOTUNE", "CsvError", "PipelineIterator", "PipelineStats", "SourceDataset", "from_iterable", "from_list",
    "mix", "decode_csv", "read_csv", "read_text", "TextStreamError", "PaiFlags", "pai_flags", "TableRecordReader",
    "WorkItem",
    "WorkQueue", "WorkQueueMismatchError", "plan_shards", "read_queue",
    "read_shard", "resolve_slice", "shard_works", "TableRecordDataset", "TableTypeError", "TableWriter",
    "WriterConflictError", "read_table", "csv_id2dense", "csv_id2sparse", "csv_kv2dense", "csv_kv2sparse",
    "csv_to_dense", "trans_csv_id2dense", "trans_csv_id2sparse", "trans_csv_kv2dense", "trans_csv_kv2sparse",
    "trans_csv_to_dense", "ConvertOptions", "ConvertResult", "convert", "convert_annotations", "load_manifest",
    "read_converted", "read_dataset",
    "retry_stats", "native_available", "native_info", "serve_metrics", "otel_metrics",
]

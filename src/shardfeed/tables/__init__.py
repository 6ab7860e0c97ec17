"""Tables: Parquet/CSV files on any storage, DuckDB, PostgreSQL, MaxCompute (ODPS).

``read_table`` / ``TableRecordDataset`` read rows as a pipeline source; ``TableWriter``
writes rows that appear only after a clean close. Table URLs: :mod:`.urls`.

Table URLs (:mod:`.urls`) need no driver: ``shardfeed.tables.urls`` imports without
pyarrow, so the queue and the PAI helpers can tell a table from a record file on a
machine without the ``tables`` extra. The readers and writers are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..pipeline.ranges import slice_range
from .urls import TableURL, is_table_url, parse_table_url

if TYPE_CHECKING:
    from .backend import WriterConflictError
    from .convert import TableTypeError
    from .reader import TableRecordDataset, count_rows, read_table
    from .record_reader import TableRecordReader
    from .writer import TableWriter

_LAZY = {"WriterConflictError": "backend", "TableTypeError": "convert", "TableRecordDataset": "reader",
         "count_rows": "reader", "read_table": "reader", "TableRecordReader": "record_reader",
         "TableWriter": "writer"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed.tables' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "TableRecordDataset", "TableRecordReader", "TableTypeError", "TableURL", "TableWriter", "WriterConflictError",
    "count_rows", "is_table_url",
    "parse_table_url", "read_table", "slice_range",
]

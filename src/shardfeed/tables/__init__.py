"""Tables: Parquet/CSV files on any storage, DuckDB, PostgreSQL, MaxCompute (ODPS).

``read_table`` / ``TableRecordDataset`` read rows as a pipeline source; ``TableWriter``
writes rows that appear only after a clean close. Table URLs: :mod:`.urls`.
"""

from .backend import WriterConflictError
from .convert import TableTypeError
from .reader import TableRecordDataset, count_rows, read_table, slice_range
from .record_reader import TableRecordReader
from .urls import TableURL, parse_table_url
from .writer import TableWriter

__all__ = [
    "TableRecordDataset", "TableRecordReader", "TableTypeError", "TableURL", "TableWriter", "WriterConflictError",
    "count_rows",
    "parse_table_url", "read_table", "slice_range",
]

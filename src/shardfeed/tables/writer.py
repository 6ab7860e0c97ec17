"""``TableWriter``: write rows to a table; they appear only after a clean ``close()``.

As PAI-TF's ``TableWriter(table, slice_id)``: opening starts an empty slice (a clean
close replaces what that ``slice_id`` wrote before; other slices keep their rows);
``write(values, indices)`` takes one row (a tuple, or a list / 1-D array of scalars) or
many (a list or 1-D array whose elements are rows: tuples, lists, structured records),
and ``indices`` says which table columns (0-based) the values go to (default: all, in
order; columns not given are NULL). A second writer of the same slice is refused with a
:class:`~shardfeed.tables.backend.WriterConflictError`. If the process dies or the
``with`` block raises before the close, the table stays as it was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ShardfeedError
from .backend import SliceWriter, open_table_backend
from .urls import parse_table_url

FLUSH_ROWS = 1 << 16


def _is_row(x: Any) -> bool:
    return isinstance(x, (tuple, list, np.void)) or (isinstance(x, np.ndarray) and x.ndim == 1)


def _rows(values: Any) -> list:
    """The rows in ``values`` (PAI's single-row vs many-rows rules)."""
    if isinstance(values, tuple):
        return [values]
    if isinstance(values, np.ndarray):
        if values.dtype.names:
            return [tuple(r) for r in values.reshape(-1)]
        if values.ndim == 1:
            return [tuple(values.tolist())]
        if values.ndim == 2:
            return [tuple(r) for r in values.tolist()]
        raise ValueError(f"write: values must be 1-D or 2-D, got shape {values.shape}")
    if isinstance(values, list):
        if values and all(_is_row(v) for v in values):
            return [tuple(v.tolist()) if isinstance(v, np.ndarray) else tuple(v) for v in values]
        if any(_is_row(v) for v in values):
            raise ValueError("write: values mixes rows and scalars; give one row (scalars) or a list of rows")
        return [tuple(values)]
    raise TypeError(f"write: values must be a tuple, a list or a numpy array, got {type(values).__name__}")


class TableWriter:
    """Write rows to slice ``slice_id`` of ``table`` (a table URL: Parquet folder on any
    storage, ``duckdb://``, ``postgresql://``, ``odps://``).

    ``schema`` (a ``pyarrow.Schema``) creates the table when it does not exist yet (for
    Parquet folders without one, the first ``write`` sets the schema, columns named
    ``c0, c1, ...``). Raises ``WriterConflictError`` when the slice is taken,
    ``FileNotFoundError`` for a SQL table that does not exist without ``schema``.
    """

    def __init__(self, table: str | os.PathLike, slice_id: int = 0, *, schema: pa.Schema | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if isinstance(slice_id, bool) or not isinstance(slice_id, int) or slice_id < 0:
            raise ValueError(f"slice_id must be an int >= 0, got {slice_id!r}")
        self.turl = parse_table_url(table)
        self.slice_id = slice_id
        self._backend = open_table_backend(self.turl, storage_options)
        self._impl: SliceWriter | None = self._backend.writer(slice_id, schema)
        self._buf: list[tuple[tuple[int, ...], list]] = []
        self._buffered = 0
        self.rows_written = 0

    @property
    def closed(self) -> bool:
        return self._impl is None

    def _schema(self, indices: tuple[int, ...], rows: list) -> pa.Schema:
        impl = self._impl
        if impl.schema is None:  # a new Parquet table: infer from the first rows
            width = max(indices) + 1
            fields = []
            for j in range(width):
                if j in indices:
                    k = indices.index(j)
                    t = pa.array([r[k] for r in rows[:1024]]).type
                    fields.append(pa.field(f"c{j}", pa.float64() if pa.types.is_null(t) else t))
                else:
                    fields.append(pa.field(f"c{j}", pa.string()))
            impl.schema = pa.schema(fields)
        return impl.schema

    def write(self, values: Any, indices: Sequence[int] | np.ndarray | None = None) -> None:
        """Write one row or many (see the module doc) to the columns ``indices``."""
        if self._impl is None:
            raise ValueError(f"{self.turl.masked}: write on a closed TableWriter")
        rows = _rows(values)
        if not rows:
            return
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise ValueError("write: rows have different numbers of values")
        if indices is None:
            indices = tuple(range(width))
        else:
            idx = np.asarray(indices).reshape(-1)
            if idx.dtype.kind not in "iu":
                raise TypeError(f"write: indices must be integers (column positions), got {list(indices)!r}")
            indices = tuple(int(i) for i in idx)
        if len(indices) != width:
            raise ValueError(f"write: {width} values per row but {len(indices)} indices")
        if len(set(indices)) != len(indices) or min(indices) < 0:
            raise ValueError(f"write: indices must be distinct column positions >= 0, got {list(indices)}")
        schema = self._schema(indices, rows)
        if max(indices) >= len(schema):
            raise ValueError(f"write: index {max(indices)} is past the table's {len(schema)} columns "
                             f"({schema.names})")
        self._buf.append((indices, rows))
        self._buffered += len(rows)
        if self._buffered >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        impl = self._impl
        schema = impl.schema
        for indices, rows in self._buf:
            arrays = []
            for j, field in enumerate(schema):
                if j in indices:
                    k = indices.index(j)
                    col = [r[k] for r in rows]
                    arrays.append(_column(col, field, self.turl.masked))
                else:
                    arrays.append(pa.nulls(len(rows), field.type))
            impl.stage(pa.Table.from_arrays(arrays, schema=schema))
            self.rows_written += len(rows)
        self._buf, self._buffered = [], 0

    def close(self) -> None:
        """Commit: the rows become visible, replacing this slice's earlier rows. Idempotent."""
        impl, self._impl = self._impl, None
        if impl is None:
            return
        try:
            if impl.schema is not None:
                self._flush_with(impl)
        except BaseException:
            impl.abort()
            raise
        impl.commit()
        self._backend.close()

    def _flush_with(self, impl: SliceWriter) -> None:
        self._impl = impl
        try:
            self._flush()
        finally:
            self._impl = None

    def abort(self) -> None:
        """Discard everything written; the table stays as it was. Idempotent."""
        impl, self._impl = self._impl, None
        if impl is not None:
            self._buf = []
            impl.abort()
            self._backend.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    def __del__(self) -> None:
        if getattr(self, "_impl", None) is not None:
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass


def _column(values: list, field: pa.Field, where: str) -> pa.Array:
    values = [v.item() if isinstance(v, np.generic) else v for v in values]
    if pa.types.is_integer(field.type):
        # pyarrow makes 2.9 the integer 2 without a word: only whole numbers go to an integer column
        bad = next((v for v in values if type(v) is float and not v.is_integer()), None)
        if bad is not None:
            raise ShardfeedError(f"{where}: value {bad!r} for column {field.name!r} is not a whole number, and the "
                                 f"column's type is {field.type}")
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    try:
        return pc.cast(pa.array(values), field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError) as exc:
        raise ShardfeedError(f"{where}: values for column {field.name!r} do not fit its type {field.type}: "
                             f"{exc}") from None


__all__ = ["TableWriter"]

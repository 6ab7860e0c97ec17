"""The interface every table store implements, and the registry from URL kind to store.

A backend reads: ``schema()`` (all columns, partition columns included), ``num_rows()``,
and ``read(columns, start, stop, batch_rows)``, Arrow record batches of rows
``[start, stop)`` in the table's stable order (``stop=None``: to the end). ``read`` may be
called from several threads at once. ``writer(slice_id, ...)`` returns a
:class:`SliceWriter` for :class:`~shardfeed.tables.writer.TableWriter`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from ..errors import ShardfeedError
from .urls import TableURL


class WriterConflictError(ShardfeedError, RuntimeError):
    """Another writer holds the same slice of the same table."""


class TableBackend:
    kind = "table"

    def __init__(self, turl: TableURL) -> None:
        self.turl = turl

    @property
    def masked(self) -> str:
        return self.turl.masked

    def schema(self) -> pa.Schema:
        raise NotImplementedError

    def num_rows(self) -> int:
        raise NotImplementedError

    def read(self, columns: list[str], start: int, stop: int | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def writer(self, slice_id: int, schema: pa.Schema | None) -> SliceWriter:
        raise NotImplementedError(f"{self.masked}: writing is not supported for {self.kind} tables")

    def close(self) -> None:
        """Release connections (idempotent)."""


class SliceWriter:
    """One slice's pending write: ``schema`` (the table's columns), ``stage(table)``
    (an Arrow table with exactly those columns), then ``commit()`` or ``abort()``."""

    schema: pa.Schema

    def stage(self, table: pa.Table) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


def open_table_backend(turl: TableURL, storage_options: Mapping[str, Any] | None = None) -> TableBackend:
    """The backend for ``turl``, by its kind, from the registry (:mod:`shardfeed.registry`:
    drivers are imported here, with an install hint when missing)."""
    from .. import registry  # noqa: PLC0415 - the registry imports backends lazily, by name

    return registry.load("table", turl.kind)(turl, storage_options)


open_backend = open_table_backend  # the earlier name


def slice_batches(batches: Iterator[pa.RecordBatch], skip: int, limit: int | None) -> Iterator[pa.RecordBatch]:
    """Drop the first ``skip`` rows of a batch stream and stop after ``limit`` rows."""
    left = limit
    for b in batches:
        n = b.num_rows
        if skip >= n:
            skip -= n
            continue
        if skip:
            b = b.slice(skip)
            skip = 0
        if left is not None:
            if left <= 0:
                return
            if b.num_rows > left:
                b = b.slice(0, left)
            left -= b.num_rows
        if b.num_rows:
            yield b
        if left is not None and left <= 0:
            return


def quote_ident(name: str) -> str:
    """``schema.table`` or ``column`` as quoted SQL identifiers."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def quote_column(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


__all__ = ["SliceWriter", "TableBackend", "WriterConflictError", "open_table_backend", "quote_column", "quote_ident",
           "slice_batches"]

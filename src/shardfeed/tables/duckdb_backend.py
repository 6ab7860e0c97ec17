"""DuckDB tables: ``duckdb:///path/file.db/table[/k=v...]``.

One DuckDB instance per file per process (DuckDB refuses two configurations of the same
file in one process), shared by readers and writers through cursors, reference-counted
and closed when the last user is done. Readers open the file read-only when they are
first, so several processes can read it at once; a writer needs it read-write (DuckDB
lets one process write a file at a time). Rows come in insertion order
(``preserve_insertion_order``); ``k=v`` segments become ``WHERE k = 'v'``.

Written with the DuckDB 2.0 API (``sql(...).to_arrow_reader``, ``fetchall``); works with
1.x too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from ..registry import require
from .backend import (
    SliceWriter,
    TableBackend,
    WriterConflictError,
    quote_column,
    quote_ident,
)
from .urls import TableURL

try:
    import duckdb
except ImportError:  # pragma: no cover - exercised only without the extra
    duckdb = None

_pool_lock = threading.Lock()
_pool: dict[str, list] = {}  # path -> [connection, read_only, users]
_commit_locks: dict[str, threading.Lock] = {}
_writers: set[tuple[str, str, int]] = set()


def _need() -> Any:
    if duckdb is None:
        return require("duckdb", what="duckdb:// tables")  # raises, with the pip command
    return duckdb


def _acquire(path: str, write: bool) -> Any:
    _need()
    with _pool_lock:
        entry = _pool.get(path)
        if entry is not None and write and entry[1]:
            if entry[2]:
                raise WriterConflictError(f"{path}: this process is reading the DuckDB file read-only right now; "
                                          "open the TableWriter before reading, or after the read ends")
            entry[0].close()
            entry = None
        if entry is None:
            if not write and not os.path.exists(path):
                raise FileNotFoundError(f"duckdb://{path}: no such DuckDB file")
            try:
                con = duckdb.connect(path, read_only=not write)
            except duckdb.IOException as exc:
                msg = str(exc)
                if "lock" in msg.lower():
                    raise WriterConflictError(f"duckdb://{path}: the file is open for writing in another process "
                                              f"(DuckDB allows one writing process): {msg}") from None
                raise
            entry = _pool[path] = [con, not write, 0]
        entry[2] += 1
        return entry[0].cursor()


def _release(path: str, cursor: Any) -> None:
    try:
        cursor.close()
    finally:
        with _pool_lock:
            entry = _pool.get(path)
            if entry is not None:
                entry[2] -= 1
                if entry[2] <= 0:
                    entry[0].close()
                    del _pool[path]


class DuckDBBackend(TableBackend):
    kind = "duckdb"

    def __init__(self, turl: TableURL, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(turl)
        _need()
        self.path = os.path.abspath(turl.location)
        self.table = quote_ident(turl.table)
        self._schema: pa.Schema | None = None
        self._order = ""

    def _where(self) -> str:
        if not self.turl.partitions:
            return ""
        conds = [f"{quote_column(k)} = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in self.turl.partitions]
        return " WHERE " + " AND ".join(conds)

    def _query(self, sql: str, write: bool = False) -> list:
        cur = _acquire(self.path, write)
        try:
            return cur.execute(sql).fetchall()
        except duckdb.CatalogException as exc:
            raise FileNotFoundError(f"{self.masked}: no such table ({str(exc).splitlines()[0]})") from None
        finally:
            _release(self.path, cur)

    def schema(self) -> pa.Schema:
        if self._schema is None:
            cur = _acquire(self.path, False)
            try:
                self._schema = cur.sql(f"SELECT * FROM {self.table} LIMIT 0").to_arrow_table().schema
                self._order = self._row_order(cur)
            except duckdb.CatalogException as exc:
                raise FileNotFoundError(f"{self.masked}: no such table ({str(exc).splitlines()[0]})") from None
            finally:
                _release(self.path, cur)
            missing = [k for k, _ in self.turl.partitions if k not in self._schema.names]
            if missing:
                raise ValueError(f"{self.masked}: partition column(s) {missing} are not columns of the table")
        return self._schema

    def _row_order(self, cur: Any) -> str:
        """A table's scan keeps insertion order (DuckDB's ``preserve_insertion_order``), so
        slices are exact row ranges without a sort; a view's order may change from one query
        to the next (a hash aggregate's, a parallel union's), and LIMIT/OFFSET slices of it
        would repeat and lose rows: it is read sorted by every column read (rows equal in
        all of them are interchangeable)."""
        try:
            cur.execute(f"SELECT rowid FROM {self.table} LIMIT 0")
            return ""
        except duckdb.BinderException:
            return " ORDER BY ALL"

    def num_rows(self) -> int:
        return int(self._query(f"SELECT count(*) FROM {self.table}{self._where()}")[0][0])

    def read(self, columns: list[str], start: int, stop: int | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        cols = ", ".join(quote_column(c) for c in columns)
        self.schema()
        sql = f"SELECT {cols} FROM {self.table}{self._where()}{self._order}"
        if stop is not None:
            sql += f" LIMIT {max(0, stop - start)}"
        if start:
            sql += f" OFFSET {start}"
        cur = _acquire(self.path, False)
        try:
            rel = cur.sql(sql)
            reader = rel.to_arrow_reader(batch_rows)
            try:
                yield from reader
            finally:
                # Free the stream before the cursor and connection go: a stream outliving its
                # database blocks the next connect to the same file.
                reader.close()
                del reader, rel
        finally:
            _release(self.path, cur)

    def writer(self, slice_id: int, schema: pa.Schema | None) -> DuckDBSliceWriter:
        return DuckDBSliceWriter(self, slice_id, schema)


def _shadow_name(table: str) -> str:
    if "." in table:
        schema, name = table.rsplit(".", 1)
        return quote_ident(f"{schema}._sf_slices_{name}")
    return quote_ident(f"_sf_slices_{table}")


class DuckDBSliceWriter(SliceWriter):
    """Stages rows in a TEMP table (gone with the connection); a commit replaces this
    slice's rows in ``_sf_slices_<table>`` and rewrites the table from it, in one
    transaction."""

    def __init__(self, backend: DuckDBBackend, slice_id: int, schema: pa.Schema | None) -> None:
        self.b = backend
        self.slice_id = slice_id
        self.key = (backend.path, backend.turl.table, slice_id)
        with _pool_lock:
            if self.key in _writers:
                raise WriterConflictError(f"{backend.masked}: slice {slice_id} is already being written by another "
                                          "TableWriter in this process; close it first or use another slice_id")
            _writers.add(self.key)
        self.cur = None
        try:
            self.cur = _acquire(backend.path, True)
            self._open(schema)
        except BaseException:
            self._done()
            raise

    def _open(self, schema: pa.Schema | None) -> None:
        cur, table = self.cur, self.b.table
        try:
            self.schema = cur.sql(f"SELECT * FROM {table} LIMIT 0").to_arrow_table().schema
        except duckdb.CatalogException:
            if schema is None:
                raise FileNotFoundError(f"{self.b.masked}: no such table; create it first or pass schema= to "
                                        "TableWriter") from None
            empty = pa.Table.from_batches([], schema=schema)
            cur.register("_sf_empty", empty)
            cur.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _sf_empty")
            cur.unregister("_sf_empty")
            self.schema = cur.sql(f"SELECT * FROM {table} LIMIT 0").to_arrow_table().schema
        self.stage_name = f"_sf_stage_{self.slice_id}"
        cur.execute(f"CREATE OR REPLACE TEMP TABLE {self.stage_name} AS SELECT * FROM {table} LIMIT 0")

    def stage(self, data: pa.Table) -> None:
        cols = ", ".join(quote_column(c) for c in data.column_names)
        self.cur.register("_sf_buf", data)
        try:
            self.cur.execute(f"INSERT INTO {self.stage_name} ({cols}) SELECT {cols} FROM _sf_buf")
        finally:
            self.cur.unregister("_sf_buf")

    def commit(self) -> None:
        cur, table, k = self.cur, self.b.table, self.slice_id
        shadow = _shadow_name(self.b.turl.table)
        cols = ", ".join(quote_column(c) for c in self.schema.names)
        with _pool_lock:
            lock = _commit_locks.setdefault(self.b.path, threading.Lock())
        try:
            with lock:
                cur.execute("BEGIN TRANSACTION")
                try:
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {shadow} AS SELECT {cols}, 0::BIGINT AS _sf_slice, "
                                f"0::BIGINT AS _sf_seq FROM {table} LIMIT 0")
                    cur.execute(f"DELETE FROM {shadow} WHERE _sf_slice = {k}")
                    cur.execute(f"INSERT INTO {shadow} SELECT {cols}, {k}, rowid FROM {self.stage_name}")
                    cur.execute(f"DELETE FROM {table}")
                    cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {shadow} "
                                "ORDER BY _sf_slice, _sf_seq")
                    cur.execute("COMMIT")
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
        finally:
            self._done()

    def abort(self) -> None:
        self._done()

    def _done(self) -> None:
        if self.cur is not None:
            try:
                self.cur.execute(f"DROP TABLE IF EXISTS {getattr(self, 'stage_name', '_sf_none')}")
            except Exception:  # noqa: BLE001 - the temp table dies with the connection anyway
                pass
            _release(self.b.path, self.cur)
            self.cur = None
        with _pool_lock:
            _writers.discard(self.key)


__all__ = ["DuckDBBackend", "DuckDBSliceWriter"]

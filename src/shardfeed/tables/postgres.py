"""PostgreSQL tables: ``postgresql://user[:password]@host:port/db/table[/k=v...]``.

Rows come in physical order (``ORDER BY tableoid, ctid``: stable while the table is not
rewritten; a view's rows in the order of their text), so slices are exact row ranges.
``k=v`` segments become ``WHERE k = 'v'`` (the literal is cast to the column's type by
the server). Each ``read`` uses its own connection and a server-side cursor, so threads
read in parallel.

Writing: rows are staged in a TEMP table with ``COPY`` (it dies with the session); a
commit, in one transaction under ``LOCK TABLE ... IN EXCLUSIVE MODE``, replaces this
slice's rows in ``_sf_slices_<table>`` and rewrites the table from it. A session-level
advisory lock per (table, slice) refuses a second writer of the same slice; the server
drops it when the writer's process dies.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from ..errors import ShardfeedError
from ..registry import require
from ..storage.urls import mask
from .backend import (
    SliceWriter,
    TableBackend,
    WriterConflictError,
    quote_column,
    quote_ident,
)
from .urls import TableURL

# PostgreSQL type oid -> (arrow type, SQL cast applied when selecting, or "")
_TYPES: dict[int, tuple[pa.DataType, str]] = {
    16: (pa.bool_(), ""), 20: (pa.int64(), ""), 21: (pa.int16(), ""), 23: (pa.int32(), ""),
    700: (pa.float32(), ""), 701: (pa.float64(), ""), 1700: (pa.float64(), "::float8"),
    25: (pa.string(), ""), 1043: (pa.string(), ""), 1042: (pa.string(), ""), 19: (pa.string(), ""),
    17: (pa.binary(), ""), 1082: (pa.date32(), ""), 1114: (pa.timestamp("us"), ""),
    1184: (pa.timestamp("us", tz="UTC"), ""),
}
_PG_TYPES = {
    "bool": "boolean", "int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint",
    "float": "real", "double": "double precision", "string": "text", "large_string": "text",
    "binary": "bytea", "date32[day]": "date",
}


def _psycopg() -> Any:
    return require("psycopg", what="postgresql:// tables (psycopg 3)")


class PostgresBackend(TableBackend):
    kind = "postgresql"

    def __init__(self, turl: TableURL, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(turl)
        self.psycopg = _psycopg()
        self.table = quote_ident(turl.table)
        self._schema: pa.Schema | None = None
        self._casts: dict[str, str] = {}
        self._order = ""

    def connect(self, autocommit: bool = True) -> Any:
        try:
            return self.psycopg.connect(self.turl.location, autocommit=autocommit, connect_timeout=10)
        except self.psycopg.OperationalError as exc:
            raise ConnectionError(f"{self.masked}: cannot connect to PostgreSQL: "
                                  f"{mask(exc, also=self.turl.secrets)}") from None
        except self.psycopg.Error as exc:  # libpq refused the URL itself, quoting pieces of it
            raise ValueError(f"{self.masked}: not a valid PostgreSQL connection URL: "
                             f"{mask(exc, also=self.turl.secrets)}") from None

    def _where(self, con: Any) -> str:
        if not self.turl.partitions:
            return ""
        from psycopg import sql

        conds = [f"{quote_column(k)} = {sql.Literal(v).as_string(con)}" for k, v in self.turl.partitions]
        return " WHERE " + " AND ".join(conds)

    def schema(self) -> pa.Schema:
        if self._schema is None:
            with self.connect() as con:
                try:
                    cur = con.execute(f"SELECT * FROM {self.table} LIMIT 0")
                except self.psycopg.errors.UndefinedTable:
                    raise FileNotFoundError(f"{self.masked}: no such table") from None
                fields = []
                for d in cur.description:
                    t, cast = _TYPES.get(d.type_code, (pa.string(), "::text"))
                    if d.type_code == 1700 and d.precision and d.scale is not None and d.precision <= 38:
                        # numeric(p, s) as decimals, every digit kept (as DuckDB and Parquet give
                        # them); a numeric without a precision has no Arrow type: float64
                        t, cast = pa.decimal128(d.precision, d.scale), ""
                    self._casts[d.name] = cast
                    fields.append(pa.field(d.name, t))
                self._order = self._row_order(con)
            self._schema = pa.schema(fields)
            missing = [k for k, _ in self.turl.partitions if k not in self._schema.names]
            if missing:
                raise ValueError(f"{self.masked}: partition column(s) {missing} are not columns of the table")
        return self._schema

    def _row_order(self, con: Any) -> str:
        """The ORDER BY that makes slices exact row ranges: physical order, partition by
        partition (the partitions of a table repeat each other's ctids, so ctid alone
        leaves ties that LIMIT/OFFSET may break differently per slice); a view or a foreign
        table has no ctid: the whole row's text, a total order up to identical rows, which
        are interchangeable (a sort per read: slower than a table's scan)."""
        try:
            con.execute(f"SELECT tableoid, ctid FROM {self.table} LIMIT 0")
            return " ORDER BY tableoid, ctid"
        except (self.psycopg.errors.UndefinedColumn, self.psycopg.errors.FeatureNotSupported):
            return " ORDER BY ROW(_sf_row.*)::text"  # ROW(): a column named _sf_row cannot shadow it

    def num_rows(self) -> int:
        with self.connect() as con:
            return int(con.execute(f"SELECT count(*) FROM {self.table}{self._where(con)}").fetchone()[0])

    def read(self, columns: list[str], start: int, stop: int | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        schema = self.schema()
        types = [schema.field(c).type for c in columns]
        cols = ", ".join(f"{quote_column(c)}{self._casts.get(c, '')}" for c in columns)
        with self.connect(autocommit=False) as con:
            q = f"SELECT {cols} FROM {self.table} AS _sf_row{self._where(con)}{self._order}"
            if stop is not None:
                q += f" LIMIT {max(0, stop - start)}"
            if start:
                q += f" OFFSET {start}"
            with con.cursor(name=f"sf_{uuid.uuid4().hex[:12]}") as cur:
                cur.itersize = batch_rows
                cur.execute(q)
                while rows := cur.fetchmany(batch_rows):
                    cols_data = list(zip(*rows))
                    yield pa.RecordBatch.from_arrays(
                        [_array(v, t) for v, t in zip(cols_data, types)], names=columns)

    def writer(self, slice_id: int, schema: pa.Schema | None) -> PostgresSliceWriter:
        return PostgresSliceWriter(self, slice_id, schema)


def _array(values: tuple, t: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(t) and t.tz is not None:
        values = tuple(v.astimezone(datetime.UTC) if v is not None else None for v in values)
    return pa.array(values, type=t)


PG_NAME_BYTES = 63
"""PostgreSQL cuts identifiers at this many bytes (NAMEDATALEN - 1), silently."""


def shadow_name(name: str) -> str:
    """The bookkeeping table's name for table ``name``: ``_sf_slices_<name>`` while that
    fits in an identifier (the name earlier versions used), else a prefix of the name and
    a hash of all of it, so that two long names that share a prefix never share one
    bookkeeping table (PostgreSQL would cut both to the same 63 bytes)."""
    plain = f"_sf_slices_{name}"
    if len(plain.encode()) <= PG_NAME_BYTES:
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    prefix = name.encode()[:24].decode("utf-8", errors="ignore")
    return f"_sf_slices_{prefix}_{digest}"


def _shadow(table: str) -> str:
    if "." in table:
        schema, name = table.rsplit(".", 1)
        return quote_ident(f"{schema}.{shadow_name(name)}")
    return quote_ident(shadow_name(table))


def _copy_error(exc: Any, first: int, slice_id: int) -> str:
    """What a COPY of staged rows refused, with the row of the write it was (PostgreSQL
    names the line of the COPY, and the column, in its context)."""
    diag = exc.diag
    what = diag.message_primary or str(exc)
    got = re.search(r"line (\d+)(?:, column ([^:]+))?", diag.context or "")
    if got is None:
        return f"a row written to slice {slice_id} does not fit the table: {what}"
    row, column = first + int(got.group(1)) - 1, got.group(2)
    where = f"column {column!r} of row {row}" if column else f"row {row}"
    return f"{where} written to slice {slice_id} (counted from 0) does not fit the table: {what}"


class PostgresSliceWriter(SliceWriter):
    def __init__(self, backend: PostgresBackend, slice_id: int, schema: pa.Schema | None) -> None:
        self.b = backend
        self.slice_id = slice_id
        self.con = backend.connect(autocommit=True)
        self.lock_key = f"shardfeed:{backend.turl.table}"
        self.locked = False
        try:
            self._open(schema)
        except BaseException:
            self.abort()
            raise

    def _open(self, schema: pa.Schema | None) -> None:
        con, table, b = self.con, self.b.table, self.b
        got = con.execute("SELECT pg_try_advisory_lock(hashtext(%s), %s)",
                          (self.lock_key, self.slice_id)).fetchone()[0]
        self.locked = bool(got)
        if not got:
            raise WriterConflictError(f"{b.masked}: slice {self.slice_id} is already being written by another "
                                      "TableWriter (PostgreSQL advisory lock held); use another slice_id or wait")
        try:
            con.execute(f"SELECT * FROM {table} LIMIT 0")
        except b.psycopg.errors.UndefinedTable:
            if schema is None:
                raise FileNotFoundError(f"{b.masked}: no such table; create it first or pass schema= to "
                                        "TableWriter") from None
            defs = ", ".join(f"{quote_column(f.name)} {_PG_TYPES.get(str(f.type), 'text')}" for f in schema)
            con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({defs})")
        b._schema = None
        self.schema = b.schema()
        self.stage_name = f"_sf_stage_{self.slice_id}"
        con.execute(f"DROP TABLE IF EXISTS {self.stage_name}")
        con.execute(f"CREATE TEMP TABLE {self.stage_name} AS SELECT t.*, 0::bigint AS _sf_seq "
                    f"FROM {table} t WITH NO DATA")
        # the stage table has none of the table's constraints: NOT NULL is checked as rows are
        # staged (naming the row), the others at the commit's insert
        self.not_null = {r[0] for r in con.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND attnotnull "
            "AND NOT attisdropped", (table,))}
        self.seq = 0

    def stage(self, data: pa.Table) -> None:
        names = data.column_names
        first = self.seq
        for name in names:
            col = data.column(name)
            if name in self.not_null and col.null_count:
                row = first + col.is_null().to_pylist().index(True)
                raise ShardfeedError(f"{self.b.masked}: column {name!r} is NOT NULL, and row {row} written to slice "
                                     f"{self.slice_id} (counted from 0) has null there (None, or a column left out)")
        cols = ", ".join(quote_column(c) for c in names) + ", _sf_seq"
        pycols = [data.column(i).to_pylist() for i in range(data.num_columns)]
        try:
            with self.con.cursor() as cur, cur.copy(f"COPY {self.stage_name} ({cols}) FROM STDIN") as cp:
                for row in zip(*pycols):
                    cp.write_row((*row, self.seq))
                    self.seq += 1
        except self.b.psycopg.errors.DataError as exc:
            raise ShardfeedError(f"{self.b.masked}: {_copy_error(exc, first, self.slice_id)}") from exc

    def commit(self) -> None:
        con, table, k = self.con, self.b.table, int(self.slice_id)
        shadow = _shadow(self.b.turl.table)
        cols = ", ".join(quote_column(c) for c in self.schema.names)
        try:
            with con.transaction():
                con.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
                con.execute(f"CREATE TABLE IF NOT EXISTS {shadow} AS SELECT {cols}, 0::bigint AS _sf_slice, "
                            f"0::bigint AS _sf_seq FROM {table} WITH NO DATA")
                con.execute(f"DELETE FROM {shadow} WHERE _sf_slice = {k}")
                con.execute(f"INSERT INTO {shadow} SELECT {cols}, {k}, _sf_seq FROM {self.stage_name}")
                con.execute(f"DELETE FROM {table}")
                con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {shadow} ORDER BY _sf_slice, _sf_seq")
        except (self.b.psycopg.errors.IntegrityError, self.b.psycopg.errors.DataError) as exc:
            diag = exc.diag
            raise ShardfeedError(f"{self.b.masked}: the table refused the rows of slice {k} at the commit (nothing "
                                 f"was written): {diag.message_primary or exc}"
                                 + (f" ({diag.message_detail})" if diag.message_detail else "")) from exc
        finally:
            self.abort()

    def abort(self) -> None:
        if self.con.closed:
            return
        try:
            if self.locked:  # released now: the session's end releases it only once its backend
                # has exited, after close() returns (a writer of the same slice opened at once
                # found it held: found by the test suite on a busy machine)
                self.con.execute("SELECT pg_advisory_unlock(hashtext(%s), %s)", (self.lock_key, self.slice_id))
                self.locked = False
        except Exception:  # noqa: BLE001, S110 - a broken session: its end releases the lock
            pass
        finally:
            self.con.close()  # drops the TEMP table (and the lock, if still held)


__all__ = ["PostgresBackend", "PostgresSliceWriter", "WriterConflictError"]

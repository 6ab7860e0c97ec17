"""Tables of Parquet or CSV files on any storage: a file, a folder, a glob, hive partitions.

Files are read in sorted path order; rows keep their order inside each file. Names that
start with ``_`` or ``.`` (lock files, staged files, ``_SUCCESS``) are not data. Folders
``k=v`` below the table (or at the end of its URL) become columns ``k`` (int64 when every
value is an integer, else string). A URL ending in ``/pt=1`` reads only that folder.

Writing: each slice owns one file, ``part-<slice_id:05d>.parquet``, written to a staged
temporary file and moved into place (local disk: ``os.replace``; object stores: one
atomic upload) only by a clean close. A lock (``_sf_writer-<slice>.lock``) refuses a
second writer of the same slice: an ``flock`` locally (released when the process dies), a
marker object on object stores (taken over when its process is gone from this host).
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .. import storage
from ..errors import ShardfeedError
from ..storage.urls import mask
from .backend import SliceWriter, TableBackend, WriterConflictError, slice_batches
from .urls import CSV_SUFFIXES, PARQUET_SUFFIXES, TableURL

logger = logging.getLogger(__name__)

_PARQUET = PARQUET_SUFFIXES
_CSV = CSV_SUFFIXES
CSV_BLOCK_LIMIT = 1 << 30
"""The longest row of a CSV table, in bytes (1 GiB). pyarrow reads a CSV in blocks and a
row must fit in one: a longer row makes the reader start again with blocks four times
larger, skipping the rows it gave, up to this bound; past it, an error naming the file."""
_held_locks: set[tuple[str, int]] = set()
_held_lock = threading.Lock()


def _is_data(rel: str) -> bool:
    return not any(p.startswith(("_", ".")) for p in rel.split("/"))


def _partition_value(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        return v


class FilesBackend(TableBackend):
    kind = "files"

    def __init__(self, turl: TableURL, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(turl)
        self.storage_options = dict(storage_options or {})
        self.parsed = storage.parse_url(turl.location)
        self.root = turl.location.rstrip("/")
        if turl.partitions:
            self.root += "/" + "/".join(f"{k}={v}" for k, v in turl.partitions)
        self._files: list[tuple[str, dict[str, str]]] | None = None
        self._counts: list[int] | None = None
        self._schema: pa.Schema | None = None
        self._lock = threading.Lock()

    # -- discovery ---------------------------------------------------------------------
    def files(self) -> list[tuple[str, dict[str, str]]]:
        """``(url, partition values)`` of every data file, sorted."""
        if self._files is None:
            self._files = self._discover()
        return self._files

    def _discover(self) -> list[tuple[str, dict[str, str]]]:
        fixed = dict(self.turl.partitions)
        root = self.root
        if storage.urls.has_magic(root):
            return [(u, dict(fixed)) for u in storage.glob(root, self.storage_options)
                    if _is_data(u.rsplit("/", 1)[-1])]
        fs, path = storage.get_filesystem(root, self.storage_options)
        path = path.rstrip("/")
        try:
            isdir = fs.isdir(path)
        except OSError as exc:
            raise FileNotFoundError(f"{mask(root)}: cannot list the table ({exc})") from exc
        if not isdir:
            if not fs.exists(path):
                raise FileNotFoundError(f"{mask(root)}: no such table (no file or folder there)")
            return [(root, dict(fixed))]
        out = []
        for name in sorted(fs.find(path, withdirs=False)):
            name = "/" + name if self.parsed.protocol == "memory" and not name.startswith("/") else name
            rel = name[len(path):].lstrip("/")
            if not rel or not _is_data(rel):
                continue
            parts = dict(fixed)
            for seg in rel.split("/")[:-1]:
                if "=" in seg:
                    k, v = seg.split("=", 1)
                    parts[k] = v
            out.append((self.parsed.with_path(name), parts))
        return out

    def format(self) -> str:
        names = [u.split("?", 1)[0].lower() for u, _ in self.files()]
        if names and all(n.endswith(_CSV) for n in names):
            return "csv"
        if any(n.endswith(_CSV) for n in names):
            raise ValueError(f"{self.masked}: the table mixes CSV and other files; keep one format per table")
        return "parquet"

    def _open(self, url: str):
        p = storage.parse_url(url)
        if p.is_local:
            return p.path
        fs, path = storage.get_filesystem(p, self.storage_options)
        return fs.open(path, "rb")

    def _partition_schema(self) -> list[pa.Field]:
        keys: dict[str, set[str]] = {}
        for _, parts in self.files():
            for k, v in parts.items():
                keys.setdefault(k, set()).add(v)
        fields = []
        for k, values in keys.items():
            ints = all(isinstance(_partition_value(v), int) for v in values)
            fields.append(pa.field(k, pa.int64() if ints else pa.string()))
        return fields

    def schema(self) -> pa.Schema:
        with self._lock:
            if self._schema is None:
                files = self.files()
                if not files:
                    raise FileNotFoundError(f"{self.masked}: the table folder holds no data files")
                first = files[0][0]
                try:
                    if self.format() == "csv":
                        file_schema = self._csv_schema(first)
                    else:
                        file_schema = pq.ParquetFile(self._open(first)).schema_arrow
                except (pa.ArrowInvalid, OSError) as exc:
                    raise ShardfeedError(f"{mask(first)}: cannot read the table file ({mask(exc)})") from exc
                fields = [f for f in file_schema if f.name not in {p.name for p in self._partition_schema()}]
                self._schema = pa.schema(fields + self._partition_schema())
        return self._schema

    # -- reading -----------------------------------------------------------------------
    def _file_rows(self, url: str) -> int:
        if self.format() == "csv":
            return sum(b.num_rows for b in self._csv_batches(url, None, 1 << 16))
        return pq.ParquetFile(self._open(url)).metadata.num_rows

    def counts(self) -> list[int]:
        if self._counts is None:
            self._counts = [self._file_rows(u) for u, _ in self.files()]
        return self._counts

    def num_rows(self) -> int:
        return sum(self.counts())

    def _csv_batches(self, url: str, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        schema = self.schema()
        file_cols = [f for f in schema if f.name not in self._part_names()]
        opts = pacsv.ConvertOptions(column_types={f.name: f.type for f in file_cols},
                                    include_columns=columns, strings_can_be_null=True)
        yield from self._csv_read(url, max(1 << 20, batch_rows * 64), opts)

    def _csv_schema(self, url: str) -> pa.Schema:
        """The columns of a CSV file, typed from its first block."""
        for schema in self._csv_read(url, 1 << 20, None, schema_only=True):
            try:
                names = schema.names
            except UnicodeDecodeError as exc:  # a column name's bytes (pyarrow says no file)
                raise ShardfeedError(f"{mask(url)}: the header is not UTF-8 text ({exc.reason} at byte {exc.start} "
                                     "of a column name); save the CSV as UTF-8") from None
            twice = next((n for k, n in enumerate(names) if n in names[:k]), None)
            if twice is not None:  # pyarrow would read one column's cells under both names
                raise ValueError(f"{mask(url)}: the header names column {twice!r} twice; give each column its "
                                 "own name")
            return schema
        raise AssertionError("unreachable")  # pragma: no cover

    def _csv_read(self, url: str, block: int, opts: Any, schema_only: bool = False) -> Iterator[Any]:
        """The batches of a CSV file (or, ``schema_only``, its schema), read in blocks of
        ``block`` bytes, larger ones where a row does not fit (:data:`CSV_BLOCK_LIMIT`);
        pyarrow's errors name the file."""
        given = 0
        while True:
            try:
                with pacsv.open_csv(self._open(url), read_options=pacsv.ReadOptions(block_size=block),
                                    convert_options=opts) as r:
                    if schema_only:
                        yield r.schema
                        return
                    for b in slice_batches(iter(r), given, None):
                        given += b.num_rows
                        yield b
                return
            except pa.ArrowInvalid as exc:
                if "straddl" not in str(exc):
                    raise ShardfeedError(f"{mask(url)}: {mask(exc)}") from None
                if block >= CSV_BLOCK_LIMIT:
                    raise ShardfeedError(f"{mask(url)}: a row after row {given} is longer than {CSV_BLOCK_LIMIT} "
                                         "bytes (CSV_BLOCK_LIMIT)") from None
                block = min(block * 4, CSV_BLOCK_LIMIT)

    def _part_names(self) -> set[str]:
        return {f.name for f in self._partition_schema()}

    def _file_batches(self, url: str, columns: list[str], start: int, stop: int | None,
                      batch_rows: int) -> Iterator[pa.RecordBatch]:
        if self.format() == "csv":
            yield from slice_batches(self._csv_batches(url, columns, batch_rows), start,
                                     None if stop is None else stop - start)
            return
        pf = pq.ParquetFile(self._open(url))
        md = pf.metadata
        missing = [c for c in columns if c not in pf.schema_arrow.names]
        if missing:
            raise ShardfeedError(f"{mask(url)}: the file has no column(s) {missing} that the table's first file has")
        groups, first, pos = [], None, 0
        for i in range(md.num_row_groups):
            n = md.row_group(i).num_rows
            if pos + n > start and (stop is None or pos < stop):
                groups.append(i)
                first = pos if first is None else first
            pos += n
        if not groups:
            return
        it = pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns)
        yield from slice_batches(it, start - first, None if stop is None else stop - start)

    def read(self, columns: list[str], start: int, stop: int | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        parts = self._partition_schema()
        part_types = {f.name: f.type for f in parts}
        file_cols = [c for c in columns if c not in part_types]
        files = self.files()
        counts = self.counts() if start else [None] * len(files)
        offset = 0
        for (url, pvals), n in zip(files, counts):
            if n is None and stop is not None:  # from the start: no row counts needed
                if offset >= stop:
                    return
                for b in self._file_batches(url, file_cols, 0, stop - offset, batch_rows):
                    offset += b.num_rows
                    yield _with_partitions(b, columns, pvals, part_types)
                continue
            if n is not None:
                lo, hi = offset, offset + n
                offset = hi
                if hi <= start or (stop is not None and lo >= stop):
                    continue
                s, e = max(start, lo) - lo, (min(stop, hi) - lo) if stop is not None else None
            else:
                s, e = 0, None
            for b in self._file_batches(url, file_cols, s, e, batch_rows):
                yield _with_partitions(b, columns, pvals, part_types)


def _with_partitions(b: pa.RecordBatch, columns: list[str], pvals: dict[str, str],
                     types: dict[str, pa.DataType]) -> pa.RecordBatch:
    if not types:
        return b
    arrays = []
    for c in columns:
        if c in types:
            v = pvals.get(c)
            v = (int(v) if pa.types.is_integer(types[c]) else v) if v is not None else None
            arrays.append(pa.array([v] * b.num_rows, types[c]))
        else:
            arrays.append(b.column(c))
    return pa.RecordBatch.from_arrays(arrays, names=columns)


# -- writing -------------------------------------------------------------------------------
class _Lock:
    def __init__(self, root: str, slice_id: int, storage_options: Mapping[str, Any]) -> None:
        self.url = f"{root.rstrip('/')}/_sf_writer-{slice_id:05d}.lock"
        self.key = (self.url, slice_id)
        self.storage_options = storage_options
        self.fd: int | None = None
        with _held_lock:
            if self.key in _held_locks:
                raise WriterConflictError(f"{mask(root)}: slice {slice_id} is already being written by another "
                                          "TableWriter in this process; close it first or use another slice_id")
            _held_locks.add(self.key)
        try:
            self._acquire(slice_id, root)
        except BaseException:
            with _held_lock:
                _held_locks.discard(self.key)
            raise

    def _acquire(self, slice_id: int, root: str) -> None:
        p = storage.parse_url(self.url)
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        if p.is_local:
            os.makedirs(os.path.dirname(p.path), exist_ok=True)
            self.fd = os.open(p.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self.fd)
                self.fd = None
                raise WriterConflictError(f"{mask(root)}: slice {slice_id} is already being written by another "
                                          "process; use another slice_id or wait for it to close") from None
            os.ftruncate(self.fd, 0)
            os.write(self.fd, json.dumps(me).encode())
            return
        if storage.exists(self.url, self.storage_options):
            try:
                holder = json.loads(storage.read_bytes(self.url, self.storage_options))
            except (ValueError, OSError):
                holder = {}
            stale = holder.get("host") == me["host"] and not _pid_alive(int(holder.get("pid", 0)))
            if not stale:
                raise WriterConflictError(f"{mask(root)}: slice {slice_id} is being written by {holder} "
                                          f"(lock {mask(self.url)}); if that writer is gone, delete the lock")
        storage.write_bytes(self.url, json.dumps(me).encode(), self.storage_options)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the lock file stays; flock is what counts
            self.fd = None
        elif not storage.parse_url(self.url).is_local:
            storage.remove(self.url, self.storage_options)
        with _held_lock:
            _held_locks.discard(self.key)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_staging(directory: str, slice_id: int) -> None:
    """Staged files of this slice left by a writer that was killed. Safe: this writer holds
    the slice's lock, so no live writer of the slice owns one."""
    for path in glob.glob(os.path.join(glob.escape(directory), f".part-{slice_id:05d}.*.tmp")):
        try:
            os.unlink(path)
            logger.info("removed %s, staged by a writer of slice %d that did not finish", path, slice_id)
        except FileNotFoundError:
            pass


class ParquetSliceWriter(SliceWriter):
    def __init__(self, backend: FilesBackend, slice_id: int, schema: pa.Schema | None) -> None:
        root = backend.turl.location.rstrip("/")
        if backend.turl.partitions:
            root += "/" + "/".join(f"{k}={v}" for k, v in backend.turl.partitions)
        self.root = root
        self.url = f"{root}/part-{slice_id:05d}.parquet"
        self.storage_options = backend.storage_options
        self._lock = _Lock(root, slice_id, self.storage_options)
        try:
            if schema is None:
                try:
                    existing = backend.schema()
                    parts = {f.name for f in backend._partition_schema()}
                    schema = pa.schema([f for f in existing if f.name not in parts])
                except FileNotFoundError:
                    schema = None
            self.schema = schema
            p = storage.parse_url(self.url)
            directory = os.path.dirname(p.path) if p.is_local else None
            if directory:
                os.makedirs(directory, exist_ok=True)
                _remove_stale_staging(directory, slice_id)
            fd, self.tmp = tempfile.mkstemp(prefix=f".part-{slice_id:05d}.{uuid.uuid4().hex[:8]}.",
                                            suffix=".tmp", dir=directory)
            os.close(fd)
            self._pq: pq.ParquetWriter | None = None
        except BaseException:
            self._lock.release()
            raise

    def stage(self, table: pa.Table) -> None:
        if self._pq is None:
            self.schema = table.schema
            self._pq = pq.ParquetWriter(self.tmp, table.schema)
        self._pq.write_table(table)

    def commit(self) -> None:
        try:
            if self._pq is None:
                if self.schema is None:
                    raise ValueError(f"{mask(self.root)}: nothing was written and the table has no schema yet; "
                                     "pass schema= to TableWriter to create an empty table")
                self._pq = pq.ParquetWriter(self.tmp, self.schema)
            self._pq.close()
            p = storage.parse_url(self.url)
            if p.is_local:
                os.replace(self.tmp, p.path)
            else:
                with open(self.tmp, "rb") as src, storage.open_output(self.url, self.storage_options) as out:
                    while chunk := src.read(16 << 20):
                        out.write(chunk)
                os.unlink(self.tmp)
        finally:
            self._cleanup()

    def abort(self) -> None:
        try:
            if self._pq is not None:
                self._pq.close()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        self._lock.release()


def parquet_writer(backend: FilesBackend, slice_id: int, schema: pa.Schema | None) -> ParquetSliceWriter:
    return ParquetSliceWriter(backend, slice_id, schema)


FilesBackend.writer = parquet_writer  # type: ignore[assignment]

__all__ = ["FilesBackend", "ParquetSliceWriter", "WriterConflictError"]

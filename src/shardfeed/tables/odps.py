"""MaxCompute (ODPS) tables: ``odps://project/tables/name[/pt=...]``, through pyodps.

Credentials come from the environment, never the URL: ``ODPS_ACCESS_ID`` /
``ODPS_ACCESS_KEY`` (or ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``..._SECRET``) and
``ODPS_ENDPOINT``. Reads go through the table tunnel's Arrow reader with a row range, so
slices read only their rows; writes through a tunnel upload session per slice, committed
by a clean close (MaxCompute makes the block visible only then). This backend is not
exercised against a live service in shardfeed's tests (they need an account); URL parsing
and the missing-dependency error are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from ..registry import require
from .backend import SliceWriter, TableBackend
from .urls import TableURL


def _pyodps() -> Any:
    try:
        return require("odps", what="odps:// (MaxCompute) tables")
    except ImportError as exc:
        exc.add_note("credentials come from ODPS_ACCESS_ID, ODPS_ACCESS_KEY and ODPS_ENDPOINT")
        raise


def _env(*names: str) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


class ODPSBackend(TableBackend):
    kind = "odps"

    def __init__(self, turl: TableURL, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(turl)
        odps = _pyodps()
        access_id = _env("ODPS_ACCESS_ID", "ALIBABA_CLOUD_ACCESS_KEY_ID")
        secret = _env("ODPS_ACCESS_KEY", "ALIBABA_CLOUD_ACCESS_KEY_SECRET")
        endpoint = _env("ODPS_ENDPOINT")
        if not (access_id and secret and endpoint):
            raise PermissionError(f"{self.masked}: set ODPS_ACCESS_ID, ODPS_ACCESS_KEY and ODPS_ENDPOINT to read "
                                  "MaxCompute tables")
        from ..storage.urls import register_secret

        register_secret(secret)
        self.o = odps.ODPS(access_id, secret, project=turl.location, endpoint=endpoint)
        self.t = self.o.get_table(turl.table)
        self.partition = ",".join(f"{k}={v}" for k, v in turl.partitions) or None
        self._schema: pa.Schema | None = None

    def schema(self) -> pa.Schema:
        if self._schema is None:
            with self.t.open_reader(partition=self.partition, arrow=True) as r:
                first = r.read(start=0, count=1) if hasattr(r, "read") else None
            if first is not None and hasattr(first, "schema"):
                self._schema = first.schema
            else:
                self._schema = pa.schema([pa.field(c.name, pa.string()) for c in self.t.table_schema.columns])
        return self._schema

    def num_rows(self) -> int:
        with self.t.open_reader(partition=self.partition, arrow=True) as r:
            return int(r.count)

    def read(self, columns: list[str], start: int, stop: int | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        with self.t.open_reader(partition=self.partition, arrow=True, columns=columns) as r:
            end = r.count if stop is None else min(stop, r.count)
            pos = start
            while pos < end:
                n = min(batch_rows, end - pos)
                data = r.read(start=pos, count=n)
                batches = data.to_batches() if isinstance(data, pa.Table) else list(data)
                for b in batches:
                    yield b.select(columns) if hasattr(b, "select") else b
                pos += n

    def writer(self, slice_id: int, schema: pa.Schema | None) -> ODPSSliceWriter:
        return ODPSSliceWriter(self, slice_id)


class ODPSSliceWriter(SliceWriter):
    """One tunnel upload session; ``commit`` makes the rows visible, overwriting the
    table (or partition) as PAI's TableWriter does."""

    def __init__(self, backend: ODPSBackend, slice_id: int) -> None:
        self.b = backend
        self.schema = backend.schema()
        from odps.tunnel import TableTunnel

        self.session = TableTunnel(backend.o).create_upload_session(
            backend.t.name, partition_spec=backend.partition, overwrite=True)
        self.block = int(slice_id)
        self.w = self.session.open_arrow_writer(self.block)

    def stage(self, data: pa.Table) -> None:
        self.w.write(data)

    def commit(self) -> None:
        self.w.close()
        self.session.commit([self.block])

    def abort(self) -> None:
        try:
            self.w.close()
        except Exception:  # noqa: BLE001 - an uncommitted session expires on the server
            pass


__all__ = ["ODPSBackend"]

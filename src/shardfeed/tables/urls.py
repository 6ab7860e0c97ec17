"""Table URLs: what a table string names, and which backend reads and writes it.

=================================================  ==========================================
URL                                                table
=================================================  ==========================================
``duckdb:///path/file.db/table[/k=v...]``          a DuckDB table (``schema.table`` allowed)
``postgresql://user@host:port/db/table[/k=v...]``  a PostgreSQL table (``postgres://`` too)
``odps://project/tables/name[/k=v...]``            a MaxCompute table (through pyodps)
anything else (path, ``s3://``, ``oss://`` ...)    Parquet or CSV files: a file, a folder, a glob,
                                                   hive partition folders ``.../k=v/...``
=================================================  ==========================================

Trailing ``k=v`` segments select a partition: a folder for files, a column filter for SQL
stores. A value may be percent-encoded (``pt=a%2Fb``).

Where a URL could also be a record file (a ``WorkQueue``'s works, static sharding),
:func:`is_table_url` is the one answer: a table scheme, or Parquet/CSV files by suffix.
This module needs no driver (no pyarrow): it imports on any machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from ..storage.urls import mask

TABLE_SCHEMES = ("duckdb", "postgresql", "postgres", "odps")
"""URL schemes that always name a table."""
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
"""File suffixes read as Parquet tables."""
CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz")
"""File suffixes read as CSV tables."""

_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$")


@dataclass(frozen=True, repr=False)
class TableURL:
    """A parsed table URL.

    ``kind`` is ``"files"``, ``"duckdb"``, ``"postgresql"`` or ``"odps"``; ``location``
    the files' URL (without partition segments), the DuckDB file path, the PostgreSQL
    connection URL (``postgresql://user@host:port/db?...``) or the ODPS project;
    ``table`` the table name (``""`` for files); ``partitions`` the ``(key, value)``
    pairs of the trailing ``k=v`` segments; ``url`` the URL as given.
    """

    kind: str
    location: str
    table: str
    partitions: tuple[tuple[str, str], ...] = field(default=())
    url: str = ""

    @property
    def masked(self) -> str:
        """The URL with credentials masked, for messages."""
        return mask(self.url)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The password the URL holds, as written and percent-decoded (``()`` without one):
        a driver's message may quote it without its URL; pass it to ``mask(text, also=...)``."""
        if self.kind != "postgresql":
            return ()
        userinfo = self.location.split("://", 1)[1].rpartition("@")[0]
        password = userinfo.partition(":")[2]
        return (password, unquote(password)) if password else ()

    def __repr__(self) -> str:  # the dataclass's would show the password (in url and location)
        return (f"TableURL(kind={self.kind!r}, location={mask(self.location)!r}, table={self.table!r}, "
                f"partitions={self.partitions!r}, url={self.masked!r})")

    def __str__(self) -> str:
        return self.masked

    @property
    def partition_columns(self) -> dict[str, str]:
        return dict(self.partitions)


def _split_partitions(segments: list[str], url: str) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    parts: list[tuple[str, str]] = []
    while segments and (m := _PART.match(segments[-1])):
        segments.pop()
        parts.append((m.group(1), unquote(m.group(2))))
    parts.reverse()
    keys = [k for k, _ in parts]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{mask(url)}: partition key given twice ({keys})")
    return segments, tuple(parts)


def _check_table(name: str, url: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"{mask(url)}: {name!r} is not a table name (letters, digits and '_', "
                         "optionally 'schema.table')")
    return name


def parse_table_url(url: str | os.PathLike) -> TableURL:
    """Parse a table URL (see the module doc). Raises ``ValueError`` saying what is missing."""
    url = os.fspath(url)
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"a table URL must be a non-empty string, got {url!r}")
    url = url.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "duckdb":
        rest = url.split("://", 1)[1]
        segments = [s for s in rest.split("/") if s != ""]
        segments, parts = _split_partitions(segments, url)
        if len(segments) < 2:
            raise ValueError(f"{mask(url)}: a DuckDB table URL is duckdb:///path/to/file.db/table[/k=v]")
        table = _check_table(segments[-1], url)
        path = "/".join(segments[:-1])
        path = ("/" + path) if rest.startswith("/") else path
        return TableURL("duckdb", path, table, parts, url)
    if scheme in ("postgresql", "postgres"):
        rest = url.split("://", 1)[1]
        query = ""
        if "?" in rest:
            rest, query = rest.split("?", 1)
        netloc, _, path = rest.partition("/")
        segments = [s for s in path.split("/") if s != ""]
        segments, parts = _split_partitions(segments, url)
        if any("@" in seg for seg in segments):  # libpq ends the user:password part at the first '/'
            raise ValueError(f"{mask(url)}: the user name or password holds a raw '/' (or a name after the "
                             "host an '@'): percent-encode them in the URL, '/' as %2F and '@' as %40")
        if len(segments) != 2 or not netloc:
            raise ValueError(f"{mask(url)}: a PostgreSQL table URL is "
                             "postgresql://user[:password]@host:port/database/table[/k=v]")
        db, table = segments
        conninfo = f"postgresql://{netloc}/{db}" + (f"?{query}" if query else "")
        return TableURL("postgresql", conninfo, _check_table(table, url), parts, url)
    if scheme == "odps":
        rest = url.split("://", 1)[1].split("?", 1)[0]
        segments = [s for s in rest.split("/") if s != ""]
        segments, parts = _split_partitions(segments, url)
        if len(segments) != 3 or segments[1] != "tables":
            raise ValueError(f"{mask(url)}: a MaxCompute table URL is odps://project/tables/name[/pt=...]")
        return TableURL("odps", segments[0], _check_table(segments[2], url), parts, url)
    # Files on any storage: trailing k=v folders select a partition.
    base, query = (url.split("?", 1) + [""])[:2] if scheme in ("s3", "oss", "gs", "gcs") else (url, "")
    trailing_slash = base.endswith("/")
    head = ""
    if "://" in base:
        head, base = base.split("://", 1)
        head += "://"
    segments = base.split("/")
    leading = segments[0] == ""
    segments = [s for s in segments if s != ""]
    segments, parts = _split_partitions(segments, url)
    if not segments:
        raise ValueError(f"{mask(url)}: no table location before the partition folders")
    location = head + ("/" if leading else "") + "/".join(segments)
    if trailing_slash and not parts:
        location += "/"
    if query:
        location += "?" + query
    return TableURL("files", location, "", parts, url)


def is_table_url(url: str | os.PathLike) -> bool:
    """Whether ``url`` names a table rather than a record file: a ``duckdb://``,
    ``postgresql://``/``postgres://`` or ``odps://`` URL, or a Parquet or CSV file
    (:data:`PARQUET_SUFFIXES`, :data:`CSV_SUFFIXES`; case, a query string and trailing
    ``k=v`` partition folders ignored). The queue, static sharding and the table reader all
    ask this function, so a URL is a table to all of them or to none."""
    url = os.fspath(url).strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in TABLE_SCHEMES:
        return True
    segments = [s for s in url.split("?", 1)[0].split("/") if s]
    while segments and _PART.match(segments[-1]):
        segments.pop()
    return bool(segments) and segments[-1].lower().endswith(PARQUET_SUFFIXES + CSV_SUFFIXES)


def table_urls(filenames: str | os.PathLike | list | tuple) -> list[str]:
    """The list of table URLs in ``filenames``: a list, or one string (a comma-separated
    list of ``odps://``/``duckdb://``/``postgresql://`` URLs is split as PAI's ``-Dtables``)."""
    if isinstance(filenames, (str, os.PathLike)):
        s = os.fspath(filenames)
        if "," in s and re.match(r"^(odps|duckdb|postgres|postgresql)://", s, re.IGNORECASE):
            return [p.strip() for p in s.split(",") if p.strip()]
        return [s]
    out = [os.fspath(f) for f in filenames]
    if not out:
        raise ValueError("no tables given: pass one table URL or a list of them")
    return out


__all__ = ["CSV_SUFFIXES", "PARQUET_SUFFIXES", "TABLE_SCHEMES", "TableURL", "is_table_url", "parse_table_url",
           "table_urls"]

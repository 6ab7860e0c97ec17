"""Inputs to rows: a DataFrame, a CSV on any storage, or an image folder.

Each reader returns ``(rows, discards)``: rows that parsed, and a report line for each
row that did not (wrong number of cells, unknown split, a missing value without a
default). Nothing is read from the images here; that happens in the workers.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import storage
from ..storage.urls import mask, parse_url
from .csv_text import csv_layout, csv_lines
from .options import Discard, DiscardRecord, Row
from .schema import (
    AUTOML_COLUMNS,
    SPLIT_NAMES,
    Schema,
    automl_schema,
    cell_parser,
    is_missing,
    normalize_split,
)

logger = logging.getLogger(__name__)

def resolve_uri(uri: str, base: str | None) -> str:
    """``uri`` as is when it is absolute (a URL or an absolute path), else relative to ``base``."""
    uri = uri.strip()
    if not base or "://" in uri or os.path.isabs(uri):
        return uri
    if "://" in base:
        return posixpath.join(base.rstrip("/"), uri)
    return os.path.join(base, uri)


def _dirname(url: str) -> str:
    if "://" in url:
        return url.rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(url))


class RowBuilder:
    """Typed rows from ``(number, {column: cell}, error)``, one at a time (a Spark executor
    builds its partition's rows with it, without holding them all)."""

    def __init__(self, schema: Schema, origin: str, base: str | None):
        self.schema, self.origin, self.base = schema, origin, base
        self.split_col = schema.column_of("split")
        self.image_col = schema.column_of("image_uri")
        self.label_col = schema.column_of("label")
        self.features = schema.feature_columns()
        self._parsers = [(c, cell_parser(schema, c)) for c in self.features]
        self._label = cell_parser(schema, self.label_col) if self.label_col else None

    def build(self, number: int, cells: Mapping[str, Any] | None, error: str | None) -> Row | DiscardRecord:
        """The row, or the discard record of a row with an error or a cell that does not parse."""
        image = None
        try:
            if error is not None or cells is None:
                raise Discard(error or "unreadable row")
            if self.image_col is not None:
                raw = cells.get(self.image_col)
                if is_missing(raw):
                    raise Discard(f"column {self.image_col!r} (image_uri) is empty")
                image = resolve_uri(str(raw), self.base)
            split = normalize_split(cells.get(self.split_col)) if self.split_col else None
            label = self._label(cells.get(self.label_col)) if self._label is not None else None
            values = {c: parse(cells.get(c)) for c, parse in self._parsers}
            return Row(number, self.origin, image, split, label, values)
        except Discard as d:
            return DiscardRecord(number, image or f"{self.origin}#{number}", str(d))


def rows_from_records(records: Iterable[tuple[int, Mapping[str, Any] | None, str | None]], schema: Schema,
                      origin: str, base: str | None) -> tuple[list[Row], list[DiscardRecord]]:
    """Typed rows from ``(number, {column: cell}, error)`` tuples; a tuple with an error
    (or a cell that does not parse) becomes a discard record."""
    builder = RowBuilder(schema, origin, base)
    rows: list[Row] = []
    discards: list[DiscardRecord] = []
    for number, cells, error in records:
        r = builder.build(number, cells, error)
        (rows if isinstance(r, Row) else discards).append(r)
    return rows, discards


def default_schema(columns: Sequence[str], what: str) -> Schema:
    lowered = [str(c).strip().lower() for c in columns]
    missing = [c for c in AUTOML_COLUMNS[1:] if c not in lowered]
    if missing:
        raise ValueError(
            f"{what} has columns {list(columns)[:10]} but no schema was given: expected the AutoML layout "
            f"split,image_uri,label (missing {', '.join(missing)}), or pass schema={{column: type}}")
    schema = automl_schema()
    mapping = {lowered[i]: str(c) for i, c in enumerate(columns)}
    cols = {mapping[c]: t for c, t in schema.columns.items() if c in mapping}
    return Schema(cols)


def _column_values(col: Any) -> list:
    """The values of a pandas Series, as iterating it gives them: ``tolist()`` where that
    is the same list, made at once (a numpy column, a string column: five times faster than
    iterating pandas 3's Arrow-backed strings), else the iteration itself (a nullable Int64
    column iterates as numpy scalars, which ``tolist`` would make Python's)."""
    import pandas as pd  # noqa: PLC0415 - a DataFrame's caller has it

    if isinstance(col.dtype, (np.dtype, pd.StringDtype, pd.CategoricalDtype)):
        return col.tolist()
    return list(col)


def read_dataframe(df: Any, schema: Schema | None, origin: str = "<DataFrame>", base: str | None = None,
                   where: str | None = None) -> tuple[list[Row], list[DiscardRecord], Schema]:
    """Rows of a pandas DataFrame (row numbers are 1-based positions); ``origin`` names it
    in the discard report, ``base`` is the folder relative image paths are taken from,
    ``where`` the file it was read from (a part of a folder), for errors."""
    columns = [str(c) for c in df.columns]
    what = where or ("the DataFrame" if origin == "<DataFrame>" else origin)
    schema = schema or default_schema(columns, what)
    absent = [c for c in schema.columns if c not in columns]
    if absent:
        raise ValueError(f"{what} lacks column(s) the schema names: {', '.join(absent)} (it has "
                         f"{columns[:20] if columns else 'no columns'})")
    used = list(schema.columns)
    twice = next((c for c in used if columns.count(c) > 1), None)
    if twice is not None:  # which column's cells to write? (a CSV header naming one twice is refused too)
        raise ValueError(f"{what} has {columns.count(twice)} columns named {twice!r} (as text): give each column "
                         "its own name (df.columns) before converting")
    # the schema's columns only (the rows read nothing else), each as the list its values
    # give when iterated (as itertuples gives them)
    last = {str(c): j for j, c in enumerate(df.columns)}
    values = [_column_values(df.iloc[:, last[c]]) for c in used]

    def records():
        for i, tup in enumerate(zip(*values) if used else (() for _ in range(len(df))), start=1):
            yield i, dict(zip(used, tup)), None

    rows, discards = rows_from_records(records(), schema, origin, base)
    return rows, discards, schema


PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


def table_format(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """``"parquet"``, ``"json"`` (JSON lines) or ``"csv"``: by the name's suffix, else by the
    file's first bytes (Parquet's ``PAR1`` magic)."""
    low = url.lower().rstrip("/")
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(JSON_SUFFIXES):
        return "json"
    if low.endswith((".csv", ".tsv", ".txt")):
        return "csv"
    try:
        head = storage.read_bytes(url, 0, 4, storage_options=storage_options)
    except (OSError, ValueError):
        return "csv"
    return "parquet" if head == b"PAR1" else "csv"


def parquet_parts(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str] | None:
    """The part files of a folder that holds a Parquet dataset (what Spark and pandas write:
    ``part-*.parquet``, maybe ``_SUCCESS``), sorted; None when the folder holds anything else."""
    try:
        names = sorted(storage.list_dir(url, storage_options))
    except (OSError, ValueError):
        return None
    data = [u for u in names if not u.rstrip("/").rsplit("/", 1)[-1].startswith(("_", "."))]
    if data and all(u.lower().endswith(PARQUET_SUFFIXES) for u in data):
        return data
    return None


def _frame(url: str, fmt: str, storage_options: Mapping[str, Any] | None) -> Any:
    """A pandas DataFrame of one Parquet or JSON-lines file."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError(f"reading {mask(url)} ({fmt}) needs pandas: pip install 'shardfeed[convert]'") from exc
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {mask(url)} (Parquet) needs pyarrow: pip install pyarrow") from exc
        try:
            table = pq.read_table(io.BytesIO(storage.read_bytes(url, storage_options=storage_options)))
            df = table.to_pandas()
        except (OSError, ValueError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ValueError(f"{mask(url)}: not a readable Parquet file ({exc})") from None
        # lists, structs and maps as Python gives them: pandas would make a list of ints with
        # a null a float array ([nan, 3.0]) and a struct's ints floats where a row holds a null
        # (by name: a pandas index stored in the file is no column of the frame)
        for j, f in enumerate(table.schema):
            if pa.types.is_nested(f.type) and f.name in df.columns:
                df[f.name] = pd.Series(table.column(j).to_pylist(), index=df.index, dtype=object)
        return df
    text = storage.read_bytes(url, storage_options=storage_options).decode("utf-8-sig")
    try:
        return pd.read_json(io.StringIO(text), lines=True, dtype=False) if text.strip() else pd.DataFrame()
    except ValueError as exc:
        raise ValueError(f"{mask(url)}: not JSON lines ({exc})") from None


def read_table_part(file_url: str, schema: Schema | None, storage_options: Mapping[str, Any] | None,
                    origin: str, base: str | None, first: int = 1, fmt: str | None = None
                    ) -> tuple[list[Row], list[DiscardRecord], Schema]:
    """Rows of one file of a table (CSV, Parquet or JSON lines), numbered from ``first``
    and named ``origin`` (the table's name, for a part of a folder)."""
    fmt = fmt or table_format(file_url, storage_options)
    if fmt == "csv":
        rows, discards, used = read_csv(file_url, schema, storage_options)
    else:
        frame = _frame(file_url, fmt, storage_options)
        if len(frame) == 0 and len(frame.columns) == 0:  # an empty JSON-lines file: no rows, as an empty CSV
            logger.warning("%s: the file holds no rows", mask(file_url))
            return [], [], schema or automl_schema()
        rows, discards, used = read_dataframe(frame, schema, origin, base, where=mask(file_url))
    if first != 1 or (fmt == "csv" and origin != mask(file_url)):
        shift = first - 1
        for r in rows:
            r.number += shift
            r.origin = origin
        for d in discards:
            own = d.source.startswith(f"{mask(file_url) if fmt == 'csv' else origin}#")
            d.row += shift
            if own:
                d.source = f"{origin}#{d.row}"
    return rows, discards, used


def read_table_file(url: str, schema: Schema | None, storage_options: Mapping[str, Any] | None = None,
                    parts: list[str] | None = None, counts: list[int] | None = None
                    ) -> tuple[list[Row], list[DiscardRecord], Schema]:
    """Rows of a Parquet file (or the ``parts`` of a Parquet folder, numbered on across
    parts in name order) or a JSON-lines file, read with pyarrow / pandas; image paths
    relative to the file's folder. Other files are CSV (:func:`read_csv`). ``counts``, when
    given, receives the number of records each file held."""
    if not parts:
        fmt = table_format(url, storage_options)
        rows, discards, used = read_table_part(url, schema, storage_options, mask(url), _dirname(url), fmt=fmt)
        if counts is not None:
            counts.append(len(rows) + len(discards))
        return rows, discards, used
    base = url.rstrip("/")
    if parse_url(base).is_local:
        base = os.path.abspath(parse_url(base).path)
    rows, discards, used = [], [], schema
    for part in parts:
        r, d, used = read_table_part(part, schema, storage_options, mask(url), base, len(rows) + len(discards) + 1,
                                     fmt="parquet")
        rows.extend(r)
        discards.extend(d)
        if counts is not None:
            counts.append(len(r) + len(d))
    if used is None:
        used = default_schema([], mask(url))
    return rows, discards, used


def read_csv(url: str, schema: Schema | None, storage_options: Mapping[str, Any] | None = None,
             header: bool | None = None) -> tuple[list[Row], list[DiscardRecord], Schema]:
    """Rows of a CSV file on any storage (UTF-8, an optional BOM, RFC 4180 quoting).

    ``header=None`` detects one: a first row holding all the schema's column names (or
    equal to ``split,image_uri,label``) is a header; without a schema and without a header the
    AutoML layout ``split,image_uri,label`` is assumed (AutoML CSVs have no header).
    Relative image paths are taken relative to the CSV's directory.
    """
    data = storage.read_bytes(url, storage_options=storage_options)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{mask(url)}: not UTF-8 text (byte offset {exc.start}); save the CSV as UTF-8") from None
    del data
    origin = mask(url)
    # the lines as the rows are built, never all at once (a row's cells as str take more
    # memory than the row)
    lines = csv_lines(text, origin)
    head = next(lines, None)
    if head is None:
        logger.warning("%s: the CSV holds no rows", origin)
        return [], [], schema or automl_schema()
    header, columns = csv_layout([c.strip() for c in head], schema, origin, header)
    body = lines if header else itertools.chain([head], lines)
    if schema is None:
        schema = default_schema(columns, origin)
    absent = [c for c in schema.columns if c not in columns]
    if absent:
        raise ValueError(f"{origin}: schema names columns the CSV lacks: {', '.join(absent)} (header: {columns})")

    def records():
        for i, cells in enumerate(body, start=1):
            if len(cells) != len(columns):
                yield i, None, f"expected {len(columns)} cells, found {len(cells)}"
            else:
                yield i, dict(zip(columns, cells)), None

    rows, discards = rows_from_records(records(), schema, origin, _dirname(url))
    return rows, discards, schema


def folder_files(root: str, storage_options: Mapping[str, Any] | None = None, under: tuple[str, ...] = ()
                 ) -> list[tuple[tuple[str, ...], str]]:
    """``(path parts under root, URI)`` of every file in ``root`` (or in its subfolder
    ``under``) and below, sorted; hidden files and folders left out, folder links not followed."""
    root = root.rstrip("/")
    parsed = parse_url(root)
    rels: list[tuple[tuple[str, ...], str]] = []
    if parsed.is_local:
        base = parsed.path
        if not os.path.isdir(base):
            raise FileNotFoundError(f"{mask(root)}: no such folder")
        for dirpath, dirnames, filenames in os.walk(os.path.join(base, *under)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel = os.path.relpath(dirpath, base)  # once per folder, not per file (it costs tens of us)
            parts = () if rel == os.curdir else tuple(rel.split(os.sep))
            pre = os.path.join(dirpath, "")  # os.walk joined dirpath from base: pre + f == join(base, *parts, f)
            rels.extend(((*parts, f), pre + f) for f in filenames if not f.startswith("."))
    else:
        prefix = root + "/"
        for u in storage.glob(prefix + "".join(p + "/" for p in under) + "**", storage_options):
            if u.startswith(prefix):
                parts = tuple(u[len(prefix):].split("/"))
                if not any(p.startswith(".") for p in parts):
                    rels.append((parts, u))
    rels.sort()
    return rels


def folder_entries(root: str, storage_options: Mapping[str, Any] | None = None, under: tuple[str, ...] = ()
                   ) -> list[tuple[str, bool]]:
    """``(name, is a folder)`` of what is directly in ``root`` (or its subfolder ``under``),
    sorted, as :func:`folder_files` walks it: hidden names and links to folders left out."""
    root = root.rstrip("/")
    parsed = parse_url(root)
    found: list[tuple[str, bool]] = []
    if parsed.is_local:
        if not os.path.isdir(parsed.path):
            raise FileNotFoundError(f"{mask(root)}: no such folder")
        with os.scandir(os.path.join(parsed.path, *under)) as it:
            for e in it:
                is_dir = e.is_dir()
                if not e.name.startswith(".") and not (is_dir and e.is_symlink()):
                    found.append((e.name, is_dir))
    else:
        fs, path = storage.get_filesystem(parsed, storage_options)
        path = path.rstrip("/") + "".join("/" + p for p in under)
        for info in fs.ls(path, detail=True):
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith(".") and info["name"].rstrip("/") != path.rstrip("/"):
                found.append((name, info.get("type") == "directory"))
    return sorted(set(found))  # an object store may give a prefix twice (a folder and a listing of it)


def folder_part_files(root: str, parts: tuple[str, ...], is_dir: bool,
                      storage_options: Mapping[str, Any] | None = None) -> list[tuple[tuple[str, ...], str]]:
    """The files of one of :func:`folder_layout`'s parts, as :func:`folder_files` gives them:
    a folder's files, or the part itself when it is a file."""
    if is_dir:
        return folder_files(root, storage_options, parts)
    root = root.rstrip("/")
    parsed = parse_url(root)
    return [(parts, os.path.join(parsed.path, *parts) if parsed.is_local else root + "/" + "/".join(parts))]


def _has_file(root: str, under: tuple[str, ...], storage_options: Mapping[str, Any] | None) -> bool:
    """Whether :func:`folder_files` finds anything under ``root/under`` (stops at the first file)."""
    parsed = parse_url(root.rstrip("/"))
    if parsed.is_local:
        walk: Any = os.walk(os.path.join(parsed.path, *under))
    else:
        fs, path = storage.get_filesystem(parsed, storage_options)
        walk = fs.walk(path.rstrip("/") + "".join("/" + p for p in under))
    for _, dirnames, filenames in walk:
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(not f.startswith(".") for f in filenames):
            return True
    return False


def folder_layout(root: str, storage_options: Mapping[str, Any] | None = None
                  ) -> tuple[bool, list[tuple[tuple[str, ...], bool]]]:
    """What a cluster needs to list ``root`` in parallel, found by listing little more than its
    top level: whether it is in the ``split/label/file`` layout (as :func:`read_image_folder`
    decides: its non-empty top-level folders are all split names), and its parts in the order
    :func:`folder_files` gives their files: ``(path parts, is a folder)``, one per top-level
    entry, or per entry of a split folder in the split layout. Each folder's files are
    ``folder_files(root, under=parts)``."""
    tops = folder_entries(root, storage_options)
    dirs = [n for n, is_dir in tops if is_dir]
    others = [n for n in dirs if n.lower() not in SPLIT_NAMES]
    if any(_has_file(root, (n,), storage_options) for n in others):
        with_split = False  # a non-empty folder that is no split name: the label/file layout
    else:
        with_split = any(_has_file(root, (n,), storage_options) for n in dirs)
    parts: list[tuple[tuple[str, ...], bool]] = []
    for name, is_dir in tops:
        if with_split and is_dir and name.lower() in SPLIT_NAMES:
            parts.extend(((name, n), d) for n, d in folder_entries(root, storage_options, (name,)))
        else:
            parts.append(((name,), is_dir))
    return with_split, parts


def folder_item(number: int, parts: tuple[str, ...], uri: str, with_split: bool, origin: str) -> Row | DiscardRecord:
    """The row of a file at ``parts`` under an image folder, or its discard when it is not
    in the folder's layout, or when its path is not valid UTF-8 (a POSIX name Python holds
    with surrogate escapes: no record, manifest or report could hold it as text)."""
    if not uri.isascii():
        try:
            uri.encode()
        except UnicodeEncodeError as exc:
            shown = uri.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            at = len(uri[:exc.start].encode())
            return DiscardRecord(number, shown, f"path is not valid UTF-8 (at byte {at})")
    if len(parts) != (3 if with_split else 2):
        layout = "split/label/file" if with_split else "label/file"
        return DiscardRecord(number, uri, f"not in the {layout} layout")
    return Row(number, origin, uri, SPLIT_NAMES[parts[0].lower()] if with_split else None, parts[-2])


def read_image_folder(url: str, storage_options: Mapping[str, Any] | None = None
                      ) -> tuple[list[Row], list[DiscardRecord], Schema]:
    """Rows of a folder laid out ``split/label/file`` or ``label/file`` (sorted paths).

    Top-level folders named train/validation/test (any case) make the first layout;
    otherwise every top-level folder is a label and ``test_ratio`` decides the split.
    Hidden files and folders are left out.
    """
    root = url.rstrip("/")
    rels = folder_files(root, storage_options)
    tops = {p[0].lower() for p, _ in rels if len(p) > 1}
    with_split = bool(tops) and tops <= set(SPLIT_NAMES)
    origin = mask(root)
    rows: list[Row] = []
    discards: list[DiscardRecord] = []
    for number, (parts, uri) in enumerate(rels, start=1):
        item = folder_item(number, parts, uri, with_split, origin)
        (discards if isinstance(item, DiscardRecord) else rows).append(item)  # type: ignore[arg-type]
    return rows, discards, automl_schema()

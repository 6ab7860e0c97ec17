"""``read_csv``: typed rows of CSV files, with ``decode_csv``-style ``record_defaults``.

Each entry of ``record_defaults`` gives a column's type and its default for an empty
field: ``0`` (int64), ``0.0`` (float32), ``np.float64(0)``, ``""`` (str), ``b""`` (bytes).
An entry that is ``[]`` (TensorFlow's spelling: a required str column) or a type (``int``,
``float``, ``str``, ``bytes``, a numpy dtype) makes the column required: an empty field is
an error. ``[value]`` (the TensorFlow spelling) means ``value``. ``None`` is deprecated
here (a ``DeprecationWarning``; it still means a required str column): everywhere else
(``read_table``) ``None`` means "keep the source's type", so write ``str`` or ``[]``.
Fields may be quoted (``"a,b"``, ``""`` for a quote), and a quoted field may span lines.
Errors name the file, the line and the column.
"""

from __future__ import annotations

import csv as _csv
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import storage
from ..deprecation import renamed_argument, warn_deprecated
from ..errors import ShardfeedError
from ..formats.tfrecord import normalize_compression
from ..storage.cache import get_cache
from .sources import SourceDataset
from .text import LineReader, check_encoding

CSV_FIELD_LIMIT = 1 << 30
"""The longest CSV field read, in characters (1 Gi; Python's csv module stops at 128 Ki):
a field past it is an error naming the file and line."""


def allow_long_fields() -> None:
    """Raise the csv module's field limit (process-wide, only ever raised) to
    :data:`CSV_FIELD_LIMIT`."""
    if _csv.field_size_limit() < CSV_FIELD_LIMIT:
        _csv.field_size_limit(CSV_FIELD_LIMIT)


class CsvError(ShardfeedError, ValueError):
    """A CSV row does not fit ``record_defaults``. Attributes: ``url`` (masked), ``line``
    (1-based, where the row starts) and ``column`` (0-based, in the file; ``None`` for a
    row-level problem)."""

    def __init__(self, message: str, url: str, line: int, column: int | None = None) -> None:
        where = f"{url}, line {line}" + (f", column {column}" if column is not None else "")
        super().__init__(f"{where}: {message}")
        self.url = url
        self.line = line
        self.column = column

    def __reduce__(self):
        return (_rebuild, (str(self), self.url, self.line, self.column))


def _rebuild(text: str, url: str, line: int, column: int | None) -> CsvError:
    err = CsvError.__new__(CsvError)
    ValueError.__init__(err, text)
    err.url, err.line, err.column = url, line, column
    return err


def plain_number(text: str) -> bool:
    """Whether ``text`` is written as numbers are in CSV files (TensorFlow's parsers): ASCII,
    without the ``_`` digit separators Python's ``int``/``float`` also take (``1_000``, and
    other scripts' digits, ``١٢`` or full-width ``１２``, are not numbers there)."""
    return text.isascii() and "_" not in text


@dataclass(frozen=True)
class Column:
    dtype: np.dtype | type  # str or bytes for text columns
    default: Any  # None: required

    def convert(self, field: str) -> Any:
        if self.dtype is str:
            return field
        if self.dtype is bytes:
            return field.encode("utf-8")
        if not plain_number(field):
            raise ValueError(field)
        if self.dtype.kind in "iu":
            return self.dtype.type(int(field.strip()))
        if self.dtype.kind == "b":
            low = field.strip().lower()
            if low not in ("true", "false", "1", "0"):
                raise ValueError(field)
            return np.bool_(low in ("true", "1"))
        return self.dtype.type(float(field.strip()))


def _column(i: int, d: Any) -> Column:
    if isinstance(d, (list, tuple)):
        if len(d) > 1:
            raise ValueError(f"record_defaults[{i}] has {len(d)} values; give one default (or [] for required)")
        d = d[0] if d else None
    if d is None:
        return Column(str, None)
    if d in (str, bytes):
        return Column(d, None)
    if isinstance(d, type) or isinstance(d, np.dtype):
        try:
            dt = np.dtype(float if d is float else d)
        except TypeError:
            raise TypeError(f"record_defaults[{i}]: unsupported column type {d!r}") from None
        if d is float:
            dt = np.dtype(np.float32)
        return Column(dt, None)
    if isinstance(d, str):
        return Column(str, d)
    if isinstance(d, bytes):
        return Column(bytes, d)
    if isinstance(d, (bool, np.bool_)):
        return Column(np.dtype(bool), np.bool_(d))
    if isinstance(d, np.generic):
        return Column(d.dtype, d)
    if isinstance(d, int):
        return Column(np.dtype(np.int64), np.int64(d))
    if isinstance(d, float):
        return Column(np.dtype(np.float32), np.float32(d))
    raise TypeError(f"record_defaults[{i}] is {d!r}; use a value (0, 0.0, '', b''), a type, or [] for required")


def typed_row(fields: Sequence[str], columns: Sequence[Column], select_cols: Sequence[int] | None, na_value: str,
              url: str, line: int) -> tuple:
    """The fields of one row typed by ``columns`` (after picking ``select_cols``); raises
    :class:`CsvError` naming ``url``, ``line`` and the column."""
    if select_cols is None:
        if len(fields) != len(columns):
            raise CsvError(f"expected {len(columns)} fields (len(record_defaults)), found {len(fields)}", url, line)
        picked = fields
    else:
        if len(fields) <= select_cols[-1]:
            raise CsvError(f"row has {len(fields)} fields, select_cols needs column {select_cols[-1]}", url, line)
        picked = [fields[c] for c in select_cols]
    out = []
    for j, (col, field) in enumerate(zip(columns, picked)):
        file_col = select_cols[j] if select_cols is not None else j
        if field == na_value:
            if col.default is None:
                raise CsvError("required field is empty (its record_default is []/a type)", url, line, file_col)
            out.append(col.default)
            continue
        try:
            out.append(col.convert(field))
        except (ValueError, OverflowError):
            name = getattr(col.dtype, "name", getattr(col.dtype, "__name__", str(col.dtype)))
            raise CsvError(f"cannot parse {field!r} as {name}", url, line, file_col) from None
    return tuple(out)


def _check_select_cols(select_cols: Sequence[int] | None, ncols: int) -> list[int] | None:
    if select_cols is None:
        return None
    cols = list(select_cols)
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in cols):
        raise ValueError(f"select_cols must be column indices >= 0, got {select_cols!r}")
    if cols != sorted(set(cols)):
        raise ValueError(f"select_cols must be strictly increasing, got {select_cols!r}")
    if len(cols) != ncols:
        raise ValueError(f"select_cols has {len(cols)} columns but record_defaults has {ncols}")
    return cols


def _columns_of(record_defaults: Sequence[Any], caller: str) -> list[Column]:
    if isinstance(record_defaults, (str, bytes)) or not isinstance(record_defaults, Sequence) or not record_defaults:
        raise ValueError("record_defaults must be a non-empty list, one entry per column, e.g. [0, 0.0, '']")
    nones = [i for i, d in enumerate(record_defaults) if d is None]
    if nones:
        warn_deprecated(f"{caller}: record_defaults{nones} is None, which here has meant a required str column; "
                        "write str (or [], TensorFlow's spelling) instead: None is deprecated in read_csv/decode_csv "
                        "because in read_table it means 'keep the table's type'")
    return [_column(i, d) for i, d in enumerate(record_defaults)]


def decode_csv(records: Any, record_defaults: Sequence[Any], field_delim: str = ",", use_quote_delim: bool = True,
               na_value: str = "", select_cols: Sequence[int] | None = None) -> list[np.ndarray]:
    """``tf.io.decode_csv``: each record (one CSV line, ``str`` or ``bytes``) split on
    ``field_delim`` and typed by ``record_defaults`` (as in :func:`read_csv`); returns one
    numpy array per column, in the shape of ``records`` (object arrays for text columns).
    ``use_quote_delim=False`` treats ``"`` as an ordinary character. Raises
    :class:`CsvError` naming the record (``line`` is its 1-based position) and column."""
    if not isinstance(field_delim, str) or len(field_delim) != 1:
        raise ValueError(f"field_delim must be one character, got {field_delim!r}")
    columns = _columns_of(record_defaults, "decode_csv")
    allow_long_fields()
    cols = _check_select_cols(select_cols, len(columns))
    arr = np.asarray(records, dtype=object)
    flat = arr.reshape(-1)
    rows = []
    for i, rec in enumerate(flat.tolist()):
        if isinstance(rec, (bytes, bytearray)):
            try:
                rec = bytes(rec).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CsvError(f"not valid utf-8: {exc.reason}", "<records>", i + 1) from None
        elif not isinstance(rec, str):
            raise TypeError(f"record #{i} is {type(rec).__name__}; decode_csv takes str or bytes lines")
        try:
            fields = next(_csv.reader([rec], delimiter=field_delim, quotechar='"' if use_quote_delim else None,
                                      quoting=_csv.QUOTE_MINIMAL if use_quote_delim else _csv.QUOTE_NONE,
                                      strict=True), [])
        except _csv.Error as exc:
            raise CsvError(f"malformed CSV: {exc}", "<records>", i + 1) from None
        rows.append(typed_row(fields or [""], columns, cols, na_value, "<records>", i + 1))
    out = []
    for j, col in enumerate(columns):
        values = [r[j] for r in rows]
        if col.dtype in (str, bytes):
            a = np.empty(len(values), dtype=object)
            a[:] = values
        else:
            a = np.array(values, dtype=col.dtype)
        out.append(a.reshape(arr.shape))
    return out


class _CsvReader(LineReader):
    def __init__(self, ds: "CsvDataset", state: Mapping[str, Any] | None) -> None:
        super().__init__(ds.files, ds.compression, ds.storage_options, state, header=ds.header, cache=ds.cache)
        self.ds = ds

    def __next__(self) -> tuple:
        ds = self.ds
        raw = LineReader.__next__(self)
        start = self.line
        url = self.url
        text = self._decode(raw, url)
        while text.count(ds.quote) % 2 and ds.quote:  # a quoted field goes on to the next line
            fi, ending = self.fi, self.ending.decode("ascii")
            try:
                more = LineReader.__next__(self)
            except StopIteration:
                more = None
            if more is None or self.fi != fi:
                raise CsvError("quoted field is not closed before the end of the file", storage.mask(url), start)
            text += ending + self._decode(more, url)  # the field holds the line break as written
        try:
            fields = next(_csv.reader([text], delimiter=ds.field_delim, quotechar=ds.quote or None, strict=True))
        except _csv.Error as exc:
            raise CsvError(f"malformed CSV: {exc}", storage.mask(url), start) from None
        return typed_row(fields, ds.columns, ds.select_cols, ds.na_value, storage.mask(url), start)

    def stream_error(self, why: str) -> Exception:
        return CsvError(f"damaged compressed file at byte {self.offset:,} of its uncompressed text: {why}",
                        storage.mask(self.url), self.line + 1)

    def _decode(self, raw: bytes, url: str) -> str:
        try:
            return raw.decode(self.ds.encoding)
        except UnicodeDecodeError as exc:
            raise CsvError(f"not valid {self.ds.encoding}: {exc.reason}", storage.mask(url), self.line) from None


class CsvDataset(SourceDataset):
    """Typed rows of CSV files (see :func:`read_csv`)."""

    kind = "csv"

    def __init__(self, files: Any, record_defaults: Sequence[Any], field_delim: str = ",", header: bool = False,
                 select_cols: Sequence[int] | None = None, na_value: str = "", quote: str = '"',
                 compression: str | None = "auto", encoding: str = "utf-8",
                 storage_options: Mapping[str, Any] | None = None, cache_dir: str | None = None,
                 cache_limit: int | str | None = None) -> None:
        if not isinstance(field_delim, str) or len(field_delim) != 1:
            raise ValueError(f"field_delim must be one character, got {field_delim!r}")
        if quote and (not isinstance(quote, str) or len(quote) != 1):
            raise ValueError(f"quote must be one character or '' for none, got {quote!r}")
        self.columns = _columns_of(record_defaults, "read_csv")
        self.select_cols: list[int] | None = _check_select_cols(select_cols, len(self.columns))
        normalize_compression(compression)
        check_encoding(encoding)
        allow_long_fields()
        self.files = storage.expand(files, storage_options)
        self.field_delim = field_delim
        self.header = bool(header)
        self.na_value = na_value
        self.quote = quote
        self.compression = compression
        self.encoding = encoding
        self.storage_options = storage_options
        self.cache = get_cache(cache_dir, cache_limit)

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _CsvReader:
        return _CsvReader(self, state)

    def __repr__(self) -> str:
        return f"read_csv({len(self.files)} files, {len(self.columns)} columns)"


@renamed_argument("files", "source")
def read_csv(source: str | os.PathLike | Iterable[str | os.PathLike], record_defaults: Sequence[Any],
             field_delim: str = ",", header: bool = False, select_cols: Sequence[int] | None = None,
             na_value: str = "", quote: str = '"', compression: str | None = "auto", encoding: str = "utf-8",
             storage_options: Mapping[str, Any] | None = None, cache_dir: str | None = None,
             cache_limit: int | str | None = None) -> CsvDataset:
    """Rows of CSV files (``source``: a URL, a glob or a list) as tuples typed by
    ``record_defaults`` (see the module docs).

    ``select_cols``: increasing 0-based indices of the columns to keep (``record_defaults``
    then describes those). ``header=True`` skips each file's first line. A field equal to
    ``na_value`` (default: empty) takes the column's default. ``batch(n)`` turns rows into
    a tuple of numpy arrays. Raises :class:`CsvError` naming file, line and column for a
    row that does not fit; ``ValueError``/``TypeError`` for bad arguments. Remote files are
    fetched in parallel ranged GETs; ``cache_dir``/``cache_limit`` keep them on local disk
    as :func:`read_tfrecord` does.
    """
    return CsvDataset(source, record_defaults, field_delim, header, select_cols, na_value, quote, compression,
                      encoding, storage_options, cache_dir, cache_limit)

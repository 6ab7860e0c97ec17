"""``record_defaults``: the type of every column read, and the value that fills its NULLs.

A default is a value (``0`` int64, ``0.0`` float32, ``np.float64(0)`` float64, ``""`` str,
``b""`` bytes, ``False`` bool; TF's one-element list ``[0.0]`` too), a type (``int``,
``float``, ``str``, ``bytes``, ``bool``, a numpy dtype or its name: the column gets that
type and a NULL is an error), or ``None`` / ``[]`` (no default: the column keeps its table
type; NULL is an error). ``None`` has this one meaning; ``read_csv``/``decode_csv``, whose
text has no type to keep, deprecate it in favour of ``str`` or ``[]``. Values are
converted with Arrow's safe casts: a value that does not convert
(``"abc"`` as int, ``1.5`` as int) is a :class:`TableTypeError` naming column and row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ShardfeedError

_NO_DEFAULT = object()


class TableTypeError(ShardfeedError, ValueError):
    """A value of a table column cannot be read as the requested type, or is NULL without
    a default. ``url`` (masked), ``column`` and ``row`` (0-based, in the table) say where."""

    def __init__(self, message: str, url: str, column: str, row: int) -> None:
        super().__init__(f"{url}: column {column!r}, row {row}: {message}")
        self.url, self.column, self.row = url, column, row

    def __reduce__(self):
        return (_rebuild, (str(self), self.url, self.column, self.row))


def _rebuild(msg: str, url: str, column: str, row: int) -> TableTypeError:
    e = TableTypeError.__new__(TableTypeError)
    Exception.__init__(e, msg)
    e.url, e.column, e.row = url, column, row
    return e


_NAMES = {
    "int": pa.int64(), "int64": pa.int64(), "long": pa.int64(), "bigint": pa.int64(), "int32": pa.int32(),
    "float": pa.float32(), "float32": pa.float32(), "float64": pa.float64(), "double": pa.float64(),
    "bool": pa.bool_(), "boolean": pa.bool_(), "str": pa.string(), "string": pa.string(),
    "bytes": pa.binary(), "binary": pa.binary(),
}


@dataclass(frozen=True)
class ColumnType:
    """What one output column becomes: ``arrow`` type (``None``: keep) and ``default``."""

    arrow: pa.DataType | None
    default: Any = _NO_DEFAULT

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT


def _type_of(spec: Any) -> pa.DataType | None:
    if spec is int:
        return pa.int64()
    if spec is float:
        return pa.float32()
    if spec is str:
        return pa.string()
    if spec is bytes:
        return pa.binary()
    if spec is bool:
        return pa.bool_()
    if isinstance(spec, str):
        return _NAMES.get(spec.lower())
    if isinstance(spec, pa.DataType):
        return spec
    try:
        dt = np.dtype(spec)
    except TypeError:
        return None
    if dt.kind == "U":
        return pa.string()
    if dt.kind == "S":
        return pa.binary()
    try:
        return pa.from_numpy_dtype(dt)
    except (pa.ArrowNotImplementedError, TypeError):
        return None


def column_type(spec: Any, position: int) -> ColumnType:
    """Interpret one element of ``record_defaults``."""
    if isinstance(spec, (list, tuple)):
        if len(spec) > 1:
            raise ValueError(f"record_defaults[{position}] is a list of {len(spec)} values; give one value, "
                             "a one-element list ([0.0]), [] (no default) or a type")
        spec = spec[0] if spec else None  # [] is TensorFlow's "no default": as None
    if spec is None:
        return ColumnType(None)
    if isinstance(spec, type) or isinstance(spec, (np.dtype, pa.DataType)) or (
            isinstance(spec, str) and spec.lower() in _NAMES):
        # A string that names a type ("int64", "string") is that type; any other is a str default.
        t = _type_of(spec)
        if t is None:
            raise TypeError(f"record_defaults[{position}]: unsupported type {spec!r}; use int, float, str, "
                            "bytes, bool or a numpy dtype")
        return ColumnType(t)
    if isinstance(spec, np.generic):  # before float: np.float64 is a float subclass
        return ColumnType(_type_of(spec.dtype), spec.item())
    if isinstance(spec, (bool, np.bool_)):
        return ColumnType(pa.bool_(), bool(spec))
    if isinstance(spec, int):
        return ColumnType(pa.int64(), spec)
    if isinstance(spec, float):
        return ColumnType(pa.float32(), spec)
    if isinstance(spec, str):
        return ColumnType(pa.string(), spec)
    if isinstance(spec, bytes):
        return ColumnType(pa.binary(), spec)
    raise TypeError(f"record_defaults[{position}] = {spec!r}: give a value (0, 0.0, '', False), a type "
                    "(int, float, str, bool, np.float64) or None")


def column_types(record_defaults: Sequence[Any] | None, columns: Sequence[str]) -> list[ColumnType]:
    """One :class:`ColumnType` per output column; raises ``ValueError`` on a count mismatch."""
    if record_defaults is None:
        return [ColumnType(None) for _ in columns]
    if isinstance(record_defaults, (str, bytes)) or not hasattr(record_defaults, "__len__"):
        raise TypeError("record_defaults must be a list or tuple with one entry per column read")
    if len(record_defaults) != len(columns):
        raise ValueError(f"record_defaults has {len(record_defaults)} entries but {len(columns)} columns are "
                         f"read ({', '.join(columns)}); give one per column (or select fewer columns)")
    return [column_type(d, i) for i, d in enumerate(record_defaults)]


def _first_failure(arr: pa.Array, target: pa.DataType) -> tuple[int, Any]:
    step = 1024
    for lo in range(0, len(arr), step):
        part = arr.slice(lo, step)
        try:
            pc.cast(part, target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            for i in range(len(part)):
                try:
                    pc.cast(part.slice(i, 1), target, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    return lo + i, part[i].as_py()
    return 0, None


def to_numpy(arr: pa.Array | pa.ChunkedArray, ct: ColumnType, url: str, column: str, first_row: int) -> np.ndarray:
    """Convert one column chunk (whose first row is table row ``first_row``) to numpy."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    target = ct.arrow
    if target is not None and arr.type != target:
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        try:
            arr = pc.cast(arr, target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            i, value = _first_failure(arr, target)
            raise TypeError_(f"value {value!r} ({arr.type}) cannot be read as {target}", url, column,
                             first_row + i) from None
    if arr.null_count:
        if not ct.has_default:
            i = int(pc.index(arr.is_null(), True).as_py())
            raise TypeError_("NULL value, and no default for this column; give one in record_defaults "
                             "(e.g. 0, 0.0 or '')", url, column, first_row + i)
        try:
            arr = pc.fill_null(arr, pa.scalar(ct.default, arr.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise TableTypeError(f"default {ct.default!r} does not fit type {arr.type} ({exc})", url, column,
                                 first_row) from None
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr.to_numpy(zero_copy_only=False)


TypeError_ = TableTypeError

__all__ = ["ColumnType", "TableTypeError", "column_type", "column_types", "to_numpy"]

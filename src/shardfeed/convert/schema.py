"""Table schemas: which column is the split, the image, the label, and how each other
column becomes a feature; parsing of cells with declared defaults.

A schema maps a column name to a type: ``split``, ``image_uri``, ``int``, ``float``,
``string``, ``int list``, ``float list``, ``string list``, ``integer label``,
``string label``. Without one, a table in the AutoML layout ``split,image_uri,label`` is
expected (label text or integer).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..formats.spec import FixedLen, VarLen
from ..pipeline.csv import plain_number
from .options import Discard

FLOAT32_MAX = 3.4028234663852886e38  # a finite float beyond it would be written as inf
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

COLUMN_TYPES = (
    "split", "image_uri", "int", "float", "string", "int list", "float list", "string list",
    "integer label", "string label",
)
"""The column types a conversion ``schema={column: type}`` accepts."""
_ALIASES = {t.replace(" ", "_"): t for t in COLUMN_TYPES} | {"str": "string", "label": "string label",
                                                           "int label": "integer label", "image": "image_uri"}
AUTOML_COLUMNS = ("split", "image_uri", "label")
SPLIT_NAMES = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
               "val": "validation", "test": "test", "testing": "test"}
"""A split cell's value (lowercased) -> the split it names."""
_UNASSIGNED = ("", "unassigned")


def normalize_split(value: Any) -> str | None:
    """``TRAIN``/``VALIDATION``/``TEST`` in any case -> ``train``/``validation``/``test``;
    empty or ``UNASSIGNED`` -> ``None`` (``test_ratio`` decides); anything else raises
    :class:`Discard`."""
    if value is None or is_missing(value):
        return None
    s = str(value).strip().lower()
    if s in _UNASSIGNED:
        return None
    if s not in SPLIT_NAMES:
        raise Discard(f"unknown split {str(value)[:40]!r} (expected TRAIN, VALIDATION, TEST or UNASSIGNED)")
    return SPLIT_NAMES[s]


def _normalize_type(column: str, t: Any) -> str:
    key = str(t).strip().lower()
    key = _ALIASES.get(key.replace(" ", "_"), key)
    if key not in COLUMN_TYPES:
        raise ValueError(f"schema column {column!r}: unknown type {t!r}; use one of {', '.join(COLUMN_TYPES)}")
    return key


@dataclass
class Schema:
    """Column types in input order, defaults for missing cells, and the list separator."""

    columns: dict[str, str]
    defaults: dict[str, Any] = field(default_factory=dict)
    separator: str = ";"

    def __post_init__(self) -> None:
        self.columns = {str(c): _normalize_type(str(c), t) for c, t in self.columns.items()}
        for role in ("split", "image_uri"):
            found = [c for c, t in self.columns.items() if t == role]
            if len(found) > 1:
                raise ValueError(f"schema names {len(found)} {role} columns ({', '.join(found)}); give at most one")
        labels = [c for c, t in self.columns.items() if t.endswith(" label")]
        if len(labels) > 1:
            raise ValueError(f"schema names {len(labels)} label columns ({', '.join(labels)}); give at most one")
        unknown = sorted(set(self.defaults) - set(self.columns))
        if unknown:
            raise ValueError(f"defaults name columns that are not in the schema: {', '.join(unknown)}")

    def column_of(self, role: str) -> str | None:
        for c, t in self.columns.items():
            if t == role or (role == "label" and t.endswith(" label")):
                return c
        return None

    @property
    def label_type(self) -> str | None:
        c = self.column_of("label")
        return self.columns[c] if c else None

    def feature_columns(self) -> dict[str, str]:
        """Columns stored as features under their own name (not split, image or label)."""
        return {c: t for c, t in self.columns.items()
                if t not in ("split", "image_uri", "integer label", "string label")}

    def feature_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        for c, t in self.feature_columns().items():
            dtype = {"int": "int64", "float": "float32", "string": "bytes"}[t.split()[0]]
            spec[c] = VarLen(dtype) if t.endswith(" list") else FixedLen(dtype)
        return spec

    def to_dict(self) -> dict[str, Any]:
        return {"columns": dict(self.columns), "defaults": dict(self.defaults), "separator": self.separator}


def automl_schema(label_type: str = "string label") -> Schema:
    return Schema({"split": "split", "image_uri": "image_uri", "label": label_type})


def as_schema(schema: Schema | Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None,
              separator: str = ";") -> Schema | None:
    if schema is None or isinstance(schema, Schema):
        if defaults and isinstance(schema, Schema):
            return Schema(schema.columns, {**schema.defaults, **defaults}, schema.separator)
        return schema
    if not isinstance(schema, Mapping):
        raise TypeError(f"schema must be a mapping of column -> type, got {type(schema).__name__}")
    return Schema(dict(schema), dict(defaults or {}), separator)


def is_missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    if isinstance(v, str) and v.strip() == "":
        return True
    try:  # pandas NA / NaT without importing pandas
        return type(v).__name__ in ("NAType", "NaTType")
    except Exception:  # noqa: BLE001
        return False


def _split_list(v: Any, sep: str) -> list:
    if isinstance(v, (list, tuple)):
        return list(v)
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        out = v.tolist()
        return out if isinstance(out, list) else [out]
    s = str(v).strip()
    if s.startswith("[") and s.endswith("]"):
        try:
            parsed = json.loads(s)
            if isinstance(parsed, list):
                return parsed
        except ValueError:
            pass
    return [p.strip() for p in s.split(sep)] if s else []


def _is_null(v: Any) -> bool:
    """A null value (None, NaN, pandas NA/NaT), unlike :func:`is_missing` not a blank str."""
    return not isinstance(v, str) and is_missing(v)


def _nested(column: str, v: Any, what: str) -> Discard:
    kind = "struct" if isinstance(v, Mapping) else "list"
    return Discard(f"column {column!r}: a {kind} is not {what}")


def _json_value(column: str, v: Any) -> Any:
    if hasattr(v, "tolist"):  # a numpy array or scalar in a DataFrame's cell
        return v.tolist()
    if hasattr(v, "isoformat"):  # a date or timestamp field: ISO 8601, as JSON has no such type
        return v.isoformat()
    raise Discard(f"column {column!r}: a struct or list holding {type(v).__name__} cannot be written as JSON")


def integer_text(v: Any) -> bool:
    """Whether ``v`` is a str that writes an integer as a CSV does (ASCII digits, a leading
    ``-``): an AutoML table whose labels all are keeps them as label ids. ``"--5"``, ``"²"``
    and other scripts' digits are not (``str.isdigit`` takes them; ``int`` then fails, or
    reads ``"٣"`` as 3)."""
    if not isinstance(v, str):
        return False
    t = v.strip()
    return t.isascii() and t.lstrip("-").isdigit() and t.count("-") <= 1 and not t.startswith("-", 1)


def _unicode(column: str, s: str) -> str:
    """``s``, unless it holds a lone surrogate (a Python str made from bytes with
    ``surrogateescape``, or built by hand), which UTF-8 cannot hold: that discards the row
    naming the column, instead of failing the whole conversion where the text is encoded."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Discard(f"column {column!r}: text that is not valid Unicode (a lone surrogate "
                          f"{s[exc.start]!r} at character {exc.start})") from None
    return s


def _to_text(column: str, v: Any) -> str:
    """A text cell: a str as it is, bytes decoded, a struct (dict) or list as JSON of the
    values' own types (a Parquet struct's ints stay ints), anything else ``str``; text that
    UTF-8 cannot hold (a lone surrogate) or bytes that are not UTF-8 discard the row."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Discard(f"column {column!r}: bytes that are not UTF-8 text (at byte {exc.start})") from None
    if isinstance(v, (Mapping, list, tuple)):
        try:
            return _unicode(column, json.dumps(v, ensure_ascii=False, default=lambda o: _json_value(column, o)))
        except (TypeError, ValueError) as exc:  # keys JSON cannot hold, a cycle
            raise Discard(f"column {column!r}: cannot be written as JSON ({exc})") from None
    return _unicode(column, str(v))


def _item(item: int | None) -> str:
    return "" if item is None else f" (item {item})"


def _to_int(column: str, v: Any, item: int | None = None) -> int:
    """An int64 value; beyond int64's range discards the row (an Example holds int64)."""
    i = _to_any_int(column, v)
    if not INT64_MIN <= i <= INT64_MAX:
        raise Discard(f"column {column!r}: {i} is out of int64 range{_item(item)}")
    return i


def _in_float32(column: str, f: float, item: int | None = None) -> float:
    """``f`` unless it is finite and beyond float32's range, which discards the row rather
    than being written as inf; NaN and inf are values."""
    if not math.isinf(f) and abs(f) > FLOAT32_MAX:
        try:
            struct.pack("<f", f)  # rounds to float32's largest value, or overflows to inf
        except OverflowError:
            raise Discard(f"column {column!r}: {f!r} is out of float32 range{_item(item)}") from None
    return f


def _to_any_int(column: str, v: Any) -> int:
    if isinstance(v, (Mapping, list, tuple)):
        raise _nested(column, v, "an integer")
    if isinstance(v, (bool, np.bool_)):  # numpy's too: a nullable boolean column iterates as np.bool_
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not v.is_integer():
            raise Discard(f"column {column!r}: {v!r} is not an integer")
        return int(v)
    text = str(v).strip()
    if not plain_number(text):  # 1_000, Arabic-Indic or full-width digits: not numbers in a CSV (TensorFlow's reading)
        raise Discard(f"column {column!r}: {text[:60]!r} is not an integer")
    try:
        return int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise Discard(f"column {column!r}: {str(v)[:60]!r} is not an integer") from None
        if not f.is_integer():
            raise Discard(f"column {column!r}: {str(v)[:60]!r} is not an integer") from None
        return int(f)


def _to_float(column: str, v: Any, item: int | None = None) -> float:
    if isinstance(v, (Mapping, list, tuple)):
        raise _nested(column, v, "a number")
    if isinstance(v, str) and not plain_number(v):
        raise Discard(f"column {column!r}: {v.strip()[:60]!r} is not a number")
    try:
        f = float(v)
    except OverflowError:  # an int beyond even float64's range (10**400)
        raise Discard(f"column {column!r}: {str(v)[:60]!r} is out of float32 range{_item(item)}") from None
    except (TypeError, ValueError):
        raise Discard(f"column {column!r}: {str(v)[:60]!r} is not a number") from None
    if math.isinf(f) and not _infinite(v):
        # a finite number written beyond even float64's range ("1e400", Decimal("1e400")): out
        # of range, as "1e40" is, not the inf that float() makes of it
        raise Discard(f"column {column!r}: {str(v).strip()[:60]!r} is out of float32 range{_item(item)}")
    return f


def _infinite(v: Any) -> bool:
    """Whether ``v`` is itself infinite (a float inf, the text ``inf``/``Infinity``, a
    Decimal or other number type's infinity), not a finite number that ``float()`` overflowed."""
    if isinstance(v, (float, np.floating)):
        return True
    if isinstance(v, str):
        return v.strip().lstrip("+-").lower() in ("inf", "infinity")
    is_infinite = getattr(v, "is_infinite", None)  # decimal.Decimal
    if callable(is_infinite):
        return bool(is_infinite())
    return False


def parse_cell(schema: Schema, column: str, raw: Any) -> Any:
    """The typed value of one cell; a missing cell takes the declared default or raises
    :class:`Discard` naming the column.

    Missing: empty, blank, None, NaN, pandas NA; for a list column only a null (a blank text
    cell is the empty list, as ``"a;b"`` is two items). A null item in a list discards the
    row (a float list's NaN is a float, not a null). A struct or list in a text column is
    written as JSON. In a ``float`` cell the text ``nan`` is missing too, ``inf``/``-inf`` is a
    value, and a finite number beyond float32's range discards the row."""
    t = schema.columns[column]
    if t == "float" and not is_missing(raw):
        raw = _in_float32(column, _to_float(column, raw))  # a text 'nan' is missing, as a Parquet NaN is
    if not isinstance(raw, (list, tuple)) and is_missing(raw):
        if column in schema.defaults:
            return schema.defaults[column]
        if t.endswith(" list") and isinstance(raw, str):
            return []
        raise Discard(f"column {column!r} is missing and has no default")
    if t in ("int", "integer label"):
        return _to_int(column, raw)
    if t == "float":
        return _to_float(column, raw)
    if t in ("string", "string label", "split", "image_uri"):
        return _to_text(column, raw)
    items = _split_list(raw, schema.separator)
    for k, x in enumerate(items):
        if _is_null(x) and not (t == "float list" and isinstance(x, float)):
            raise Discard(f"column {column!r}: null element in list (item {k})")
    if t == "int list":
        return [_to_int(column, x, k) for k, x in enumerate(items)]
    if t == "float list":
        return [_in_float32(column, _to_float(column, x, k), k) for k, x in enumerate(items)]
    return [_to_text(column, x) for x in items]


def cell_parser(schema: Schema, column: str) -> Callable[[Any], Any]:
    """``parse_cell(schema, column, raw)`` as a function of ``raw``, with the common cell
    of a text table (a str that parses) read without the general path's checks: the same
    value for every input, because every cell the shortcut does not take (a blank, a value
    that does not parse, a non-str) goes through :func:`parse_cell`."""
    t = schema.columns[column]

    def slow(raw: Any) -> Any:
        return parse_cell(schema, column, raw)

    if t in ("int", "integer label"):
        def parse_int(raw: Any) -> Any:
            if type(raw) is str and raw.isascii() and "_" not in raw:  # plain_number; int() strips as _to_int does
                try:
                    i = int(raw)
                except ValueError:
                    return slow(raw)
                if INT64_MIN <= i <= INT64_MAX:  # beyond: the general path discards the row
                    return i
            return slow(raw)
        return parse_int
    if t == "float":
        def parse_float(raw: Any) -> Any:
            if type(raw) is str and raw.isascii() and "_" not in raw:  # a blank str raises here: missing there
                try:
                    f = float(raw)
                except ValueError:
                    f = math.nan
                if -FLOAT32_MAX <= f <= FLOAT32_MAX:  # NaN, inf and out of range: the general path
                    return f
            return slow(raw)
        return parse_float
    if t in ("string", "string label"):
        def parse_str(raw: Any) -> Any:
            if type(raw) is str and raw and not raw.isspace():  # not blank: parse_cell gives it as it is
                if raw.isascii():
                    return raw
                try:
                    raw.encode("utf-8")  # a lone surrogate: parse_cell discards the row
                    return raw
                except UnicodeEncodeError:
                    pass
            return slow(raw)
        return parse_str
    return slow


def header_matches_automl(header: Sequence[str]) -> bool:
    return [h.strip().lower() for h in header] == list(AUTOML_COLUMNS)

"""Feature specs and the column types a batch parse returns.

The spec kinds mirror ``tf.io.FixedLenFeature``, ``tf.io.VarLenFeature``,
``tf.io.SparseFeature`` and ``tf.io.FixedLenSequenceFeature``; dtypes are ``"int64"``,
``"float32"`` and ``"bytes"`` (numpy
dtypes and the strings ``"string"``/``"float"``/``"int"`` are accepted as aliases). A spec
asking for another width (``int32``, ``float64``) is a ``TypeError``, as in TensorFlow:
the record holds int64 or float32 values, and a column of another dtype than asked would
be a quiet surprise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

INT64 = "int64"
"""The dtype of an ``Int64List`` feature (``tf.int64``)."""
FLOAT32 = "float32"
"""The dtype of a ``FloatList`` feature (``tf.float32``)."""
BYTES = "bytes"
"""The dtype of a ``BytesList`` feature (``tf.string``)."""
DTYPES = (INT64, FLOAT32, BYTES)
"""The three dtypes a ``tf.train.Example`` feature holds."""

_ALIASES = {
    "int64": INT64, "int": INT64, "long": INT64,
    "float32": FLOAT32, "float": FLOAT32,
    "bytes": BYTES, "string": BYTES, "str": BYTES, "object": BYTES,
}


_OTHER_WIDTHS = {
    **{k: INT64 for k in ("int8", "int16", "int32", "uint8", "uint16", "uint32", "uint64", "bool")},
    **{k: FLOAT32 for k in ("float16", "bfloat16", "half", "float64", "double")},
}


def normalize_dtype(dtype: Any) -> str:
    """Map a dtype-like value to ``"int64"``, ``"float32"`` or ``"bytes"``.

    Raises ``TypeError`` for anything else (the Example format stores only these three),
    saying which to ask for when ``dtype`` is another width of int or float.
    """
    if isinstance(dtype, str):
        key = dtype.lower()
    elif dtype is bytes or dtype is str:
        key = "bytes"
    elif dtype is int:
        key = "int64"
    elif dtype is float:
        key = "float32"
    else:
        name = getattr(dtype, "name", None)  # tf.DType and np.dtype both have .name
        if name is None:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = repr(dtype)
        key = str(name).lower()
    if key in _OTHER_WIDTHS:
        stored = _OTHER_WIDTHS[key]
        raise TypeError(
            f"unsupported feature dtype {dtype!r}: tf.train.Example stores {stored} values, and parsing gives "
            f"them as {stored} (tf.io.parse_example refuses {key} too); ask for {stored!r} and cast the column "
            f"after parsing, e.g. .map(lambda b: {{**b, 'x': b['x'].astype('{key}')}})"
        )
    if key not in _ALIASES:
        raise TypeError(
            f"unsupported feature dtype {dtype!r}: tf.train.Example stores only int64, "
            "float32 and bytes (use 'int64', 'float32' or 'bytes')"
        )
    return _ALIASES[key]


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a column of ``dtype`` has (bytes columns are ``object``)."""
    return np.dtype({INT64: np.int64, FLOAT32: np.float32, BYTES: object}[dtype])


@dataclass(frozen=True)
class FixedLen:
    """A feature with a fixed number of values per record, reshaped to ``shape``.

    ``default`` is used when a record lacks the feature; without one a missing feature is
    an error. A scalar default is broadcast to ``shape``.
    """

    dtype: str
    shape: tuple[int, ...] = ()
    default: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        shape = tuple(int(d) for d in (self.shape if self.shape is not None else ()))
        if any(d < 0 for d in shape):
            raise ValueError(f"FixedLen shape must have non-negative sizes, got {shape}")
        object.__setattr__(self, "shape", shape)

    @property
    def size(self) -> int:
        """Values per record."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclass(frozen=True)
class VarLen:
    """A feature with any number of values per record (values plus row splits)."""

    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))


@dataclass(frozen=True)
class FixedLenSequence:
    """A dense feature whose first dimension varies, as ``tf.io.FixedLenSequenceFeature``:
    each record holds any number of items of ``shape`` (its value count a multiple of
    ``prod(shape)``); a batch pads every record to the longest with ``default`` (a scalar;
    ``None``: 0, or ``b""`` for bytes). In an Example (``parse_example``) it needs
    ``allow_missing=True``, as in TensorFlow, and a missing feature has length 0. In a
    SequenceExample's feature lists (``parse_sequence_example``) each step is one item;
    without ``allow_missing`` a missing feature list is an error, and ``default`` must be
    ``None`` there (TensorFlow's rule)."""

    dtype: str
    shape: tuple[int, ...] = ()
    allow_missing: bool = False
    default: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        shape = tuple(int(d) for d in (self.shape if self.shape is not None else ()))
        if any(d < 0 for d in shape):
            raise ValueError(f"FixedLenSequence shape must have non-negative sizes, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "allow_missing", bool(self.allow_missing))
        if self.default is not None and np.ndim(self.default) != 0:
            raise ValueError(f"FixedLenSequence default is the padding value, a scalar; got {self.default!r} "
                             "(tf.io.FixedLenSequenceFeature refuses another shape too)")

    @property
    def size(self) -> int:
        """Values per item."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def pad_value(self) -> Any:
        """The padding value, of the column's type."""
        d = self.default
        if self.dtype == BYTES:
            if d is None:
                return b""
            if isinstance(d, str):
                return d.encode("utf-8")
            if isinstance(d, (bytes, np.bytes_)):
                return bytes(d)
            raise TypeError(f"FixedLenSequence bytes default must be bytes or str, got {d!r}")
        if d is None:
            return numpy_dtype(self.dtype).type(0)
        if isinstance(d, (bytes, str)) or np.asarray(d).dtype.kind not in "biuf":
            raise TypeError(f"FixedLenSequence default must be numeric for dtype {self.dtype}, got {d!r}")
        if self.dtype == INT64 and float(d) != int(d):
            raise ValueError(f"FixedLenSequence default {d!r} is not an integer (dtype int64)")
        return numpy_dtype(self.dtype).type(int(d) if self.dtype == INT64 else d)


@dataclass(frozen=True)
class Sparse:
    """A sparse feature built from an index feature and a value feature, as
    ``tf.io.SparseFeature``: ``index_key`` names int64 features (one, or a list for
    several dimensions), ``value_key`` the values, ``size`` the dense shape per record."""

    index_key: str | tuple[str, ...]
    value_key: str
    dtype: str
    size: int | tuple[int, ...]
    already_sorted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        keys = (self.index_key,) if isinstance(self.index_key, str) else tuple(self.index_key)
        sizes = (self.size,) if isinstance(self.size, int) else tuple(int(s) for s in self.size)
        if len(keys) != len(sizes):
            raise ValueError(
                f"Sparse: {len(keys)} index keys but {len(sizes)} sizes; give one size per index key"
            )
        object.__setattr__(self, "index_key", keys)
        object.__setattr__(self, "size", sizes)


FeatureSpec = FixedLen | VarLen | Sparse | FixedLenSequence
"""One feature's spec, a value of the ``spec`` mapping: :class:`FixedLen`, :class:`VarLen`,
:class:`Sparse` or :class:`FixedLenSequence`."""


@dataclass
class RaggedColumn:
    """Variable-length values of a batch: record ``i`` owns
    ``values[row_splits[i]:row_splits[i + 1]]``. Bytes values are a numpy object array."""

    values: np.ndarray
    row_splits: np.ndarray

    @property
    def row_lengths(self) -> np.ndarray:
        return np.diff(self.row_splits)

    def __len__(self) -> int:
        return len(self.row_splits) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.row_splits[i] : self.row_splits[i + 1]]

    def to_list(self) -> list:
        return [self[i] for i in range(len(self))]

    def to_sparse(self) -> "SparseColumn":
        """The ``tf.io.VarLenFeature`` view: indices ``[row, position]``."""
        lengths = self.row_lengths
        rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        cols = np.arange(len(self.values), dtype=np.int64) - np.repeat(self.row_splits[:-1], lengths)
        width = int(lengths.max()) if len(lengths) else 0
        return SparseColumn(np.stack([rows, cols], axis=1), self.values, np.array([len(lengths), width], np.int64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaggedColumn):
            return NotImplemented
        return np.array_equal(self.row_splits, other.row_splits) and _values_equal(self.values, other.values)


@dataclass
class SparseColumn:
    """A sparse tensor as numpy arrays (``indices`` is ``[nnz, rank]``)."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseColumn):
            return NotImplemented
        return (
            np.array_equal(self.indices, other.indices)
            and np.array_equal(self.dense_shape, other.dense_shape)
            and _values_equal(self.values, other.values)
        )


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):  # BytesBuffer values (bytes_as="buffer")
        return (type(a) is type(b) and len(a) == len(b)
                and all(np.array_equal(x, y) for x, y in zip(a, b)))
    if a.dtype == object or b.dtype == object:
        return len(a) == len(b) and all(x == y for x, y in zip(a, b))
    return np.array_equal(a, b)


def normalize_spec(spec: Mapping[str, FeatureSpec]) -> dict[str, FeatureSpec]:
    """Check a ``{name: FixedLen|VarLen|Sparse|FixedLenSequence}`` mapping; raise
    ``TypeError`` naming the offending key for anything else."""
    if not isinstance(spec, Mapping):
        raise TypeError("spec must be a mapping of feature name to FixedLen/VarLen/Sparse/FixedLenSequence, got "
                        f"{type(spec).__name__}")
    out: dict[str, FeatureSpec] = {}
    for name, s in spec.items():
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {name!r}")
        if not isinstance(s, (FixedLen, VarLen, Sparse, FixedLenSequence)):
            raise TypeError(
                f"spec[{name!r}] is {type(s).__name__}; use shardfeed.FixedLen, VarLen, Sparse or FixedLenSequence"
            )
        out[name] = s
    return out


__all__ = [
    "FixedLen", "VarLen", "Sparse", "FixedLenSequence", "FeatureSpec", "RaggedColumn", "SparseColumn",
    "normalize_dtype", "numpy_dtype", "normalize_spec", "INT64", "FLOAT32", "BYTES", "DTYPES",
]

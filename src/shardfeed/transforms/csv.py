"""The five CSV feature transforms of PAI-TF (``trans_csv_*``), vectorized with numpy.

Each takes a batch of strings (one record per row) and returns a dense ``numpy`` matrix
or a :class:`~shardfeed.SparseColumn` (``indices [nnz, 2]``, ``values``,
``dense_shape [batch, max_id]``), with the source document's defaults and errors:

=====================  ==========================  =================  ==================
function               record                      output             default values
=====================  ==========================  =================  ==================
``csv_id2sparse``      ``"2,10"`` (ids)            sparse, int64      the ids
``csv_id2dense``       ``"2,10"`` (ids)            dense int64        1, 0 elsewhere
``csv_kv2sparse``      ``"1:0.1,4:0.4"``           sparse, float32    the values
``csv_kv2dense``       ``"1:0.1,4:0.4"``           dense float32      0.0 elsewhere
``csv_to_dense``       ``"0.1,0.2,0.4"``           dense float32      0.0 padding
=====================  ==========================  =================  ==================

An id ``< 0`` or ``>= max_id`` is a ``ValueError`` naming the row. ``field_delim`` is one
single-byte character that is not a digit, a sign, ``e``/``E`` or ``.``; with ``" "`` a
run of spaces counts as one delimiter (and leading/trailing spaces are ignored).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain
from typing import Any

import numpy as np

from ..formats.spec import SparseColumn
from ..pipeline.csv import plain_number

_FORBIDDEN = set("0123456789+-eE.")
_SPACES = re.compile(" +")


def _check_delim(field_delim: Any, kv: bool = False) -> str:
    if isinstance(field_delim, bytes):
        try:
            field_delim = field_delim.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"field_delim {field_delim!r} is not a single-byte character") from None
    if not isinstance(field_delim, str):
        raise TypeError(f"field_delim must be a one-character string, got {type(field_delim).__name__}")
    if len(field_delim.encode("utf-8")) != 1:
        raise ValueError(f"field_delim must be exactly one single-byte character, got {field_delim!r} "
                         "(multi-byte and multi-character delimiters are not supported)")
    if field_delim in _FORBIDDEN:
        raise ValueError(f"field_delim {field_delim!r} is not allowed: digits, '+', '-', 'e', 'E' and '.' "
                         "can be part of a number")
    if kv and field_delim == ":":
        raise ValueError("field_delim ':' is not allowed for key:value records (':' separates key and value)")
    return field_delim


def _check_max_id(max_id: Any) -> int:
    if isinstance(max_id, (bool, np.bool_)) or not isinstance(max_id, (int, np.integer)) or not 1 <= max_id < 2**63:
        raise ValueError(f"max_id must be a positive int below 2**63 (the number of output columns), got {max_id!r}")
    return int(max_id)


def _records(records: Any) -> list[str]:
    if isinstance(records, (str, bytes)):
        raise TypeError("records must be a batch (list or 1-D array) of strings, got a single string; "
                        "wrap it in a list")
    arr = records.numpy() if hasattr(records, "numpy") and not isinstance(records, np.ndarray) else records
    if isinstance(arr, np.ndarray) and arr.ndim != 1:
        raise ValueError(f"records must be 1-D (one string per row), got shape {arr.shape}")
    out = []
    for i, r in enumerate(arr):
        if isinstance(r, bytes):
            try:
                r = r.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"row {i}: record is not UTF-8 text ({exc})") from None
        elif not isinstance(r, str):
            raise TypeError(f"row {i}: records must be strings or bytes, got {type(r).__name__}")
        out.append(r)
    return out


def _split(records: Any, delim: str) -> tuple[list[str], np.ndarray, int]:
    """Tokens of every record, the row of each token, and the batch size."""
    rows = _records(records)
    if delim == " ":
        parts = [_SPACES.split(r.strip(" ")) if r.strip(" ") else [] for r in rows]
    else:
        parts = [r.split(delim) if r else [] for r in rows]
    counts = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    tokens = list(chain.from_iterable(parts))
    return tokens, np.repeat(np.arange(len(rows), dtype=np.int64), counts), len(rows)


def _int64(token: str) -> int:
    """``token`` as an int64 (a ``ValueError`` otherwise: not an integer, or out of range)."""
    if not plain_number(token):
        raise ValueError(token)
    v = int(token)
    if not -(2**63) <= v < 2**63:
        raise ValueError(token)
    return v


def _float(token: str) -> float:
    if not plain_number(token):
        raise ValueError(token)
    return float(token)


def _first_bad(tokens: list[str], row_of: np.ndarray, conv: Any, what: str) -> ValueError:
    for k, t in enumerate(tokens):
        try:
            conv(t)
        except (ValueError, OverflowError):
            hint = " (an integer in the int64 range)" if conv is _int64 else ""
            return ValueError(f"row {int(row_of[k])}: {what} {t!r} is not a valid number{hint}")
    return ValueError(f"cannot parse {what}s")  # not reached: numpy and these converters agree


def _to_int(tokens: list[str], row_of: np.ndarray, what: str = "id") -> np.ndarray:
    if not tokens:
        return np.zeros(0, np.int64)
    try:
        if not plain_number("".join(tokens)):  # one pass over every token: numpy takes what int() takes
            raise ValueError
        return np.array(tokens).astype(np.int64)
    except (ValueError, OverflowError):
        raise _first_bad(tokens, row_of, _int64, what) from None


def _to_float(tokens: list[str], row_of: np.ndarray, what: str = "value") -> np.ndarray:
    if not tokens:
        return np.zeros(0, np.float32)
    try:
        if not plain_number("".join(tokens)):
            raise ValueError
        return np.array(tokens).astype(np.float32)
    except ValueError:
        raise _first_bad(tokens, row_of, _float, what) from None


def _check_range(ids: np.ndarray, row_of: np.ndarray, max_id: int) -> None:
    bad = (ids < 0) | (ids >= max_id)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"row {int(row_of[k])}: id {int(ids[k])} is out of range [0, {max_id}) "
                         f"(max_id={max_id})")


def _parse_ids(records: Any, max_id: int, field_delim: str) -> tuple[np.ndarray, np.ndarray, int]:
    tokens, row_of, n = _split(records, _check_delim(field_delim))
    ids = _to_int(tokens, row_of)
    _check_range(ids, row_of, max_id)
    return ids, row_of, n


def _parse_kv(records: Any, max_id: int, field_delim: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    tokens, row_of, n = _split(records, _check_delim(field_delim, kv=True))
    if not tokens:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), row_of, n
    parts = np.char.partition(np.array(tokens), ":")
    bad = (parts[:, 1] != ":") | (np.char.find(parts[:, 2], ":") >= 0)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"row {int(row_of[k])}: item {tokens[k]!r} is not key:value (one ':' between an "
                         "integer key and a number)")
    keys = _to_int(parts[:, 0].tolist(), row_of, "key")
    values = _to_float(parts[:, 2].tolist(), row_of, "value")
    _check_range(keys, row_of, max_id)
    return keys, values, row_of, n


def _sparse(row_of: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int, max_id: int) -> SparseColumn:
    order = np.lexsort((cols, row_of))  # canonical row-major order (stable: duplicates keep theirs)
    indices = np.stack([row_of[order], cols[order]], axis=1) if len(cols) else np.zeros((0, 2), np.int64)
    return SparseColumn(indices.astype(np.int64, copy=False), values[order], np.array([n, max_id], np.int64))


def csv_id2sparse(records: Iterable[str | bytes], max_id: int, id_as_value: bool = True,
                  field_delim: str = ",") -> SparseColumn:
    """Rows of ids (``"2,10"``) to a sparse int64 matrix ``[batch, max_id]``: entry
    ``[row, id]`` holds the id (``id_as_value=True``, the default) or 1. Raises
    ``ValueError`` for an id outside ``[0, max_id)``, a non-integer id or a bad delimiter."""
    max_id = _check_max_id(max_id)
    ids, row_of, n = _parse_ids(records, max_id, field_delim)
    values = ids.copy() if id_as_value else np.ones(len(ids), np.int64)
    return _sparse(row_of, ids, values, n, max_id)


def csv_id2dense(records: Iterable[str | bytes], max_id: int, id_as_value: bool = False,
                 field_delim: str = ",") -> np.ndarray:
    """Rows of ids (``"2,10"``) to a dense int64 matrix ``[batch, max_id]``: 1 at each id
    (or the id itself with ``id_as_value=True``), 0 elsewhere. Raises ``ValueError`` for
    an id outside ``[0, max_id)``."""
    max_id = _check_max_id(max_id)
    ids, row_of, n = _parse_ids(records, max_id, field_delim)
    out = np.zeros((n, max_id), np.int64)
    out[row_of, ids] = ids if id_as_value else 1
    return out


def csv_kv2sparse(records: Iterable[str | bytes], max_id: int, field_delim: str = ",") -> SparseColumn:
    """Rows of ``key:value`` items (``"1:0.1,4:0.4"``) to a sparse float32 matrix
    ``[batch, max_id]``. Raises ``ValueError`` for an item without exactly one ``:``, a
    key outside ``[0, max_id)`` or a value that is not a number."""
    max_id = _check_max_id(max_id)
    keys, values, row_of, n = _parse_kv(records, max_id, field_delim)
    return _sparse(row_of, keys, values, n, max_id)


def csv_kv2dense(records: Iterable[str | bytes], max_id: int, field_delim: str = ",") -> np.ndarray:
    """Rows of ``key:value`` items to a dense float32 matrix ``[batch, max_id]``, 0.0
    elsewhere (a key given twice in a row: the last value wins). Errors as
    :func:`csv_kv2sparse`."""
    max_id = _check_max_id(max_id)
    keys, values, row_of, n = _parse_kv(records, max_id, field_delim)
    out = np.zeros((n, max_id), np.float32)
    out[row_of, keys] = values
    return out


def csv_to_dense(records: Iterable[str | bytes], max_id: int, field_delim: str = ",") -> np.ndarray:
    """Rows of numbers (``"0.1,0.2,0.4"``) to a dense float32 matrix ``[batch, max_id]``,
    each row padded with 0.0. Raises ``ValueError`` for a row with more than ``max_id``
    numbers or a field that is not a number."""
    max_id = _check_max_id(max_id)
    tokens, row_of, n = _split(records, _check_delim(field_delim))
    values = _to_float(tokens, row_of)
    counts = np.bincount(row_of, minlength=n) if n else np.zeros(0, np.int64)
    if n and counts.max(initial=0) > max_id:
        r = int(np.argmax(counts > max_id))
        raise ValueError(f"row {r}: {int(counts[r])} values do not fit in max_id={max_id} columns")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if n else np.zeros(0, np.int64)
    cols = np.arange(len(values), dtype=np.int64) - np.repeat(starts, counts)
    out = np.zeros((n, max_id), np.float32)
    out[row_of, cols] = values
    return out


# PAI-TF names.
trans_csv_id2sparse = csv_id2sparse
"""PAI-TF's name for :func:`csv_id2sparse`."""
trans_csv_id2dense = csv_id2dense
"""PAI-TF's name for :func:`csv_id2dense`."""
trans_csv_kv2sparse = csv_kv2sparse
"""PAI-TF's name for :func:`csv_kv2sparse`."""
trans_csv_kv2dense = csv_kv2dense
"""PAI-TF's name for :func:`csv_kv2dense`."""
trans_csv_to_dense = csv_to_dense
"""PAI-TF's name for :func:`csv_to_dense`."""


# -- conversions of a SparseColumn ---------------------------------------------------------
def sparse_to_scipy(sp: SparseColumn) -> Any:
    """A ``scipy.sparse.csr_matrix`` (needs scipy; duplicates are summed, as scipy does)."""
    try:
        import scipy.sparse
    except ImportError as exc:
        raise ImportError("sparse_to_scipy needs scipy: pip install scipy") from exc
    rows, cols = sp.indices[:, 0], sp.indices[:, 1]
    return scipy.sparse.csr_matrix((sp.values, (rows, cols)), shape=tuple(int(d) for d in sp.dense_shape))


def sparse_to_torch(sp: SparseColumn) -> Any:
    """A ``torch.sparse_coo_tensor`` (needs torch)."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError("sparse_to_torch needs PyTorch: pip install torch") from exc
    return torch.sparse_coo_tensor(torch.from_numpy(np.ascontiguousarray(sp.indices.T)),
                                   torch.from_numpy(np.ascontiguousarray(sp.values)),
                                   tuple(int(d) for d in sp.dense_shape), check_invariants=True)


def sparse_to_tf(sp: SparseColumn) -> Any:
    """A ``tf.sparse.SparseTensor`` (needs TensorFlow)."""
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ImportError("sparse_to_tf needs TensorFlow: pip install tensorflow-cpu") from exc
    return tf.sparse.SparseTensor(sp.indices, sp.values, sp.dense_shape)


def sparse_to_dense(sp: SparseColumn) -> np.ndarray:
    """The dense numpy matrix (later duplicates overwrite earlier ones)."""
    out = np.zeros(tuple(int(d) for d in sp.dense_shape), dtype=sp.values.dtype)
    if len(sp.values):
        out[sp.indices[:, 0], sp.indices[:, 1]] = sp.values
    return out


__all__ = [
    "csv_id2dense",
    "csv_id2sparse",
    "csv_kv2dense",
    "csv_kv2sparse",
    "csv_to_dense",
    "sparse_to_dense",
    "sparse_to_scipy",
    "sparse_to_tf",
    "sparse_to_torch",
    "trans_csv_id2dense",
    "trans_csv_id2sparse",
    "trans_csv_kv2dense",
    "trans_csv_kv2sparse",
    "trans_csv_to_dense",
]

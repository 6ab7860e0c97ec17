"""Batch parsing against a feature spec, as ``tf.io.parse_example`` does, in pure Python:
the reference of the native batch parser (the rules: :mod:`shardfeed.formats.example`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DecodeError, ParseError
from .example_decode import (
    _DTYPE_KIND,
    _KIND_BYTES,
    _KIND_INT64,
    _KIND_NAMES,
    FeatureValue,
    _decode_example_raw,
    _Feature,
)
from .example_encode import _BYTES_TYPES, _int64_array, _to_bytes
from .padding import pad_rows
from .spec import (
    BYTES,
    INT64,
    FeatureSpec,
    FixedLen,
    FixedLenSequence,
    RaggedColumn,
    SparseColumn,
    VarLen,
    normalize_spec,
)

# ----------------------------------------------------------------------------- batch parsing


def _object_array(values: list) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = values
    return out


def _fixed_default(name: str, fl: FixedLen) -> np.ndarray | None:
    """The default of ``fl`` as a flat array of ``fl.size`` values, or None."""
    d = fl.default
    if d is None:
        return None
    if fl.dtype == BYTES:
        if isinstance(d, _BYTES_TYPES):
            flat = _object_array([_to_bytes(name, d)])
        else:
            flat = _object_array([_to_bytes(name, v) for v in np.asarray(d, dtype=object).ravel()])
    else:
        a = np.asarray(d)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"FixedLen default of feature {name!r} must be numeric for dtype {fl.dtype}, got {d!r}")
        if fl.dtype == INT64:
            if a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.trunc(a))):
                raise ValueError(f"FixedLen default of feature {name!r} has non-integer values for dtype int64: {d!r}")
            flat = _int64_array(name, a.astype(object) if a.dtype.kind == "f" else a)
        else:
            flat = a.astype(np.float32).ravel()
    if flat.size == 1 and fl.size != 1:
        flat = np.repeat(flat, fl.size)
    elif flat.size != fl.size:
        raise ValueError(
            f"FixedLen default of feature {name!r} has {flat.size} values but shape {list(fl.shape)} "
            f"needs {fl.size}; give a scalar or {fl.size} values"
        )
    return flat


def _present(feats: dict, key: str, kind: int, name: str, ri: int | None, what: str) -> _Feature | None:
    """The Feature ``key`` if it holds values of ``kind``; None if absent or kindless."""
    f = feats.get(key)
    if f is None or f.kind is None:
        return None
    if f.kind != kind:
        raise ParseError(
            f"{what} holds {_KIND_NAMES[f.kind]} values but the spec expects {_KIND_NAMES[kind]}",
            feature=name, record_index=ri,
        )
    return f


def _flat_values(f: _Feature | None, kind: int) -> FeatureValue:
    if f is None:
        return [] if kind == _KIND_BYTES else np.empty(0, np.int64 if kind == _KIND_INT64 else np.float32)
    return f.parts if kind == _KIND_BYTES else f.values()


def check_example_spec(spec: Mapping[str, FeatureSpec]) -> dict[str, FeatureSpec]:
    """``spec`` checked for parsing Examples: a FixedLenSequence there needs
    ``allow_missing=True`` (ValueError otherwise, as in TensorFlow)."""
    spec = normalize_spec(spec)
    for name, s in spec.items():
        if isinstance(s, FixedLenSequence) and not s.allow_missing:
            raise ValueError(f"spec[{name!r}]: a FixedLenSequence in an Example needs allow_missing=True (a missing "
                             "feature then has length 0), as tf.io.parse_example requires")
    return spec


def _parse(records: Sequence[bytes], spec: Mapping[str, FeatureSpec], single: bool,
           decoded: Sequence[dict] | None = None) -> dict[str, Any]:
    """The batch parse; ``decoded``: the records' Features already decoded (a
    SequenceExample's context), in place of decoding ``records``."""
    spec = check_example_spec(spec)
    if isinstance(records, (bytes, bytearray, memoryview, str)):
        raise TypeError("records must be a sequence of serialized Examples; for one record use parse_single_example")
    if isinstance(records, np.ndarray) and records.dtype.kind != "O":
        raise TypeError(
            f"records is a numpy array of dtype {records.dtype}, which drops trailing NUL bytes; "
            "pass a list or an object array of bytes"
        )
    n = len(records)
    fixed, ragged, sparse = {}, {}, {}
    for name, s in spec.items():
        kind = _DTYPE_KIND[s.dtype]
        if isinstance(s, FixedLen):
            out = np.empty((n, s.size), object) if s.dtype == BYTES else np.empty((n, s.size), np.dtype(s.dtype))
            fixed[name] = (s, kind, _fixed_default(name, s), out)
        elif isinstance(s, (VarLen, FixedLenSequence)):
            ragged[name] = (kind, [], np.zeros(n, np.int64))
        else:
            sparse[name] = (s, kind, [], [[] for _ in s.index_key], [])
    wanted = set(fixed) | set(ragged)  # every other feature is checked, never built
    for s, *_ in sparse.values():
        wanted.add(s.value_key)
        wanted.update(s.index_key)
    for i, rec in enumerate(records):
        ri = None if single else i
        try:
            feats = decoded[i] if decoded is not None else _decode_example_raw(rec, wanted)
        except DecodeError as e:
            raise DecodeError(f"not a valid tf.train.Example: {e}", record_index=ri) from None
        except TypeError as e:
            raise TypeError(f"record #{i}: {e}") from None
        for name, (s, kind, default, out) in fixed.items():
            f = _present(feats, name, kind, name, ri, "the feature")
            if f is None:
                if default is None:
                    raise ParseError(
                        f"required feature is missing (FixedLen {s.dtype} shape {list(s.shape)} has no default)",
                        feature=name, record_index=ri,
                    )
                out[i] = default
                continue
            got = f.count()
            if got != s.size:
                raise ParseError(
                    f"expected {s.size} {s.dtype} values for shape {list(s.shape)}, got {got}",
                    feature=name, record_index=ri,
                )
            out[i] = _flat_values(f, kind)
        for name, (kind, chunks, lengths) in ragged.items():
            f = _present(feats, name, kind, name, ri, "the feature")
            if f is not None:
                vals = _flat_values(f, kind)
                chunks.append(vals)
                lengths[i] = len(vals)
        for name, (s, kind, rows, idx, vals) in sparse.items():
            v = _flat_values(_present(feats, s.value_key, kind, name, ri, f"value feature {s.value_key!r}"), kind)
            for d, (key, size) in enumerate(zip(s.index_key, s.size)):
                ix = _flat_values(_present(feats, key, _KIND_INT64, name, ri, f"index feature {key!r}"), _KIND_INT64)
                if len(ix) != len(v):
                    raise ParseError(
                        f"index feature {key!r} has {len(ix)} values but value feature {s.value_key!r} has {len(v)}",
                        feature=name, record_index=ri,
                    )
                if len(ix) and (int(ix.min()) < 0 or int(ix.max()) >= size):
                    bad = int(ix.min()) if int(ix.min()) < 0 else int(ix.max())
                    raise ParseError(
                        f"index feature {key!r} holds {bad}, outside [0, {size})", feature=name, record_index=ri
                    )
                idx[d].append(ix)
            if len(v):
                rows.append(np.full(len(v), i, np.int64))
                vals.append(v)

    result: dict[str, Any] = {}
    for name, s in spec.items():
        if name in fixed:
            out = fixed[name][3].reshape((n, *s.shape))
            result[name] = out[0] if single else out
        elif name in ragged:
            kind, chunks, lengths = ragged[name]
            values = _concat(chunks, kind)
            splits = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=splits[1:])
            if isinstance(s, FixedLenSequence):
                padded = pad_rows(values, splits, s, name, single)[0]
                result[name] = padded[0] if single else padded
            else:
                result[name] = values if single else RaggedColumn(values, splits)
        else:
            s, kind, rows, idx, vals = sparse[name]
            cols = [np.concatenate(rows) if rows else np.empty(0, np.int64)]
            cols += [np.concatenate(c) if c else np.empty(0, np.int64) for c in idx]
            values = _concat(vals, kind)
            if not s.already_sorted:
                order = np.lexsort(cols[::-1])  # stable, so duplicates keep their order as in TF
                cols = [c[order] for c in cols]
                values = values[order]
            indices = np.stack(cols, axis=1).astype(np.int64)
            shape = np.array([n, *s.size], np.int64)
            result[name] = (SparseColumn(indices[:, 1:], values, shape[1:]) if single
                            else SparseColumn(indices, values, shape))
    return result


def _concat(chunks: list, kind: int) -> np.ndarray:
    if kind == _KIND_BYTES:
        return _object_array([b for c in chunks for b in c])
    dtype = np.int64 if kind == _KIND_INT64 else np.float32
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.empty(0, dtype)


def parse_example(
    records: Sequence[bytes], spec: Mapping[str, FeatureSpec]
) -> dict[str, np.ndarray | RaggedColumn | SparseColumn]:
    """Parse a batch of serialized Examples into columns, as ``tf.io.parse_example`` does.

    FixedLen gives an array of shape ``(len(records), *shape)`` (int64, float32, or object
    holding bytes); FixedLenSequence one of shape ``(len(records), longest, *shape)``,
    padded; VarLen a :class:`RaggedColumn`; Sparse a :class:`SparseColumn` with
    indices ``[nnz, 1 + rank]`` (record first) and dense shape ``[len(records), *size]``.
    Raises DecodeError (with ``record_index``) for a record that is not an Example,
    ParseError (with ``feature`` and ``record_index``) for one that does not fit the spec,
    ValueError/TypeError for a bad spec default or a bad ``records`` argument.
    """
    return _parse(records, spec, single=False)


def parse_single_example(
    record: bytes | memoryview, spec: Mapping[str, FeatureSpec]
) -> dict[str, np.ndarray | SparseColumn]:
    """Parse one serialized Example, as ``tf.io.parse_single_example`` does.

    FixedLen gives an array of shape ``shape`` (for shape ``()`` a numpy scalar, or
    ``bytes``, as a TF scalar's ``.numpy()``); VarLen a 1-D array (object for bytes);
    Sparse a :class:`SparseColumn` with indices ``[nnz, rank]`` and dense shape ``size``.
    Raises as :func:`parse_example`, without a record index.
    """
    if not isinstance(record, (bytes, bytearray, memoryview)):
        raise TypeError(f"record must be bytes, bytearray or memoryview, got {type(record).__name__}")
    return _parse([record], spec, single=True)

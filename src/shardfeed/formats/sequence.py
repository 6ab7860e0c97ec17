"""Spec-driven ``tf.train.SequenceExample`` parsing, as ``tf.io.parse_sequence_example``.

A SequenceExample holds context Features (parsed as an Example's, with ``FixedLen`` and
``VarLen`` specs, value for value as :func:`~shardfeed.formats.example.parse_example`)
and feature lists: per name, one Feature per step. Sequence specs:

- ``FixedLenSequence(dtype, shape)``: every step holds exactly ``prod(shape)`` values of
  the spec's kind (an empty or kindless step is an error, as in TensorFlow); a batch gives
  ``(n, longest, *shape)``, padded with 0 / ``b""``, and the record's step count in the
  ``lengths`` dict. A missing feature list is a ParseError unless ``allow_missing``
  (then 0 steps). ``default`` must be ``None`` (TensorFlow's rule).
- ``VarLen(dtype)``: any number of values per step; a :class:`SparseColumn` with indices
  ``[record, step, position]`` and dense shape ``[n, most steps, most values]``, the
  layout of TensorFlow's ``SparseTensor``.

A step of another kind than the spec's is a ParseError even when empty. Errors come in
one order: the first record that does not decode (every record is decoded before any is
checked against the specs), else the first context error (record by record), else the
first feature-list error (feature by feature in spec order, then record, then step).

This module holds the pure-Python reference, :func:`parse_sequence_example_py`; the public
functions use the native core when it is built (:mod:`.sequence_native`, the same values
and errors) and this reference otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DecodeError, ParseError
from .example_decode import _DTYPE_KIND, _KIND_NAMES, decode_sequence_raw
from .example_parse import _concat, _fixed_default, _flat_values, _parse
from .padding import pad_rows
from .sequence_native import parse_sequence_batch, sequence_native_available
from .spec import FeatureSpec, FixedLen, FixedLenSequence, RaggedColumn, SparseColumn, VarLen, normalize_spec

Column = np.ndarray | RaggedColumn | SparseColumn


def check_sequence_specs(context_features: Mapping[str, FeatureSpec] | None,
                         sequence_features: Mapping[str, FeatureSpec] | None) -> tuple[dict, dict]:
    """Both specs checked (kinds, defaults) and normalized; TypeError/ValueError saying
    what to change, before any record is read."""
    ctx = normalize_spec(context_features or {})
    seq = normalize_spec(sequence_features or {})
    for name, s in ctx.items():
        if not isinstance(s, (FixedLen, VarLen)):
            raise TypeError(f"context_features[{name!r}] is {type(s).__name__}; context features are FixedLen or "
                            "VarLen (as tf.io.parse_sequence_example's)")
        if isinstance(s, FixedLen):
            _fixed_default(name, s)
    for name, s in seq.items():
        if not isinstance(s, (FixedLenSequence, VarLen)):
            raise TypeError(f"sequence_features[{name!r}] is {type(s).__name__}; sequence features are "
                            "FixedLenSequence or VarLen")
        if isinstance(s, FixedLenSequence) and s.default is not None:
            raise ValueError(f"sequence_features[{name!r}]: a FixedLenSequence of a feature list takes no default "
                             "(steps are padded with 0 or b''), as tf.io.parse_sequence_example requires")
    if not ctx and not seq:
        raise ValueError("give context_features, sequence_features or both")
    return ctx, seq


def _step_values(steps: list, kind: int, name: str, ri: int | None, size: int | None) -> list:
    """Each step's values, checked against the spec's kind (and count, for ``size``)."""
    out = []
    for j, f in enumerate(steps):
        if f.kind is not None and f.kind != kind:
            raise ParseError(f"step {j} of the feature list holds {_KIND_NAMES[f.kind]} values but the spec "
                             f"expects {_KIND_NAMES[kind]}", feature=name, record_index=ri)
        vals = _flat_values(f if f.kind is not None else None, kind)
        if size is not None and len(vals) != size:
            raise ParseError(f"step {j} of the feature list has {len(vals)} values, expected {size}",
                             feature=name, record_index=ri)
        out.append(vals)
    return out


def _parse_sequences(records: Sequence[Any], context_features: Mapping[str, FeatureSpec] | None,
                     sequence_features: Mapping[str, FeatureSpec] | None, single: bool, use_native: bool):
    ctx_spec, seq_spec = check_sequence_specs(context_features, sequence_features)
    if isinstance(records, (bytes, bytearray, memoryview, str)):
        raise TypeError("records must be a sequence of serialized SequenceExamples; for one record use "
                        "parse_single_sequence_example")
    if use_native and sequence_native_available():
        return parse_sequence_batch(records, ctx_spec, seq_spec, single)
    n = len(records)
    contexts, lists = [], []
    for i, rec in enumerate(records):
        try:
            c, fl = decode_sequence_raw(rec)
        except DecodeError as e:
            raise DecodeError(f"not a valid tf.train.SequenceExample: {e}",
                              record_index=None if single else i) from None
        except TypeError as e:
            raise TypeError(f"record #{i}: {e}") from None
        contexts.append(c)
        lists.append(fl)
    context = _parse(list(records), ctx_spec, single, decoded=contexts) if ctx_spec else {}

    feature_lists: dict[str, Column] = {}
    lengths: dict[str, np.ndarray] = {}
    for name, s in seq_spec.items():
        kind = _DTYPE_KIND[s.dtype]
        fixed = isinstance(s, FixedLenSequence)
        per_record = []  # per record, the list of its steps' values
        for i in range(n):
            ri = None if single else i
            steps = lists[i].get(name)
            if steps is None:
                if fixed and not s.allow_missing:
                    raise ParseError("required feature list is missing (FixedLenSequence without allow_missing)",
                                     feature=name, record_index=ri)
                steps = []
            per_record.append(_step_values(steps, kind, name, ri, s.size if fixed else None))
        if fixed:
            counts = np.array([sum(len(v) for v in steps) for steps in per_record], np.int64)
            splits = np.zeros(n + 1, np.int64)
            np.cumsum(counts, out=splits[1:])
            values = _concat([v for steps in per_record for v in steps], kind)
            padded, steps_of = pad_rows(values, splits, s, name, single)
            feature_lists[name] = padded[0] if single else padded
            lengths[name] = steps_of
        else:
            feature_lists[name] = _sparse_steps(per_record, kind, single)
    return context, feature_lists, lengths


def _sparse_steps(per_record: list, kind: int, single: bool) -> SparseColumn:
    """VarLen feature lists as TensorFlow's SparseTensor: ``[record, step, position]``."""
    rows, steps, pos, chunks = [], [], [], []
    most_steps = most_values = 0
    for i, record_steps in enumerate(per_record):
        most_steps = max(most_steps, len(record_steps))
        for j, v in enumerate(record_steps):
            k = len(v)
            most_values = max(most_values, k)
            if k:
                rows.append(np.full(k, i, np.int64))
                steps.append(np.full(k, j, np.int64))
                pos.append(np.arange(k, dtype=np.int64))
                chunks.append(v)
    cols = [np.concatenate(c) if c else np.empty(0, np.int64) for c in (rows, steps, pos)]
    values = _concat(chunks, kind)
    if single:
        return SparseColumn(np.stack(cols[1:], axis=1), values, np.array([most_steps, most_values], np.int64))
    return SparseColumn(np.stack(cols, axis=1), values, np.array([len(per_record), most_steps, most_values], np.int64))


def parse_sequence_example(
    records: Sequence[bytes],
    context_features: Mapping[str, FeatureSpec] | None = None,
    sequence_features: Mapping[str, FeatureSpec] | None = None,
) -> tuple[dict[str, Column], dict[str, Column], dict[str, np.ndarray]]:
    """Parse a batch of serialized SequenceExamples, as ``tf.io.parse_sequence_example``:
    ``(context, feature_lists, lengths)``.

    ``context``: as :func:`~shardfeed.parse_example` gives for ``context_features``
    (``FixedLen``, ``VarLen``). ``feature_lists``: for each of ``sequence_features``, a
    ``FixedLenSequence`` gives an array ``(len(records), longest, *shape)`` padded with 0
    or ``b""``, a ``VarLen`` a :class:`SparseColumn` with indices ``[record, step,
    position]``. ``lengths``: the step count of every record for each FixedLenSequence.
    Raises DecodeError (``record_index``) for bytes that are not a SequenceExample,
    ParseError (``feature``, ``record_index``) for a record that does not fit the specs,
    TypeError/ValueError for bad specs.
    """
    return _parse_sequences(records, context_features, sequence_features, single=False, use_native=True)


def parse_sequence_example_py(
    records: Sequence[bytes],
    context_features: Mapping[str, FeatureSpec] | None = None,
    sequence_features: Mapping[str, FeatureSpec] | None = None,
    *,
    single: bool = False,
):
    """:func:`parse_sequence_example` in pure Python, whether or not the native core is
    built: the reference the native path is checked against. With ``single`` (one record
    in ``records``) it returns what :func:`parse_single_sequence_example` returns, and
    ``lengths``."""
    return _parse_sequences(records, context_features, sequence_features, single=single, use_native=False)


def parse_single_sequence_example(
    record: bytes | memoryview,
    context_features: Mapping[str, FeatureSpec] | None = None,
    sequence_features: Mapping[str, FeatureSpec] | None = None,
) -> tuple[dict[str, Any], dict[str, Column]]:
    """Parse one serialized SequenceExample, as ``tf.io.parse_single_sequence_example``:
    ``(context, feature_lists)``, each column without the batch dimension (a
    FixedLenSequence ``(steps, *shape)``, a VarLen sequence a :class:`SparseColumn` with
    indices ``[step, position]``). Raises as :func:`parse_sequence_example`, without a
    record index."""
    if not isinstance(record, (bytes, bytearray, memoryview)):
        raise TypeError(f"record must be bytes, bytearray or memoryview, got {type(record).__name__}")
    context, feature_lists, _ = _parse_sequences([record], context_features, sequence_features, single=True,
                                                 use_native=True)
    return context, feature_lists


__all__ = ["check_sequence_specs", "parse_sequence_example", "parse_sequence_example_py",
           "parse_single_sequence_example"]

"""``tf.train.SequenceExample`` batches on the native core: the context and the feature lists
of every record are decoded and checked in C (GIL released), and the columns built here with
numpy, value for value as the pure-Python reference (:mod:`.sequence`).

The C parser gives, per feature list, the values of every step of every record back to back,
the running value count after each step, and the running step count after each record;
a ``FixedLenSequence`` is padded from those by :func:`~.padding.pad_rows` (as the reference
pads), a ``VarLen`` one becomes a :class:`SparseColumn` ``[record, step, position]``.
Specs reach this module already checked (:func:`.sequence.check_sequence_specs`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DecodeError, ParseError
from . import native
from .padding import pad_rows
from .spec import BYTES, FeatureSpec, FixedLen, FixedLenSequence, RaggedColumn, SparseColumn

_FIXED, _VAR, _SEQ_FIXED, _SEQ_VAR = 0, 1, 3, 4  # SF_COL_* in example_parse.h


class CompiledSequenceSpec:
    """Context and sequence specs prepared once for the native parser: column ``k`` of the
    C spec is ``names[k]``, ``("context", name)`` or ``("sequence", name)``."""

    def __init__(self, context: Mapping[str, FeatureSpec], sequence: Mapping[str, FeatureSpec]):
        from .example_parse import _fixed_default

        self.context, self.sequence = dict(context), dict(sequence)
        # context columns in the order CompiledSpec uses (FixedLen, then VarLen); feature
        # lists in spec order, which is the order the reference checks them in
        names = ([("context", n) for n, s in self.context.items() if isinstance(s, FixedLen)]
                 + [("context", n) for n, s in self.context.items() if not isinstance(s, FixedLen)]
                 + [("sequence", n) for n in self.sequence])
        cols = []
        for where, name in names:
            s = (self.context if where == "context" else self.sequence)[name]
            kind = native._KIND[s.dtype]
            key = native._key_bytes(name)
            if where == "context" and isinstance(s, FixedLen):
                d = _fixed_default(name, s)
                if d is not None:
                    d = list(d) if s.dtype == BYTES else np.ascontiguousarray(d, np.dtype(s.dtype))
                cols.append((_FIXED, kind, key, s.size, d, (), ()))
            elif where == "context":
                cols.append((_VAR, kind, key, 0, None, (), ()))
            elif isinstance(s, FixedLenSequence):
                cols.append((_SEQ_FIXED, kind, key, s.size, not s.allow_missing, (), ()))
            else:
                cols.append((_SEQ_VAR, kind, key, 0, False, (), ()))
        self.names = names
        self._native = native._ext.CompiledSpec(cols)


_cache: dict[tuple, CompiledSequenceSpec] = {}
_cache_lock = threading.Lock()


def compile_sequence_spec(context: Mapping[str, FeatureSpec], sequence: Mapping[str, FeatureSpec]
                          ) -> CompiledSequenceSpec:
    """The :class:`CompiledSequenceSpec` of checked specs, cached by their contents (specs
    are immutable values)."""
    try:
        key = (tuple(context.items()), tuple(sequence.items()))
        hash(key)
    except TypeError:  # an unhashable default: compile every time
        return CompiledSequenceSpec(context, sequence)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None:
        hit = CompiledSequenceSpec(context, sequence)
        with _cache_lock:
            if len(_cache) > 256:
                _cache.clear()
            _cache[key] = hit
    return hit


def _raise(err: tuple, cs: CompiledSequenceSpec, records: Sequence[Any], single: bool) -> None:
    kind, code, ri, ci, a, b, c, msg = err
    if kind == "type":
        raise TypeError(f"record #{ri}: a serialized record must be bytes, bytearray or memoryview, got "
                        f"{type(records[ri]).__name__}")
    index = None if single else ri
    if kind == "decode":
        raise DecodeError(f"not a valid tf.train.SequenceExample: {msg}", record_index=index)
    where, name = cs.names[ci]
    s = (cs.context if where == "context" else cs.sequence)[name]
    raise ParseError(native.parse_error_message(code, a, b, c, s), feature=name, record_index=index)


def _sparse_steps(values: np.ndarray, record_steps: np.ndarray, step_values: np.ndarray, n: int,
                  single: bool) -> SparseColumn:
    """A VarLen feature list as TensorFlow's SparseTensor: indices ``[record, step, position]``."""
    steps_per_record = np.diff(record_steps)
    values_per_step = np.diff(step_values)
    nsteps = len(values_per_step)
    record_of_step = np.repeat(np.arange(n, dtype=np.int64), steps_per_record)
    step_in_record = np.arange(nsteps, dtype=np.int64) - np.repeat(record_steps[:-1], steps_per_record)
    rows = np.repeat(record_of_step, values_per_step)
    steps = np.repeat(step_in_record, values_per_step)
    pos = np.arange(len(values), dtype=np.int64) - np.repeat(step_values[:-1], values_per_step)
    most_steps = int(steps_per_record.max()) if n else 0
    most_values = int(values_per_step.max()) if nsteps else 0
    if single:
        return SparseColumn(np.stack([steps, pos], axis=1), values, np.array([most_steps, most_values], np.int64))
    return SparseColumn(np.stack([rows, steps, pos], axis=1), values, np.array([n, most_steps, most_values], np.int64))


def sequence_native_available() -> bool:
    """True when the built extension has the SequenceExample parser (an extension built
    from older sources has not: then the pure-Python reference is used)."""
    return native._ext is not None and hasattr(native._ext, "parse_sequence_batch")


def parse_sequence_batch(records: Sequence[Any], context: Mapping[str, FeatureSpec],
                         sequence: Mapping[str, FeatureSpec], single: bool = False):
    """``(context, feature_lists, lengths)`` of serialized SequenceExamples, as
    :func:`shardfeed.parse_sequence_example` gives them, natively. ``context`` and
    ``sequence`` are specs checked by :func:`.sequence.check_sequence_specs`; ``single``
    drops the batch dimension and the record index of errors. Needs the extension built."""
    cs = compile_sequence_spec(context, sequence)
    n = len(records)
    cols, err = native._ext.parse_sequence_batch(cs._native, records, None, None, False)
    if err is not None:
        _raise(err, cs, records, single)
    by_name = dict(zip(cs.names, cols))
    ctx: dict[str, Any] = {}
    for name, s in cs.context.items():
        col = by_name[("context", name)]
        if isinstance(s, FixedLen):
            out = col.reshape((n, *s.shape))
            ctx[name] = out[0] if single else out
        else:
            values, splits = col
            ctx[name] = values if single else RaggedColumn(values, splits)
    lists: dict[str, Any] = {}
    lengths: dict[str, np.ndarray] = {}
    for name, s in cs.sequence.items():
        values, record_steps, step_values = by_name[("sequence", name)]
        if isinstance(s, FixedLenSequence):
            padded, steps_of = pad_rows(values, step_values[record_steps], s, name, single)
            lists[name] = padded[0] if single else padded
            lengths[name] = steps_of
        else:
            lists[name] = _sparse_steps(values, record_steps, step_values, n, single)
    return ctx, lists, lengths


__all__ = ["CompiledSequenceSpec", "compile_sequence_spec", "parse_sequence_batch", "sequence_native_available"]

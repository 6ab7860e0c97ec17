"""The parsers the rest of shardfeed (and ``sf.parse_example`` / ``sf.parse_single_example``)
call: the native one when the C core is built, the pure-Python reference otherwise. Both
give the same values and the same errors (checked by tests/test_native.py and the
differential fuzzer)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DecodeError, ParseError
from .example import parse_example as _parse_example_py
from .example import parse_single_example as _parse_single_example_py
from .native import native_available, parse_example_batch
from .spec import FeatureSpec, FixedLen, FixedLenSequence, RaggedColumn, SparseColumn, VarLen, normalize_spec

Records = Sequence[bytes] | tuple[Any, np.ndarray, np.ndarray]


def parse_batch(records: Records, spec: Mapping[str, FeatureSpec], *, bytes_as: str = "object") -> dict[str, Any]:
    """Parse serialized Examples into columns (see :func:`shardfeed.parse_example`).

    ``records`` is a sequence of records or a ``(buffer, offsets, lengths)`` triple such as
    a :class:`~shardfeed.formats.chunks.FrameChunk`. Uses the native parser (GIL released)
    when it is built. A FrameChunk whose data CRCs the framing left unchecked (``crcs``)
    has them checked here (CorruptRecordError for the first that fails).
    """
    triple = getattr(records, "triple", None)  # a FrameChunk
    crcs = getattr(records, "crcs", None)  # its data CRCs, when the framing left them to us
    if triple is not None:
        records = triple
    if crcs is not None or native_available() or bytes_as != "object" or isinstance(records, tuple):
        return parse_example_batch(records, spec, bytes_as=bytes_as, crcs=crcs)
    return _parse_example_py(records, spec)


def parse_example(records: Sequence[bytes], spec: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Parse a batch of serialized Examples into columns, as ``tf.io.parse_example`` does
    (see :func:`shardfeed.formats.example.parse_example` for every rule): natively, with
    the GIL released, when the C core is built."""
    if native_available():
        return parse_example_batch(records, spec)
    return _parse_example_py(records, spec)


def parse_single_example(record: bytes | memoryview, spec: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Parse one serialized Example, as ``tf.io.parse_single_example`` does (see
    :func:`shardfeed.formats.example.parse_single_example`): natively when the C core is
    built, about 8x the pure-Python reference on a CTR-like record. A record that does not
    parse is parsed again by the reference, so the error is the reference's, without a
    record index."""
    if not isinstance(record, (bytes, bytearray, memoryview)):
        raise TypeError(f"record must be bytes, bytearray or memoryview, got {type(record).__name__}")
    if not native_available():
        return _parse_single_example_py(record, spec)
    try:
        cols = parse_example_batch([record], spec)
    except (DecodeError, ParseError):
        return _parse_single_example_py(record, spec)  # raises the reference's error
    out: dict[str, Any] = {}
    for name, s in normalize_spec(spec).items():
        col = cols[name]
        if isinstance(s, (FixedLen, FixedLenSequence)):
            out[name] = col[0]
        elif isinstance(s, VarLen):
            out[name] = col.values if isinstance(col, RaggedColumn) else col
        else:
            assert isinstance(col, SparseColumn)
            out[name] = SparseColumn(col.indices[:, 1:], col.values, col.dense_shape[1:])
    return out


__all__ = ["parse_batch", "parse_example", "parse_single_example"]

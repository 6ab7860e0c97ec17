"""Padding variable-length rows into the dense column a ``FixedLenSequence`` feature gives.

Both parsers (native and pure Python) read such a feature as ragged values plus row splits
and pad here, so they pad alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ParseError
from .spec import BYTES, FixedLenSequence, numpy_dtype


def pad_rows(values: Any, row_splits: np.ndarray, fl: FixedLenSequence, name: str,
             single: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``values`` (row ``i`` is ``values[row_splits[i]:row_splits[i + 1]]``) as an
    array ``(rows, longest, *fl.shape)`` padded with ``fl.pad_value()``, and the rows'
    lengths in items (int64). A row whose value count is not a multiple of
    ``prod(fl.shape)`` is a ParseError naming ``name`` and the row (no row with
    ``single``)."""
    splits = np.asarray(row_splits, np.int64)
    counts = np.diff(splits)
    n = len(counts)
    size = fl.size
    bad = np.nonzero(counts % size if size else counts)[0]
    if len(bad):
        i = int(bad[0])
        raise ParseError(f"expected a multiple of {size} {fl.dtype} values (items of shape {list(fl.shape)}), "
                         f"got {int(counts[i])}", feature=name, record_index=None if single else i)
    lengths = counts // size if size else np.zeros(n, np.int64)
    longest = int(lengths.max()) if n else 0
    dtype = numpy_dtype(fl.dtype)
    out = np.empty((n, longest * size), dtype)
    out[...] = fl.pad_value()
    if len(values):
        if fl.dtype == BYTES and not isinstance(values, np.ndarray):
            flat = np.empty(len(values), object)
            flat[:] = list(values)
        else:
            flat = np.asarray(values)
        rows = np.repeat(np.arange(n, dtype=np.int64), counts)
        cols = np.arange(len(flat), dtype=np.int64) - np.repeat(splits[:-1], counts)
        out[rows, cols] = flat
    return out.reshape((n, longest, *fl.shape)), lengths.astype(np.int64)

"""TensorFlow: a shardfeed dataset as a ``tf.data.Dataset`` (via ``from_generator``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..formats.spec import FixedLenSequence, RaggedColumn, SparseColumn
from ..pipeline.dataset import Dataset
from ..pipeline.tree import keystr, tree_map_with_path
from ..registry import require


def _padded_names(ds: Dataset) -> set[str]:
    """Names of the FixedLenSequence features the spec upstream of ``ds`` parses: their
    second dimension (the longest record of the batch) changes from batch to batch."""
    d: Any = ds
    while d is not None:
        spec = d._deferred_spec()
        if spec:
            return {k for k, s in spec.items() if isinstance(s, FixedLenSequence)}
        d = getattr(d, "parent", None)
    return set()


def _spec_of(x: Any, tf: Any, path: str, padded: frozenset = frozenset()) -> Any:
    """The ``tf.TensorSpec`` structure of element ``x``; a top-level feature named in ``padded``
    gets an unknown second dimension."""
    out = tree_map_with_path(lambda p, leaf: _leaf_spec(leaf, tf, path + keystr(p)), x)
    if isinstance(x, Mapping):
        for k in padded & set(x):
            s = out[k]
            if len(s.shape) >= 2:
                out[k] = tf.TensorSpec(shape=(None, None) + tuple(s.shape[2:]), dtype=s.dtype)
    return out


def _leaf_spec(x: Any, tf: Any, path: str) -> Any:
    if isinstance(x, (RaggedColumn, SparseColumn)):
        raise TypeError(f"{path} is a {type(x).__name__}; to_tf supports dense arrays only: "
                        "pad it in a map, or pass output_signature and convert it yourself")
    a = np.asarray(x)
    dtype = tf.string if a.dtype == object or a.dtype.kind in "SU" else tf.as_dtype(a.dtype)
    shape = (None,) + a.shape[1:] if a.ndim >= 1 else ()  # the last batch may be smaller
    return tf.TensorSpec(shape=shape, dtype=dtype)


def to_tf(ds: Dataset, output_signature: Any = None) -> Any:
    """A ``tf.data.Dataset`` yielding the elements of ``ds``. ``output_signature`` is
    inferred from the first element when not given (first dimension left unknown).

    When ``ds.cardinality()`` is known (record counts from index files or a conversion
    manifest, through ``batch``/``take``/``map``...), the result reports it
    (``tf.data.experimental.assert_cardinality``), so Keras knows the epoch length; a pass
    that yields another number of elements then fails instead of going on. Otherwise the
    cardinality is unknown and ``model.fit`` needs ``steps_per_epoch`` (docs/pipeline.md).
    Raises ``ImportError`` when TensorFlow is missing, ``TypeError`` for elements that are
    not dense arrays (or dicts/tuples of them)."""
    tf = require("tensorflow", what="to_tf")
    if output_signature is None:
        first = list(ds.take(1))
        if not first:
            raise ValueError("to_tf cannot infer output_signature from an empty dataset; pass output_signature")
        output_signature = _spec_of(first[0], tf, "element", frozenset(_padded_names(ds)))

    def gen():
        it = iter(ds)
        try:
            yield from it
        finally:
            it.close()

    out = tf.data.Dataset.from_generator(gen, output_signature=output_signature)
    n = ds.cardinality()
    if n is not None:
        out = out.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY if n == math.inf else n))
    return out

"""numpy and JAX iteration."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..formats.spec import RaggedColumn, SparseColumn
from ..pipeline.dataset import Dataset
from ..pipeline.tree import Path, keystr, tree_map, tree_map_with_path
from ..registry import require

logger = logging.getLogger(__name__)

# JAX without x64 stores these as the 32-bit type (jax.device_put converts silently)
_NARROW = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
           np.dtype(np.float64): np.dtype(np.float32)}


def to_numpy(x: Any) -> Any:
    """Every leaf as a numpy array (dicts and tuples kept; ragged/sparse columns kept)."""
    return tree_map(_leaf_numpy, x)


def _leaf_numpy(x: Any) -> Any:
    if isinstance(x, (np.ndarray, RaggedColumn, SparseColumn)):
        return x
    return np.asarray(x)


def as_numpy(ds: Dataset) -> Iterator[Any]:
    """Iterate ``ds`` with every value as numpy."""
    it = iter(ds)
    try:
        for x in it:
            yield to_numpy(x)
    finally:
        it.close()


def _fits(a: np.ndarray, narrow: np.dtype) -> bool:
    """Whether every value of ``a`` survives the cast to ``narrow`` (floats: no finite value
    turns infinite; the precision of float32 is what 32-bit JAX means)."""
    if not a.size:
        return True
    if narrow.kind == "f":
        finite = a[np.isfinite(a)]
        return not finite.size or float(np.abs(finite).max()) <= float(np.finfo(narrow).max)
    info = np.iinfo(narrow)
    return int(a.min()) >= info.min and int(a.max()) <= info.max


def narrow_for_jax(a: np.ndarray, name: str, warned: set[str]) -> np.ndarray:
    """``a`` as JAX without 64-bit types will hold it: int64/uint64/float64 cast to the
    32-bit type when every value fits (logging a warning naming ``name`` the first time,
    recorded in ``warned``); ``OverflowError`` naming the feature and the fix when some
    value does not fit. Other dtypes pass unchanged."""
    narrow = _NARROW.get(a.dtype)
    if narrow is None:
        return a
    if not _fits(a, narrow):
        hi = a[np.isfinite(a)] if a.dtype.kind == "f" else a
        raise OverflowError(
            f"to_jax: {name} holds {a.dtype} values (from {hi.min()} to {hi.max()}) that do not fit {narrow}, "
            f"and JAX runs with 32-bit types (jax_enable_x64 is off), so they would arrive corrupted: call "
            f'jax.config.update("jax_enable_x64", True) before iterating, or bring the values into the '
            f"{narrow} range with a map before to_jax")
    if name not in warned:
        warned.add(name)
        logger.warning("to_jax: %s is %s but JAX runs with 32-bit types (jax_enable_x64 is off): casting it to "
                       "%s (every value fits; enable x64 to keep %s)", name, a.dtype, narrow, a.dtype)
    return a.astype(narrow)


def to_jax(ds: Dataset, device: Any = None) -> Iterator[Any]:
    """Iterate ``ds`` with numeric arrays placed by ``jax.device_put`` (on ``device``, or
    JAX's default). Bytes/str arrays and ragged columns stay numpy.

    JAX keeps 64-bit types only with ``jax_enable_x64``; without it an int64, uint64 or
    float64 array is cast to the 32-bit type when every value fits (a warning names the
    feature once per pass), and a value that does not fit raises ``OverflowError`` naming
    the feature, instead of arriving wrapped (JAX's own ``device_put`` would turn
    ``2**40 + 5`` into ``5``). Raises ``ImportError`` when JAX is missing."""
    jax = require("jax", what="to_jax")
    x64 = bool(jax.config.jax_enable_x64)
    warned: set[str] = set()

    def put(path: Path, x: Any, features: bool) -> Any:
        if isinstance(x, np.ndarray) and x.dtype != object and x.dtype.kind not in "SU":
            # a dict element's leaves are features ("feature 'k'"); otherwise "the element[0]..."
            name = f"feature {path[0]!r}{keystr(path[1:])}" if features else f"the element{keystr(path)}"
            return jax.device_put(x if x64 else narrow_for_jax(x, name, warned), device)
        return x

    for x in as_numpy(ds):
        features = isinstance(x, Mapping)
        yield tree_map_with_path(lambda path, v, f=features: put(path, v, f), x)

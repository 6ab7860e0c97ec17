"""numpy and JAX iteration."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from ..formats.spec import RaggedColumn, SparseColumn
from ..pipeline.dataset import Dataset


def to_numpy(x: Any) -> Any:
    """Every leaf as a numpy array (dicts and tuples kept; ragged/sparse columns kept)."""
    if isinstance(x, Mapping):
        return {k: to_numpy(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(to_numpy(v) for v in x)
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


def to_jax(ds: Dataset, device: Any = None) -> Iterator[Any]:
    """Iterate ``ds`` with numeric arrays placed by ``jax.device_put`` (on ``device``, or
    JAX's default). Bytes/str arrays and ragged columns stay numpy. Raises ``ImportError``
    when JAX is missing."""
    try:
        import jax  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("to_jax needs JAX: pip install jax") from exc

    def put(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {k: put(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(put(v) for v in x)
        if isinstance(x, np.ndarray) and x.dtype != object and x.dtype.kind not in "SU":
            return jax.device_put(x, device)
        return x

    for x in as_numpy(ds):
        yield put(x)

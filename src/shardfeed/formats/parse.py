"""The batch parser the rest of shardfeed calls: the native one when the C core is built,
the pure-Python reference otherwise. Both give the same values and the same errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .example import parse_example as _parse_example_py
from .native import native_available, parse_example_batch
from .spec import FeatureSpec

Records = Sequence[bytes] | tuple[Any, np.ndarray, np.ndarray]


def parse_batch(records: Records, spec: Mapping[str, FeatureSpec], *, bytes_as: str = "object") -> dict[str, Any]:
    """Parse serialized Examples into columns (see :func:`shardfeed.parse_example`).

    ``records`` is a sequence of records or a ``(buffer, offsets, lengths)`` triple such as
    a :class:`~shardfeed.formats.chunks.FrameChunk`. Uses the native parser (GIL released)
    when it is built.
    """
    triple = getattr(records, "triple", None)  # a FrameChunk
    if triple is not None:
        records = triple
    if native_available() or bytes_as != "object" or isinstance(records, tuple):
        return parse_example_batch(records, spec, bytes_as=bytes_as)
    return _parse_example_py(records, spec)

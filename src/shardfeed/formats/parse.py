"""The batch parser the rest of shardfeed calls: the native one when it is built, the
pure-Python reference otherwise. Both give the same values and the same errors."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .example import parse_example as _parse_example_py
from .spec import FeatureSpec


def parse_batch(records: Sequence[bytes], spec: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Parse serialized Examples into columns (see :func:`shardfeed.parse_example`)."""
    return _parse_example_py(records, spec)

"""Progress bars for long work: tqdm on a terminal, nothing when output is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


class _NoBar:
    def __init__(self, iterable: Iterable | None = None):
        self._iterable = iterable

    def __iter__(self):
        return iter(self._iterable or ())

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", disable: bool = False) -> Any:
    """A tqdm bar on stderr (rate and ETA; bytes shown as KB/MB/GB), or a no-op when
    ``disable`` is set, stderr is not a terminal, or tqdm is not installed."""
    if disable or not sys.stderr.isatty():
        return _NoBar(iterable)
    try:
        from tqdm import tqdm  # noqa: PLC0415
    except ImportError:
        return _NoBar(iterable)
    return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit == "B",
                unit_divisor=1024 if unit == "B" else 1000, file=sys.stderr, dynamic_ncols=True)

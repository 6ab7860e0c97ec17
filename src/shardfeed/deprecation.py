"""Older spellings that still work, with a ``DeprecationWarning`` that names the new one.

:func:`renamed_argument` keeps a renamed keyword argument working: every reader's first
argument is ``source`` (what to read: URLs, a glob, a list, a ``WorkQueue``...), and a
call that passes the older keyword (``files=``, ``tables=``...) still runs, warning once
per call at the caller's line.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_deprecated(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the first caller outside shardfeed (the user's
    line), however many of shardfeed's own frames lie between."""
    level = 1
    frame: FrameType | None = sys._getframe(0)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)



def renamed_argument(old: str, new: str) -> Callable[[F], F]:
    """Decorate a function whose parameter ``new`` was called ``old``: ``old=`` given by
    keyword is passed on as ``new=`` with a ``DeprecationWarning``; ``TypeError`` when the
    call gives both (by keyword, or ``new`` by position)."""

    def decorate(fn: F) -> F:
        params = list(inspect.signature(fn).parameters)
        if new not in params:
            raise ValueError(f"{fn.__qualname__} has no parameter {new!r}")
        position = params.index(new)
        name = fn.__qualname__.replace(".__init__", "")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs or len(args) > position:
                    raise TypeError(f"{name}() got {new!r} and its older name {old!r}: give {new!r} only")
                warn_deprecated(f"{name}({old}=...) is now {name}({new}=...): the older name will be removed")
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


__all__ = ["renamed_argument", "warn_deprecated"]

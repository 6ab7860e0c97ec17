"""User functions at the pipeline's call sites: how to name one, and PEP 479's rule.

Every stage pulls from its parent with ``next()`` and takes ``StopIteration`` for the end
of the data. A user function (``map``'s, ``filter``'s predicate, ``interleave``'s, an
``on_error`` handler) runs inside that call, so a ``StopIteration`` leaking out of it (a
``next()`` on an exhausted iterator) would end the pass quietly, the records after it lost.
As Python does for a generator's body (PEP 479), each call site turns it into a
``RuntimeError`` naming the stage and the function, the ``StopIteration`` as its cause. The
``try`` costs nothing while nothing is raised (Python 3.11's zero-cost exceptions).
"""

from __future__ import annotations

import functools
from typing import Any


def describe(fn: Any) -> str:
    """A user callable's name as its author knows it: ``module.qualname`` for a function,
    ``Class.method`` of an object for a bound method, ``functools.partial(...)`` of one."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({describe(fn.func)}, ...)"
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:  # a callable object
        cls = type(fn)
        return f"{cls.__module__}.{cls.__qualname__} object"
    module = getattr(fn, "__module__", None)
    if owner is not None and not isinstance(owner, type) and type(owner).__module__ != "builtins":
        return f"{module}.{name} (bound to a {type(owner).__qualname__} object)"
    return f"{module}.{name}" if module else name


def stop_error(fn: Any, what: str, exc: StopIteration) -> RuntimeError:
    """What ``fn``'s ``StopIteration`` becomes: a ``RuntimeError`` saying ``what`` ran it
    (``"the map stage's function"``); raise it ``from exc``."""
    detail = f" ({exc})" if str(exc) else ""
    return RuntimeError(f"{what} {describe(fn)} raised StopIteration{detail}: a user function's StopIteration is "
                        "an error of that function, not the end of the data (PEP 479's rule for generators): look "
                        "for a next() on an exhausted iterator in it; to end the data early, use take() upstream")


__all__ = ["describe", "stop_error"]

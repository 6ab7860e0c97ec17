"""Which part of a chain does not pickle, named for the user who wrote it.

A chain goes to a spawned child (``in_subprocess``) by pickle. When it does not pickle,
pickle's own error names the innermost object it choked on, often the wrong culprit: a lock
a source drops in ``__getstate__`` looks unpicklable when tried alone. So the search walks
each object as pickle does (a dataset through its ``__getstate__``, a bound method through
its object, a ``functools.partial`` through its function and arguments) and reports the
stage, the user's function by its qualified name, and the innermost part that fails, why.
"""

from __future__ import annotations

import functools
import pickle
import types
from collections.abc import Iterator
from typing import Any

from .dataset import Dataset
from .policy import ErrorPolicy
from .userfn import describe

MAX_DEPTH = 8  # how deep inside one attribute the search looks for the part that fails

def check_picklable(ds: Dataset) -> None:
    """Raise ``TypeError`` naming the stage of ``ds``'s chain, the user function in it and
    the part of it that cannot be pickled to a spawned child: user functions must be
    top-level functions of an importable module (not lambdas or closures), and what they
    hold (a ``functools.partial``'s arguments, a bound method's object) must pickle too."""
    try:
        pickle.dumps(ds, protocol=pickle.HIGHEST_PROTOCOL)
        return
    except Exception as exc:  # noqa: BLE001 - any pickling failure is reported below
        first = exc
    where = unpicklable_part(ds)
    raise TypeError(f"in_subprocess: the chain above it must pickle to reach the spawned child, but "
                    f"{where or f'a stage does not ({type(first).__name__}: {first})'}. Give map/filter/interleave "
                    "top-level functions of an importable module (not lambdas, closures or functions defined in "
                    "__main__ of an interactive session), holding nothing that cannot travel to another process "
                    "(locks, open files, sockets, generators): open those in the function, in the child") from first


def unpicklable_part(ds: Any, depth: int = 0) -> str | None:
    """What in ``ds``'s chain does not pickle, in words, or None when every part does."""
    if depth > 100 or not isinstance(ds, Dataset):
        return None
    for attr, value in _state(ds):
        inner = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(v, Dataset) for v in inner):
            for v in inner:
                found = unpicklable_part(v, depth + 1)
                if found:
                    return found
            continue
        if _pickles(value) is None:
            continue
        return f"the {ds.kind} stage's {attr} ({value!r:.80}) does not: {_why(value)}"
    return None


def why_unpicklable(value: Any) -> str | None:
    """Why ``value`` (a user function) cannot be pickled, in words, or None when it can."""
    return None if _pickles(value) is None else _why(value)


def _why(value: Any) -> str:
    """Why ``value``, a stage's attribute, does not pickle."""
    who = describe(value) if callable(value) else "it"
    if isinstance(value, ErrorPolicy) and value.handler is not None:
        value = value.handler
        who = f"its on_error handler {describe(value)}"
    path, part, err = _innermost(value)
    name = getattr(part, "__qualname__", "")
    reason = f"({type(err).__name__}: {err})"
    if path == "" and "<lambda>" in name:
        return f"{who} is a lambda, which pickle cannot find by name in the child {reason}"
    if path == "" and "<locals>" in name:
        return f"{who} is defined inside a function, which pickle cannot find by name in the child {reason}"
    if path == "":
        return f"{who} cannot be pickled {reason}"
    return f"{who} cannot be pickled: its {path} ({part!r:.80}) does not {reason}"


def _innermost(value: Any, path: str = "", depth: int = 0) -> tuple[str, Any, BaseException]:
    """The deepest part of ``value`` (at ``path`` in it) that does not pickle, and its error."""
    err = _pickles(value)
    assert err is not None
    if depth < MAX_DEPTH:
        for sub, part in _parts(value):
            if _pickles(part) is not None:
                return _innermost(part, f"{path}.{sub}" if path and not sub.startswith("[") else f"{path}{sub}",
                                  depth + 1)
    return path, value, err


def _parts(value: Any) -> Iterator[tuple[str, Any]]:
    """The parts pickle would save of ``value``, by the name a user would give each."""
    if isinstance(value, functools.partial):
        yield "func", value.func
        for i, a in enumerate(value.args):
            yield f"args[{i}]", a
        for k, v in (value.keywords or {}).items():
            yield f"keywords[{k!r}]", v
    elif isinstance(value, types.MethodType):
        yield "__self__", value.__self__
    elif isinstance(value, ErrorPolicy):
        yield "handler", value.handler
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"[{k!r}]", v
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, v in enumerate(value):
            yield f"[{i}]", v
    elif not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        yield from _state(value)


def _state(obj: Any) -> list[tuple[str, Any]]:
    """``obj``'s attributes as pickle saves them (through ``__getstate__``), else none."""
    try:
        state = obj.__getstate__()
    except Exception:  # noqa: BLE001 - no state to look into
        return []
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        merged = dict(state[0] or {})
        merged.update(state[1] or {})
        state = merged
    return list(state.items()) if isinstance(state, dict) else []


def _pickles(value: Any) -> BaseException | None:
    """None when ``value`` pickles, else the error pickling it raised."""
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return exc
    return None


__all__ = ["check_picklable", "unpicklable_part", "why_unpicklable"]

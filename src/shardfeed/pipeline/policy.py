"""One error policy for reading, parsing and ``map``: ``on_error``.

``on_error`` is ``"raise"`` (the default: the first error stops the pass), ``"skip"``
(the bad frame, record or element is dropped, counted and logged, and the pass goes on)
or a callable ``handler(exc, context) -> None`` that decides per error, as webdataset's
handlers do: it returns to skip (the error is then counted like ``"skip"``'s) and raises
(``exc`` itself or another exception) to stop the pass. ``context`` is a dict naming where
the error happened: ``stage`` (``"read"``, ``"parse"`` or ``"map"``), and as far as they
are known ``url``, ``offset`` (of the frame, in the uncompressed stream), ``record_index``
(in its batch) and ``element`` (the input's position in the stage).

Every skipped error of one pass is counted in ``stats()`` (``skipped``: totals by stage
and the first :data:`MAX_EXAMPLES` with where they happened).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import warn_skipped
from ..storage.urls import mask
from .userfn import stop_error

logger = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")
MAX_EXAMPLES = 100

ErrorHandler = Callable[[BaseException, Mapping[str, Any]], None]


class ErrorPolicy:
    """``on_error`` checked: ``mode`` is ``"raise"``, ``"skip"`` or ``"call"``."""

    __slots__ = ("mode", "handler")

    def __init__(self, on_error: "str | ErrorHandler | ErrorPolicy" = "raise") -> None:
        if isinstance(on_error, ErrorPolicy):
            self.mode, self.handler = on_error.mode, on_error.handler
        elif isinstance(on_error, str) and on_error in ON_ERROR:
            self.mode, self.handler = on_error, None
        elif callable(on_error):
            self.mode, self.handler = "call", on_error
        else:
            raise ValueError(f"on_error must be 'raise', 'skip' or a callable(exc, context), got {on_error!r}")

    @property
    def raises(self) -> bool:
        return self.mode == "raise"

    @property
    def framing(self) -> str:
        """What the TFRecord framing readers are told (``on_corrupt``)."""
        return "raise" if self.mode == "raise" else "skip"

    def handle(self, exc: BaseException, context: Mapping[str, Any], log: "ErrorLog | None",
               logged: bool = False) -> None:
        """Decide about one error: raise it (``"raise"``, or a handler that raises), or
        count it in ``log`` as skipped and return."""
        if self.mode == "raise":
            raise exc
        if self.handler is not None:
            try:
                self.handler(exc, dict(context))
            except StopIteration as stop:  # the handler's error, not the end of the data (userfn.py)
                raise stop_error(self.handler, f"the {context.get('stage', '?')} stage's on_error handler",
                                 stop) from stop
        if log is not None:
            log.add(exc, context, logged)

    def __reduce__(self):
        return (ErrorPolicy, (self.handler if self.mode == "call" else self.mode,))

    def __repr__(self) -> str:
        return f"ErrorPolicy({self.handler!r})" if self.mode == "call" else f"ErrorPolicy({self.mode!r})"


def on_error_from(on_error: Any, on_corrupt: str | None) -> ErrorPolicy:
    """The policy of a reader given ``on_error`` and the older ``on_corrupt`` (framing
    only): ``on_error`` wins when given; the two must not disagree."""
    if on_error is None:
        return ErrorPolicy(on_corrupt or "raise")
    policy = ErrorPolicy(on_error)
    if on_corrupt not in (None, "raise") and policy.framing != on_corrupt:
        raise ValueError(f"on_corrupt={on_corrupt!r} and on_error={on_error!r} disagree: give on_error only")
    return policy


class ErrorLog:
    """The errors one pass skipped: counted by stage; the first :data:`MAX_EXAMPLES`
    kept with where they happened. Thread-safe."""

    def __init__(self) -> None:
        self.by_stage: collections.Counter = collections.Counter()
        self.examples: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return sum(self.by_stage.values())

    def add(self, exc: BaseException, context: Mapping[str, Any], logged: bool = False) -> None:
        """Count ``exc`` as skipped where ``context`` says; ``logged``: the reader that
        skipped it has logged it already."""
        stage = context.get("stage", "?")
        entry = {k: (mask(v) if k == "url" and isinstance(v, str) else v) for k, v in context.items()
                 if v is not None}
        entry["error"] = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.by_stage[stage] += 1
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append(entry)
        if not logged:
            warn_skipped(logger, "skipped (%s): %s", ", ".join(f"{k}={v}" for k, v in entry.items() if k != "error"),
                           entry["error"])

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"total": self.total, "by_stage": dict(self.by_stage), "examples": list(self.examples)}


__all__ = ["ErrorPolicy", "ErrorLog", "ErrorHandler", "on_error_from", "ON_ERROR", "MAX_EXAMPLES"]

"""Parts of a node's state made only when the state is asked for.

A node hands a state with every element it delivers, and few of them are ever kept: a part
that costs real work to make (a fused shuffle's buffered-record offsets) is a
:class:`DeferredState` snapshot, made into its JSON-able form by :func:`materialize` when
``PipelineIterator.get_state`` is called.
"""

from __future__ import annotations

from typing import Any


class DeferredState:
    """A part of a node's state made only when the state is asked for (a node hands a state
    with every element; few are kept): :meth:`value` gives its JSON-able form, or None to leave
    the key out. ``PipelineIterator.get_state`` makes them (:func:`materialize`)."""

    __slots__ = ()

    def value(self) -> Any:
        raise NotImplementedError

    def fallback(self) -> Any:
        """What stands in for it where it is not made (``materialize(make=False)``): None
        leaves the key out."""
        return None


def materialize(state: Any, make: bool = True) -> Any:
    """``state`` with each :class:`DeferredState` in it made (keys whose value is None left
    out), or with each replaced by its ``fallback()`` (``make=False``: a state sent to another
    process with every element, where making it each time would cost what deferring saves);
    the same object when it holds none."""
    if isinstance(state, dict):
        out = None
        for k, v in state.items():
            m = materialize(v, make)
            if m is not v:
                if out is None:
                    out = dict(state)
                if isinstance(v, DeferredState) and m is None:
                    del out[k]
                else:
                    out[k] = m
        return state if out is None else out
    if isinstance(state, list):
        items = [materialize(v, make) for v in state]
        return state if all(a is b for a, b in zip(items, state)) else items
    if isinstance(state, DeferredState):
        return state.value() if make else state.fallback()
    return state


class ReadPosition(DeferredState):
    """A part of a node's state that says where its parent *read* to, not what reached the
    consumer (a shuffle buffer's upstream over a work queue): saved as the state it wraps,
    but not taken for a delivered position by what acts on delivery (a queue's
    acknowledgements look into the pass's state and skip it)."""

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state

    def value(self) -> Any:
        return materialize(self.state)

    def fallback(self) -> Any:
        return materialize(self.state, make=False)

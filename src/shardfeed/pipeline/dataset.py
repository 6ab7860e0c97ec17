"""The base of every pipeline: an immutable description that makes iterators."""

from __future__ import annotations

from typing import Any, Iterator


class Dataset:
    """A re-iterable description of a stream of elements.

    A ``Dataset`` holds no iteration state: each ``iter(ds)`` starts a fresh pass, so the
    same object can be iterated many times (one pass per epoch) and shared between threads.
    Subclasses implement :meth:`__iter__`.
    """

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    def take(self, count: int) -> list[Any]:
        """The first ``count`` elements, as a list (a convenience for inspection)."""
        out = []
        if count <= 0:
            return out
        it = iter(self)
        try:
            for element in it:
                out.append(element)
                if len(out) >= count:
                    break
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        return out

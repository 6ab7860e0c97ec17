"""Pipeline sources, and the interface other layers (tables, work queues) plug into.

A source is a :class:`SourceDataset` whose :meth:`~SourceDataset.open` returns a
:class:`SourceReader`: an iterator with ``get_state()`` (a small dict, a cursor) and
``close()``, reopened from such a state to resume. Random-access objects (``len`` and
``[i]``) become sources through :func:`from_list`; any re-iterable through
:func:`from_iterable` (resumed by replaying its prefix).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from .dataset import Dataset
from .node import Build, Node


class SourceReader(Protocol):
    """What :meth:`SourceDataset.open` returns."""

    bytes_read: int

    def __next__(self) -> Any: ...

    def get_state(self) -> dict:
        """The reader's position: a small dict that ``SourceDataset.open(state, raw)`` resumes from."""

    def close(self) -> None:
        """Release the reader's files and threads; a second call does nothing."""


class SourceDataset(Dataset):
    """Base class of sources: implement :meth:`open` (and ``kind`` for statistics).

    ``open(state, raw)`` starts reading at ``state`` (``None``: the beginning); ``raw`` is
    true when the consumer accepts serialized records instead of parsed ones (see
    :meth:`Dataset._deferred_spec`); sources without a spec ignore it.
    """

    kind = "source"

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> SourceReader:
        """Start reading at ``state`` (``None``: the beginning) and return the reader;
        ``raw``: the consumer accepts serialized records instead of parsed ones."""
        raise NotImplementedError

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return SourceNode(b, self, self.open(state, b.raw))


class SourceNode(Node):
    """Adapts a :class:`SourceReader` to the node contract and counts its bytes."""

    def __init__(self, b: Build, ds: Dataset, reader: SourceReader) -> None:
        super().__init__(b, ds)
        self.reader = reader
        self._bytes = 0
        b.ctx.on_close(self.close)

    def _next(self) -> Any:
        x = next(self.reader)
        n = getattr(self.reader, "bytes_read", 0)
        if n != self._bytes:
            self.stats.bytes += n - self._bytes
            self._bytes = n
        return x

    def get_state(self) -> dict:
        return self.reader.get_state()

    def close(self) -> None:
        close = getattr(self.reader, "close", None)
        if close is not None:
            close()


# -- in-memory sources -------------------------------------------------------------------
class _ListReader:
    bytes_read = 0

    def __init__(self, items: Any, state: Mapping[str, Any] | None) -> None:
        self.items = items
        self.i = int(state["i"]) if state else 0

    def __next__(self) -> Any:
        i = self.i
        if i >= len(self.items):
            raise StopIteration
        self.i = i + 1
        return self.items[i]

    def get_state(self) -> dict:
        return {"i": self.i}

    def close(self) -> None:
        pass


class ListDataset(SourceDataset):
    """The items of a random-access object (``len`` and ``[i]``), in order."""

    kind = "from_list"

    def __init__(self, items: Any) -> None:
        if not (hasattr(items, "__len__") and hasattr(items, "__getitem__")):
            raise TypeError(f"from_list needs an object with len() and [i], got {type(items).__name__}; "
                            "use from_iterable for iterators and generators")
        self.items = items

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _ListReader:
        return _ListReader(self.items, state)

    def cardinality(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"from_list({len(self.items)} items)"


class _ReplayReader:
    """Reads a fresh iterator; resumes by skipping the ``i`` elements already delivered."""

    bytes_read = 0

    def __init__(self, make: Callable[[], Iterator[Any]], state: Mapping[str, Any] | None) -> None:
        self.it = iter(make())
        self.i = 0
        for _ in range(int(state["i"]) if state else 0):
            next(self.it)
            self.i += 1

    def __next__(self) -> Any:
        x = next(self.it)
        self.i += 1
        return x

    def get_state(self) -> dict:
        return {"i": self.i}

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()


class IterableDataset(SourceDataset):
    """The elements of a re-iterable object, or of the iterator a callable returns."""

    kind = "from_iterable"

    def __init__(self, source: Iterable[Any] | Callable[[], Iterable[Any]]) -> None:
        if isinstance(source, Iterator):
            raise TypeError("from_iterable needs something that can be iterated again for every pass "
                            "(a list, a range, or a zero-argument function returning an iterator), "
                            "got a one-shot iterator; wrap it: from_iterable(lambda: make_iterator())")
        if not callable(source) and not isinstance(source, Iterable):
            raise TypeError(f"from_iterable needs an iterable or a callable, got {type(source).__name__}")
        self.source = source

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _ReplayReader:
        src = self.source
        return _ReplayReader(src if callable(src) and not isinstance(src, Iterable) else (lambda: iter(src)), state)


class IterableNode(SourceNode):
    """For ``Dataset`` subclasses that implement only ``__iter__``."""

    def __init__(self, b: Build, ds: Dataset, make: Callable[[], Iterator[Any]], state: Mapping[str, Any] | None):
        super().__init__(b, ds, _ReplayReader(make, state))


def from_list(items: Any) -> ListDataset:
    """A dataset of the items of a list (or anything with ``len`` and ``[i]``), in order;
    resumes by index."""
    return ListDataset(items)


def from_iterable(source: Iterable[Any] | Callable[[], Iterable[Any]]) -> IterableDataset:
    """A dataset of the elements of a re-iterable object (each pass iterates it again), or
    of what a zero-argument callable returns. Resumes by replaying the prefix. Raises
    ``TypeError`` for a one-shot iterator (it cannot make a second pass)."""
    return IterableDataset(source)

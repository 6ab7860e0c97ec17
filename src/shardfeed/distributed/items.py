"""Work items: a whole file or table, or a range of its records or rows.

Items are plain JSON (never pickled): ``{"work": url, "kind": "file"|"records"|"rows",
"start": int|None, "stop": int|None}``. A file becomes record ranges through its index
file (``<file>.idx``, one ``offset length`` line per record, see
:func:`shardfeed.build_index`); a table becomes row ranges through its row count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..formats.index import index_url_of, load_index
from ..pipeline.ranges import split_ranges
from ..storage.urls import mask
from ..tables.urls import is_table_url

logger = logging.getLogger(__name__)

RowCounter = Callable[[str], int]


@dataclass(frozen=True)
class WorkItem:
    """One unit of work: ``work`` (a URL) whole, or records/rows ``start..stop-1`` of it.

    ``str(item)`` is the work URL (what PAI's ``WorkQueue.take()`` returned). Items a
    :class:`~shardfeed.WorkQueue` hands out also carry ``id`` (``"epoch:index"``),
    ``epoch``, ``index`` (position in the item list) and ``token`` (the lease; an
    acknowledgement must show it).
    """

    work: str
    kind: str = "file"
    start: int | None = None
    stop: int | None = None
    offset: int | None = None
    end: int | None = None
    id: str = ""
    epoch: int = 0
    index: int = 0
    token: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return self.work

    @property
    def size(self) -> int | None:
        """Records or rows in a range item; ``None`` for a whole file."""
        return None if self.start is None or self.stop is None else self.stop - self.start

    def to_json(self) -> dict:
        d: dict[str, Any] = {"work": self.work, "kind": self.kind}
        if self.start is not None:
            d["start"], d["stop"] = self.start, self.stop
        if self.offset is not None:
            d["offset"] = self.offset
        if self.end is not None:
            d["end"] = self.end
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], **extra: Any) -> "WorkItem":
        if not isinstance(d, Mapping) or not isinstance(d.get("work"), str):
            raise ValueError(f"not a work item: {d!r:.200}")
        start, stop, off, end = d.get("start"), d.get("stop"), d.get("offset"), d.get("end")
        return cls(d["work"], str(d.get("kind", "file")), None if start is None else int(start),
                   None if stop is None else int(stop), None if off is None else int(off),
                   None if end is None else int(end), **extra)


def apply_prefix(works: Iterable[Any], prefix: str | None) -> list[str]:
    """The works as strings, each with ``prefix`` in front (PAI's ``prefix``)."""
    if isinstance(works, (str, bytes)):
        raise TypeError("works must be a list of file or table URLs, not one string; wrap it: [url]")
    out = []
    for w in works:
        w = w.decode() if isinstance(w, bytes) else str(w)
        out.append((prefix or "") + w)
    if not out:
        raise ValueError("works is empty: give at least one file or table URL")
    return out


def digest(obj: Any) -> str:
    """A short stable digest of a JSON-able object (sha256, 16 hex digits)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def count_records(url: str, storage_options: Mapping[str, Any] | None = None, scan: bool = False) -> int:
    """Records in a TFRecord file: from its index file, or (``scan=True``) by reading it.

    Raises ``ValueError`` saying how to build the index when there is none and
    ``scan`` is false.
    """
    index = load_index(url, storage_options)
    if index is not None:
        return len(index)
    if not scan:
        beside = index_url_of(url)
        where = mask(beside) if beside else "none can lie beside a signed URL"
        raise ValueError(f"{mask(url)} has no index file ({where}); splitting a file into "
                         "record ranges needs one: run `shardfeed index FILES` or sf.build_index(url)")
    from ..formats.chunks import iter_frame_chunks  # noqa: PLC0415

    return sum(c.count for c in iter_frame_chunks(url, storage_options=storage_options))


def count_units(url: str, row_counter: RowCounter | None = None, storage_options: Mapping[str, Any] | None = None,
                scan: bool = False) -> int:
    """Rows of a table (through ``row_counter``, else ``shardfeed.tables.count_rows``) or
    records of a file (see :func:`count_records`)."""
    if is_table_url(url):
        return _count_rows(url, row_counter)
    return count_records(url, storage_options, scan)


def _count_rows(url: str, row_counter: RowCounter | None) -> int:
    if row_counter is None:
        try:
            from ..tables import count_rows as row_counter  # type: ignore[no-redef]  # noqa: PLC0415
        except ImportError:
            raise ValueError(f"{mask(url)} is a table: splitting it into row ranges needs its row count; "
                             "pass row_counts={url: rows} or a function url -> rows") from None
    return int(row_counter(url))


class Units:
    """Sizes (records or rows) of works, with the record offsets needed to cut ranges."""

    def __init__(self, row_counter: RowCounter | None, storage_options: Mapping[str, Any] | None) -> None:
        self.row_counter = row_counter
        self.storage_options = storage_options
        self.index: dict[str, Any] = {}

    def size(self, url: str) -> int:
        if is_table_url(url):
            return _count_rows(url, self.row_counter)
        if url not in self.index:
            self.index[url] = load_index(url, self.storage_options)
            if self.index[url] is None:
                count_records(url, self.storage_options)  # raises, naming the missing index
        return len(self.index[url])

    def item(self, url: str, start: int, stop: int) -> WorkItem:
        if is_table_url(url):
            return WorkItem(url, "rows", start, stop)
        index = self.index[url]
        offset = int(index[start, 0]) if start < len(index) else None
        end = int(index[stop - 1, 0] + index[stop - 1, 1]) if 0 < stop <= len(index) else None
        return WorkItem(url, "records", start, stop, offset, end)


def row_counter_of(row_counts: Mapping[str, int] | RowCounter | None) -> RowCounter | None:
    if row_counts is None or callable(row_counts):
        return row_counts  # type: ignore[return-value]
    if isinstance(row_counts, Mapping):
        counts = dict(row_counts)

        def lookup(url: str) -> int:
            if url not in counts:
                raise ValueError(f"row_counts has no entry for {mask(url)}")
            return int(counts[url])
        return lookup
    raise TypeError(f"row_counts must be a dict url -> rows or a function, got {type(row_counts).__name__}")


def make_items(works: Sequence[str], num_slices: int | None, row_counter: RowCounter | None = None,
               storage_options: Mapping[str, Any] | None = None) -> list[WorkItem]:
    """The item list of a queue: one item per work when ``num_slices`` is ``None`` or not
    more than the works; otherwise each work split into record/row ranges, about
    ``num_slices`` items in all, each work's share proportional to its size."""
    if num_slices is None or num_slices <= len(works):
        return [WorkItem(w, "rows" if is_table_url(w) else "file") for w in works]
    units = Units(row_counter, storage_options)
    sizes = [units.size(w) for w in works]
    total = sum(sizes)
    if total == 0:
        return [WorkItem(w, "rows" if is_table_url(w) else "file") for w in works]
    per = total / num_slices
    items = []
    for w, n in zip(works, sizes):
        if n == 0:
            continue  # an empty file yields nothing; no item needed
        for a, b in split_ranges(n, max(1, math.floor(n / per + 0.5))):
            items.append(units.item(w, a, b))
    return items

"""Spans and the providers that yield them: the seam every record read goes through.

A :class:`Span` is a piece of one file: the whole file, or the frames between two byte
offsets (a record range, cut through the file's index). A **provider** yields the spans
of one pass, in order: a static list (:class:`StaticSpans`), a rank's share of one
(:func:`split_spans`), or, from the distributed layer, what a worker takes off a
``WorkQueue``. The TFRecord source (:mod:`shardfeed.pipeline.records`) reads whatever
spans its provider gives; splitting work among readers happens here, on spans, so that
every reader fetches only its share of the bytes.

The provider protocol lives in this layer and the distributed layer implements it, so the
pipeline never imports the distributed layer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..formats.index import StaleIndexError, load_index, local_stamp
from ..formats.tfrecord import ReadStats, normalize_compression
from ..storage import size
from ..storage.urls import mask, parse_url
from .identity import check_state, identity, spans_digest, state_url
from .ranges import slice_range

try:
    from .._native import plan_window as _native_plan_window  # type: ignore[attr-defined]
except ImportError:  # the native core is not built: numpy
    _native_plan_window = None

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Span:
    """Frames of ``url`` from byte ``offset`` up to byte ``end`` (``None``: the end of the
    file). ``start``/``stop`` are the record numbers of the range when it was cut through
    an index (for messages and counting); ``handle`` is the provider's own object for the
    span (a queue item), passed back to it when the span is done."""

    url: str
    offset: int = 0
    end: int | None = None
    start: int | None = None
    stop: int | None = None
    handle: Any = field(default=None, compare=False, repr=False)

    @property
    def records(self) -> int | None:
        """Records in a range cut through an index; ``None`` for a whole file."""
        return None if self.start is None or self.stop is None else self.stop - self.start

    def key(self) -> list:
        """What identifies the span in a saved state (JSON): its URL keyed by
        :func:`~shardfeed.pipeline.identity.state_url` (no signature), its bytes."""
        return [state_url(self.url), self.offset, self.end]


@runtime_checkable
class SpanStream(Protocol):
    """One pass of a provider."""

    def next_span(self, block: bool = True) -> Span | None:
        """The next span, or ``None`` when the pass has no more. With ``block=False``,
        ``None`` may also mean "none at once" (a queue whose other items are leased)."""

    def get_state(self) -> Any:
        """A JSON-able state from which ``open`` yields first the span that ``next_span``
        would return now (or, for a provider whose backend is its own checkpoint, whatever
        that backend hands out next). The source takes it just before each ``next_span``."""

    def finish(self, span: Span) -> None:
        """Every record of ``span`` was read into the pipeline (acknowledge it)."""

    def keep(self, span: Span) -> bool:
        """Called while ``span`` is read; ``False`` stops reading it at once (its work was
        given to another reader, say)."""

    def close(self) -> None:
        """The pass ends; give back spans taken and not finished."""


@runtime_checkable
class SpanProvider(Protocol):
    """Yields the spans of every pass (``epoch`` is the pass's repetition path)."""

    def open(self, state: Any, epoch: tuple) -> SpanStream: ...


class _OwnStream:
    """A stream whose provider keeps no record of spans handed out: nothing to finish,
    keep or give back."""

    def finish(self, span: Span) -> None:
        pass

    def keep(self, span: Span) -> bool:
        return True

    def close(self) -> None:
        pass


class _ListStream(_OwnStream):
    def __init__(self, spans: Sequence[Span], state: Any, ident: Mapping[str, Any] | None = None) -> None:
        self.spans = spans
        self.i = int(state["i"]) if state else 0
        self.ident = dict(ident or {})  # what the state depends on (pipeline.identity), saved with it

    def next_span(self, block: bool = True) -> Span | None:
        if self.i >= len(self.spans):
            return None
        self.i += 1
        return self.spans[self.i - 1]

    def get_state(self) -> dict:
        return {"i": self.i, **self.ident}


class StaticSpans:
    """A fixed list of spans, the same every pass; the state is one index. ``counts``
    (``{url: records}``, from a conversion manifest, say) gives the record count of whole
    files whose count is known without an index file."""

    replayable = True
    """Reopening at a saved state yields the same spans again (a queue's does not)."""

    def __init__(self, spans: Sequence[Span], counts: Mapping[str, int] | None = None, *,
                 _slice: Sequence[Sequence[int]] = (), _files: str | None = None) -> None:
        self.spans = list(spans)
        self.counts = dict(counts or {})
        self._slice = [list(p) for p in _slice]  # the splits that made this share, [[index, count], ...]
        self._files = _files  # the digest of the spans before any split (made when first needed)

    def identity(self) -> dict[str, Any]:
        """What a state of this provider depends on: the spans before any split, and
        which share of them this is."""
        if self._files is None:
            self._files = spans_digest([s.key() for s in self.spans])
        return identity(self._files, self._slice)

    def open(self, state: Any, epoch: tuple) -> _ListStream:
        ident = self.identity()
        if state:
            check_state(state, ident)
        return _ListStream(self.spans, state, ident)

    def split(self, index: int, count: int, storage_options: Mapping[str, Any] | None = None,
              compression: str | None = "auto", cache: Any = None, on_corrupt: str = "raise") -> "StaticSpans":
        """This reader's share (see :func:`split_spans`)."""
        files = self.identity()["files"]
        chain = self._slice + ([[index, count]] if count != 1 else [])
        return StaticSpans(split_spans(self.spans, index, count, storage_options, compression, cache, on_corrupt),
                           self.counts, _slice=chain, _files=files)

    def record_count(self, storage_options: Mapping[str, Any] | None = None, compression: str | None = "auto",
                     cache: Any = None) -> int | None:
        """Records of one pass when known without reading a file (see :func:`span_records`)."""
        return _total(self.spans, storage_options, compression, cache, self.counts)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.spans]

    def __repr__(self) -> str:
        return f"StaticSpans({len(self.spans)} spans)"


def span_records(s: Span, storage_options: Mapping[str, Any] | None = None, compression: str | None = "auto",
                 cache: Any = None, counts: Mapping[str, int] | None = None) -> int | None:
    """Records in ``s`` when known without reading the file: a record range's own count,
    a whole file's count in ``counts``, or the count its index file gives (never built
    here); ``None`` otherwise (a compressed file without a known count, say)."""
    if s.records is not None:
        return s.records
    if counts and _whole(s) and s.url in counts:
        return int(counts[s.url])
    if normalize_compression(compression, s.url) is not None:
        return None
    try:
        idx = load_index(s.url, storage_options, build=False, cache=cache)
    except StaleIndexError as exc:  # rebuilt by whatever reads through it; the count is not known now
        logger.warning("%s", exc)
        return None
    if idx is None:
        return None
    a = _record_at(idx, s.offset) if s.offset else 0
    return (len(idx) if s.end is None else _record_at(idx, s.end)) - a


def _total(spans: Sequence[Span], storage_options: Mapping[str, Any] | None, compression: str | None, cache: Any,
           counts: Mapping[str, int] | None = None) -> int | None:
    total = 0
    for s in spans:
        n = span_records(s, storage_options, compression, cache, counts)
        if n is None:
            return None
        total += n
    return total


def file_spans(urls: Sequence[str]) -> list[Span]:
    """One whole-file span per URL."""
    return [Span(u) for u in urls]


def range_spans(url: str, index: Any, start: int, stop: int) -> list[Span]:
    """The span of records ``start..stop-1`` of ``url`` through its index (none when empty)."""
    if start >= stop:
        return []
    return [Span(url, int(index[start, 0]), int(index[stop - 1, 0] + index[stop - 1, 1]), start, stop)]


def _whole(s: Span) -> bool:
    return s.offset == 0 and s.end is None


BALANCE_CHECK_MAX_FILES = 4096
"""Up to this many files, a split by whole files is checked for balance by the files' sizes."""


def split_spans(spans: Sequence[Span], index: int, count: int,
                storage_options: Mapping[str, Any] | None = None, compression: str | None = "auto",
                cache: Any = None, on_corrupt: str = "raise") -> list[Span]:
    """Reader ``index`` of ``count``'s share of ``spans``: every record in exactly one
    share, and each reader's share is only its own bytes. Deterministic: every reader
    computes the same plan without talking to the others.

    - Whole files, round robin (reader ``r`` gets spans ``r, r+count, ...``), when that
      gives every reader about the same bytes (within 10%, by the files' sizes; not
      checked beyond 4,096 files), or when some file lacks an index file and there are at
      least ``count`` files (no file is read just to plan; a warning names the imbalance).
    - Otherwise contiguous record ranges of the sequence of all records, sizes differing by
      at most one, cut through the files' index files; a missing index is built by
      scanning the file once and saved beside it (or in the index cache when the storage
      is read-only), so later readers and passes find it. With a ``cache`` (an
      :class:`~shardfeed.storage.cache.ObjectCache`) remote index files are read through it.

    Compressed files cannot be cut into record ranges: ``ValueError`` when that is needed.
    With ``on_corrupt="skip"`` a missing index is built skipping a damaged file's corrupt
    frames (kept in memory, never saved), and each range reaches to where the next begins
    (the last to the file's end), so every damaged byte is in one reader's range, which
    skips and counts it as a sequential reader would.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of readers must be a positive int, got {count!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"reader index must be an int in [0, {count}), got {index!r}")
    spans = list(spans)
    if count == 1:
        return spans
    n = len(spans)
    sizes: dict[str, int] = {}  # file sizes the balance check stated: the index checks reuse them
    balanced = n % count == 0 and (n > BALANCE_CHECK_MAX_FILES or _balanced(spans, count, storage_options, sizes))
    if balanced:
        return spans[index::count]
    compressed = [s.url for s in spans if normalize_compression(compression, s.url) is not None]
    whole = [s for s in spans if _whole(s)]
    indexes: dict[str, Any] = {}  # loaded once, for the decision and for the ranges
    have_index = not compressed
    for s in whole if have_index else ():
        try:
            idx = indexes[s.url] if s.url in indexes else load_index(s.url, storage_options, cache=cache,
                                                                     size=sizes.get(s.url))
        except StaleIndexError:  # as good as missing: rebuilt below when record ranges are needed
            idx = None
        if idx is None:
            have_index = False
            break
        indexes[s.url] = idx
    if n >= count and not have_index:
        if n % count or n <= BALANCE_CHECK_MAX_FILES:
            logger.warning("%d files split among %d readers by whole files: shares differ in size (build index "
                           "files with `shardfeed index FILES` for shares equal to one record, or use "
                           "read_shard(..., equal_steps='pad'|'min') for collective training)", n, count)
        return spans[index::count]
    if compressed:
        raise ValueError(f"{len(spans)} file(s) among {count} readers needs record ranges, but "
                         f"{mask(compressed[0])} is compressed (there is no index into a compressed stream): "
                         "give at least as many files as readers, or decompress the files")
    if whole and not have_index:
        logger.warning("splitting %d file(s) among %d readers needs record ranges: building index files where "
                       "missing (one scan per file; run `shardfeed index FILES` once to skip this)", n, count)
    return _split_records(spans, index, count, storage_options, indexes, cache, sizes, on_corrupt == "skip")


def _span_bytes(s: Span, storage_options: Mapping[str, Any] | None, sizes: dict[str, int]) -> int:
    if s.end is not None:
        return max(0, s.end - s.offset)
    n = sizes[s.url] = sizes[s.url] if s.url in sizes else size(s.url, storage_options)
    return max(0, n - s.offset)


def _balanced(spans: list[Span], count: int, storage_options: Mapping[str, Any] | None,
              sizes: dict[str, int]) -> bool:
    """Whether dealing the spans round robin gives every reader its share within 10%
    (``sizes`` gets the sizes of the files it stated)."""
    shares = [0] * count
    for k, s in enumerate(spans):
        shares[k % count] += _span_bytes(s, storage_options, sizes)
    mean = sum(shares) / count
    return mean == 0 or max(shares) <= 1.1 * mean


def _split_records(spans: list[Span], index: int, count: int, storage_options: Mapping[str, Any] | None,
                   indexes: dict[str, Any], cache: Any = None, sizes: Mapping[str, int] | None = None,
                   skip: bool = False) -> list[Span]:
    sized: list[tuple[Span, Any, int, int]] = []  # span, index, first record, stop
    for s in spans:
        idx = indexes.get(s.url)
        if idx is None:
            idx = indexes[s.url] = load_index(s.url, storage_options, build=True, cache=cache,
                                              size=(sizes or {}).get(s.url), damage=ReadStats() if skip else None)
        if s.start is not None and s.stop is not None:
            a, b = s.start, s.stop
        else:
            a = int(_record_at(idx, s.offset)) if s.offset else 0
            b = len(idx) if s.end is None else int(_record_at(idx, s.end))
        sized.append((s, idx, a, b))
    total = sum(b - a for _, _, a, b in sized)
    lo, hi = slice_range(total, index, count)
    out: list[Span] = []
    base = 0
    for s, idx, a, b in sized:
        size = b - a
        x, y = max(lo, base), min(hi, base + size)
        if x < y and not skip:
            out += range_spans(s.url, idx, a + x - base, a + y - base)
        elif x < y:  # to where the next range begins: the damage between two is the first's to count
            start, stop = a + x - base, a + y - base
            end = int(idx[stop, 0]) if stop < len(idx) else s.end
            out.append(Span(s.url, int(idx[start, 0]), end, start, stop))
        base += size
    return out


def _record_at(index: Any, offset: int) -> int:
    """The number of the first record whose frame starts at or after byte ``offset``."""
    import numpy as np  # noqa: PLC0415

    return int(np.searchsorted(index[:, 0], offset, side="left"))


# -- shuffled orders -----------------------------------------------------------------------------
SHUFFLES = (None, "files", "blocks", "global")
DEFAULT_BLOCK_BYTES = 4 << 20
"""``shuffle="blocks"`` with ``block_size=None`` cuts each file into blocks of about this
many bytes: on object storage a block is then one ranged GET of a whole part (parts are at
most 4 MiB under the default read-ahead budget), and a block of small records is not a
ranged read too small to pay for its round trip, nor a block of large records hundreds
of megabytes. Cut through the file's index (record offsets), never from a measurement,
so the order is the same on every run, link and machine."""
DEFAULT_WINDOW = 2048
"""Positions a ``shuffle="global"`` window gathers at once when ``block_size`` is ``None``
(the window groups reads; the order does not depend on it)."""
def blocks_rule(block_size: int | None) -> str:
    """The block cut as it goes into a saved state: ``"records:N"`` or ``"bytes:N"``."""
    return f"bytes:{DEFAULT_BLOCK_BYTES}" if block_size is None else f"records:{int(block_size)}"


INDEX_LOADS_AT_ONCE = 16
"""Remote index files fetched (or built) at once: each is a few round trips, and a
shuffled pass waits for all of them before its first record."""


def open_pass(provider: SpanProvider, state: Any, epoch: tuple, counters: Any, cache: Any = None,
              seen: set | None = None) -> SpanStream:
    """``provider.open(state, epoch)`` for one pass whose reads are counted in ``counters``
    (an :class:`~shardfeed.storage.IOCounters`), through ``cache`` (its view of the object
    cache) with ``seen`` (the cached objects it counted): a provider that loads index files
    for the pass (:meth:`ShuffledSpans.open_counted`) counts them there too."""
    opener = getattr(provider, "open_counted", None)
    return opener(state, epoch, counters, cache, seen) if opener is not None else provider.open(state, epoch)


def _each(fn: Any, urls: Sequence[str]) -> dict[str, Any]:
    """``{url: fn(url)}`` for the distinct ``urls``; remote ones several at once (each is a
    few round trips). The error of the first URL in order that failed is raised."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    distinct = list(dict.fromkeys(urls))
    if sum(1 for u in distinct if not parse_url(u).is_local) < 2:
        return {u: fn(u) for u in distinct}
    with ThreadPoolExecutor(min(INDEX_LOADS_AT_ONCE, len(distinct)), thread_name_prefix="shardfeed-index") as pool:
        futures = [pool.submit(fn, u) for u in distinct]
        return {u: f.result() for u, f in zip(distinct, futures)}


def load_indexes(urls: Sequence[str], storage_options: Mapping[str, Any] | None, cache: Any,
                 wrap: Any = None, counters: Any = None, seen: set | None = None,
                 damage: dict | None = None) -> dict[str, np.ndarray]:
    """The index of each of ``urls`` (built when missing), ``{url: index}``; remote ones
    several at once. ``wrap(url, exc)``, when given, turns a storage error into the one
    raised; what the loads fetch is counted in ``counters`` (the pass's; ``seen``: the
    cached objects it counted, see :func:`~shardfeed.formats.index.load_index`).
    ``damage`` (``{url: ReadStats}``): a shard found corrupt while its index is built is
    skipped past and its damage put there (see :func:`load_damaged`); without it, raised."""

    def one(url: str) -> np.ndarray:
        try:
            if damage is not None:
                return load_damaged(url, storage_options, damage, cache=cache, counters=counters, seen=seen)
            return np.asarray(load_index(url, storage_options, build=True, cache=cache, counters=counters,
                                         seen=seen))
        except (PermissionError, OSError) as exc:
            if wrap is None:
                raise
            raise wrap(url, exc) from None

    return _each(one, urls)


def load_damaged(url: str, storage_options: Mapping[str, Any] | None, damage: dict, **kw: Any) -> np.ndarray:
    """``url``'s index, built when missing by a scan that skips corrupt frames (for a
    reader whose ``on_corrupt`` policy skips); the frames skipped go to ``damage[url]``
    as ``(ReadStats, index)``, for the passes to report (``_GlobalStream`` and ``_BlockStream``'s
    ``take_damage``)."""
    found = ReadStats()
    idx = np.asarray(load_index(url, storage_options, build=True, damage=found, **kw))
    if found.corrupt or found.skipped_records:
        damage[url] = (found, idx)
    return idx


def report_damage(found: Sequence[tuple], on_skip: Any) -> ReadStats:
    """Corrupt frames an index scan skipped (``found``: ``(error, frames, bytes)`` each), put
    to a pass's error policy (``on_skip``: each error, as the record reader puts its skips;
    ``None``, a policy that raises: the first is raised), as the counts the pass adds to
    its stats."""
    out = ReadStats()
    for err, frames, nbytes in found:
        if on_skip is None:
            raise err
        out.skipped(err, frames, nbytes)
        on_skip(err)
    return out


def _damage_entries(found: ReadStats) -> list[tuple]:
    return [(err, *n) for err, n in zip(found.corrupt, found.skips)]


STEP = "step"
"""``Span.handle`` of a block not cut yet: the records of ``url`` whose frames start in
bytes ``[offset, end)`` (see :func:`block_spans`)."""


def block_spans(spans: Sequence[Span], block_size: int | None, storage_options: Mapping[str, Any] | None = None,
                compression: str | None = "auto", cache: Any = None, counters: Any = None,
                seen: set | None = None, damage: dict | None = None) -> list[Span]:
    """``spans`` cut into blocks, in order. With ``block_size`` records: record ranges
    through the files' index files (built when missing), the last of a file maybe
    shorter. With ``None``, by bytes: the records of a file whose frames start in the same
    :data:`DEFAULT_BLOCK_BYTES` step of the file (bytes ``[k*B, (k+1)*B)``) are block
    ``k``, so a block is less than that many bytes plus its last record, and a file of
    ``size`` bytes has ``ceil(size / B)`` blocks (one is empty only where a record longer
    than a step spans it). The cut then needs the files' sizes only: these blocks are
    placeholders (``handle`` :data:`STEP`, the step's bytes as ``offset``/``end``), cut
    through the index when read (:func:`cut_step`), so no index file is read before the
    first record. A record range (not a whole file) is cut likewise, counting its steps
    from its first record, through its index at once. What index loads fetch is counted
    in ``counters`` (the pass's); ``damage``: see :func:`load_indexes`."""
    for s in spans:
        if normalize_compression(compression, s.url) is not None:
            raise ValueError(f"shuffle='blocks' needs record ranges, but {mask(s.url)} is compressed (there is "
                             "no index into a compressed stream): use shuffle='files', or decompress the files")
    out: list[Span] = []
    if block_size is None:
        step = DEFAULT_BLOCK_BYTES
        sizes = _each(lambda u: size(u, storage_options, counters), [s.url for s in spans if _whole(s)])
        parts = [s for s in spans if not _whole(s)]
        indexes = (load_indexes([s.url for s in parts], storage_options, cache, counters=counters, seen=seen,
                                damage=damage) if parts else {})
        for s in spans:
            if _whole(s):
                n = sizes[s.url]
                out += [Span(s.url, k * step, min(n, (k + 1) * step), handle=STEP) for k in range(-(-n // step))]
                continue
            idx = indexes[s.url]
            a, b = _records_of(s, idx)
            if b > a:
                offsets = np.asarray(idx[a:b, 0], dtype=np.int64)
                which = (offsets - offsets[0]) // step
                cuts = [a, *(a + np.flatnonzero(np.diff(which)) + 1).tolist(), b]
                for lo, hi in zip(cuts[:-1], cuts[1:]):
                    out += range_spans(s.url, idx, lo, hi)
        return out
    indexes = load_indexes([s.url for s in spans], storage_options, cache, counters=counters, seen=seen,
                           damage=damage)
    for s in spans:
        idx = indexes[s.url]
        a, b = _records_of(s, idx)
        for lo in range(a, b, block_size):
            out += range_spans(s.url, idx, lo, min(b, lo + block_size))
    return out


def _records_of(s: Span, idx: Any) -> tuple[int, int]:
    """The record numbers ``[a, b)`` of span ``s`` in its file's index."""
    a = s.start if s.start is not None else (_record_at(idx, s.offset) if s.offset else 0)
    b = s.stop if s.stop is not None else (len(idx) if s.end is None else _record_at(idx, s.end))
    return a, b


def cut_step(step: Span, idx: Any) -> Span | None:
    """The block of placeholder ``step`` (see :func:`block_spans`) through its file's
    index: the records whose frames start in its bytes; ``None`` when none does."""
    starts = np.asarray(idx[:, 0])
    a = int(np.searchsorted(starts, step.offset, side="left"))
    b = int(np.searchsorted(starts, int(step.end or 0), side="left"))
    spans = range_spans(step.url, idx, a, b)
    return spans[0] if spans else None


class _BlockStream(_ListStream):
    """A pass over blocks. Blocks cut by bytes are cut through their file's index as they
    are handed out; the index files this reader needs are loaded in the background, in
    the order of their first block, several at once, so the first block waits for one
    index, not all. The state says how the blocks were cut, so that a state is never
    applied to blocks cut another way (its index would point at other blocks)."""

    def __init__(self, spans: Sequence[Span], state: Any, rule: str, provider: "ShuffledSpans",
                 ident: Mapping[str, Any] | None = None, reads: tuple = (None, None, None)) -> None:
        saved = state.get("blocks") if state else rule
        if saved is None and rule.startswith("bytes:"):
            # saved before blocks were cut by bytes: always a count of records
            raise ValueError("this state was saved by a shuffle='blocks' reader of an earlier version, whose blocks "
                             f"were records, but this one cuts them by bytes ({rule!r}): resume with the block_size "
                             "it was saved with (block_size=2048 unless one was given), or the order would differ "
                             "and records repeat or go missing")
        if saved is not None and saved != rule:
            raise ValueError(f"this state was saved by a shuffle='blocks' reader whose blocks were cut as {saved!r}, "
                             f"but this one cuts them as {rule!r}: resume with the block_size it was saved with "
                             f"({_block_size_arg(saved)}), or the order would differ and records repeat or go "
                             "missing")
        super().__init__(spans, state, ident)
        self.rule = rule
        self.p = provider
        self.reads = reads  # the pass's (counters, cache, seen): index files loaded for it are counted there
        self.pool: Any = None
        self.loading: dict[str, Any] = {}
        # damage the index scans found (a corrupt shard under a skipping policy), reported once a
        # pass by the reader that reads the block it lies in (files with no record left: at the
        # pass's start by reader 0, or with the file's first step)
        self.damage: list[tuple] = [e for url, (found, idx) in list(provider._damage.items())
                                    if not len(idx) and provider.index == 0 and self._all_cut(url)
                                    for e in _damage_entries(found)]
        wanted = [s.url for s in spans[self.i:] if s.handle == STEP and s.url not in provider._indexes]
        wanted = list(dict.fromkeys(wanted))
        if wanted:
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            self.pool = ThreadPoolExecutor(min(INDEX_LOADS_AT_ONCE, len(wanted)), thread_name_prefix="shardfeed-index")
            self.loading = {u: self.pool.submit(provider.index_of, u, *reads) for u in wanted}

    def next_span(self, block: bool = True) -> Span | None:
        while True:
            s = super().next_span(block)
            if s is None or s.handle != STEP:
                if s is not None:
                    self._own(s)
                return s
            fut = self.loading.get(s.url)
            idx = fut.result() if fut is not None else self.p.index_of(s.url, *self.reads)
            cut = cut_step(s, idx)
            if not len(idx) and s.offset == 0 and s.url in self.p._damage:  # no record left in the file
                self.damage += _damage_entries(self.p._damage[s.url][0])
            if cut is not None:
                self._own(cut)
                return cut

    def _all_cut(self, url: str) -> bool:
        """Whether ``url``'s blocks were cut when the pass began (by records; blocks cut by
        bytes are cut as they are read, and whichever reader is dealt the file's first step
        reports a file left with no record). Every reader's blocks, not this one's: the
        damage is reported once across the readers."""
        return not any(s.url == url and s.handle == STEP for s in self.p.units(*self.reads))

    def _own(self, s: Span) -> None:
        """The damage block ``s`` reports: corrupt frames between two records of one block
        are read (and reported) with the block; those just before its first record (between
        two blocks, or at the file's start), or after the file's last record when it is the
        file's last block, are read by no block, so it reports them."""
        hit = self.p._damage.get(s.url)
        if hit is None or s.start is None or s.stop is None:
            return
        found, idx = hit
        for e in _damage_entries(found):
            r = _record_at(idx, e[0].offset)
            if r == s.start or (r == len(idx) and s.stop == len(idx)):
                self.damage.append(e)

    def take_damage(self) -> list[tuple]:
        """Damage to report now (see ``damage``), taken once."""
        out, self.damage = self.damage, []
        return out

    def get_state(self) -> dict:
        return {"i": self.i, "blocks": self.rule, **self.ident}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _block_size_arg(rule: str) -> str:
    kind, _, n = rule.partition(":")
    return f"block_size={n}" if kind == "records" else "block_size=None, the default"


class ShuffledSpans:
    """Spans (``"files"``) or blocks (``"blocks"``: ``block_size`` records, or about
    :data:`DEFAULT_BLOCK_BYTES` for ``None``) in a
    seeded order that changes every epoch (a :class:`~shardfeed.pipeline.permute.Permutation`
    keyed by ``(seed, epoch)``); reader ``index`` of ``count`` takes positions ``index,
    index + count, ...`` of that order, so every unit is read once per epoch across the
    readers, and each epoch deals them afresh. The state is one index."""

    replayable = True

    def __init__(self, spans: Sequence[Span], seed: int, mode: str = "files", block_size: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, compression: str | None = "auto",
                 index: int = 0, count: int = 1, _units: list | None = None, cache: Any = None,
                 _indexes: dict | None = None, _sizes: dict | None = None, _files: list | None = None,
                 _damage: dict | None = None) -> None:
        if mode not in ("files", "blocks", "global"):
            raise ValueError(f"shuffle must be one of {SHUFFLES}, got {mode!r}")
        self.spans = list(spans)
        self.seed = seed
        self.mode = mode
        self.block_size = block_size
        self.storage_options = storage_options
        self.compression = compression
        self.cache = cache
        self.index, self.count = index, count
        self._units_cache = _units if _units is not None else []  # shared with splits: made once
        self._indexes = _indexes if _indexes is not None else {}  # url -> index, shared with splits
        self._sizes = _sizes if _sizes is not None else {}  # url -> size known from the block cut, shared
        self._files: list[str] = _files if _files is not None else []  # the spans' digest, made once, shared
        # url -> (ReadStats, index): corrupt frames the scan that built a shard's index skipped,
        # reported by every pass (see load_damaged), shared with splits
        self._damage: dict[str, tuple] = _damage if _damage is not None else {}
        # local files as the cached units and indexes found them: (size, mtime), shared with splits
        self._stamps: dict[str, tuple] = {}

    def units(self, counters: Any = None, cache: Any = None, seen: set | None = None) -> list[Span]:
        """This provider's units, cut once (``counters``, ``cache``, ``seen``: those of the
        pass that cuts them, which counts the index files read)."""
        if self.mode == "global":
            raise ValueError("shuffle='global' has no units: its spans are computed per window")
        if not self._units_cache:
            units = self.spans if self.mode == "files" else block_spans(self.spans, self.block_size,
                                                                        self.storage_options, self.compression,
                                                                        cache or self.cache, counters, seen,
                                                                        self._damage)
            for u in units:  # the last step of a file ends at its size: its index check needs no stat
                if u.handle == STEP and u.end is not None:
                    self._sizes[u.url] = u.end
            self._units_cache.append(units)
        return self._units_cache[0]

    def index_of(self, url: str, counters: Any = None, cache: Any = None, seen: set | None = None) -> np.ndarray:
        """``url``'s index (built when missing), loaded once for this provider and its
        splits (any thread); what the load fetches is counted in ``counters`` (``cache``,
        ``seen``: the pass's)."""
        idx = self._indexes.get(url)
        if idx is None:
            idx = load_damaged(url, self.storage_options, self._damage, cache=cache or self.cache,
                               size=self._sizes.get(url), counters=counters, seen=seen)
            idx = self._indexes.setdefault(url, idx)  # atomic: a load raced by another thread keeps one
        return idx

    def order(self, epoch: tuple, reads: tuple = (None, None, None)) -> list[Span]:
        """This reader's units of the epoch, in order (``reads``: see :meth:`open_counted`)."""
        from .permute import Permutation  # noqa: PLC0415

        units = self.units(*reads)
        perm = Permutation(len(units), (self.seed, *[int(e) for e in epoch]))
        return [units[i] for i in perm.take(self.index, len(units), self.count).tolist()]

    def identity(self) -> dict[str, Any]:
        """What a state of this reader depends on: the spans, the shuffle mode and seed,
        and (but under a global shuffle, whose states any reader may resume) which reader
        of how many this is."""
        if not self._files:
            self._files.append(spans_digest([s.key() for s in self.spans]))
        share = None if self.mode == "global" else ([[self.index, self.count]] if self.count != 1 else [])
        return identity(self._files[0], share, self.mode, self.seed)

    def open(self, state: Any, epoch: tuple) -> Any:
        return self.open_counted(state, epoch, None)

    def open_counted(self, state: Any, epoch: tuple, counters: Any, cache: Any = None,
                     seen: set | None = None) -> Any:
        """:meth:`open`, the index files the pass needs counted in ``counters`` (its
        :class:`~shardfeed.storage.IOCounters`: reads, and shards scanned to build them),
        read through ``cache`` (the pass's view of the cache; default this provider's) and
        ``seen`` (the cached objects the pass counted: a shard downloaded to build its
        index is not counted again when the pass reads it)."""
        ident = self.identity()
        if state:
            check_state(state, ident)
        self._forget_changed_files()
        reads = (counters, cache, seen)
        if self.mode == "global":
            return _GlobalStream(self, epoch, state, ident, reads)
        if self.mode == "blocks":
            return _BlockStream(self.order(epoch, reads), state, blocks_rule(self.block_size), self, ident, reads)
        return _ListStream(self.order(epoch), state, ident)

    def _forget_changed_files(self) -> None:
        """Drop what this provider cut or loaded from local files that changed since (a
        shard rewritten between two passes of one dataset: its records were read at their
        old offsets, found from outside); one stat a file a pass."""
        changed = False
        for url in dict.fromkeys(s.url for s in self.spans):
            if not parse_url(url).is_local:
                continue
            stamp = local_stamp(url) or ()
            old = self._stamps.get(url)
            if old is not None and old != stamp:
                changed = True
                for d in (self._indexes, self._damage, self._sizes):
                    d.pop(url, None)
            self._stamps[url] = stamp
        if changed:
            self._units_cache.clear()

    def record_count(self, storage_options: Mapping[str, Any] | None = None, compression: str | None = "auto",
                     cache: Any = None) -> int | None:
        """This reader's records of one pass, when that is the same every epoch and known
        without reading: a global shuffle deals positions ``index, index + count, ...``
        of all records; files or blocks dealt among several readers give each a different
        number every epoch (``None``)."""
        if self.mode != "global" and self.count != 1:
            return None
        n = _total(self.spans, self.storage_options, self.compression, self.cache)
        return n if n is None else len(range(self.index, n, self.count))

    # -- shuffle="global" ---------------------------------------------------------------------
    def records(self, counters: Any = None, cache: Any = None, seen: set | None = None) -> "GlobalIndex":
        """Every record of every file, through the index files (loaded once, built when
        missing, what that fetches counted in ``counters``; see :meth:`open_counted`);
        shared with the splits of this provider."""
        if not self._units_cache:
            g = GlobalIndex.of(self.spans, self.storage_options, self.compression, cache or self.cache, counters,
                               seen, self._damage)
            self._units_cache.append(g)
            remote = [u for u in g.urls if not parse_url(u).is_local]
            if remote and self.cache is None:
                logger.warning(
                    "shuffle='global' over %d remote shard(s) without cache_dir: every record is fetched by its own "
                    "ranged GET (records of a window within 128 KiB of each other share one, the bytes between "
                    "them fetched too: an epoch can fetch 10x the data or more), so an epoch of %d "
                    "records makes up to %d round trips to the store, which runs at hundreds of records/s, not "
                    "thousands; give "
                    "cache_dir=... (each shard fetched once, then read locally) or use shuffle='blocks' (one GET "
                    "a block)", len(remote), g.n, g.n)
        return self._units_cache[0]

    def rebase(self, state: Any) -> Any:
        """A cursor saved by another reader of a global shuffle (any ``slice_count``) as
        this reader's: every reader resumes after the records all readers delivered, so a
        job can save with 4 readers and go on with 2 or 8. It counts on every reader having
        delivered as many records as the one whose state is given (a synchronous step);
        near the end of an epoch, where some readers have fewer, save a state of one that
        has not finished."""
        if self.mode != "global" or not state or not isinstance(state.get("spans"), dict):
            return state
        ps = state["spans"]
        if "base" not in ps or "count" not in ps:
            check_state(ps, self.identity())  # says which mode it was saved with, when it says
            raise ValueError("this state was not saved by a shuffle='global' reader; resume with the shuffle mode "
                             "it was saved with")
        ident = self.identity()
        check_state(ps, ident)
        if (ps.get("index"), ps.get("count"), ps.get("window", self.window)) == (self.index, self.count,
                                                                                    self.window):
            return state
        t = int(ps["t"])
        if state.get("key") is not None and list(state["key"]) == list(ps.get("key") or []):
            t += int(np.searchsorted(self.records().window_ends(ps, self.seed), int(state["offset"]), "right"))
        consumed = int(ps["base"]) + int(ps["count"]) * t
        return {"spans": {"base": consumed, "t": 0, "index": self.index, "count": self.count, **ident}, "key": None,
                "offset": 0}

    def split(self, index: int, count: int, storage_options: Mapping[str, Any] | None = None,
              compression: str | None = "auto", cache: Any = None, on_corrupt: str = "raise") -> "ShuffledSpans":
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or not 0 <= index < count:
            raise ValueError(f"need 0 <= index < count, got index={index!r}, count={count!r}")
        out = ShuffledSpans(self.spans, self.seed, self.mode, self.block_size, self.storage_options,
                            self.compression, self.index + index * self.count, self.count * count,
                            self._units_cache, self.cache, self._indexes, self._sizes, self._files, self._damage)
        out._stamps = self._stamps
        return out

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.spans]

    @property
    def window(self) -> int:
        """Positions a global shuffle's window gathers at once."""
        return DEFAULT_WINDOW if self.block_size is None else self.block_size

    def __repr__(self) -> str:
        return f"ShuffledSpans({len(self.spans)} spans, {self.mode}, reader {self.index} of {self.count})"


class GatherPlan(NamedTuple):
    """The records of one window of a global shuffle, in order: for record ``k``, file
    ``urls[files[k]]`` holds its frame at byte ``offsets[k]``, ``lengths[k]`` bytes long
    (frame overhead included). Read as if the frames were one file: frame ``k`` starts
    at the virtual byte ``virtual[k]``."""

    urls: list
    files: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    virtual: np.ndarray
    remote: bool = False
    """Whether some of ``urls`` is on object storage (known once per index, not per window)."""
    numbers: Any = None
    """Each record's number in its file (-1 where not known: a shard whose index leaves out
    corrupt frames), for errors; ``None``: none known."""


class GlobalIndex:
    """Where every record of a list of files is: each record's frame offset (int64) and
    length (uint32 while every frame is shorter than 4 GiB), and the number of records
    before each file (a record's file is found there): 12 bytes a record, the files' own
    index arrays not kept."""

    def __init__(self, urls: list[str], indexes: list[np.ndarray], first: list[int] | None = None) -> None:
        self.urls = urls
        # the number in its file of each file's first record here (-1: not known), for errors
        self.first = np.array(first if first is not None else [0] * len(urls), dtype=np.int64)
        counts = np.array([len(i) for i in indexes], dtype=np.int64)
        self.before = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n = int(self.before[-1])
        self.offsets = np.concatenate([i[:, 0] for i in indexes]) if indexes else np.zeros(0, np.int64)
        lengths = np.concatenate([i[:, 1] for i in indexes]) if indexes else np.zeros(0, np.int64)
        small = not len(lengths) or int(lengths.max()) < 1 << 32
        self.lengths = lengths.astype(np.uint32) if small else lengths
        self.remote = any(not parse_url(u).is_local for u in urls)

    def file_of(self, ids: np.ndarray) -> np.ndarray:
        """The file (its number in ``urls``) of each record of ``ids``."""
        return np.searchsorted(self.before, ids, "right") - 1

    @property
    def nbytes(self) -> int:
        """Bytes this index holds (what a global shuffle keeps per record, times ``n``)."""
        return self.offsets.nbytes + self.lengths.nbytes + self.before.nbytes

    @classmethod
    def of(cls, spans: Sequence[Span], storage_options: Mapping[str, Any] | None, compression: str | None,
           cache: Any, counters: Any = None, seen: set | None = None, damage: dict | None = None) -> "GlobalIndex":
        urls, indexes = [], []
        for s in spans:
            if normalize_compression(compression, s.url) is not None:
                raise ValueError(f"shuffle='global' reads records through index files, but {mask(s.url)} is "
                                 "compressed (there is no index into a compressed stream): use shuffle='files', "
                                 "or decompress the files")

        def wrap(url: str, exc: OSError) -> OSError:
            return type(exc)(f"shuffle='global' needs the index file of {mask(url)} and cannot build it "
                             f"({exc}); build index files once with `shardfeed index FILES`")

        loaded = load_indexes([s.url for s in spans], storage_options, cache, wrap, counters, seen, damage)
        first = []
        for s in spans:
            idx = loaded[s.url]
            a = s.start if s.start is not None else (_record_at(idx, s.offset) if s.offset else 0)
            b = s.stop if s.stop is not None else (len(idx) if s.end is None else _record_at(idx, s.end))
            urls.append(s.url)
            indexes.append(np.asarray(idx[a:b], dtype=np.int64))
            first.append(-1 if damage and s.url in damage else int(a))
        return cls(urls, indexes, first)

    def plan(self, ids: np.ndarray) -> GatherPlan:
        """Where the records ``ids`` are (a window of the permutation, in that order): in one
        native pass where the core is built (numpy took a tenth of a 1 KB record pass here)."""
        if _native_plan_window is not None and len(ids):
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            out = np.empty((5, len(ids)), dtype=np.int64)
            files, offs, lens, virtual, numbers = out
            _native_plan_window(ids, self.offsets, self.lengths, self.before, self.first, files, offs, lens, virtual,
                                numbers)
            return GatherPlan(self.urls, files, offs, lens, virtual, self.remote, numbers)
        lengths = np.take(self.lengths, ids).astype(np.int64)
        virtual = np.zeros(len(ids), dtype=np.int64)
        if len(ids) > 1:
            np.cumsum(lengths[:-1], out=virtual[1:])
        files = self.file_of(ids)
        first = self.first[files]
        numbers = np.where(first >= 0, ids - self.before[files] + first, -1)
        return GatherPlan(self.urls, files, np.take(self.offsets, ids), lengths, virtual, self.remote, numbers)

    def window_ends(self, ps: Mapping[str, Any], seed: int) -> np.ndarray:
        """The virtual end offsets of the records of the window that state ``ps`` starts."""
        ids = _window_ids(self.n, seed, tuple(ps.get("epoch", ())), int(ps["base"]), int(ps["index"]),
                          int(ps["count"]), int(ps["t"]), int(ps.get("window", DEFAULT_WINDOW)))
        p = self.plan(ids)
        return p.virtual + p.lengths


def _window_ids(n: int, seed: int, epoch: tuple, base: int, index: int, count: int, t0: int,
                window: int, perm: Any = None) -> np.ndarray:
    """Record ids at this reader's positions ``t0 .. t0 + window`` of the epoch's
    permutation: positions ``base + index + count * t`` (``perm``: that permutation, when
    the caller keeps it)."""
    first = base + index + count * t0
    stop = min(n, base + index + count * (t0 + window))
    if first >= n:
        return np.zeros(0, dtype=np.int64)
    return (perm or _epoch_permutation(n, seed, epoch)).take(first, stop, count)


def _epoch_permutation(n: int, seed: int, epoch: tuple) -> Any:
    from .permute import Permutation  # noqa: PLC0415

    return Permutation(n, (seed, *[int(e) for e in epoch]))


class _GlobalStream(_OwnStream):
    """One pass of a global shuffle: windows of ``provider.window`` of this reader's positions,
    each one span gathering its records from wherever they are. The state is a few
    integers: where this pass's positions start (``base``), which reader of how many,
    and the window's first position."""

    def __init__(self, provider: ShuffledSpans, epoch: tuple, state: Any, ident: Mapping[str, Any],
                 reads: tuple = (None, None, None)) -> None:
        self.p = provider
        self.ident = dict(ident)
        self.epoch = tuple(int(e) for e in epoch)
        self.g = provider.records(*reads)
        self.base = int(state["base"]) if state else 0
        self.t = int(state["t"]) if state else 0
        # made once a pass: its keys come from a SeedSequence, which costs more than a window
        self.perm = _epoch_permutation(self.g.n, provider.seed, self.epoch)
        # the damage the index scans skipped lies between records, in no reader's positions:
        # reader 0 reports it, once a pass, when the pass begins
        self.damage = [e for url, (found, _) in list(provider._damage.items()) if url in self.g.urls
                       for e in _damage_entries(found)] if provider.index == 0 else []

    def take_damage(self) -> list[tuple]:
        """Damage to report now (see ``damage``), taken once."""
        out, self.damage = self.damage, []
        return out

    def get_state(self) -> dict:
        p = self.p
        return {"base": self.base, "t": self.t, "index": p.index, "count": p.count, "epoch": list(self.epoch),
                "window": p.window, "key": self._key(self.t), **self.ident}

    def _key(self, t: int) -> list:
        return [self._url(t), 0, None]

    def _url(self, t: int) -> str:
        p = self.p
        return (f"shuffle://global/seed-{p.seed}/epoch-{'.'.join(map(str, self.epoch)) or '0'}/from-{self.base}/"
                f"reader-{p.index}-of-{p.count}/position-{t}")

    def next_span(self, block: bool = True) -> Span | None:
        p = self.p
        ids = _window_ids(self.g.n, p.seed, self.epoch, self.base, p.index, p.count, self.t, p.window, self.perm)
        if not len(ids):
            return None
        plan = self.g.plan(ids)
        span = Span(self._url(self.t), 0, None, self.t, self.t + len(ids), handle=plan)
        self.t += p.window
        return span

"""Reading the spans a provider yields as tagged chunks of frames: the part every read
path of the TFRecord source shares (:mod:`shardfeed.pipeline.records`).

Spans are opened in the provider's order and read through the native chunk path
(:func:`~shardfeed.formats.chunks.iter_frame_chunks`); remote or compressed spans can be
read ahead in background threads, a bounded number of bytes each, and still come out in
order. Every chunk is tagged with its span, so a reader's state is a cursor:
:func:`cursor_state`.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from ..formats.chunks import FIRST_CHUNK, FrameChunk, iter_frame_chunks
from ..formats.native import native_available
from ..formats.tfrecord import ReadStats, normalize_compression
from ..storage.counters import IOCounters
from ..storage.urls import mask, parse_url
from .gather import gather_chunks
from .spans import GatherPlan, Span, open_pass, report_damage
from .workers import ChunkQueue, Closed, WorkerPool

logger = logging.getLogger(__name__)

READ_AHEAD_BYTES = 64 << 20
"""Bytes that spans read ahead (remote or compressed shards) may hold together, parsed
into chunks (the fetcher holds its own budget of bytes in flight)."""
DEFAULT_READ_AHEAD = 16
"""Spans (compressed or remote) read at once by default (``num_parallel_reads=AUTOTUNE``)."""
REMOTE_READ_AHEAD = 48
"""Remote objects read at once by default."""
REMOTE_GATHER_AHEAD = 2
"""Windows of a global shuffle over remote shards without a cache gathered at once (each
makes its ranged GETs per record, 16 at a time): more would only queue more round trips
behind the link, and keep it busy long after the reader stopped."""


class ChunkTag(NamedTuple):
    """Where a chunk came from: the span's sequence number in the pass, the provider's
    state at that span, and the span."""

    seq: int
    pstate: Any
    span: Span


def _needs_read_ahead(span: Span, o: Any) -> bool:
    if isinstance(span.handle, GatherPlan):  # a global shuffle's window: a copy, unless remote
        return span.handle.remote
    # local uncompressed shards are mapped: nothing to wait for, nothing to read ahead
    return normalize_compression(o.compression, span.url) is not None or not parse_url(span.url).is_local


class SpanChunks:
    """The chunks of one pass over a provider's spans, each tagged with a :class:`ChunkTag`.

    Spans are opened in order. A span read to its end is finished (acknowledged, for a
    queue) once a record of a later span reached the consumer (``delivered``) or at the
    end of the pass; only when the provider has nothing to hand out at once (a queue whose
    other items are leased, perhaps to this very reader) are the spans read to their end
    finished before waiting, so a reader never waits on work it holds itself. With
    ``read_ahead`` > 1, remote or compressed spans are read in that many background
    threads, a bounded number of bytes ahead, and their chunks still come out in span
    order.
    """

    def __init__(self, src: Any, epoch: tuple, state: Mapping[str, Any] | None, chunk_size: int,
                 counters: IOCounters | None = None, errors: Any = None, track_sources: bool = False,
                 defer_data_crc: bool = False, release_pages: bool = True) -> None:
        self.src = src
        # local maps hand back the pages a scan has passed (False: the consumer, which holds
        # chunks long after they were read, does: release_chunk)
        self.release_pages = release_pages
        # data CRCs left to the batch parser (FrameChunk.crcs): only for a consumer that parses
        # (and calls rewind() at a failed check); the scan defers only CRCs it would check
        self.defer_data_crc = bool(defer_data_crc and src.options.verify_crc and native_available())
        # chunks say which file each record came from (FrameChunk.sources), for batch mixing
        self.track_sources = track_sources
        self.file_ids: dict[str, int] = {}
        self.plan_ids: dict[int, np.ndarray] = {}
        self.o = src.options
        policy = self.o.policy
        # each frame skipped goes to the policy (a handler may stop the pass) and the log
        self.on_skip = None if policy.raises else functools.partial(_framing_skipped, policy, errors)
        cache = self.o.cache
        # entries are checked against storage (and their CRC) at their first use in a pass
        self.cache = cache.for_pass() if cache is not None else None
        self.counters = counters if counters is not None else IOCounters()
        self.cached_seen: set = set()  # cached objects counted as hits in this pass (gathers)
        self.gather_opened: dict[str, Any] = {}  # files a global shuffle's windows read, opened once a pass
        self.chunk_size = chunk_size
        rebase = getattr(src.provider, "rebase", None)
        if rebase is not None:  # a state saved by another reader (of another world size)
            state = rebase(state)
        # index files the pass loads (a shuffle's) are counted with its other reads
        self.stream = open_pass(src.provider, state["spans"] if state else None, epoch, self.counters, self.cache,
                                self.cached_seen)
        self._report_damage()
        self.resume = (state["key"], int(state["offset"])) if state and state.get("key") is not None else None
        self.seq = 0
        self.read_ahead = src.read_ahead
        # remote objects: enough read at once that small ones keep the link busy too (each
        # keeps its own ranged GETs in flight, within the fetcher's byte budget)
        self.remote_ahead = REMOTE_READ_AHEAD if self.read_ahead == DEFAULT_READ_AHEAD else self.read_ahead
        # a span's queue holds up to this many bytes, plus the chunk that crossed the limit
        self.per_span = max(1, READ_AHEAD_BYTES // max(1, self.read_ahead, self.remote_ahead))
        self.pool: WorkerPool | None = None
        # (tag, start, ChunkQueue | None, reference index | None: read through the reference reader)
        self.ahead: collections.deque = collections.deque()
        self.opened: dict[int, tuple[ChunkTag, int]] = {}  # seq -> (tag, start) of spans not yet done
        # deferred reads: records handed out, by span (seq -> [count before, [(positions, lengths) of
        # each chunk since]]): where a rewind's frame lies, and what it takes back
        self.handed: dict[int, list] = {}
        self.finished: set[int] = set()  # spans of `opened` finished before their records were delivered
        self.read_done: collections.deque = collections.deque()  # (seq, span) read to the end, not finished
        self.closed = False

    def _ahead_limit(self, span: Span) -> int:
        if isinstance(span.handle, GatherPlan):
            if self.cache is None and _needs_read_ahead(span, self.o):  # remote, no cache: GETs per record
                return min(self.read_ahead, REMOTE_GATHER_AHEAD)
            return self.read_ahead
        return self.remote_ahead if not parse_url(span.url).is_local else self.read_ahead

    def delivered(self, seq: int, offset: int | None = None) -> None:
        """A record of span ``seq`` reached the consumer: every span before it is done
        (and, given the ``offset`` after the last record delivered, no :meth:`rewind` goes
        back before it)."""
        done = self.read_done
        while done and done[0][0] < seq:
            self._finish(*done.popleft())
        for s in [s for s in self.opened if s < seq]:
            del self.opened[s]
            self.handed.pop(s, None)
            self.finished.discard(s)
        kept = self.handed.get(seq)
        if offset is not None and kept is not None:
            chunks = kept[1]
            while chunks and int(chunks[0][0][-1]) < offset:
                kept[0] += len(chunks.pop(0)[0])

    def rewind(self, seq: int, offset: int) -> None:
        """Read span ``seq`` again from its frame at byte ``offset`` through the reference
        reader, and every span opened after it again from its start: a deferred read met
        its first failed check there (a handoff, or a data CRC the parser found). What was
        handed out from there on is no longer counted as read. Iterate again after it."""
        tag, began = self.opened[seq]
        kept = self.handed.get(seq, [0, []])
        index = _first_index(tag.span, began) + kept[0] + sum(int(np.count_nonzero(positions < offset))
                                                               for positions, _ in kept[1])
        undo = ReadStats()
        for s in [s for s in self.handed if s >= seq]:
            for positions, lengths in self.handed.pop(s)[1]:
                if s == seq:
                    lengths = lengths[positions >= offset]
                undo.records -= len(lengths)
                undo.bytes -= int(lengths.sum()) + 16 * len(lengths)
        self.src._merge_stats(undo)
        for _, _, q, _ in self.ahead:
            if q is not None:
                q.close()
        self.ahead.clear()
        self.read_done = collections.deque((d, span) for d, span in self.read_done if d < seq)
        self._start(tag, offset, index)
        for s in sorted(self.opened):
            if s > seq:
                self._start(*self.opened[s])

    def _start(self, tag: ChunkTag, start: int, reference: int | None = None) -> None:
        """Start reading span ``tag`` from byte ``start`` (ahead, when that helps)."""
        q = None
        span = tag.span
        if self.read_ahead > 1 and _needs_read_ahead(span, self.o):
            if self.pool is None:
                self.pool = WorkerPool(max(self.read_ahead, self.remote_ahead), "read-ahead")
            q = ChunkQueue(self.per_span)
            self.pool.submit(self._fill, span, start, q, tag.seq == 0, reference)
        self.ahead.append((tag, start, q, reference))

    def finish_all(self) -> None:
        """The pass reached its end: every span read to its end is done."""
        while self.read_done:
            self._finish(*self.read_done.popleft())

    def _finish(self, seq: int, span: Span) -> None:
        self.stream.finish(span)
        if seq in self.opened:  # a rewind may read it again: it is this reader's, finished or not
            self.finished.add(seq)

    def _open_next(self, block: bool) -> bool:
        """Take the next span and start reading it ahead when that helps; false when the
        provider has none (now, when not ``block``ing)."""
        pstate = self.stream.get_state()
        span = self.stream.next_span(False)
        if span is None and block:
            self.finish_all()  # nothing at once: never wait on work this reader holds
            pstate = self.stream.get_state()
            span = self.stream.next_span(True)
        self._report_damage()  # also at the end: a last block placeholder without records may hold some
        if span is None:
            return False
        start = span.offset
        if self.resume is not None:
            key, offset = self.resume
            self.resume = None
            if list(key) == span.key():
                start = max(start, offset)
        tag = ChunkTag(self.seq, pstate, span)
        self.seq += 1
        if self.defer_data_crc:  # spans a rewind may read again
            self.opened[tag.seq] = (tag, start)
        self._start(tag, start)
        return True

    def _report_damage(self) -> None:
        """Corrupt frames the scan that built a shard's index skipped (a shuffle's), which the
        stream says this reader reports now: to the error policy, and counted as the record
        reader counts its skips (every pass: the records are missing from every pass)."""
        take = getattr(self.stream, "take_damage", None)
        found = take() if take is not None else None
        if found:
            self.src._merge_stats(report_damage(found, self.on_skip))

    def _read(self, span: Span, start: int, stats: ReadStats, first: bool = True,
              reference: int | None = None) -> Iterator[FrameChunk]:
        """The chunks of ``span`` from byte ``start``. ``first``: the pass's first span,
        whose consumer waits for it now (its first chunk small); spans after it are read
        ahead, in chunks of ``chunk_size`` from the start, so a short span (a shuffled
        block) is one chunk and no batch is copied together from two. ``reference``: read
        through the reference reader, the frame at ``start`` being the ``reference``-th."""
        o = self.o
        if isinstance(span.handle, GatherPlan):
            chunks = gather_chunks(span.handle, start, o, self.chunk_size, stats, self.counters, self.cache,
                                   self.cached_seen, self.gather_opened, self._deferred(span, reference))
        else:
            chunks = iter_frame_chunks(span.url, o.compression, o.verify_crc, o.on_corrupt, o.storage_options,
                                       chunk_size=self.chunk_size, stats=stats, start_offset=start,
                                       end_offset=span.end, counters=self.counters, cache=self.cache,
                                       first_chunk=FIRST_CHUNK if first else self.chunk_size,
                                       defer_data_crc=self.defer_data_crc, reference_index=reference,
                                       first_index=_first_index(span, start), release_pages=self.release_pages)
        return self._with_sources(span, chunks) if self.track_sources else chunks

    def _with_sources(self, span: Span, chunks: Iterator[FrameChunk]) -> Iterator[FrameChunk]:
        """``chunks`` with ``sources`` set: this pass's number of each record's file."""
        ids = self.file_ids
        plan = span.handle if isinstance(span.handle, GatherPlan) else None
        if plan is not None:
            table = self.plan_ids.get(id(plan.urls))
            if table is None:
                table = np.array([ids.setdefault(u, len(ids)) for u in plan.urls], dtype=np.int64)
                self.plan_ids = {id(plan.urls): table}  # one plan's urls at a time
        else:
            file_id = ids.setdefault(span.url, len(ids))
        try:
            for chunk in chunks:
                if plan is not None:
                    yield chunk._replace(sources=table[chunk.sources]) if chunk.sources is not None else chunk
                else:
                    yield chunk._replace(sources=np.full(chunk.count, file_id, dtype=np.int64))
        finally:
            close_generator(chunks)

    def __iter__(self) -> Iterator[tuple[FrameChunk, ChunkTag]]:
        ahead = self.ahead
        while True:
            if not ahead and not self._open_next(block=True):
                return
            # keep spans read ahead while the newest one is read in the background
            while len(ahead) < self._ahead_limit(ahead[-1][0].span) and ahead[-1][2] is not None \
                    and self._open_next(block=False):
                pass
            tag, start, q, reference = ahead[0]
            chunks = self._local(tag, start, reference) if q is None else self._queued(tag, q)
            if self._deferred(tag.span, reference):
                chunks = self._handing(tag.seq, chunks)
            kept = yield from chunks
            ahead.popleft()
            if not kept:
                self.opened.pop(tag.seq, None)  # never read again
            elif tag.seq not in self.finished:  # one read again after a rewind is finished once
                self.read_done.append((tag.seq, tag.span))

    def _deferred(self, span: Span, reference: int | None) -> bool:
        """Whether a read leaves its data CRCs to the consumer: its records are then counted
        as read when handed out (:meth:`rewind` takes back what it reads again), not when
        the read ends (nothing is skipped there: it stops with a handoff instead)."""
        if isinstance(span.handle, GatherPlan):  # a global shuffle's window: its records left in place
            return self.defer_data_crc and reference is None and not span.handle.remote
        return self.defer_data_crc and reference is None

    def _handing(self, seq: int, chunks: Any) -> Any:
        """``chunks`` of span ``seq`` (``_local``'s or ``_queued``'s), each counted as read
        and kept (its positions) as it is handed out; returns what ``chunks`` returns."""
        kept = self.handed.setdefault(seq, [0, []])
        try:
            while True:
                try:
                    chunk, tag = next(chunks)
                except StopIteration as stop:
                    return stop.value
                if chunk.count:
                    kept[1].append((chunk.positions, chunk.lengths))
                    self.src._merge_stats(ReadStats(records=chunk.count,
                                                    bytes=int(chunk.lengths.sum()) + 16 * chunk.count))
                yield chunk, tag
        finally:
            close_generator(chunks)

    def _stats(self) -> ReadStats:
        return ReadStats(on_skip=self.on_skip)

    def _local(self, tag: ChunkTag, start: int, reference: int | None = None) -> Any:
        stats = self._stats()
        chunks = self._read(tag.span, start, stats, tag.seq == 0, reference)
        try:
            for chunk in chunks:
                if not self._keep(tag):  # checked before the records go out, not after
                    return False
                yield chunk, tag
        finally:
            close_generator(chunks)  # now, not at garbage collection: its file or download stops
            if not self._deferred(tag.span, reference) or isinstance(tag.span.handle, GatherPlan):
                # a deferred read's records count as handed out (a window's in place: they are
                # not counted in stats, but what it skipped is)
                self.src._merge_stats(stats)
        return True

    def _queued(self, tag: ChunkTag, q: ChunkQueue) -> Iterator[tuple[FrameChunk, ChunkTag]]:
        while True:
            kind, x = q.get()
            if kind == "end":
                return True
            if kind == "error":
                raise x
            if not self._keep(tag):
                q.close()
                return False
            yield x, tag

    def _keep(self, tag: ChunkTag) -> bool:
        if self.stream.keep(tag.span) or tag.seq in self.finished:  # finished: its records are this reader's
            return True
        logger.warning("span %s of %s was given to another reader; stopping it here", tag.seq, mask(tag.span.url))
        return False

    def _fill(self, span: Span, start: int, q: ChunkQueue, first: bool, reference: int | None = None) -> None:
        """Runs in a read-ahead thread: the span's chunks into ``q``, then an end marker
        (after the read's counts are merged: a pass that ends on it finds them counted)."""
        stats = self._stats()
        chunks = self._read(span, start, stats, first, reference)
        merged = self._deferred(span, reference)  # a deferred read's records count as handed out

        def merge() -> None:
            nonlocal merged
            if not merged:
                merged = True
                self.src._merge_stats(stats)

        try:
            for chunk in chunks:
                q.put(("chunk", chunk), max(1, _chunk_bytes(chunk)))
            merge()
            q.put(("end", None), 1)
        except Closed:
            pass
        except BaseException as exc:  # noqa: BLE001 - carried to the consumer, raised there
            close_generator(chunks)
            merge()
            try:
                q.put(("error", exc), 1)
            except Closed:
                pass
        finally:
            close_generator(chunks)  # a closed pass stops the span's reads (and downloads) now
            merge()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for _, _, q, _ in self.ahead:
            if q is not None:
                q.close()
        self.ahead.clear()
        if self.pool is not None:
            self.pool.close()
        self.stream.close()


def _first_index(span: Span, start: int) -> int:
    """The number, in its file, of the frame a read of ``span`` from byte ``start`` begins
    with, where known: a record range's first record, read from its start (0 otherwise:
    errors then count frames from where the read began)."""
    if span.start is not None and start == span.offset and not isinstance(span.handle, GatherPlan):
        return int(span.start)
    return 0


def _framing_skipped(policy: Any, errors: Any, err: Any) -> None:
    """A frame the framing reader skips, put to the pass's error policy (in the thread
    that reads it; a handler that raises stops the read, and the pass sees the error)."""
    policy.handle(err, {"stage": "read", "url": err.url, "offset": err.offset, "record_index": err.record_index,
                        "check": err.check}, errors, logged=True)


def _chunk_bytes(chunk: FrameChunk) -> int:
    n = chunk.count
    return int(chunk.offsets[-1] + chunk.lengths[-1] - chunk.offsets[0]) if n else 0


def cursor_state(tag: ChunkTag | None, offset: int, initial: Any, replayable: bool = True) -> Any:
    """A source's state: the provider's state at the span of ``tag``, the span, and the
    byte ``offset`` after the last record delivered (``initial`` before any record)."""
    if tag is None:
        state = initial
    else:
        state = {"spans": tag.pstate, "key": tag.span.key(), "offset": offset}
    if not replayable:
        # a provider that is its own checkpoint (a queue): stages above must not count on
        # reopening this state to read the same records again
        state = dict(state or {}, replayable=False)
    return state


def close_generator(gen: Any) -> None:
    """Close a generator, unless it is running in another thread right now (a pass closed
    from outside its consumer's thread): it then ends with the pass it belongs to."""
    try:
        gen.close()
    except ValueError:
        pass


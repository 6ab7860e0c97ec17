"""``source.batch(n)`` fused: whole batches of frames from a producer straight to the
batch parser, on a pool of threads, delivered in order (:class:`SourceBatchNode`). The
TFRecord source's plain producer rebatches its chunks; the fused shuffle
(:mod:`shardfeed.pipeline.shuffle_batch`) is another producer.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptRecordError, DecodeError, ParseError
from ..formats.bufpool import pass_closed
from ..formats.chunks import FrameChunk, rebatch_pieces
from ..formats.native import ParsePool, parse_pool_available
from ..formats.parse import parse_batch
from ..formats.tfrecord import FRAME_OVERHEAD
from ..formats.truncated import past_new_end, truncated_while_read
from ..storage.urls import mask
from .node import AUTOTUNE, Build, Node
from .skipping import parse_skipping, without
from .span_reader import SpanChunks, close_generator, cursor_state
from .workers import WorkerPool

_IN_POOL = object()  # a _Pending's result: taken from the node's ParsePool, in order
_AGAIN = object()  # what SourceBatchNode._take returns when the batch it took was not delivered
ACTIVE_S = 0.05
BUSY_BATCHES = 4
"""A thread that took this many fused batches within ``ACTIVE_S`` reads flat out now (see :func:`_share`)."""
_readers: dict[int, collections.deque] = {}  # consumer thread -> when it took its last BUSY_BATCHES batches


def _share(threads: int) -> int:
    """Parse threads one reader of this process should keep busy: ``threads`` (its cores)
    divided among the threads that read fused batches flat out now (two ``read_shard``
    slices in two threads, say: ``BUSY_BATCHES`` batches within ``ACTIVE_S`` each), so that
    together they use the cores without crowding them: 4 parsing threads on 2 cores ran 7 %
    slower than 2. A thread that takes a batch now and then (an evaluation or logging reader)
    does not count; one thread reading several sources (a mix) counts once. A reader whose
    share is one parses in its own thread only (a pool, once started, keeps its size)."""
    now = time.monotonic()
    ident = threading.get_ident()
    times = _readers.get(ident)
    if times is None:
        times = _readers[ident] = collections.deque(maxlen=BUSY_BATCHES)
    times.append(now)
    if len(_readers) == 1:
        return threads
    busy = 1  # this one
    for other, ts in list(_readers.items()):
        if other == ident:
            continue
        if len(ts) == BUSY_BATCHES and now - ts[0] <= ACTIVE_S:
            busy += 1
        elif now - ts[-1] > 10 * ACTIVE_S:
            _readers.pop(other, None)
    return max(1, threads // busy)


def _done_reading(ident: int | None) -> None:
    """A reader's thread stopped taking its batches (the pass ended or closed)."""
    if ident is not None:
        _readers.pop(ident, None)


class _Pending(NamedTuple):
    result: Any  # a Future; _IN_POOL; None: parse in the consumer's thread; the exception when reading failed
    batch: FrameChunk | None
    where: Any  # record index -> where it came from, for error notes
    state: Any  # the node's state once this batch is delivered
    token: Any  # handed back to the producer once delivered


class _PlainBatches:
    """Batches of frames of the source, in order, each with the cursor after it.

    The scan leaves the data CRCs to the parser, and stops at a failed check with a handoff
    instead of raising or skipping (:func:`~shardfeed.formats.chunks.iter_frame_chunks`):
    the first failure of a span is known only once the batch holding it is parsed. The node
    then calls :meth:`rewind`, and the span is read on from that frame through the
    reference reader, as the record path reads it, so both deliver, skip, count and raise
    alike (the records of the batch before it are kept, the batches read after it read
    again)."""

    rereads_skips = True
    """Under the skipping policy too, a record the parser finds damaged is read again from
    its file (its span rewound), as the record path reads it."""

    def __init__(self, src: Any, epoch: tuple, state: Mapping[str, Any] | None, ds: Any,
                 counters: Any = None, errors: Any = None) -> None:
        self.src = src
        self.ds = ds
        # the data CRCs are checked by the batch parser, in the pass that copies the values out
        self.chunks = SpanChunks(src, epoch, state, src.options.chunk_size, counters, errors, track_sources=True,
                                 defer_data_crc=True)
        self._chunk_iter = iter(self.chunks)
        self.batches = rebatch_pieces(self._chunk_iter, ds.batch_size, ds.drop_remainder)
        self.replayable = src.replayable

    def __next__(self) -> tuple[FrameChunk, Any, Any, Any]:
        batch, pieces = next(self.batches)
        tag = pieces[-1].tag
        offset = int(batch.positions[-1] + batch.lengths[-1]) + FRAME_OVERHEAD if batch.count else 0

        def where(k: int) -> str:  # the file of the piece record k is in (a batch may span files)
            url = next((p.tag.span.url for p in pieces if p.start <= k < p.start + p.chunk.count), tag.span.url)
            return f"byte offset {int(batch.positions[k])} of {mask(url)} (record #{k} of its batch)"

        return batch, where, cursor_state(tag, offset, None, self.replayable), _Token(tag.seq, offset, pieces)

    def url_of(self, token: "_Token", k: int) -> str:
        """The (masked) file record ``k`` of the batch of ``token`` came from."""
        for p in token.pieces:
            if p.start <= k < p.start + p.chunk.count:
                return mask(p.tag.span.url)
        return mask(token.pieces[-1].tag.span.url)

    def record_groups(self, batch: FrameChunk, token: "_Token") -> list[tuple[str, slice]]:
        """Which records of ``batch`` (of ``token``) come from which file: ``(url, slice)`` pairs."""
        return [(p.tag.span.url, slice(p.start, p.start + p.chunk.count)) for p in token.pieces if p.chunk.count]

    def handoff_at(self, token: "_Token") -> int | None:
        """How many of a batch's records come before the first handoff in it (``None``:
        none). A batch holding a handoff is never delivered: the node rewinds."""
        for p in token.pieces:
            if p.chunk.handoff is not None:
                return p.start
        return None

    def rewind(self, batch: FrameChunk, token: "_Token", k: int, cause: Any = None) -> None:
        """Record ``k`` of ``batch`` failed its deferred data CRC, or (``k`` is where
        :meth:`handoff_at` says) the scan stopped there: the records before it are kept for
        the next batch, the span is read on from that frame through the reference reader,
        the spans after it again."""
        close_generator(self.batches)
        close_generator(self._chunk_iter)
        prefix = []
        for p in token.pieces:
            if p.chunk.handoff is not None:
                if p.start == k:
                    seq, offset = p.tag.seq, p.chunk.handoff[0]
                    break
                continue
            if p.start + p.chunk.count > k:
                seq, offset = p.tag.seq, int(batch.positions[k])
                if k > p.start:
                    prefix.append((p.chunk.part(0, k - p.start), p.tag))
                break
            prefix.append((p.chunk, p.tag))
        else:
            raise AssertionError(f"no record or handoff at {k} of a batch of {batch.count}")
        self.chunks.rewind(seq, offset)
        self._chunk_iter = iter(self.chunks)
        self.batches = rebatch_pieces(itertools.chain(prefix, self._chunk_iter), self.ds.batch_size,
                                      self.ds.drop_remainder)

    def delivered(self, token: "_Token") -> None:
        self.chunks.delivered(token.seq, token.offset)

    def finish_all(self) -> None:
        self.chunks.finish_all()

    def close(self) -> None:
        try:
            self.chunks.close()  # first: stops read-ahead threads, gives back held spans
        finally:
            close_generator(self.batches)
            close_generator(self._chunk_iter)


class _Token(NamedTuple):
    """What :class:`_PlainBatches` needs back about a batch: its last record's span and the
    offset after it (delivered), the pieces it was made of (a rewind)."""

    seq: int
    offset: int
    pieces: list


class SourceBatchNode(Node):
    """``source.batch(n)`` fused: batches of frames straight from the chunks to the batch
    parser, ``threads`` batches parsed at once (the native parser releases the GIL),
    delivered in order. Its state is the source's cursor (or, behind a fused shuffle, the
    shuffle's state), so it resumes exactly like the unfused chain."""

    def __init__(self, b: Build, ds: Any, src: Any, state: Mapping[str, Any] | None,
                 producer: Any = None) -> None:
        super().__init__(b, ds)
        self.src = src
        self.spec = src.spec
        self.bytes_as = ds.bytes_as
        self.state = dict(state) if state else None
        self.producer = producer if producer is not None else _PlainBatches(
            src, b.epoch, state, ds, b.ctx.stats.storage, b.ctx.stats.errors)
        self.policy = src.options.policy
        self.errors = b.ctx.stats.errors
        if self.state is None and producer is not None:
            self.state = producer.get_state()
        elif self.state is None:
            self.state = cursor_state(None, 0, None, src.replayable)
        self.threads = src.threads
        self.unchecked = not src.options.verify_crc  # no CRC catches a record past a cut file's end
        self.autotuned = src.num_parallel_reads == AUTOTUNE
        self.reader: int | None = None  # the thread taking the batches (for _share)
        self.pool: WorkerPool | None = None
        # Under the raising policy, batches are parsed on native threads that never take the
        # GIL, and here when no pool thread has started the batch this thread needs next; the
        # values' objects (the serial part) are made here, as each batch is taken (buffer-form
        # values are copied out by the parsing thread). With Python threads parsing, the GIL
        # crossed threads several times a batch, and three busy threads on two cores left the
        # one holding it without a core a third of the time: 1.25-1.30x one thread's rate
        # with objects, against 1.6-1.7x this way.
        self.native = self.threads > 1 and self.policy.raises and parse_pool_available()
        self.parse_pool: ParsePool | None = None
        self.pending: collections.deque[_Pending] = collections.deque()
        self.exhausted = False
        self.held = False  # a batch holding a handoff is pending: the producer waits for the rewind
        # for stats(), per next(): this thread's waits on the parsing threads, their work;
        # the parse pool's (busy, caller's share, take time) already counted
        self._waited = self._others = 0.0
        self._pool = (0.0, 0.0, 0.0)
        if self.threads > 1:
            self.stats.threaded = True
            self.stats.parallelism = self.threads
        b.ctx.on_close(self.close)

    def _parse(self, batch: FrameChunk) -> Any:
        if self.policy.raises:
            return parse_batch(batch, self.spec, bytes_as=self.bytes_as)
        return parse_skipping(batch, self.spec, self.bytes_as)

    def _parse_timed(self, batch: FrameChunk) -> tuple[Any, float]:
        t = time.perf_counter()
        out = self._parse(batch)
        return out, time.perf_counter() - t

    def _fill(self) -> None:
        # the first batch goes out after its own frames, not after 2 x threads batches'
        # (a first batch from object storage waited for four batches' bytes): the read-ahead
        # ramps up by one batch per batch handed out
        want = 1 if self.threads <= 1 else min(2 * self.threads, 1 + self.stats.elements)
        # with AUTOTUNE, other threads of this process reading batches now share the cores
        share = self.threads
        if self.native and self.autotuned:
            share = _share(self.threads)
            self.reader = threading.get_ident()
        while not self.exhausted and not self.held and len(self.pending) < want:
            try:
                batch, where, state, token = next(self.producer)
            except StopIteration:
                self.exhausted = True
                break
            except Exception as exc:  # noqa: BLE001 - raised in order, after the batches before it
                self.exhausted = True
                self.pending.append(_Pending(exc, None, None, None, None))
                break
            handoff = self._handoff_at(token)
            if handoff is not None:  # nothing after it is delivered before a rewind: read no further
                self.held = True
            if self.threads <= 1 or handoff == 0:
                self.pending.append(_Pending(None, batch, where, state, token))
                continue
            if share <= 1:  # the cores are taken: this thread parses it, when taken
                self.pending.append(_Pending(None, batch, where, state, token))
                continue
            if self.native:
                if self.parse_pool is None:
                    if self.ctx.closed:
                        raise RuntimeError("the iterator was closed")
                    # this thread parses too (and makes every value's object): one fewer
                    self.parse_pool = ParsePool(min(self.threads - 1, 255))
                try:
                    self.parse_pool.submit(batch.triple, self.spec, bytes_as=self.bytes_as, crcs=batch.crcs)
                except Exception as exc:  # noqa: BLE001 - raised in order, after the batches before it
                    self.exhausted = True
                    self.pending.append(_Pending(exc, None, None, None, None))
                    break
                self.pending.append(_Pending(_IN_POOL, batch, where, state, token))
                continue
            if self.pool is None:
                if self.ctx.closed:
                    raise RuntimeError("the iterator was closed")
                self.pool = WorkerPool(self.threads, "parse")
            self.pending.append(_Pending(self.pool.submit(self._parse_timed, batch), batch, where, state, token))

    def _next(self) -> Any:
        # The stage's work, for stats(): this thread's time here (reading, the objects, the
        # parses it does itself), less its waits on the parsing threads, plus their parse
        # time (a threaded stage's busy time is its workers' work).
        t = time.perf_counter()
        self._waited = self._others = 0.0
        try:
            while True:
                out = self._take()
                if out is not _AGAIN:
                    return out
        finally:
            pool = self.parse_pool
            if pool is not None:  # its take() waited, or parsed a batch no pool thread had started
                (busy, caller), took = pool.busy, pool.take_s
                self._others += (busy - caller) - (self._pool[0] - self._pool[1])
                self._waited += (took - self._pool[2]) - (caller - self._pool[1])
                self._pool = (busy, caller, took)
            took = time.perf_counter() - t
            # the time its consumer waited on it for this batch: the reader thread's own work
            # and its waits for the parses it needs next (the stage's critical path)
            self.stats.serial_s += took
            self.stats.work_s += took - self._waited + self._others

    def _take(self) -> Any:
        """The next batch's columns, or ``_AGAIN`` when the batch taken was not delivered
        (every record skipped, or the pass rewound: :meth:`_rewind`)."""
        self._fill()
        if not self.pending:
            _done_reading(self.reader)
            self.producer.finish_all()
            raise StopIteration
        fut, batch, where, state, token = self.pending.popleft()
        if batch is None:  # reading failed after the batches before it
            raise fut
        # records from this one on come after a failed check of the deferred scan
        handoff = self._handoff_at(token)
        if handoff == 0:
            self._discard(fut)
            return self._rewind(batch, token, 0)
        try:
            if fut is None:
                out = self._parse(batch)
            elif fut is _IN_POOL:
                assert self.parse_pool is not None
                out = self.parse_pool.take()  # its wait and parse: counted in _next
            else:
                t = time.perf_counter()
                out, parsed_s = fut.result()
                self._waited += time.perf_counter() - t
                self._others += parsed_s
        except CorruptRecordError as exc:  # a data CRC the framing left to the parser
            k = exc.record_index
            if batch.crcs is None and k is not None and 0 <= k < batch.count:
                raise self._located(exc, batch, token, k) from None  # past a truncated file's end
            if batch.crcs is None or k is None or not 0 <= k < batch.count:
                raise
            return self._rewind(batch, token, k if handoff is None else min(k, handoff),
                                exc if handoff is None or k < handoff else None)
        except (DecodeError, ParseError) as exc:
            if handoff is not None and exc.record_index is not None and exc.record_index >= handoff:
                return self._rewind(batch, token, handoff)
            if self.unchecked:
                self._unchecked_cut(batch, token, None)  # a record past a cut file's end, read as zeros
            if exc.record_index is not None and 0 <= exc.record_index < batch.count:
                self._locate_decode(exc, batch, token, exc.record_index)
                exc.add_note(f"in record at {where(exc.record_index)}")
            raise
        if self.unchecked:
            out = self._unchecked_cut(batch, token, out)
        if not self.policy.raises:
            out, skipped = out
            # the first deferred data CRC that failed: nothing of the batch is reported
            # before the pass is read again from that frame on (the rest comes again); a
            # producer that does not read again (a fused shuffle: its CRCs are checked when
            # read) skips what the parser found (a record past a truncated file's end) here
            rereads = getattr(self.producer, "rereads_skips", False) and batch.crcs is not None
            bad = [k for k, exc in skipped if rereads and isinstance(exc, CorruptRecordError)] + [handoff]
            first = min((k for k in bad if k is not None), default=None)
            if first is not None:
                cause = next((exc for k, exc in skipped if k == first and isinstance(exc, CorruptRecordError)), None)
                return self._rewind(batch, token, first, cause)
            for k, exc in skipped:  # each put to the policy: a handler may stop here
                if isinstance(exc, CorruptRecordError):
                    exc = self._located(exc, batch, token, k)
                else:
                    self._locate_decode(exc, batch, token, k)
                exc.add_note(f"in record at {where(k)}")
                self.policy.handle(exc, {"stage": "parse", "offset": int(batch.positions[k]), "where": where(k),
                                         "record_index": k}, self.errors)
            if out is None:  # every record of the batch was skipped: the next one
                self.producer.delivered(token)
                self.state = state
                return _AGAIN
        elif handoff is not None:
            return self._rewind(batch, token, handoff)
        self.producer.delivered(token)
        self.state = state
        if batch.sources is not None and batch.count:
            self.stats.add_mix(batch.sources)
        # the serialized bytes parsed: exact, and free (measuring the columns costs more
        # than a tenth of the parse when they hold many small bytes values)
        self.stats.bytes += int(batch.lengths.sum())
        return out

    def _unchecked_cut(self, batch: FrameChunk, token: Any, out: Any) -> Any:
        """Without CRCs: ``out`` (the batch parsed) less the records that now lie past the end
        of a local file cut under the pass (the rest of the page that holds the new end reads as
        zeros, no fault says so): raised, or left out, parsed again, and skipped one by one."""
        groups_of = getattr(self.producer, "record_groups", None)
        if groups_of is None or not batch.count:
            return out
        groups = groups_of(batch, token)
        lost, sizes = past_new_end(batch.positions, batch.lengths, groups)
        if not len(lost):
            return out
        url_at = {int(j): url for url, sel in groups for j in np.arange(batch.count)[sel].tolist()}
        errors = [(int(j), truncated_while_read(url_at[j], int(batch.positions[j]), None, sizes[url_at[j]]))
                  for j in lost.tolist()]
        if self.policy.raises or out is None:
            raise errors[0][1]
        keep = np.delete(np.arange(batch.count), lost)
        cols, skipped = parse_skipping(without(batch, lost), self.spec, self.bytes_as)
        return cols, sorted([(int(keep[k]), e) for k, e in skipped] + errors, key=lambda x: x[0])

    def _located(self, exc: CorruptRecordError, batch: FrameChunk, token: Any, k: int) -> CorruptRecordError:
        """``exc`` (the parser's, record ``k`` of ``batch``) naming the file and the frame's offset
        in it, when the parser could not (the producer knows each record's file)."""
        url_of = getattr(self.producer, "url_of", None)
        if exc.url is not None or url_of is None:
            return exc
        return CorruptRecordError(exc.check, url_of(token, k), int(batch.positions[k]), None, exc.detail)

    def _locate_decode(self, exc: Exception, batch: FrameChunk, token: Any, k: int) -> None:
        """Set a decode error's ``url`` and ``offset`` (record ``k`` of ``batch``) where the
        parser, which sees only the batch, left them unset (found from outside: ``url`` None)."""
        url_of = getattr(self.producer, "url_of", None)
        if getattr(exc, "url", None) is None and url_of is not None:
            exc.url = url_of(token, k)  # type: ignore[attr-defined]
        if getattr(exc, "offset", None) is None:
            exc.offset = int(batch.positions[k])  # type: ignore[attr-defined]

    def _handoff_at(self, token: Any) -> int | None:
        at = getattr(self.producer, "handoff_at", None)
        return None if at is None else at(token)

    def _discard(self, fut: Any) -> None:
        """Drop a batch read past a rewind: its parse is taken (in order) and forgotten."""
        if fut is _IN_POOL:
            assert self.parse_pool is not None
            try:
                self.parse_pool.take()
            except Exception:  # noqa: BLE001, S110 - records read past the failure: read again
                pass
        elif hasattr(fut, "cancel"):
            fut.cancel()

    def _rewind(self, batch: FrameChunk, token: Any, k: int, cause: CorruptRecordError | None = None) -> Any:
        """The deferred scan's first failure in the pass is record ``k`` of ``batch`` (the
        parser's error ``cause``, None for a handoff): the batches read after it are dropped
        and the producer reads on from it (the records of ``batch`` before it, again)."""
        for p in self.pending:
            if p.batch is not None:
                self._discard(p.result)
        self.pending.clear()
        self.exhausted = self.held = False
        self.producer.rewind(batch, token, k, cause)
        return _AGAIN

    def get_state(self) -> Any:
        return self.state

    def close(self) -> None:
        _done_reading(self.reader)
        self.reader = None
        for p in self.pending:
            if hasattr(p.result, "cancel"):
                p.result.cancel()
        self.pending.clear()
        try:
            if self.parse_pool is not None:
                self.parse_pool.close()
            if self.pool is not None:
                self.pool.close()
        finally:
            self.producer.close()
            pass_closed()  # the pooled batch buffers stay warm for the next pass, until idle (bufpool.py)

"""``source.shuffle(n).batch(k)`` fused: the buffer shuffle computed on positions, whole
batches of frames gathered from the source's chunks and parsed at once.

The shuffle node draws one slot at a time and refills it from upstream; which upstream
position each output is depends only on the random draws (see
:func:`~shardfeed.pipeline.shuffle.slot_positions`). So the positions of a whole batch
are computed at once with numpy (the last write to each drawn slot), the frames at those
positions are gathered from the chunks the source read, and the batch parser takes them
in one call: the same elements in the same order as the unfused chain, and the same state
(either chain resumes from the other's), without a Python step per record.

Records stay in the source's chunks while any of them is buffered; chunks that hold only a
few buffered records are compacted (those records copied out), so memory stays near the
buffer's own size.

A restore re-reads what the buffer held, not what came before it: the state names each
buffered record's file, byte offset and length (``"frames"``: zlib-compressed deltas, a few
bytes a record) and the source's cursor at the first record not yet drawn into the buffer, so
the restore reads back exactly the buffered records (nearby ones in one range), at most one
buffer, and the source goes on from there (:mod:`shardfeed.pipeline.frames`). Without
``"frames"`` (a state from ``in_subprocess``, a compressed file) it re-reads from the anchor,
the cursor before the oldest buffered record (about ``buffer * ln(buffer)`` records back), as
the unfused node then does.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..crc import masked_crc32c
from ..errors import CorruptRecordError
from ..formats.chunks import FrameChunk, is_mapped, release_chunk
from ..formats.native import IN_FRAME, Buffers, frame_crcs
from ..formats.tfrecord import FRAME_OVERHEAD, ReadStats
from ..formats.truncated import past_new_end, truncated_detail
from ..storage.urls import mask
from .frames import Frames, chunk_entry, fetch_frames
from .held_chunks import NO_CRCS, RELEASE_AFTER, Flat, copied, own_copy, stored_crcs, trailing_crcs
from .records import TFRecordSource
from .shuffle import derive_seed, next_draws, slot_positions
from .span_reader import SpanChunks, close_generator, cursor_state
from .stats import StageStats


def shuffle_stage(b: Any, shuffle_ds: Any) -> StageStats:
    """The statistics stage of the fused node's shuffle (named and keyed as the unfused
    shuffle node's would be): its own time as ``busy_s``, the time it waited for the
    source's chunks as ``read_s``; the parse stays the batch stage's."""
    key = (b.scope, shuffle_ds.kind) if b.scope else id(shuffle_ds)
    st = b.ctx.stats.stage(key, f"{b.scope}/{shuffle_ds.kind}" if b.scope else shuffle_ds.kind)
    st.threaded = True  # its time is measured, not inferred from its upstream's
    return st


class _Chunk:
    __slots__ = ("base", "chunk", "url", "start_state", "end_state", "serial")

    def __init__(self, base: int, chunk: FrameChunk, url: str, start_state: Any, end_state: Any,
                 serial: int) -> None:
        self.base = base  # upstream position of its first record
        self.chunk = chunk
        self.url = url
        self.serial = serial  # the chunks read before it in the pass
        self.start_state = start_state  # the source's state before its first record
        self.end_state = end_state  # ... after its last


class ShuffledBatches:
    """The batch producer of a fused shuffle + batch (see :class:`~shardfeed.pipeline.records.SourceBatchNode`)."""

    def __init__(self, src: TFRecordSource, shuffle_ds: Any, batch_ds: Any, epoch: tuple,
                 state: Mapping[str, Any] | None, counters: Any = None, errors: Any = None,
                 stage: StageStats | None = None) -> None:
        self.src = src
        # the shuffle's own time (draws, gather, compaction, state) and, apart, the time
        # spent waiting for the source's chunks: the parse is the batch stage's
        self.stage = stage
        self.read_s = 0.0
        self.counters = counters
        self.errors = errors
        self.file_ids: dict[str, int] = {}  # for each batch's file mix
        # Under the raising policy the records' data CRCs are left to the batch parser (the
        # parsing threads check each record as they copy its values out, as the sequential
        # path does): checked in the scan, every byte of the buffer was read twice, the
        # second time long after the first (out of the CPU's caches), and the scan's CRC ran
        # on this thread alone. A record that fails is raised when it is drawn (rewind()),
        # named by file and offset. Skipping keeps the check in the scan: a record skipped
        # there never enters the buffer, so the order is the unfused chain's.
        self.deferred = src.options.policy.raises
        # Skipping checks each CRC in the scan, and the values are copied out when a record is
        # drawn, long after: from a file's map, which shows a rewrite of the file in place. The
        # stored CRCs are kept from the scan and the parser checks the bytes it copies against
        # them (a record that changed is skipped and counted, never delivered torn).
        self.recheck = not self.deferred and bool(src.options.verify_crc)
        self.size = shuffle_ds.buffer_size
        self.k = batch_ds.batch_size
        self.drop = batch_ds.drop_remainder
        self.epoch_path = epoch
        epoch_key = epoch if shuffle_ds.reshuffle_each_iteration else ()
        if state is not None:
            self.seed = int(state["seed"])
            self.parent_start = state["parent_start"]
        else:
            self.seed = shuffle_ds.seed if shuffle_ds.seed is not None else secrets.randbits(63)
            self.parent_start = None
        self.chunks: collections.deque[_Chunk] = collections.deque()
        self.flat = Flat()
        self.batches_out = 0
        self.releases: collections.deque = collections.deque()  # (due, chunk, keep)
        self.serial = 0
        self.file_urls: list[str] = []  # by file number (file_ids)
        # compacted or read back: position -> (record, file offset, url, its stored data CRC or
        # None: checked, [its map's chunk, its records still buffered] or None: not a view)
        self.survivors: dict[int, tuple] = {}
        self.read = 0  # upstream positions held or passed
        self.ended = False  # the source has no more records
        self.consumed = 0
        self.old_starts: collections.deque = collections.deque()  # (base, end, start state) of compacted chunks
        self.frame_index: collections.deque = collections.deque()  # (base, file offsets, lengths, url) a chunk
        self.restored: tuple | None = None  # (positions, offsets, lengths, url ids, urls) a restore read back
        if state is not None and state.get("read") and state.get("anchor") is not None:
            consumed, read, exhausted = int(state["consumed"]), int(state["read"]), bool(state["exhausted"])
            anchor_pos, anchor_state = int(state["anchor"][0]), state["anchor"][1]
            self.rng, self.draws, self.di, table = slot_positions(self.seed, epoch_key, self.size, consumed, read,
                                                                  exhausted)
            self.consumed = consumed
            frames = state.get("frames")
            if frames is not None:  # the buffered records from their offsets, the source from its chunk
                resume_pos, resume_state = int(frames["resume"][0]), frames["resume"][1]
                self.read = resume_pos
                self._open(resume_state)
                self._fetch(frames)
                if anchor_pos < resume_pos:  # a later state still names the anchor (the unfused node's way)
                    self.old_starts.append((anchor_pos, resume_pos, anchor_state))
            else:
                self.read = anchor_pos
                self._open(anchor_state)
            self._read_to(read)
            if frames is None:  # read again: every record from the anchor to where the pass had read
                self.src._merge_stats(ReadStats(reread=max(0, min(self.read, read) - anchor_pos)))
            if exhausted or len(table) < self.size:
                self.table: Any = list(table)
                self.swap_mode = True
            else:
                self.table = np.asarray(table, dtype=np.int64)
                self.swap_mode = False
            self.filled = True
            self.oldest = min(table) if table else read
        else:
            self.oldest = 0
            self.rng = np.random.Generator(np.random.PCG64(derive_seed(self.seed, epoch_key)))
            self.draws, self.di = np.empty(0), 0
            self._open(self.parent_start)
            self.table = np.empty(0, np.int64)
            self.swap_mode = False
            self.filled = False

    # -- the source's chunks ----------------------------------------------------------------
    def _open(self, source_state: Any) -> None:
        # Chunks of the sequential batch path's size (a chunk costs its scan call and its
        # bookkeeping here, and a buffer of large records spans hundreds of 1 MiB ones). A
        # local file's pages stay mapped while its chunks are held (buffered records are
        # parsed long after the scan passed them: released there, each faulted back in) and
        # are handed back as each chunk is let go (_compact, _release_due).
        self.span_chunks = SpanChunks(self.src, self.epoch_path, source_state, self.src.options.chunk_size,
                                      self.counters, self.errors, defer_data_crc=self.deferred,
                                      release_pages=False)
        self.deferred = self.span_chunks.defer_data_crc  # not without verify_crc or the native core
        self.recheck = self.recheck and not self.deferred
        self.it = iter(self.span_chunks)
        self.last_state = source_state

    def _file_id(self, url: str) -> int:
        """The pass's number of file ``url`` (for each batch's file mix, and its errors)."""
        file_id = self.file_ids.setdefault(url, len(self.file_ids))
        if file_id == len(self.file_urls):
            self.file_urls.append(url)
        return file_id

    def _read_to(self, target: int) -> None:
        """Read chunks until ``read >= target`` or the source ends."""
        while self.read < target and not self.ended:
            t0 = time.perf_counter()
            try:
                chunk, tag = next(self.it)
            except StopIteration:
                self.read_s += time.perf_counter() - t0
                self.ended = True
                self.span_chunks.finish_all()
                break
            self.read_s += time.perf_counter() - t0
            if chunk.handoff is not None:  # the deferred scan met a bad frame: the reference reader
                close_generator(self.it)  # reads on from it (and raises)
                self.span_chunks.rewind(tag.seq, chunk.handoff[0])
                self.it = iter(self.span_chunks)
                continue
            if not chunk.count:
                continue
            end = int(chunk.positions[-1] + chunk.lengths[-1]) + FRAME_OVERHEAD
            end_state = cursor_state(tag, end, None)
            url = tag.span.url
            file_id = self._file_id(url)
            crcs = chunk.crcs
            if crcs is IN_FRAME:  # a global shuffle's records, in their frames, unchecked: each frame's
                crcs = frame_crcs(*chunk.triple)  # stored CRC (flipped where its length fails)
                if isinstance(chunk.buffer, Buffers):  # in several files' maps: one buffer of their own
                    chunk = copied(chunk._replace(crcs=crcs))
            elif self.recheck:
                crcs = trailing_crcs(chunk)
            elif crcs is None and self.deferred:
                crcs = stored_crcs(chunk, np.arange(chunk.count))
            self.flat.add(self.read, chunk, crcs if crcs is not None else NO_CRCS, self.serial, file_id)
            self.chunks.append(_Chunk(self.read, chunk, url, self.last_state, end_state, self.serial))
            self.serial += 1
            # where each record of the chunk lies in its file, kept while any may be buffered
            # (not the chunk's bytes): what a state's "frames" is made from
            self.frame_index.append(chunk_entry(self.read, chunk, tag.span))
            self.last_state = end_state
            self.read += chunk.count
            self.span_chunks.delivered(tag.seq)

    # -- restoring from the buffered records' offsets --------------------------------------------
    def _frames_state(self, read: int) -> Frames | None:
        """The state's ``"frames"`` as a snapshot made into its JSON form only if the state is
        asked for (:class:`~shardfeed.pipeline.frames.Frames`): the buffered positions, the index of where records lie,
        and the source's cursor at upstream position ``read`` (the first record not drawn into
        the buffer yet); None where there is no such cursor."""
        resume = None
        for c in reversed(self.chunks):
            if c.base <= read < c.base + c.chunk.count:
                if not (isinstance(c.end_state, dict) and "offset" in c.end_state):
                    return None
                # a source's cursor is a byte offset in its span: here, the frame of position `read`
                resume = [read, dict(c.end_state, offset=int(c.chunk.positions[read - c.base]))]
                break
            if c.base + c.chunk.count <= read:
                break
        if resume is None:
            if read != self.read:
                return None
            resume = [self.read, self.last_state]
        index = self.frame_index
        while len(index) > 1 and index[0][0] + len(index[0][1]) <= self.oldest:
            index.popleft()  # no buffered record lies there any more
        if self.restored is not None and (not len(self.restored[0]) or self.oldest > self.restored[0][-1]):
            self.restored = None
        return Frames(resume, np.array(self._buffered(), dtype=np.int64), tuple(index), self.restored,
                       self.src.options.compression)

    def _fetch(self, frames: Mapping[str, Any]) -> None:
        """The records a state's ``"frames"`` names into ``survivors`` (:func:`fetch_frames`)."""
        got, self.restored = fetch_frames(self.src, frames, self.span_chunks.counters, self.span_chunks.cache)
        # records read back: checked there (no stored CRC kept), not views of a map
        self.survivors.update((p, (*v, None, None)) for p, v in got.items())

    # -- the draws ----------------------------------------------------------------------------
    def _fill_first(self) -> None:
        self._read_to(self.size)
        first = min(self.size, self.read)
        self.table = np.arange(first, dtype=np.int64)
        self.filled = True
        if self.ended and self.read < self.size:
            self.table = list(range(first))
            self.swap_mode = True

    def _draw(self, want: int) -> list[np.ndarray]:
        """Upstream positions of the next ``want`` outputs (fewer at the end)."""
        out: list[np.ndarray] = []
        while want > 0:
            if not self.swap_mode:
                size = self.size
                self._read_to(size + self.consumed + want)  # every draw's refill is at hand, or the source ended
                full = min(want, max(0, self.read - size - self.consumed))
                if full:
                    draws, self.draws, self.di = next_draws(self.rng, self.draws, self.di, full)
                    slots = (draws * size).astype(np.int64)
                    t = np.arange(full, dtype=np.int64)
                    order = np.lexsort((t, slots))  # by slot, then time
                    ss, ts = slots[order], t[order]
                    same = ss[1:] == ss[:-1]
                    prev = np.full(full, -1, np.int64)
                    prev[ts[1:][same]] = ts[:-1][same]
                    base = size + self.consumed
                    got = np.where(prev >= 0, base + prev, self.table[slots])
                    last = np.ones(full, bool)
                    last[:-1] = ~same
                    self.table[ss[last]] = base + ts[last]
                    if (got == self.oldest).any():  # the oldest buffered record went out
                        self.oldest = int(self.table.min())
                    self.consumed += full
                    want -= full
                    out.append(got)
                if want and self.ended:
                    self.table = self.table.tolist()
                    self.swap_mode = True
                continue
            table = self.table
            if not table:
                break
            n = min(want, len(table))
            draws, self.draws, self.di = next_draws(self.rng, self.draws, self.di, n)
            got_list = []
            for d in draws.tolist():
                i = int(d * len(table))
                got_list.append(table[i])
                table[i] = table[-1]
                table.pop()
            if self.oldest in got_list:
                self.oldest = min(table) if table else self.read
            self.consumed += n
            want -= n
            out.append(np.asarray(got_list, dtype=np.int64))
        return out

    def _release_later(self, chunk: FrameChunk, keep: Any = ()) -> None:
        """Hand back the pages of a mapped chunk let go of (but those of the byte ranges
        ``keep``) once the batches handed out by now are parsed (:data:`RELEASE_AFTER` batches
        on): released at once, a batch whose records lie there would fault them back in (and
        keep them)."""
        self.releases.append((self.batches_out + RELEASE_AFTER, chunk, keep))

    def _release_due(self) -> None:
        releases = self.releases
        while releases and releases[0][0] <= self.batches_out:
            _, chunk, keep = releases.popleft()
            release_chunk(chunk, keep)

    def __next__(self) -> tuple[FrameChunk, Any, Any, Any]:
        t0, read0 = time.perf_counter(), self.read_s
        self._release_due()
        self.batches_out += 1
        try:
            if not self.filled:
                self._fill_first()
            parts = self._draw(self.k)
            positions = np.concatenate(parts) if parts else np.empty(0, np.int64)
            if not len(positions) or (self.drop and len(positions) < self.k):
                raise StopIteration
            batch, urls = self._gather(positions)
            state = self.get_state()
            self._compact()
        finally:
            if self.stage is not None:
                self.stage.add_work(max(0.0, time.perf_counter() - t0 - (self.read_s - read0)))
                self.stage.extra["read_s"] = round(self.read_s, 6)
        if self.stage is not None:
            self.stage.elements += len(positions)

        def where(k: int) -> str:
            return f"byte offset {int(batch.positions[k])} of {mask(urls[k])} (upstream record #{int(positions[k])})"

        return batch, where, state, (positions, urls)

    def url_of(self, token: Any, k: int) -> str:
        """The (masked) file record ``k`` of the batch of ``token`` came from."""
        return mask(token[1][k])

    def record_groups(self, batch: FrameChunk, token: Any) -> list[tuple[str, np.ndarray]]:
        """Which records of ``batch`` (of ``token``) come from which file: ``(url, indices)`` pairs."""
        ids = np.asarray(batch.sources)
        groups = []
        for f in np.unique(ids).tolist():
            sel = np.flatnonzero(ids == f)
            groups.append((token[1][int(sel[0])], sel))
        return groups

    def rewind(self, batch: FrameChunk, token: Any, k: int, cause: CorruptRecordError | None = None) -> None:
        """Record ``k`` of a batch failed its data CRC, which the scan left to the parser
        (:attr:`deferred`), or lay past the end of a file truncated while it was read
        (``cause``, the parser's error): raised, named by its file and byte offset (a shuffled
        pass does not read on past a corrupt record under the raising policy)."""
        positions, urls = token
        check, detail = "data crc", f"upstream record #{int(positions[k])}"
        cut, sizes = past_new_end(batch.positions[k:k + 1], batch.lengths[k:k + 1], [(urls[k], slice(None))])
        if cause is not None and cause.check == "truncated data":
            check, detail = cause.check, f"{detail}; {cause.detail}"
        elif len(cut):
            # past the end of a file cut since it was read (the tail of the page holding the new
            # end reads as zeros without a fault: the CRC saw it first)
            check, detail = "truncated data", f"{detail}; {truncated_detail(sizes[urls[k]])}"
        raise CorruptRecordError(check, mask(urls[k]), int(batch.positions[k]), None, detail)

    # -- records at positions --------------------------------------------------------------------
    def _gather(self, positions: np.ndarray) -> tuple[FrameChunk, list[str]]:
        """The frames at ``positions``, in that order, as references into the buffers they
        lie in (:class:`~shardfeed.formats.native.Buffers`: the chunks read, the compacted
        records), and each record's file."""
        chunks = self.chunks
        n = len(positions)
        kept: dict[int, tuple] = {}
        survivors = self.survivors
        if survivors:  # a dict lookup a position: a batch is small, the survivors may be many
            for k, p in enumerate(positions.tolist()):
                got = survivors.pop(p, None)
                if got is not None:
                    kept[k] = got
        offs, lens, file_pos, crc_col, serials, fids = self.flat.columns(chunks[0].base if chunks else self.read)
        if kept:
            held = np.ones(n, bool)
            held[list(kept)] = False
            at = positions[held] - self.flat.base
        else:
            at = positions - self.flat.base
        src_off, lens, file_pos, serial, file_id = offs[at], lens[at], file_pos[at], serials[at], fids[at]
        crcs = crc_col[at] if self.deferred or self.recheck else None
        used = np.unique(serial)
        first = chunks[0].serial if chunks else 0
        # by reference: each record where it lies, in the chunk the source read (or its
        # compacted copy); the batch parser reads them there, so no byte is copied here
        bufs = [chunks[s - first].chunk.buffer for s in used.tolist()]
        slot = np.searchsorted(used, serial)
        if kept:  # the compacted records: buffers of their own, each after the chunks'
            out = [np.zeros(n, np.int64) for _ in range(5)]
            for col, got in zip(out, (src_off, lens, file_pos, slot, file_id)):
                col[held] = got
            src_off, lens, file_pos, slot, file_id = out
            if crcs is not None:
                all_crcs = np.zeros(n, np.uint32)
                all_crcs[held] = crcs
                crcs = all_crcs
            for k, got in sorted(kept.items()):
                pinned = got[4]
                if pinned is not None:  # a view of a map: its chunk's pages, once its last record is parsed
                    pinned[1] -= 1
                    if not pinned[1]:
                        self._release_later(pinned[0])
                lens[k], file_pos[k], slot[k] = len(got[0]), got[1], len(bufs)
                file_id[k] = self._file_id(got[2])
                bufs.append(got[0])
                if crcs is not None:  # a record read back by a restore was checked there: its CRC anew
                    crcs[k] = got[3] if got[3] is not None else masked_crc32c(got[0])
        urls = self.file_urls
        names = [urls[i] for i in file_id.tolist()]
        if len(bufs) == 1:
            batch = FrameChunk(bufs[0], src_off, lens, file_pos, file_id, crcs)
        else:
            batch = FrameChunk(Buffers(tuple(bufs), slot), src_off, lens, file_pos, file_id, crcs)
        return (own_copy(batch) if self.recheck else batch), names

    def _buffered(self) -> np.ndarray:
        t = self.table
        return t if isinstance(t, np.ndarray) else np.asarray(t, dtype=np.int64)

    def _compact(self) -> None:
        """Release chunks none of whose records is buffered; copy out the few buffered
        records of old chunks, so that memory stays near the buffer's size. Records not
        yet drawn into the buffer (read ahead) are never released."""
        chunks = self.chunks
        if len(chunks) < 2:
            return
        frontier = self.read if self.swap_mode else min(self.read, self.size + self.consumed)
        horizon = frontier - 2 * max(self.size, 1024)
        held = None
        while len(chunks) > 1:
            c = chunks[0]
            end = c.base + c.chunk.count
            if end > frontier:
                break
            if end <= self.oldest:  # nothing of it is buffered any more
                self._release_later(chunks.popleft().chunk)
                continue
            if end > horizon:
                break
            if held is None:
                held = self._buffered()
            live = held[(held >= c.base) & (held < end)]
            keep = []
            if len(live):
                # a file's map: the records stay where they lie (a view keeps the map), the
                # rest of the chunk's pages are handed back now, theirs once the last of them
                # is drawn (one call, not one a record); another buffer: copied out
                mapped = is_mapped(c.chunk.buffer)
                view = memoryview(c.chunk.buffer)
                pinned = [c.chunk, len(live)] if mapped else None
                crc_col = self.flat.columns(c.base)[3]  # empty when the parser checks no CRCs
                for p in live.tolist():
                    j = p - c.base
                    o, n = int(c.chunk.offsets[j]), int(c.chunk.lengths[j])
                    # the CRC its scan checked (the map may show other bytes by the time it is drawn)
                    crc = int(crc_col[p - self.flat.base]) if len(crc_col) else None
                    record = view[o: o + n] if mapped else bytes(view[o: o + n])
                    self.survivors[p] = (record, int(c.chunk.positions[j]), c.url, crc, pinned)
                    if mapped:
                        keep.append((o - 12, o + n + 4))
                self.old_starts.append((c.base, end, c.start_state))
            self._release_later(chunks.popleft().chunk, keep)

    # -- state --------------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """The unfused shuffle node's state at the same point (either chain resumes from it)."""
        size = self.size
        n_ended = self.read if self.ended else None
        read = size + self.consumed if n_ended is None else min(n_ended, size + self.consumed)
        if not self.filled:
            read = 0
        exhausted = bool(n_ended is not None and (n_ended < size or self.consumed > n_ended - size))
        state = {"seed": self.seed, "parent_start": self.parent_start, "consumed": self.consumed, "read": read,
                 "exhausted": exhausted, "anchor": None}
        oldest = self.oldest if len(self.table) else read
        starts = self.old_starts
        while starts and starts[0][1] <= oldest:  # the oldest buffered position only grows
            starts.popleft()
        anchor = [0, self.parent_start]
        for base, _, st in starts:
            if base <= oldest:
                anchor = [base, st]
        for c in self.chunks:
            if c.base > oldest:
                break
            anchor = [c.base, c.start_state]
        state["anchor"] = anchor
        if self.filled and read:
            frames = self._frames_state(read)
            if frames is not None:
                state["frames"] = frames
        return state

    def delivered(self, token: Any) -> None:
        pass

    def finish_all(self) -> None:
        self.span_chunks.finish_all()

    def close(self) -> None:
        try:
            self.span_chunks.close()
        finally:
            close_generator(self.it)
            self.chunks.clear()
            self.survivors.clear()
            self.releases.clear()  # the maps go with their last reference

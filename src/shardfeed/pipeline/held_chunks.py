"""The bookkeeping of the chunks a fused buffer shuffle holds (:mod:`shardfeed.pipeline.shuffle_batch`):
where each held record lies, as flat per-record arrays, the stored CRCs of records whose
chunk was checked when read, and a drawn batch's records copied into a buffer of its own."""

from __future__ import annotations

import numpy as np

from ..crc import masked_crc32c
from ..formats.chunks import FrameChunk
from ..formats.native import Buffers, gather
from ..formats.truncated import lost_in

NO_CRCS = np.zeros(0, np.uint32)
"""The CRC column of chunks whose CRCs the parser does not check."""
RELEASE_AFTER = 8
"""Batches handed out after the one that let go of a mapped chunk (or drew a record kept in
its map) before its pages are handed back: by then its records are parsed (a source batch
node parses at most two batches a thread ahead)."""


def stored_crcs(chunk: FrameChunk, j: np.ndarray) -> np.ndarray:
    """The masked data CRCs of records ``j`` of a chunk whose scan checked them (read by the
    reference reader after a deferred scan's handoff), for a batch whose parser checks them."""
    view = memoryview(chunk.buffer).cast("B")
    return np.fromiter((masked_crc32c(view[o:o + n]) for o, n in zip(chunk.offsets[j].tolist(),
                                                                      chunk.lengths[j].tolist())),
                       dtype=np.uint32, count=len(j))


def trailing_crcs(chunk: FrameChunk) -> np.ndarray:
    """The masked data CRCs stored after each record of ``chunk`` (the 4 bytes that follow its
    data in the frame), as the buffer holds them now: read at the scan that checked them,
    they let the parser check that the bytes it copies out later are still those bytes (a
    file's map shows a rewrite of the file in place). A chunk whose records do not lie in
    their frames (the reference reader's, records copied out one by one: their first and
    last length fields are not before them) gets its records' CRCs computed instead."""
    if not chunk.count:
        return NO_CRCS
    view = np.frombuffer(memoryview(chunk.buffer).cast("B"), np.uint8)
    offsets, lengths = np.asarray(chunk.offsets, np.int64), np.asarray(chunk.lengths, np.int64)
    ends = [(int(offsets[k]), int(lengths[k])) for k in (0, -1)]
    if any(o < 12 or o + n + 4 > len(view) or int(view[o - 12:o - 4].view("<u8")[0]) != n for o, n in ends):
        return stored_crcs(chunk, np.arange(chunk.count))
    at = (offsets + lengths)[:, None] + np.arange(4)
    return np.ascontiguousarray(view[at]).view("<u4").reshape(-1).astype(np.uint32)


class Flat:
    """Where each record of the chunks held lies, one entry a record from upstream position
    ``base`` on (offsets and lengths in its chunk's buffer, frame offsets in its file, stored
    data CRCs, its chunk's serial number, its file's number): a batch's frames are found with
    a few indexings, not a step per chunk (a batch of large records draws from tens of
    chunks)."""

    def __init__(self) -> None:
        self.base = 0
        self.cols: tuple = tuple(np.zeros(0, np.uint32 if i == 3 else np.int64) for i in range(6))
        self.pending: list[tuple] = []

    def add(self, base: int, chunk: FrameChunk, crcs: np.ndarray, serial: int, file_id: int) -> None:
        if not len(self.cols[0]) and not self.pending:
            self.base = base
        n = chunk.count
        self.pending.append((chunk.offsets, chunk.lengths, chunk.positions, crcs,
                             np.full(n, serial, np.int64), np.full(n, file_id, np.int64)))

    def columns(self, start: int) -> tuple:
        """The columns, with entries before position ``start`` (no longer held) let go of."""
        if self.pending:
            cut = min(max(0, start - self.base), len(self.cols[0]))
            parts = [tuple(c[cut:] for c in self.cols), *self.pending]
            self.cols = tuple(np.concatenate([p[i] for p in parts]) for i in range(6))
            self.base += cut
            self.pending = []
        return self.cols


def own_copy(batch: FrameChunk) -> FrameChunk:
    """``batch`` with its records copied into one buffer of its own (:func:`copied`), for a
    parser that checks them against the CRCs their scan read: the check and every value the
    parser copies out later then see the same bytes, whatever another process writes into the
    file meanwhile (values are read from a file's map long after a check of the map itself: a
    file rewritten over and over in place gave records whose numbers came from one version
    and whose bytes from another). A batch with a record past the end of a file cut while it
    was read (the copy touched every page: the guard has noted it by now) goes on as it was,
    for the parser to name what was cut."""
    own, groups = _copy_groups(batch)
    if any(len(lost_in(b, batch.offsets[sel], batch.lengths[sel])) for b, sel in groups):
        return batch
    return own


def copied(batch: FrameChunk) -> FrameChunk:
    """``batch`` with its records copied into one buffer of its own (one native ``memcpy`` a
    source buffer, the GIL released)."""
    return _copy_groups(batch)[0]


def _copy_groups(batch: FrameChunk) -> tuple[FrameChunk, list]:
    n = batch.count
    lens = np.asarray(batch.lengths, np.int64)
    offsets = np.zeros(n, np.int64)
    if n > 1:
        np.cumsum(lens[:-1], out=offsets[1:])
    own = np.empty(int(lens.sum()), np.uint8)
    buf = batch.buffer
    groups: list
    if isinstance(buf, Buffers):  # the records of each source buffer: one sort, not a scan a buffer
        order = np.argsort(buf.which, kind="stable")
        which = np.asarray(buf.which)[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(which)) + 1))
        groups = [(buf.buffers[int(which[a])], sel) for a, sel in zip(starts.tolist(), np.split(order, starts[1:]))]
    else:
        groups = [(buf, slice(None))]
    for b, sel in groups:
        gather(own, offsets[sel], b, batch.offsets[sel], lens[sel])
    return FrameChunk(own, offsets, lens, batch.positions, batch.sources, batch.crcs), groups

"""Where a shuffle's buffered records lie in their files, so that a restore reads back exactly
those records (at most one buffer) instead of re-reading from an older cursor.

A shuffle buffer holds records drawn from up to ``buffer * ln(buffer)`` positions back. A
state that names each buffered record's file, byte offset and length (``"frames"``: zlib
compressed deltas, a few bytes a record) and the cursor of the first record not drawn into
the buffer yet lets a restore fetch those frames by offset (nearby ones in one ranged read,
through the source's own framing: CRC checks, I/O counters, the object cache) and go on from
the cursor.

Two shuffles keep such states: the fused ``source.shuffle(n).batch(k)``
(:mod:`~shardfeed.pipeline.shuffle_batch`), which holds the source's chunks itself, and the
shuffle node over a chain whose elements are the source's records one for one (the source,
or ``map`` stages on it: :meth:`~shardfeed.pipeline.dataset.Dataset._record_source`). The
latter learns where each record lies through a :class:`FrameRecorder` the source fills as it
hands out chunks, and restores by replaying that chain over the fetched records
(:class:`Replay`: the source yields them, the maps map them again).
"""

from __future__ import annotations

import base64
import collections
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import CorruptRecordError
from ..formats.chunks import FrameChunk, iter_frame_chunks
from ..formats.compression import normalize_compression
from ..formats.tfrecord import FRAME_OVERHEAD, ReadStats
from ..storage.urls import mask
from .deferred import DeferredState
from .identity import state_url
from .spans import GatherPlan

FRAMES_GAP = 64 << 10
"""Buffered frames closer than this in a file are read back in one range on restore."""


_NARROW = ("<i1", "<i2", "<i4", "<i8")


def pack_ints(values: np.ndarray) -> str:
    """int64 values as a state field: their deltas in the narrowest integer type that holds
    them, zlib-compressed (level 1: a state is made for every step a ``StatefulDataLoader``
    takes), base64, prefixed with the type (``"i2:..."``)."""
    deltas = np.diff(np.asarray(values, np.int64), prepend=np.int64(0))
    lo, hi = (int(deltas.min()), int(deltas.max())) if len(deltas) else (0, 0)
    dtype = next(t for t in _NARROW if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)
    packed = base64.b64encode(zlib.compress(deltas.astype(dtype).tobytes(), 1)).decode("ascii")
    return f"{dtype[1:]}:{packed}"


def unpack_ints(text: str) -> np.ndarray:
    """The values :func:`pack_ints` packed (and the plain base64 of int64 deltas an earlier
    version wrote)."""
    dtype, _, packed = text.rpartition(":")
    if dtype not in ("", "i1", "i2", "i4", "i8"):
        raise ValueError(f"not a packed integer field: {text[:40]!r}")
    raw = np.frombuffer(zlib.decompress(base64.b64decode(packed)), "<" + (dtype or "i8"))
    return np.cumsum(raw, dtype=np.int64)


def chunk_entry(base: int, chunk: FrameChunk, span: Any) -> tuple:
    """Where the records of ``chunk`` (upstream positions ``base...``) lie: ``(base, file
    offsets, lengths, url)``; ``url`` is ``(urls, file of each record)`` for a global
    shuffle's window (its chunks' positions are offsets in the window, not in a file)."""
    plan = span.handle
    if isinstance(plan, GatherPlan):
        k = np.searchsorted(plan.virtual, chunk.positions)
        return base, plan.offsets[k], chunk.lengths, (plan.urls, plan.files[k])
    return base, chunk.positions, chunk.lengths, span.url


def entry_url_ids(url: Any, j: np.ndarray, id_of: Any) -> Any:
    """The ids (``id_of(name)``) of the files of records ``j`` of an index entry whose
    ``url`` is a name (one id) or a global shuffle window's ``(urls, file of each record)``."""
    if isinstance(url, str):
        return id_of(url)
    names, files = url
    return np.array([id_of(u) for u in names], np.int64)[files[j]]


class Frames(DeferredState):
    """A state's ``"frames"``, made into JSON only when the state is asked for (every element
    or batch carries a state; few are saved): the buffered positions (an array or a list, a
    copy), the index of where the records since the oldest of them lie (entries
    of :func:`chunk_entry`), the records a restore read back, and the cursor ``resume``
    (``[position, state]`` of the first record not drawn into the buffer)."""

    __slots__ = ("resume", "positions", "index", "restored", "compression", "kept")

    def __init__(self, resume: list, positions: Any, index: tuple, restored: tuple | None,
                 compression: Any, kept: tuple | None = None) -> None:
        self.resume, self.positions, self.index = resume, positions, index
        self.restored, self.compression = restored, compression
        self.kept = kept  # a KeptRecords snapshot: where each position's record lies (a filter between)

    def value(self) -> dict | None:
        positions = np.asarray(self.positions, np.int64)
        before = np.sort(positions[positions < self.resume[0]])
        at = np.zeros(len(before), np.int64)
        lens = np.zeros(len(before), np.int64)
        url_of = np.zeros(len(before), np.int64)
        urls: dict[str, int] = {}

        def url_id(u: str) -> int:
            return urls.setdefault(u, len(urls))

        dense = np.ones(len(before), bool)
        if self.restored is not None:  # records a restore read back: their offsets as the state gave them
            rpos, rat, rlens, rurl_of, rurls = self.restored
            k = np.clip(np.searchsorted(rpos, before), 0, max(len(rpos) - 1, 0))
            hit = (rpos[k] == before) if len(rpos) else np.zeros(len(before), bool)
            at[hit], lens[hit] = rat[k[hit]], rlens[k[hit]]
            for u in np.unique(rurl_of[k[hit]]).tolist():
                url_of[hit & (rurl_of[k] == u)] = url_id(rurls[u])
            dense = ~hit
        if self.kept is not None:  # a filter between: where each element it let through lies
            got = kept_frames(self.kept, before[dense])
            if got is None:
                return None
            at[dense], lens[dense] = got[0], got[1]
            url_of[dense] = [url_id(u) for u in got[2]]
        else:
            bases = np.fromiter((e[0] for e in self.index), dtype=np.int64, count=len(self.index))
            which = np.searchsorted(bases, before, side="right") - 1
            which[~dense] = -2
            if (which == -1).any():
                return None
            for w in np.unique(which[dense]).tolist():
                base, offsets, lengths, url = self.index[w]
                sel = dense & (which == w)
                j = before[sel] - base
                if j.max() >= len(offsets):
                    return None
                at[sel], lens[sel] = offsets[j], lengths[j]
                url_of[sel] = entry_url_ids(url, j, url_id)
        if any(normalize_compression(self.compression, u) is not None for u in urls):
            return None  # a compressed stream has no byte offsets to read back from
        # the files by the names a state gives them (no signature): a restore reads the live URLs
        return {"resume": self.resume, "urls": [state_url(u) for u in urls], "pos": pack_ints(before),
                "url": pack_ints(url_of), "at": pack_ints(at), "len": pack_ints(lens)}


def fetch_frames(src: Any, frames: Mapping[str, Any], counters: Any, cache: Any
                 ) -> tuple[dict[int, tuple[bytes, int, str]], tuple]:
    """The records a state's ``"frames"`` names, ``{position: (record, file offset, url)}``,
    read by offset (nearby frames in one range) through the source's own framing (its CRC
    checks, I/O counters and object cache); and the ``restored`` index (positions, offsets,
    lengths, url ids, urls) a later state names them by. A frame that is not where the state
    says fails with a :class:`~shardfeed.errors.CorruptRecordError` naming file and offset."""
    live = {state_url(u): u for u in getattr(src.provider, "urls", None) or ()}
    urls = [live.get(u, u) for u in frames["urls"]]  # a presigned URL as the dataset has it now
    pos, url_of = unpack_ints(frames["pos"]), unpack_ints(frames["url"])
    at, lens = unpack_ints(frames["at"]), unpack_ints(frames["len"])
    opts = src.options
    out: dict[int, tuple[bytes, int, str]] = {}
    stats = ReadStats()
    for u, url in enumerate(urls):
        sel = np.flatnonzero(url_of == u)
        sel = sel[np.argsort(at[sel], kind="stable")]
        k = 0
        while k < len(sel):
            first, end = k, int(at[sel[k]] + lens[sel[k]]) + FRAME_OVERHEAD
            while k + 1 < len(sel) and int(at[sel[k + 1]]) - end <= FRAMES_GAP:
                k += 1
                end = max(end, int(at[sel[k]] + lens[sel[k]]) + FRAME_OVERHEAD)
            # a file listed twice has the same frame buffered at two positions
            wanted: dict[int, list[int]] = {}
            length: dict[int, int] = {}
            for i in sel[first:k + 1].tolist():
                wanted.setdefault(int(at[i]), []).append(int(pos[i]))
                length[int(at[i])] = int(lens[i])
            start = int(at[sel[first]])
            try:
                try:
                    _read_wanted(opts, url, start, end, wanted, out, stats, counters, cache)
                except CorruptRecordError as exc:
                    if exc.offset in wanted:
                        raise
                    # a frame between buffered ones is corrupt (one the pass skipped): each
                    # buffered frame left is read alone, and only their own damage raises
                    for o in sorted(wanted):
                        _read_wanted(opts, url, o, o + length[o] + FRAME_OVERHEAD, wanted, out, stats, counters,
                                     cache)
            except CorruptRecordError as exc:
                # numbered from the ranged read's start, not the file's: no record number
                err = CorruptRecordError(exc.check, exc.url, exc.offset, None, exc.detail)
                err.add_note("(a shuffle restore reading back its buffer: was the file changed since the "
                             "state was saved?)")
                raise err from None
            if wanted:
                raise CorruptRecordError("frame start", mask(url), min(wanted), detail=(
                    "the restored state names a record here and no frame starts at this offset: was the file "
                    "changed since the state was saved?"))
            k += 1
    src._merge_stats(stats)
    return out, (pos, at, lens, url_of, urls)


def _read_wanted(opts: Any, url: str, lo: int, hi: int, wanted: dict, out: dict, stats: ReadStats, counters: Any,
                 cache: Any) -> None:
    """The frames of ``wanted`` (frame offset -> positions) found in bytes ``lo`` to ``hi`` of
    ``url``, taken from ``wanted`` into ``out`` (position -> (record, file offset, url))."""
    for chunk in iter_frame_chunks(url, None, opts.verify_crc, "raise", opts.storage_options, chunk_size=hi - lo,
                                   stats=ReadStats(), start_offset=lo, end_offset=hi, counters=counters, cache=cache):
        view = memoryview(chunk.buffer)
        for j in np.flatnonzero(np.isin(chunk.positions, list(wanted))).tolist():
            o, n = int(chunk.offsets[j]), int(chunk.lengths[j])
            ps = wanted.pop(int(chunk.positions[j]))
            record = bytes(view[o:o + n])
            for p in ps:
                out[p] = (record, int(chunk.positions[j]), url)
            stats.records += len(ps)
            stats.reread += len(ps)
            stats.bytes += (n + FRAME_OVERHEAD) * len(ps)


class KeptRecords:
    """Where the record of each element a ``filter`` let through lies (file offset, length,
    file), in order, the element numbered ``base`` first; and the number of the last one's
    record. Blocks of arrays, appended as the recorder looks records up, so that a state's
    snapshot of it costs little; only the elements let through are kept, however few."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.blocks: collections.deque = collections.deque()  # (offsets, lengths, url ids) arrays
        self.urls: list[str] = []
        self.url_ids: dict[str, int] = {}
        self.last_record = -1

    def url_id(self, url: str) -> int:
        uid = self.url_ids.get(url)
        if uid is None:
            uid = self.url_ids[url] = len(self.urls)
            self.urls.append(url)
        return uid

    def snapshot(self) -> tuple:
        return self.base, tuple(self.blocks), tuple(self.urls)

    def trim(self, oldest: int) -> None:
        """Drop the blocks wholly before element ``oldest``."""
        while len(self.blocks) > 1 and self.base + len(self.blocks[0][0]) <= oldest:
            self.base += len(self.blocks.popleft()[0])


def kept_frames(kept: tuple, positions: np.ndarray) -> tuple | None:
    """``(offsets, lengths, urls)`` of the elements at ``positions`` from a
    :meth:`KeptRecords.snapshot` (``urls``: each element's file); None when some position is
    not in it."""
    base, blocks, urls = kept
    if not blocks:
        return None if len(positions) else (positions, positions, [])
    at, lens, uid = (np.concatenate([b[k] for b in blocks]) for k in range(3))
    j = positions - base
    if len(j) and (j.min() < 0 or j.max() >= len(at)):
        return None
    return at[j], lens[j], [urls[u] for u in uid[j].tolist()]


class FrameRecorder:
    """Filled by a source built with it (``Build.frames``): where each record it hands out
    lies, an entry of :func:`chunk_entry` a chunk, records numbered from ``base``. With
    ``kept_base`` (a ``filter`` between the source and the shuffle), the filter puts the
    number of each record it lets through into ``pending``, and :meth:`resolve` looks up where
    they lie into ``kept``, the first being upstream position ``kept_base``; without, an
    element's upstream position is its record's number. The shuffle that made it trims what
    no buffered element needs any more."""

    def __init__(self, base: int = 0, kept_base: int | None = None) -> None:
        self.count = base
        self.index: collections.deque = collections.deque()
        self.kept = KeptRecords(kept_base) if kept_base is not None else None
        self.pending: list[int] = []  # records of elements a filter let through, not looked up yet

    def add(self, chunk: FrameChunk, span: Any) -> None:
        if self.pending and len(self.index) >= 4:  # a filter's elements let through: where they lie, now
            self.resolve()
        self.index.append(chunk_entry(self.count, chunk, span))
        self.count += chunk.count

    def trim(self, oldest: int) -> None:
        """Drop what lies wholly before upstream position ``oldest`` (with a filter between:
        the kept elements' places; the filter forgets the chunks it has passed itself)."""
        if self.kept is not None:
            self.resolve()
            self.kept.trim(oldest)
            return
        self.forget_before(oldest)

    def forget_before(self, record: int) -> None:
        """Drop the chunks wholly before ``record``."""
        index = self.index
        while len(index) > 1 and index[0][0] + len(index[0][1]) <= record:
            index.popleft()

    def resolve(self) -> None:
        """Where the records of ``pending`` lie, into ``kept`` (vectorized, a chunk at a time);
        then the chunks before the last of them go (the filter has passed them)."""
        pending, kept = self.pending, self.kept
        if not pending or kept is None:
            return
        recs = np.array(pending, np.int64)
        self.pending = []
        kept.last_record = int(recs[-1])
        at = np.zeros(len(recs), np.int64)
        lens = np.zeros(len(recs), np.int64)
        uid = np.full(len(recs), -1, np.int64)
        for base, offsets, lengths, url in self.index:
            lo, hi = np.searchsorted(recs, [base, base + len(offsets)])
            if lo == hi:
                continue
            j = recs[lo:hi] - base
            at[lo:hi], lens[lo:hi] = offsets[j], lengths[j]
            uid[lo:hi] = entry_url_ids(url, j, kept.url_id)
        if (uid < 0).any():
            raise RuntimeError(f"shuffle offsets: record #{int(recs[uid < 0][0])} is not among the chunks the "
                               "source handed out")
        kept.blocks.append((at, lens, uid))
        self.forget_before(int(recs[-1]))


class Replay:
    """Passed as ``Build.frames``: the source yields these serialized records (parsed as it
    would parse its own) and ends; the stages above map them as they mapped the originals."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = records

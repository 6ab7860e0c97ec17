"""Reading a window of a global shuffle: records from wherever they are, in the window's
order, as chunks of one virtual file (:class:`~shardfeed.pipeline.spans.GatherPlan`).

Local shards (and remote ones in the local cache) are mapped, and one native call per
chunk (``_native.gather_frames``) copies the chunk's frames into one (pooled) buffer in the
window's order, prefetching the frames ahead (a random read of the page cache), and checks
each as it copies it: its length against the index, both CRCs (the data's computed in the copy).
The batch parser then reads them there; nothing in Python is done per record. A chunk
with a frame that fails a check is gathered again by the reference path (copied, then
scanned frame by frame), which raises or skips exactly as a sequential read does, naming
the file and byte offset, so a global shuffle delivers the same records, checked the same
way, as a sequential read. A remote shard with no cache is read by ranged GETs, several at once:
one per run of the window's records of a file whose frames lie within
:data:`COALESCE_GAP` bytes of each other (often one per record): correct, but slow; a
warning when the records are first indexed says so, with the numbers, and steers to
``cache_dir`` or ``shuffle="blocks"``; the source gathers only
:data:`~shardfeed.pipeline.span_reader.REMOTE_GATHER_AHEAD` such windows at once.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import CorruptRecordError, warn_skipped
from ..formats.chunks import FrameChunk, map_file
from ..formats.index import StaleIndexError, forget_index, index_url_of, local_stamp, stale_at
from ..formats.native import IN_FRAME, Buffers, gather, scan_frames
from ..formats.tfrecord import MAX_RECORD_BYTES, ReadStats
from ..formats.truncated import lost_frames, past_new_end, truncated_detail
from ..storage import io as sio
from ..storage.fetch import RangeStream
from ..storage.urls import mask, parse_url
from .spans import GatherPlan

try:
    from .._native import gather_frames as _gather_frames  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _gather_frames = None

logger = logging.getLogger(__name__)

COALESCE_GAP = 128 << 10
"""Records of one file in one window whose frames are at most this many bytes apart are
fetched by one ranged GET (the bytes between them read and dropped): a round trip saved
costs at most this many bytes, which a link of 20 ms and 25 MB/s per connection moves in
5 ms."""
MAX_COALESCED = 1 << 20
"""A coalesced GET covers at most this many bytes (the smallest part a link's plan picks,
so it is one GET; many such GETs of a window go out at once)."""

IN_PLACE = True
"""Whether a consumer that parses natively gets a window's records where they lie in the
mapped files (``gather_chunks(direct=True)``); ``False``: copied and checked here first,
the path before (kept for the benchmark's before/after and where the extension is old)."""

MAPS_KEPT = 256
"""Files kept mapped between windows: a window touches records all over every file, and
mapping a file afresh costs a page fault per page touched."""
PRUNE_EVERY = 64
"""Maps made between two looks at the files kept mapped: one deleted, replaced or changed
since is let go (a deleted file's map would keep its disk space in use)."""
_maps: collections.OrderedDict = collections.OrderedDict()  # (path, size, mtime, ino) -> mmap
_maps_lock = threading.Lock()
_made = [0]


def _prune() -> None:
    """Let go of the maps of files deleted or changed since they were mapped."""
    with _maps_lock:
        keys = list(_maps)
    gone = [k for k in keys if (k[0], *(local_stamp(k[0]) or ())) != k]
    with _maps_lock:
        for k in gone:
            _maps.pop(k, None)


def _mapped(path: str) -> Any:
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)  # local_stamp's order: _prune compares them
    with _maps_lock:
        mm = _maps.get(key)
        if mm is not None:
            _maps.move_to_end(key)
            return mm
    if st.st_size == 0:
        return b""
    # no descriptor kept open (Python's mmap keeps one): a pass holds a map of every file it
    # gathers from, thousands of them under the usual limit of 1,024 open files
    _made[0] += 1
    if _made[0] % PRUNE_EVERY == 0:
        _prune()
    mm = map_file(path)
    with _maps_lock:
        for old in [k for k in _maps if k[0] == path and k != key]:  # that file as it was: not read again
            del _maps[old]
        mm = _maps.setdefault(key, mm)
        while len(_maps) > MAPS_KEPT:
            # dropped, not closed: a window being gathered may still hold it; the map goes
            # when its last user lets go
            _maps.popitem(last=False)
    return mm


def _source(url: str, o: Any, counters: Any, cache: Any, seen: set) -> Any:
    """A mapped view of ``url``'s bytes, or ``None`` when it must be read by ranges.
    ``seen``: the cached objects already counted as hits in this pass."""
    path = None
    if parse_url(url).is_local:
        path = parse_url(url).path
    elif cache is not None:
        path = cache.fetch(url, o.storage_options, counters, seen=seen)
    if path is None:
        return None
    try:
        return _mapped(path)
    except OSError as exc:
        raise sio._translate(exc, url, "open") from exc


def gather_chunks(plan: GatherPlan, start: int, o: Any, chunk_size: int, stats: ReadStats, counters: Any,
                  cache: Any, seen: set | None = None, opened: dict[str, Any] | None = None,
                  direct: bool = False) -> Iterator[FrameChunk]:
    """The records of ``plan`` from the one whose frame starts at virtual byte ``start``
    on, as chunks of about ``chunk_size`` bytes (``seen``: cached objects already counted
    in this pass; ``opened``: the pass's ``{url: mapped view or None}``, so that a file is
    stated, looked up in the cache and mapped once a pass, not once a window).

    ``direct`` (a consumer that parses natively and rewinds at a failed check, as for
    deferred data CRCs): where every file is mapped, a chunk is the records where they lie
    in the maps, nothing copied or checked here (``crcs`` :data:`~shardfeed.formats.native.IN_FRAME`:
    the parsing threads check each frame); its records are counted by the consumer as it
    takes them, not in ``stats``."""
    seen = seen if seen is not None else set()
    opened = opened if opened is not None else {}
    n = len(plan.files)
    k = int(np.searchsorted(plan.virtual, start, "left"))
    ends = plan.virtual + plan.lengths
    sources: dict[int, Any] = {}
    pool: ThreadPoolExecutor | None = None
    every = (_all_sources(plan, o, counters, cache, seen, opened) if direct and IN_PLACE and _gather_frames is not None
             else None)
    try:
        while k < n:
            j = int(np.searchsorted(ends, plan.virtual[k] + chunk_size, "right"))
            j = max(j, k + 1)
            if every is not None:
                chunk = _in_place(plan, k, j, *every)
                if chunk is not None:
                    yield chunk
                    k = j
                    continue
            base = int(plan.virtual[k])
            files = plan.files[k:j]
            dst = plan.virtual[k:j] - base
            used, local = np.unique(files, return_inverse=True)
            for f in used.tolist():
                if f not in sources:
                    url = plan.urls[f]
                    if url not in opened:
                        opened[url] = _source(url, o, counters, cache, seen)
                    sources[f] = opened[url]
            fused = _fused(plan, k, j, int(ends[j - 1]) - base, dst, used, local, sources, o, stats)
            if fused is not None:
                yield _uncounted(fused, stats) if direct else fused
                k = j
                continue
            buf = bytearray(int(ends[j - 1]) - base)
            remote = []
            for f in used.tolist():
                src = sources[f]
                sel = np.flatnonzero(files == f)
                if src is None:
                    remote += [(f, int(plan.offsets[k + i]), int(plan.lengths[k + i]), int(dst[i])) for i in sel]
                    continue
                inside = plan.offsets[k + sel] + plan.lengths[k + sel] <= len(src)
                past = sel[~inside]
                if len(past) and o.on_corrupt != "skip":
                    raise CorruptRecordError("truncated data", mask(plan.urls[f]), int(plan.offsets[k + past[0]]),
                                             None, f"the file ({len(src)} bytes) is shorter than its index file "
                                             "says: it was cut since the index was written, or while this pass "
                                             "read it (rebuild the index with `shardfeed index`)")
                sel = sel[inside]
                gather(buf, dst[sel], src, plan.offsets[k + sel], plan.lengths[k + sel])
                # past its file's end (cut before it was mapped, or truncated while mapped): its
                # place fails the scan, which counts it (skip) or raises naming it
                lost = np.concatenate([past, sel[lost_frames(src, plan.offsets[k + sel], plan.lengths[k + sel])],
                                       _past_end(plan, k, sel, o)])
                for i in lost.tolist():
                    buf[int(dst[i]):int(dst[i]) + 8] = b"\xff" * 8
            if remote:
                pool = pool or ThreadPoolExecutor(16, thread_name_prefix="shardfeed-gather")

                def get(run: tuple, buf: bytearray = buf) -> None:
                    f, a, b, members = run
                    with RangeStream(plan.urls[f], a, b, o.storage_options, counters, small_first=False) as stream:
                        data = memoryview(stream.readall())  # retried, counted and length-checked there
                    for off, ln, d in members:
                        buf[d:d + ln] = data[off - a:off - a + ln]

                for _ in pool.map(get, coalesce(remote)):
                    pass
            checked = _checked(plan, k, j, buf, base, o, stats)
            yield _uncounted(checked, stats) if direct else checked
            k = j
    finally:
        if pool is not None:
            pool.shutdown(wait=True)


def _all_sources(plan: GatherPlan, o: Any, counters: Any, cache: Any, seen: set,
                 opened: dict) -> tuple[tuple, np.ndarray] | None:
    """Every file of ``plan`` mapped, once a pass: ``(maps, their sizes)``, one tuple for
    all the pass's chunks (so the batches they make are joined by offsets alone); ``None``
    when some file must be read by ranges."""
    key = ("every", id(plan.urls))
    got = opened.get(key)
    if got is None or got[0] is not plan.urls:
        maps = []
        for url in plan.urls:
            if url not in opened:
                opened[url] = _source(url, o, counters, cache, seen)
            maps.append(opened[url])
        every = None if any(m is None for m in maps) else (tuple(maps), np.array([len(m) for m in maps], np.int64))
        got = opened[key] = (plan.urls, every)
    return got[1]


def _in_place(plan: GatherPlan, k: int, j: int, maps: tuple, sizes: np.ndarray) -> FrameChunk | None:
    """Records ``k .. j`` of ``plan`` where they lie in ``maps``, each frame to be checked
    by the parser (:data:`~shardfeed.formats.native.IN_FRAME`); ``None`` where one would
    fail before that (a file shorter than its index says, an absurd length): the copying
    path then says what is wrong, as a read of the file would."""
    files, offsets, lengths = plan.files[k:j], plan.offsets[k:j], plan.lengths[k:j]
    if int(lengths.max()) - 16 > MAX_RECORD_BYTES or bool((offsets + lengths > sizes[files]).any()):
        return None
    return FrameChunk(Buffers(maps, files), offsets + 12, lengths - 16, plan.virtual[k:j], files, IN_FRAME)


def _uncounted(chunk: FrameChunk, stats: ReadStats) -> FrameChunk:
    """``chunk`` (copied and checked here, its records counted in ``stats``) for a consumer
    that counts the records it takes itself: taken back out of ``stats``."""
    stats.records -= chunk.count
    stats.bytes -= int(chunk.lengths.sum()) + 16 * chunk.count
    return chunk


def _past_end(plan: GatherPlan, k: int, sel: np.ndarray, o: Any) -> np.ndarray:
    """Without CRCs: which of records ``k + sel`` (one local file's) now lie past its end (the
    rest of the page holding a cut file's new end reads as zeros, and no fault says so)."""
    if o.verify_crc or not len(sel):
        return np.zeros(0, np.int64)
    url = plan.urls[int(plan.files[k + int(sel[0])])]
    return sel[past_new_end(plan.offsets[k + sel], plan.lengths[k + sel] - 16, [(url, slice(None))])[0]]


def _fused(plan: GatherPlan, k: int, j: int, size: int, dst: np.ndarray, used: np.ndarray, local: np.ndarray,
           sources: dict[int, Any], o: Any, stats: ReadStats) -> FrameChunk | None:
    """Records ``k .. j`` of ``plan`` gathered and checked by one native call (every
    file mapped), or ``None``: a file must be read by ranges, the extension is not built,
    or a frame failed a check (the reference path then raises or skips it)."""
    srcs = tuple(sources[f] for f in used.tolist())
    if _gather_frames is None or None in srcs:
        return None
    offsets, lengths = plan.offsets[k:j], plan.lengths[k:j]
    if int(lengths.max()) - 16 > MAX_RECORD_BYTES:  # the scan's "absurd length": the reference path says it
        return None
    local = np.ascontiguousarray(local, dtype=np.int64)
    # in the window's order: the frames ahead are prefetched as each is copied, which hides the
    # random read (sorting them by file and offset first saved nothing more from the page
    # cache, and cost a sort per window)
    buf, bad, _ = _gather_frames(size, dst, srcs, local, offsets, lengths, None, bool(o.verify_crc))
    if bad != j - k:
        return None
    for i, src in enumerate(srcs):  # copied from a map past its file's new end: zeros (the reference path says so)
        sel = np.flatnonzero(local == i)
        if len(lost_frames(src, offsets[sel], lengths[sel])) or len(_past_end(plan, k, sel, o)):
            return None
    stats.records += j - k
    stats.bytes += int(lengths.sum())  # frames, framing included, as the scan counts them
    return FrameChunk(buf, dst + 12, lengths - 16, plan.virtual[k:j], plan.files[k:j])


def coalesce(records: list[tuple[int, int, int, int]], gap: int | None = None,
             limit: int | None = None) -> list[tuple[int, int, int, list[tuple[int, int, int]]]]:
    """Ranged reads for ``records`` (``(file, offset, length, destination)`` each): per
    file, in offset order, records whose frames are at most ``gap`` bytes apart (default
    :data:`COALESCE_GAP`) share one read of at most ``limit`` bytes (default
    :data:`MAX_COALESCED`, or one record's frame if larger). Each read is ``(file, start,
    end, [(offset, length, destination), ...])``."""
    gap = COALESCE_GAP if gap is None else gap
    limit = MAX_COALESCED if limit is None else limit
    runs: list[tuple[int, int, int, list[tuple[int, int, int]]]] = []
    for f, off, ln, d in sorted(records):
        if runs:
            f0, a, b, members = runs[-1]
            if f0 == f and off - b <= gap and max(b, off + ln) - a <= limit:
                runs[-1] = (f, a, max(b, off + ln), members)
                members.append((off, ln, d))
                continue
        runs.append((f, off, off + ln, [(off, ln, d)]))
    return runs


def _checked(plan: GatherPlan, k: int, j: int, buf: bytearray, base: int, o: Any, stats: ReadStats) -> FrameChunk:
    """The chunk of records ``k .. j`` in ``buf``, each frame checked as a file's would be;
    a bad one raises naming its own file and offset, or is skipped and counted."""
    offsets, lengths, consumed, error = scan_frames(buf, o.verify_crc)
    keep = np.ones(j - k, dtype=bool)
    if error is not None or len(offsets) != j - k:
        # find the bad frames one by one, so every good one still goes out
        offs, lens = [], []
        for i in range(k, j):
            d = int(plan.virtual[i]) - base
            ln = int(plan.lengths[i])
            off1, len1, _, err1 = scan_frames(memoryview(buf)[d:d + ln], o.verify_crc)
            if err1 is None and len(off1) == 1:
                offs.append(int(off1[0]) + d)
                lens.append(int(len1[0]))
                continue
            f = int(plan.files[i])
            check = err1[0] if err1 is not None else "truncated data"
            number = None if plan.numbers is None or plan.numbers[i] < 0 else int(plan.numbers[i])
            detail = "read through shuffle='global'"
            url = plan.urls[f]
            cut, sizes = past_new_end(plan.offsets[i:i + 1], plan.lengths[i:i + 1] - 16, [(url, slice(None))])
            if len(cut):  # its map was longer when gathered from: the file was cut under the pass
                check, detail = "truncated data", f"{detail}; {truncated_detail(sizes[url])}"
            elif (stale := stale_at(url, int(plan.offsets[i]), ln)) is not None:
                # not a damaged frame: the index names bytes that are no longer that frame (an
                # intact record would be skipped as corrupt, and others read from wrong places)
                forget_index(url)  # the copy kept may be what is stale (the file rewritten in place)
                raise StaleIndexError(url, index_url_of(url) or url, stale)
            exc = CorruptRecordError(check, mask(url), int(plan.offsets[i]), number, detail)
            if o.on_corrupt != "skip":
                raise exc
            keep[i - k] = False
            warn_skipped(logger, "skipping corrupt data: %s (%d bytes)", exc, ln)
            stats.skipped(exc, 1, ln)
        offsets = np.asarray(offs, dtype=np.int64)
        lengths = np.asarray(lens, dtype=np.int64)
    stats.records += len(offsets)
    stats.bytes += int(lengths.sum()) + 16 * len(offsets)
    return FrameChunk(buf, offsets, lengths, plan.virtual[k:j][keep], plan.files[k:j][keep])

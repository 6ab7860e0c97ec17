"""The fast read path: whole TFRecord frames found in large chunks, then batches of
records handed to the batch parser as ``(buffer, offsets, lengths)``, with no ``bytes``
object per record.

The frame scan is native (CRC-32C with the CPU's instruction) when the C core is built.
At the first failed check or at a frame cut off by the end of the file, the rest of that
file goes through :class:`~shardfeed.formats.tfrecord.TFRecordReader`, the reference, which
raises or skips (``on_corrupt``) and reports exactly as it always does. A scan that leaves
the data CRCs to the batch parser (``defer_data_crc``) cannot know yet which frame failed
first (a data CRC the parser will find may lie before the check the scan failed), so it
stops with a *handoff* (:attr:`FrameChunk.handoff`) instead; its consumer, once the frames
before are checked, reads on from the first failure through the reference
(``reference_index``): one resynchronisation rule for every read path.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptRecordError
from ..storage.io import _translate
from ..storage.urls import mask, parse_url
from .native import (
    IN_FRAME,
    Buffers,
    frame_crcs,
    masked_crc32c,
    native_available,
    scan_frames,
    scan_frames_deferred,
)
from .tfrecord import MAX_RECORD_BYTES, ReadStats, TFRecordReader, expand_files, normalize_compression, open_stream
from .truncated import cut_short, file_size_now, shrunk_to

try:
    from .._native import map_file as _native_map_file  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _native_map_file = None

DEFAULT_CHUNK = 8 << 20
FIRST_CHUNK = 256 << 10  # the first chunk of a streamed file: one first ranged read


class FrameChunk(NamedTuple):
    """Records ``buffer[offsets[k] : offsets[k] + lengths[k]]`` for ``k < len(offsets)``;
    ``positions[k]`` is where record ``k``'s frame starts in its file (the uncompressed
    stream), for resuming and for error messages. ``sources``, when a reader tracks it:
    which file each record came from (small ints, for measuring how mixed batches are).
    ``crcs``: ``None`` when every record's data CRC was checked (or is not to be), else each
    record's stored masked data CRC (uint32), left for the batch parser to check in the pass
    that copies the values out (``defer_data_crc``). ``handoff``: ``(offset, index)`` on a
    chunk without records that ends a ``defer_data_crc`` scan at a failed check or a cut
    frame: the frame at byte ``offset`` (the ``index``-th read) is where the reference
    reader takes over, unless a deferred data CRC before it fails first."""

    buffer: Any
    offsets: np.ndarray
    lengths: np.ndarray
    positions: np.ndarray
    sources: Any = None
    crcs: Any = None
    handoff: Any = None

    @property
    def triple(self) -> tuple[Any, np.ndarray, np.ndarray]:
        """``(buffer, offsets, lengths)``, what the batch parser takes."""
        return self.buffer, self.offsets, self.lengths

    @property
    def count(self) -> int:
        """Number of records."""
        return len(self.offsets)

    def part(self, i: int, j: int) -> "FrameChunk":
        """Records ``i:j`` of this chunk (the same buffer)."""
        return _slice(self, i, j)

    def records(self) -> list[bytes]:
        if isinstance(self.buffer, Buffers):
            return [self.buffer.record(k, o, n)
                    for k, (o, n) in enumerate(zip(self.offsets.tolist(), self.lengths.tolist()))]
        mv = memoryview(self.buffer)
        return [bytes(mv[o: o + n]) for o, n in zip(self.offsets.tolist(), self.lengths.tolist())]


_EMPTY = np.zeros(0, dtype=np.int64)


def _handoff(offset: int, index: int) -> FrameChunk:
    """A deferred scan's end at a failed check (see :attr:`FrameChunk.handoff`)."""
    return FrameChunk(b"", _EMPTY, _EMPTY, _EMPTY, handoff=(int(offset), int(index)))


def _chunk_of(records: list[bytes], positions: list[int]) -> FrameChunk:
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    offsets = np.zeros(len(records), dtype=np.int64)
    if len(records) > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    return FrameChunk(b"".join(records), offsets, lengths, np.array(positions, dtype=np.int64))


def iter_frame_chunks(
    url: str,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    stats: ReadStats | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
    start_offset: int = 0,
    end_offset: int | None = None,
    counters: Any = None,
    cache: Any = None,
    first_chunk: int = FIRST_CHUNK,
    defer_data_crc: bool = False,
    reference_index: int | None = None,
    first_index: int = 0,
    release_pages: bool = True,
) -> Iterator[FrameChunk]:
    """Yield the records of one file as :class:`FrameChunk` s of about ``chunk_size`` bytes,
    starting at the frame that begins at byte ``start_offset`` (of the uncompressed stream)
    and ending before byte ``end_offset`` (``None``: the end of the file). Bytes past
    ``end_offset`` are never read, so readers of neighbouring record ranges of one file
    fetch disjoint bytes. Remote objects are fetched in parallel ranged GETs counted in
    ``counters`` (an :class:`~shardfeed.storage.IOCounters`); with a ``cache`` (an
    :class:`~shardfeed.storage.cache.ObjectCache`) a remote object is read from its
    local copy, downloaded whole on first use, unless the cache is full. A streamed
    file's first chunk is ``first_chunk`` bytes at most (small, so that its records go out
    after one ranged read; a reader reading this file ahead of its consumer passes
    ``chunk_size``, so that a short span is one chunk). ``defer_data_crc`` (with
    ``verify_crc``, native core only): the scan checks each frame's length CRC but leaves
    its data CRC to the batch parser (``FrameChunk.crcs``); whoever takes these chunks
    must check them (:func:`~shardfeed.formats.parse.parse_batch` does); at a failed check
    such a scan yields a handoff chunk (:attr:`FrameChunk.handoff`) and stops, and neither
    raises nor skips. ``reference_index``: read from ``start_offset`` through the reference
    reader alone (the frame there is the ``reference_index``-th one read, for messages): how
    a consumer of a handoff, or of a deferred data CRC that failed, reads on. ``first_index``:
    the number, in its file, of the frame at ``start_offset`` (a record range's first record),
    so that errors name each frame by its number in the file. ``release_pages=False``: a
    local file's map keeps the pages the scan has passed (see :func:`release_chunk`), for a
    consumer that holds chunks long after they were read (a buffer shuffle) and would fault
    them back in."""
    comp = normalize_compression(compression, url)
    defer = bool(defer_data_crc and verify_crc and native_available())
    scan = functools.partial(_scan, verify_crc=verify_crc, max_record_bytes=max_record_bytes, defer=defer)
    stats = stats if stats is not None else ReadStats()
    chunk_size = max(int(chunk_size), 64)  # at least a frame header, so every scan can progress
    if end_offset is not None and end_offset <= start_offset:
        return
    tee = None
    if cache is not None and not parse_url(url).is_local:
        if start_offset == 0 and end_offset is None:
            # read whole: a miss streams to the reader and fills the entry on the way
            local, tee = cache.open_tee(url, storage_options, counters)
        else:
            local = cache.fetch(url, storage_options, counters)
        if local is not None:
            # what is found in the local copy is reported for the object (its URL, the offset the
            # same): the skips as they happen, an error as it is raised
            note = f"(read from the local copy of {mask(url)} in the cache at {local})"
            outer = stats.on_skip

            def relocated(err: CorruptRecordError) -> None:
                err.relocate(mask(url), note)
                if outer is not None:
                    outer(err)

            stats.on_skip = relocated
            try:
                yield from iter_frame_chunks(local, comp, verify_crc, on_corrupt, None, chunk_size, stats,
                                             max_record_bytes, start_offset, end_offset, defer_data_crc=defer,
                                             reference_index=reference_index, first_index=first_index,
                                             release_pages=release_pages)
            except CorruptRecordError as exc:
                raise exc.relocate(mask(url), note) from None
            finally:
                stats.on_skip = outer
            return
    if reference_index is not None:
        yield from _reference_from(url, comp, verify_crc, on_corrupt, storage_options, max_record_bytes,
                                   start_offset, reference_index, chunk_size, stats, end_offset)
        return
    if comp is None and parse_url(url).is_local:
        yield from _mapped_chunks(url, verify_crc, on_corrupt, chunk_size, stats, max_record_bytes, start_offset,
                                  end_offset, scan, defer, first_index, release_pages)
        return
    # a bounded range: never buffer past its end
    buffer = chunk_size if end_offset is None else max(64, min(chunk_size, end_offset - start_offset))
    stream = open_stream(url, comp, storage_options, buffer_size=buffer, counters=counters,
                         start_offset=start_offset, end_offset=end_offset, raw=True, source=tee)
    base = start_offset  # stream offset of buf[0]
    limit = None if end_offset is None else end_offset - start_offset  # stream bytes left to read
    index = first_index
    tail = b""
    # the first chunk small: its records go out after the first ranged read, not after
    # chunk_size bytes have arrived (a first batch within a round trip or two); the next
    # ones double up to chunk_size, as the stream's ranges do, so that the rest of a first
    # batch waits for the next range or two, not for chunk_size bytes
    step = need = min(chunk_size, max(64, int(first_chunk)))
    try:
        while True:
            if len(tail) >= 8:  # a frame bigger than a chunk: read the whole of it
                (length,) = struct.unpack_from("<Q", tail, 0)
                if length <= max_record_bytes:
                    need = max(need, length + 16 - len(tail))
            # read in pieces of at most 16 MiB, so a length field never sizes an allocation
            parts = [tail] if tail else []
            got = 0
            broken = False
            while got < need:
                ask = min(need - got, max(chunk_size, 16 << 20))
                if limit is not None:
                    ask = min(ask, limit)
                    if ask <= 0:
                        break
                try:
                    piece = stream.read(ask)
                except (EOFError, zlib.error):
                    # a damaged compressed stream: the frames read so far go out, then the
                    # reference reader re-reads from the first frame not delivered and
                    # reports the damage as its on_corrupt policy says
                    broken = True
                    break
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
                if limit is not None:
                    limit -= len(piece)
            data = got > 0 and not broken
            buf = parts[0] if len(parts) == 1 else b"".join(parts)
            if not buf and not broken:
                return
            offsets, lengths, consumed, error, crcs = scan(buf)
            if len(offsets):
                stats.records += len(offsets)
                stats.bytes += int(lengths.sum()) + 16 * len(offsets)
                index += len(offsets)
                yield FrameChunk(buf, offsets, lengths, offsets + (base - 12), crcs=crcs)
            if error is not None or broken or (not data and consumed < len(buf)):
                # a failed check, or the file ends inside a frame: the reference reader
                # takes over from that frame and raises or skips exactly as it does (a
                # deferred scan's consumer calls it, once the frames before are checked)
                stream.close()
                if defer:
                    yield _handoff(base + consumed, index)
                    return
                yield from _reference_from(url, comp, verify_crc, on_corrupt, storage_options, max_record_bytes,
                                           base + consumed, index, chunk_size, stats, end_offset)
                return
            tail = buf[consumed:]
            base += consumed
            if not data:
                return
            step = need = min(chunk_size, step * 2)
    finally:
        stream.close()


def _reference_from(url, comp, verify_crc, on_corrupt, storage_options, max_record_bytes, offset, index,
                    chunk_size, stats, end_offset=None) -> Iterator[FrameChunk]:
    """The rest of a file (up to the frame starting at or after ``end_offset``) from frame
    ``offset`` on, through the reference reader. A local file that now ends at or before
    ``offset`` was truncated while the pass read it: a ``"truncated data"`` error there
    (raised, or skipped and counted), where the reader would find nothing to read."""
    size = shrunk_to(url, comp, offset)
    if size is not None and (end_offset is None or offset < end_offset):
        cut_short(url, offset, index, size, on_corrupt, stats)
        return
    reader = TFRecordReader(url, comp, verify_crc, on_corrupt, storage_options,
                            max_record_bytes=max_record_bytes, start_offset=offset, start_index=index)
    reader.stats.on_skip = stats.on_skip
    ended = True  # at the end of the file, not of the range
    with reader:
        try:
            pending: list[bytes] = []
            positions: list[int] = []
            size = 0
            for record in reader:
                if end_offset is not None and reader.offset >= end_offset:
                    stats.records -= 1  # counted by the reader, but it belongs to the next range
                    stats.bytes -= len(record) + 16
                    ended = False
                    break
                pending.append(record)
                positions.append(reader.offset)
                size += len(record)
                if size >= chunk_size:
                    yield _chunk_of(pending, positions)
                    pending, positions, size = [], [], 0
            if pending:
                yield _chunk_of(pending, positions)
        finally:
            stats.merge(reader.stats)
    if ended and end_offset is not None and comp is None and parse_url(url).is_local:
        now = file_size_now(url)
        if now < end_offset:  # the range was planned on the file before it was cut (at a frame's end)
            cut_short(url, now, None, now, on_corrupt, stats)


def _scan(buf: Any, verify_crc: bool, max_record_bytes: int, defer: bool) -> tuple:
    """:func:`scan_frames` plus the deferred data CRCs (``None`` unless ``defer``)."""
    if defer:
        return scan_frames_deferred(buf, max_record_bytes)
    return (*scan_frames(buf, verify_crc, max_record_bytes), None)


def map_file(path: str) -> Any:
    """A read-only map of the whole file at ``path`` (``b""`` when empty) that keeps no file
    descriptor open (the native core's), so that chunks held in a shuffle buffer or a queue
    may keep maps of thousands of files alive under the usual limit of 1,024 open files;
    Python's ``mmap`` (which keeps one) where the core is not built."""
    if _native_map_file is not None:
        return _native_map_file(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _mapped_chunks(url, verify_crc, on_corrupt, chunk_size, stats, max_record_bytes, start,
                   end_offset=None, scan=None, defer=False, first_index=0, release=True) -> Iterator[FrameChunk]:
    """Local uncompressed files: scan the page cache in place through ``mmap`` (no copy).
    Chunks keep the map alive for as long as they are referenced.

    Pages more than a chunk behind the scan are released from the mapping
    (``MADV_DONTNEED``), so the process's resident size does not grow with the file; a
    consumer that still reads them (a chunk held in a queue) faults them back in from the
    page cache, unchanged, since the mapping is a read-only view of the file. ``release=False``
    leaves that to the consumer (:func:`release_chunk`)."""
    if scan is None:
        scan = functools.partial(_scan, verify_crc=verify_crc, max_record_bytes=max_record_bytes, defer=False)
    path = parse_url(url).path
    try:
        mm = map_file(path)
    except OSError as exc:
        raise _translate(exc, url, "open") from exc
    size = len(mm)
    # a range planned on the file before it was cut (an index's block, a split): what it no longer
    # holds is reported once the rest is read, not an end of the range like any other
    short = end_offset is not None and end_offset > size
    if size == 0 or start >= size:
        if short or start > size:
            cut_short(url, start, first_index, size, on_corrupt, stats)
        return
    view = memoryview(mm)
    if end_offset is not None:
        size = min(size, end_offset)  # the range ends here: scan no further
    pos = start
    index = first_index
    released = 0  # pages below this offset were handed back
    prev = start  # where the previous chunk began
    can_release = release and is_mapped(mm)
    while pos < size:
        if can_release:
            upto = (prev // mmap.PAGESIZE) * mmap.PAGESIZE
            if upto - released >= chunk_size:
                mm.madvise(mmap.MADV_DONTNEED, released, upto - released)
                released = upto
        prev = pos
        end = min(size, pos + chunk_size)
        offsets, lengths, consumed, error, crcs = scan(view[pos:end])
        if consumed == 0 and error is None and end < size and size - pos >= 8:
            # a frame bigger than the chunk (its length CRC checked out): scan just past it
            (length,) = struct.unpack_from("<Q", mm, pos)
            end = min(size, pos + 16 + length)
            offsets, lengths, consumed, error, crcs = scan(view[pos:end])
        lost = getattr(mm, "lost_from", None)
        if lost is not None and pos + consumed > lost:
            # the file was truncated under the scan: the map past its new end reads zeros (with
            # verify_crc=False, empty frames); the frames it cut are read again from the file
            whole = int(np.count_nonzero(offsets + lengths + (pos + 4) <= lost))
            offsets, lengths, crcs = offsets[:whole], lengths[:whole], None if crcs is None else crcs[:whole]
            consumed = int(offsets[-1] + lengths[-1] + 4) if whole else 0
            error, end = error or ("truncated data", pos + consumed), size
        if len(offsets):
            stats.records += len(offsets)
            stats.bytes += int(lengths.sum()) + 16 * len(offsets)
            index += len(offsets)
            yield FrameChunk(mm, offsets + pos, lengths, offsets + (pos - 12), crcs=crcs)
        pos += consumed
        if error is not None or (end == size and pos < size):
            if defer:
                yield _handoff(pos, index)
                return
            yield from _reference_from(url, None, verify_crc, on_corrupt, None, max_record_bytes, pos, index,
                                       chunk_size, stats, end_offset)
            return
    if short:
        cut_short(url, pos, index, len(mm), on_corrupt, stats)


def release_chunk(chunk: FrameChunk, keep: Iterable[tuple[int, int]] = ()) -> None:
    """Hand back the pages of a mapped chunk (one of :func:`_mapped_chunks`) that hold only its
    frames, for a consumer that read with ``release_pages=False`` and is done with it; the
    pages it shares with the frames before or after it are kept, and those of the byte ranges
    ``keep`` (``(start, end)`` in the map: records still held by a view). Other buffers:
    nothing."""
    mm = chunk.buffer
    if not chunk.count or not is_mapped(mm):
        return
    page = mmap.PAGESIZE
    at = -(-int(chunk.positions[0]) // page) * page  # the first frame's start, rounded up
    hi = (int(chunk.positions[-1] + chunk.lengths[-1]) + 16) // page * page
    for start, end in sorted(keep):
        upto = min(hi, start // page * page)
        if upto > at:
            mm.madvise(mmap.MADV_DONTNEED, at, upto - at)
        at = max(at, -(-end // page) * page)
    if hi > at:
        mm.madvise(mmap.MADV_DONTNEED, at, hi - at)


def is_mapped(buffer: Any) -> bool:
    """Whether ``buffer`` is a file's map (:func:`map_file`) whose pages can be handed back."""
    return hasattr(buffer, "madvise") and hasattr(mmap, "MADV_DONTNEED")


def rebatch(chunks: Iterable[FrameChunk], batch_size: int, drop_remainder: bool = False) -> Iterator[FrameChunk]:
    """Regroup chunks into chunks of exactly ``batch_size`` records (the last may be
    smaller unless ``drop_remainder``). Bytes are copied only for a batch that spans two
    chunks of different buffers (two streamed chunks, or two files), never for one that
    spans chunks of one mapped file."""
    for batch, _ in rebatch_tagged(((c, None) for c in chunks), batch_size, drop_remainder):
        yield batch


def rebatch_tagged(
    chunks: Iterable[tuple[FrameChunk, Any]], batch_size: int, drop_remainder: bool = False
) -> Iterator[tuple[FrameChunk, Any]]:
    """:func:`rebatch` over ``(chunk, tag)`` pairs, yielding ``(batch, tag)`` where ``tag``
    is that of the chunk the batch's last record came from (a file index, say)."""
    for batch, pieces in rebatch_pieces(chunks, batch_size, drop_remainder):
        yield batch, pieces[-1][2]


class Piece(NamedTuple):
    """Part of a batch: records ``start:start + chunk.count`` of it are ``chunk`` (a slice
    of one chunk of the stream, or a handoff chunk without records at ``start``), which
    came with ``tag``."""

    start: int
    chunk: FrameChunk
    tag: Any


def rebatch_pieces(
    chunks: Iterable[tuple[FrameChunk, Any]], batch_size: int, drop_remainder: bool = False
) -> Iterator[tuple[FrameChunk, list[Piece]]]:
    """:func:`rebatch` over ``(chunk, tag)`` pairs, yielding ``(batch, pieces)``: the batch
    and the :class:`Piece` s it was made of, in order. A handoff chunk
    (:attr:`FrameChunk.handoff`) is kept as a piece of the batch being made; a last batch
    holding one is yielded even with ``drop_remainder`` (its consumer must see the handoff)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    carry: list[Piece] = []
    carried = 0
    handoff = False
    for chunk, tag in chunks:
        if chunk.handoff is not None:
            carry.append(Piece(carried, chunk, tag))
            handoff = True
            continue
        start = 0
        n = chunk.count
        if carry:
            take = min(batch_size - carried, n)
            carry.append(Piece(carried, _slice(chunk, 0, take), tag))
            carried += take
            start = take
            if carried < batch_size:
                continue
            yield _merge([p.chunk for p in carry]), carry
            carry, carried, handoff = [], 0, False
        while n - start >= batch_size:
            batch = _slice(chunk, start, start + batch_size)
            yield batch, [Piece(0, batch, tag)]
            start += batch_size
        if start < n:
            carry = [Piece(0, _slice(chunk, start, n), tag)]
            carried = n - start
    if carry and (handoff or (carried and not drop_remainder)):
        yield _merge([p.chunk for p in carry]), carry


def _slice(chunk: FrameChunk, i: int, j: int) -> FrameChunk:
    buf = chunk.buffer
    if isinstance(buf, Buffers):  # records in several buffers: which buffer each is in, sliced too
        buf = Buffers(buf.buffers, buf.which[i:j])
    crcs = chunk.crcs
    return FrameChunk(buf, chunk.offsets[i:j], chunk.lengths[i:j], chunk.positions[i:j],
                      None if chunk.sources is None else chunk.sources[i:j],
                      crcs if crcs is None or crcs is IN_FRAME else crcs[i:j])


def _merge(pieces: list[FrameChunk]) -> FrameChunk:
    """One chunk of ``pieces``' records, in order. Pieces of one buffer (the chunks of
    one mapped file all view its whole map, at offsets into it) are joined without a copy:
    only their offsets are concatenated. So are pieces whose data CRCs are left to the
    parser (``crcs``: only the native parser takes them), their buffers as
    :class:`~shardfeed.formats.native.Buffers`. Otherwise the records' bytes are copied
    into one new buffer."""
    pieces = [p for p in pieces if p.handoff is None]
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return FrameChunk(b"", _EMPTY, _EMPTY, _EMPTY)
    sources = [p.sources for p in pieces if p.count]
    merged_sources = np.concatenate(sources) if sources and all(s is not None for s in sources) else None
    live = [p for p in pieces if p.count]
    if live and all(p.crcs is IN_FRAME and isinstance(p.buffer, Buffers) for p in live) \
            and all(p.buffer.buffers is live[0].buffer.buffers for p in live):
        # records in their frames in the same mapped files (a global shuffle's): joined by
        # their offsets and which file each is in, checked by the parser
        return FrameChunk(Buffers(live[0].buffer.buffers, np.concatenate([p.buffer.which for p in live])),
                          np.concatenate([p.offsets for p in live]), np.concatenate([p.lengths for p in live]),
                          np.concatenate([p.positions for p in live]), merged_sources, IN_FRAME)
    # records still to be checked go on with their stored CRCs (those in their frames read
    # there); checked ones (a piece from the reference reader) get theirs computed, which they match
    crcs = (np.concatenate([_crcs_of(p) if p.crcs is None else frame_crcs(*p.triple) if p.crcs is IN_FRAME
                            else p.crcs for p in live])
            if any(p.crcs is not None for p in live) else None)
    if live and all(p.buffer is live[0].buffer for p in live):
        return FrameChunk(live[0].buffer, np.concatenate([p.offsets for p in live]),
                          np.concatenate([p.lengths for p in live]), np.concatenate([p.positions for p in live]),
                          merged_sources, crcs)
    if live and crcs is not None:
        # records left to the native parser (deferred CRCs; a checked piece's computed): the
        # pieces' buffers as they are, each record naming its own (no copy to join them)
        bufs: list = []
        which = []
        for p in live:
            if isinstance(p.buffer, Buffers):
                which.append(np.asarray(p.buffer.which, dtype=np.int64) + len(bufs))
                bufs.extend(p.buffer.buffers)
                continue
            if not bufs or bufs[-1] is not p.buffer:
                bufs.append(p.buffer)
            which.append(np.full(p.count, len(bufs) - 1, dtype=np.int64))
        return FrameChunk(Buffers(tuple(bufs), np.concatenate(which)), np.concatenate([p.offsets for p in live]),
                          np.concatenate([p.lengths for p in live]), np.concatenate([p.positions for p in live]),
                          merged_sources, crcs)
    parts, offsets, lengths, positions = [], [], [], []
    pos = 0
    for p in pieces:
        if not p.count:
            continue
        lo = int(p.offsets[0])
        hi = int(p.offsets[-1] + p.lengths[-1])
        parts.append(memoryview(p.buffer)[lo:hi])
        offsets.append(p.offsets - lo + pos)
        lengths.append(p.lengths)
        positions.append(p.positions)
        pos += hi - lo
    return FrameChunk(b"".join(parts), np.concatenate(offsets), np.concatenate(lengths), np.concatenate(positions),
                      merged_sources, crcs)


def _crcs_of(chunk: FrameChunk) -> np.ndarray:
    """The masked data CRCs of a chunk's records, computed."""
    mv = memoryview(chunk.buffer).cast("B")
    return np.array([masked_crc32c(mv[o:o + n]) for o, n in zip(chunk.offsets.tolist(), chunk.lengths.tolist())],
                    dtype=np.uint32)


def iter_record_batches(
    urls: str | Iterable[str],
    batch_size: int,
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    drop_remainder: bool = False,
    stats: ReadStats | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> Iterator[FrameChunk]:
    """Batches of ``batch_size`` records from every file of ``urls`` in order, as chunks
    ready for :func:`shardfeed.formats.parse.parse_batch`."""
    def all_chunks() -> Iterator[FrameChunk]:
        for url in expand_files(urls, storage_options):
            yield from iter_frame_chunks(url, compression, verify_crc, on_corrupt, storage_options, chunk_size, stats)

    return rebatch(all_chunks(), batch_size, drop_remainder)

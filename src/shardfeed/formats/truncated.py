"""Shards truncated while a pass reads them: which records a map of such a file no longer
holds (the native core's guard answers the fault past the new end with zero pages, see
``_native/mapfile.c``), and the error, raised or counted, that reports them."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import CorruptRecordError
from ..storage.urls import mask, parse_url
from .native import TRUNCATED_WHILE_READ, Buffers
from .tfrecord import ReadStats

try:
    from .._native import first_lost as _native_first_lost  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _native_first_lost = None


def first_lost(chunk: Any) -> int | None:
    """The first record of ``chunk`` that lies past the new end of a file truncated while this
    process had it mapped (``chunks.map_file``: the part of the map past the end reads as zeros,
    not as the file's bytes), or ``None`` (at once while no file has been). Ask after the
    records' bytes were read (copied out): what was read before the truncation is the file's."""
    if _native_first_lost is None or not chunk.count or isinstance(chunk.buffer, Buffers):
        return None
    k = _native_first_lost(chunk.buffer, chunk.offsets, chunk.lengths)
    return None if k < 0 else k


def lost_in(buffer: Any, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the records ``buffer[offsets[k]:][:lengths[k]]`` that :func:`first_lost`
    would name (one buffer); empty when none (at once while no file has been cut)."""
    if _native_first_lost is None or not len(offsets):
        return np.zeros(0, np.int64)
    return _native_first_lost(buffer, offsets, lengths, True)


def lost_records(chunk: Any) -> np.ndarray:
    """The indices of every record of ``chunk`` that :func:`first_lost` would name (records in
    several buffers too); empty when none."""
    if _native_first_lost is None or not chunk.count:
        return np.zeros(0, np.int64)
    buf = chunk.buffer
    if not isinstance(buf, Buffers):
        return lost_in(buf, chunk.offsets, chunk.lengths)
    parts = []
    for b in np.unique(buf.which).tolist():
        sel = np.flatnonzero(buf.which == b)
        parts.append(sel[lost_in(buf.buffers[b], chunk.offsets[sel], chunk.lengths[sel])])
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def lost_frames(buffer: Any, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the whole frames ``buffer[offsets[k]:][:lengths[k]]`` (framing included)
    that lie past the new end of a file truncated while mapped (as :func:`first_lost`)."""
    if _native_first_lost is None or not len(offsets):
        return np.zeros(0, np.int64)
    # the guard counts the 4 bytes after a record's data as its own: a frame's data CRC
    return _native_first_lost(buffer, offsets, np.maximum(np.asarray(lengths, np.int64) - 4, 0), True)


def truncated_detail(size: int) -> str:
    """What a ``"truncated data"`` error adds about a file cut under the pass, now ``size`` bytes."""
    return f"{TRUNCATED_WHILE_READ} (it has {size} bytes now)"


def truncated_while_read(url: str, offset: int, index: int | None, size: int) -> CorruptRecordError:
    """The error of a read that had reached byte ``offset`` of a file now ``size`` bytes long."""
    return CorruptRecordError("truncated data", mask(url), offset, index, truncated_detail(size))


def file_size_now(url: str) -> int:
    """The size of local file ``url`` now (0 when it is gone)."""
    try:
        return os.path.getsize(parse_url(url).path)
    except OSError:
        return 0


def shrunk_to(url: str, comp: Any, offset: int) -> int | None:
    """The size of local file ``url`` when it ends at or before ``offset`` (> 0), else None:
    a read handed over to the reference reader there met a file truncated under it (a
    handover comes at a failed check, so bytes were there when the pass read them)."""
    if comp is not None or offset <= 0 or not parse_url(url).is_local:
        return None
    size = file_size_now(url)
    return size if size <= offset else None


def past_new_end(positions: np.ndarray, lengths: np.ndarray, groups: Any) -> tuple[np.ndarray, dict[str, int]]:
    """Which records (frames at ``positions``, of ``lengths`` bytes of data) now lie past their
    local file's end, ``groups`` saying which records are whose (``(url, indices or slice)``
    pairs), and the sizes looked up (one stat a file): what a read without CRCs asks, for which
    the rest of the page that holds a cut file's new end reads as zeros without a fault the
    guard would see."""
    sizes: dict[str, int] = {}
    lost = []
    for url, sel in groups:
        where = parse_url(url)
        if not where.is_local:
            continue
        try:
            size = sizes[url] = os.path.getsize(where.path)
        except OSError:
            size = sizes[url] = 0
        ends = positions[sel] + lengths[sel] + 16
        if len(ends) and int(ends.max()) > size:
            lost.append(np.arange(len(positions))[sel][ends > size])
    return (np.sort(np.concatenate(lost)) if lost else np.zeros(0, np.int64)), sizes


def cut_short(url: str, offset: int, index: int | None, size: int, on_corrupt: str, stats: ReadStats) -> None:
    """Frames the pass found (an index's range, a scan) that the file, now ``size`` bytes, no
    longer holds from ``offset`` on: :func:`truncated_while_read`, raised, or skipped and
    counted as one frame."""
    err = truncated_while_read(url, offset, index, size)
    if on_corrupt == "raise":
        raise err
    stats.skipped(err, 1, 0)


__all__ = ["cut_short", "file_size_now", "first_lost", "lost_frames", "lost_records", "past_new_end", "shrunk_to",
           "truncated_detail", "truncated_while_read"]

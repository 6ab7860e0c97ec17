"""TFRecord index files and random access through them.

An index file holds one line per record, ``offset length``, in bytes: where the frame
starts in the (uncompressed) shard and how long the whole frame is (header, data and
footer), the format DALI's TFRecord reader takes.
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import storage
from ..errors import CorruptRecordError, ShardfeedError
from ..storage.urls import mask, parse_url
from .crc import masked_crc32c, masked_length_crc
from .tfrecord import ReadStats, TFRecordReader, check_index_url, format_index, normalize_compression

try:
    from .._native import parse_index as _native_parse_index  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _native_parse_index = None

logger = logging.getLogger(__name__)


class StaleIndexError(ShardfeedError, ValueError):
    """An index file that does not describe its shard as the shard is now (cut, emptied,
    a line doubled or lost, or the shard rewritten, truncated or appended to since)."""

    def __init__(self, url: str, index_url: str, reason: str) -> None:
        super().__init__(f"{mask(index_url)} is a stale index of {mask(url)} (not the file as it is now): {reason} "
                         f"(rebuild it with "
                         f"`shardfeed index {mask(url)}` or sf.build_index(url), or delete it)")
        self.url, self.index_url, self.reason = mask(url), mask(index_url), reason


def stale_at(url: str, offset: int, length: int) -> str | None:
    """Why the index that names a frame of ``length`` bytes (framing included) at byte
    ``offset`` of local shard ``url``, a frame that failed its check, no longer describes the
    shard, or ``None`` when it does there (the frame itself is damaged). The shard's frames
    are walked from its start by their length fields, each checked by its own CRC (the data
    CRCs are not looked at): an index that tiles the file but was written for other records
    (a shard rewritten in place with the same size) names a byte that is no frame's start, or
    the wrong length. Only a walk that reaches the file's end whole says so: a damaged length
    field (one whose CRC was made to match, too) sends the walk astray, and then the frame is
    reported as damaged."""
    from .chunks import map_file  # noqa: PLC0415 - chunks imports this module
    from .native import native_available, scan_frames_deferred  # noqa: PLC0415

    if not native_available() or not parse_url(url).is_local:
        return None
    try:
        mm = map_file(parse_url(url).path)
    except OSError:
        return None
    if not len(mm):
        return None
    offsets, lengths, consumed, error, _ = scan_frames_deferred(memoryview(mm))
    if error is not None or consumed != len(mm):
        return None  # a frame of the file is damaged (a length that lies, say): the walk proves nothing
    starts = offsets - 12
    k = int(np.searchsorted(starts, offset))
    if k < len(starts) and starts[k] == offset:
        got = int(lengths[k]) + 16
        return None if got == length else (f"the frame at byte {offset} is {got} bytes long, the index says "
                                           f"{length} (the shard was rewritten since)")
    return f"no frame of the shard starts at byte {offset}, where the index puts one (the shard was rewritten)"


def check_index(index: np.ndarray, file_size: int) -> str | None:
    """Why ``index`` (``(records, 2)``: frame offset, frame length) cannot be the index of a
    file of ``file_size`` bytes, or ``None`` when its frames tile the file: the first at
    byte 0, each where the one before ends, the last ending at the file's end. (What the
    frames hold is checked as they are read: their CRCs.)"""
    n = len(index)
    if n == 0:
        return None if file_size == 0 else f"it lists no record, and the file holds {file_size} bytes"
    offsets, lengths = index[:, 0], index[:, 1]
    if int(offsets[0]) != 0:
        return f"its first frame starts at byte {int(offsets[0])}, not 0"
    ends = offsets + lengths
    bad = np.flatnonzero(offsets[1:] != ends[:-1])
    if len(bad):
        k = int(bad[0]) + 1
        return (f"line {k + 1} puts a frame at byte {int(offsets[k])}, but the frame before ends at byte "
                f"{int(ends[k - 1])} (a line lost, doubled or out of order)")
    end = int(ends[-1])
    if end != file_size:
        return (f"its last frame ends at byte {end}, but the file holds {file_size} bytes (the file was "
                f"{'cut' if end > file_size else 'written to or replaced'} after the index was made, or the "
                "index was cut)")
    return None


def read_index(index_url: str, storage_options: Mapping[str, Any] | None = None,
               counters: Any = None) -> np.ndarray:
    """Read an index file into an ``int64`` array of shape ``(records, 2)``: offset, length.
    A remote file's GETs and bytes are counted in ``counters`` (a pass's
    :class:`~shardfeed.storage.IOCounters`) when given.

    Raises :class:`ShardfeedError` naming the file and line for a malformed line.
    """
    data = storage.read_bytes(index_url, storage_options=storage_options, counters=counters)
    fast = _parse_index_fast(data)
    if fast is not None:
        return fast
    text = data.decode("ascii", errors="replace")  # something is off: find the line and say which
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            off, n = int(parts[0]), int(parts[1])
            if off < 0 or n < 16 or off + n >= 1 << 63:
                raise ValueError
        except ValueError:
            raise ShardfeedError(
                f"{mask(index_url)}: line {lineno} is not 'offset length' with offset >= 0 and length >= 16: "
                f"{line[:80]!r}"
            ) from None
        rows.append((off, n))
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def _parse_index_fast(data: bytes) -> np.ndarray | None:
    """The index parsed in one native pass (about 1 ms per 100,000 lines), else by numpy
    (below), or ``None`` when any line is not two valid numbers: the caller's loop then
    names the line."""
    if _native_parse_index is not None:
        out = np.empty((data.count(b"\n") + 1, 2), dtype=np.int64)
        n = _native_parse_index(out, data)
        return out[:n] if n >= 0 else None
    return _parse_index_numpy(data)


def _parse_index_numpy(data: bytes) -> np.ndarray | None:
    """The index parsed by numpy's text reader (several times the tokens converted by
    numpy, which cost a shuffled pass over object storage about a tenth of a second per
    index file of 31,250 records), or ``None`` when any line is not two valid numbers:
    the caller's loop then names the line."""
    if data.translate(None, b"0123456789 \n"):
        # anything but digits, spaces and newlines (numpy would stop at it with a warning,
        # and the process's warning filters are no place to catch that from a thread)
        return None
    b = np.frombuffer(data, dtype=np.uint8)
    digit = b >= ord("0")
    starts = digit.copy()
    starts[1:] &= ~digit[:-1]  # the first digit of each number
    per_line = np.bincount(np.searchsorted(np.flatnonzero(b == ord("\n")), np.flatnonzero(starts)))
    if not ((per_line == 0) | (per_line == 2)).all():
        return None  # a line with other than two numbers (blank lines are skipped)
    flat = np.fromstring(data, dtype=np.int64, sep=" ")
    if len(flat) % 2 or (len(flat) and flat.max() == np.iinfo(np.int64).max):  # clamped
        return None
    arr = flat.reshape(-1, 2)
    if len(arr) and (arr[:, 0].min() < 0 or arr[:, 1].min() < 16):
        return None
    return arr


def build_index(
    url: str,
    index_url: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    verify_crc: bool = True,
) -> np.ndarray:
    """Scan ``url`` (uncompressed) and write its index to ``index_url`` (default
    ``<url>.idx``); return the index. Corrupt frames raise :class:`CorruptRecordError`."""

    if normalize_compression("auto", url) is not None:
        raise ValueError(f"{mask(url)}: index files address uncompressed TFRecord files only")
    index_url = index_url or os.fspath(url) + ".idx"
    check_index_url(url, index_url)
    entries = []
    with TFRecordReader(url, compression=None, verify_crc=verify_crc, storage_options=storage_options) as reader:
        for record in reader:
            entries.append((reader.offset, len(record) + 16))
    storage.write_bytes(index_url, format_index(entries), storage_options)
    return np.array(entries, dtype=np.int64).reshape(-1, 2)


class IndexedTFRecord:
    """Random access to the records of one uncompressed shard through its index.

    ``len(shard)`` is the record count; ``shard[i]`` reads record ``i`` with one ranged
    read and checks its CRCs. ``read_range(i, j)`` reads records ``i..j-1`` in one request.
    """

    def __init__(
        self,
        url: str,
        index_url: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        verify_crc: bool = True,
    ):
        self.url = os.fspath(url)
        self.index_url = index_url or self.url + ".idx"
        self._storage_options = storage_options
        self.verify_crc = verify_crc
        self.index = read_index(self.index_url, storage_options)
        reason = check_index(self.index, storage.size(self.url, storage_options))
        if reason is not None:
            raise StaleIndexError(self.url, self.index_url, reason)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> bytes:
        n = len(self.index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record {i} out of range: {mask(self.url)} has {n} records")
        return self.read_range(i, i + 1)[0]

    def read_range(self, start: int, stop: int) -> list[bytes]:
        """Records ``start..stop-1`` (clipped to the shard) with a single ranged read."""
        start, stop = max(0, start), min(len(self.index), stop)
        if start >= stop:
            return []
        first = int(self.index[start, 0])
        last_end = int(self.index[stop - 1, 0] + self.index[stop - 1, 1])
        blob = storage.read_bytes(self.url, first, last_end, self._storage_options)
        out = []
        for i in range(start, stop):
            off, n = int(self.index[i, 0]), int(self.index[i, 1])
            out.append(self._unframe(blob, off - first, off, n, i))
        return out

    def _unframe(self, blob: bytes, pos: int, offset: int, n: int, i: int) -> bytes:
        if pos + n > len(blob):
            raise CorruptRecordError("truncated data", mask(self.url), offset, i,
                                     "the index points past the end of the file (stale index?)")
        length, length_crc = struct.unpack_from("<QI", blob, pos)
        if length + 16 != n:
            raise CorruptRecordError("length crc" if masked_length_crc(length) != length_crc else "index length",
                                     mask(self.url), offset, i,
                                     f"index says {n} bytes, frame says {length + 16} (stale index?)")
        data = blob[pos + 12: pos + 12 + length]
        if self.verify_crc:
            if masked_length_crc(length) != length_crc:
                raise CorruptRecordError("length crc", mask(self.url), offset, i)
            (data_crc,) = struct.unpack_from("<I", blob, pos + 12 + length)
            if masked_crc32c(data) != data_crc:
                raise CorruptRecordError("data crc", mask(self.url), offset, i)
        return data


# -- finding, building and caching the index of a shard ------------------------------------
def index_url_of(url: str) -> str | None:
    """Where the index of ``url`` lives beside it: ``<url>.idx`` (before any query string);
    ``None`` for an http(s) URL with a query (a presigned URL, say): its query is part of the
    object's address and signs that object alone, so no index can be addressed beside it
    (appending ``.idx`` to the query once named the shard itself, and a server that did not
    check the signature took the index written there as the new shard). Such a shard's
    index lives in :func:`cache_dir` only."""
    from ..storage.urls import parse_url  # noqa: PLC0415

    url = os.fspath(url)
    if parse_url(url).protocol in ("http", "https") and "?" in url:
        return None
    return url.split("?", 1)[0] + ".idx"


def cache_dir() -> str:
    """The folder for indexes that cannot be written beside their shard:
    ``$SHARDFEED_CACHE_DIR/index`` (default ``~/.cache/shardfeed/index``)."""
    root = os.environ.get("SHARDFEED_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "shardfeed")
    return os.path.join(root, "index")


def _cached_index_path(url: str, size: int) -> str:
    import hashlib  # noqa: PLC0415

    # keyed by the shard's address and size, so a rewritten shard never meets a stale index
    key = hashlib.sha256(f"{url}\0{size}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), key + ".idx")


def _shard_size(url: str, storage_options: Mapping[str, Any] | None, counters: Any = None) -> int:
    """The shard's size: seen in a listing a moment ago, else one stat (a HEAD request,
    counted in ``counters``)."""
    if not parse_url(url).is_local:
        from ..storage.io import size_hint  # noqa: PLC0415

        hint = size_hint(url)
        if hint is not None:
            return hint
    return storage.size(url, storage_options, counters)


def _read_checked(url: str, index_url: str, read: Any, size: int) -> tuple[np.ndarray | None, str | None]:
    """``(index, None)`` when ``read()`` gives an index that fits the shard's ``size``;
    ``(None, reason)`` when there is one that does not (malformed, or frames that do not tile
    the shard); ``(None, None)`` when there is none."""
    try:
        index = read()
    except FileNotFoundError:
        return None, None
    except ShardfeedError as exc:  # malformed: a writer cut short, say
        return None, str(exc)
    reason = check_index(index, size)
    return (index, None) if reason is None else (None, reason)


class Kept:
    """The values used last, kept for later use in the process: at most ``entries`` of them
    and ``nbytes`` bytes (each value's ``nbytes``), the oldest let go first; thread-safe."""

    def __init__(self, entries: int, nbytes: int) -> None:
        self.entries, self.limit = entries, nbytes
        self.values: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self.total = 0
        self.lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self.lock:
            hit = self.values.get(key)
            if hit is not None:
                self.values.move_to_end(key)
            return hit

    def drop(self, match: Any) -> None:
        """Let go of every value whose key ``match(key)`` is true."""
        with self.lock:
            for key in [k for k in self.values if match(k)]:
                self.total -= self.values.pop(key).nbytes

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            old = self.values.pop(key, None)
            self.total += value.nbytes - (old.nbytes if old is not None else 0)
            self.values[key] = value
            while len(self.values) > 1 and (len(self.values) > self.entries or self.total > self.limit):
                self.total -= self.values.popitem(last=False)[1].nbytes


LOADED_INDEX_BYTES = 256 << 20
"""What the index files of local shards read and checked, kept for later loads in the process,
may hold (the ones used last): a dataset made again over the same shards (every epoch, say)
finds each index without reading and parsing its file again (800,000 lines cost 20 ms, a
fifth of a pass over 60-byte records)."""
_LOADED = Kept(1 << 20, LOADED_INDEX_BYTES)


def local_stamp(url: str) -> tuple | None:
    """A local file's size, modification time and inode (what tells that it changed);
    ``None`` for a remote one or one that is not there."""
    parsed = parse_url(url)
    if not parsed.is_local:
        return None
    try:
        st = os.stat(parsed.path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def forget_index(url: str) -> None:
    """Let go of the kept copy of ``url``'s index (found stale while read: a dataset made
    later reads the index file again)."""
    idx = index_url_of(url)
    _LOADED.drop(lambda key: key[0] == idx)


def _loaded_key(idx: str | None, size: int) -> tuple | None:
    """What a local index file read and checked against a shard of ``size`` bytes depends on:
    its path and :func:`local_stamp`, and the shard's size; ``None`` for a remote one or one
    that is not there."""
    stamp = local_stamp(idx) if idx is not None else None
    return None if stamp is None else (idx, *stamp, int(size))


def load_index(url: str, storage_options: Mapping[str, Any] | None = None, build: bool = False,
               cache: Any = None, size: int | None = None, counters: Any = None,
               seen: set | None = None, damage: Any = None) -> np.ndarray | None:
    """The index of ``url`` (``(records, 2)``: frame offset, frame length), from ``<url>.idx``
    or the index cache; ``None`` when there is none and ``build`` is false.

    An index is checked against the shard before use (:func:`check_index`: its frames tile
    the file, the last ending at the file's size), which costs one stat (a HEAD request;
    none when ``size``, the shard's size in bytes, is given or was seen in a listing). One
    that does not fit (cut, emptied, a line doubled or lost, or the shard rewritten since)
    is rebuilt with ``build=True`` (a warning names it) and refused otherwise:
    :class:`StaleIndexError` naming the file and what does not fit.

    With ``build=True`` a missing index is made by scanning the shard once (the native
    frame scan) and saved beside it, or in :func:`cache_dir` when the storage is
    read-only, so later readers and later passes find it. With a ``cache`` (an
    :class:`~shardfeed.storage.cache.ObjectCache`) a remote index file is read through it,
    and a shard scanned to build its index is downloaded into it (read once, not once to
    build and once more to read). What either fetches is counted in ``counters`` (the
    pass's :class:`~shardfeed.storage.IOCounters`) when given, a shard downloaded once
    (``seen``: the cached objects the pass counted, as the cache's ``fetch`` takes it).

    ``damage`` (a :class:`~shardfeed.formats.tfrecord.ReadStats`, for a reader whose
    ``on_corrupt`` policy skips): a shard scanned to build its index skips its corrupt
    frames as the record reader does, and they are counted there (each error in
    ``damage.corrupt``) for the caller to report; such an index leaves the damaged bytes
    out, so it is kept in memory only and never saved (a saved index tiles its shard).
    Without it the scan raises :class:`CorruptRecordError` at the first corrupt frame.
    Compressed shards have no
    index (records cannot be reached without inflating what precedes them): ``ValueError``.
    """
    idx = index_url_of(url)
    if normalize_compression("auto", url) is not None:
        # an index of a compressed shard counts frames of the inflated stream: no size to check
        if idx is not None and storage.exists(idx, storage_options, counters):
            return read_index(idx, storage_options, counters)
        if not build:
            return None
        raise ValueError(f"{mask(url)}: a compressed shard cannot be split into record ranges (index files "
                         "address uncompressed TFRecords); give more files than readers, or decompress it")
    n = size if size is not None else _shard_size(url, storage_options, counters)

    def read_beside() -> np.ndarray:
        if idx is None:
            raise FileNotFoundError(url)  # none can lie beside it: the index cache alone
        local = (cache.fetch(idx, storage_options, counters, seen) if cache is not None
                 and not parse_url(idx).is_local else None)
        return read_index(local, None) if local is not None else read_index(idx, storage_options, counters)

    key = _loaded_key(idx, n)
    hit = _LOADED.get(key) if key is not None else None
    if hit is not None:
        return hit
    index, stale = _read_checked(url, idx or url, read_beside, n)
    if index is not None:
        if key is not None:
            index.flags.writeable = False  # shared by every later load
            _LOADED.put(key, index)
        return index
    cached = _cached_index_path(url, n)
    if os.path.exists(cached):
        index, cached_stale = _read_checked(url, cached, lambda: read_index(cached), n)
        if index is not None:
            return index
        stale = stale or cached_stale
    if stale is not None and not build:
        raise StaleIndexError(url, idx or cached, stale)
    if not build:
        return None
    if stale is not None:
        logger.warning("%s is a stale index of %s (%s): rebuilding it", mask(idx), mask(url), stale)
    from .chunks import iter_frame_chunks  # noqa: PLC0415

    # the whole shard is scanned: through the cache it is downloaded once, and the pass then
    # reads the cached copy (counted once, a miss, in ``seen``)
    local = None
    if cache is not None and not parse_url(url).is_local:
        local = cache.fetch(url, storage_options, counters, seen)
    offsets, lengths = [], []
    found = ReadStats()
    try:
        for chunk in iter_frame_chunks(local or url, None, on_corrupt="raise" if damage is None else "skip",
                                       storage_options=None if local else storage_options, stats=found,
                                       counters=counters):
            offsets.append(chunk.positions)
            lengths.append(chunk.lengths + 16)
    except CorruptRecordError as exc:
        if local:
            raise exc.relocate(mask(url), f"(found building the index of {mask(url)} from its local copy {local} "
                                          "in the cache)") from None
        raise
    index = np.stack([np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
                      np.concatenate(lengths) if lengths else np.zeros(0, np.int64)], axis=1).astype(np.int64)
    if found.skipped_records or found.corrupt:
        if local:  # name the shard, not its copy in the cache
            for err in found.corrupt:
                err.relocate(mask(url), f"(found building the index of {mask(url)} from its local copy {local} in "
                                        "the cache)")
        damage.merge(ReadStats(skipped_records=found.skipped_records, skipped_bytes=found.skipped_bytes,
                               corrupt=list(found.corrupt), skips=list(found.skips)))
        logger.warning("%s has %d corrupt record(s) (the first at byte %d): its index leaves them out and is "
                       "kept for this run only, not saved (a saved index covers every byte of its shard); "
                       "rewrite the shard, or read it with shuffle=None to see where", mask(url),
                       found.skipped_records, found.corrupt[0].offset if found.corrupt else -1)
        return index
    data = format_index(index.tolist())
    try:
        if idx is None:
            raise PermissionError("no index can be written beside a URL signed for the shard alone")
        storage.write_bytes(idx, data, storage_options, counters)
        logger.info("built the index of %s (%d records) and saved it as %s", mask(url), len(index), mask(idx))
    except (PermissionError, OSError, NotImplementedError) as exc:
        os.makedirs(cache_dir(), exist_ok=True)
        storage.write_bytes(cached, data)
        logger.info("built the index of %s (%d records); cannot write beside it (%s), cached as %s",
                    mask(url), len(index), type(exc).__name__, cached)
    return index

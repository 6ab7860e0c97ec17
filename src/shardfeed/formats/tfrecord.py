"""TFRecord framing: read and write, uncompressed, GZIP and ZLIB, on any storage URL.

A frame is ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``,
little-endian. Readers check both CRCs by default. On a failed check the policy
``on_corrupt`` decides: ``"raise"`` (default) raises :class:`CorruptRecordError` naming the
file, the byte offset of the frame and the check; ``"skip"`` counts the bad frame in
:class:`ReadStats`, logs it, and goes on (after a bad length it resynchronises on the next
offset where a whole frame checks out). A file that ends inside a frame is reported the
same way (check ``"truncated ..."``). A length beyond what the file holds is never
allocated: remote and compressed streams are read in bounded chunks.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import storage
from ..deprecation import renamed_argument
from ..errors import CorruptRecordError, warn_skipped
from ..storage.urls import has_magic, mask, parse_url
from .compression import normalize_compression, open_stream
from .crc import masked_crc32c, masked_length_crc

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
HEADER_SIZE = 12
FOOTER_SIZE = 4
FRAME_OVERHEAD = HEADER_SIZE + FOOTER_SIZE
MAX_RECORD_BYTES = (1 << 31) - 1  # a serialized protobuf cannot exceed 2 GiB
_CHUNK = 4 << 20
_COMPRESSED_PIECE = 16 << 10

# Files that sit beside shards and are never TFRecords themselves: left out when a
# directory or a glob is expanded.
SIDECAR_SUFFIXES = (".idx", ".json", ".csv", ".txt", ".md")
# Names that say "TFRecord file": ``x.tfrecord``, ``x.tfrecords``, ``x.tfr``, compressed
# (``.gz``, ``.gzip``, ``.zz``, ``.zlib``) or numbered as TFDS names shards
# (``mnist-train.tfrecord-00000-of-00001``). Such a file is never sniffed and left out of a
# folder: if its first bytes are not a frame, it is a corrupt TFRecord file.
_RECORD_NAME = re.compile(r"\.(tfrecords?|tfr)(\.(gz|gzip|zz|zlib)|-\d+(-of-\d+)?)?$", re.IGNORECASE)
ON_CORRUPT = ("raise", "skip")


@dataclass
class ReadStats:
    """What a reader saw: records delivered, bytes of frames read, frames skipped as
    corrupt (with the errors describing them), and bytes skipped while resynchronising.
    ``reread``: of ``records``, those read again to restore a saved state of a fused
    ``source.shuffle(n).batch(k)`` (its buffer's records, which the pass had read before the
    state was saved; see ``pipeline/shuffle_batch.py``)."""

    records: int = 0
    bytes: int = 0
    skipped_records: int = 0
    skipped_bytes: int = 0
    reread: int = 0
    corrupt: list[CorruptRecordError] = field(default_factory=list)
    # (frames, bytes) of each entry of ``corrupt``, in order
    skips: list[tuple[int, int]] = field(default_factory=list, repr=False)
    # called with each skipped frame's error before it is counted; raising stops the read
    # (how a pipeline's on_error handler sees framing errors). Not merged.
    on_skip: Any = field(default=None, repr=False, compare=False)

    def skipped(self, err: CorruptRecordError, frames: int, nbytes: int) -> None:
        """Count a skipped frame (or damage), after ``on_skip`` had its say."""
        if self.on_skip is not None:
            self.on_skip(err)
        self.skipped_records += frames
        self.skipped_bytes += nbytes
        self.corrupt.append(err)
        self.skips.append((frames, nbytes))

    def merge(self, other: "ReadStats") -> None:
        self.records += other.records
        self.bytes += other.bytes
        self.skipped_records += other.skipped_records
        self.skipped_bytes += other.skipped_bytes
        self.reread += other.reread
        self.corrupt.extend(other.corrupt)
        self.skips.extend(other.skips)


class TFRecordReader:
    """Iterate the records of one TFRecord file as ``bytes``.

    ``offset`` after each record is that record's frame offset (uncompressed stream);
    ``stats`` counts what was read and skipped. ``start_offset`` starts reading at that
    frame offset (``start_index`` is then the number of frames before it, for messages).
    Use as an iterator, or a context manager to close the file early.
    """

    def __init__(
        self,
        url: str,
        compression: str | None = "auto",
        verify_crc: bool = True,
        on_corrupt: str = "raise",
        storage_options: Mapping[str, Any] | None = None,
        buffer_size: int = 8 << 20,
        max_record_bytes: int = MAX_RECORD_BYTES,
        start_offset: int = 0,
        start_index: int = 0,
    ):
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")
        self.url = os.fspath(url)
        self.compression = normalize_compression(compression, self.url)
        self.verify_crc = verify_crc
        self.on_corrupt = on_corrupt
        self.max_record_bytes = max_record_bytes
        self.stats = ReadStats()
        self.offset = start_offset
        # a compressed stream unbuffered: its reader delivers every inflated byte before
        # it reports damage, and a buffer on top would drop the bytes of a read that fails
        self._stream = open_stream(self.url, self.compression, storage_options, buffer_size,
                                   start_offset=start_offset, raw=self.compression is not None)
        self._iter = self._records(start_offset, start_index)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._iter)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "TFRecordReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _corrupt(self, check: str, offset: int, index: int, detail: str = "") -> CorruptRecordError:
        hint = detail
        if self.compression is not None:
            hint = (detail + "; " if detail else "") + f"offsets are in the uncompressed stream ({self.compression})"
        if index == 0 and offset == 0 and self.compression is None and check in ("length crc", "absurd length"):
            hint = (detail + "; " if detail else "") + "is the file compressed? pass compression='GZIP' or 'ZLIB'"
        return CorruptRecordError(check, mask(self.url), offset, index, hint)

    def _records(self, base: int, index: int) -> Iterator[bytes]:
        """The framing loop over a sliding buffer of at most a few chunks plus one record."""
        stream = self._stream
        buf = b""
        pos = 0  # position in buf
        buf_base = base  # stream offset of buf[0]
        eof = False
        verify = self.verify_crc
        # A decompressor that hits a truncated stream raises and loses what it inflated in
        # that call: small reads keep that loss to a few KiB of a damaged file.
        piece = _COMPRESSED_PIECE if self.compression is not None else 0
        stats = self.stats

        def fill(need: int) -> bool:
            """Make ``need`` bytes available at pos; False at end of stream."""
            nonlocal buf, pos, buf_base, eof
            if len(buf) - pos >= need:
                return True
            parts = [buf[pos:]]
            have = len(parts[0])
            buf_base += pos
            pos = 0
            while have < need and not eof:
                try:
                    chunk = stream.read(piece if piece else max(_CHUNK, min(need - have, 16 << 20)))
                except (EOFError, zlib.error) as exc:
                    # named at the frame it cuts (buf starts there), as every other check is
                    err = self._corrupt("compressed stream", buf_base, index,
                                        f"{type(exc).__name__}: {exc}; no byte after offset {buf_base + have} "
                                        "inflates")
                    if self.on_corrupt == "raise":
                        raise err from exc
                    self._skip(err, 0, frames=0)
                    chunk = b""
                if not chunk:
                    eof = True
                    break
                parts.append(chunk)
                have += len(chunk)
            buf = b"".join(parts)
            return have >= need

        while True:
            if not fill(HEADER_SIZE):
                left = len(buf) - pos
                if left == 0:
                    return
                check = "truncated length" if left < 8 else "truncated length crc"
                err = self._corrupt(check, buf_base + pos, index, f"{left} bytes left at end of file")
                if self.on_corrupt == "raise":
                    raise err
                self._skip(err, left, frames=1)
                return
            frame_off = buf_base + pos
            length, length_crc = _HEADER.unpack_from(buf, pos)
            err = None
            total = HEADER_SIZE + length + FOOTER_SIZE
            if verify and masked_length_crc(length) != length_crc:
                err = self._corrupt("length crc", frame_off, index)
            elif length > self.max_record_bytes:
                err = self._corrupt("absurd length", frame_off, index,
                                    f"length field says {length} bytes (limit {self.max_record_bytes})")
            elif not fill(total):
                left = len(buf) - pos
                check = "truncated data" if left < HEADER_SIZE + length else "truncated data crc"
                err = self._corrupt(check, frame_off, index,
                                    f"frame needs {total} bytes, only {left} left at end of file")
            elif verify:
                (data_crc,) = _FOOTER.unpack_from(buf, pos + HEADER_SIZE + length)
                if masked_crc32c(memoryview(buf)[pos + HEADER_SIZE: pos + HEADER_SIZE + length]) != data_crc:
                    err = self._corrupt("data crc", frame_off, index)
            if err is not None:
                if self.on_corrupt == "raise":
                    raise err
                # resynchronise byte by byte: the next offset where a whole frame checks out
                # (length CRC and data CRC), whatever the bad frame's length field claimed,
                # so a wrong length that passes its CRC loses no intact record after it
                skipped = 1
                pos += 1
                while True:
                    if not fill(HEADER_SIZE):
                        skipped += len(buf) - pos
                        pos = len(buf)
                        break
                    ln, lc = _HEADER.unpack_from(buf, pos)
                    if masked_length_crc(ln) == lc and ln <= self.max_record_bytes:
                        if fill(HEADER_SIZE + ln + FOOTER_SIZE):
                            (dc,) = _FOOTER.unpack_from(buf, pos + HEADER_SIZE + ln)
                            if masked_crc32c(memoryview(buf)[pos + HEADER_SIZE: pos + HEADER_SIZE + ln]) == dc:
                                break
                    pos += 1
                    skipped += 1
                self._skip(err, skipped, frames=1)
                index += 1
                continue
            start = pos + HEADER_SIZE
            end = start + length
            record = buf[start:end]
            pos += total
            index += 1
            stats.records += 1
            stats.bytes += total
            self.offset = frame_off
            yield record

    def _skip(self, err: CorruptRecordError, nbytes: int, frames: int) -> None:
        warn_skipped(logger, "skipping corrupt data: %s (%d bytes)", err, nbytes)
        self.stats.skipped(err, frames, nbytes)


@renamed_argument("urls", "source")
def read_records(
    source: str | Iterable[str],
    compression: str | None = "auto",
    verify_crc: bool = True,
    on_corrupt: str = "raise",
    storage_options: Mapping[str, Any] | None = None,
    stats: ReadStats | None = None,
) -> Iterator[bytes]:
    """Yield the serialized records of every file in ``source`` (a URL, a glob or a list), in order.

    Pass a :class:`ReadStats` as ``stats`` to collect counts (and skipped frames) across files.
    """
    for url in expand_files(source, storage_options):
        with TFRecordReader(url, compression, verify_crc, on_corrupt, storage_options) as reader:
            try:
                yield from reader
            finally:
                if stats is not None:
                    stats.merge(reader.stats)


def expand_files(urls: str | Iterable[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """TFRecord files named by ``urls`` (URL, glob, directory or list), leaving out the
    index, manifest and report files that sit beside shards."""
    return storage.expand(urls, storage_options, skip_suffixes=SIDECAR_SUFFIXES)


def looks_like_tfrecord(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``url`` starts like a TFRecord file: nothing at all (no records), a frame
    header whose length CRC checks, or a GZIP or ZLIB stream."""
    head = storage.read_bytes(url, 0, HEADER_SIZE, storage_options=storage_options)
    zlib_header = len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0
    if not head or head[:2] == b"\x1f\x8b" or zlib_header:
        return True
    if len(head) < HEADER_SIZE:
        return False
    length, crc = _HEADER.unpack_from(head)
    return masked_length_crc(length) == crc


def has_record_name(url: str) -> bool:
    """Whether the file name of ``url`` says it is a TFRecord file (``.tfrecord``,
    ``.tfrecords``, ``.tfr``, maybe compressed or TFDS-numbered)."""
    return bool(_RECORD_NAME.search(url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]))


def record_files(urls: str | Iterable[str], storage_options: Mapping[str, Any] | None = None
                 ) -> tuple[list[str], list[str]]:
    """``(files, skipped)``: the TFRecord files ``urls`` name, and the files a directory or
    a glob held that are not (index files, manifests, ``schema.pbtxt``, reports: a file
    without a record extension that does not start like a TFRecord file). A file with a
    record extension (:func:`has_record_name`) is kept whatever its first bytes, so damage
    there is reported as corruption; files named explicitly are kept as given."""
    items = [os.fspath(urls)] if isinstance(urls, (str, os.PathLike)) else [os.fspath(u) for u in urls]
    files: list[str] = []
    skipped: list[str] = []
    for item in items:
        parsed = storage.parse_url(item)
        listing = has_magic(item) or (parsed.is_local and os.path.isdir(parsed.path)) or (
            not parsed.is_local and item.split("?", 1)[0].endswith("/"))
        if not listing:
            files.extend(storage.expand(item, storage_options))
            continue
        for u in storage.expand(item, storage_options):
            name = u.split("?", 1)[0]
            if name.endswith(SIDECAR_SUFFIXES) or (
                    not has_record_name(name) and not looks_like_tfrecord(u, storage_options)):
                skipped.append(u)
            else:
                files.append(u)
        if not files:
            raise FileNotFoundError(f"{mask(item)}: no TFRecord files there (left out: "
                                    f"{', '.join(os.path.basename(u.split('?', 1)[0]) for u in skipped[:10])})")
    return files, skipped


def frame(record: bytes) -> bytes:
    """One TFRecord frame around ``record``."""
    n = len(record)
    return b"".join((_HEADER.pack(n, masked_length_crc(n)), record, _FOOTER.pack(masked_crc32c(record))))


class TFRecordWriter:
    """Write records to a TFRecord file at ``url``, atomically.

    Nothing appears at ``url`` until :meth:`close` succeeds; used as a context manager an
    exception discards the file. ``index=True`` also writes ``<url>.idx`` (or give the index
    URL): one ``offset length`` line per record, as DALI reads (uncompressed files only).
    ``compression`` is ``None``, ``"GZIP"`` or ``"ZLIB"``; ``"auto"`` picks by extension.
    GZIP output carries no timestamp, so the same records give the same bytes.
    """

    def __init__(
        self,
        url: str,
        compression: str | None = None,
        index: bool | str = False,
        storage_options: Mapping[str, Any] | None = None,
        compression_level: int = 6,
    ):
        self.url = os.fspath(url)
        self.compression = normalize_compression(compression, self.url)
        if index and self.compression is not None:
            raise ValueError("index files address uncompressed TFRecord files; use compression=None with index")
        self.index_url = (self.url + ".idx" if index is True else index) or None
        if self.index_url:
            check_index_url(self.url, self.index_url)
        check_compression_level(self.compression, compression_level, self.url)
        self._storage_options = storage_options
        self._raw = storage.open_output(self.url, storage_options)
        self._zobj = None
        self._gz = None
        if self.compression == "GZIP":
            self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=compression_level, mtime=0,
                                     filename="")
        elif self.compression == "ZLIB":
            self._zobj = zlib.compressobj(compression_level)
        self._offset = 0
        self._index: list[tuple[int, int]] = []
        self.records = 0
        self._closed = False

    def write(self, record: bytes) -> None:
        """Append one serialized record."""
        if self._closed:
            raise ValueError(f"write to a closed TFRecordWriter ({mask(self.url)})")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"TFRecordWriter.write takes bytes, got {type(record).__name__}")
        record = bytes(record)
        n = len(record)
        if self._gz is not None:
            self._gz.write(frame(record))
        elif self._zobj is not None:
            self._raw.write(self._zobj.compress(frame(record)))
        else:  # the pieces go to the buffered file as they are: no joined copy of the record
            self._raw.write(_HEADER.pack(n, masked_length_crc(n)))
            self._raw.write(record)
            self._raw.write(_FOOTER.pack(masked_crc32c(record)))
        if self.index_url:
            self._index.append((self._offset, n + 16))
        self._offset += n + 16
        self.records += 1

    def write_many(self, records: Iterable[bytes]) -> None:
        for r in records:
            self.write(r)

    def write_frames(self, frames: Any, lengths: Iterable[int]) -> None:
        """Append records already framed (``formats.native.frame_records``): ``frames``
        holds one frame per entry of ``lengths`` (each record's data length), in order.
        The file gets the same bytes as :meth:`write` of each record; an uncompressed file
        takes them in one write. Raises ValueError when the lengths do not add up to
        ``frames``."""
        if self._closed:
            raise ValueError(f"write to a closed TFRecordWriter ({mask(self.url)})")
        mv = memoryview(frames).cast("B")
        lengths = list(lengths)
        if sum(lengths) + 16 * len(lengths) != len(mv):
            raise ValueError(f"write_frames: {len(mv)} bytes of frames, but the {len(lengths)} record lengths "
                             f"frame {sum(lengths) + 16 * len(lengths)} ({mask(self.url)})")
        if self._gz is not None or self._zobj is not None:
            pos = 0  # frame by frame, as write() feeds the compressor
            for n in lengths:
                piece = mv[pos:pos + n + 16]
                if self._gz is not None:
                    self._gz.write(piece)
                elif self._zobj is not None:
                    self._raw.write(self._zobj.compress(piece))
                pos += n + 16
        elif len(mv):
            self._raw.write(mv)
        if self.index_url:
            off = self._offset
            for n in lengths:
                self._index.append((off, n + 16))
                off += n + 16
        self._offset += len(mv)
        self.records += len(lengths)

    @property
    def bytes_written(self) -> int:
        """Uncompressed bytes of frames written so far."""
        return self._offset

    def close(self) -> None:
        """Finish the file and make it (and its index) appear."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._gz is not None:
                self._gz.close()
            elif self._zobj is not None:
                self._raw.write(self._zobj.flush())
            self._raw.commit()
        except BaseException:
            self._raw.abort()
            raise
        if self.index_url:
            storage.write_bytes(self.index_url, format_index(self._index), self._storage_options)

    def abort(self) -> None:
        """Discard the file; nothing appears at ``url``."""
        if self._closed:
            return
        self._closed = True
        self._raw.abort()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_records(url: str, records: Iterable[bytes], compression: str | None = "auto", index: bool | str = False,
                  storage_options: Mapping[str, Any] | None = None) -> int:
    """Write ``records`` to ``url`` atomically; return how many were written."""
    with TFRecordWriter(url, compression, index, storage_options) as w:
        w.write_many(records)
    return w.records


def check_index_url(url: str, index_url: str) -> None:
    """Refuse an index file that would be written over its own shard (found from outside:
    ``index=url``, ``build_index(url, url)`` and ``shardfeed index --suffix ""`` replaced the
    records with their index, without a word)."""
    a, b = parse_url(os.fspath(url)), parse_url(os.fspath(index_url))
    if a.is_local and b.is_local:
        same = os.path.realpath(a.path) == os.path.realpath(b.path)
    else:
        same = (a.protocol, a.path) == (b.protocol, b.path)
    if same:
        raise ValueError(f"the index file of {mask(os.fspath(url))} would be the shard itself: give the index "
                         "another name (the default adds .idx)")


def check_compression_level(compression: str | None, level: Any, url: str) -> None:
    """Refuse a ``compression_level`` zlib would refuse, naming the argument and the file
    (zlib's own words were "Invalid initialization option", about a temporary file)."""
    if compression is None:
        return
    low = 0 if compression == "GZIP" else -1
    if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= 9:
        raise ValueError(f"{mask(url)}: compression_level for {compression} must be an int from {low} to 9, "
                         f"got {level!r}")


def format_index(entries: Iterable[tuple[int, int]]) -> bytes:
    """Index file content: ``offset length`` per line."""
    return "".join(f"{o} {n}\n" for o, n in entries).encode()


__all__ = [
    "TFRecordReader", "TFRecordWriter", "ReadStats", "read_records", "write_records", "frame",
    "normalize_compression", "open_stream", "expand_files", "record_files", "looks_like_tfrecord",
    "format_index",
]

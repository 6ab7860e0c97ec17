"""The compression layer of TFRecord files: GZIP (any number of members) and ZLIB streams,
named by ``compression`` or by the file name, opened for one sequential read on any
storage.

A damaged or cut stream gives every byte that inflates before the damage, then raises:
the readers above deliver every whole record before it and report the damage at the
first frame they could not complete.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

from .. import storage

COMPRESSIONS = (None, "GZIP", "ZLIB")
"""The compressions a TFRecord file may have (``None``: uncompressed)."""
_CHUNK = 4 << 20  # inflated bytes at most per step
_IN_PIECE = 64 << 10  # compressed bytes fed to the inflater at a time


def normalize_compression(compression: str | None, url: str | None = None) -> str | None:
    """``None``/``""``/``"NONE"`` -> ``None``; ``"GZIP"``/``"ZLIB"`` (any case); ``"auto"``
    picks by the file name (``.gz``/``.gzip`` -> GZIP, ``.zz``/``.zlib`` -> ZLIB)."""
    if compression is None:
        return None
    c = str(compression).upper()
    if c in ("", "NONE"):
        return None
    if c == "AUTO":
        name = (url or "").split("?", 1)[0].lower()
        if name.endswith((".gz", ".gzip")):
            return "GZIP"
        if name.endswith((".zz", ".zlib")):
            return "ZLIB"
        return None
    if c in ("GZIP", "ZLIB"):
        return c
    raise ValueError(f"compression must be None, 'GZIP', 'ZLIB' or 'auto', got {compression!r}")


class _InflateReader(io.RawIOBase):
    """A raw stream that inflates a ZLIB stream, or a GZIP stream of any number of members,
    read from ``raw``, at most one chunk of output at a time (a zlib bomb cannot make it
    allocate more).

    Every byte that inflates is delivered before an error is raised: a stream cut short
    (``EOFError``) or damaged (``zlib.error``) raises on the first read after the last good
    byte, so the records before the damage are not lost. Reads are short (whatever one
    step inflated); ``position`` is the number of bytes delivered."""

    def __init__(self, raw: BinaryIO, kind: str):
        super().__init__()
        self._raw = raw
        self._kind = kind
        self._wbits = 31 if kind == "GZIP" else 15  # 16 + 15: a gzip header and trailer
        self._d = zlib.decompressobj(self._wbits)
        self._pending = b""
        self._at = 0  # read position in _pending
        self._error: BaseException | None = None
        self._done = False
        self._started = False  # any compressed byte seen: an empty file is an empty stream
        self._carry = b""  # input not yet given to the decompressor (after a member's end)
        self.position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._at >= len(self._pending):
            if self._error is not None:
                raise self._error
            if self._done:
                return 0
            self._step()
        n = min(len(b), len(self._pending) - self._at)
        b[:n] = self._pending[self._at: self._at + n]
        self._at += n
        self.position += n
        return n

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (``-1``: the rest of the stream), short at the end of one
        inflated chunk; ``b""`` only at the end of the stream."""
        if size is None or size < 0:
            parts = []
            while piece := self.read(_CHUNK):
                parts.append(piece)
            return b"".join(parts)
        while self._at >= len(self._pending):
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._step()
        out = self._pending[self._at: self._at + size]
        self._at += len(out)
        self.position += len(out)
        return out

    def _step(self) -> None:
        """Inflate the next chunk into ``_pending``, or note the end or the error."""
        d = self._d
        if d.eof:
            if self._kind != "GZIP":
                self._done = True  # bytes after a zlib stream's end are not part of it
                return
            # another gzip member may follow (``cat a.gz b.gz``), after zero padding
            data = (d.unused_data + self._carry).lstrip(b"\0")
            self._carry = b""
            while not data:
                more = self._raw.read(_IN_PIECE)
                if not more:
                    self._done = True
                    return
                data = bytes(more).lstrip(b"\0")
            self._d = zlib.decompressobj(self._wbits)
        else:
            data = d.unconsumed_tail or self._carry or self._raw.read(_IN_PIECE)
            self._carry = b""
            if not data:
                if self._started:
                    self._error = EOFError(f"the {self._kind} stream ends before its end marker (truncated file)")
                else:
                    self._done = True
                return
        self._started = True
        self._pending = self._inflate(bytes(data))
        self._at = 0

    def _inflate(self, data: bytes) -> bytes:
        saved = self._d.copy()
        try:
            return self._d.decompress(data, _CHUNK)
        except zlib.error:
            self._d = saved
        # damaged: inflate the same input again in pieces of 1 KiB, then byte by byte, so
        # every byte before the damage is delivered; the error is raised after them
        out: list[bytes] = []
        at, size = 0, 1024
        while at < len(data):
            keep = self._d.copy()
            try:
                out.append(self._d.decompress(data[at: at + size]))
            except zlib.error as exc:
                self._d = keep
                if size > 1:
                    size = 1
                    continue
                self._error = zlib.error(f"damaged {self._kind} stream: {exc}")
                break
            at += size
            if self._d.eof:  # a gzip member ends here: what follows is read by _step
                self._carry = data[at:]
                break
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_stream(url: str, compression: str | None = "auto", storage_options: Mapping[str, Any] | None = None,
                buffer_size: int = 8 << 20, counters: Any = None, start_offset: int = 0,
                end_offset: int | None = None, raw: bool = False, source: Any = None) -> BinaryIO:
    """Open ``url`` for one sequential read of its (decompressed) stream, positioned at
    ``start_offset``; an uncompressed stream ends at ``end_offset`` (``None``: the end of
    the file). Remote objects are fetched ahead in parallel ranged GETs, counted in
    ``counters``; a compressed one is inflated from its start. ``raw``: an uncompressed
    stream may return short reads and buffer-protocol objects other than ``bytes``
    (whole fetched ranges, without a copy); otherwise it is a buffered binary file.
    ``source``: the object's bytes already opened as a raw stream from its first byte (a
    cache's tee), read in place of opening ``url`` (whole objects only)."""
    comp = normalize_compression(compression, url)
    local = storage.parse_url(url).is_local
    if source is not None:
        if start_offset or end_offset is not None:
            raise ValueError("a source stream is read whole, from its first byte")
        if comp is None:
            return source if raw else io.BufferedReader(source, buffer_size)  # type: ignore[return-value]
        inflated: Any = _InflateReader(io.BufferedReader(source, 1 << 20), comp)
        return inflated if raw else io.BufferedReader(inflated, buffer_size=1 << 20)  # type: ignore[return-value]
    if comp is None:
        plain = storage.open_range(url, start_offset, end_offset, storage_options, counters, zero_copy=raw)
        # buffered: line readers call readline(); large reads pass straight through
        if raw or (local and end_offset is None):
            return plain  # type: ignore[return-value]
        return io.BufferedReader(plain, buffer_size)  # type: ignore[return-value]
    if local:
        packed = storage.open_input(url, storage_options, buffer_size=buffer_size)
    else:
        packed = io.BufferedReader(storage.open_range(url, 0, None, storage_options, counters), 1 << 20)
    stream: Any = _InflateReader(packed, comp)
    if not raw:
        stream = io.BufferedReader(stream, buffer_size=1 << 20)
    left = start_offset
    while left > 0 and (piece := stream.read(min(left, 16 << 20))):
        left -= len(piece)
    return stream


__all__ = ["COMPRESSIONS", "normalize_compression", "open_stream"]

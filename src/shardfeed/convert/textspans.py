"""Lines of a text file by byte range, as Hadoop's line record reader reads them: a reader of
the range ``[start, end)`` owns the lines that *start* in it, and reads past ``end`` to
finish its last one; the reader of the range after it skips to its first line start. The
ranges of a file, read one after another, give each line once, whatever the cut points.

A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (what Python's universal newlines and
the ``csv`` module break on), never at the other characters ``str.splitlines`` breaks on
(``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, U+0085, U+2028, U+2029): those bytes can sit inside
a multi-byte UTF-8 character or, unescaped, inside a JSON string. ``\\r`` and ``\\n`` never
occur inside a multi-byte UTF-8 character, so lines are found in the bytes and a range's
cut never splits a character.

Only sizes are needed to plan the ranges (:func:`plan_ranges`); each reader fetches its
own bytes (:class:`LineReader`), on any storage.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .. import storage

BOM = b"\xef\xbb\xbf"
READ_BYTES = 1 << 20  # what a reader fetches at a time past its range (and at most within it)
_EOL = re.compile(rb"\r\n?|\n")


def plan_ranges(size: int, range_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of ``range_bytes`` (the last one shorter) covering a file
    of ``size`` bytes; one empty range for an empty file."""
    if range_bytes < 1:
        raise ValueError(f"range_bytes must be at least 1, got {range_bytes}")
    if size <= 0:
        return [(0, 0)]
    return [(s, min(size, s + range_bytes)) for s in range(0, size, range_bytes)]


def strip_eol(line: bytes) -> bytes:
    """``line`` (as :class:`LineReader` gives it) without its terminator: a line holds no
    ``\r`` or ``\n`` but its one terminator, so stripping both strips just that."""
    return line.rstrip(b"\r\n")


class LineReader:
    """The lines of ``url`` from the first line start at or after ``start`` to the end of
    the file, each with its byte offset; the caller stops where its range ends.

    ``data``, when given, is the whole file (nothing is read). ``first`` is the offset of
    the first line the reader gives (``start`` itself when a line starts there).
    """

    def __init__(self, url: str, start: int = 0, storage_options: Mapping[str, Any] | None = None,
                 data: bytes | None = None, read_bytes: int = READ_BYTES):
        if start < 0:
            raise ValueError(f"start must be a byte offset (at least 0), got {start}")
        self.url, self.storage_options, self.read_bytes = url, storage_options, max(1, read_bytes)
        if data is not None:
            self._buf, self._base, self._eof = data, 0, True
        else:
            self._base = max(0, start - 1)
            self._buf, self._eof = b"", False
        self._pos = start  # absolute offset of the next line
        self.first = self._sync(start)

    def _more(self) -> bool:
        """Fetch the next bytes after the buffer; False at the end of the file."""
        if self._eof:
            return False
        at = self._base + len(self._buf)
        got = storage.read_bytes(self.url, at, at + self.read_bytes, storage_options=self.storage_options)
        if len(got) < self.read_bytes:
            self._eof = True
        # keep only what the next line needs: from the current position on
        keep = max(0, min(self._pos, at) - self._base - 1)
        self._buf = self._buf[keep:] + got
        self._base += keep
        return bool(got)

    def _eol(self, at: int) -> tuple[int, int] | None:
        """``(start, end)`` of the first line terminator at or after offset ``at``; None at
        the end of the file. A ``\\r`` at the end of the buffer waits for the next byte."""
        while True:
            m = _EOL.search(self._buf, at - self._base)
            if m is not None and (m.group() != b"\r" or m.end() < len(self._buf) or self._eof):
                return m.start() + self._base, m.end() + self._base
            if not self._more():
                m = _EOL.search(self._buf, at - self._base)
                return None if m is None else (m.start() + self._base, m.end() + self._base)

    def _size(self) -> int:
        while self._more():
            pass
        return self._base + len(self._buf)

    def _sync(self, start: int) -> int:
        if start == 0:
            return 0
        eol = self._eol(start - 1)  # a terminator ending at start-1 makes start a line start
        first = self._size() if eol is None else eol[1]
        self._pos = first
        return first

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """``(offset, line with its terminator)`` from :attr:`first` to the end of the file."""
        while True:
            # bytes.splitlines breaks at \n, \r\n and \r only; the last piece may be cut
            # (no terminator yet, or a \r whose \n is in the next bytes) until the end of the file
            parts = self._buf[self._pos - self._base:].splitlines(keepends=True)
            if not self._eof and parts:
                parts.pop()
            for line in parts:
                at = self._pos
                self._pos = at + len(line)
                yield at, line
            if self._eof:
                return
            self._more()

    @property
    def position(self) -> int:
        """The offset after the last line given (where the next line starts)."""
        return self._pos


__all__ = ["BOM", "LineReader", "plan_ranges", "strip_eol"]

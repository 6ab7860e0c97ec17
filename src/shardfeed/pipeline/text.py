"""``read_text``: the lines of text files, with a ``(file, byte offset, line)`` cursor."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from .. import storage
from ..deprecation import renamed_argument
from ..errors import ShardfeedError
from ..formats.tfrecord import normalize_compression, open_stream
from ..storage.cache import cacheable, get_cache
from .sources import SourceDataset


class TextStreamError(ShardfeedError, ValueError):
    """A compressed text file (GZIP, ZLIB) that is cut short or damaged: ``url`` (masked),
    ``line`` (the first line not delivered) and ``offset`` (its byte offset in the
    uncompressed text). The lines before it were delivered."""

    def __init__(self, message: str, url: str, line: int, offset: int) -> None:
        super().__init__(message)
        self.url, self.line, self.offset = url, line, offset

    def __reduce__(self):  # pickles (process pools) with its custom init
        return (type(self), (str(self), self.url, self.line, self.offset), self.__dict__)


def check_encoding(encoding: str | None) -> None:
    """Refuse an encoding lines cannot be split in as bytes: one that does not write line
    breaks, quotes and delimiters as their ASCII bytes (UTF-16, UTF-32, EBCDIC code pages),
    whose files would be cut inside characters."""
    if encoding is None:
        return
    import codecs  # noqa: PLC0415

    try:
        codecs.lookup(encoding)
    except LookupError:
        raise LookupError(f"unknown encoding {encoding!r}") from None
    sample = "\n\r,;\t|\"'ab09"
    try:
        encoder = codecs.getincrementalencoder(encoding)()
        encoder.encode("a")  # a byte-order mark, if the codec writes one first (utf-8-sig), goes here
        ok = encoder.encode(sample) == sample.encode("ascii")
    except UnicodeError:
        ok = False
    if not ok:
        raise ValueError(f"encoding {encoding!r} does not write line breaks as ASCII bytes (as UTF-16 and UTF-32 "
                         "do not): lines are split as bytes before they are decoded, so use an ASCII-compatible "
                         "encoding (utf-8, latin-1, cp1252, gbk, shift_jis, ...) or convert the file "
                         "(iconv -f utf-16 -t utf-8)")


class LineReader:
    """Lines (``bytes``, newline stripped) of a list of files, resumable by byte offset.

    ``line`` is the 1-based number of the last line returned, ``url`` its file, ``ending``
    the line break it had (``b"\n"``, ``b"\r\n"``, or ``b""`` for a last line without one).
    """

    def __init__(self, files: list[str], compression: str | None, storage_options: Mapping[str, Any] | None,
                 state: Mapping[str, Any] | None, header: bool = False, cache: Any = None) -> None:
        self.files = files
        self.cache = cache
        self.compression = compression
        self.storage_options = storage_options
        self.header = header
        self.fi = int(state["file"]) if state else 0
        self.offset = int(state["offset"]) if state else 0
        self.line = int(state["line"]) if state else 0
        self.stream: Any = None
        self.bytes_read = 0
        self.ending = b""

    @property
    def url(self) -> str:
        return self.files[min(self.fi, len(self.files) - 1)]

    def _open(self) -> None:
        url = self.files[self.fi]
        compression = normalize_compression(self.compression, url)  # by the file's own name
        so = self.storage_options
        if self.cache is not None and cacheable(url):
            local = self.cache.fetch(url, so)  # None: the cache is full, read it from storage
            if local is not None:
                url, so = local, None
        self.stream = open_stream(url, compression, so, buffer_size=1 << 20, start_offset=self.offset)
        if not self.offset and self.header:
            first = self.stream.readline()
            self.offset += len(first)
            self.line += 1

    def __next__(self) -> bytes:
        while True:
            if self.stream is None:
                if self.fi >= len(self.files):
                    raise StopIteration
                self._open()
            try:
                raw = self.stream.readline()
            except (EOFError, zlib.error) as exc:  # the inflater: a cut or damaged GZIP/ZLIB file
                raise self.stream_error(str(exc)) from None
            if not raw:
                self.close()
                self.fi += 1
                self.offset = 0
                self.line = 0
                continue
            self.offset += len(raw)
            self.bytes_read += len(raw)
            self.line += 1
            self.ending = b""
            if raw.endswith(b"\n"):
                self.ending = b"\r\n" if raw.endswith(b"\r\n") else b"\n"
                raw = raw[:-len(self.ending)]
            return raw

    def stream_error(self, why: str) -> Exception:
        """The error for a compressed file cut short or damaged before the next line."""
        url, line = storage.mask(self.url), self.line + 1
        return TextStreamError(f"{url}, line {line} (byte {self.offset:,} of the uncompressed text): {why}", url,
                               line, self.offset)

    def get_state(self) -> dict:
        return {"file": self.fi, "offset": self.offset, "line": self.line}

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None


class _TextReader(LineReader):
    def __init__(self, ds: "TextLineDataset", state: Mapping[str, Any] | None) -> None:
        super().__init__(ds.files, ds.compression, ds.storage_options, state, cache=ds.cache)
        self.encoding = ds.encoding

    def __next__(self) -> Any:
        raw = super().__next__()
        if self.encoding is None:
            return raw
        try:
            return raw.decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise UnicodeDecodeError(exc.encoding, exc.object, exc.start, exc.end,
                                     f"{exc.reason} in {storage.mask(self.url)}, line {self.line}") from None


class TextLineDataset(SourceDataset):
    """Lines of text files, file after file (see :func:`read_text`)."""

    kind = "text"

    def __init__(self, files: Any, compression: str | None = "auto", encoding: str | None = "utf-8",
                 storage_options: Mapping[str, Any] | None = None, cache_dir: str | None = None,
                 cache_limit: int | str | None = None) -> None:
        normalize_compression(compression)
        check_encoding(encoding)
        self.files = storage.expand(files, storage_options)
        self.compression = compression
        self.encoding = encoding
        self.storage_options = storage_options
        self.cache = get_cache(cache_dir, cache_limit)

    def open(self, state: Mapping[str, Any] | None, raw: bool) -> _TextReader:
        return _TextReader(self, state)

    def __repr__(self) -> str:
        return f"read_text({len(self.files)} files)"


@renamed_argument("files", "source")
def read_text(source: str | os.PathLike | Iterable[str | os.PathLike], compression: str | None = "auto",
              encoding: str | None = "utf-8", storage_options: Mapping[str, Any] | None = None,
              cache_dir: str | None = None, cache_limit: int | str | None = None) -> TextLineDataset:
    """The lines of text files (``source``: a URL, a glob or a list; any storage), newline removed.

    Lines are ``str`` decoded with ``encoding`` (``None``: ``bytes``). ``compression`` as
    for :func:`read_tfrecord`. Resumes by byte offset. Raises ``FileNotFoundError`` when a
    path or glob matches nothing, ``UnicodeDecodeError`` naming file and line for bad text,
    :class:`TextStreamError` naming file, line and offset for a cut or damaged compressed file,
    ``ValueError`` for an encoding that does not write line breaks as ASCII bytes (UTF-16).
    Remote files are fetched in parallel ranged GETs; ``cache_dir``/``cache_limit`` keep
    them on local disk as :func:`read_tfrecord` does.
    """
    return TextLineDataset(source, compression, encoding, storage_options, cache_dir, cache_limit)

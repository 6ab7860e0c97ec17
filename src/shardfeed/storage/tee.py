"""One remote object downloaded into its new cache entry while its reader reads it."""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .counters import IOCounters
from .urls import mask

if TYPE_CHECKING:
    from .cache import ObjectCache


class LocalWriteError(OSError):
    """Writing a cache entry to local disk failed (full, read-only, gone): the cache is
    read around, the remote read goes on."""


class TeeStream(io.RawIOBase):
    """One remote object downloaded into its new cache entry by a thread at the link's
    pace, read by its reader from the part written so far: the first records arrive after
    one round trip, and the entry is complete as soon as the link allows whatever the
    reader's pace (other processes wait for it, as for any download). Committed at the end
    of the object; when the reader closes it before, the download stops and the partial
    entry is dropped. Holds the entry's lock until then. When the local disk refuses a
    write (full, read-only), the entry is dropped and the reader goes on past the bytes
    written with ranged reads of its own: the cache is read around, the pass goes on."""

    def __init__(self, cache: "ObjectCache", key: str, url: str, stream: Any, begun: tuple, counters: IOCounters,
                 held: contextlib.ExitStack, storage_options: Mapping[str, Any] | None = None,
                 scope: Any = None) -> None:
        super().__init__()
        self.cache, self.key, self.url, self.counters, self.held = cache, key, url, counters, held
        self.storage_options, self.scope = storage_options, scope
        self.size, self.etag, fd, self.tmp = begun
        self.rfd = os.open(self.tmp, os.O_RDONLY)
        self.pos = 0
        self.written = 0
        self.error: BaseException | None = None
        self.local_failed = False  # the disk refused a write: bytes past `written` come from storage
        self.around: Any = None  # the reader's own ranged read past `written`
        self.finished = False
        self.stop = threading.Event()
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._fill, args=(stream, fd), name="shardfeed-cache-fill",
                                       daemon=True)
        self.thread.start()

    def _write(self, out: Any, piece: Any) -> None:
        view = memoryview(piece)
        while len(view):
            try:
                k = out.write(view)
            except OSError as exc:
                raise LocalWriteError(exc.errno, f"writing the cache entry {self.tmp}: {exc.strerror}") from exc
            view = view[k:]
            with self.cond:
                self.written += k
                self.cond.notify_all()

    def _fill(self, stream: Any, fd: int) -> None:
        from ..crc import crc32c  # noqa: PLC0415

        crc = 0
        try:
            with stream, os.fdopen(fd, "wb", buffering=0) as out:
                while not self.stop.is_set() and len(piece := stream.read(8 << 20)):
                    self._write(out, piece)
                    crc = crc32c(piece, crc)
            if not self.stop.is_set():
                if self.written != self.size:
                    raise OSError(f"{mask(self.url)}: downloaded {self.written} bytes of {self.size}")
                try:
                    self.cache._commit(self.key, self.url, self.tmp, self.size, self.etag, crc, self.counters,
                                       scope=self.scope)
                    self.tmp = None
                except LocalWriteError as exc:  # every byte is in the file the reader reads
                    self.cache._disk_trouble(exc, self.counters)
        except LocalWriteError as exc:
            self.local_failed = True
            self.cache._disk_trouble(exc, self.counters)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            self.error = exc
        finally:
            if self.tmp is not None:  # stopped or failed: nothing half-made stays
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.tmp)
            self.held.close()
            with self.cond:
                self.finished = True
                self.cond.notify_all()

    def readable(self) -> bool:
        return True

    def _ready(self) -> int:
        """Bytes readable at ``pos`` from the local file now, waiting for the download; 0
        at the end (or where the local file stopped)."""
        with self.cond:
            while self.written <= self.pos and not self.finished:
                self.cond.wait(1.0)
            if self.written > self.pos:
                return self.written - self.pos
        if self.error is not None:
            raise self.error
        return 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size
        if self.around is None:
            avail = self._ready()
            if avail or not n:
                data = os.pread(self.rfd, min(n, avail), self.pos) if avail and n else b""
                self.pos += len(data)
                return data
            if not self.local_failed or self.pos >= self.size:
                return b""
            from .io import open_range  # noqa: PLC0415 - io imports the cache's users

            self.around = open_range(self.url, self.pos, self.size, self.storage_options, self.counters)
        data = self.around.read(n)
        self.pos += len(data)
        return bytes(data)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        self.stop.set()
        self.thread.join()
        os.close(self.rfd)
        if self.around is not None:
            self.around.close()
        super().close()

"""A host-wide local cache of whole remote objects (shards and their index files).

``cache_dir=`` on a source (or ``SHARDFEED_CACHE_DIR``) keeps every remote object it
reads as a local file under ``<cache_dir>/objects``, so later passes (and every other
process on the host) read it from local disk:

- **Checked at each pass.** Each entry records the object's size and ETag, the local
  file's size and modification time and a CRC-32C of its bytes. The first use of an entry
  in each pass (:meth:`ObjectCache.for_pass`; every use, outside a pass) checks all of them:
  the object's size and ETag must be those storage reports (an entry without the ETag
  storage reports is never trusted), and one read of the file for the CRC (from the page
  cache, a few GB/s). A pass asks storage once per folder, one listing page for up to 1000
  objects, shared by all of them; where listing is denied or the store is not S3, one HEAD
  request per object (:meth:`.cache_trust.CachePass.remote_info`). Later uses in the pass
  check the local size and time. A stale, truncated or altered copy is dropped and fetched
  again; an object gone from storage is a ``FileNotFoundError`` naming it.
- **Trusted folder only.** A cache folder another user can write into (not owned by us, or
  writable by everyone without the sticky bit) is refused: anyone could plant entries.
- **Shared safely.** A download holds a lock file (``flock``) for its entry and writes a
  temporary file renamed into place, so two processes never download one object twice at
  once, and nobody ever sees a partial file.
- **Epoch-aware eviction.** With ``cache_limit`` bytes, objects are admitted while they
  fit. When the cache is full, room is made only from entries this process has not used
  and that nobody used for ``min_age_s`` (another dataset's, yesterday's); the objects of
  the dataset being read are never evicted to make room for each other. A dataset twice
  the cache's size so keeps one fixed half resident and fetches the other half each epoch,
  where LRU would evict every object before its next use and fetch everything again.
- **Only its own files.** Eviction deletes only entries it wrote (a 32-hex-digit name
  with its metadata beside it) in its own folder, never anything else there. Partial
  downloads of a process that died are deleted at the next open.
- **Read around on local trouble.** A full disk, or a cache folder that cannot be
  written, is read around (from storage), with one warning naming the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from .cache_trust import CachePass, UnsafeCacheFolder, check_folder
from .counters import IOCounters
from .tee import LocalWriteError, TeeStream
from .urls import endpoint_option, mask, parse_url

logger = logging.getLogger(__name__)

MARKER = ".shardfeed-cache"
_META = ".json"
_LOCK = ".lock"
TROUBLE_S = 60.0
"""After the local disk refused a write, new objects are read around the cache this long."""
MIN_AGE_S = 3600.0
"""An entry this process has not used can be evicted once nobody used it for this long."""


def default_cache_dir() -> str | None:
    """``$SHARDFEED_CACHE_DIR``, or ``None`` (no cache) when it is not set."""
    return os.environ.get("SHARDFEED_CACHE_DIR") or None


def default_cache_limit() -> int | None:
    """``$SHARDFEED_CACHE_LIMIT`` in bytes (``K``, ``M``, ``G``, ``T`` suffixes allowed)."""
    text = os.environ.get("SHARDFEED_CACHE_LIMIT")
    return parse_size(text) if text else None


def parse_size(value: int | str | None) -> int | None:
    """Bytes from an int or a string such as ``"200G"`` or ``"1.5T"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"cache_limit must be a number of bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"cache_limit must be >= 0 bytes, got {value}")
        return value
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:] if text else "", 1)
    try:
        n = float(text[:-1] if scale > 1 else text)
    except ValueError:
        raise ValueError(f"cache_limit must be a number of bytes such as 200000000 or '200G', got {value!r}") from None
    if n < 0:
        raise ValueError(f"cache_limit must be >= 0 bytes, got {value!r}")
    return int(n * scale)


@contextlib.contextmanager
def _flock(path: str, blocking: bool = True) -> Iterator[bool]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # the lock of an entry cannot even be made: the disk is the trouble
        raise LocalWriteError(exc.errno, f"making the lock file {path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class ObjectCache:
    """Whole remote objects as local files under ``<directory>/objects``, at most
    ``limit`` bytes of them (``None``: as many as the disk holds, less 1 GiB).

    Raises :class:`UnsafeCacheFolder` (a ``PermissionError``) for a folder another user
    can write into, ``OSError`` when the folder cannot be made."""

    def __init__(self, directory: str, limit: int | None = None, min_age_s: float = MIN_AGE_S) -> None:
        self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
        self.root = os.path.join(self.directory, "objects")
        self.limit = parse_size(limit)
        self.min_age_s = min_age_s
        os.makedirs(self.root, exist_ok=True)
        check_folder(self.directory, ours=False)
        check_folder(self.root, ours=True)
        marker = os.path.join(self.root, MARKER)
        if not os.path.exists(marker):
            with open(marker, "w", encoding="utf-8") as f:
                f.write("shardfeed object cache: files here are managed by shardfeed\n")
        self._lock = threading.Lock()
        self._used: set[str] = set()  # keys this process read: never evicted by it
        self._trouble_until = 0.0  # the disk refused a write: read around until then
        self._warned = False
        self._list_denied: set[tuple] = set()  # stores whose listing was refused: a HEAD per object
        self._sweep()

    def __reduce__(self):
        # a copy in another process is that process's cache of the same folder
        return get_cache, (self.directory, self.limit)

    def __repr__(self) -> str:
        return f"ObjectCache({self.directory!r}, limit={self.limit})"

    def for_pass(self) -> "CachePass":
        """A view of this cache for one pass: each entry checked in full at its first use
        in the pass (see the module's docstring), trusted for the rest of it."""
        return CachePass(self)

    def _disk_trouble(self, exc: BaseException, counters: IOCounters | None = None) -> None:
        """The local disk refused a write: read around the cache for a while, say so once."""
        self._trouble_until = time.monotonic() + TROUBLE_S
        if counters is not None:
            counters.add(cache_bypassed=1)
        self._warn_once("the cache at %s cannot be written (%s); reading from storage around it", self.directory,
                        exc)

    def _warn_once(self, fmt: str, *args: Any) -> None:
        with self._lock:
            first, self._warned = not self._warned, True
        (logger.warning if first else logger.debug)(fmt, *args)

    # -- names -----------------------------------------------------------------------------
    @staticmethod
    def key_of(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
        """The entry name of ``url``: a hash of the URL and the endpoint serving it."""
        endpoint = endpoint_option(storage_options)
        return hashlib.sha256(f"{url}\0{endpoint}".encode()).hexdigest()[:32]

    def _paths(self, key: str) -> tuple[str, str, str]:
        base = os.path.join(self.root, key)
        return base, base + _META, base + _LOCK

    # -- use -------------------------------------------------------------------------------
    def fetch(self, url: str, storage_options: Mapping[str, Any] | None = None,
              counters: IOCounters | None = None, seen: set | None = None,
              scope: "CachePass | None" = None) -> str | None:
        """The local path of ``url``'s bytes, downloading the object when it is not cached
        (or its cached copy is damaged or stale); ``None`` when the cache cannot hold it
        or the local disk refuses it (read it from storage then). ``seen``: the URLs this
        pass already counted (a hit or a miss), for a reader that opens the same object
        many times in one pass; ``scope``: the pass (entries checked in it are trusted)."""
        counters = counters if counters is not None else IOCounters()
        key = self.key_of(url, storage_options)
        data, meta_path, lock = self._paths(key)
        with self._lock:
            self._used.add(key)
        path = self._valid(key, url, storage_options, counters, seen, scope)
        if path is not None:
            return path
        try:
            with _flock(lock):
                path = self._valid(key, url, storage_options, counters, seen, scope)  # another process got it
                if path is not None:
                    return path
                return self._download(key, url, storage_options, counters, seen, scope)
        except LocalWriteError as exc:
            self._disk_trouble(exc, counters)
            return None

    def _read_meta(self, key: str) -> dict | None:
        _, meta_path, _ = self._paths(key)
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            return meta if isinstance(meta, dict) else None
        except (OSError, ValueError):
            return None

    def _valid(self, key: str, url: str, storage_options, counters: IOCounters, seen: set | None = None,
               scope: "CachePass | None" = None) -> str | None:
        data, _, lock = self._paths(key)
        meta = self._read_meta(key)
        if meta is None:
            return None
        try:
            st = os.stat(data)
        except OSError:
            return None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if st.st_size != meta.get("size") or st.st_mtime_ns != meta.get("mtime_ns"):
            logger.warning("cached copy of %s was changed on disk (%s); fetching it again", mask(url), data)
            return None
        if scope is None or not scope.checked(key, stamp):
            if not self._check_remote(url, storage_options, meta, counters, scope):
                return None
            if not self._check_crc(data, meta, url):
                with contextlib.suppress(OSError):
                    self._evict(key)  # damaged: never useful again
                return None
            if scope is not None:
                scope.mark(key, stamp)
        with contextlib.suppress(OSError):
            os.utime(lock)  # last use, for eviction
        if self._first(url, seen):
            counters.add(cache_hits=1, bytes_from_cache=st.st_size)
        return data

    def _first(self, url: str, seen: set | None) -> bool:
        if seen is None:
            return True
        with self._lock:
            first = url not in seen
            seen.add(url)
            return first

    def _check_remote(self, url: str, storage_options, meta: dict, counters: IOCounters,
                      scope: "CachePass | None" = None) -> bool:
        size, etag = self._remote_info(url, storage_options, counters, scope)
        # the ETag storage reports must be the one recorded: an entry without one (planted,
        # or of an object that had none) is trusted only for an object that has none
        if size != meta.get("size") or etag != meta.get("etag"):
            logger.info("%s changed in storage since it was cached (or its entry does not say which version it "
                        "holds); fetching it again", mask(url))
            return False
        return True

    @staticmethod
    def _check_crc(data: str, meta: dict, url: str) -> bool:
        from ..crc import crc32c  # noqa: PLC0415

        crc = 0
        try:
            with open(data, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # mapped, not read: no copy per block (~7 GB/s from the page cache, 4x read())
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else contextlib.nullcontext(b"")
                with mapped as m, memoryview(m) as view:
                    for at in range(0, size, 64 << 20):
                        crc = crc32c(view[at:at + (64 << 20)], crc)
        except OSError as exc:
            logger.warning("cached copy of %s cannot be read (%s); fetching it again", mask(url), exc)
            return False
        if crc != meta.get("crc32c"):
            logger.warning("cached copy of %s is damaged (CRC-32C mismatch in %s); fetching it again", mask(url), data)
            return False
        return True

    def open_tee(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 counters: IOCounters | None = None, scope: "CachePass | None" = None) -> tuple[str | None, Any]:
        """For a reader about to read ``url`` whole, from its first byte:
        ``(path, None)`` when a valid copy is cached; ``(None, stream)`` on a miss, a raw
        stream of the object's bytes that fills the cache entry as the reader reads it
        (downloaded by a thread at the link's pace, committed at the end, dropped if the
        reader stops before), so the first records arrive after one round trip instead of
        after the whole download; ``(None, None)`` when the cache cannot hold the object
        (read it from storage then). When another process is downloading it, waits for
        that download as :meth:`fetch` does."""
        counters = counters if counters is not None else IOCounters()
        key = self.key_of(url, storage_options)
        _, _, lock = self._paths(key)
        with self._lock:
            self._used.add(key)
        path = self._valid(key, url, storage_options, counters, scope=scope)
        if path is not None:
            return path, None
        held = contextlib.ExitStack()
        try:
            if not held.enter_context(_flock(lock, blocking=False)):
                held.close()  # another process is fetching it, at the link's pace: wait for it
                return self.fetch(url, storage_options, counters, scope=scope), None
            path = self._valid(key, url, storage_options, counters, scope=scope)
            if path is not None:
                held.close()
                return path, None
            begun = self._begin(key, url, storage_options, counters, scope)
            if begun is None:
                held.close()
                return None, None
            from .io import open_range  # noqa: PLC0415 - io imports this module's users

            stream = open_range(url, 0, begun[0], storage_options, counters, zero_copy=True)
        except LocalWriteError as exc:
            held.close()
            self._disk_trouble(exc, counters)
            return None, None
        except BaseException:
            held.close()
            raise
        return None, TeeStream(self, key, url, stream, begun, counters, held, storage_options, scope)

    @staticmethod
    def _remote_info(url: str, storage_options, counters: IOCounters,
                     scope: "CachePass | None") -> tuple[int, str | None]:
        """``(size, etag)`` of ``url`` in storage: from the pass's listing (``scope``), or a HEAD."""
        from .io import _remote_info  # noqa: PLC0415 - io imports this module's users

        if scope is not None:
            return scope.remote_info(url, storage_options, counters)
        return _remote_info(url, storage_options, counters)

    def _begin(self, key: str, url: str, storage_options, counters: IOCounters,
               scope: "CachePass | None" = None) -> tuple | None:
        """``(size, etag, fd, tmp)`` for a download of ``url`` into a new entry; ``None``
        (counted as bypassed) when the cache cannot hold it."""
        if time.monotonic() < self._trouble_until:
            counters.add(cache_bypassed=1)  # the disk refused a write a moment ago
            return None
        size, etag = self._remote_info(url, storage_options, counters, scope)
        # a stale copy stays until the new one replaces it (os.replace): a reader that
        # opened it keeps reading a whole file, never a missing one
        reserved = self._admit(key, size)
        if reserved is None:
            counters.add(cache_bypassed=1)
            return None
        return (size, etag) + reserved

    def _commit(self, key: str, url: str, tmp: str, size: int, etag: Any, crc: int, counters: IOCounters,
                seen: set | None = None, scope: "CachePass | None" = None) -> str:
        """The downloaded ``tmp`` made the entry of ``key``, with its metadata (raises
        :class:`LocalWriteError` when the disk refuses it)."""
        data, meta_path, _ = self._paths(key)
        tmp_meta = None
        replaced = False
        try:
            os.replace(tmp, data)
            replaced = True
            st = os.stat(data)
            meta = {"url": mask(url), "size": size, "etag": etag, "mtime_ns": st.st_mtime_ns, "crc32c": crc,
                    "cached_at": time.time()}
            fd2, tmp_meta = tempfile.mkstemp(prefix=f".{key}.", suffix=".meta", dir=self.root)
            with os.fdopen(fd2, "w", encoding="utf-8") as f:
                json.dump(meta, f)
            os.replace(tmp_meta, meta_path)
            tmp_meta = None
        except BaseException as exc:
            for path in (tmp, tmp_meta) + ((data, meta_path) if replaced else ()):
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)  # nothing half-made stays behind, nothing untracked
            if isinstance(exc, OSError) and not isinstance(exc, LocalWriteError):
                raise LocalWriteError(exc.errno, f"committing the cache entry {data}: {exc.strerror}") from exc
            raise
        if scope is not None:
            scope.mark(key, (st.st_size, st.st_mtime_ns, st.st_ino))  # just made: nothing to check
        self._first(url, seen)
        counters.add(cache_misses=1)
        return data

    def _download(self, key: str, url: str, storage_options, counters: IOCounters,
                  seen: set | None = None, scope: "CachePass | None" = None) -> str | None:
        from ..crc import crc32c  # noqa: PLC0415
        from .io import open_range  # noqa: PLC0415

        begun = self._begin(key, url, storage_options, counters, scope)
        if begun is None:
            return None
        size, etag, fd, tmp = begun
        try:
            crc = 0
            got = 0
            with os.fdopen(fd, "wb") as out, open_range(url, 0, size, storage_options, counters,
                                                          zero_copy=True) as stream:
                while len(piece := stream.read(16 << 20)):
                    try:
                        out.write(piece)
                    except OSError as exc:
                        raise LocalWriteError(exc.errno, f"writing the cache entry {tmp}: {exc.strerror}") from exc
                    crc = crc32c(piece, crc)
                    got += len(piece)
            if got != size:
                raise OSError(f"{mask(url)}: downloaded {got} bytes of {size}")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return self._commit(key, url, tmp, size, etag, crc, counters, seen, scope)

    # -- room ------------------------------------------------------------------------------
    def entries(self) -> list[tuple[str, int, float]]:
        """``(key, size, last_used)`` of every complete entry."""
        out = []
        for name in os.listdir(self.root):
            if not name.endswith(_META) or len(name) != 32 + len(_META):
                continue
            key = name[:32]
            if not all(c in "0123456789abcdef" for c in key):
                continue
            meta = self._read_meta(key)
            if meta is None or not isinstance(meta.get("size"), int):
                continue
            data, _, lock = self._paths(key)
            try:
                used = os.stat(lock).st_mtime
            except OSError:
                used = meta.get("cached_at", 0.0)
            if os.path.exists(data):
                out.append((key, meta["size"], used))
        return out

    def _sweep(self) -> int:
        """Delete the partial downloads and metadata that a process which died left (their
        entry's lock is free: nobody writes them); bytes of the downloads under way."""
        under_way = 0
        for name in os.listdir(self.root):
            if not (name.endswith((".part", ".meta")) and name.startswith(".") and len(name) > 34):
                continue
            path = os.path.join(self.root, name)
            try:
                with _flock(os.path.join(self.root, name[1:33] + _LOCK), blocking=False) as free:
                    if free:
                        with contextlib.suppress(OSError):
                            os.unlink(path)
                        continue
            except OSError:  # a lock file that cannot be made (read-only disk): leave it
                continue
            if name.endswith(".part"):
                with contextlib.suppress(OSError):
                    under_way += os.stat(path).st_size
        return under_way

    def usage(self, but: str | None = None) -> int:
        """Bytes held by complete entries (``but`` that one) and downloads under way."""
        return sum(size for k, size, _ in self.entries() if k != but) + self._sweep()

    def _admit(self, key: str, size: int) -> tuple[int, str] | None:
        """Room for an object of ``size`` bytes, made when allowed: ``(fd, path)`` of its
        download file, already ``size`` bytes long (sparse) so that every other download
        sees the room taken; ``None`` when the cache cannot hold it."""
        try:
            with _flock(os.path.join(self.root, ".admit" + _LOCK)):
                if not self._room(key, size):
                    return None
                fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".part", dir=self.root)
                try:
                    os.ftruncate(fd, size)
                except BaseException:
                    os.close(fd)
                    os.unlink(tmp)
                    raise
                return fd, tmp
        except LocalWriteError:
            raise
        except OSError as exc:
            raise LocalWriteError(exc.errno, f"making room in {self.root}: {exc.strerror}") from exc

    def _room(self, key: str, size: int) -> bool:
        limit = self.limit
        if limit is None:
            free = shutil.disk_usage(self.root).free
            if free - size < (1 << 30):
                self._warn_once("the cache at %s has less than 1 GiB free after this object; reading around it",
                                self.directory)
                return False
            return True
        if size > limit:
            return False
        used = self.usage(but=key)  # a stale copy of this object is replaced, not kept
        if used + size <= limit:
            return True
        with self._lock:
            mine = set(self._used)
        now = time.time()
        candidates = sorted((e for e in self.entries() if e[0] not in mine and e[0] != key
                             and now - e[2] >= self.min_age_s), key=lambda e: e[2])
        for k, n, _ in candidates:
            if self._evict(k):
                used -= n
                if used + size <= limit:
                    return True
        return False

    def _evict(self, key: str) -> bool:
        data, meta_path, lock = self._paths(key)
        with _flock(lock, blocking=False) as got:
            if not got:
                return False  # being downloaded or checked right now
            for path in (meta_path, data):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        logger.debug("evicted %s from the cache at %s", key, self.root)
        return True

    def clear(self) -> None:
        """Delete every entry this cache wrote (and nothing else)."""
        for key, _, _ in self.entries():
            self._evict(key)


_caches: dict[tuple, ObjectCache] = {}
_caches_lock = threading.Lock()


_unusable: dict[tuple, float] = {}  # cache folders that could not be made: when it was tried


def get_cache(directory: str | None, limit: int | str | None = None) -> ObjectCache | None:
    """The process's :class:`ObjectCache` for ``directory`` (``None``: the one named by
    ``SHARDFEED_CACHE_DIR``, or no cache). A folder that cannot be made or written is no
    cache (reads go to storage), with one warning naming it; raises
    :class:`UnsafeCacheFolder` for a folder another user can write into."""
    directory = directory if directory is not None else default_cache_dir()
    if directory is None:
        return None
    limit = parse_size(limit) if limit is not None else default_cache_limit()
    key = (os.path.abspath(os.path.expanduser(os.fspath(directory))), limit, os.getpid())
    with _caches_lock:
        cache = _caches.get(key)
        if cache is not None:
            return cache
        if time.monotonic() - _unusable.get(key, -TROUBLE_S) < TROUBLE_S:
            return None
        try:
            cache = _caches[key] = ObjectCache(directory, limit)
        except UnsafeCacheFolder:
            raise
        except OSError as exc:
            first = key not in _unusable
            _unusable[key] = time.monotonic()
            (logger.warning if first else logger.debug)(
                "the cache folder %s cannot be used (%s: %s); reading from storage without a cache", key[0],
                type(exc).__name__, exc)
            return None
        return cache


def cacheable(url: str) -> bool:
    """Remote objects are cached; local files are read where they are."""
    return not parse_url(url).is_local

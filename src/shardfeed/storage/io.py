"""Read, ranged-read, write, list and glob by URL.

Every operation retries transient errors (:mod:`.retry`) and turns library errors into
``FileNotFoundError``, ``PermissionError`` or :class:`~shardfeed.errors.StorageError`
whose message names the (masked) URL and says why.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import StorageError
from .fs import get_filesystem
from .retry import call_with_retry, transient_reason
from .urls import ParsedURL, has_magic, mask, parse_url

logger = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE = 8 << 20  # bytes per ranged read of a remote object
_SPOOL_MAX = 64 << 20  # remote writes are staged in memory up to this, then on local disk


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of an HTTP client error anywhere in ``exc``'s cause chain."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        status = getattr(e, "status", None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def _translate(exc: BaseException, url: str, op: str) -> BaseException:
    """An exception that names ``url`` (masked) and the operation, keeping the original as cause."""
    if isinstance(exc, StorageError):
        return exc
    where = mask(url)
    detail = mask(exc) or type(exc).__name__
    http = _http_status(exc)
    if http in (401, 403):  # fsspec's HTTP backend turns any failed stat into FileNotFoundError
        return PermissionError(f"{where}: access denied (HTTP {http}) ({op})")
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(f"{where}: no such file or object ({op})")
    if isinstance(exc, PermissionError):
        return PermissionError(f"{where}: access denied ({op}): {detail}")
    if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        return type(exc)(f"{where}: {detail}")
    status = getattr(exc, "response", None)
    code = status.get("Error", {}).get("Code") if isinstance(status, dict) else None
    if code in ("NoSuchBucket",):
        return FileNotFoundError(f"{where}: the bucket does not exist ({op})")
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
        return PermissionError(f"{where}: access denied ({code}) ({op})")
    reason = transient_reason(exc)
    extra = f" after retries ({reason})" if reason else ""
    return StorageError(f"{where}: {op} failed{extra}: {type(exc).__name__}: {detail}", url=where)


def _run(op: str, url: str, fn, counters: Any = None, stop: Any = None):
    try:
        return call_with_retry(fn, op=op, url=url, counters=counters, stop=stop)
    except (ValueError, TypeError, ImportError):
        raise
    except Exception as exc:  # noqa: BLE001 - translated with context
        # the library's own exception (and its chain) may print the URL with its secrets
        # (a signed URL's signature, a password): the translated one says what it said,
        # masked, and is raised without it
        raise _translate(exc, url, op) from None


def size(url: str, storage_options: Mapping[str, Any] | None = None, counters: Any = None) -> int:
    """Size of the object or file at ``url`` in bytes (a remote one's HEAD counted in
    ``counters``, a pass's :class:`~.counters.IOCounters`, when given)."""
    parsed = parse_url(url)
    if parsed.is_local:
        try:
            st = os.stat(parsed.path)
        except OSError as exc:
            raise _translate(exc, url, "stat") from exc
        if not os.path.isfile(parsed.path):
            raise IsADirectoryError(f"{mask(url)}: is a directory, not a file")
        return st.st_size
    return _remote_info(url, storage_options, counters)[0]


def _remote_info(url: str, storage_options: Mapping[str, Any] | None, counters: Any = None) -> tuple[int, str | None]:
    """``(size, etag)`` of a remote object (one HEAD request, counted in ``counters``)."""
    parsed = parse_url(url)
    fs, path = get_filesystem(parsed, storage_options)
    info = _listed(fs, path)
    if info is None:
        info = _run("stat", url, lambda: counters.timed_stat(lambda: fs.info(path)) if counters is not None
                    else fs.info(path), counters)
        if counters is not None:
            counters.add(stat_requests=1)
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{mask(url)}: is a directory, not a file")
    etag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
    return int(info["size"]), (str(etag).strip('"') if etag else None)


_NOT_LISTED = "not listed"  # what _listing answers for a path whose folder no listing of this build holds


def _listing(fs: Any, path: str) -> dict | None | str:
    """What a listing ``fs`` made during this build (a glob's, kept until the next dataset
    lists again; see :func:`_forget_listings`) says of ``path``, which ``fs`` would answer
    from without a request: its entry; None when the listing holds its folder and not it (a
    read then fails without asking the store: s3fs answers from that listing);
    :data:`_NOT_LISTED` when no listing holds its folder. Asked first, so that only a
    request that goes to the store is counted as one (found from outside: a blocks shuffle
    counted 20 HEADs the wire never saw)."""
    if not getattr(fs, "dircache", None):
        return _NOT_LISTED
    try:
        entries = fs._ls_from_cache(path)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - anything else: the store is asked
        return _NOT_LISTED
    if entries is None:
        return _NOT_LISTED
    for e in entries:
        if e.get("name", "").rstrip("/") == path.rstrip("/") and "size" in e:
            return e
    return _NOT_LISTED


def _listed(fs: Any, path: str) -> dict | None:
    """``path``'s entry in a listing of this build (:func:`_listing`), or None."""
    got = _listing(fs, path)
    return got if isinstance(got, dict) else None


def _protocol(fs: Any) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def _sizes_whole_reads(fs: Any) -> bool:
    """Whether ``fs`` reads a whole object by asking its size first (s3fs with concurrency:
    a HEAD, unless a listing answers, then one GET, or parallel GETs of ``default_block_size``)."""
    return _protocol(fs) in ("s3", "s3a", "oss") and (getattr(fs, "max_concurrency", 1) or 1) > 1


def _missing_object_probe(fs: Any) -> dict[str, int]:
    """What a read of a missing object asked the store, as counts to add to the one GET
    :meth:`~.counters.IOCounters.request_ended` counts for the attempt: s3fs asks for the
    object's head, then lists its key as a folder (two stat requests, no GET); others (gcsfs)
    try the GET itself."""
    if _protocol(fs) in ("s3", "s3a"):
        return {"stat_requests": 2, "requests": -1}
    return {}


def exists(url: str, storage_options: Mapping[str, Any] | None = None, counters: Any = None) -> bool:
    """Whether a file or object exists at ``url`` (a remote one's HEAD counted in
    ``counters`` when given; none when a listing of this build already says)."""
    parsed = parse_url(url)
    if parsed.is_local:
        return os.path.exists(parsed.path)
    fs, path = get_filesystem(parsed, storage_options)
    listed = _listing(fs, path)
    if listed is not _NOT_LISTED:
        return listed is not None
    found = bool(_run("exists", url, lambda: fs.exists(path), counters))
    if counters is not None:
        counters.add(stat_requests=1)
    return found


def _read_whole_file(path: str) -> bytes:
    """The whole local file at ``path``: one read of its size (and one more to see the end),
    without the buffered file object ``open`` builds (a fifth of the cost of a 50 KB file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    try:
        first = os.read(fd, os.fstat(fd).st_size + 1)
        if not first:
            return first
        parts = [first]
        while True:  # a file that grew, or one whose size stat does not tell (/proc)
            more = os.read(fd, 1 << 16)
            if not more:
                break
            parts.append(more)
        return first if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def read_bytes(
    url: str,
    start: int | None = None,
    end: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    counters: Any = None,
) -> bytes:
    """Bytes ``[start, end)`` of ``url`` (all of it by default); fewer at the end of the file.
    A remote read's GETs (each attempt) and bytes are counted in ``counters`` (an
    :class:`~.counters.IOCounters`) when given: a pass's index files, say."""
    parsed = parse_url(url)
    if parsed.is_local:
        try:
            if not start and end is None:
                return _read_whole_file(parsed.path)
            with open(parsed.path, "rb") as f:
                if start:
                    f.seek(start)
                return f.read() if end is None else f.read(max(0, end - (start or 0)))
        except OSError as exc:
            raise _translate(exc, url, "read") from exc
    fs, path = get_filesystem(parsed, storage_options)
    if counters is None:
        return _run("read", url, lambda: fs.cat_file(path, start=start, end=end))

    def attempt() -> bytes:
        listed = _listing(fs, path)  # before the read: a failed one may list the folder itself
        known_missing = listed is None
        sized = start is None and end is None and _sizes_whole_reads(fs) and not isinstance(listed, dict)
        started = counters.request_started()
        data = b""
        try:
            data = fs.cat_file(path, start=start, end=end)
            if sized:  # s3fs asked for the object's size first (a HEAD), and read a large one in parts
                parts = -(-len(data) // max(1, int(getattr(fs, "default_block_size", 0) or len(data) or 1)))
                counters.add(stat_requests=1, requests=max(0, parts - 1))
            return data
        except FileNotFoundError:
            # no GET crossed the wire for a missing object: what the filesystem asked instead
            # (nothing, when a listing of this build already said it is not there)
            counters.add(**({"requests": -1} if known_missing else _missing_object_probe(fs)))
            raise
        finally:
            counters.request_ended(len(data), started)

    return _run("read", url, attempt, counters)


class RangedReader(io.RawIOBase):
    """A read-only, seekable file over ranged reads, each retried on its own.

    Used for remote objects: one request per ``buffer_size`` bytes (default 8 MiB), so a
    dropped connection costs one range, not the whole object.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 buffer_size: int = DEFAULT_BUFFER_SIZE):
        super().__init__()
        self.url = url
        self._fs, self._path = get_filesystem(url, storage_options)
        self._size = size(url, storage_options)
        self._pos = 0
        self._buffer_size = max(1, int(buffer_size))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._read_range(self._pos, self._pos + n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self._read_range(self._pos, end)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def _read_range(self, start: int, end: int) -> bytes:
        data = _run("read", self.url, lambda: self._fs.cat_file(self._path, start=start, end=end))
        if len(data) != end - start:
            raise StorageError(
                f"{mask(self.url)}: short read at byte offset {start}: asked for {end - start} bytes, "
                f"got {len(data)} (the object changed while it was read?)",
                url=mask(self.url),
            )
        return data

    @property
    def size(self) -> int:
        return self._size


def open_input(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    buffer_size: int = DEFAULT_BUFFER_SIZE,
) -> io.BufferedReader:
    """Open ``url`` for binary reading with a buffer of ``buffer_size`` bytes.

    Local files are opened directly; remote objects through :class:`RangedReader`.
    Raises ``FileNotFoundError`` naming the URL when there is nothing there.
    """
    parsed = parse_url(url)
    if parsed.is_local:
        try:
            if os.path.isdir(parsed.path):
                raise IsADirectoryError(f"{mask(url)}: is a directory, not a file")
            return open(parsed.path, "rb", buffering=min(max(buffer_size, 1 << 16), 1 << 20))
        except OSError as exc:
            raise _translate(exc, url, "open") from exc
    return io.BufferedReader(RangedReader(url, storage_options, buffer_size), buffer_size=buffer_size)


def open_range(
    url: str,
    start: int = 0,
    end: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    counters: Any = None,
    zero_copy: bool = False,
) -> io.RawIOBase:
    """Bytes ``[start, end)`` of ``url`` for one sequential read (``end=None``: to the end).

    Remote objects are fetched as parallel ranged GETs ahead of the reader
    (:class:`~.fetch.RangeStream`), each request and retry counted in ``counters`` (an
    :class:`~.counters.IOCounters`); local files are opened and positioned. ``zero_copy``:
    remote reads return the fetched buffers (``bytearray`` or ``memoryview``) as they are.
    """
    parsed = parse_url(url)
    if parsed.is_local:
        f = open_input(url, storage_options)
        if start:
            f.seek(start)
        return f if end is None else _Bounded(f, end - start)
    from .fetch import RangeStream  # noqa: PLC0415

    return RangeStream(url, start, end, storage_options, counters, zero_copy=zero_copy)


class _Bounded(io.RawIOBase):
    """At most ``n`` bytes of a file, then end of file."""

    def __init__(self, f, n: int) -> None:
        super().__init__()
        self._f = f
        self._left = max(0, n)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        want = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(want) if want else b""
        self._left -= len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


class AtomicWriter(io.RawIOBase):
    """A binary file whose content appears at ``url`` only when closed without error.

    Local: a hidden temporary file in the same directory, renamed into place (``os.replace``)
    on commit. Remote: data is staged in memory (up to 64 MiB, then a local temporary
    file) and uploaded in one put on commit; object stores never show a half-written object.
    Used as a context manager, an exception inside the block discards everything.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None):
        super().__init__()
        self.url = url
        self._parsed: ParsedURL = parse_url(url)
        self._storage_options = storage_options
        self._done = False
        self.bytes_written = 0
        if self._parsed.is_local:
            final = os.path.abspath(self._parsed.path)
            directory = os.path.dirname(final)
            try:
                os.makedirs(directory, exist_ok=True)
                fd, self._tmp_path = tempfile.mkstemp(
                    prefix=f".{os.path.basename(final)}.", suffix=".tmp", dir=directory
                )
            except OSError as exc:
                raise _translate(exc, url, "create") from exc
            self._final = final
            self._file = os.fdopen(fd, "wb", buffering=1 << 20)
        else:
            self._final = self._parsed.path
            self._file = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MAX)

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = self._file.write(b)
        self.bytes_written += n
        return n

    def abort(self) -> None:
        """Discard everything written; nothing appears at ``url``."""
        if self._done:
            return
        self._done = True
        try:
            self._file.close()
        finally:
            if self._parsed.is_local:
                try:
                    os.unlink(self._tmp_path)
                except FileNotFoundError:
                    pass
        super().close()

    def commit(self) -> None:
        """Make the written bytes appear at ``url`` (atomically)."""
        if self._done:
            return
        try:
            if self._parsed.is_local:
                self._file.flush()
                self._file.close()
                os.chmod(self._tmp_path, 0o666 & ~_umask())  # mkstemp made it 0600
                os.replace(self._tmp_path, self._final)
            else:
                self._file.flush()
                self._upload()
                self._file.close()
        except BaseException:
            self.abort()
            raise
        self._done = True
        super().close()

    def _upload(self) -> None:
        fs, path = get_filesystem(self._parsed, self._storage_options)
        parent = path.rsplit("/", 1)[0] if "/" in path else path

        def put():
            self._file.seek(0)
            if self.bytes_written <= _SPOOL_MAX:
                fs.pipe_file(path, self._file.read())
            else:
                with fs.open(path, "wb") as out:  # multipart: visible only on completion
                    while chunk := self._file.read(16 << 20):
                        out.write(chunk)

        if self._parsed.protocol == "memory":
            fs.makedirs(parent, exist_ok=True)
        _run("write", self.url, put)

    def close(self) -> None:
        self.commit()

    def __del__(self) -> None:
        # Only an explicit close() or commit() publishes: a writer dropped half-way (an
        # exception outside a `with`) must leave nothing behind, not a partial file.
        if not getattr(self, "_done", True):
            logger.warning("%s: writer dropped without close(); discarding %d bytes", mask(self.url),
                           self.bytes_written)
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - nothing to do about it during collection
                pass

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def open_output(url: str, storage_options: Mapping[str, Any] | None = None) -> AtomicWriter:
    """Open ``url`` for an atomic binary write (see :class:`AtomicWriter`)."""
    return AtomicWriter(url, storage_options)


def write_bytes(url: str, data: bytes, storage_options: Mapping[str, Any] | None = None,
                counters: Any = None) -> None:
    """Write ``data`` to ``url`` atomically (a remote write counted in ``counters``'s
    ``put_requests`` when given)."""
    with open_output(url, storage_options) as f:
        f.write(data)
    if counters is not None and not parse_url(url).is_local:
        counters.add(put_requests=1)


def remove(url: str, storage_options: Mapping[str, Any] | None = None, missing_ok: bool = True) -> None:
    """Delete the file or object at ``url``."""
    parsed = parse_url(url)
    if parsed.is_local:
        try:
            os.unlink(parsed.path)
        except FileNotFoundError:
            if not missing_ok:
                raise FileNotFoundError(f"{mask(url)}: no such file or object (remove)") from None
        return
    fs, path = get_filesystem(parsed, storage_options)
    if not missing_ok and not exists(url, storage_options):  # object-store deletes are idempotent
        raise FileNotFoundError(f"{mask(url)}: no such file or object (remove)")
    try:
        _run("remove", url, lambda: fs.rm_file(path))
    except FileNotFoundError:
        if not missing_ok:
            raise


def list_dir(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """URLs of the files directly under ``url``, sorted."""
    parsed = parse_url(url)
    if parsed.is_local and os.path.isdir(parsed.path):
        # a local folder without fsspec (whose first import, with asyncio and its codecs, costs
        # more than converting a hundred images); the same names fsspec's LocalFileSystem.ls gives
        base = os.path.abspath(parsed.path)
        try:
            with os.scandir(base) as it:
                files = [os.path.join(base, e.name) for e in it if not e.is_dir()]
        except OSError as exc:
            raise _translate(exc, url, "list") from exc
        return sorted(parsed.with_path(f) for f in files)
    fs, path = get_filesystem(parsed, storage_options)
    _forget_under(fs, path)  # a listing is fresh: see _forget_listings
    entries = _run("list", url, lambda: fs.ls(path, detail=True))
    return sorted(parsed.with_path(_unstrip(fs, e["name"], parsed)) for e in entries if e.get("type") != "directory")


def glob(pattern: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """URLs of the files matching ``pattern`` (``*``, ``?``, ``[...]``, ``**``), sorted.
    Hidden names (starting with ``.``) match only a pattern whose last part starts with ``.``."""
    parsed = parse_url(pattern)
    fs, path = get_filesystem(parsed, storage_options)
    _forget_under(fs, re.split(r"[*?\[]", path, maxsplit=1)[0].rsplit("/", 1)[0])
    found = _run("glob", pattern, lambda: fs.glob(path, detail=True))
    if not parsed.is_local:
        for name, info in found.items():
            note_size(parsed.with_path(_unstrip(fs, name, parsed)), info)
    # as a shell does: hidden names (writers' staging files among them) only when asked for
    hidden_ok = path.rstrip("/").rsplit("/", 1)[-1].startswith(".")
    return sorted(parsed.with_path(_unstrip(fs, name, parsed)) for name, info in found.items()
                  if info.get("type") != "directory"
                  and (hidden_ok or not name.rstrip("/").rsplit("/", 1)[-1].startswith(".")))


def _forget_listings(items: Sequence[str], storage_options: Mapping[str, Any] | None) -> None:
    """Drop what the object stores' filesystems remember of earlier listings: a dataset
    lists when it is built, and the listing cache of the filesystem object (which outlives
    datasets) gave the next one deleted objects, missed new ones, and old sizes that cut a
    grown object's records short without a word (found from outside). Within one build the
    cache still serves: a listing then gives the sizes its objects' stats need."""
    seen = set()
    for item in items:
        parsed = parse_url(item)
        if parsed.is_local or parsed.protocol in ("http", "https", "memory"):
            continue
        fs, _ = get_filesystem(parsed, storage_options)
        if id(fs) not in seen:
            seen.add(id(fs))
            fs.invalidate_cache()


def _forget_under(fs: Any, root: str) -> None:
    """Drop ``fs``'s cached listings of ``root``, its parents and everything under it."""
    cache = getattr(fs, "dircache", None)
    if not cache or not hasattr(fs, "invalidate_cache"):
        return
    fs.invalidate_cache(root)
    root = root.rstrip("/") + "/"
    for key in [k for k in list(cache) if isinstance(k, str) and k.startswith(root)]:
        cache.pop(key, None)


def _unstrip(fs, name: str, parsed: ParsedURL) -> str:
    if parsed.protocol == "memory" and not name.startswith("/"):
        return "/" + name
    return name


def expand(
    urls: str | os.PathLike | Iterable[str | os.PathLike],
    storage_options: Mapping[str, Any] | None = None,
    skip_suffixes: tuple[str, ...] = (),
) -> list[str]:
    """Turn a URL, a glob or a list of them into a list of file URLs.

    Globs are expanded (sorted); a directory expands to the files in it (sorted, hidden
    files left out); plain URLs keep the order given. Names ending in one of
    ``skip_suffixes`` are left out of glob and directory expansions (index files beside
    shards, say), never out of names given explicitly. Raises ``FileNotFoundError`` for a
    glob that matches nothing, a directory that holds no such files, or a plain URL with
    nothing there, naming it.
    """
    def keep(u: str) -> bool:
        name = u.split("?", 1)[0]
        return not (skip_suffixes and name.endswith(skip_suffixes))

    if isinstance(urls, (str, os.PathLike)):
        items: Sequence[str] = [os.fspath(urls)]
    else:
        items = [os.fspath(u) for u in urls]
    out: list[str | list[str]] = []
    remote: list[tuple[int, str]] = []  # (position in out, url): stat'ed together below
    _forget_listings(items, storage_options)
    for item in items:
        if has_magic(item):
            matched = [u for u in glob(item, storage_options) if keep(u)]
            if not matched:
                raise FileNotFoundError(f"{mask(item)}: no files match this pattern")
            out.extend(matched)
            continue
        parsed = parse_url(item)
        if parsed.is_local:
            if os.path.isdir(parsed.path):
                files = sorted(os.path.join(parsed.path, n) for n in os.listdir(parsed.path)
                               if not n.startswith(".") and os.path.isfile(os.path.join(parsed.path, n)) and keep(n))
                if not files:  # as a glob that matches nothing: a pass over nothing is a mistake
                    raise FileNotFoundError(f"{mask(item)}: a directory with no files in it")
                out.extend(files)
            elif not os.path.exists(parsed.path):
                raise FileNotFoundError(f"{mask(item)}: no such file or object")
            else:
                out.append(item)
            continue
        if parsed.protocol in ("http", "https"):
            out.append(item)
            continue
        remote.append((len(out), item))
        out.append(item)
    if remote:
        # one HEAD per object, many at once: a list of a thousand objects is not a
        # thousand round trips one after another
        def stat(item: str) -> list[str]:
            fs, path = get_filesystem(item, storage_options)
            info = _run("stat", item, lambda: fs.info(path))
            if info.get("type") == "directory":
                files = [u for u in list_dir(item, storage_options)
                         if not u.rsplit("/", 1)[-1].startswith(".") and keep(u)]
                if not files:
                    raise FileNotFoundError(f"{mask(item)}: a directory with no files in it")
                return files
            note_size(item, info)
            return [item]

        if len(remote) == 1:
            found = [stat(remote[0][1])]
        else:
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

            with ThreadPoolExecutor(min(32, len(remote)), thread_name_prefix="shardfeed-stat") as pool:
                found = list(pool.map(stat, [u for _, u in remote]))
        for (k, _), urls_found in zip(remote, found):
            out[k] = urls_found
    flat: list[str] = []
    for entry in out:
        if isinstance(entry, list):
            flat.extend(entry)
        else:
            flat.append(entry)
    return flat


# -- sizes seen in listings -------------------------------------------------------------------
SIZE_HINT_S = 60.0
"""How long a size seen in a listing or stat stands in for a HEAD request of its own."""
_size_hints: dict[str, tuple[int, float]] = {}
_size_hints_lock = threading.Lock()


def note_size(url: str, info: Mapping[str, Any]) -> None:
    """Remember the size a listing or stat of ``url`` reported (for :func:`size_hint`)."""
    size = info.get("size")
    if isinstance(size, int) and info.get("type") != "directory":
        with _size_hints_lock:
            if len(_size_hints) > 100_000:
                _size_hints.clear()
            _size_hints[url] = (size, time.monotonic())


def size_hint(url: str) -> int | None:
    """The size of ``url`` seen in a listing or stat in the last :data:`SIZE_HINT_S`
    seconds, used once (a reader then skips its own HEAD request); ``None`` otherwise."""
    with _size_hints_lock:
        hint = _size_hints.pop(url, None)
    if hint is None or time.monotonic() - hint[1] > SIZE_HINT_S:
        return None
    return hint[0]

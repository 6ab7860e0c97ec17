"""What the object cache needs to trust its entries: a folder nobody else can write into,
a pass's record of the entries it checked, and what storage says of them (one listing
page a folder per pass, a HEAD where listing is not allowed)."""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .counters import IOCounters
from .urls import mask, parse_url

if TYPE_CHECKING:
    from .cache import ObjectCache


logger = logging.getLogger("shardfeed.storage.cache")

LIST_PAGE = 1000
"""Keys a listing request asks for (S3's largest page)."""


class UnsafeCacheFolder(PermissionError):
    """The cache folder can be written by another user: its entries cannot be trusted."""


def check_folder(path: str, ours: bool) -> None:
    """Refuse ``path`` when another user can write into it: owned by someone else (for
    ``ours``, anyone but us; else anyone but us or root) or writable by everyone without
    the sticky bit."""
    st = os.stat(path)
    me = os.geteuid()
    owners = (me,) if ours else (me, 0)
    if st.st_uid not in owners:
        raise UnsafeCacheFolder(
            f"the cache folder {path} is owned by uid {st.st_uid}, not by this user (uid {me}): anyone who can write "
            "into it can plant entries that would be served as data; give cache_dir a folder of your own (or "
            f"`chown {me} {path}`)")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafeCacheFolder(
            f"the cache folder {path} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): anyone could "
            f"plant entries that would be served as data; `chmod o-w {path}` (or `chmod +t {path}`), or give "
            "cache_dir a folder of your own")


class CachePass:
    """One pass's view of an :class:`ObjectCache` (:meth:`ObjectCache.for_pass`): the
    same ``fetch`` and ``open_tee``, with each entry checked in full at its first use in
    the pass and trusted for the rest of it (while its size, time and inode stay)."""

    def __init__(self, cache: ObjectCache) -> None:
        self.cache = cache
        self._checked: dict[str, tuple] = {}
        self._lock = threading.Lock()
        self._listings: dict[tuple, _Listing] = {}
        self._heads: dict[str, tuple[int, str | None]] = {}

    def __reduce__(self):
        return CachePass, (self.cache,)  # a copy elsewhere is a pass of its own

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def checked(self, key: str, stamp: tuple) -> bool:
        """Whether entry ``key`` (as ``stamp`` says: size, time, inode) was checked in this pass."""
        with self._lock:
            return self._checked.get(key) == stamp

    def mark(self, key: str, stamp: tuple) -> None:
        with self._lock:
            self._checked[key] = stamp

    def remote_info(self, url: str, storage_options: Mapping[str, Any] | None,
                    counters: IOCounters | None) -> tuple[int, str | None]:
        """``(size, etag)`` of ``url`` in storage, from this pass's listing of its folder
        (one request per folder and 1000 keys, shared by every object of the pass), or from
        a HEAD where the store cannot be listed (not S3, or the listing is denied). Raises
        ``FileNotFoundError`` for an object the listing does not hold."""
        from .io import _remote_info  # noqa: PLC0415 - io imports the cache's users

        parsed = parse_url(url)
        if parsed.protocol in ("s3", "oss"):
            from .fs import _freeze, get_filesystem  # noqa: PLC0415

            fs, path = get_filesystem(parsed, storage_options)
            bucket, key = path.split("/", 1) if "/" in path else (path, "")
            prefix = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
            where = (parsed.protocol, parsed.query, _freeze(dict(storage_options or {})), bucket)
            if key and where not in self.cache._list_denied:
                with self._lock:
                    listing = self._listings.setdefault(where + (prefix,), _Listing(fs, bucket, prefix))
                try:
                    listed = listing.info(url, key, counters)
                    if listed is not None:
                        return listed
                except PermissionError as exc:
                    self.cache._list_denied.add(where)
                    logger.info("listing %s is not allowed (%s): each cached object is checked with a HEAD "
                                "request instead", mask(f"{parsed.protocol}://{bucket}/{prefix}"), exc)
        with self._lock:
            got = self._heads.get(url)
        if got is None:  # one HEAD an object a pass (its check, then its download if stale)
            got = _remote_info(url, storage_options, counters)
            with self._lock:
                self._heads[url] = got
        return got

    def fetch(self, url: str, storage_options: Mapping[str, Any] | None = None, counters: IOCounters | None = None,
              seen: set | None = None) -> str | None:
        """:meth:`ObjectCache.fetch` in this pass."""
        return self.cache.fetch(url, storage_options, counters, seen, scope=self)

    def open_tee(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 counters: IOCounters | None = None) -> tuple[str | None, Any]:
        """:meth:`ObjectCache.open_tee` in this pass."""
        return self.cache.open_tee(url, storage_options, counters, scope=self)

    def for_pass(self) -> "CachePass":
        return CachePass(self.cache)


class _Listing:
    """One pass's listing of one folder (S3 ListObjectsV2, no recursion): pages fetched
    as objects ask for keys no page covers yet, one at a time (the others wait for it and
    find their keys in it)."""

    def __init__(self, fs: Any, bucket: str, prefix: str) -> None:
        self.fs, self.bucket, self.prefix = fs, bucket, prefix
        self.lock = threading.Lock()
        self.found: dict[str, tuple[int, str | None]] = {}
        self.covered: list[tuple[str, str | None]] = []  # (after, last): keys in (after, last] (None: to the end)
        self.denied: PermissionError | None = None

    def _covers(self, key: str) -> bool:
        return any(after < key and (last is None or key <= last) for after, last in self.covered)

    def info(self, url: str, key: str, counters: IOCounters | None) -> tuple[int, str | None] | None:
        """``(size, etag)`` of ``key``; ``None`` when the listing cannot say (ask a HEAD)."""
        with self.lock:
            if self.denied is not None:  # the threads that waited for the one that was refused
                raise self.denied
            if not self._covers(key):
                # the first page from the folder's start (shards are read in name order);
                # later ones from just before the key asked for (key[:-1] sorts before it),
                # also right after the first when the key asked first lies past it (the
                # threads reading ahead do not ask in name order)
                if not self.covered:
                    self._page("", url, counters)
                if not self._covers(key):
                    self._page(key[:-1], url, counters)
                if not self._covers(key):
                    return None
            got = self.found.get(key)
        if got is None:
            raise FileNotFoundError(f"{mask(url)}: no such object in storage (the listing of its folder does not "
                                    "hold it): deleted or renamed since the dataset was listed or cached")
        return got

    def _page(self, after: str, url: str, counters: IOCounters | None) -> None:
        from .io import _run  # noqa: PLC0415 - io imports the cache's users

        kw = {"Bucket": self.bucket, "Prefix": self.prefix, "Delimiter": "/", "MaxKeys": LIST_PAGE}
        if after > self.prefix:
            kw["StartAfter"] = after

        def call() -> dict:
            return self.fs.call_s3("list_objects_v2", **kw)

        try:
            resp = _run("list", url, (lambda: counters.timed_stat(call)) if counters is not None else call, counters)
        except PermissionError as exc:
            self.denied = exc
            raise
        finally:
            if counters is not None:
                counters.add(stat_requests=1)
        keys = resp.get("Contents") or []
        for item in keys:
            etag = item.get("ETag")
            self.found[item["Key"]] = (int(item["Size"]), str(etag).strip('"') if etag else None)
        # a truncated page covers up to its last entry, a key or a subfolder (they come in order)
        names = [k["Key"] for k in keys[-1:]] + [c["Prefix"] for c in (resp.get("CommonPrefixes") or [])[-1:]]
        if resp.get("IsTruncated") and not names:
            return  # an empty page cut short (never seen): covers nothing, the object gets a HEAD
        self.covered.append((after or self.prefix, max(names) if resp.get("IsTruncated") else None))

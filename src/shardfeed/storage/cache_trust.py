"""What the object cache needs to trust its entries: a folder nobody else can write into,
and a pass's record of the entries it checked in full."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .counters import IOCounters

if TYPE_CHECKING:
    from .cache import ObjectCache


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

    def __reduce__(self):
        return CachePass, (self.cache,)  # a copy elsewhere is a pass of its own

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def checked(self, key: str, stamp: tuple) -> bool:
        with self._lock:
            return self._checked.get(key) == stamp

    def mark(self, key: str, stamp: tuple) -> None:
        with self._lock:
            self._checked[key] = stamp

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

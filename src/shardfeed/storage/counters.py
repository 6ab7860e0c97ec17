"""What reading from storage cost one pass: bytes fetched, GET requests, retries, cache hits.

A pass's reads share one :class:`IOCounters` (``iterator.stats().storage``); the
process-wide totals of retries stay in :func:`~shardfeed.storage.retry_stats`.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class IOCounters:
    """Counters of remote reads, safe to update from several threads.

    ``bytes_fetched`` and ``requests`` count what came over the network (ranged GETs, each
    attempt once); ``stat_requests`` the HEAD requests (an object's size and ETag);
    ``retries`` the attempts that failed and were tried again; ``cache_hits`` /
    ``cache_misses`` whole objects found in / downloaded to the local cache;
    ``cache_bypassed`` objects read past a full cache; ``bytes_from_cache`` what was read
    from it. ``mb_per_s`` is the fetch rate while at least one request was
    in flight.
    """

    FIELDS = ("bytes_fetched", "requests", "stat_requests", "retries", "cache_hits", "cache_misses", "cache_bypassed",
              "bytes_from_cache")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.requests = 0
        self.stat_requests = 0
        self.retries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_bypassed = 0
        self.bytes_from_cache = 0
        self.active_s = 0.0  # time with at least one request in flight
        self._in_flight = 0
        self._since = 0.0

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def request_started(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1

    def request_ended(self, nbytes: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self.requests += 1
            self.bytes_fetched += nbytes
            if self._in_flight == 0:
                self.active_s += time.perf_counter() - self._since

    @property
    def mb_per_s(self) -> float:
        with self._lock:
            active = self.active_s
            if self._in_flight:
                active += time.perf_counter() - self._since
        return self.bytes_fetched / active / 1e6 if active > 0 else 0.0

    def merge(self, other: "IOCounters") -> None:
        snap = other.to_dict()
        with self._lock:
            for name in self.FIELDS:
                setattr(self, name, getattr(self, name) + snap[name])
            self.active_s += other.active_s

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.FIELDS}
        out["mb_per_s"] = round(self.mb_per_s, 3)
        return out

    def __repr__(self) -> str:
        d = self.to_dict()
        return "IOCounters(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")"

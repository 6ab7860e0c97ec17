"""What reading from storage cost one pass: bytes fetched, GET requests, retries, cache hits.

A pass's reads share one :class:`IOCounters` (``iterator.stats().storage``); the
process-wide totals of retries stay in :func:`~shardfeed.storage.retry_stats`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

LATENCY_BOUNDS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the request latency histogram's buckets; one more bucket holds the rest."""


class IOCounters:
    """Counters of remote reads, safe to update from several threads.

    ``bytes_fetched`` and ``requests`` count what came over the network (ranged GETs, each
    attempt once); ``stat_requests`` the HEAD requests (an object's size and ETag) and listing pages;
    ``put_requests`` the objects written (index files saved beside their shards);
    ``retries`` the attempts that failed and were tried again; ``cache_hits`` /
    ``cache_misses`` whole objects found in / downloaded to the local cache;
    ``cache_bypassed`` objects read past a full cache; ``bytes_from_cache`` what was read
    from it. ``mb_per_s`` is the fetch rate while at least one request was
    in flight. ``latency`` is a histogram of how long each request (GET or HEAD, each
    attempt) took, in seconds: counts per bucket whose upper bounds are
    :data:`LATENCY_BOUNDS_S` (the last bucket unbounded), with ``latency_sum_s``;
    ``waiting_s`` is the time with at least one request of either kind in flight.
    ``fetch_threads`` is the most fetch threads the process had running while this pass
    made a request (they leave after half a second idle: ``storage.fetch.IDLE_EXIT_S``).
    """

    FIELDS = ("bytes_fetched", "requests", "stat_requests", "put_requests", "retries", "cache_hits", "cache_misses",
              "cache_bypassed", "bytes_from_cache")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.requests = 0
        self.stat_requests = 0
        self.put_requests = 0
        self.retries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_bypassed = 0
        self.bytes_from_cache = 0
        self.fetch_threads = 0
        self.active_s = 0.0  # time with at least one request in flight
        self._in_flight = 0
        self._since = 0.0
        self.latency = [0] * (len(LATENCY_BOUNDS_S) + 1)
        self.latency_sum_s = 0.0
        self.waiting_s = 0.0  # time with at least one GET or HEAD in flight
        self._any_in_flight = 0
        self._any_since = 0.0

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def note_threads(self, n: int) -> None:
        """The fetch threads running now (kept: the most seen)."""
        if n > self.fetch_threads:
            self.fetch_threads = n  # a racing smaller write only loses a peak by a thread

    def request_started(self) -> float:
        """A GET begins; returns its start time (``time.perf_counter()``) for :meth:`request_ended`."""
        with self._lock:
            now = time.perf_counter()
            if self._in_flight == 0:
                self._since = now
            self._in_flight += 1
            self._begin_wait(now)
        return now

    def request_ended(self, nbytes: int, started: float | None = None) -> None:
        """A GET that began at ``started`` (from :meth:`request_started`) ended with ``nbytes``."""
        with self._lock:
            now = time.perf_counter()
            self._in_flight -= 1
            self.requests += 1
            self.bytes_fetched += nbytes
            if self._in_flight == 0:
                self.active_s += now - self._since
            if started is not None:
                self._end_wait(now, now - started)

    def timed_stat(self, fn: Callable[[], T]) -> T:
        """Run one HEAD request ``fn()``, its latency counted (not its failure's)."""
        with self._lock:
            t = time.perf_counter()
            self._begin_wait(t)
        try:
            return fn()
        finally:
            with self._lock:
                now = time.perf_counter()
                self._end_wait(now, now - t)

    def _begin_wait(self, now: float) -> None:
        if self._any_in_flight == 0:
            self._any_since = now
        self._any_in_flight += 1

    def _end_wait(self, now: float, seconds: float) -> None:
        self._any_in_flight -= 1
        if self._any_in_flight == 0:
            self.waiting_s += now - self._any_since
        self.latency[bisect_left(LATENCY_BOUNDS_S, seconds)] += 1
        self.latency_sum_s += seconds

    @property
    def latency_count(self) -> int:
        """Requests (GET and HEAD attempts) whose latency was measured."""
        return sum(self.latency)

    def latency_quantile(self, q: float) -> float | None:
        """The upper bound of the latency bucket holding quantile ``q`` (0..1) of the
        requests, in seconds (``math.inf`` past the last bound); ``None`` before any."""
        counts = list(self.latency)
        total = sum(counts)
        if not total:
            return None
        rank, acc = q * total, 0
        for i, c in enumerate(counts):
            acc += c
            if acc >= rank and c:
                return LATENCY_BOUNDS_S[i] if i < len(LATENCY_BOUNDS_S) else float("inf")
        return float("inf")

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
            self.waiting_s += other.waiting_s
            self.fetch_threads = max(self.fetch_threads, other.fetch_threads)
            self.latency_sum_s += other.latency_sum_s
            self.latency = [a + b for a, b in zip(self.latency, other.latency)]

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.FIELDS}
        out["fetch_threads"] = self.fetch_threads
        out["mb_per_s"] = round(self.mb_per_s, 3)
        out["waiting_s"] = round(self.waiting_s, 6)
        out["latency"] = {"bounds_s": list(LATENCY_BOUNDS_S), "counts": list(self.latency),
                          "sum_s": round(self.latency_sum_s, 6)}
        return out

    def __repr__(self) -> str:
        d = self.to_dict()
        return "IOCounters(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")"

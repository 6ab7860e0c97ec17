"""Parallel ranged reads of remote objects, with the concurrency chosen from the link.

One connection to an object store gives tens of MB/s with tens of milliseconds per
request; a reader that fetches one range at a time leaves most of the link idle. A
:class:`RangeStream` reads one object (or a byte range of it) in order, but keeps several
ranged GETs of it in flight; several streams (several objects read ahead) share one
process-wide pool, whose number of requests in flight is chosen from what the requests so
far measured: the per-request latency ``L`` and the per-connection rate ``r``. A part of
``P`` bytes takes ``L + P/r``; keeping ``n`` in flight gives ``n * P / (L + P/r)``, so
``n`` is what reaches :data:`TARGET_BYTES_PER_S`, capped by ``max_concurrency`` (a
storage option; default :data:`MAX_CONCURRENCY`) and by the bytes that may be fetched
ahead of the reader (:data:`READ_AHEAD_BYTES`).

Every request and every retry is counted in the :class:`~.counters.IOCounters` given.
"""

from __future__ import annotations

import collections
import heapq
import io
import math
import os
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from ..errors import StorageError
from .counters import IOCounters
from .urls import endpoint_option, mask, parse_url

FIRST_PART = 256 << 10
"""The first range of a stream a reader waits on is small (its records arrive after one
round trip); its next ranges double in size up to the link's part, so that the bytes just
behind it (the rest of a first batch) also come after a short transfer."""
FIRST_WINDOW = 4
"""Requests in flight at most until an endpoint has answered one: the first ranges of the
object the reader waits on (a small one and the doubling ones behind it) go out alone,
before the read-ahead of the objects behind it; the plan's concurrency after that answer."""
MIN_PART = 1 << 20
MAX_PART = 8 << 20
TAIL_FRACTION = 8
"""A range whose last part would be at most 1/8 of a part is fetched with the part
before it (a shuffled block of a part and a record is one GET, not two)."""
MAX_CONCURRENCY = 64
"""Requests in flight per process at most, unless ``storage_options['max_concurrency']``."""
TARGET_BYTES_PER_S = 4e9
"""The rate the chosen concurrency aims at (the pool stops there or at the cap)."""
def _ahead_bytes() -> int:
    text = os.environ.get("SHARDFEED_FETCH_AHEAD_BYTES")
    if not text:
        return 256 << 20
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"SHARDFEED_FETCH_AHEAD_BYTES must be a number of bytes, got {text!r}") from None
    return max(n, 16 << 20)


READ_AHEAD_BYTES = _ahead_bytes()
"""Bytes fetched ahead of the readers, all streams together (one part per stream is
always allowed, so a reader never waits on the others)."""
_DEFAULT_LATENCY = 0.02
_DEFAULT_RATE = 50e6


class Link:
    """Measurements of one endpoint: ``(bytes, seconds)`` of recent requests, and the
    part size and concurrency they call for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: collections.deque = collections.deque(maxlen=256)
        self._plan: dict[int, tuple[float, tuple[int, int]]] = {}
        self._answered = False  # whether a request was answered (FIRST_WINDOW before)

    def record(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._samples.append((nbytes, max(seconds, 1e-6)))
            self._answered = True

    def estimate(self) -> tuple[float, float]:
        """``(latency_s, bytes_per_s)`` per request and connection: latency from the
        fastest small requests, the rate from the large ones less that latency."""
        with self._lock:
            samples = list(self._samples)
        small = sorted(s for n, s in samples if n <= FIRST_PART)
        latency = small[len(small) // 4] if small else _DEFAULT_LATENCY
        rates = sorted(n / max(s - latency, s * 0.05) for n, s in samples if n >= MIN_PART)
        rate = rates[len(rates) // 2] if rates else _DEFAULT_RATE
        return latency, rate

    def plan(self, cap: int = MAX_CONCURRENCY) -> tuple[int, int]:
        """``(part_size, concurrency)`` for this link: parts that take several round trips
        to transfer (so the latency is a small share), and enough of them in flight.
        Recomputed at most every 50 ms; the concurrency is held to :data:`FIRST_WINDOW`
        until a request was answered (the first ranges must not share a new link with the
        whole read-ahead)."""
        now = time.monotonic()
        cached = self._plan.get(cap)
        if cached is not None and now - cached[0] < 0.05:
            out = cached[1]
        else:
            out = self._compute_plan(cap)
            self._plan[cap] = (now, out)
        return out if self._answered else (out[0], min(out[1], FIRST_WINDOW))

    def _compute_plan(self, cap: int) -> tuple[int, int]:
        latency, rate = self.estimate()
        # parts that take several round trips to transfer (fewer, larger requests cost the
        # store and this process less per byte), but small enough that the read-ahead
        # budget holds as many in flight as the cap allows: parts fetched ahead of a slow
        # reader hold budget too
        part = int(min(MAX_PART, READ_AHEAD_BYTES // MAX_CONCURRENCY, max(MIN_PART, rate * latency * 8)))
        part = 1 << (part.bit_length() - 1)  # a power of two: ranges line up
        per_request = part / (latency + part / rate)
        n = math.ceil(TARGET_BYTES_PER_S / per_request)
        n = min(n, cap, max(2, READ_AHEAD_BYTES // part))
        return part, max(2, n)

    def summary(self) -> dict:
        latency, rate = self.estimate()
        part, n = self.plan()
        return {"latency_ms": round(latency * 1e3, 2), "conn_mb_per_s": round(rate / 1e6, 2),
                "part_bytes": part, "concurrency": n, "samples": len(self._samples)}


_links: dict[tuple, Link] = {}
_links_lock = threading.Lock()


def link_for(url: str, storage_options: Mapping[str, Any] | None) -> Link:
    """The measurements of the endpoint serving ``url``."""
    parsed = parse_url(url)
    endpoint = endpoint_option(storage_options)
    if parsed.protocol in ("http", "https"):
        host = parsed.path.split("://", 1)[-1].split("/", 1)[0]
    else:
        host = parsed.path.split("/", 1)[0]
    key = (parsed.protocol, endpoint, dict(parsed.query).get("endpoint", ""), host)
    with _links_lock:
        link = _links.get(key)
        if link is None:
            link = _links[key] = Link()
        return link


IDLE_EXIT_S = 0.5
"""A fetch thread with nothing to do for this long leaves: a pass closed early, or a reader
gone idle, leaves no thread behind a second later, and the next pass starts new ones (a
thread starts in about 0.1 ms, against a request's milliseconds)."""


class _Threads:
    """Daemon worker threads that start when work waits and leave after :data:`IDLE_EXIT_S`
    idle, at most ``max_workers``. ``submit(fn, *args)`` returns a ``Future``. Unlike a
    ``ThreadPoolExecutor`` nothing is joined, at a pass's close or at exit: a thread still
    in a request finishes it (its result is dropped by the stream that closed) and goes."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # workers wait on it for requests
        self.spawn = threading.Condition(self.lock)  # the starter waits on it for threads to start
        self.queue: collections.deque = collections.deque()
        self.alive = 0
        self.idle = 0
        self.starting = 0  # threads asked for and not yet at work
        self.want = 0  # of them, not yet started by the starter
        self.starter = False  # whether the starter thread is alive
        self._n = 0

    def submit(self, fn, *args) -> Future:
        """Queue ``fn(*args)``. A thread it needs is started by the pool's starter thread,
        never by the caller: ``Thread.start()`` waits for the new thread to run (a GIL switch
        each under load), and a burst of requests (the read-ahead opening up when the first
        answer came) made the reader holding the first batch start 44 threads, 0.25 s."""
        fut: Future = Future()
        start_starter = False
        with self.lock:
            self.queue.append((fut, fn, args))
            if len(self.queue) > self.idle + self.starting and self.alive < self.max_workers:
                self.alive += 1
                self.starting += 1
                self.want += 1
                if self.starter:
                    self.spawn.notify()
                else:
                    self.starter = start_starter = True
            else:
                self.cond.notify()
        if start_starter:
            threading.Thread(target=self._start_threads, name=f"{self.name}-starter", daemon=True).start()
        return fut

    def _start_threads(self) -> None:
        while True:
            with self.lock:
                while not self.want:
                    if not self.spawn.wait(IDLE_EXIT_S) and not self.want:
                        self.starter = False
                        return
                self.want -= 1
                self._n += 1
                name = f"{self.name}_{self._n}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        with self.lock:
            self.starting -= 1
        while True:
            with self.cond:
                while not self.queue:
                    self.idle += 1
                    woke = self.cond.wait(IDLE_EXIT_S)
                    self.idle -= 1
                    if not woke and not self.queue:
                        self.alive -= 1
                        return
                fut, fn, args = self.queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the future's owner
                fut.set_exception(exc)
            else:
                fut.set_result(result)


class _Pool:
    """The process's fetch threads and its gate on requests in flight.

    Requests wait in a queue ordered by (stream, offset): streams are numbered as they
    open and readers consume them in that order, so when only ``limit`` requests may be
    in flight, the ones the reader needs first go first, never behind ranges of objects
    far ahead. A request whose stream was closed before its turn is dropped."""

    def __init__(self) -> None:
        # a thread a request in flight at most (the gate below), plus the odd size request
        self.executor = _Threads(MAX_CONCURRENCY + 8, "shardfeed-fetch")
        self.cond = threading.Condition()
        self.in_flight = 0
        self.limit = 2
        self.ahead_bytes = 0  # fetched or in flight, not yet taken by a reader
        self.streams: dict[int, Any] = {}  # open streams (weak references), oldest first
        self.reserved: dict[int, int] = {}  # bytes each stream has in flight or fetched
        self._next_id = 0
        self._waiting: list = []  # heap of (key, seq, future, fn)
        self._seq = 0

    def run(self, fn, key: tuple = ()) -> Future:
        return self.run_many([(fn, key)])[0]

    def run_many(self, calls: list) -> list[Future]:
        """``run`` for each ``(fn, key)``, queued together before any is dispatched (a
        stream's ranges are ordered among themselves, not behind another stream's)."""
        futs: list[Future] = []
        with self.cond:
            for fn, key in calls:
                fut: Future = Future()
                self._seq += 1
                heapq.heappush(self._waiting, (key, self._seq, fut, fn))
                futs.append(fut)
        self._dispatch()
        return futs

    def _dispatch(self) -> None:
        start = []
        with self.cond:
            while self._waiting and self.in_flight < self.limit:
                _, _, fut, fn = heapq.heappop(self._waiting)
                if not fut.set_running_or_notify_cancel():
                    continue  # its stream was closed
                self.in_flight += 1
                start.append((fut, fn))
        for fut, fn in start:
            self.executor.submit(self._run, fut, fn)

    def _run(self, fut: Future, fn) -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            fut.set_exception(exc)
        else:
            fut.set_result(result)
        finally:
            with self.cond:
                self.in_flight -= 1
            self._dispatch()

    def set_limit(self, n: int) -> None:
        with self.cond:
            grew = n > self.limit
            self.limit = n
        if grew:
            self._dispatch()

    def register(self, stream: "RangeStream") -> int:
        """Give ``stream`` its id (set on it before any other thread can see it) and let
        wake() reach it; call it once the stream is otherwise built."""
        with self.cond:
            self._next_id += 1
            stream.sid = self._next_id
            self.streams[self._next_id] = weakref.ref(stream)
            self.reserved[self._next_id] = 0
            return self._next_id

    def is_oldest(self, sid: int) -> bool:
        """Whether stream ``sid`` is the oldest open one: the one a reader takes bytes from
        next (streams opened after it are read ahead)."""
        with self.cond:
            return next(iter(self.streams), None) == sid

    def unregister(self, sid: int) -> None:
        with self.cond:
            self.streams.pop(sid, None)
            left = self.reserved.pop(sid, 0)
        if left == 0:
            self.wake()

    def reserve(self, nbytes: int, force: bool, sid: int) -> bool:
        """Count ``nbytes`` more fetched ahead for stream ``sid``; false when the bytes
        reserved by it and every older stream would pass the budget, unless ``force``d or
        asked by the oldest open stream. Readers consume streams in the order they opened,
        so the budget goes to the nearest objects whole, not to the first ranges of many
        objects far ahead."""
        with self.cond:
            oldest = next(iter(self.streams), None) == sid
            if not force and not oldest:
                older = sum(r for k, r in self.reserved.items() if k <= sid)
                if older + nbytes > READ_AHEAD_BYTES:
                    return False
            self.ahead_bytes += nbytes
            if sid in self.reserved:
                self.reserved[sid] += nbytes
            return True

    def release(self, nbytes: int, sid: int) -> None:
        with self.cond:
            self.ahead_bytes -= nbytes
            if sid in self.reserved:
                self.reserved[sid] -= nbytes
        self.wake()

    def wake(self) -> None:
        """Room was given back: let the oldest streams ask for more, in order, without
        waiting for their readers to come back (a reader blocked on its own full queue
        would otherwise leave its object unfetched until it is read)."""
        with self.cond:
            refs = list(self.streams.values())
        for ref in refs:
            stream = ref()
            if stream is not None and not stream.top_up_from_pool():
                break


_pool: _Pool | None = None
_pool_pid = -1
_pool_lock = threading.Lock()


def _the_pool() -> _Pool:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child starts its own
            _pool, _pool_pid = _Pool(), os.getpid()
        return _pool


def _cap_of(storage_options: Mapping[str, Any] | None) -> int:
    cap = (storage_options or {}).get("max_concurrency")
    if cap is None:
        return MAX_CONCURRENCY
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"storage_options['max_concurrency'] must be an int >= 1, got {cap!r}")
    return min(cap, MAX_CONCURRENCY)


# -- direct ranged GETs ---------------------------------------------------------------------------
PRESIGN_TTL_S = 3600
_PRESIGN_REUSE_S = 600.0  # a presigned URL is reused this long, well inside its validity

_tls = threading.local()


class HTTPStatusError(OSError):
    """A ranged GET answered with an error status (``status``: the HTTP status)."""

    def __init__(self, status: int, reason: str, body: bytes = b"") -> None:
        code = ""
        if b"<Code>" in body:
            code = body.split(b"<Code>", 1)[1].split(b"</Code>", 1)[0].decode("ascii", "replace")
        super().__init__(f"HTTP {status} {reason}" + (f" ({code})" if code else ""))
        self.status = status
        self.code = code


class DirectGet:
    """Ranged GETs of one object with the standard library's HTTP client on a persistent
    connection per thread, read straight into a buffer: a fraction of the CPU an async S3
    client spends per request, which on a small machine is the difference between filling
    the link and not. S3 and OSS objects are reached through a presigned URL made by the
    filesystem's own client (its credentials, endpoint and addressing style); ``http(s)``
    URLs as they are. :meth:`of` returns ``None`` where the filesystem's client must do
    the request itself (custom TLS settings, proxies, requester-pays, other stores)."""

    def __init__(self, fs: Any, path: str, url: str, connect_timeout: float, read_timeout: float) -> None:
        self.fs, self.path, self.url = fs, path, url
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._signed: tuple[str, float] | None = None
        self._lock = threading.Lock()
        # the version being read: the ETag of the first answer, asked for again by every later
        # range (If-Match), and the object's size as listed or first answered, checked against
        # each answer's Content-Range. Ranges of one object never come from two versions.
        self.etag: str | None = None
        self.size: int | None = None

    @classmethod
    def of(cls, fs: Any, path: str, url: str, storage_options: Mapping[str, Any] | None) -> "DirectGet | None":
        so = dict(storage_options or {})
        if so.pop("direct_get", True) is False:
            return None
        from .fs import _pop_timeouts  # noqa: PLC0415

        connect, read = _pop_timeouts(so)
        protocol = parse_url(url).protocol
        # plain http(s) URLs keep fsspec's client (redirects, credentials in the URL, quoting)
        if protocol not in ("s3", "oss") or not hasattr(fs, "split_path"):
            return None
        client = dict(so.get("client_kwargs") or {})
        config = dict(so.get("config_kwargs") or {})
        if "verify" in client or "proxies" in config or so.get("requester_pays") or so.get("version_aware") \
                or so.get("anon") or so.get("s3_additional_kwargs"):
            return None
        if _proxied(getattr(fs, "client_kwargs", {}).get("endpoint_url") or client.get("endpoint_url")):
            return None  # a proxy from the environment: botocore honours it, http.client would not
        return cls(fs, path, url, connect, read)

    def target(self) -> str:
        with self._lock:
            if self._signed is not None and time.monotonic() - self._signed[1] < _PRESIGN_REUSE_S:
                return self._signed[0]
        from fsspec.asyn import sync  # noqa: PLC0415

        bucket, key, version = self.fs.split_path(self.path)
        params = {"Bucket": bucket, "Key": key, **({"VersionId": version} if version else {})}

        async def sign() -> str:
            client = await self.fs.set_session()
            return await client.generate_presigned_url("get_object", Params=params, ExpiresIn=PRESIGN_TTL_S)

        signed = sync(self.fs.loop, sign)
        with self._lock:
            self._signed = (signed, time.monotonic())
        return signed

    def forget_signature(self) -> None:
        with self._lock:
            self._signed = None

    def _changed(self, why: str) -> StorageError:
        return _changed_error(self.url, why)

    def _same_version(self, etag: str | None, total: int | None, conn: Any) -> None:
        """Pin the first answer's version, and raise when an answer is of another (an ETag,
        or a size, other than the pinned one: a store that ignores If-Match says so too)."""
        with self._lock:
            if self.etag is None and etag:
                self.etag = etag
            if self.size is None and total is not None:
                self.size = total
            pinned, size = self.etag, self.size
        if etag and pinned is not None and etag != pinned:
            conn.close()
            raise self._changed(f"ETag {etag}, where its first bytes came from ETag {pinned}")
        if total is not None and size is not None and total != size:
            conn.close()
            raise self._changed(f"{total} bytes now, {size} when this pass listed or first read it")

    def get(self, a: int, b: int, counters: IOCounters, on_total: Any = None) -> bytearray:
        """Bytes ``[a, b)``: fewer when the object ends first, none past its end.
        ``on_total(size)`` is called with the object's size when the answer tells it
        (``Content-Range: bytes a-b/size``, or a whole object's ``Content-Length``)."""
        import http.client  # noqa: PLC0415
        import urllib.parse  # noqa: PLC0415

        u = urllib.parse.urlsplit(self.target())
        conns = getattr(_tls, "conns", None)
        if conns is None:
            conns = _tls.conns = {}
        key = (u.scheme, u.netloc, self.connect_timeout, self.read_timeout)
        conn = conns.pop(key, None)
        if conn is None:
            if u.scheme == "https":
                conn = http.client.HTTPSConnection(u.netloc, timeout=self.connect_timeout, context=_tls_context())
            else:
                conn = http.client.HTTPConnection(u.netloc, timeout=self.connect_timeout)
        buf = bytearray(b - a)
        n = 0
        started = counters.request_started()
        try:
            if conn.sock is None:
                conn.connect()
                conn.sock.settimeout(self.read_timeout)
            headers = {"Range": f"bytes={a}-{b - 1}"}
            pinned = self.etag
            if pinned is not None:
                headers["If-Match"] = pinned
            conn.request("GET", u.path + (f"?{u.query}" if u.query else ""), headers=headers)
            resp = conn.getresponse()
            total = _total_size(resp, a)
            if resp.status == 412 and pinned is not None:
                conn.close()
                raise self._changed(f"HTTP 412: it is no longer the version of ETag {pinned} whose first bytes "
                                    "this pass read")
            if resp.status in (200, 206):
                self._same_version(resp.getheader("ETag"), total, conn)
            if on_total is not None and total is not None:
                on_total(total)
            if resp.status not in (200, 206):
                body = resp.read(4096)
                conn.close()
                if resp.status == 416:
                    return bytearray()
                if resp.status == 403 and parse_url(self.url).protocol != "http":
                    self.forget_signature()  # an expired signature is signed afresh next time
                raise _status_error(resp.status, resp.reason, body, self.url)
            if resp.status == 200 and a > 0:
                conn.close()
                raise OSError(f"{mask(self.url)}: the server ignored the Range header (HTTP 200 for bytes {a}-{b - 1})")
            with memoryview(buf) as view:
                while n < len(buf):
                    k = resp.readinto(view[n:])
                    if not k:
                        break
                    n += k
            length = resp.getheader("Content-Length") or ""
            if n < len(buf) and length.isdigit() and n < int(length):
                # the body ended before the bytes its header promised (the connection closed
                # early): a transport fault, retried like a reset, not an object that changed
                conn.close()
                raise http.client.IncompleteRead(b"", min(int(length), len(buf)) - n)
            if resp.status == 206 and not resp.will_close:
                resp.read()  # nothing is left of a 206: the connection can serve the next range
                conns[key] = conn
            else:
                conn.close()  # a 200 may go on past the range: never read the rest of an object
        except BaseException:
            conn.close()
            raise
        finally:
            counters.request_ended(n, started)
        if n < len(buf):
            del buf[n:]
        return buf


def _changed_error(url: str, why: str) -> StorageError:
    err = StorageError(f"{mask(url)}: the object changed while it was read ({why}); read it again (a new "
                       "pass) once it is written, and write objects under new names rather than over ones "
                       "being read", url=mask(url))
    err.status = 412  # type: ignore[attr-defined]  # a failed precondition: never retried
    return err


def _total_size(resp: Any, start: int) -> int | None:
    """The object's size as an HTTP answer to a ranged GET from ``start`` tells it:
    ``Content-Range: bytes a-b/size`` (206), ``bytes */size`` (416), or the length of a
    whole object sent as a 200 from byte 0; None when it does not."""
    text = resp.getheader("Content-Range") or ""
    if "/" in text:
        tail = text.rsplit("/", 1)[1].strip()
        return int(tail) if tail.isdigit() else None
    if resp.status == 200 and start == 0:
        length = resp.getheader("Content-Length") or ""
        return int(length) if length.isdigit() else None
    return None


def _tls_context() -> Any:
    """TLS settings as botocore takes them: ``AWS_CA_BUNDLE`` when set, else the system's."""
    import ssl  # noqa: PLC0415

    return ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)


def _proxied(endpoint: str | None) -> bool:
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    if not endpoint:
        return bool(urllib.request.getproxies().get("https"))
    u = urllib.parse.urlsplit(endpoint)
    proxies = urllib.request.getproxies()
    return bool(proxies.get(u.scheme)) and not urllib.request.proxy_bypass(u.hostname or "")


def _status_error(status: int, reason: str, body: bytes, url: str) -> OSError:
    err = HTTPStatusError(status, reason, body)
    if status == 404:
        return FileNotFoundError(f"{mask(url)}: no such object (HTTP 404)")
    if status in (401, 403):
        e = PermissionError(f"{mask(url)}: access denied (HTTP {status}{', ' + err.code if err.code else ''})")
        e.status = status  # type: ignore[attr-defined]
        return e
    return err


class RangeStream(io.RawIOBase):
    """Bytes ``[start, end)`` of a remote object, read in order, fetched ahead as parallel
    ranged GETs (``end=None``: to the end of the object, whose size is asked for in the
    same round trip as the first range). ``read(n)`` returns at most ``n`` bytes, fewer at
    a part's end, and ``b""`` at the end; with ``zero_copy`` a fetched range (a
    ``bytearray``) or a ``memoryview`` of one instead of a copy as ``bytes``; with
    ``small_first=False`` the first range is a whole part (the caller reads it all at
    once: a range of a part or less is one GET)."""

    def __init__(self, url: str, start: int = 0, end: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, counters: IOCounters | None = None,
                 size: int | None = None, zero_copy: bool = False, small_first: bool = True) -> None:
        super().__init__()
        self.zero_copy = zero_copy
        from .fs import get_filesystem  # noqa: PLC0415 - fs imports the optional drivers

        self.url = url
        self.counters = counters if counters is not None else IOCounters()
        self.cap = _cap_of(storage_options)
        self.fs, self.path = get_filesystem(url, storage_options)
        self.direct = DirectGet.of(self.fs, self.path, url, storage_options)
        self.link = link_for(url, storage_options)
        self.pool = _the_pool()
        self._lock = threading.RLock()
        self.start = start
        self.pos = start  # next byte to hand out
        self.next = start  # next byte to ask for
        self.end = end
        self.size_future: Future | None = None
        if end is None:
            if size is None:
                from .io import size_hint  # noqa: PLC0415

                size = size_hint(url)  # seen in the listing a moment ago: no HEAD of its own
            if size is not None:
                self.end = size
                if self.direct is not None:
                    self.direct.size = size
            elif self.direct is not None:
                # the first ranged GET's answer tells the size (Content-Range): no HEAD
                self.size_future = Future()
            else:
                self.size_future = self.pool.executor.submit(self._stat)
        self.pending: collections.deque = collections.deque()  # (start, end, future)
        self.buf = b""
        self.buf_pos = 0
        # the first range small (records after one round trip), the next ones doubling up
        # to a part, unless the caller wants the whole range before it uses any of it (a
        # global shuffle's coalesced records); 0 once the ranges are whole parts
        self.ramp = FIRST_PART if small_first else 0
        # registered last: from here another thread's wake() may call _top_up on this stream
        self.pool.register(self)

    # -- requests --------------------------------------------------------------------------
    def _stat(self) -> int:
        from .io import _listed, _run  # noqa: PLC0415 - io imports this module

        info = _listed(self.fs, self.path)  # in a listing of this build: no request to count
        if info is None:
            info = _run("stat", self.url, lambda: self.counters.timed_stat(lambda: self.fs.info(self.path)),
                        self.counters)
            self.counters.add(stat_requests=1)
        return int(info["size"])

    def _get(self, a: int, b: int, speculative: bool = False) -> Any:
        """Bytes ``[a, b)``; a ``speculative`` range (asked before the size was known) may
        come back short, or empty past the end."""
        from .io import _http_status, _run  # noqa: PLC0415

        # the direct GET's answer tells the size (a stream without one made its size future
        # for this); otherwise a HEAD already runs beside this range
        learn = (speculative and self.direct is not None and self.size_future is not None
                 and not self.size_future.done())

        def attempt() -> Any:
            t = time.perf_counter()
            self.counters.note_threads(self.pool.executor.alive)
            if self.direct is not None:
                data = self.direct.get(a, b, self.counters, self._size_known if learn else None)
            else:
                started = self.counters.request_started()
                data = b""
                try:
                    data = self.fs.cat_file(self.path, start=a, end=b)
                except OSError as exc:
                    if speculative and (_http_status(exc) == 416 or "not satisfiable" in str(exc)):
                        return b""  # the object ends before the range: it is empty
                    raise
                finally:
                    self.counters.request_ended(len(data), started)
            self.link.record(len(data), time.perf_counter() - t)
            return data

        try:
            # a range read ahead of a pass that ended (an error, a close) is not tried again: it
            # retried on into the next passes against a store that was gone (found by the suite)
            data = _run("read", self.url, attempt, self.counters, stop=lambda: self.closed)
        except BaseException as exc:
            if learn and not self.size_future.done():
                self.size_future.set_exception(exc)  # nobody waits on a size that never comes
            raise
        if learn and not self.size_future.done():  # the answer did not say: ask
            try:
                self._size_known(self._stat())
            except BaseException as exc:
                self.size_future.set_exception(exc)
                raise
        if len(data) != b - a and not (speculative and len(data) < b - a):
            raise StorageError(f"{mask(self.url)}: short read at byte offset {a}: asked for {b - a} bytes, got "
                               f"{len(data)} (the object changed while it was read?)", url=mask(self.url))
        return data

    def _size_known(self, size: int) -> None:
        fut = self.size_future
        if fut is not None and not fut.done():
            try:
                fut.set_result(int(size))
            except Exception:  # noqa: BLE001 - set by another attempt a moment ago
                pass

    def _known_end(self) -> int | None:
        if self.end is None and self.size_future is not None and self.size_future.done():
            self.end = self.size_future.result()
        return self.end

    def _top_up(self) -> bool:
        """Ask for more ranges, up to the plan's width and the budget; false when the
        budget refused one (the streams behind this one need not try)."""
        with self._lock:
            if self.closed:
                return True
            part, n = self.link.plan(self.cap)
            self.pool.set_limit(n)
            end = self._known_end()
            calls: list = []  # queued together at the end: one stream's ranges in order
            try:
                return self._plan_ranges(part, n, end, calls)
            finally:
                if calls:
                    futs = self.pool.run_many([(fn, key) for _, _, fn, key in calls])
                    self.pending.extend((a, b, fut) for (a, b, _, _), fut in zip(calls, futs))

    def _plan_ranges(self, part: int, n: int, end: int | None, calls: list) -> bool:
        """The ranges to ask for now, appended to ``calls`` as ``(a, b, fn, key)``; see
        :meth:`_top_up`."""
        while len(self.pending) + len(calls) < n:
            if end is not None and self.next >= end:
                return True
            if end is None and self.next != self.start:
                return True  # the size is not known yet: only the first range goes out before it
            if self.ramp and self.ramp < part and (end is None or self.pool.is_oldest(self.sid)):
                # small, then doubling: the reader waits for these now (or the size is
                # not known yet); a stream opened ahead of its reader asks for whole
                # parts from the start, which halves the requests for spans of a part or
                # less (shuffled blocks)
                size = self.ramp
            elif end is None:
                return True  # whole parts need the size
            else:
                size = part
            b = self.next + size if end is None else min(end, self.next + size)
            if end is not None and end - b <= size // TAIL_FRACTION:
                b = end  # a short tail rides with this range: one round trip, not two
            if not self.pool.reserve(b - self.next, force=not self.pending and not calls, sid=self.sid):
                return False
            spec = end is None
            calls.append((self.next, b, lambda a=self.next, b=b, s=spec: self._get(a, b, s), (self.sid, self.next)))
            self.next = b
            self.ramp = self.ramp * 2 if size == self.ramp else 0
        return True

    def top_up_from_pool(self) -> bool:
        """:meth:`_top_up` from another thread, skipped while the reader is at it."""
        if not self._lock.acquire(blocking=False):
            return True
        self._lock.release()
        return self._top_up()

    def _next_part(self) -> bool:
        self._top_up()
        if not self.pending:
            if self.end is None and self.size_future is not None:
                self.end = self.size_future.result()
                self._top_up()
            if not self.pending:
                return False
        with self._lock:
            a, b, fut = self.pending.popleft()
        try:
            data = fut.result()
        finally:
            self.pool.release(b - a, self.sid)
        if self.end is None and self.size_future is not None:
            self.end = self.size_future.result()
        if self.end is not None and b > self.end:
            data = data[: max(0, self.end - a)]  # the first range may run past a small object
        self.buf, self.buf_pos = data, 0
        self._top_up()
        return bool(data)

    # -- io --------------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def _take(self, n: int) -> Any:
        """Up to ``n`` bytes as they were fetched: a whole range, or a view into one."""
        if self.closed:
            raise ValueError("read from a closed RangeStream")
        if self.buf_pos >= len(self.buf):
            if self.end is not None and self.pos >= self.end:
                return b""
            if not self._next_part():
                return b""
        take = min(n, len(self.buf) - self.buf_pos)
        if self.buf_pos == 0 and take == len(self.buf):
            out = self.buf
        else:
            out = memoryview(self.buf)[self.buf_pos:self.buf_pos + take]
        self.buf_pos += take
        self.pos += take
        return out

    def read(self, n: int = -1) -> Any:
        if n is None or n < 0:
            return self.readall()
        out = self._take(n)
        return out if self.zero_copy or isinstance(out, bytes) else bytes(out)

    def readinto(self, b) -> int:
        data = self._take(len(b))
        b[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        parts = []
        while len(chunk := self._take(1 << 62)):
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            with self._lock:
                super().close()
                pending, self.pending = list(self.pending), collections.deque()
            for a, b, fut in pending:
                if not fut.cancel():  # running: its bytes are given back when it ends
                    fut.add_done_callback(lambda _f, n=b - a, sid=self.sid: self.pool.release(n, sid))
                else:
                    self.pool.release(b - a, self.sid)
            self.pool.unregister(self.sid)
            self.buf = b""
        super().close()


def probe(url: str, storage_options: Mapping[str, Any] | None = None, small_requests: int = 8,
          large_bytes: int = 32 << 20, parallel_bytes: int = 256 << 20) -> dict:
    """Measure the link to the object at ``url``: per-request latency (the median of
    ``small_requests`` 4 KiB GETs), one connection's rate (one GET of up to
    ``large_bytes``), the part size and concurrency shardfeed would pick from those, and
    the rate it reaches reading up to ``parallel_bytes`` of the object with them."""
    from .io import _remote_info  # noqa: PLC0415

    counters = IOCounters()
    so = dict(storage_options or {})
    size, _ = _remote_info(url, so, counters)
    if size == 0:
        raise ValueError(f"{mask(url)}: the object is empty; probe with an object of a few MB or more")
    stream = RangeStream(url, 0, size, so, counters, size=size)
    link = Link()  # measured afresh, not mixed with earlier reads
    stream.link = link
    lat = []
    for i in range(small_requests):
        a = (i * 4096) % max(1, size - 4096)
        t = time.perf_counter()
        stream._get(a, min(size, a + 4096))
        lat.append(time.perf_counter() - t)
    lat.sort()
    latency = lat[len(lat) // 2]
    n = min(size, large_bytes)
    t = time.perf_counter()
    stream._get(0, n)
    one = time.perf_counter() - t
    conn_rate = n / max(one - latency, one * 0.05)
    part, concurrency = link.plan(_cap_of(so))
    stream.close()
    total = min(size, parallel_bytes)
    t = time.perf_counter()
    with RangeStream(url, 0, total, so, counters, size=size) as s:
        while s.read():
            pass
    par = time.perf_counter() - t
    return {"url": mask(url), "object_bytes": size, "latency_ms": round(latency * 1e3, 2),
            "one_connection_mb_per_s": round(conn_rate / 1e6, 2), "part_bytes": part, "concurrency": concurrency,
            "parallel_mb_per_s": round(total / par / 1e6, 2), "parallel_bytes": total,
            "requests": counters.requests, "retries": counters.retries}

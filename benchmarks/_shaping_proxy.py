"""A TCP proxy that shapes loopback traffic like a remote object store.

It listens on 127.0.0.1 and forwards every connection to an upstream ``host:port`` (a
moto S3 server, in ``benchmarks/object_storage.py``), adding what a loopback server lacks:

- per-request latency: bytes from the client that arrive on a connection after the
  previous response started coming back (a new HTTP request) wait ``latency_s`` before
  they go upstream (default 20 ms);
- a bandwidth cap per connection on the server -> client direction (a token bucket,
  default 25e6 bytes/s);
- an optional cap on the server -> client bytes of all connections together.

It runs asyncio in its own process (so its work never shares a GIL with the benchmark),
reads in 256 KiB chunks, and counts connections, requests (by method) and bytes in shared
memory that the parent reads with :meth:`ShapingProxy.counters`::

    with ShapingProxy("127.0.0.1", 5000, latency_s=0.02, conn_bytes_per_s=25e6) as proxy:
        ...  # point clients at proxy.url

Standalone::

    python benchmarks/shaping_proxy.py UPSTREAM_HOST:PORT [--port 0] [--latency-ms 20] [--conn-mbps 25] [--total-mbps N]
    python benchmarks/shaping_proxy.py --self-test [--seconds 3]   # the proxy's own speed, no caps

``--conn-mbps 0`` (or ``conn_bytes_per_s=None``) switches the per-connection cap off. The
process is started with ``spawn`` by default (safe in a process with threads), so a script
that starts a proxy needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

CHUNK = 256 * 1024  # read size, both directions
BURST = 64 * 1024   # what a token bucket lets through at once after an idle spell

# the shared counters (int64 slots in a RawArray written only by the proxy process)
FIELDS = ("connections", "open_connections", "requests", "gets", "heads", "other_requests",
          "bytes_to_client", "bytes_to_upstream")
_IDX = {name: i for i, name in enumerate(FIELDS)}
_GET, _HEAD = b"GET", b"HEAD"
_METHODS = (b"GET", b"HEAD", b"PUT", b"POST", b"DELETE", b"OPTIONS", b"PATCH")


class TokenBucket:
    """``rate`` bytes/s with a burst of ``burst`` bytes; takers that overdraw wait their debt
    off (so concurrent takers queue up fairly, in the order they asked)."""

    def __init__(self, rate: float, burst: int = BURST):
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = time.monotonic()

    def reserve(self, n: int) -> float:
        """Take ``n`` bytes; return how long to wait before sending them."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= n
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


class _Conn:
    __slots__ = ("new_request", "bucket")

    def __init__(self, bucket: TokenBucket | None):
        self.new_request = True  # the next client bytes start a request
        self.bucket = bucket


async def _serve(upstream: tuple[str, int], latency_s: float, conn_rate: float | None, total_rate: float | None,
                 counts, sock: socket.socket, stop: asyncio.Event) -> None:
    total = TokenBucket(total_rate) if total_rate else None
    tasks: set[asyncio.Task] = set()

    async def client_to_upstream(st: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            if st.new_request:
                st.new_request = False
                counts[_IDX["requests"]] += 1
                method = data[:8].split(b" ", 1)[0]
                if method == _GET:
                    counts[_IDX["gets"]] += 1
                elif method == _HEAD:
                    counts[_IDX["heads"]] += 1
                else:
                    counts[_IDX["other_requests"]] += 1
                if latency_s > 0:
                    await asyncio.sleep(latency_s)
            counts[_IDX["bytes_to_upstream"]] += len(data)
            writer.write(data)
            await writer.drain()

    async def upstream_to_client(st: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            st.new_request = True  # a response is under way: the client's next bytes are a new request
            n = len(data)
            if st.bucket is not None:
                wait = st.bucket.reserve(n)
                if wait > 0:
                    await asyncio.sleep(wait)
            if total is not None:
                wait = total.reserve(n)
                if wait > 0:
                    await asyncio.sleep(wait)
            counts[_IDX["bytes_to_client"]] += n
            writer.write(data)
            await writer.drain()

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        tasks.add(task)
        counts[_IDX["connections"]] += 1
        counts[_IDX["open_connections"]] += 1
        uwriter = None
        try:
            ureader, uwriter = await asyncio.open_connection(*upstream, limit=CHUNK)
            for w in (cwriter, uwriter):
                s = w.get_extra_info("socket")
                if s is not None:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            st = _Conn(TokenBucket(conn_rate) if conn_rate else None)
            up = asyncio.ensure_future(client_to_upstream(st, creader, uwriter))
            down = asyncio.ensure_future(upstream_to_client(st, ureader, cwriter))
            try:
                # the response side ending (or either side failing) ends the connection; the
                # request side ending (client half-closed) lets the response finish
                done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
                if up in done and up.exception() is None and not down.done():
                    await down
            finally:
                for t in (up, down):
                    t.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # shutting down: end quietly (asyncio's stream callback would report a cancelled handler)
        finally:
            counts[_IDX["open_connections"]] -= 1
            for w in (cwriter, uwriter):
                if w is not None:
                    w.close()
            tasks.discard(task)

    server = await asyncio.start_server(handle, sock=sock, limit=CHUNK, backlog=1024)
    async with server:
        await stop.wait()
    for t in list(tasks):
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _child(upstream, latency_s, conn_rate, total_rate, counts, conn, port) -> None:
    """The proxy process: listen, report the port through ``conn``, serve until ``conn``
    says stop or its parent end closes (the parent stopped, or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    sock.setblocking(False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_parent() -> None:
            try:
                conn.recv()  # "stop"
            except (EOFError, OSError):
                pass
            loop.remove_reader(conn.fileno())
            stop.set()

        loop.add_reader(conn.fileno(), on_parent)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        conn.send(sock.getsockname()[1])
        await _serve(upstream, latency_s, conn_rate, total_rate, counts, sock, stop)

    asyncio.run(main())


class ShapingProxy:
    """The shaping proxy in its own process; see the module docstring.

    ``start()`` returns once it listens; ``url`` is ``http://127.0.0.1:PORT``; ``stop()``
    (idempotent) ends it. ``counters()`` is a snapshot of the counts since the start
    (subtract two snapshots for what happened in between).
    """

    def __init__(self, upstream_host: str, upstream_port: int, latency_s: float = 0.02,
                 conn_bytes_per_s: float | None = 25e6, total_bytes_per_s: float | None = None,
                 port: int = 0, start_method: str = "spawn"):
        self.upstream = (upstream_host, int(upstream_port))
        self.latency_s = float(latency_s)
        self.conn_bytes_per_s = conn_bytes_per_s or None
        self.total_bytes_per_s = total_bytes_per_s or None
        self.port = int(port)
        self._ctx = mp.get_context(start_method)
        self._counts = self._ctx.RawArray("q", len(FIELDS))
        self._proc = None
        self._conn = None

    @property
    def url(self) -> str:
        if self._proc is None:
            raise RuntimeError("ShapingProxy not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "ShapingProxy":
        if self._proc is not None:
            return self
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_child, name="shaping-proxy", daemon=True,
            args=(self.upstream, self.latency_s, self.conn_bytes_per_s, self.total_bytes_per_s, self._counts, child,
                  self.port))
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        try:
            if not parent.poll(timeout):
                raise RuntimeError(f"shaping proxy did not start within {timeout:g} s")
            self.port = parent.recv()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 5.0) -> None:
        proc, conn = self._proc, self._conn
        if proc is None:
            return
        self._proc = self._conn = None
        try:
            conn.send("stop")
        except (OSError, ValueError):
            pass
        conn.close()
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()

    def counters(self) -> dict[str, int]:
        return {name: int(self._counts[i]) for i, name in enumerate(FIELDS)}

    @staticmethod
    def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
        return {k: after[k] - before.get(k, 0) for k in after}

    def __enter__(self) -> "ShapingProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        caps = f"{self.conn_bytes_per_s / 1e6:g} MB/s per connection" if self.conn_bytes_per_s else "no cap"
        if self.total_bytes_per_s:
            caps += f", {self.total_bytes_per_s / 1e6:g} MB/s in all"
        where = self.url if self._proc is not None else "not started"
        return (f"<ShapingProxy {where} -> {self.upstream[0]}:{self.upstream[1]}, "
                f"{self.latency_s * 1e3:g} ms/request, {caps}>")


# -- self-test: the proxy's own speed with no caps ------------------------------------------------
def _blast_server(nbytes: int) -> tuple[socket.socket, threading.Thread]:
    """A minimal HTTP/1.1 keep-alive server on 127.0.0.1 that answers any request with
    ``nbytes`` zero bytes, as fast as the kernel takes them."""
    body = memoryview(bytes(nbytes))
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {nbytes}\r\n\r\n".encode()
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(128)

    def one(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            buf = b""
            while True:
                try:
                    data = c.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    buf = buf.split(b"\r\n\r\n", 1)[1]
                    c.sendall(head)
                    c.sendall(body)

    def accept() -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return lsock, t


def _pull(url_port: int, nbytes: int, seconds: float, conns: int) -> float:
    """MB/s of GETs of ``nbytes`` each over ``conns`` persistent connections for ``seconds``."""
    import http.client  # noqa: PLC0415

    got = [0] * conns
    end = time.perf_counter() + seconds

    def worker(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", url_port, timeout=30)
        buf = bytearray(nbytes)
        while time.perf_counter() < end:
            c.request("GET", "/x")
            r = c.getresponse()
            view, n = memoryview(buf), 0
            while n < nbytes:
                k = r.readinto(view[n:])
                if not k:
                    break
                n += k
            r.read()
            got[i] += n
        c.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(got) / (time.perf_counter() - t0) / 1e6


def self_test(seconds: float = 3.0, nbytes: int = 8 << 20) -> int:
    lsock, _ = _blast_server(nbytes)
    port = lsock.getsockname()[1]
    print(f"uncapped proxy speed, GETs of {nbytes >> 20} MiB from a byte-blasting loopback server, "
          f"{os.cpu_count()} cores, {seconds:g} s each")
    print(f"{'path':<34}{'connections':>12}{'MB/s':>10}")
    try:
        for conns in (1, 8):
            direct = _pull(port, nbytes, seconds, conns)
            print(f"{'direct':<34}{conns:>12}{direct:>10,.0f}")
            with ShapingProxy("127.0.0.1", port, latency_s=0.0, conn_bytes_per_s=None) as p:
                via = _pull(p.port, nbytes, seconds, conns)
                c = p.counters()
            print(f"{'through ShapingProxy (no caps)':<34}{conns:>12}{via:>10,.0f}   ({c['requests']} requests)")
    finally:
        lsock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("upstream", nargs="?", help="HOST:PORT to forward to")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--conn-mbps", type=float, default=25.0, help="MB/s (1e6 bytes/s) per connection; 0: no cap")
    ap.add_argument("--total-mbps", type=float, default=0.0, help="MB/s of all connections together; 0: no cap")
    ap.add_argument("--self-test", action="store_true", help="measure the proxy's own speed with no caps, then exit")
    ap.add_argument("--seconds", type=float, default=3.0, help="--self-test: seconds per measurement")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(args.seconds)
    if not args.upstream:
        ap.error("give UPSTREAM as HOST:PORT (or --self-test)")
    host, _, port = args.upstream.rpartition(":")
    proxy = ShapingProxy(host or "127.0.0.1", int(port), latency_s=args.latency_ms / 1e3,
                         conn_bytes_per_s=args.conn_mbps * 1e6, total_bytes_per_s=args.total_mbps * 1e6,
                         port=args.port)
    proxy.start()
    print(f"{proxy!r}; Ctrl-C stops", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        c = proxy.counters()
        proxy.stop()
        print(f"\n{c['connections']} connections, {c['requests']} requests ({c['gets']} GET, {c['heads']} HEAD), "
              f"{c['bytes_to_client'] / 1e6:,.1f} MB to clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared fixtures: a real S3 API server (moto, server mode) on loopback, a fault-injecting
proxy in front of it, and a loopback HTTP file server."""

from __future__ import annotations

import collections
import http.client
import http.server
import io
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Credentials for the loopback S3 server only; never real ones.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing-secret-value")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

# property tests (hypothesis): no per-example deadline. The default 200 ms fails an example
# that a loaded machine happened to run slowly; what the tests check is the answers, and
# pytest's timeout still catches a hang. max_examples stays as each test sets it.
try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # hypothesis is a test dependency; the modules that use it import it
    pass
else:
    _hypothesis_settings.register_profile("shardfeed", deadline=None)
    _hypothesis_settings.load_profile("shardfeed")

# the server fixtures every test module may ask for by name: PostgreSQL and Redis, each
# defined beside its helpers and registered here, once
from .conftest_pg import pg_server  # noqa: E402, F401
from .test_workqueue_support import redis_url  # noqa: E402, F401


@pytest.fixture(scope="session")
def s3_endpoint():
    """URL of a moto S3 server on 127.0.0.1 (a real HTTP S3 API)."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A fresh bucket; yields ``(bucket, storage_options)``."""
    import boto3

    bucket = f"sf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    yield bucket, {"endpoint_url": s3_endpoint}
    from shardfeed.storage import clear_cache

    clear_cache()


@pytest.fixture(scope="session")
def gcs_endpoint():
    """URL of a Google Cloud Storage JSON API emulator on 127.0.0.1 (gcp-storage-emulator's
    request handler and in-memory store, served by a threading HTTP server so that parallel
    ranged GETs are served at once), read through gcsfs as users read GCS."""
    pytest.importorskip("gcsfs")
    emulator = pytest.importorskip("gcp_storage_emulator.server")
    import functools
    from http.server import ThreadingHTTPServer

    from gcp_storage_emulator.storage import Storage

    class Quiet(emulator.RequestHandler):
        def log_message(self, *args):  # one line per request on stderr otherwise
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client that hung up early
            pass

    httpd = Server(("127.0.0.1", 0), functools.partial(Quiet, Storage(use_memory_fs=True)))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="gcs-emulator", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def gcs_bucket(gcs_endpoint):
    """A fresh bucket on the GCS emulator; yields ``(bucket, storage_options)``."""
    import gcsfs

    opts = {"endpoint_url": gcs_endpoint, "token": "anon", "project": "shardfeed-test"}
    bucket = f"sf-{uuid.uuid4().hex[:12]}"
    gcsfs.core.GCSFileSystem(skip_instance_cache=True, **opts).mkdir(bucket)
    yield bucket, opts
    from shardfeed.storage import clear_cache

    clear_cache()


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``target`` that fails chosen requests.

    ``fail_every = n`` answers every n-th request with ``status`` (503 SlowDown by default)
    instead of forwarding it; ``reset_every = n`` closes the connection without an answer;
    ``stall_every = n`` holds every n-th request ``stall_s`` seconds (a stalled connection)
    before forwarding it; ``before(method, path, range)``, when set, runs before each request
    is forwarded (a test changes the store there, inside ``with proxy.quiesce():`` when no
    other request may be at the store meanwhile: moto answers a GET racing a PUT of its key
    with HTTP 500, which real stores never do); ``truncate_every = n`` forwards every n-th object GET but sends only
    the first half of its body (the headers promise all of it) and closes the connection; ``max_faults`` caps how many faults are injected in all.
    ``failed`` counts injected faults, ``forwarded`` the requests that reached the target;
    ``log`` holds one ``(method, path, Range header or None, outcome)`` a request, in order.
    ``object_gets`` / ``object_bytes`` count the GETs of objects (not listings) answered
    200 or 206 and the body bytes they sent: what crossed the wire, for the counters.
    """

    SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>Please reduce your request rate.</Message><RequestId>sf</RequestId></Error>")

    DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
              b"<Message>Access Denied</Message><RequestId>sf</RequestId></Error>")

    def __init__(self, target: str):
        self.target_host, self.target_port = target.split("://", 1)[1].split(":")
        self.fail_every = 0
        self.reset_every = 0
        self.stall_every = 0
        self.truncate_every = 0
        self.truncated = 0
        self.before: Any = None
        self.stall_s = 30.0
        self.status = 503
        self.max_faults: int | None = None
        self.deny: Any = None
        self.count = 0
        self.failed = 0
        self.forwarded = 0
        self.object_gets = 0
        self.object_bytes = 0
        self.kinds: collections.Counter = collections.Counter()  # requests forwarded: GET, HEAD, LIST, PUT...
        self.log: list[tuple[str, str, str | None, str]] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._inflight = 0  # requests being forwarded to the target now
        self._quiet = False  # a quiesce() holds new forwards back
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy.count += 1
                    n = proxy.count
                    budget = proxy.max_faults is None or proxy.failed < proxy.max_faults
                    fail = budget and proxy.fail_every and n % proxy.fail_every == 0
                    reset = budget and proxy.reset_every and n % proxy.reset_every == 0
                    stall = budget and proxy.stall_every and n % proxy.stall_every == 0
                    proxy.log.append((self.command, self.path, self.headers.get("Range"),
                                      "fail" if fail else "reset" if reset else "stall" if stall else "ok"))
                    if fail or reset or stall:
                        proxy.failed += 1
                    else:
                        proxy.forwarded += 1
                if proxy.deny is not None and proxy.deny(self.command, self.path):
                    denied = FaultProxy.DENIED
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(denied)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(denied)
                    return
                if stall:
                    time.sleep(proxy.stall_s)
                    self.close_connection = True
                    return
                if reset:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fail:
                    self.send_response(proxy.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(FaultProxy.SLOWDOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(FaultProxy.SLOWDOWN)
                    return
                if proxy.before is not None:
                    proxy.before(self.command, self.path, self.headers.get("Range"))
                with proxy._idle:
                    while proxy._quiet:
                        proxy._idle.wait()
                    proxy._inflight += 1
                try:
                    conn = http.client.HTTPConnection(proxy.target_host, int(proxy.target_port), timeout=30)
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("connection", "proxy-connection")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    with proxy._idle:
                        proxy._inflight -= 1
                        proxy._idle.notify_all()
                listing = self.command == "GET" and ("list-type" in self.path or "delimiter=" in self.path
                                                     or self.path.split("?", 1)[0].endswith("/"))
                with proxy._lock:
                    cut = (proxy.truncate_every and self.command == "GET" and not listing and len(data) > 1
                           and resp.status in (200, 206) and (proxy.max_faults is None or proxy.failed < proxy.max_faults)
                           and (proxy.object_gets + proxy.truncated + 1) % proxy.truncate_every == 0)
                    if cut:
                        proxy.truncated += 1
                        proxy.failed += 1
                    else:
                        # every request that reached the store, by kind, counted before any of
                        # the answer goes out: a client that has its answer finds its request
                        # counted (counted after, a dataset's build-time listing was now and then
                        # counted in the pass a test measured next)
                        proxy.kinds["LIST" if listing else self.command] += 1
                        if self.command == "GET" and resp.status in (200, 206) and not listing:
                            proxy.object_gets += 1
                            proxy.object_bytes += len(data)
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if cut:  # half the body, then a clean close (FIN): fewer bytes than Content-Length said
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    conn.close()
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # parallel ranged reads open many connections at once
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @contextmanager
    def quiesce(self):
        """Hold new forwards back and wait until none is at the target (called from
        ``before``, whose own request is not forwarded yet): what the block does to the
        store happens between two requests, never during one."""
        with self._idle:
            while self._quiet:
                self._idle.wait()
            self._quiet = True
            while self._inflight:
                self._idle.wait()
        try:
            yield
        finally:
            with self._idle:
                self._quiet = False
                self._idle.notify_all()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fault_proxy(s3_endpoint):
    proxy = FaultProxy(s3_endpoint)
    yield proxy
    proxy.close()
    from shardfeed.storage import clear_cache

    clear_cache()


@contextmanager
def serve_directory(directory: str, served: dict | None = None):
    """Serve ``directory`` over HTTP on 127.0.0.1 (supports Range requests); yields the base
    URL. With ``served``, body bytes sent for GETs are added up there per file name."""
    lock = threading.Lock()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=directory, **kw)

        def log_message(self, *args):
            pass

        def send_head(self):
            path = self.translate_path(self.path)
            if not os.path.isfile(path):
                return super().send_head()
            size = os.path.getsize(path)
            rng = self.headers.get("Range")
            start, end = 0, size - 1
            if rng:
                start_s, _, end_s = rng.split("=", 1)[1].partition("-")
                start = int(start_s) if start_s else max(0, size - int(end_s))
                end = min(size - 1, int(end_s)) if (end_s and start_s) else size - 1
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(max(0, end - start + 1))
            self.send_response(206 if rng else 200)
            self.send_header("Content-Type", "application/octet-stream")
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if served is not None and self.command == "GET":
                with lock:
                    name = os.path.basename(path)
                    served[name] = served.get(name, 0) + len(data)
            return io.BytesIO(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_dir(tmp_path):
    """``(directory, base_url)``: files put in the directory are served on loopback."""
    with serve_directory(str(tmp_path)) as url:
        yield tmp_path, url


# -- the quick loop: `make test-fast` runs what is not marked slow (nor tf) ----------------------
SLOW_FIXTURES = {"s3_endpoint", "pg_server", "redis_url"}  # a server started for the test
SLOW_MODULES = {
    "test_workqueue_processes", "test_workqueue_redis_restart", "test_convert_video", "test_bench_cmd",
    "test_examples", "test_tfrecorder_output", "test_docs",
}
SLOW_NAME_PARTS = ("process", "spawn", "ddp", "dataloader", "subprocess", "num_workers")


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that starts a server, a process or a subprocess, so that
    ``pytest -m "not slow and not tf"`` is an edit loop of a minute or two."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        name = item.name.lower()
        if (SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))) or module in SLOW_MODULES \
                or any(part in name for part in SLOW_NAME_PARTS):
            item.add_marker(pytest.mark.slow)

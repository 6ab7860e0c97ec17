"""Fixtures shared by the work-queue tests: a real Redis server on loopback (password set,
free port, stopped at the end), small indexed TFRecord shards, and the three backends."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import pytest

import shardfeed as sf

REDIS_PASSWORD = "s3cr3t-redis-pw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url():
    """``redis://:password@127.0.0.1:PORT/0`` of a redis-server started for the session."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (CI installs it)")
    pytest.importorskip("redis")
    d = tempfile.mkdtemp(prefix="sf-redis-")
    port = free_port()
    subprocess.run([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                    "--dir", d, "--daemonize", "yes", "--pidfile", f"{d}/redis.pid", "--logfile", f"{d}/redis.log",
                    "--requirepass", REDIS_PASSWORD], check=True)
    import redis

    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    else:
        pytest.fail("redis-server did not answer")
    client.close()
    yield url
    try:
        with open(f"{d}/redis.pid") as f:
            os.kill(int(f.read().strip()), 15)
    except (OSError, ValueError):
        pass
    shutil.rmtree(d, ignore_errors=True)


def make_shards(d, sizes, index: bool = True) -> tuple[list[str], list[bytes]]:
    """TFRecord files with ``sizes[i]`` records each, named ``f<i>-r<j>``; returns
    ``(paths, all records)``."""
    paths, records = [], []
    for i, n in enumerate(sizes):
        p = os.path.join(str(d), f"part-{i:03d}.tfrecord")
        recs = [f"f{i}-r{j}".encode() for j in range(n)]
        sf.write_records(p, recs, index=index)
        paths.append(p)
        records += recs
    return paths, records


@pytest.fixture
def shards(tmp_path):
    return make_shards(tmp_path, [7, 0, 13, 5, 20])


@pytest.fixture(params=["memory", "sqlite", "redis"])
def backend_url(request, tmp_path):
    """A backend URL for each of the three backends (queue names are unique per test)."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/queue.db"
    return request.getfixturevalue("redis_url")


@pytest.fixture
def qname():
    return f"q-{uuid.uuid4().hex[:10]}"

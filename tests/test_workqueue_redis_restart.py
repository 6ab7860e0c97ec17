"""A Redis restart with its data (AOF on) does not kill WorkQueue workers: they reconnect
with backoff and keep their leases; every item is still done exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager

import pytest

import shardfeed as sf
from shardfeed.distributed.redis_backend import RedisBackend, _take_reconnect

from .test_workqueue_support import free_port


def _start(exe: str, d: str, port: int, persist: bool = True) -> None:
    """A redis-server on 127.0.0.1:``port`` in ``d``, with its data kept (AOF) or not; up on return."""
    aof = ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
    subprocess.run([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", *aof, "--dir", d,
                    "--daemonize", "yes", "--pidfile", f"{d}/redis.pid", "--logfile", f"{d}/redis.log"], check=True)
    _wait_up(port)


def _stop(d: str) -> None:
    """Stop the server of ``d`` (SIGTERM); gone on return."""
    with open(f"{d}/redis.pid") as f:
        pid = int(f.read().strip())
    os.kill(pid, 15)
    deadline = time.monotonic() + 30  # a loaded machine may take seconds to write and exit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.02)
    pytest.fail(f"redis-server (pid {pid}) still running 30 s after SIGTERM")


def _wait_up(port: int) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail(f"redis-server on port {port} not answering 30 s after it was started")
                time.sleep(0.05)
    finally:
        client.close()


def test_reconnect_seconds_come_from_the_url_or_the_argument():
    assert _take_reconnect("redis://h:1/0?reconnect_s=5", None) == ("redis://h:1/0", 5.0)
    assert _take_reconnect("redis://h:1/0", 2) == ("redis://h:1/0", 2.0)
    assert _take_reconnect("redis://h:1/0", None)[1] == 60.0
    with pytest.raises(ValueError, match="reconnect_s"):
        _take_reconnect("redis://h:1/0?reconnect_s=soon", None)


def _server_place(prefix: str) -> tuple[str, str, int]:
    """The redis-server executable, a fresh folder for its data and a free port (the test is
    skipped where redis-server or the client is missing)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (CI installs it)")
    pytest.importorskip("redis")
    return exe, tempfile.mkdtemp(prefix=prefix), free_port()


@contextmanager
def _redis_server(prefix: str, persist: bool = True):
    """A redis-server on a free loopback port in its own folder: ``(exe, folder, port)``;
    stopped and its folder removed afterwards (whatever the test left running)."""
    exe, d, port = _server_place(prefix)
    _start(exe, d, port, persist=persist)
    try:
        yield exe, d, port
    finally:
        try:
            _stop(d)
        except OSError:
            pass
        shutil.rmtree(d, ignore_errors=True)


def test_workers_survive_a_redis_restart_with_its_data():
    with _redis_server("sf-redis-restart-") as (exe, d, port):
        url = f"redis://127.0.0.1:{port}/0?reconnect_s=30"
        works = [f"/data/part-{i:03d}" for i in range(40)]
        q = sf.WorkQueue(works, backend=url, name="restart", seed=1, lease_timeout=60)
        done, errors = [], []

        def worker():
            try:
                wq = sf.WorkQueue(works, backend=url, name="restart", seed=1, lease_timeout=60)
                for item in wq:
                    time.sleep(0.02)  # the work
                    done.append(str(item))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        _stop(d)
        time.sleep(1.5)  # the workers hit a refused connection meanwhile
        _start(exe, d, port)
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert sorted(done) == sorted(works)  # each exactly once: leases survived the restart
        m = q.metrics()
        assert m["drained"] and m["done"] == len(works)
        assert isinstance(q.backend, RedisBackend) and q.backend.reconnect_s == 30.0


def test_a_queue_lost_in_a_restart_without_persistence_stops_its_workers_with_a_clear_error():
    with _redis_server("sf-redis-lost-", persist=False) as (exe, d, port):
        url = f"redis://127.0.0.1:{port}/0?reconnect_s=20"
        works = [f"/data/part-{i:03d}" for i in range(10)]
        old = sf.WorkQueue(works, backend=url, name="volatile", seed=2)
        item = old.take()
        state = old.get_state()  # a checkpoint saved before the loss
        _stop(d)
        _start(exe, d, port, persist=False)  # back, empty: the queue is gone
        with pytest.raises(sf.WorkQueueLostError, match="gone since this worker joined"):
            old.ack_and_take(item)
        newcomer = sf.WorkQueue(works, backend=url, name="volatile", seed=2)  # fills it afresh
        assert newcomer.take() is not None
        with pytest.raises(sf.WorkQueueLostError, match="created again"):
            old.take()  # the old worker never runs the epoch again
        # the way back: restore the checkpoint; the queue hands out what was not acknowledged
        assert old.set_state(state)
        left = []
        while (it := old.take(block=False)) is not None:
            left.append(str(it))
            old.ack(it)
        assert sorted(left) == sorted(works)  # nothing was acknowledged before the checkpoint


def test_every_call_of_a_worker_whose_queue_was_lost_raises_work_queue_lost():
    """Not only take: ack, renew, release and metrics of a joined worker say the queue was lost
    (before, ack raised a plain KeyError and renew/release answered False)."""
    with _redis_server("sf-redis-lost-all-", persist=False) as (exe, d, port):
        url = f"redis://127.0.0.1:{port}/0?reconnect_s=20"
        works = [f"/data/part-{i:03d}" for i in range(6)]
        q = sf.WorkQueue(works, backend=url, name="volatile2", seed=3)
        a, b = q.take(), q.take()
        _stop(d)
        _start(exe, d, port, persist=False)  # back, empty
        for call in (lambda: q.ack(a), lambda: q.renew(a), lambda: q.release(b), q.metrics, q.get_state):
            with pytest.raises(sf.WorkQueueLostError, match="gone since this worker joined"):
                call()
        sf.WorkQueue(works, backend=url, name="volatile2", seed=3)  # a newcomer makes it again
        for call in (lambda: q.ack(a), lambda: q.renew(a), lambda: q.release(b)):
            with pytest.raises(sf.WorkQueueLostError, match="created again"):
                call()

"""What a WorkQueue may deliver twice (issue 36 item 5): only the records of items a dead
worker had started delivering; never an acknowledged item, also across a Redis restart
that keeps its data; every re-delivery counted (``metrics()["redelivered"]``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import shardfeed as sf

from .test_workqueue_support import backend_url, qname, redis_url  # noqa: F401 - fixtures

SRC = str(Path(__file__).resolve().parents[1] / "src")

# Reads the queue through sf.read_tfrecord with read-ahead (gzip files are read ahead in
# background threads), writes each record it consumes at once; the stalling one stops in
# the middle of its third file, where the test kills it.
READER = r"""
import os, sys, time
import shardfeed as sf

backend, name, works_file, out, stall_marker = sys.argv[1:6]
works = open(works_file).read().split()
q = sf.WorkQueue(works, seed=5, backend=backend, name=name, lease_timeout=1.5, poll_interval=0.05)
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
files = []
for rec in sf.read_tfrecord(q, num_parallel_reads=4):
    r = rec.decode()
    os.write(fd, (r + "\n").encode())
    f = r.split("-")[0]
    if f not in files:
        files.append(f)
    if stall_marker != "-" and len(files) == 3 and r.endswith("-r2"):
        open(stall_marker, "w").write(f)   # three records into its third file: the test kills us
        time.sleep(300)
    time.sleep(0.001)
q.close()
"""

SIZES = [30, 25, 40, 17, 33, 28, 22, 35, 26, 31]


def _gz_shards(d: Path) -> tuple[list[str], list[str]]:
    paths, records = [], []
    for i, n in enumerate(SIZES):
        p = str(d / f"part-{i:03d}.tfrecord.gz")
        recs = [f"f{i}-r{j}" for j in range(n)]
        sf.write_records(p, [r.encode() for r in recs])
        paths.append(p)
        records += recs
    return paths, records


def _killed_mid_item(tmp_path: Path, backend: str, name: str) -> None:
    paths, records = _gz_shards(tmp_path)
    works_file = tmp_path / "works.txt"
    works_file.write_text("\n".join(paths))
    script = tmp_path / "reader.py"
    script.write_text(READER)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    marker = tmp_path / "stalled"

    def start(i: int, stall: bool) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), backend, name, str(works_file),
                                 str(tmp_path / f"out-{i}.txt"), str(marker) if stall else "-"], env=env)

    sf.WorkQueue(paths, seed=5, backend=backend, name=name).close()  # made before the workers join it
    victim = start(0, stall=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the stalling worker never reached the middle of its third file"
        assert victim.poll() is None, "the stalling worker exited early"
        time.sleep(0.02)
    others = [start(i, stall=False) for i in (1, 2)]
    time.sleep(0.3)  # the others take items meanwhile; the victim holds its read-ahead leases
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for p in others:
        assert p.wait(timeout=180) == 0

    outs = [(tmp_path / f"out-{i}.txt").read_text().split() for i in range(3)]
    seen = Counter(r for out in outs for r in out)
    assert set(seen) == set(records), "records lost"
    repeated = {r for r, n in seen.items() if n > 1}
    started = marker.read_text()  # the file the victim was delivering when it died
    victims = set(outs[0])
    # only the records the victim delivered of the item it was in the middle of come twice
    assert repeated == {r for r in victims if r.startswith(started + "-")}, \
        f"repeated records outside the item being delivered: {sorted(repeated)}"
    assert max(seen.values()) == 2
    m = sf.WorkQueue(paths, seed=5, backend=backend, name=name).metrics()
    assert m["drained"] and m["done"] == len(paths) and m["late_acks"] == 0
    # the item in the middle and those read ahead (taken, none of their records out) came back
    assert m["redelivered"] == m["expired"] >= 1


def test_a_reader_killed_mid_item_repeats_only_that_items_records_sqlite(tmp_path):
    _killed_mid_item(tmp_path, f"sqlite://{tmp_path}/queue.db", "redeliver")


def test_a_reader_killed_mid_item_repeats_only_that_items_records_redis(tmp_path, redis_url):  # noqa: F811
    _killed_mid_item(tmp_path, redis_url, f"redeliver-{tmp_path.name}")


def test_redelivered_counts_takes_of_items_given_back(backend_url, qname):  # noqa: F811
    q = sf.WorkQueue([f"/w/{i}" for i in range(4)], name=qname, backend=backend_url, seed=1, lease_timeout=0.3)
    a = q.take()
    b = q.take()
    assert q.metrics()["redelivered"] == 0
    q.release(a)
    assert q.take().id == a.id  # given back: taken again, counted
    time.sleep(0.5)  # a's and b's leases expire
    again = [q.take(), q.take()]
    assert {x.id for x in again} == {a.id, b.id}
    for x in again:
        q.ack(x)
    while (x := q.take(block=False)) is not None:
        q.ack(x)
    m = q.metrics()
    assert m["redelivered"] == 3 and m["released"] == 1 and m["expired"] == 2 and m["drained"]


def test_a_sqlite_file_from_before_the_redelivered_counter_is_upgraded(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript("""
    CREATE TABLE wq_queues (name TEXT PRIMARY KEY, meta TEXT NOT NULL, num_epochs INTEGER,
        next_epoch INTEGER NOT NULL DEFAULT 0, token INTEGER NOT NULL DEFAULT 0, restore_id TEXT,
        taken INTEGER NOT NULL DEFAULT 0, acked INTEGER NOT NULL DEFAULT 0, expired INTEGER NOT NULL DEFAULT 0,
        late_acks INTEGER NOT NULL DEFAULT 0, released INTEGER NOT NULL DEFAULT 0);
    CREATE TABLE wq_items (name TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, worker TEXT, token INTEGER,
        deadline REAL, PRIMARY KEY (name, id));
    """)
    con.close()
    q = sf.WorkQueue(["/w/0", "/w/1"], name="old", backend=f"sqlite://{path}", seed=1)
    q.release(q.take())
    q.ack(q.take())
    assert q.metrics()["redelivered"] == 1

"""Real worker processes sharing one queue (SQLite file, Redis server); one is killed with
SIGKILL in the middle of an item, another joins mid-epoch. Every record of the epoch is
consumed exactly once by acknowledged items, and the queue finishes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from shardfeed.distributed import WorkQueue
from shardfeed.distributed.sqlite import SQLiteBackend

from .test_workqueue_support import make_shards

SRC = str(Path(__file__).resolve().parents[1] / "src")

WORKER = r"""
import json, os, sys, time
from shardfeed.distributed import WorkQueue, iter_item_records

backend, name, works_file, out, stall_marker = sys.argv[1:6]
works = json.load(open(works_file))
q = WorkQueue(works, num_epochs=2, num_slices=24, seed=5, backend=backend, name=name, lease_timeout=1.5,
              poll_interval=0.05)
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
n_items = 0
while True:
    item = q.take()
    if item is None:
        break
    records = []
    for k, rec in enumerate(iter_item_records(item)):
        records.append(rec.decode())
        if stall_marker != "-" and n_items == 1 and k == 1:
            open(stall_marker, "w").write(item.id)   # now in the middle of an item: the test kills us
            time.sleep(120)
        time.sleep(0.002)
    if q.ack(item):
        os.write(fd, (json.dumps({"id": item.id, "records": records}) + "\n").encode())
    n_items += 1
q.close()
"""


def _run_workers(tmp_path: Path, backend: str, name: str) -> None:
    paths, records = make_shards(tmp_path, [30, 11, 0, 25, 17, 40])
    works_file = tmp_path / "works.json"
    works_file.write_text(json.dumps(paths))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    marker = tmp_path / "stalled"

    def start(i: int, stall: bool) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), backend, name, str(works_file),
                                 str(tmp_path / f"out-{i}.jsonl"), str(marker) if stall else "-"], env=env)

    # the queue exists before the workers start, so they all join the same one
    WorkQueue(paths, num_epochs=2, num_slices=24, seed=5, backend=backend, name=name).close()
    victim = start(0, stall=True)
    procs = [start(i, stall=False) for i in (1, 2)]
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the stalling worker never reached the middle of an item"
        assert victim.poll() is None, "the stalling worker exited early"
        time.sleep(0.02)
    procs.append(start(3, stall=False))  # joins mid-epoch
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for p in procs:
        assert p.wait(timeout=180) == 0

    acked = Counter()
    per_epoch: dict[int, Counter] = {0: Counter(), 1: Counter()}
    for i in range(4):
        f = tmp_path / f"out-{i}.jsonl"
        for line in f.read_text().splitlines() if f.exists() else []:
            d = json.loads(line)
            acked[d["id"]] += 1
            per_epoch[int(d["id"].split(":")[0])].update(d["records"])
    assert set(acked.values()) == {1}
    q = WorkQueue(paths, num_epochs=2, num_slices=24, seed=5, backend=backend, name=name)
    assert len(acked) == 2 * len(q)
    expected = Counter(r.decode() for r in records)
    for e in (0, 1):
        assert per_epoch[e] == expected, f"epoch {e}: records missing or duplicated"
    m = q.metrics()
    assert m["drained"] and m["done"] == 2 * len(q) and m["expired"] >= 1
    assert marker.read_text() not in {k for k, v in acked.items() if v != 1}
    assert len(m["workers"]) >= 2  # the killed worker and at least one other took items


def test_four_sqlite_workers_one_killed_mid_item(tmp_path):
    _run_workers(tmp_path, f"sqlite://{tmp_path}/queue.db", "procs")


def test_four_redis_workers_one_killed_mid_item(tmp_path, redis_url):  # noqa: F811
    _run_workers(tmp_path, redis_url, f"procs-{tmp_path.name}")




def _open_queue_files(root: str, runs: int, together, errors) -> None:
    for run in range(runs):
        together.wait()  # all six at once, each time
        try:
            SQLiteBackend(os.path.join(root, f"q{run}", "queue.db")).close()
        except Exception as e:  # reported to the test
            errors.put(repr(e))


def test_sqlite_workers_opening_a_new_queue_file_together_all_open_it(tmp_path):
    """Workers started together on a new queue file: one making the tables while another
    turned the file to WAL got "database is locked" at once (SQLite does not wait where
    waiting could deadlock; 3 runs of 20 with 6 processes, and a CI run). Each now waits."""
    ctx = multiprocessing.get_context("spawn")
    errors, together = ctx.Queue(), ctx.Barrier(6)
    procs = [ctx.Process(target=_open_queue_files, args=(str(tmp_path), 30, together, errors)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * 6
    assert errors.empty(), errors.get()

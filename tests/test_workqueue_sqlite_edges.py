"""The SQLite work-queue backend at its edges: a queue of many items (the cost of a take and
an acknowledgement must not grow with it), a file that cannot be used (a garbage file, a
read-only one), and a file deleted or replaced under running workers."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import shardfeed as sf
from shardfeed.distributed.sqlite import SQLiteBackend
from shardfeed.errors import ShardfeedError, WorkQueueLostError

WORKS = [f"/works/file-{i}.tfrecord" for i in range(10)]


def _queue(path: Path, name: str = "train", **kw) -> sf.WorkQueue:
    kw.setdefault("seed", 5)
    kw.setdefault("lease_timeout", 30)
    return sf.WorkQueue(kw.pop("works", WORKS), name=name, backend=f"sqlite://{path}", **kw)


def _remove_queue_file(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")


# -- F6: a take and an acknowledgement cost the same however many items the queue holds ------------
def _backend_with(path: Path, n: int) -> SQLiteBackend:
    """A backend holding queue "q" of ``n`` items (its meta as big as a real one's: about 50
    bytes an item), epoch 0 filled, one item leased and acknowledged."""
    b = SQLiteBackend(str(path))
    b.open("q", {"num_epochs": 1, "items": [f"/data/shard-{i:06d}.tfrecord" for i in range(n)]})
    assert b.take("q", "w", 30)["status"] == "need_epoch"
    assert b.fill_epoch("q", 0, list(range(n)))
    got = b.take("q", "w", 30)
    assert b.ack("q", got["id"], got["token"], "w")
    return b


def _vm_steps_of_lease_calls(b: SQLiteBackend) -> int:
    """SQLite virtual-machine instructions run by one round of lease calls: a take that
    reclaims expired leases, a take, a renewal, a release, and acknowledgements. A statement
    that visits every item of the queue (a scan, or an index searched on its first column
    only) runs thousands more for a big queue than for a small one."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    expiring = [b.take("q", "w", -1.0) for _ in range(3)]  # leases already past their deadline
    conn = b._conn()
    conn.set_progress_handler(count, 1)
    try:
        first = b.take("q", "w", 30)  # reclaims the three expired leases, then takes
        second = b.take("q", "w", 30)
        assert b.renew("q", second["id"], second["token"], 30)
        assert b.release("q", second["id"], second["token"])
        assert b.ack("q", first["id"], first["token"], "w")
    finally:
        conn.set_progress_handler(None, 1)
    assert {first["id"]} <= {x["id"] for x in expiring}  # the reclaimed ones went to the front
    return steps[0]


def test_sqlite_lease_calls_visit_as_many_rows_for_20000_items_as_for_500(tmp_path):
    """Taking reclaimed expired leases through MIN(seq) over an index that starts (name,
    worker): it visited every item of the queue (a SEARCH in the query plan, yet a scan)."""
    small = _vm_steps_of_lease_calls(_backend_with(tmp_path / "small.db", 500))
    big = _vm_steps_of_lease_calls(_backend_with(tmp_path / "big.db", 20_000))
    assert big <= small * 1.2 + 50, f"{big} VM instructions for 20,000 items against {small} for 500"


def _wal_frames_per_take_and_ack(b: SQLiteBackend, rounds: int = 10) -> float:
    """Pages written (WAL frames) per take and acknowledgement."""
    conn = b._conn()
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for _ in range(rounds):
        got = b.take("q", "w", 30)
        assert b.ack("q", got["id"], got["token"], "w")
    _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return frames / rounds


def test_sqlite_take_and_ack_write_as_many_pages_for_20000_items_as_for_500(tmp_path):
    """The queue's meta (its item list: 0.9 MB for 20,000 items) lived in the wq_queues row
    that every take and acknowledgement rewrites: 15 ms a take and acknowledgement at 60,000
    items against 0.4 ms at 2,000. It lives in wq_meta now."""
    small = _wal_frames_per_take_and_ack(_backend_with(tmp_path / "small.db", 500))
    big = _wal_frames_per_take_and_ack(_backend_with(tmp_path / "big.db", 20_000))
    assert small < 40
    assert big <= small + 5, f"{big} pages written per take and acknowledgement for 20,000 items, {small} for 500"


def test_sqlite_statements_of_take_and_ack_use_indexes(tmp_path):
    """No statement that a take (reclaiming expired leases), an acknowledgement, a renewal or
    a release runs scans the items table or sorts more than the rows it found."""
    b = _backend_with(tmp_path / "q.db", 100)
    for _ in range(2):
        b.take("q", "w", -1.0)
    seen: list[str] = []
    conn = b._conn()
    conn.set_trace_callback(seen.append)
    try:
        got = b.take("q", "w", 30)
        b.renew("q", got["id"], got["token"], 30)
        b.release("q", got["id"], got["token"])
        got = b.take("q", "w", 30)
        b.ack("q", got["id"], got["token"], "w")
    finally:
        conn.set_trace_callback(None)
    statements = {s for s in seen if "wq_items" in s}
    assert len(statements) >= 6
    for s in statements:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + s)]
        assert not any(p.startswith("SCAN") for p in plan), (s, plan)
        if "ORDER BY seq DESC" not in s:  # the expired leases found are sorted: only they
            assert not any("TEMP B-TREE" in p for p in plan), (s, plan)


def test_a_queue_file_written_before_wq_meta_opens_and_goes_on(tmp_path):
    """A file of the layout before wq_meta and the seq/deadline indexes (the meta inside
    wq_queues) opens, keeps its progress and leases, and has its meta moved out."""
    path = tmp_path / "q.db"
    q = _queue(path, num_epochs=2)
    done = q.take()
    assert q.ack(done)
    held = q.take()
    q.backend.close()
    con = sqlite3.connect(path)  # back to the layout before
    con.executescript("""
        UPDATE wq_queues SET meta=(SELECT meta FROM wq_meta WHERE wq_meta.name=wq_queues.name);
        DROP TABLE wq_meta; DROP INDEX wq_items_seq; DROP INDEX wq_items_deadline;
    """)
    con.close()
    again = _queue(path, num_epochs=2)
    assert again.metrics()["done"] == 1 and again.metrics()["in_flight"] == 1
    assert q.ack(held)  # the lease taken before the upgrade is still the worker's
    seen = Counter([done.id, held.id])
    while (item := again.take(block=False)) is not None:
        assert again.ack(item)
        seen[item.id] += 1
    assert len(seen) == 2 * len(WORKS) and set(seen.values()) == {1}
    con = sqlite3.connect(path)
    assert con.execute("SELECT meta FROM wq_queues").fetchall() == [("",)]
    assert json.loads(con.execute("SELECT meta FROM wq_meta").fetchone()[0])["digest"] == again.digest
    con.close()


# -- F7: a file that cannot be used ----------------------------------------------------------------
def test_a_garbage_queue_file_is_reported_with_its_path_and_the_queue_when_opened(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"not a database " * 100)
    with pytest.raises(ShardfeedError) as info:
        _queue(path)
    text = str(info.value)
    assert str(path) in text and "'train'" in text and "not a SQLite database" in text
    assert not isinstance(info.value, sqlite3.Error)


def _make_read_only(path: Path):
    """Make ``path`` read-only even for root (the immutable flag), or by its mode for
    others; returns the undo. Skips where neither stops a write."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a filesystem without chattr +i: cannot make a file read-only")
        return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
    mode = path.stat().st_mode
    path.chmod(0o444)
    return lambda: path.chmod(mode)


def test_a_read_only_queue_file_is_reported_with_its_path_and_the_queue_when_opened(tmp_path):
    path = tmp_path / "ro.db"
    q = _queue(path)
    q.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    undo = _make_read_only(path)
    try:
        with pytest.raises(ShardfeedError) as info:
            _queue(path)  # raised here, where the queue is opened, not at the first take
    finally:
        undo()
    text = str(info.value)
    assert str(path) in text and "'train'" in text and "read-only" in text
    assert not isinstance(info.value, sqlite3.Error)


def test_an_unusable_file_is_reported_by_the_command_line_calls_too(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"\x00garbage" * 600)
    b = SQLiteBackend(str(path))  # the name comes with the first call
    with pytest.raises(ShardfeedError, match=r"work queue 'train' on sqlite://.*garbage\.db: open failed"):
        b.snapshot("train")
    with pytest.raises(ShardfeedError, match="work queues on sqlite://.*not a SQLite database"):
        b.names()


# -- F8: the file deleted or replaced under running workers -----------------------------------------
def test_a_worker_whose_queue_file_was_deleted_stops_at_take_ack_and_renew(tmp_path):
    path = tmp_path / "queue.db"
    a = _queue(path)
    item = a.take()
    _remove_queue_file(path)
    for call in (a.take, lambda: a.ack(item), lambda: a.renew(item)):
        with pytest.raises(WorkQueueLostError, match=f"'train' on .* is gone since this worker joined .*{path} was "
                                                     "deleted"):
            call()


def test_a_queue_file_replaced_under_a_worker_stops_it_and_no_item_is_done_twice(tmp_path):
    """The outside tester's case: the file removed, a worker joining later made the queue
    afresh in a new file, the old worker went on with the deleted one: every item done twice."""
    path = tmp_path / "queue.db"
    old = _queue(path)
    first = old.take()
    assert old.ack(first)
    _remove_queue_file(path)
    new = _queue(path)  # a worker that joins later makes the queue afresh
    with pytest.raises(WorkQueueLostError, match=f"{path} was replaced by another file"):
        old.take(block=False)
    with pytest.raises(WorkQueueLostError):
        old.ack(first)
    done = Counter()
    while (item := new.take(block=False)) is not None:
        assert new.ack(item)
        done[item.id] += 1
    assert len(done) == len(WORKS) and set(done.values()) == {1}


def test_a_worker_restores_its_checkpoint_into_the_file_now_at_the_path(tmp_path):
    """``set_state`` is the way back for a worker whose queue was lost: it writes the file
    now at the path (not the deleted one its connections had open), where other workers
    find the restored queue."""
    path = tmp_path / "queue.db"
    a = _queue(path)
    assert a.ack(a.take())
    state = a.get_state()
    _remove_queue_file(path)
    assert a.set_state(state)
    item = a.take()
    assert item is not None and a.ack(item)
    joiner = _queue(path)
    m = joiner.metrics()
    assert m["done"] == 2 and m["pending"] == len(WORKS) - 2


def test_a_reset_from_another_handle_still_says_the_queue_is_gone(tmp_path):
    """The file stays: the queue inside it went (as before)."""
    path = tmp_path / "queue.db"
    a = _queue(path)
    item = a.take()
    assert SQLiteBackend(str(path)).reset("train")
    for call in (a.take, lambda: a.ack(item), lambda: a.renew(item)):
        with pytest.raises(WorkQueueLostError, match="is gone since this worker joined"):
            call()

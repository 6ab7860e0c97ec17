"""TableRecordReader over a WorkQueue (issue 36 item 2): its read-ahead threads hold leases,
so the reader never waits in a blocking take for leases it holds itself; every row comes
once, every item is acknowledged once, and leases are renewed while rows flow."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import shardfeed as sf

duckdb = pytest.importorskip("duckdb")


@pytest.fixture
def tables(tmp_path):
    path = tmp_path / "t.db"
    con = duckdb.connect(str(path))
    for name, lo, hi in (("a", 0, 300), ("b", 1000, 1200)):
        con.execute(f"CREATE TABLE {name} (id BIGINT, price DOUBLE)")
        con.execute(f"INSERT INTO {name} SELECT range, range * 0.5 FROM range({lo}, {hi})")
    con.close()
    return [f"duckdb://{path}/a", f"duckdb://{path}/b"]


def _read_all(reader, source, n, out, errors, pause_s):
    try:
        while len(values := reader.read_up_to(source, n)[1]):
            out.extend(int(v.split(";")[0]) for v in values)
            time.sleep(pause_s)  # the consumer's own work
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def _run(reader, source, n, pause_s=0.0, limit_s=30.0) -> list[int]:
    """Every row of ``source`` through ``reader`` in a thread; a hang fails the test."""
    out: list[int] = []
    errors: list[BaseException] = []
    t = threading.Thread(target=_read_all, args=(reader, source, n, out, errors, pause_s), daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"read_up_to hung after {len(out)} rows (waiting on leases its own threads hold?)"
    assert not errors, errors
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_reader_threads_over_a_queue_of_two_tables_do_not_deadlock(tables, tmp_path, backend):
    url = f"memory://{uuid.uuid4().hex}" if backend == "memory" else f"sqlite://{tmp_path}/q.db"
    q = sf.WorkQueue(tables, name="trr-deadlock", backend=url, seed=3)
    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=2, capacity=64)
    try:
        got = _run(reader, q.input_producer(), 16)
    finally:
        reader.close()
    assert sorted(got) == list(range(300)) + list(range(1000, 1200))
    m = q.metrics()
    assert m["drained"] and m["done"] == 2 and m["expired"] == 0 and m["late_acks"] == 0


@pytest.mark.timeout(120)
def test_reader_over_row_ranges_with_more_threads_than_items_left(tables):
    q = sf.WorkQueue(tables, name="trr-ranges", backend=f"memory://{uuid.uuid4().hex}", seed=4, num_slices=5,
                     row_counts={tables[0]: 300, tables[1]: 200})
    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=4, capacity=32)
    try:
        got = _run(reader, q, 7)
    finally:
        reader.close()
    assert sorted(got) == list(range(300)) + list(range(1000, 1200))
    m = q.metrics()
    assert m["drained"] and m["done"] == len(q) and m["expired"] == 0


@pytest.mark.timeout(120)
def test_a_slow_consumer_keeps_its_leases_renewed(tables):
    # leases of 0.6 s; the consumer takes longer than that over each item
    q = sf.WorkQueue(tables, name="trr-renew", backend=f"memory://{uuid.uuid4().hex}", seed=5, num_slices=4,
                     row_counts={tables[0]: 300, tables[1]: 200}, lease_timeout=0.6)
    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=2, capacity=16)
    try:
        got = _run(reader, q, 20, pause_s=0.1)
    finally:
        reader.close()
    assert sorted(got) == list(range(300)) + list(range(1000, 1200))
    m = q.metrics()
    assert m["drained"] and m["expired"] == 0 and m["late_acks"] == 0 and m["done"] == len(q)


@pytest.mark.timeout(120)
def test_rows_of_the_last_items_do_not_each_ask_the_queue(tables, tmp_path):
    # Holding the last item of the epoch (nothing pending, its own lease out), the reader
    # asked the queue's backend again for every row it returned: 200+ round trips here.
    q = sf.WorkQueue(tables, name="trr-asks", backend=f"sqlite://{tmp_path}/q.db", shuffle=False,
                     poll_interval=60.0)
    takes = []
    take = q.backend.take

    def counted(*args, **kwargs):
        takes.append(1)
        return take(*args, **kwargs)

    q.backend.take = counted  # the real SQLite backend, its calls counted
    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=2, capacity=64)
    try:
        got = _run(reader, q, 1)
    finally:
        reader.close()
    assert sorted(got) == list(range(300)) + list(range(1000, 1200))
    assert q.metrics()["drained"]
    assert len(takes) <= 10, f"{len(takes)} takes for 2 items"


@pytest.mark.timeout(120)
def test_leases_are_renewed_while_the_consumer_waits_for_a_slow_query(pg_server):  # noqa: F811
    # The table is locked by another session for 3 s (a long transaction, a large OFFSET on
    # a busy server): the consumer waits that long for the item's first rows, longer than
    # its 1 s lease.
    psycopg = pytest.importorskip("psycopg")
    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (id bigint, price double precision)")
        con.execute(f"INSERT INTO {name} SELECT g, g * 0.5 FROM generate_series(0, 99) g")
    works, backend = [f"{pg_server}/{name}"], f"memory://{uuid.uuid4().hex}"
    q = sf.WorkQueue(works, name="trr-slow", backend=backend, lease_timeout=1.0)
    locker = psycopg.connect(pg_server)
    locker.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
    unlock = threading.Timer(3.0, locker.commit)
    unlock.start()
    other: list = []  # a second worker asks for work meanwhile, 2 s in

    def ask() -> None:
        w = sf.WorkQueue(works, name="trr-slow", backend=backend, lease_timeout=1.0)
        other.append(w.take(block=False))
        if other[-1] is not None:
            w.release(other[-1])

    asker = threading.Timer(2.0, ask)
    asker.start()
    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=1)
    try:
        got = _run(reader, q, 10)
    finally:
        reader.close()
        unlock.join()
        asker.join()
        locker.close()
    # before: the lease ran out while the consumer waited for the rows: the second worker
    # got the item, and its rows came twice
    assert other == [None]
    assert sorted(got) == list(range(100))
    m = q.metrics()
    assert m["drained"] and m["expired"] == 0 and m["late_acks"] == 0 and m["redelivered"] == 0

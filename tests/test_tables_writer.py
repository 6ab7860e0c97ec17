"""TableWriter on Parquet folders, DuckDB files and PostgreSQL: visibility, slices, conflicts, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from shardfeed.tables import TableWriter, WriterConflictError, read_table

duckdb = pytest.importorskip("duckdb")

SCHEMA = pa.schema([("uid", pa.int64()), ("name", pa.string()), ("price", pa.float64()), ("virtual", pa.bool_())])
ROWS = [(25, "Apple", 5.0, False), (38, "Pear", 4.5, False), (17, "Watermelon", 2.2, False)]


@pytest.fixture(params=["parquet", "duckdb", pytest.param("postgresql", marks=pytest.mark.slow)])
def table(request, tmp_path):
    if request.param == "parquet":
        return str(tmp_path / "test_write")
    if request.param == "postgresql":  # a real server (tests/conftest_pg.py), a fresh table per test
        import uuid

        import psycopg

        server = request.getfixturevalue("pg_server")
        name = f"test_write_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server, autocommit=True) as con:
            con.execute(f"CREATE TABLE {name} (uid bigint, name text, price double precision, virtual boolean)")
        return f"{server}/{name}"
    path = tmp_path / "out.db"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE test_write (uid BIGINT, name VARCHAR, price DOUBLE, virtual BOOLEAN)")
    con.close()
    return f"duckdb://{path}/test_write"


def rows_of(url):
    return sorted(tuple(v.item() if hasattr(v, "item") else v for v in r)
                  for r in read_table(url, record_defaults=[0, "", np.float64(0), False]))


def test_document_example_rows_appear_after_close(table):
    with TableWriter(table, schema=SCHEMA) as w:
        w.write(ROWS, indices=[0, 1, 2, 3])
    assert rows_of(table) == sorted(ROWS)


def test_rows_are_invisible_until_close(table):
    with TableWriter(table, schema=SCHEMA) as w:
        w.write(ROWS[0], indices=(0, 1, 2, 3))
    w = TableWriter(table, schema=SCHEMA)
    w.write(np.array([ROWS[1], ROWS[2]], dtype=object), indices=np.arange(4))
    assert rows_of(table) == [ROWS[0]]
    w.close()
    assert rows_of(table) == sorted(ROWS[1:])


def test_reopening_a_slice_empties_it_and_other_slices_keep_their_rows(table):
    with TableWriter(table, slice_id=0, schema=SCHEMA) as w0, TableWriter(table, slice_id=1, schema=SCHEMA) as w1:
        w0.write(ROWS[0], indices=[0, 1, 2, 3])
        w1.write([ROWS[1], ROWS[2]], indices=[0, 1, 2, 3])
    assert rows_of(table) == sorted(ROWS)
    with TableWriter(table, slice_id=1, schema=SCHEMA) as w1:
        w1.write((99, "Fig", 1.0, True), indices=(0, 1, 2, 3))
    assert rows_of(table) == sorted([ROWS[0], (99, "Fig", 1.0, True)])
    with TableWriter(table, slice_id=0, schema=SCHEMA):
        pass
    assert rows_of(table) == [(99, "Fig", 1.0, True)]


def test_second_writer_on_same_slice_is_refused(table):
    with TableWriter(table, slice_id=3, schema=SCHEMA):
        with pytest.raises(WriterConflictError, match="slice 3"):
            TableWriter(table, slice_id=3, schema=SCHEMA)
    TableWriter(table, slice_id=3, schema=SCHEMA).close()  # free again after close


def test_error_inside_with_block_leaves_table_unchanged(table):
    with TableWriter(table, schema=SCHEMA) as w:
        w.write(ROWS, indices=[0, 1, 2, 3])
    with pytest.raises(RuntimeError), TableWriter(table, schema=SCHEMA) as w:
        w.write((1, "x", 1.0, True), indices=[0, 1, 2, 3])
        raise RuntimeError("job failed")
    assert rows_of(table) == sorted(ROWS)


def test_partial_columns_are_null_and_bad_values_are_errors(table):
    with TableWriter(table, schema=SCHEMA) as w:
        w.write([(1, "a")], indices=[0, 1])
        with pytest.raises(ValueError, match="2 values per row but 3 indices"):
            w.write((1, 2), indices=[0, 1, 2])
        with pytest.raises(ValueError, match="past the table"):
            w.write((1,), indices=[9])
    got = list(read_table(table, record_defaults=[0, "", -1.0, True]))
    assert [tuple(r) for r in got] == [(1, "a", -1.0, True)]
    with pytest.raises(Exception, match="price"):
        with TableWriter(table, schema=SCHEMA) as w:
            w.write(("notanumber",), indices=[2])


def test_a_fraction_or_an_int_too_large_for_an_integer_column_is_refused_naming_it(table):
    """2.9 was written into a BIGINT column as 2 without a word, and 2**70 raised a bare
    OverflowError naming nothing (found from outside); whole floats (2.0) still go in."""
    from shardfeed.errors import ShardfeedError

    for bad, why in (([(2.9,)], r"2\.9 for column 'uid' is not a whole number"),
                     (np.array([[1.0], [-1.5]]), r"-1\.5 for column 'uid' is not a whole number"),
                     ([(float("nan"),)], r"nan for column 'uid' is not a whole number"),
                     ([(2 ** 70,)], r"column 'uid' do not fit its type int64")):
        with pytest.raises(ShardfeedError, match=why):
            with TableWriter(table, schema=SCHEMA) as w:
                w.write(bad, indices=[0])
    with TableWriter(table, schema=SCHEMA) as w:
        w.write([(2.0,), (np.float64(3.0),)], indices=[0])
    assert [int(r[0]) for r in read_table(table, selected_cols="uid")] == [2, 3]


CRASH = textwrap.dedent("""
    import sys, time
    from shardfeed.tables import TableWriter
    w = TableWriter(sys.argv[1], slice_id=0)
    w.write([(i, "new", 1.0, True) for i in range(100_000)], indices=[0, 1, 2, 3])
    print("written", flush=True)
    time.sleep(60)
""")


def test_killed_writer_leaves_table_as_it_was_and_frees_the_slice(table, tmp_path):
    with TableWriter(table, schema=SCHEMA) as w:
        w.write(ROWS, indices=[0, 1, 2, 3])
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, str(script), table], stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline().strip() == b"written"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert rows_of(table) == sorted(ROWS)
    # a file's lock goes with the process; a PostgreSQL advisory lock once the server notices
    # the dead client, which may take a while on a loaded machine
    deadline = time.monotonic() + (30 if table.startswith("postgresql://") else 0)
    while True:
        try:
            w = TableWriter(table, slice_id=0, schema=SCHEMA)
            break
        except WriterConflictError:
            if time.monotonic() > deadline:
                pytest.fail("slice 0 stayed locked after its writer was killed")
            time.sleep(0.1)
    with w:
        w.write((5, "after", 0.5, True), indices=[0, 1, 2, 3])
    assert rows_of(table) == [(5, "after", 0.5, True)]


def test_parquet_staged_files_are_not_read_and_new_table_infers_schema(tmp_path):
    out = tmp_path / "new"
    w = TableWriter(str(out), slice_id=2)
    w.write([(1, 0.5), (2, 1.5)])
    assert all(n.startswith((".", "_")) for n in os.listdir(out))
    w.close()
    assert sorted(os.listdir(out)) == ["_sf_writer-00002.lock", "part-00002.parquet"]
    assert read_table(str(out)).columns == ["c0", "c1"]


def test_parquet_writer_on_s3_commits_atomically(s3_bucket):
    bucket, opts = s3_bucket
    url = f"s3://{bucket}/out/pt=1"
    with TableWriter(url, slice_id=0, storage_options=opts) as w:
        w.write([(1, "a"), (2, "b")])
        with pytest.raises(WriterConflictError):
            TableWriter(url, slice_id=0, storage_options=opts)
    got = [tuple(v.item() if hasattr(v, "item") else v for v in r)
           for r in read_table(f"s3://{bucket}/out", storage_options=opts)]
    assert got == [(1, "a", 1), (2, "b", 1)]


def test_writes_in_threads_on_different_slices_do_not_conflict(table):
    import threading

    errors = []

    def work(k):
        try:
            with TableWriter(table, slice_id=k, schema=SCHEMA) as w:
                w.write([(k * 100 + i, f"s{k}", float(i), k % 2 == 0) for i in range(50)], indices=[0, 1, 2, 3])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(rows_of(table)) == 200
    _ = time


def test_a_killed_parquet_writers_staged_file_is_removed_by_the_next_writer_of_its_slice(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    stale0 = root / ".part-00000.deadbeef.abc123.tmp"  # left by a writer of slice 0 that was killed
    stale1 = root / ".part-00001.cafef00d.def456.tmp"
    stale0.write_bytes(b"half a parquet file")
    stale1.write_bytes(b"another")
    with TableWriter(str(root), slice_id=0) as w:
        w.write([(1, 2.0)], indices=[0, 1])
    assert not stale0.exists()
    assert stale1.exists()  # another slice's: its own next writer removes it
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith("_")) == [".part-00001.cafef00d.def456.tmp",
                                                                                   "part-00000.parquet"]


@pytest.mark.slow  # a PostgreSQL server, as the fixture's postgresql case
@pytest.mark.parametrize("table", ["postgresql"], indirect=True)
def test_a_slice_is_free_the_moment_its_writer_closes(table, pg_server):
    # closing released the slice's advisory lock only when the server's backend exited,
    # after close() returned: a writer of the same slice opened at once was refused (found
    # on a busy machine); a session already open asks for the lock right after each close
    import psycopg

    name = table.rsplit("/", 1)[1]
    with psycopg.connect(pg_server, autocommit=True) as probe:
        for k in range(30):
            with TableWriter(table, schema=SCHEMA) as w:
                w.write(ROWS[k % len(ROWS)], indices=(0, 1, 2, 3))
            got = probe.execute("SELECT pg_try_advisory_lock(hashtext(%s), 0)", (f"shardfeed:{name}",)).fetchone()[0]
            assert got, k
            probe.execute("SELECT pg_advisory_unlock(hashtext(%s), 0)", (f"shardfeed:{name}",))
    assert rows_of(table) == [ROWS[29 % len(ROWS)]]

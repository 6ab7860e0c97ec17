"""PostgreSQL tables against a real server (tests/conftest_pg.py starts it on 127.0.0.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from shardfeed.tables import (
    TableTypeError,
    TableWriter,
    WriterConflictError,
    read_table,
)

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def pg(pg_server):  # noqa: F811
    """A fresh table ``t_<uuid>`` with 500 rows; yields (base URL, table name)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (id bigint, name text, price double precision, ok boolean, pt int, "
                    "amount numeric, small int2)")
        con.execute(f"INSERT INTO {name} SELECT g, 'n' || g, g * 1.5, g % 2 = 0, g % 4, g / 3.0, g % 100 "
                    "FROM generate_series(0, 499) g")
    return pg_server, name


def test_reads_columns_with_types_and_defaults(pg):
    base, name = pg
    ids, names, prices, amounts = next(iter(read_table(f"{base}/{name}", record_defaults=[0, "", np.float64(0), 0.0],
                                                      selected_cols="id,name,price,amount").batch(4)))
    assert ids.tolist() == [0, 1, 2, 3] and names.tolist() == ["n0", "n1", "n2", "n3"]
    assert prices.dtype == np.float64 and amounts.dtype == np.float32
    assert amounts[3] == pytest.approx(1.0)


def test_numeric_with_a_precision_keeps_every_digit_as_duckdb_does(pg_server, tmp_path):  # noqa: F811
    """numeric(22, 3) went through float8 (12345678901234567.891 read as 1.2345678901234568e16,
    without a word, where DuckDB gives the Decimal; found from outside); a numeric without a
    precision, which no Arrow decimal holds, still reads as float64."""
    import decimal

    duckdb = pytest.importorskip("duckdb")
    name = f"n_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (v numeric(22, 3), w numeric(5, 2), x numeric)")
        con.execute(f"INSERT INTO {name} VALUES (12345678901234567.891, -1.25, 0.5), (0.001, 999.99, 2)")
    path = tmp_path / "d.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (v DECIMAL(22, 3), w DECIMAL(5, 2))")
    con.execute("INSERT INTO t VALUES (12345678901234567.891, -1.25), (0.001, 999.99)")
    con.close()
    want = [(decimal.Decimal("12345678901234567.891"), decimal.Decimal("-1.25")),
            (decimal.Decimal("0.001"), decimal.Decimal("999.99"))]
    for url in (f"{pg_server}/{name}", f"duckdb://{path}/t"):
        got = [tuple(r) for r in read_table(url, selected_cols="v,w")]
        assert got == want and all(type(v) is decimal.Decimal for r in got for v in r), (url, got)
    xs = [r[0] for r in read_table(f"{pg_server}/{name}", selected_cols="x")]
    assert xs == [0.5, 2.0] and all(type(x) is np.float64 for x in xs)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_backend_killed_mid_read_is_an_error_naming_the_table_and_a_resume_reads_the_rest(pg_server, threads):  # noqa: F811
    """pg_terminate_backend under a read surfaced as a bare psycopg AdminShutdown naming no
    table (with 3 threads also an 'Exception ignored in generator' traceback; found from
    outside): now a StorageError naming the table and the row, and the saved state resumes."""
    from shardfeed.errors import StorageError

    name = f"k_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} AS SELECT g::bigint AS id FROM generate_series(0, 199999) g")
    ds = read_table(f"{pg_server}/{name}", num_threads=threads, capacity=2000).batch(1000)
    it = iter(ds)
    got = [int(v) for v in next(it)[0]]
    state = it.get_state()
    with psycopg.connect(pg_server, autocommit=True) as con:
        killed = con.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "  # the readers'
                             "WHERE pid <> pg_backend_pid() AND datname = current_database() "  # open cursors
                             "AND xact_start IS NOT NULL").fetchone()[0]
    assert killed >= 1
    with pytest.raises(StorageError, match=rf"{name}: reading the table failed at row \d+ \(AdminShutdown"):
        for b in it:
            got += [int(v) for v in b[0]]
    it.close()
    rest = [int(v) for b in ds.iter_from_state(state) for v in b[0]]
    assert got[:1000] + rest == list(range(200000))


def test_partition_segments_filter_rows(pg):
    base, name = pg
    got = [int(r[0]) for r in read_table(f"{base}/{name}/pt=3", selected_cols="id")]
    assert got == list(range(3, 500, 4))


def test_slices_cover_every_row_once(pg):
    base, name = pg
    for k in (1, 3, 7, 64):
        parts = [[int(v) for b in read_table(f"{base}/{name}", selected_cols="id", slice_id=i, slice_count=k,
                                             num_threads=2).batch(37) for v in b[0]] for i in range(k)]
        assert [v for p in parts for v in p] == list(range(500))
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_nulls_unicode_and_type_errors(pg):
    base, name = pg
    with psycopg.connect(base, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name}_u (w text, n text)")
        con.execute(f"INSERT INTO {name}_u VALUES ('数据', '1'), (NULL, '2'), ('🙂', 'x')")
    assert [r[0] for r in read_table(f"{base}/{name}_u", record_defaults=["-", "-"])] == ["数据", "-", "🙂"]
    with pytest.raises(TableTypeError, match=r"column 'n', row 2"):
        list(read_table(f"{base}/{name}_u", record_defaults=["", 0]))
    with pytest.raises(TableTypeError, match=r"column 'w', row 1: NULL"):
        list(read_table(f"{base}/{name}_u"))


def test_empty_and_missing_tables(pg):
    base, name = pg
    with psycopg.connect(base, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name}_e (a bigint)")
    assert list(read_table(f"{base}/{name}_e", slice_id=1, slice_count=2)) == []
    with pytest.raises(FileNotFoundError):
        read_table(f"{base}/{name}_missing")


def test_writer_commits_on_close_and_slices_do_not_conflict(pg):
    base, name = pg
    url = f"{base}/{name}"
    w0 = TableWriter(url, slice_id=0)
    w1 = TableWriter(url, slice_id=1)
    with pytest.raises(WriterConflictError, match="slice 0"):
        TableWriter(url, slice_id=0)
    w0.write([(1, "a", 1.0, True, 0, 1.5, 1)], indices=range(7))
    w1.write((2, "b"), indices=[0, 1])
    assert len(list(read_table(url, selected_cols="id"))) == 500  # nothing visible yet
    w0.close()
    w1.close()
    rows = [(int(r[0]), r[1]) for r in read_table(url, selected_cols="id,name")]
    assert rows == [(1, "a"), (2, "b")]
    with TableWriter(url, slice_id=1) as w:
        w.write((3, "c"), indices=[0, 1])
    assert [(int(r[0]), r[1]) for r in read_table(url, selected_cols="id,name")] == [(1, "a"), (3, "c")]


def test_killed_writer_leaves_table_unchanged(pg, tmp_path):
    base, name = pg
    url = f"{base}/{name}"
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from shardfeed.tables import TableWriter
        w = TableWriter(sys.argv[1], slice_id=0)
        w.write([(i, "new") for i in range(70_000)], indices=[0, 1])
        print("written", flush=True)
        time.sleep(60)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline().strip() == b"written"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert [int(r[0]) for r in read_table(url, selected_cols="id")] == list(range(500))
    # the server notices the dead client and frees its lock: at once on a quiet machine, later
    # on a loaded one
    deadline = time.monotonic() + 30
    while True:
        try:
            TableWriter(url, slice_id=0).abort()
            break
        except WriterConflictError:
            if time.monotonic() > deadline:
                pytest.fail("slice 0 stayed locked 30 s after its writer was killed")
            time.sleep(0.1)


def test_tables_whose_long_names_share_a_prefix_keep_their_own_rows(pg_server):  # noqa: F811
    # PostgreSQL cuts identifiers at 63 bytes: "_sf_slices_" + these names would be cut to the same one
    stem = "t_" + uuid.uuid4().hex[:8] + "_" + "x" * 40  # names of 56-57 bytes: valid, but 67-68 with the prefix
    a, b = stem + "_alpha", stem + "_beta"
    with psycopg.connect(pg_server, autocommit=True) as con:
        for name in (a, b):
            con.execute(f'CREATE TABLE "{name}" (id bigint)')
    with TableWriter(f"{pg_server}/{a}", slice_id=0) as w:
        w.write([(1,), (2,)], indices=[0])
    with TableWriter(f"{pg_server}/{b}", slice_id=1) as w:
        w.write([(10,)], indices=[0])
    assert sorted(int(r[0]) for r in read_table(f"{pg_server}/{a}")) == [1, 2]
    assert sorted(int(r[0]) for r in read_table(f"{pg_server}/{b}")) == [10]
    with psycopg.connect(pg_server, autocommit=True) as con:
        shadows = [r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE '_sf_slices_%'")
                   .fetchall() if stem[:10] in r[0]]
    assert len(shadows) == 2 and all(len(s.encode()) <= 63 for s in shadows)


def test_count_rows_of_a_table_url(pg):
    from shardfeed.tables import count_rows

    base, name = pg
    assert count_rows(f"{base}/{name}") == 500


@pytest.mark.parametrize("password", ["se%ZZcret-9f3e", "pw-9f3e"])
def test_a_bad_connection_url_is_a_clear_error_without_the_password(pg_server, password):  # noqa: F811
    # libpq refuses the URL before connecting (a bad percent escape, an unknown option) and
    # quotes the password in its message: the error names the table and hides it
    port = pg_server.rsplit(":", 1)[1].split("/", 1)[0]
    url = f"postgresql://bob:{password}@127.0.0.1:{port}/postgres/t?bogus_option=1"
    with pytest.raises((ConnectionError, ValueError)) as info:
        read_table(url, selected_cols="id", record_defaults=[0])
    text = str(info.value)
    assert "9f3e" not in text and "bob:***@" in text, text
    assert "invalid" in text  # libpq's reason is kept


def test_views_and_partitioned_tables_are_sliced_into_every_row_once(pg_server):  # noqa: F811
    """A view has no ctid (reading one failed with the server's raw error), and the
    partitions of a partitioned table repeat each other's ctids (ORDER BY ctid alone does
    not fix the order, so LIMIT/OFFSET slices could repeat and lose rows)."""
    name = f"p_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (id bigint, part int, doc jsonb) PARTITION BY LIST (part)")
        for p in range(4):
            con.execute(f"CREATE TABLE {name}_{p} PARTITION OF {name} FOR VALUES IN ({p})")
        # rows in every partition take the same physical places: ctid (0,1), (0,2), ...
        con.execute(f"INSERT INTO {name} SELECT g, g % 4, jsonb_build_object('g', g) FROM generate_series(0, 799) g")
        con.execute(f"CREATE VIEW {name}_v AS SELECT id, doc FROM {name} WHERE id % 2 = 0")
        con.execute(f"CREATE VIEW {name}_dup AS SELECT 7::bigint AS id UNION ALL SELECT 7 UNION ALL SELECT 8")
    for table, want in ((name, list(range(800))), (f"{name}_v", list(range(0, 800, 2))), (f"{name}_dup", [7, 7, 8])):
        for k in (1, 3, 7):
            got = [int(v) for i in range(k) for b in read_table(
                f"{pg_server}/{table}", selected_cols="id", slice_id=i, slice_count=k, num_threads=2).batch(37)
                for v in b[0]]
            assert sorted(got) == want, (table, k)
            again = [int(v) for i in range(k) for b in read_table(
                f"{pg_server}/{table}", selected_cols="id", slice_id=i, slice_count=k).batch(50) for v in b[0]]
            assert again == got, (table, k)  # the same order every time


def test_a_value_the_table_refuses_is_an_error_naming_the_table_column_and_row(pg_server):  # noqa: F811
    """A string past varchar(n) and a None into a NOT NULL column were psycopg's own messages,
    naming a temporary table or no row and not the table's URL (found from outside): now a
    ShardfeedError naming the URL, the column and the row of the write, and the table is
    left as it was."""
    from shardfeed.errors import ShardfeedError

    name = f"w_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (id bigint NOT NULL, code varchar(3))")
        con.execute(f"INSERT INTO {name} VALUES (7, 'old')")
    url = f"{pg_server}/{name}"
    rows = [(k, "abc") for k in range(40)]
    for bad, words in (((40, "toolong"), ["'code'", "row 40", "character varying(3)"]),
                       ((None, "ok"), ["'id'", "row 40", "null"])):
        with pytest.raises(ShardfeedError) as err:
            with TableWriter(url) as w:
                w.write(rows + [bad] + rows)
        text = str(err.value)
        assert url.split("@")[-1] in text and all(word in text for word in words), text
        with psycopg.connect(pg_server, autocommit=True) as con:
            assert con.execute(f"SELECT id, code FROM {name}").fetchall() == [(7, "old")]
    with psycopg.connect(pg_server, autocommit=True) as con:  # a constraint only the commit's insert sees
        con.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (id)")
    with pytest.raises(ShardfeedError, match="refused the rows of slice 0 at the commit.*duplicate key") as err:
        with TableWriter(url) as w:
            w.write([(1, "a"), (1, "b")])
    assert url.split("@")[-1] in str(err.value)
    with psycopg.connect(pg_server, autocommit=True) as con:
        assert con.execute(f"SELECT id, code FROM {name}").fetchall() == [(7, "old")]

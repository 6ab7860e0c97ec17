"""read_table / TableRecordDataset on Parquet, CSV and DuckDB tables."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed.tables as sft
from shardfeed.pipeline import Dataset
from shardfeed.tables import TableTypeError, read_table, slice_range

duckdb = pytest.importorskip("duckdb")


@pytest.fixture
def db(tmp_path):
    """A DuckDB file with table ``s`` (1000 rows, pt = row % 3) and a few odd tables."""
    path = tmp_path / "w.db"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE s (itemid BIGINT, name VARCHAR, price DOUBLE, virtual BOOLEAN, pt INTEGER)")
    con.execute("INSERT INTO s SELECT range, 'n' || range, range * 1.5, range % 2 = 0, range % 3 FROM range(1000)")
    con.execute("CREATE TABLE nulls (a BIGINT, b VARCHAR, c DOUBLE)")
    con.execute("INSERT INTO nulls VALUES (1, 'x', 1.0), (NULL, NULL, NULL), (3, 'z', 3.5)")
    con.execute("CREATE TABLE words (w VARCHAR, n VARCHAR)")
    con.execute("INSERT INTO words VALUES ('héllo', '1'), ('数据', '2'), ('🙂', 'abc')")
    con.execute("CREATE TABLE empty (a BIGINT, b DOUBLE)")
    con.close()
    return f"duckdb://{path}"


def _parquet_table(root, files=3, rows=10, row_group_size=4):
    os.makedirs(root, exist_ok=True)
    start = 0
    for i in range(files):
        a = np.arange(start, start + rows, dtype=np.int64)
        pq.write_table(pa.table({"a": a, "x": a * 0.5}), f"{root}/f{i}.parquet", row_group_size=row_group_size)
        start += rows
    return start


def _all(ds):
    return [tuple(np.asarray(c).tolist() for c in b) for b in ds]


def test_read_table_is_a_pipeline_dataset_with_pai_example_semantics(db):
    ds = read_table(f"{db}/s", record_defaults=(0, 0.0), selected_cols="itemid, price")
    assert isinstance(ds, Dataset)
    ids, prices = next(iter(ds.batch(128).repeat(10)))
    assert ids.dtype == np.int64 and prices.dtype == np.float32
    assert ids.tolist() == list(range(128)) and prices[3] == pytest.approx(4.5)
    assert sum(len(b[0]) for b in ds.batch(128).repeat(10)) == 10_000


def test_rows_are_tuples_of_numpy_scalars_or_dicts(db):
    row = next(iter(read_table(f"{db}/s", selected_cols=["itemid", "name"])))
    assert row == (0, "n0")
    d = next(iter(read_table(f"{db}/s", selected_cols="itemid,name", as_dict=True)))
    assert d == {"itemid": 0, "name": "n0"}


def test_batches_have_exact_size_and_drop_remainder(db):
    sizes = [len(b[0]) for b in read_table(f"{db}/s", selected_cols="itemid").batch(300)]
    assert sizes == [300, 300, 300, 100]
    sizes = [len(b[0]) for b in read_table(f"{db}/s", selected_cols="itemid").batch(300, drop_remainder=True)]
    assert sizes == [300, 300, 300]


def test_shuffle_prefetch_map_work_on_the_source(db):
    ds = read_table(f"{db}/s", selected_cols="itemid").shuffle(100, seed=3).batch(50).prefetch(2)
    got = sorted(int(v) for b in ds for v in b[0])
    assert got == list(range(1000))
    doubled = read_table(f"{db}/s", selected_cols="itemid").batch(10).map(lambda b: b[0] * 2)
    assert next(iter(doubled)).tolist() == list(range(0, 20, 2))


def test_excluded_cols_and_both_at_once(db):
    ds = read_table(f"{db}/s", excluded_cols="name,virtual")
    assert ds.columns == ["itemid", "price", "pt"]
    with pytest.raises(ValueError, match="not both"):
        read_table(f"{db}/s", selected_cols="itemid", excluded_cols="name")
    with pytest.raises(ValueError, match=r"no column\(s\) \['nope'\]"):
        read_table(f"{db}/s", selected_cols="itemid,nope")


def test_record_defaults_count_must_match_columns(db):
    with pytest.raises(ValueError, match="record_defaults has 1 entries but 2 columns"):
        read_table(f"{db}/s", selected_cols="itemid,price", record_defaults=[0])


def test_nulls_are_filled_from_record_defaults(db):
    rows = list(read_table(f"{db}/nulls", record_defaults=[[-1], ["?"], [0.5]]))
    assert [tuple(r) for r in rows] == [(1, "x", 1.0), (-1, "?", 0.5), (3, "z", 3.5)]


def test_null_without_default_names_column_and_row(db):
    with pytest.raises(TableTypeError, match=r"column 'a', row 1: NULL") as e:
        list(read_table(f"{db}/nulls"))
    assert e.value.column == "a" and e.value.row == 1
    with pytest.raises(TableTypeError, match=r"column 'b', row 1"):
        list(read_table(f"{db}/nulls", record_defaults=[0, str, 0.0]))


def test_type_mismatch_names_column_and_row(db):
    with pytest.raises(TableTypeError, match=r"column 'n', row 2: value 'abc'"):
        list(read_table(f"{db}/words", record_defaults=["", 0]).batch(2))
    with pytest.raises(TableTypeError, match=r"column 'price', row 1: value 1.5"):
        list(read_table(f"{db}/s", selected_cols="price", record_defaults=[int]))


def test_unicode_strings_round_trip(db):
    words = [r[0] for r in read_table(f"{db}/words", record_defaults=["", ""])]
    assert words == ["héllo", "数据", "🙂"]


def test_empty_table_yields_nothing_and_slices_of_it_are_empty(db):
    assert list(read_table(f"{db}/empty").batch(4)) == []
    assert list(read_table(f"{db}/empty", slice_id=1, slice_count=3)) == []


def test_partition_url_is_a_column_filter_on_duckdb(db):
    ds = read_table(f"{db}/s/pt=2", selected_cols="itemid,pt")
    rows = [tuple(int(v) for v in r) for r in ds]
    assert len(rows) == 333 and all(pt == 2 and i % 3 == 2 for i, pt in rows)


@pytest.mark.parametrize("total", [0, 1, 7, 1000])
def test_slice_ranges_cover_every_row_once_with_sizes_within_one(total):
    for k in (1, 2, 3, 7, 16, 999, 1001):
        ranges = [slice_range(total, i, k) for i in range(k)]
        assert ranges[0][0] == 0 and ranges[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [e - s for s, e in ranges]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_slices_over_several_tables_deliver_every_row_exactly_once(db, tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    for i in range(3):  # parquet files whose column has the DuckDB table's name
        ids = np.arange(2000 + 11 * i, 2011 + 11 * i, dtype=np.int64)
        pq.write_table(pa.table({"itemid": ids}), root / f"f{i}.parquet", row_group_size=4)
    tables = [f"{db}/s", str(root), f"{db}/s/pt=1"]
    expected = list(range(1000)) + list(range(2000, 2033)) + [i for i in range(1000) if i % 3 == 1]
    for k in (1, 3, 13):
        parts = [[int(v) for b in read_table(tables, selected_cols="itemid", slice_id=i, slice_count=k).batch(50)
                  for v in b[0]] for i in range(k)]
        assert [v for p in parts for v in p] == expected, k
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_slices_of_repeated_table_are_contiguous_and_complete(db):
    tables = [f"{db}/s", f"{db}/s"]
    for k in (1, 4, 7):
        parts = [[int(v) for b in read_table(tables, selected_cols="itemid", slice_id=i, slice_count=k).batch(64)
                  for v in b[0]] for i in range(k)]
        flat = [v for p in parts for v in p]
        assert flat == list(range(1000)) * 2, k
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("threads,capacity", [(1, 0), (3, 0), (4, 100), (8, 7)])
def test_reader_threads_keep_table_order(db, tmp_path, threads, capacity):
    _parquet_table(str(tmp_path / "pq"), files=4, rows=250, row_group_size=64)
    ds = read_table(str(tmp_path / "pq"), selected_cols="a", num_threads=threads, capacity=capacity)
    assert [int(v) for b in ds.batch(33) for v in b[0]] == list(range(1000))
    ds = read_table(f"{db}/s", selected_cols="itemid", num_threads=threads, capacity=capacity,
                    slice_id=1, slice_count=3)
    assert [int(v) for b in ds.batch(10) for v in b[0]] == list(range(334, 667))


@pytest.mark.parametrize("threads", [1, 3])
def test_each_pass_reads_the_table_as_it_is_when_the_pass_starts(db, threads):
    """Rows added between two passes of one dataset are read by the second, with one reader
    thread or several, in one slice or two (with 3 threads the second pass stopped at the
    first pass's count without a word; found from outside)."""
    whole = read_table(f"{db}/s", selected_cols="itemid", num_threads=threads).batch(64)
    halves = [read_table(f"{db}/s", selected_cols="itemid", num_threads=threads, slice_id=k, slice_count=2).batch(64)
              for k in range(2)]

    def rows(ds):
        return [int(v) for b in ds for v in b[0]]
    assert rows(whole) == list(range(1000)) == sorted(rows(halves[0]) + rows(halves[1]))
    con = duckdb.connect(db.split("://", 1)[1])
    con.execute("INSERT INTO s SELECT range, 'n', 0.0, true, 0 FROM range(1000, 1300)")
    con.close()
    assert rows(whole) == list(range(1300)) == sorted(rows(halves[0]) + rows(halves[1]))


def test_argument_ranges_are_checked(db):
    for kwargs in ({"num_threads": 65}, {"num_threads": -1}, {"capacity": -5}, {"slice_id": 3, "slice_count": 3},
                   {"slice_count": 0}):
        with pytest.raises(ValueError):
            read_table(f"{db}/s", **kwargs)


def test_capacity_above_a_gigabyte_per_thread_warns(db, caplog):
    ds = read_table(f"{db}/s", selected_cols="itemid", capacity=10**9, num_threads=1)
    with caplog.at_level(logging.WARNING, logger="shardfeed.tables.reader"):
        assert len(list(ds.batch(500))) == 2
    assert "per reader thread" in caplog.text


def test_resume_from_state_continues_where_it_stopped(db):
    ds = read_table(f"{db}/s", selected_cols="itemid").batch(100)
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    state = it.get_state()
    rest = list(ds.iter_from_state(state))
    got = [int(v) for b in first + rest for v in b[0]]
    assert got == list(range(1000))


def test_a_state_resumes_only_into_the_slice_and_tables_that_saved_it(db, tmp_path):
    """A state was only {"row": n}: slice 0's state restored into slice 1 skipped slice 1's
    first rows without a word, and so did one of another table (found from outside)."""
    mine = read_table(f"{db}/s", selected_cols="itemid", slice_id=0, slice_count=2).batch(10)
    it = iter(mine)
    next(it)
    state = it.get_state()
    other_slice = read_table(f"{db}/s", selected_cols="itemid", slice_id=1, slice_count=2).batch(10)
    with pytest.raises(ValueError, match="saved by reader 0 of 2, but this is reader 1 of 2"):
        next(iter(other_slice.iter_from_state(state)))
    _parquet_table(str(tmp_path / "pq"), files=1, rows=1000)
    other_table = read_table(str(tmp_path / "pq"), selected_cols="a", slice_id=0, slice_count=2).batch(10)
    with pytest.raises(ValueError, match="saved by a reader of other files"):
        next(iter(other_table.iter_from_state(state)))
    rest = [int(v) for b in mine.iter_from_state(state) for v in b[0]]
    assert rest == list(range(10, 500))
    old = {**state, "root": {"row": state["root"]["row"]}}  # an earlier version's {"row": n}: taken as it is
    assert [int(v) for b in other_slice.iter_from_state(old) for v in b[0]][:1] == [510]


def test_hive_partitioned_parquet_and_partition_pruning(tmp_path):
    root = tmp_path / "sample"
    for pt in (20260101, 20260102):
        d = root / f"pt={pt}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"v": [pt % 100, pt % 100 + 10]}), d / "part-0.parquet")
    (root / "pt=20260103").mkdir()
    (root / "pt=20260103" / "part-0.parquet").write_bytes(b"not parquet at all")  # never opened when pruned
    (root / "_SUCCESS").write_bytes(b"")
    rows = [tuple(int(x) for x in r) for r in read_table(str(root / "pt=20260102"))]
    assert rows == [(2, 20260102), (12, 20260102)]
    assert read_table(str(root / "pt=20260101")).columns == ["v", "pt"]


def test_csv_files_and_s3_parquet(tmp_path, s3_bucket):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.csv").write_text("id,name,score\n1,ä,0.5\n2,b,\n")
    (tmp_path / "c" / "b.csv").write_text("id,name,score\n3,c,1.5\n")
    rows = list(read_table(str(tmp_path / "c"), record_defaults=[0, "", -1.0]))
    assert [tuple(r) for r in rows] == [(1, "ä", 0.5), (2, "b", -1.0), (3, "c", 1.5)]
    assert [int(r[0]) for r in read_table(str(tmp_path / "c"), selected_cols="id", slice_id=1, slice_count=2)] == [3]
    bucket, opts = s3_bucket
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": opts["endpoint_url"]})
    with fs.open(f"{bucket}/t/pt=7/x.parquet", "wb") as f:
        pq.write_table(pa.table({"a": [1, 2, 3]}), f)
    ds = read_table(f"s3://{bucket}/t", storage_options=opts, slice_id=1, slice_count=2)
    assert [tuple(int(x) for x in r) for r in ds] == [(3, 7)]


def test_same_table_twice_and_tables_with_different_columns(db, tmp_path):
    assert len(list(read_table([f"{db}/s", f"{db}/s"], selected_cols="itemid").batch(1000))) == 2
    with pytest.raises(ValueError, match="has no column"):
        read_table([f"{db}/s", f"{db}/nulls"], selected_cols="itemid")


def test_missing_table_and_pai_names(db, tmp_path):
    with pytest.raises(FileNotFoundError):
        read_table(f"{db}/nope")
    with pytest.raises(FileNotFoundError):
        read_table(str(tmp_path / "nothing"))
    ds = sft.TableRecordDataset(filenames=[f"{db}/s"], record_defaults=[0], selected_cols="itemid", excluded_cols=None,
                                slice_id=0, slice_count=2, num_threads=2, capacity=64)
    assert ds.num_rows() == 500


def test_none_and_empty_list_keep_the_table_type_and_make_null_an_error(db):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # None is not deprecated in read_table: it is its meaning
        for spelling in (None, []):
            rows = list(read_table(f"{db}/s", selected_cols="itemid,price,name", record_defaults=[spelling, 0.0, spelling]))
            assert type(rows[1][0]) is np.int64 and type(rows[1][1]) is np.float32 and rows[1][2] == "n1"
            with pytest.raises(TableTypeError, match=r"column 'c', row 1: NULL"):
                list(read_table(f"{db}/nulls", record_defaults=[0, "", spelling]))
    with pytest.raises(ValueError, match=r"record_defaults\[0\] is a list of 2 values.*\[\] \(no default\)"):
        read_table(f"{db}/nulls", record_defaults=[[1, 2], 0, 0])


# -- the reader threads are a pipeline WorkerPool (issue 18 #3) ---------------------------------
def test_reader_threads_are_a_worker_pool_that_close_stops_and_joins(db):
    from tests.test_pipeline_helpers import started_since, wait_threads_back_to

    before = set(threading.enumerate())
    it = iter(read_table([f"{db}/s"] * 4, selected_cols="itemid", num_threads=4, capacity=40).batch(10))
    assert [int(v) for v in next(it)[0]] == list(range(10))
    mine = started_since(before)
    assert mine and all(t.name.startswith("shardfeed-table-reader-") for t in mine)  # blocked on full queues
    it.close()
    assert wait_threads_back_to(before) == []
    it.close()  # idempotent


def test_an_error_in_a_later_thread_arrives_after_the_rows_before_it(db):
    from tests.test_pipeline_helpers import wait_threads_back_to

    con = duckdb.connect(db[len("duckdb://"):])
    con.execute("CREATE TABLE good (n VARCHAR)")
    con.execute("INSERT INTO good SELECT CAST(range AS VARCHAR) FROM range(300)")
    con.execute("CREATE TABLE bad (n VARCHAR)")
    con.execute("INSERT INTO bad VALUES ('7'), ('x')")
    con.close()
    before = set(threading.enumerate())
    got = []
    with pytest.raises(TableTypeError, match=r"bad: column 'n', row 1: value 'x'"):
        for row in read_table([f"{db}/good", f"{db}/good", f"{db}/bad"], record_defaults=[0], num_threads=3):
            got.append(int(row[0]))
    assert got == list(range(300)) * 2  # the third thread failed first; its error waits for its turn
    assert wait_threads_back_to(before) == []


def test_csv_tables_with_cells_longer_than_a_block_are_read_and_bad_lines_name_the_file(tmp_path, monkeypatch):
    from shardfeed.errors import ShardfeedError
    from shardfeed.tables import parquet as files_backend

    big = "b" * 9_000_000  # past pyarrow's blocks: "straddling object straddles two block boundaries"
    rows = [f"{i},{'x' * (i % 7)}" for i in range(3000)] + [f"3000,{big}", "3001,y"]
    (tmp_path / "t.csv").write_text("id,text\n" + "\n".join(rows) + "\n")
    (tmp_path / "first.csv").write_text(f"id,text\n0,{big}\n1,y\n")  # in the block the columns are typed from
    assert [int(r[0]) for r in read_table(str(tmp_path / "first.csv"), record_defaults=[0, ""])] == [0, 1]
    for batch in (None, 4):  # small batches read small blocks
        ds = read_table(str(tmp_path / "t.csv"), record_defaults=[0, ""])
        got = [(int(i), t) for b in ds.batch(batch or 1000) for i, t in zip(*b)]
        assert [i for i, _ in got] == list(range(3002)) and len(got[3000][1]) == len(big) and got[3001][1] == "y"
    # past the bound, an error naming the file instead of pyarrow's own
    monkeypatch.setattr(files_backend, "CSV_BLOCK_LIMIT", 4 << 20)
    with pytest.raises(ShardfeedError, match=r"t\.csv: a row after row 3000 is longer than"):
        list(read_table(str(tmp_path / "t.csv"), record_defaults=[0, ""]).batch(4))
    (tmp_path / "bad.csv").write_text("id,text\n1,a\n2,b,extra\n")
    with pytest.raises(ShardfeedError, match=r"bad\.csv: .*Expected 2 columns, got 3"):
        list(read_table(str(tmp_path / "bad.csv"), record_defaults=[0, ""]))
    (tmp_path / "latin.csv").write_bytes(b"id,pr\xefx\n1,2\n")  # a bare UnicodeDecodeError naming no file before
    with pytest.raises(ShardfeedError, match=r"latin\.csv: the header is not UTF-8 text .* at byte 2 of a column name"):
        read_table(str(tmp_path / "latin.csv"))


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path):
    """read_table gave the first column's cells under both names."""
    path = tmp_path / "dup.csv"
    path.write_text("id,id\n1,2\n")
    with pytest.raises(ValueError, match=r"dup\.csv: the header names column 'id' twice"):
        list(read_table(str(path)))


def test_slices_of_a_duckdb_view_deliver_every_row_once(tmp_path):
    """A view's rows may come in another order in every query (a hash aggregate's), so
    LIMIT/OFFSET slices of it repeated and lost rows (3,595 of 5,000 keys once in 7 slices)."""
    path = tmp_path / "v.db"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT g AS id, g % 5000 AS k FROM range(1000000) r(g)")
    con.execute("CREATE VIEW v AS SELECT k AS id, count(*) AS n FROM t GROUP BY k")
    con.close()
    for _ in range(3):
        got = [int(v) for i in range(7) for b in read_table(
            f"duckdb://{path}/v", selected_cols="id", slice_id=i, slice_count=7).batch(1000) for v in b[0]]
        assert sorted(got) == list(range(5000))


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_far_larger_than_the_first_ones_do_not_fill_the_read_ahead_with_them(tmp_path, monkeypatch, threads):
    """The automatic read-ahead sized its chunks (in rows) and its depth (in chunks) from
    the first 256 rows: rows 256 times larger after them filled the whole depth (16 MB rows
    after small ones: about 2 GB a thread, found from outside). The queue now counts bytes
    and the chunks are cut to fit once one comes out too large. Measured with the read-ahead
    at 64 KB a thread and rows of 8 KB after 300 of 32 bytes: what the reader holds at its
    peak (numpy arrays and bytes objects, traced), against the chunks of the old plan."""
    import tracemalloc

    from shardfeed.tables import reader as reader_module

    monkeypatch.setattr(reader_module, "AUTO_BYTES_PER_THREAD", 64 << 10)
    values = [b"s" * 24] * 300 + [b"b" * 8192 + b"%d" % k for k in range(6000)]
    pq.write_table(pa.table({"k": np.arange(6300), "v": values}), tmp_path / "skew.parquet", row_group_size=500)
    ds = read_table(str(tmp_path / "skew.parquet"), num_threads=threads)
    plan_rows = ds._per_thread_rows()  # the rows of a chunk the first rows give: about 2,000
    assert plan_rows > 1000
    tracemalloc.start()
    try:
        keys = [int(k) for k, _ in ds]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert keys == list(range(6300))
    # before: chunks of about 1,800 rows of 8 KB (15 MB), one in the queue, one being made, one
    # being read (30-37 MB at the peak); now one such chunk, then chunks of 64 KB (12.6 MB)
    assert peak < 1.5 * plan_rows * 8192, (peak, plan_rows)

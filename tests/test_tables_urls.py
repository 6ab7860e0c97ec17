"""Table URL parsing and backend routing."""

from __future__ import annotations

import importlib.util

import pytest

from shardfeed.tables import parse_table_url, read_table
from shardfeed.tables.urls import is_table_url, table_urls


def test_duckdb_url_splits_file_table_and_partitions():
    t = parse_table_url("duckdb:///data/wh.db/sample/pt=20260101/hh=3")
    assert (t.kind, t.location, t.table) == ("duckdb", "/data/wh.db", "sample")
    assert t.partitions == (("pt", "20260101"), ("hh", "3"))


def test_postgres_url_keeps_connection_and_masks_password():
    t = parse_table_url("postgresql://bob:s3cret@db.example:5433/prod/public.events/day=2026-01-01?sslmode=require")
    assert t.kind == "postgresql" and t.table == "public.events"
    assert t.location == "postgresql://bob:s3cret@db.example:5433/prod?sslmode=require"
    assert t.partitions == (("day", "2026-01-01"),)
    assert "s3cret" not in t.masked
    assert parse_table_url("postgres://u@h:1/db/t").kind == "postgresql"


def test_odps_url_parses_project_table_and_partition():
    t = parse_table_url("odps://algo_platform_dev/tables/sample/pt=1")
    assert (t.kind, t.location, t.table, t.partitions) == ("odps", "algo_platform_dev", "sample", (("pt", "1"),))
    with pytest.raises(ValueError, match="odps://project/tables/name"):
        parse_table_url("odps://proj/sample")


def test_file_urls_strip_trailing_partition_folders():
    t = parse_table_url("oss://bucket/warehouse/sample/pt=20260101")
    assert (t.kind, t.location, t.partitions) == ("files", "oss://bucket/warehouse/sample", (("pt", "20260101"),))
    local = parse_table_url("/data/table/a=1/b=x%2Fy")
    assert local.location == "/data/table" and local.partitions == (("a", "1"), ("b", "x/y"))
    assert parse_table_url("s3://b/t/part.parquet").partitions == ()


@pytest.mark.parametrize("bad", ["duckdb:///only.db", "postgresql://h/db", "duckdb:///x.db/bad-name", "",
                                 "postgresql://u@h/db/t;drop"])
def test_malformed_table_urls_are_rejected(bad):
    with pytest.raises(ValueError):
        parse_table_url(bad)


def test_comma_separated_pai_tables_string_is_split():
    assert table_urls("odps://p/tables/a,odps://p/tables/b") == ["odps://p/tables/a", "odps://p/tables/b"]
    assert table_urls(["x", "x"]) == ["x", "x"]


@pytest.mark.skipif(importlib.util.find_spec("odps") is not None, reason="pyodps is installed")
def test_odps_without_pyodps_says_what_to_install():
    with pytest.raises(ImportError, match="pip install pyodps"):
        read_table("odps://proj/tables/sample/pt=1")


# -- one answer to "is this URL a table?" (issue 18 #3) ---------------------------------------
@pytest.mark.parametrize("url, table", [
    ("data/t.csv", True), ("s3://b/t.CSV", True), ("t.csv.gz", True), ("t.tsv", True), ("/x/t.tsv.gz", True),
    ("t.parquet", True), ("t.pq", True), ("oss://b/t.parq?endpoint=e", True), ("s3://b/t.parquet/pt=1", True),
    ("duckdb:///wh.db/t", True), ("postgresql://u@h:1/db/t", True), ("POSTGRES://u@h:1/db/t", True),
    ("odps://p/tables/t/pt=1", True),
    ("t.tfrecord", False), ("s3://b/t.tfrecord.gz?x=1", False), ("s3://b/csv/part-0", False),
    ("sqlite:///q.db", False), ("data/", False),
])
def test_is_table_url_is_the_one_rule(url, table):
    from shardfeed.distributed.items import make_items

    assert is_table_url(url) is table
    assert make_items([url], None)[0].kind == ("rows" if table else "file")  # the queue asks the same function


def _table_files(tmp_path, rows):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    t = pa.table({"id": pa.array(rows, pa.int64()), "price": pa.array([i * 0.5 for i in rows])})
    csv, parquet = tmp_path / "t.csv", tmp_path / "t.parquet"
    pacsv.write_csv(t.slice(0, 40), csv)
    pq.write_table(t.slice(40, 30), parquet)
    return [str(csv), str(parquet)], t.slice(70)


def _read_queue_as_tables(works, num_slices, name):
    import shardfeed as sf

    q = sf.WorkQueue(works, num_slices=num_slices, name=name, backend=f"memory://{name}")
    items = q.items
    reader = sf.TableRecordReader(selected_cols="id")
    got = []
    producer = q.input_producer()
    while len(values := reader.read_up_to(producer, 16)[1]):
        got += [int(v) for v in values]
    reader.close()
    return items, got


@pytest.mark.parametrize("num_slices", [None, 9])
def test_csv_parquet_and_duckdb_tables_in_a_work_queue_are_read_as_tables(tmp_path, num_slices):
    duckdb = pytest.importorskip("duckdb")
    files, rest = _table_files(tmp_path, list(range(100)))
    con = duckdb.connect(str(tmp_path / "w.db"))
    con.execute("CREATE TABLE d AS SELECT * FROM rest")  # rows 70..99
    con.close()
    works = [*files, f"duckdb://{tmp_path}/w.db/d"]
    items, got = _read_queue_as_tables(works, num_slices, f"tq{num_slices}")
    assert {it.kind for it in items} == {"rows"}
    csv_items = [it for it in items if it.work.endswith(".csv")]
    if num_slices is None:
        assert len(items) == 3 and (csv_items[0].start, csv_items[0].stop) == (None, None)
    else:  # the CSV file is cut into row ranges too, like the others
        assert len(csv_items) == 4 and [(it.start, it.stop) for it in csv_items] == [(0, 10), (10, 20), (20, 30),
                                                                                     (30, 40)]
    assert sorted(got) == list(range(100))  # every row once, none read as a record file


def test_a_table_item_is_refused_by_the_record_reader_naming_the_table_reader(tmp_path):
    import shardfeed as sf

    files, _ = _table_files(tmp_path, list(range(70)))
    q = sf.WorkQueue(files[:1], name="tq-rec", backend="memory://tq-rec")
    with pytest.raises(ValueError, match=r"t\.csv is a table item: read it with"):
        list(sf.read_tfrecord(q))


@pytest.mark.slow
def test_a_postgresql_table_in_a_work_queue_is_read_as_a_table(tmp_path, pg_server):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(pg_server, autocommit=True) as con:
        con.execute("DROP TABLE IF EXISTS tq_pg")
        con.execute("CREATE TABLE tq_pg AS SELECT g::bigint AS id, g * 0.5 AS price FROM generate_series(70, 99) g")
    files, _ = _table_files(tmp_path, list(range(100)))
    items, got = _read_queue_as_tables([*files, f"{pg_server}/tq_pg"], 6, "tq-pg")
    assert {it.kind for it in items} == {"rows"} and len(items) == 6
    assert sorted(got) == list(range(100))


@pytest.mark.parametrize("url", [
    "postgresql://bob:pa/ss-9f3e@localhost:5432/db/table",   # a raw '/' in the password
    "postgresql://bob:pa/ss-9f3e@localhost:5432/db",          # ... that leaves two segments
    "postgresql://bob:pa/ss-9f3e@h/db/public.t/pt=1",
    "postgres://bob:a@b/ss-9f3e@h/db/t/x",                    # '@' and '/' in it
    "postgresql://bob:pass-9f3e@h:5432/db/t/u/v",             # too many segments
    "postgresql://bob:pass-9f3e@h:5432/db/bad-name",          # not a table name
])
def test_a_malformed_postgres_url_never_shows_its_password(url):
    with pytest.raises(ValueError) as info:
        parse_table_url(url)
    text = str(info.value)
    assert "9f3e" not in text and "pa/ss" not in text and "bob:***@" in text, text
    if "/ss-9f3e@" in url:  # says what is wrong and how to write it
        assert "%2F" in text


def test_a_table_urls_repr_and_str_hide_the_password():
    t = parse_table_url("postgresql://bob:s3cr%2Ft-9f3e@h:5432/db/t")
    assert t.location == "postgresql://bob:s3cr%2Ft-9f3e@h:5432/db"  # percent-encoded: accepted as is
    for text in (repr(t), str(t), f"{t}", repr([t])):
        assert "s3cr" not in text and "9f3e" not in text and "bob:***@h:5432" in text, text


def test_mask_hides_a_password_with_a_raw_slash_and_the_password_alone_when_given():
    from shardfeed.storage.urls import mask

    assert mask("postgresql://bob:pa/ss/x@h:1/db/t failed") == "postgresql://bob:***@h:1/db/t failed"
    assert mask("https://u:p/w@host/obj?X-Amz-Signature=abc&x=1") == "https://u:***@host/obj?X-Amz-Signature=***&x=1"
    # a library may quote the password without its URL: the URL's own secrets are hidden too
    assert mask('invalid percent-encoded token: "se%ZZcret"', also=("se%ZZcret",)) == \
        'invalid percent-encoded token: "***"'


def test_a_parsed_storage_urls_repr_hides_signatures_and_passwords():
    from shardfeed.storage.urls import parse_url

    for url in ("https://u:pw-9f3e@host/o?X-Amz-Signature=sig-9f3e&x=1",
                "oss://bucket/key?endpoint=e.example&OSSAccessKeyId=id-9f3e&Signature=sig-9f3e"):
        text = repr(parse_url(url))
        assert "9f3e" not in text and "ParsedURL(" in text, text

"""PAI's IO forms (issue 14 items 3-5): OSS URLs with the endpoint in the host or the
query, role_arn; the job's --buckets/--tables/--outputs/--checkpointDir flags;
TableRecordReader rows as delimited strings fed to decode_csv, from tables and a WorkQueue."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import shardfeed as sf
from shardfeed import storage
from shardfeed.formats.example import encode_example
from shardfeed.pipeline.csv import CsvError
from shardfeed.storage.urls import parse_url

duckdb = pytest.importorskip("duckdb")


# -- 3. OSS URL forms --------------------------------------------------------------------------
def test_the_endpoint_in_the_host_becomes_the_endpoint_and_the_bucket_is_the_first_label():
    p = parse_url("oss://bkt.oss-cn-hangzhou.aliyuncs.com/data/part-0.tfrecord")
    assert p.path == "bkt/data/part-0.tfrecord" and dict(p.query) == {"endpoint": "oss-cn-hangzhou.aliyuncs.com"}
    assert p.with_path("bkt/data/part-1.tfrecord") == \
        "oss://bkt/data/part-1.tfrecord?endpoint=oss-cn-hangzhou.aliyuncs.com"
    same = parse_url("oss://bkt.oss-cn-hangzhou.aliyuncs.com/x?endpoint=oss-cn-hangzhou.aliyuncs.com")
    assert same.path == "bkt/x"
    with pytest.raises(ValueError, match="differ"):
        parse_url("oss://bkt.oss-cn-hangzhou.aliyuncs.com/x?host=oss-cn-beijing.aliyuncs.com")
    # s3 bucket names may hold dots: only oss:// reads a host there
    assert parse_url("s3://my.bucket/key").path == "my.bucket/key"


def test_role_arn_is_accepted_dropped_and_explained_once(caplog):
    from shardfeed.storage import urls

    urls._role_arn_told = False
    with caplog.at_level(logging.WARNING, logger="shardfeed.storage.urls"):
        p = parse_url("oss://bkt/path/?role_arn=acs:ram::123:role/aliyunodpspaidefaultrole&host=oss-cn-beijing.aliyuncs.com")
        parse_url("oss://bkt/other/?role_arn=acs:ram::123:role/x&host=oss-cn-beijing.aliyuncs.com")
    assert dict(p.query) == {"host": "oss-cn-beijing.aliyuncs.com"}
    told = [r for r in caplog.records if "role_arn" in r.getMessage()]
    assert len(told) == 1 and "OSS_ACCESS_KEY_ID" in told[0].getMessage()


def test_every_storage_function_reads_the_pai_host_form(s3_bucket, tmp_path):
    bucket, opts = s3_bucket
    records = [encode_example({"x": [i]}) for i in range(20)]
    for k in range(2):
        sf.write_records(f"s3://{bucket}/train/part-{k}.tfrecord", records[k * 10:(k + 1) * 10],
                         storage_options=opts)
    storage.write_bytes(f"s3://{bucket}/train/labels.txt", b"a\nb\n", opts)
    # the endpoint named by the host; the loopback server stands in for it (storage_options win)
    base = f"oss://{bucket}.oss-cn-hangzhou.aliyuncs.com/train/"
    so = {"endpoint_url": opts["endpoint_url"]}
    assert storage.read_bytes(base + "labels.txt", storage_options=so) == b"a\nb\n"
    assert storage.exists(base + "labels.txt", so)
    found = storage.glob(base + "part-*.tfrecord", so)
    assert [u.split("?")[0] for u in found] == [f"oss://{bucket}/train/part-{k}.tfrecord" for k in range(2)]
    assert list(sf.read_tfrecord(base + "part-*.tfrecord", storage_options=so)) == records
    assert [r.rstrip("\n") for r in sf.read_text(base + "labels.txt", storage_options=so)] == ["a", "b"]


# -- 4. job flags --------------------------------------------------------------------------------
def test_pai_flags_parse_a_job_command_line():
    argv = [
        "--buckets=oss://bkt.oss-cn-beijing-internal.aliyuncs.com/data,oss://other/?role_arn=acs:ram::1:role/r&host=oss-cn-beijing.aliyuncs.com",
        "--tables", "odps://prj/tables/train,odps://prj/tables/eval/pt=20240101/ds=2/",
        "-Doutputs=odps://prj/tables/scores",
        "--checkpointDir=oss://bkt.oss-cn-beijing-internal.aliyuncs.com/ckpt/",
        "--learning_rate=0.1", "--epochs", "3",
    ]
    f = sf.pai_flags(argv)
    assert f.buckets == ["oss://bkt.oss-cn-beijing-internal.aliyuncs.com/data/",
                         "oss://other/?role_arn=acs:ram::1:role/r&host=oss-cn-beijing.aliyuncs.com"]
    assert f.tables == ["odps://prj/tables/train", "odps://prj/tables/eval/pt=20240101/ds=2"]
    assert f.outputs == ["odps://prj/tables/scores"]
    assert f.checkpointDir == f.checkpoint_dir == "oss://bkt.oss-cn-beijing-internal.aliyuncs.com/ckpt/"
    assert f.rest == ["--learning_rate=0.1", "--epochs", "3"]
    from shardfeed.tables.urls import parse_table_url

    t = parse_table_url(f.tables[1])
    assert t.kind == "odps" and t.table == "eval" and t.partitions == (("pt", "20240101"), ("ds", "2"))
    assert parse_url(f.buckets[0] + "train/part-0.tfrecord").path == "bkt/data/train/part-0.tfrecord"


@pytest.mark.parametrize("argv, error", [
    (["--tables=train"], "not a URL"),
    (["--checkpointDir=oss://a/x/,oss://b/y/"], "one URL"),
    (["--buckets"], "needs a value"),
    (["--buckets=http://example.com/x"], "not an object-store URL"),
])
def test_pai_flags_refuse_what_a_job_could_not_use(argv, error):
    with pytest.raises(ValueError, match=error):
        sf.pai_flags(argv)


# -- 5. decode_csv and TableRecordReader ----------------------------------------------------------
def test_decode_csv_matches_tensorflow():
    tf = pytest.importorskip("tensorflow")
    lines = ["1;0.5;abc;x", "2;;def;y", "-3;1e3;\"q;uoted\";z"]
    defaults = [[0], [0.25], [""], ["d"]]
    ours = sf.decode_csv(lines, defaults, field_delim=";")
    theirs = tf.io.decode_csv(lines, [[np.int64(0)], [0.25], [""], ["d"]], field_delim=";")
    assert ours[0].dtype == np.int64 and ours[1].dtype == np.float32
    for a, b in zip(ours, theirs):
        b = b.numpy()
        if b.dtype == object:
            b = np.array([v.decode() for v in b], dtype=object)
        np.testing.assert_array_equal(a, b)
    # bytes lines, select_cols, and a bad field named by record and column
    a, c = sf.decode_csv([b"1,2,3", b"4,5,6"], [0, 0], select_cols=[0, 2])
    assert a.tolist() == [1, 4] and c.tolist() == [3, 6]
    with pytest.raises(CsvError, match="line 2, column 1.*cannot parse 'x'"):
        sf.decode_csv(["1,2", "3,x"], [0, 0])
    with pytest.raises(CsvError, match="required field is empty"):
        sf.decode_csv(["1,"], [0, []])


@pytest.fixture
def tables(tmp_path):
    path = tmp_path / "t.db"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE a (id BIGINT, kv VARCHAR, price DOUBLE, ok BOOLEAN)")
    con.execute("INSERT INTO a SELECT range, 'k' || range || ':0.5', range * 0.25, range % 2 = 0 FROM range(0, 250)")
    con.execute("CREATE TABLE b (id BIGINT, kv VARCHAR, price DOUBLE, ok BOOLEAN)")
    con.execute("INSERT INTO b SELECT range, NULL, range * 0.25, range % 3 = 0 FROM range(1000, 1130)")
    con.close()
    return [f"duckdb://{path}/a", f"duckdb://{path}/b"]


def _expected(rows_a=range(0, 250), rows_b=range(1000, 1130)):
    out = [(i, f"k{i}:0.5", i * 0.25, i % 2 == 0) for i in rows_a]
    out += [(i, "", i * 0.25, i % 3 == 0) for i in rows_b]
    return out


def _decode(values, delim):
    ids, kv, price, ok = sf.decode_csv(values, [0, "", np.float64(0), False], field_delim=delim)
    return list(zip(ids.tolist(), kv.tolist(), price.tolist(), ok.tolist()))


@pytest.mark.parametrize("num_threads", [0, 2])
def test_table_record_reader_gives_delimited_rows_that_decode_csv_types_back(tables, num_threads):
    reader = sf.TableRecordReader(csv_delimiter=";", num_threads=num_threads, capacity=64)
    got_keys, got = [], []
    while True:
        keys, values = reader.read_up_to(tables, 100)
        if not len(keys):
            break
        assert len(keys) == len(values) <= 100
        got_keys += keys.tolist()
        got += _decode(values, ";")
    reader.close()
    assert got == _expected()
    assert got_keys[0].endswith("/a:0") and got_keys[250].endswith("/b:0") and len(set(got_keys)) == 380


def test_read_up_to_returns_fewer_rows_only_at_the_end_and_read_raises_after_it(tables):
    reader = sf.TableRecordReader(selected_cols="id,price")
    sizes = []
    while len(keys := reader.read_up_to(tables[1], 60)[0]):
        sizes.append(len(keys))
    assert sizes == [60, 60, 10]
    with pytest.raises(EOFError):
        reader.read(tables[1])
    key, value = sf.TableRecordReader(excluded_cols=["kv", "ok"], csv_delimiter="|").read(tables)
    assert value == "0|0" and key.endswith("/a:0")  # 0.0 as its shortest text


def test_table_record_reader_over_a_work_queue_of_row_ranges(tables):
    q = sf.WorkQueue(tables, num_slices=6, name="trr", backend="memory://trr",
                     row_counts={tables[0]: 250, tables[1]: 130})
    producer = q.input_producer()
    reader = sf.TableRecordReader()
    got = []
    while len(values := reader.read_up_to(producer, 64)[1]):
        got += _decode(values, ",")
    assert sorted(got) == sorted(_expected())  # every row once, in the queue's order of items
    m = q.metrics()
    assert m["in_flight"] == 0 and m["pending"] == 0 and m["done"] >= 6  # every item acknowledged


def test_table_record_reader_refuses_bad_arguments(tables):
    with pytest.raises(ValueError, match="csv_delimiter"):
        sf.TableRecordReader(csv_delimiter=";;")
    with pytest.raises(ValueError, match="not both"):
        sf.TableRecordReader(selected_cols="a", excluded_cols="b")
    with pytest.raises(ValueError, match="no column"):
        sf.TableRecordReader(selected_cols="nope").read_up_to(tables, 1)

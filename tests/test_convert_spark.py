"""The Spark runner on ``local-cluster[2,1,1024]``: two executor JVMs with their own Python
workers, as on a cluster. The same records as the local runner for every input kind, a
killed executor mid-job, resume, shard sizing, and the errors for a wrong master or no Java.

One SparkSession for the whole session (starting one takes ~15 s here); few jobs per test.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("pyspark")
pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
from PIL import Image

from shardfeed.cli import convert_cmd
from shardfeed.convert import api as sc
from shardfeed.convert.runner_spark import spark_session
from shardfeed.formats.tfrecord import read_records

from .test_convert_annotations import jpeg, pai_csv
from .test_convert_runners import dataset, output_bytes

pytestmark = pytest.mark.slow
MASTER = "local-cluster[2,1,1024]"
OPTS = {"test_ratio": 0.5, "num_samples_per_tfrecord": 3, "max_image_size": 40, "progress": False}
JAVA = shutil.which("java") or os.environ.get("JAVA_HOME")


@pytest.fixture(scope="session")
def spark():
    if not JAVA:
        pytest.skip("no Java here (scripts/system-deps.sh test installs default-jre-headless): Spark cannot start")
    session = spark_session(MASTER)
    yield session
    session.stop()


def split_records(out):
    """{split: sorted list of record bytes}: what a conversion wrote, order aside."""
    m = sc.load_manifest(out)
    return {k: sorted(r for s in v["shards"] for r in read_records(os.path.join(out, s["file"])))
            for k, v in m["splits"].items()}


def discards(out):
    """(source, reason) of every discarded row; a DataFrame row named by its position
    (which a repartition changes) named by its DataFrame only."""
    with open(os.path.join(out, "data-discards.csv"), encoding="utf-8") as f:
        return sorted((d["source"].split("#")[0], d["reason"]) for d in csv.DictReader(f))


def same_output(a, b):
    """The two outputs hold the same files with the same bytes, and manifests that differ
    only in how they were produced (runner; the source digest's composition)."""
    fa, ma = output_bytes(a)
    fb, mb = output_bytes(b)
    for m in (ma, mb):
        m.pop("source"), m.pop("plan_digest")
    assert sorted(fa) == sorted(fb)
    assert [n for n in fa if fa[n] != fb[n]] == []
    assert ma == mb


def test_spark_writes_what_the_local_runner_writes_for_csv_parquet_dataframe_folder_and_annotations(spark, tmp_path):
    src = dataset(tmp_path, n=14, bad=(3,))
    with open(src, "a", newline="") as f:
        f.write("TRAIN,img/0.jpg\n")  # a row with 2 cells: discarded by both, with the same reason
    local = str(tmp_path / "local")
    res = sc.convert(src, local, **OPTS)
    assert res.splits["train"]["records"] > 0 and res.splits["test"]["records"] > 0
    # CSV read by Spark: byte for byte the local runner's shards, index files and discard report
    out = str(tmp_path / "spark_csv")
    got = sc.convert(src, out, runner="spark", **OPTS)
    assert got.rows_read == 15 and got.rows_discarded == 2
    same_output(local, out)
    # Parquet, and a folder of Parquet parts as Spark writes it
    table = pd.read_csv(src, keep_default_na=False, dtype=str, nrows=14)
    table = table.assign(image_uri=[str(tmp_path / u) for u in table.image_uri])
    table.to_parquet(tmp_path / "a.parquet")
    sc.convert(str(tmp_path / "a.parquet"), str(tmp_path / "local_pq"), **OPTS)
    sc.convert(str(tmp_path / "a.parquet"), str(tmp_path / "spark_pq"), runner="spark", **OPTS)
    same_output(str(tmp_path / "local_pq"), str(tmp_path / "spark_pq"))
    # a Spark DataFrame in more partitions than shards: the same records per split, in
    # ceil(rows / num_samples_per_tfrecord) shards per split, not one (tiny) shard per partition
    with_null = pd.concat([table, pd.DataFrame([{"split": "", "image_uri": None, "label": "c0"}])])
    df = spark.createDataFrame(with_null).repartition(9)
    assert df.rdd.getNumPartitions() == 9
    out = str(tmp_path / "spark_df")
    got = sc.convert(df, out, **OPTS)
    want = sc.convert(with_null, str(tmp_path / "local_df"), **OPTS)
    assert split_records(out) == split_records(str(tmp_path / "local_df"))
    assert discards(out) == discards(str(tmp_path / "local_df"))
    assert got.manifest["counts"] == want.manifest["counts"] and got.manifest["runtime"]["runner"] == "spark"
    for split, info in got.splits.items():
        assert len(info["shards"]) == -(-info["rows"] // 3), split
        assert [s["rows"] for s in info["shards"][:-1]] == [3] * (len(info["shards"]) - 1)
    # an image folder (label/file) with a corrupt image
    for label in ("x", "y"):
        for i in range(4):
            p = tmp_path / "folder" / label / f"{i}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((20, 30, 3), 40 * i, np.uint8)).save(p)
    (tmp_path / "folder" / "y" / "9.jpg").write_bytes(b"not a jpeg")
    sc.convert(str(tmp_path / "folder"), str(tmp_path / "local_folder"), **OPTS)
    got = sc.convert(str(tmp_path / "folder"), str(tmp_path / "spark_folder"), runner="spark", **OPTS)
    assert got.rows_discarded == 1
    same_output(str(tmp_path / "local_folder"), str(tmp_path / "spark_folder"))
    # a PAI annotation CSV (DETECTION) with a corrupt image
    a, b = jpeg(tmp_path / "a.jpg"), jpeg(tmp_path / "b.jpg")
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 truncated")
    box = [{"text": '{"class*": "car"}', "coord": ["10", "10", "90", "10", "90", "60", "10", "60"]}]
    ann = pai_csv(tmp_path / "ann.csv", [(a, box), (b, box), (str(tmp_path / "bad.jpg"), box), (a, box)])
    sc.convert_annotations(ann, str(tmp_path / "local_ann"), model_type="DETECTION", **OPTS)
    got = sc.convert_annotations(ann, str(tmp_path / "spark_ann"), model_type="DETECTION", runner="spark", **OPTS)
    assert got.rows_discarded == 1 and got.records_written == 3
    same_output(str(tmp_path / "local_ann"), str(tmp_path / "spark_ann"))


def test_an_image_folder_is_listed_by_the_executors_and_gives_the_local_runners_output(spark, tmp_path):
    from shardfeed.convert.runner_spark import open_source

    root = tmp_path / "folder"
    files = [f"train/{label}/{i}.jpg" for label in ("cat", "dog", "emu") for i in range(5)]
    files += ["TEST/cat/t0.jpg", "TEST/dog/t1.jpg", "validation/cat/v0.jpg", "train/loose.jpg", "train/cat/deep/d.jpg",
              "train/.cache/h.jpg", "readme.jpg"]
    for i, f in enumerate(files):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((20, 30, 3), 7 * i, np.uint8)).save(root / f)
    (root / "train" / "dog" / "9.jpg").write_bytes(b"not a jpeg")
    (root / "empty").mkdir()
    src = open_source(spark, str(root), None, None, True)
    # the driver listed the top level and the split folders: one entry per label folder or file there
    assert src.kind == "folder" and src.with_split
    assert sorted(tuple(r["parts"]) for r in src.frame.collect()) == [
        ("TEST", "cat"), ("TEST", "dog"), ("empty",), ("readme.jpg",), ("train", "cat"), ("train", "dog"),
        ("train", "emu"), ("train", "loose.jpg"), ("validation", "cat")]
    want = sc.convert(str(root), str(tmp_path / "local"), **OPTS)
    got = sc.convert(str(root), str(tmp_path / "spark"), runner="spark", **OPTS)
    assert got.rows_discarded == want.rows_discarded == 4  # loose.jpg, deep/d.jpg, readme.jpg, the bad image
    same_output(str(tmp_path / "local"), str(tmp_path / "spark"))
    assert discards(str(tmp_path / "spark")) == discards(str(tmp_path / "local"))


def test_many_small_partitions_give_few_shards_sized_by_rows_or_bytes_as_the_local_runner(spark, tmp_path):
    from .test_convert_shard_bytes import SCHEMA, table

    pdf = table(1_200)
    # 40 partitions of 30 rows, in the pandas DataFrame's order
    rows = list(pdf.itertuples(index=False, name=None))
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 40), list(pdf.columns))
    assert df.rdd.getNumPartitions() == 40
    opts = {"schema": SCHEMA, "test_ratio": 0.2, "progress": False}
    for name, extra in (("rows", {"num_samples_per_tfrecord": 256}),
                        ("bytes", {"num_samples_per_tfrecord": 256, "bytes_per_tfrecord": 32768})):
        local, out = str(tmp_path / f"local_{name}"), str(tmp_path / f"spark_{name}")
        want = sc.convert(pdf, local, **opts, **extra)
        got = sc.convert(df, out, **opts, **extra)
        shards = {k: [s["rows"] for s in v["shards"]] for k, v in got.splits.items()}
        assert shards == {k: [s["rows"] for s in v["shards"]] for k, v in want.splits.items()}
        assert sum(len(v) for v in shards.values()) <= 8  # not one shard per partition
        assert split_records(out) == split_records(local)
        same_output(local, out)  # the same rows in the same order: byte for byte the local runner's shards
        if name == "rows":
            assert shards["train"][0] == 256
        else:
            per = shards["train"][0]
            assert 100 < per < 256 and len(shards["train"]) > 3
            sizes = [os.path.getsize(os.path.join(out, s["file"])) for s in got.splits["train"]["shards"][:-1]]
            assert all(0.9 * 32768 < x < 1.1 * 32768 for x in sizes), sizes


def _job_stages(ctx, group):
    """Per job of ``group``, in order: the task count of each of its stages."""
    tracker = ctx.statusTracker()
    return [[tracker.getStageInfo(s).numTasks for s in sorted(tracker.getJobInfo(j).stageIds)]
            for j in sorted(tracker.getJobIdsForGroup(group))]


def test_a_small_one_file_csv_is_read_in_a_partition_per_core_and_gives_the_local_runners_shards(spark, tmp_path):
    # about 225 KB: one Spark split under the default openCostInBytes (4 MiB), so job 1 ran
    # in one task on one of the two executor cores; now one per core
    rng = np.random.default_rng(3)
    src = tmp_path / "t.csv"
    with open(src, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "f0", "f1", "name"])
        for i in range(6_000):
            w.writerow([("a", "b", "c", "bad")[i % 4 if i % 97 == 0 else i % 3], *np.round(rng.normal(size=2), 5),
                        f"row {i} " + "x" * (i % 17)])
            if i == 3_000:
                f.write("a,1.0\n")  # a row with too few cells: discarded in job 1
    assert 200_000 < os.path.getsize(src) < 4 << 20
    # one shard per split, so each is written by one task: its rows, from both job-1
    # partitions, are converted on job 2's map side; "bad" rows are discarded there
    opts = {"schema": {"label": "string label", "f0": "float", "f1": "float", "name": "string"},
            "test_ratio": 0.2, "num_samples_per_tfrecord": 10_000, "error_class": "bad", "progress": False}
    conf = spark.conf.get("spark.sql.files.openCostInBytes")
    ctx = spark.sparkContext
    group = f"small-csv-{os.getpid()}"
    ctx.setJobGroup(group, "test: a small CSV")
    try:
        got = sc.convert(str(src), str(tmp_path / "spark"), runner="spark", **opts)
    finally:
        ctx.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert spark.conf.get("spark.sql.files.openCostInBytes") == conf  # the session's setting, restored
    stages = _job_stages(ctx, group)
    assert stages[0] == [ctx.defaultParallelism] and ctx.defaultParallelism == 2  # job 1: a task per core
    want = sc.convert(str(src), str(tmp_path / "local"), **opts)
    assert got.rows_read == want.rows_read == 6_001
    assert got.rows_discarded == want.rows_discarded == 1 + sum(1 for i in range(0, 6_000, 97) if i % 4 == 3)
    assert [len(v["shards"]) for v in got.splits.values()] == [1, 1]
    same_output(str(tmp_path / "local"), str(tmp_path / "spark"))


def test_write_tasks_are_one_per_core_at_least_and_more_only_while_each_keeps_enough_rows():
    from shardfeed.convert.spark_write import WRITE_TASK_ROWS, WRITE_TASKS_PER_CORE, write_tasks

    assert write_tasks(79, 2, 5_000) == 5_000 // WRITE_TASK_ROWS == 4  # 5,000 images: 2 a core, not 8
    assert write_tasks(79, 2, 300) == 2  # a small input: still one per core
    assert write_tasks(313, 2, 20_000) == WRITE_TASKS_PER_CORE * 2  # a large one: at most 4 a core
    assert write_tasks(3, 8, 100_000) == 3  # never more than the shards
    assert write_tasks(1, 0, 0) == 1


def test_write_task_chunks_never_span_two_shards_and_keep_every_item_in_order():
    from shardfeed.convert.spark_write import _chunked

    items = [("shard", 0), *[("row", p, f"a{p}") for p in range(5)], ("shard", 1), ("row", 0, "b0"),
             ("conv", 1, None, ([b"r"], None)), ("row", 2, "b2"), ("shard", 2), ("row", 0, None)]
    assert list(_chunked(items, 2)) == [
        ("shard", 0), ("rows", [0, 1], ["a0", "a1"]), ("rows", [2, 3], ["a2", "a3"]), ("rows", [4], ["a4"]),
        ("shard", 1), ("rows", [0], ["b0"]), ("conv", 1, None, ([b"r"], None)), ("rows", [2], ["b2"]),
        ("shard", 2), ("rows", [0], [None])]


def test_an_image_conversion_runs_two_spark_jobs_and_leaves_the_sessions_settings_as_they_were(spark, tmp_path,
                                                                                               monkeypatch):
    from shardfeed.convert import spark_write
    from shardfeed.convert.spark_session import ADAPTIVE, session_conf
    from shardfeed.convert.spark_write import write_tasks

    src = dataset(tmp_path, n=14, bad=(3,))
    ctx = spark.sparkContext
    before = spark.conf.get(ADAPTIVE)
    for setting in (None, "true"):  # unset (Spark's default: on), then set by the user
        # job 2's map side places the rows in SQL, then (too many constants) in Python
        monkeypatch.setattr(spark_write, "SQL_PLACE_MAX", 4096 if setting is None else 0)
        if setting is None:
            spark.conf.unset(ADAPTIVE)
        else:
            spark.conf.set(ADAPTIVE, setting)
        group = f"two-jobs-{setting}-{os.getpid()}"
        ctx.setJobGroup(group, "test: the jobs of a conversion")
        try:
            got = sc.convert(src, str(tmp_path / f"spark-{setting}"), runner="spark", **OPTS)
        finally:
            ctx.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        assert (ADAPTIVE in spark.conf.getAll) == (setting is not None)
        assert spark.conf.get(ADAPTIVE) == "true"
        # job 1, then one write job (adaptive execution ran its shuffle's map stage as a
        # job of its own): the map stage over job 1's partitions, then the write tasks
        stages = _job_stages(ctx, group)
        shards = sum(len(v["shards"]) for v in got.splits.values())
        assert len(stages) == 2 and stages[1] == [stages[0][0], write_tasks(shards, 2, 14)] == [stages[0][0], 2]
    want = str(tmp_path / "local")
    sc.convert(src, want, **OPTS)
    same_output(want, str(tmp_path / "spark-None"))
    same_output(want, str(tmp_path / "spark-true"))
    # a setting is restored when the block fails too
    with pytest.raises(KeyError), session_conf(spark, {ADAPTIVE: "false"}):
        assert spark.conf.get(ADAPTIVE) == "false"
        raise KeyError("failed inside")
    assert spark.conf.get(ADAPTIVE) == "true"
    spark.conf.set(ADAPTIVE, before)


def test_only_a_local_master_gets_the_jit_of_short_jobs():
    from shardfeed.convert.spark_session import JVM_OPTIONS, session_settings

    for master in ("local", "local[*]", "local[2]", "local-cluster[2,1,1024]"):
        got = session_settings(master, "python3")
        assert got["spark.driver.defaultJavaOptions"] == got["spark.executor.defaultJavaOptions"] == JVM_OPTIONS
    for master in ("spark://10.0.0.1:7077", "yarn", "k8s://https://k8s.example:443", "mesos://m:5050"):
        got = session_settings(master, "python3")  # a cluster admin's default Java options stay
        assert not any("JavaOptions" in k for k in got), got
        assert got["spark.pyspark.python"] == "python3"


def test_a_session_shardfeed_starts_runs_its_driver_and_executor_jvms_with_the_jit_of_short_jobs(spark):
    from shardfeed.convert.spark_session import JVM_OPTIONS

    conf = spark.sparkContext.getConf()
    # Spark's default Java options, so a user's extraJavaOptions come after them and win
    assert conf.get("spark.driver.defaultJavaOptions") == conf.get("spark.executor.defaultJavaOptions") == JVM_OPTIONS
    with open(f"/proc/{spark.sparkContext._gateway.proc.pid}/cmdline", "rb") as f:
        assert JVM_OPTIONS.encode() in f.read().split(b"\0")

    def executor_args(_):
        from tests.spark_helpers import executor_jvm_pid

        with open(f"/proc/{executor_jvm_pid()}/cmdline", "rb") as f:
            yield f.read().split(b"\0")

    got = spark.sparkContext.parallelize(range(2), 2).mapPartitions(executor_args).collect()
    assert len(got) == 2 and all(JVM_OPTIONS.encode() in args for args in got)


def test_spark_byte_sizes_are_read_as_spark_writes_them():
    from shardfeed.convert.spark_session import byte_size

    assert [byte_size(t) for t in ("4194304", "4MB", "4m", "128k", "128KB", "1g", "0")] == [
        4 << 20, 4 << 20, 4 << 20, 128 << 10, 128 << 10, 1 << 30, 0]


def test_resume_on_spark_rewrites_only_the_shards_not_committed(spark, tmp_path):
    src = dataset(tmp_path, n=12, bad=())
    out = str(tmp_path / "out")
    first = sc.convert(src, out, runner="spark", **OPTS)
    written = output_bytes(out)
    names = [s["file"] for sp in first.splits.values() for s in sp["shards"]]
    assert len(names) >= 3
    lost = names[1]  # as if the driver died before this task's commit
    os.unlink(os.path.join(out, lost))
    os.unlink(os.path.join(out, f".data-state/{lost}.json"))
    inodes = {n: os.stat(os.path.join(out, n)).st_ino for n in names if n != lost}
    mtimes = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in names if n != lost}
    again = sc.convert(src, out, runner="spark", resume=True, **OPTS)
    assert os.path.exists(os.path.join(out, lost))
    assert {n: os.stat(os.path.join(out, n)).st_ino for n in inodes} == inodes
    assert {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in mtimes} == mtimes
    assert again.manifest == first.manifest and output_bytes(out) == written
    # without resume (here through the CLI, on the running session) every shard is written again
    assert convert_cmd.main(["convert", src, out, "--runner", "spark", "--test_ratio", "0.5",
                             "--num_samples_per_tfrecord", "3", "--max_image_size", "40", "-q"]) == 0
    assert all(os.stat(os.path.join(out, n)).st_ino != inodes[n] for n in inodes)
    assert output_bytes(out) == written


def test_a_killed_executor_mid_job_still_gives_every_record_exactly_once(spark, tmp_path):
    n = 16
    src = dataset(tmp_path, n=n, bad=(2,))
    marker = str(tmp_path / "killed")
    opts = {"model_type": "SELF_DEFINED", "converter_class": "tests.spark_helpers:KillingConverter",
            "converter_options": {"marker": marker, "kill_row": 7}, "num_samples_per_tfrecord": 4,
            "progress": False}
    out = str(tmp_path / "out")
    res = sc.convert(src, out, runner="spark", **opts)
    with open(marker) as f:
        pid = int(f.read())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the executor really died
    assert res.rows_read == n and res.records_written == n - 1 and res.rows_discarded == 1
    ids = sorted(r for r in split_records(out)["train"])
    assert len(ids) == len(set(ids)) == n - 1
    want = str(tmp_path / "local")
    sc.convert(src, want, **{**opts, "converter_options": {"marker": marker, "kill_row": 7}})
    assert split_records(out) == split_records(want)
    # no partial shard, no staging file left: only what the manifest lists
    listed = {s["file"] for s in res.splits["train"]["shards"]}
    assert set(os.listdir(out)) == listed | {f + ".idx" for f in listed} | {
        "data-manifest.json", "data-discards.csv", ".data-state"}
    assert all(not n.endswith(".tmp") for n in os.listdir(os.path.join(out, ".data-state")))


def test_write_tasks_each_write_a_run_of_shards_and_a_killed_one_still_writes_every_record_once(spark, tmp_path):
    # 30 one-row shards on 2 executor cores: at most 8 write tasks (4 per core), each
    # writing several shards in turn; one executor killed mid-job
    n = 30
    src = dataset(tmp_path, n=n, bad=(2,))
    marker = str(tmp_path / "killed")
    opts = {"model_type": "SELF_DEFINED", "converter_class": "tests.spark_helpers:KillingConverter",
            "converter_options": {"marker": marker, "kill_row": 20}, "num_samples_per_tfrecord": 1,
            "progress": False}
    ctx = spark.sparkContext
    group = f"write-tasks-{os.getpid()}"
    ctx.setJobGroup(group, "test: write tasks")
    try:
        res = sc.convert(src, str(tmp_path / "out"), runner="spark", **opts)
    finally:
        ctx.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    tracker = ctx.statusTracker()
    stages = [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup(group)
              for s in tracker.getJobInfo(j).stageIds]
    shards = len(res.splits["train"]["shards"])
    assert shards == n
    assert max(st.numTasks for st in stages if st is not None) <= 8 < shards
    assert os.path.exists(marker)  # the executor was killed
    assert res.rows_read == n and res.records_written == n - 1 and res.rows_discarded == 1
    ids = split_records(str(tmp_path / "out"))["train"]
    assert len(ids) == len(set(ids)) == n - 1
    want = str(tmp_path / "local")
    sc.convert(src, want, **opts)
    assert split_records(str(tmp_path / "out")) == split_records(want)
    same_output(want, str(tmp_path / "out"))


def test_a_dataframe_out_of_a_shuffle_has_its_partitions_sorted_by_content_and_one_of_files_keeps_its_order(
        spark, tmp_path):
    from pyspark.sql import functions as F

    from shardfeed.convert.spark_source import stable_order

    table = pd.DataFrame({"a": [f"r{i:02}" for i in range(40)], "n": list(range(40))})
    table.to_csv(tmp_path / "t.csv", index=False)
    plain = spark.createDataFrame(table)
    files = spark.read.option("header", "true").csv(str(tmp_path / "t.csv"))
    assert stable_order(plain) is plain and stable_order(files) is files  # their order: the local runner's
    with_map = plain.select("a", F.create_map("a", "n").alias("m"))  # a map column: sorted by its JSON text
    cached = plain.repartition(3).cache()  # a lost cached block is computed again by its plan: sorted too
    for df in (plain.repartition(3), plain.repartition(3, "a"), with_map.repartition(2), cached,
               spark.createDataFrame(spark.sparkContext.parallelize([(1, "x")] * 4, 2).repartition(3), "k int, v string")):
        got = stable_order(df)
        assert got is not df and got.rdd.getNumPartitions() == df.rdd.getNumPartitions()
        parts = [[tuple(r)[0] for r in p] for p in got.rdd.glom().collect()]
        assert sum(map(len, parts)) == df.count() and all(p == sorted(p) for p in parts)
    cached.unpersist()


def _kill_an_executor_once_writing(ctx, group, killed, stop):
    """Watches ``group``'s jobs; once the write stage (job 2's last, named after
    runner_spark.py) has finished two tasks and runs more, SIGKILLs one executor JVM of
    the driver (from outside, as a lost machine) and puts its pid in ``killed``."""
    import signal

    from .spark_helpers import executor_jvms

    tracker = ctx.statusTracker()
    while not stop.wait(0.02):
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            stages = [tracker.getStageInfo(s) for s in sorted(info.stageIds)] if info else []
            last = stages[-1] if stages else None
            if last is None or "runner_spark" not in last.name or len(stages) < 2:
                continue
            if last.numCompletedTasks >= 2 and last.numActiveTasks > 0:
                pid = executor_jvms(ctx._gateway.proc.pid)[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return


def test_an_executor_killed_mid_write_of_a_repartitioned_dataframe_costs_a_retry_and_writes_each_row_once(
        spark, tmp_path, monkeypatch):
    # issue 36: a DataFrame whose partitions come out of a shuffle (here repartition(n))
    # holds its rows in the order its blocks were fetched; job 1 numbered them in that
    # order, so after a lost executor the recomputed partitions placed other rows at the
    # same positions, job 2's map output changed, and Spark aborted the job ("A shuffle map
    # stage with indeterminate output was failed and retried") since it cannot roll back a
    # write stage with finished tasks
    import threading

    from shardfeed.convert import spark_write
    from shardfeed.formats.example_decode import decode_example

    monkeypatch.setattr(spark_write, "WRITE_TASK_ROWS", 4)  # 8 write tasks: a kill finds some finished, more to run
    n = 48
    src = dataset(tmp_path, n=n, bad=())
    table = pd.read_csv(src, keep_default_na=False, dtype=str)
    table = table.assign(image_uri=[str(tmp_path / u) for u in table.image_uri])
    # 12 slices round-robined into 6 partitions: a partition's rows come from 12 blocks,
    # in the order they are fetched
    rows = list(table.itertuples(index=False, name=None))
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 12), list(table.columns)).repartition(6)
    opts = {"model_type": "SELF_DEFINED", "converter_class": "tests.spark_helpers:SlowConverter",
            "converter_options": {"sleep": 0.05}, "num_samples_per_tfrecord": 2, "test_ratio": 0.25,
            "progress": False}
    ctx = spark.sparkContext
    group = f"kill-outside-{os.getpid()}"
    killed: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_an_executor_once_writing, args=(ctx, group, killed, stop), daemon=True)
    ctx.setJobGroup(group, "test: an executor killed from outside")
    watcher.start()
    out = str(tmp_path / "out")
    try:
        res = sc.convert(df, out, **opts)
    finally:
        stop.set()
        watcher.join()
        ctx.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert killed, "the write stage ended before an executor could be killed"
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)  # the executor really died
    # every input row once, read back with shardfeed
    assert res.rows_read == n and res.records_written == n and res.rows_discarded == 0
    ids = sorted(decode_example(r)["image/source_id"][0].decode() for v in split_records(out).values() for r in v)
    assert ids == sorted(table.image_uri)
    want = str(tmp_path / "local")
    sc.convert(table, want, **opts)
    assert split_records(out) == split_records(want)
    # no partial shard, no staging file left: only what the manifest lists
    listed = {s["file"] for sp in res.splits.values() for s in sp["shards"]}
    assert set(os.listdir(out)) == listed | {f + ".idx" for f in listed} | {
        "data-manifest.json", "data-discards.csv", ".data-state"}
    assert all(not name.endswith(".tmp") for name in os.listdir(os.path.join(out, ".data-state")))


def _convert_in_subprocess(tmp_path, code, env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env=env, cwd=str(tmp_path))


def test_no_java_and_a_wrong_master_are_one_clear_error_each(tmp_path):
    src = dataset(tmp_path, n=2, bad=())
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_PYTHON", "SPARK_HOME")}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(sc.__file__.rsplit(os.sep, 1)[0]))
    code = ("import sys\nfrom shardfeed.convert import api as sc\n"
            "try:\n"
            f"    sc.convert({src!r}, 'out', runner='spark', spark_master=sys.argv[1] if len(sys.argv) > 1 else None,"
            " progress=False)\n"
            "except (RuntimeError, ValueError) as e:\n"
            "    print('ERROR', e)\n")
    no_java = dict(env, PATH=os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                             if not os.path.exists(os.path.join(p, "java"))))
    r = _convert_in_subprocess(tmp_path, code, no_java)
    assert "ERROR runner='spark' needs Java 17" in r.stdout, r.stdout + r.stderr
    with socket_closed_port() as port:
        r = subprocess.run([sys.executable, "-c", code, f"spark://127.0.0.1:{port}"], capture_output=True,
                           text=True, timeout=240, env=env, cwd=str(tmp_path))
    assert f"ERROR cannot reach the Spark master 'spark://127.0.0.1:{port}'" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", code, "nonsense://x"], capture_output=True, text=True,
                       timeout=240, env=env, cwd=str(tmp_path))
    assert "ERROR spark_master 'nonsense://x' is not a Spark master URL" in r.stdout, r.stdout + r.stderr
    if JAVA:
        # a master of the right form that Spark still refuses: Spark's reason, in one error
        r = subprocess.run([sys.executable, "-c", code, "local[x]"], capture_output=True, text=True,
                           timeout=240, env=env, cwd=str(tmp_path))
        assert "ERROR Spark did not start on master 'local[x]'" in r.stdout, r.stdout + r.stderr


class socket_closed_port:
    """A loopback port nothing listens on (bound, then closed)."""

    def __enter__(self):
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc):
        return False

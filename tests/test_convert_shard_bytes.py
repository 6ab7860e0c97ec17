"""``bytes_per_tfrecord``: shards sized by bytes in the local runner (the Spark runner's
test of the same option is in test_convert_spark.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

from shardfeed.cli import convert_cmd
from shardfeed.convert import api as sc
from shardfeed.formats.tfrecord import read_records

SCHEMA = {"label": "integer label", "x": "float", "name": "string"}


def table(n: int = 600) -> pd.DataFrame:
    """Rows whose records vary in size (a name of 50 to 149 characters), seeded."""
    rng = np.random.default_rng(3)
    return pd.DataFrame({"label": [str(i % 5) for i in range(n)], "x": [f"{v:.3f}" for v in rng.normal(size=n)],
                         "name": ["n" * int(k) for k in rng.integers(50, 150, n)]})


def shard_files(out):
    m = sc.load_manifest(out)
    return {split: [(s["file"], s["rows"], os.path.getsize(os.path.join(out, s["file"]))) for s in info["shards"]]
            for split, info in m["splits"].items()}


def records(out):
    m = sc.load_manifest(out)
    return {k: sorted(r for s in v["shards"] for r in read_records(os.path.join(out, s["file"])))
            for k, v in m["splits"].items()}


def test_bytes_per_tfrecord_gives_shards_of_about_that_size_with_the_same_records(tmp_path):
    df = table()
    opts = {"schema": SCHEMA, "test_ratio": 0.2, "num_samples_per_tfrecord": 256, "progress": False}
    by_rows = str(tmp_path / "rows")
    sc.convert(df, by_rows, **opts)
    assert [len(v) for v in shard_files(by_rows).values()] == [2, 1]  # 600 rows, 256 a shard: few, big shards
    by_bytes = str(tmp_path / "bytes")
    res = sc.convert(df, by_bytes, bytes_per_tfrecord=4096, **opts)
    files = shard_files(by_bytes)
    per = files["train"][0][1]
    assert 10 < per < 256
    for split, shards in files.items():
        assert [rows for _, rows, _ in shards[:-1]] == [per] * (len(shards) - 1), split
        assert 0 < shards[-1][1] <= per
        for name, _, size in shards[:-1]:
            assert 0.8 * 4096 < size < 1.2 * 4096, (name, size)
    assert len(files["train"]) == -(-res.splits["train"]["rows"] // per)
    assert records(by_bytes) == records(by_rows)  # only the layout moved
    # a target above what num_samples_per_tfrecord rows hold: num_samples_per_tfrecord decides
    big = str(tmp_path / "big")
    sc.convert(df, big, bytes_per_tfrecord=10 << 20, **opts)
    assert [[rows for _, rows, _ in v] for v in shard_files(big).values()] == \
        [[rows for _, rows, _ in v] for v in shard_files(by_rows).values()]


def test_bytes_per_tfrecord_from_the_cli_and_bad_values(tmp_path):
    src = tmp_path / "t.csv"
    table(300).to_csv(src, index=False)
    out = str(tmp_path / "out")
    args = ["convert", str(src), out, "--schema", "label:integer label,x:float,name:string", "--bytes_per_tfrecord",
            "2048", "-q"]
    assert convert_cmd.main(args) == 0
    sizes = [size for shards in shard_files(out).values() for _, _, size in shards[:-1]]
    assert sizes and all(0.7 * 2048 < s < 1.3 * 2048 for s in sizes)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="bytes_per_tfrecord must be a positive int"):
            sc.convert(table(5), str(tmp_path / "bad"), schema=SCHEMA, bytes_per_tfrecord=bad, progress=False)

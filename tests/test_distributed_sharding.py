"""Static sharding: file strategies when files do not divide evenly, record and row ranges,
equal steps per rank, and rank/world size from the environment."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from shardfeed.distributed import default_strategy, equal_counts, plan_shards, plan_sizes, read_shard, resolve_slice
from shardfeed.distributed.ranks import _from_env, _from_tf_config

from .test_workqueue_support import make_shards

FILES = [f"memory://d/f{i}.tfrecord" for i in range(7)]


def _names(plan):
    return [[str(it) for it in part] for part in plan]


def test_even_split_is_round_robin_for_every_strategy():
    for strategy in ("shuffle", "uneven", "drop"):
        plan = _names(plan_shards(FILES[:6], 3, strategy=strategy))
        assert plan == [[FILES[0], FILES[3]], [FILES[1], FILES[4]], [FILES[2], FILES[5]]]


def test_shuffle_strategy_gives_everyone_everything_in_its_own_seeded_order():
    plan = _names(plan_shards(FILES, 3, strategy="shuffle", seed=11))
    assert all(sorted(p) == sorted(FILES) for p in plan)
    assert len({tuple(p) for p in plan}) == 3
    assert plan == _names(plan_shards(FILES, 3, strategy="shuffle", seed=11))
    assert plan != _names(plan_shards(FILES, 3, strategy="shuffle", seed=12))


def test_uneven_strategy_gives_some_workers_one_file_more():
    plan = _names(plan_shards(FILES, 3, strategy="uneven"))
    assert [len(p) for p in plan] == [3, 2, 2]
    assert sorted(sum(plan, [])) == sorted(FILES)


def test_drop_strategy_leaves_the_remainder_out(caplog):
    plan = _names(plan_shards(FILES, 3, strategy="drop"))
    assert [len(p) for p in plan] == [2, 2, 2] and FILES[6] not in sum(plan, [])
    assert "left out" in caplog.text


def test_fewer_files_than_workers_only_shuffle_works():
    with pytest.raises(ValueError, match="strategy='shuffle'"):
        plan_shards(FILES[:2], 4, strategy="uneven")
    assert all(len(p) == 2 for p in plan_shards(FILES[:2], 4, strategy="shuffle"))


def test_whale_environment_variables_choose_the_default():
    assert default_strategy({}) == "shuffle"
    assert default_strategy({"WHALE_DROP_LAST_FILES": "True"}) == "drop"
    assert default_strategy({"WHALE_UNBALANCED_IO_SLICING": "true", "WHALE_DROP_LAST_FILES": "True"}) == "uneven"


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16, 64, 100])
def test_record_ranges_cover_every_record_once(tmp_path, count):
    paths, records = make_shards(tmp_path, [7, 0, 13, 5, 20])
    plan = plan_shards(paths, count, by="record")
    sizes = plan_sizes(plan)
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(records)
    got = []
    for r in range(count):
        got += list(read_shard(paths, slice_id=r, slice_count=count, by="record"))
    assert Counter(got) == Counter(records)


def test_record_ranges_drop_gives_everyone_the_same(tmp_path):
    paths, records = make_shards(tmp_path, [7, 13, 5])
    sizes = plan_sizes(plan_shards(paths, 4, by="record", strategy="drop"))
    assert sizes == [len(records) // 4] * 4


def test_row_ranges_through_row_counts():
    tables = ["duckdb:///w.db/a", "duckdb:///w.db/b"]
    plan = plan_shards(tables, 3, by="row", row_counts={tables[0]: 10, tables[1]: 5})
    assert [(it.work, it.kind, it.start, it.stop) for it in plan[1]] == [(tables[0], "rows", 5, 10)]
    with pytest.raises(ValueError, match="row_counts"):
        plan_shards(tables, 3, by="row", row_counts={})


@pytest.mark.parametrize("mode", ["pad", "min"])
def test_equal_steps_make_every_rank_yield_the_same_count(tmp_path, mode):
    paths, records = make_shards(tmp_path, [7, 13, 5, 2, 9], index=False)
    counts = []
    for r in range(3):
        ds = read_shard(paths, slice_id=r, slice_count=3, strategy="uneven", equal_steps=mode)
        got = list(ds)
        counts.append(len(got))
        assert set(got) <= set(records)
    sizes = plan_sizes(plan_shards(paths, 3, strategy="uneven"))
    assert counts == [max(sizes) if mode == "pad" else min(sizes)] * 3
    assert len(set(list(read_shard(paths, slice_id=2, slice_count=3, strategy="uneven", equal_steps="min")))) \
        == min(sizes)


def test_equal_steps_cannot_pad_an_empty_rank():
    with pytest.raises(ValueError, match="min"):
        equal_counts([3, 0], "pad")
    assert equal_counts([3, 0], "min") == 0 and equal_counts([1, 2], None) is None


def test_static_shard_resumes_from_its_state(tmp_path):
    paths, _ = make_shards(tmp_path, [6, 6])
    ds = read_shard(paths, slice_id=0, slice_count=1)
    it = iter(ds)
    head = [next(it) for _ in range(8)]
    rest = list(ds.iter_from_state(it.get_state()))
    assert head + rest == list(ds)


def test_rank_from_tf_config_env_and_arguments():
    cfg = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1", "d:1"], "ps": ["p:1"]},
           "task": {"type": "worker", "index": 1}}
    assert _from_tf_config({"TF_CONFIG": json.dumps(cfg)}) == (2, 4)
    cfg["task"] = {"type": "ps", "index": 0}
    assert _from_tf_config({"TF_CONFIG": json.dumps(cfg)}) is None
    assert _from_env({"RANK": "3", "WORLD_SIZE": "8"}) == (3, 8)
    assert _from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert resolve_slice(env={}) == (0, 1)
    assert resolve_slice(1, 2) == (1, 2)
    with pytest.raises(ValueError, match="both"):
        resolve_slice(1, None)
    with pytest.raises(ValueError, match="slice_id < slice_count"):
        resolve_slice(2, 2)


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_rank_from_torch_distributed_when_initialized(tmp_path):
    pytest.importorskip("torch")
    code = (
        "import os, torch.distributed as dist\n"
        "from shardfeed.distributed import resolve_slice\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0, world_size=1)\n"
        "os.environ['RANK'] = '5'; os.environ['WORLD_SIZE'] = '9'\n"
        "print(resolve_slice())\n"
        "dist.destroy_process_group()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(0, 1)"


def test_table_rows_are_counted_without_row_counts(tmp_path):
    import duckdb

    from shardfeed.tables import count_rows

    path = tmp_path / "w.db"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE a AS SELECT range AS x FROM range(10)")
    con.execute("CREATE TABLE b AS SELECT range AS x FROM range(30)")
    con.close()
    tables = [f"duckdb://{path}/a", f"duckdb://{path}/b"]
    assert [count_rows(t) for t in tables] == [10, 30]
    plan = plan_shards(tables, 4, by="row")  # no row_counts: counted through shardfeed.tables
    assert [sum(it.size for it in items) for items in plan] == [10, 10, 10, 10]

"""`shardfeed bench peers`: shardfeed beside the other loaders, one table (benchmarks/peers/)."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from shardfeed.cli import bench_cmd
from shardfeed.cli.main import main


def _peers_module(name: str):
    folder = str(bench_cmd.benchmarks_dir() / "peers")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # every installed peer writes its data and runs each workload in its own process
def test_quick_run_has_a_row_per_installed_peer_and_workload_with_every_record_once(tmp_path):
    out = tmp_path / "peers.json"
    rc = main(["bench", "peers", "--quick", "--json", str(out)])
    res = json.loads(out.read_text())
    run = _peers_module("run")
    common = _peers_module("common")
    rows = {(r["peer"], r["workload"]): r for r in res["rows"]}
    ctx = common.Ctx(root=str(tmp_path), ctr_records=res["sizes"]["ctr_records"], images=res["sizes"]["images"])
    expected_rows = set()
    for peer, status in res["peers"].items():
        mod = run.load(peer)
        if mod.available():
            assert status["skipped"] and status["version"] is None, peer
            assert not any(p == peer for p, _ in rows), f"{peer} is not installed but has rows"
            continue
        assert status["version"], peer
        for w, why in mod.supports().items():
            if why:
                assert status["unsupported"][w] == why
                continue
            expected_rows |= {(peer, "e1"), (peer, "e2")} if w == "e" else {(peer, w)}
    assert ("shardfeed", "a") in expected_rows
    assert set(rows) == expected_rows
    for key, r in rows.items():
        assert "error" not in r, (key, r.get("error"), r.get("log", "")[-2000:])
        count, check = common.expected(ctx, common.DATA[key[1][0]])
        assert r["counts"] == [count] and r["checks"] == [check], key  # every record once per epoch
        assert r["ok"] and r["rate"] > 0 and r["peak_rss"] > 0 and r["cpu_seconds"] > 0, key
    for key in expected_rows:
        if key[0] != "shardfeed" and ("shardfeed", key[1]) in rows:
            assert rows[key]["shardfeed_over_peer"] > 0
    # epoch 2 of the S3 workload reads shardfeed's cache, not the shards again (a listing, no more)
    e1, e2 = rows[("shardfeed", "e1")]["read_bytes"], rows[("shardfeed", "e2")]["read_bytes"]
    assert e1 >= rows[("shardfeed", "e1")]["format_bytes"] and e2 < e1 / 10
    assert rc == 0


def test_unknown_peer_or_workload_is_named(capsys, tmp_path):
    assert main(["bench", "peers", "--peers", "shardfeed,nope", "--json", str(tmp_path / "p.json")]) == 2
    assert not (tmp_path / "p.json").exists()
    run = _peers_module("run")
    with pytest.raises(ValueError, match="unknown peer or workload z"):
        run.run_all(run.argparse.Namespace(peers="shardfeed", workloads="a,z", dir=str(tmp_path)))


def test_peer_options_belong_to_bench_peers(capsys):
    assert main(["bench", "read_tfrecord", "--workloads", "a"]) == 2
    assert "--workloads is an option of `shardfeed bench peers` only" in capsys.readouterr().err


def test_table_reports_missing_and_unsupported_peers_with_the_reason():
    run = _peers_module("run")
    res = {"peers": {"shardfeed": {"version": "x", "skipped": None},
                     "grain": {"version": "y", "skipped": None, "unsupported": {"e": "ArrayRecord reads local files only"}},
                     "dali": {"version": None, "skipped": "not installed: no wheel"}},
           "rows": [{"peer": "shardfeed", "workload": "a", "count": 10, "ok": True, "rate": 100.0, "cpu_seconds": 0.01,
                     "peak_rss": 5e7, "read_bytes": 0, "format_bytes": 1e6, "shardfeed_over_peer": 1.0},
                    {"peer": "grain", "workload": "a", "count": 9, "ok": False, "rate": 50.0, "cpu_seconds": 0.01,
                     "peak_rss": 6e7, "read_bytes": 1e6, "format_bytes": 1e6, "shardfeed_over_peer": 2.0}]}
    table = run.format_table(res)
    assert "dali" in table and "not installed: no wheel" in table
    assert "ArrayRecord reads local files only" in table
    assert "9 WRONG" in table  # a peer that lost or repeated records says so
    assert "2.00x" in table

"""`shardfeed bench`: runs benchmark scripts as subprocesses and prints one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardfeed.cli import bench_cmd
from shardfeed.cli.main import main

HEADER = ["benchmark", "configuration", "shardfeed", "anchor", "ratio"]


def test_bench_long_tail_quick(tmp_path, capsys):
    """The real long_tail benchmark, with --quick sizes (about a second)."""
    out = tmp_path / "out" / "bench.json"
    assert main(["bench", "long_tail", "--quick", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    lines = stdout.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.split()[:5] == HEADER)
    rows = [ln for ln in lines[header + 2:] if ln.startswith("long_tail ")]
    assert len(rows) == 2  # workqueue on the memory and the SQLite backend
    assert "workqueue[memory]" in rows[0] and "workqueue[sqlite]" in rows[1]
    assert all("static:" in r and r.rstrip().endswith("x") for r in rows)
    assert f"wrote {out}" in stdout

    combined = json.loads(out.read_text())
    assert combined["quick"] is True
    entry = combined["benchmarks"]["long_tail"]
    assert entry["returncode"] == 0 and "error" not in entry
    assert "--items" in entry["command"] and "--json" in entry["command"]
    assert entry["result"]["items"] == 40 and set(entry["result"]["median_s"]) >= {"static", "workqueue[memory]"}
    assert (out.parent / "long_tail.json").exists()  # each script's own JSON beside the combined one
    assert [r["benchmark"] for r in combined["rows"]] == ["long_tail", "long_tail"]
    assert set(combined["rows"][0]) == set(HEADER)
    ratio = float(combined["rows"][0]["ratio"].rstrip("x"))
    assert ratio > 0


def _fake_benchmarks(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "benchmarks"
    d.mkdir()
    (d / "pipeline_seed003.py").write_text(body)
    return d


def test_bench_table_from_script_json_and_failures(tmp_path, capsys):
    """Plumbing with stand-in scripts: JSON to rows, a failing script reported, exit 1."""
    good = (
        "import json, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "assert '--steps' in sys.argv  # --quick sizes passed\n"
        "json.dump({'produce_ms': 5.0, 'sync': {'step_ms': 10.0, 'wait_fraction': 0.5},\n"
        "           'shardfeed_prefetch': {'step_ms': 5.0, 'wait_fraction': 0.01}, 'speedup': 2.0},\n"
        "          open(out, 'w'))\n"
    )
    bdir = _fake_benchmarks(tmp_path, good)
    (bdir / "long_tail.py").write_text("import sys\nprint('boom: no luck', file=sys.stderr)\nsys.exit(3)\n")
    out = tmp_path / "b.json"
    rc = main(["bench", "--quick", "--benchmarks-dir", str(bdir), "--json", str(out)])
    assert rc == 1
    stdout = capsys.readouterr().out
    seed = next(ln for ln in stdout.splitlines() if ln.startswith("pipeline_seed003"))
    assert "5.00 ms (wait 1.0%)" in seed and "synchronous: 10.00 ms" in seed and seed.rstrip().endswith("2.00x")
    failed = next(ln for ln in stdout.splitlines() if ln.startswith("long_tail"))
    assert "FAILED" in failed and "exit status 3" in failed
    combined = json.loads(out.read_text())
    assert "boom: no luck" in combined["benchmarks"]["long_tail"]["error"]
    assert list(combined["benchmarks"]) == ["pipeline_seed003", "long_tail"]  # suite order, present scripts only


def test_bench_errors(tmp_path, capsys):
    bdir = _fake_benchmarks(tmp_path, "")
    assert main(["bench", "nosuch", "--benchmarks-dir", str(bdir), "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark(s) nosuch" in err and "pipeline_seed003" in err
    assert main(["bench", "--benchmarks-dir", str(tmp_path / "none"), "--json", str(tmp_path / "x.json")]) == 2
    assert "no such benchmarks folder" in capsys.readouterr().err


def test_benchmarks_dir_missing_message(monkeypatch, tmp_path):
    import shardfeed

    monkeypatch.delenv("SHARDFEED_BENCHMARKS_DIR", raising=False)
    monkeypatch.setattr(shardfeed, "__file__", str(tmp_path / "site-packages" / "shardfeed" / "__init__.py"))
    with pytest.raises(FileNotFoundError, match="benchmarks live in the source tree"):
        bench_cmd.benchmarks_dir()


def test_every_script_has_a_reader():
    """Every script in benchmarks/ is part of the suite (a new one needs a row reader here)."""
    bdir = bench_cmd.benchmarks_dir()
    scripts = {p.stem for p in bdir.glob("*.py") if not p.stem.startswith("_")}
    assert scripts <= set(bench_cmd.BENCHMARKS), scripts - set(bench_cmd.BENCHMARKS)


def test_shuffle_rows_compare_object_storage_rows_with_the_sequential_s3_read():
    res = {"median": {"sequential": 400.0, "S3 sequential": 100.0, "S3 shuffle='blocks'": 80.0,
                      "tf.data shuffle(10000)": 200.0},
           "largest_file_share": {"sequential": 0.99}, "anchor": "tf.data shuffle(10000)",
           "s3": {"anchor": "S3 sequential"}}
    rows = {r[0]: r for r in bench_cmd._rows_shuffle(res)}
    assert rows["sequential (largest file share 0.990)"][3] == "2.00x"
    assert rows["S3 sequential"][2].startswith("tf.data") and rows["S3 sequential"][3] == "0.50x"
    assert rows["S3 shuffle='blocks'"][2] == "S3 sequential: 100 rec/s" and rows["S3 shuffle='blocks'"][3] == "0.80x"
    assert "tf.data shuffle(10000)" not in rows

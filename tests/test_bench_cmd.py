"""`shardfeed bench`: runs benchmark scripts as subprocesses and prints one table."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
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
    own = json.loads((out.parent / "long_tail.json").read_text())
    assert own["rows"] == entry["rows"]  # the script made its rows; bench only prefixed the name
    assert [["long_tail", *r] for r in own["rows"]] == [[r[h] for h in HEADER] for r in combined["rows"]]
    assert [r["benchmark"] for r in combined["rows"]] == ["long_tail", "long_tail"]
    assert set(combined["rows"][0]) == set(HEADER)
    ratio = float(combined["rows"][0]["ratio"].rstrip("x"))
    assert ratio > 0


# what benchmarks/pipeline_seed003.py writes, and the rows it makes of it
SEED003 = {"produce_ms": 5.0, "sync": {"step_ms": 10.0, "wait_fraction": 0.5},
           "shardfeed_prefetch": {"step_ms": 5.0, "wait_fraction": 0.01}, "speedup": 2.0}
SEED003_ROWS = [["MLP train step, batch production 5.0 ms", "5.00 ms (wait 1.0%)",
                 "synchronous: 10.00 ms (wait 50.0%)", "2.00x"]]


def _load_script(name: str, monkeypatch):
    """Import benchmarks/<name>.py as a module (for its ``table_rows``), leaving sys.path and the
    environment as they were."""
    bdir = bench_cmd.benchmarks_dir()
    monkeypatch.setattr(sys, "path", [str(bdir), *sys.path])
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # pipeline_seed003 sets them
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:
            monkeypatch.delenv(var, raising=False)
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", bdir / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


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
        f"json.dump({{**{SEED003!r}, 'rows': {SEED003_ROWS!r}}}, open(out, 'w'))\n"
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


def test_every_script_is_in_the_suite():
    """Every script in benchmarks/ is part of the suite (a new one needs its quick arguments here)."""
    bdir = bench_cmd.benchmarks_dir()
    scripts = {p.stem for p in bdir.glob("*.py") if not p.stem.startswith("_")}
    assert scripts <= set(bench_cmd.BENCHMARKS), scripts - set(bench_cmd.BENCHMARKS)


def test_shuffle_rows_compare_object_storage_rows_with_the_sequential_s3_read(monkeypatch):
    res = {"median": {"sequential": 400.0, "S3 sequential": 100.0, "S3 shuffle='blocks'": 80.0,
                      "tf.data shuffle(10000)": 200.0},
           "largest_file_share": {"sequential": 0.99}, "anchor": "tf.data shuffle(10000)",
           "s3": {"anchor": "S3 sequential"}}
    rows = {r[0]: r for r in _load_script("shuffle", monkeypatch).table_rows(res)}
    assert rows["sequential (largest file share 0.990)"][3] == "2.00x"
    assert rows["S3 sequential"][2].startswith("tf.data") and rows["S3 sequential"][3] == "0.50x"
    assert rows["S3 shuffle='blocks'"][2] == "S3 sequential: 100 rec/s" and rows["S3 shuffle='blocks'"][3] == "0.80x"
    assert "tf.data shuffle(10000)" not in rows


def test_every_script_writes_its_rows():
    """Every script bench runs makes its table rows itself (``table_rows``, helpers from
    ``benchmarks/_rows.py``) and writes them as "rows" in its JSON."""
    bdir = bench_cmd.benchmarks_dir()
    for name in bench_cmd.BENCHMARKS:
        src = (bdir / f"{name}.py").read_text()
        assert "\ndef table_rows(res: dict)" in src and "import _rows\n" in src, name
        assert '["rows"] = table_rows(' in src, f"{name}.py does not write its rows into its JSON"


def test_pipeline_seed003_quick_writes_rows(tmp_path, monkeypatch):
    """A second real script, with --quick sizes: its JSON carries rows the table shows as they are;
    and its ``table_rows`` makes the expected strings from the JSON the stand-in above writes."""
    out = tmp_path / "bench.json"
    assert main(["bench", "pipeline_seed003", "--quick", "--json", str(out)]) == 0
    own = json.loads((tmp_path / "pipeline_seed003.json").read_text())
    assert len(own["rows"]) == 1 and own["rows"][0][0].startswith("MLP train step")
    assert all(isinstance(v, str) for v in own["rows"][0])
    assert json.loads(out.read_text())["benchmarks"]["pipeline_seed003"]["rows"] == own["rows"]
    assert _load_script("pipeline_seed003", monkeypatch).table_rows(SEED003) == [tuple(r) for r in SEED003_ROWS]


def test_json_without_rows_is_an_error_naming_the_script(tmp_path, capsys):
    bdir = _fake_benchmarks(tmp_path, f"import json, sys\njson.dump({SEED003!r}, open(sys.argv[-1], 'w'))\n")
    out = tmp_path / "b.json"
    assert main(["bench", "--quick", "--benchmarks-dir", str(bdir), "--json", str(out)]) == 1
    stdout = capsys.readouterr().out
    line = next(ln for ln in stdout.splitlines() if ln.startswith("pipeline_seed003"))
    assert "FAILED" in line and 'pipeline_seed003.py wrote no "rows"' in line
    error = json.loads(out.read_text())["benchmarks"]["pipeline_seed003"]["error"]
    assert 'pipeline_seed003.py wrote no "rows" in its JSON' in error and "benchmarks/_rows.py" in error


def test_rows_that_are_not_rows_are_an_error():
    with pytest.raises(ValueError, match=r'x\.py wrote "rows" that are not \[configuration'):
        bench_cmd.table_rows({"rows": [["only", "three", "cells"]]}, "x.py")
    with pytest.raises(ValueError, match=r'x\.py wrote no "rows"'):
        bench_cmd.table_rows({"median": {}}, "x.py")
    assert bench_cmd.table_rows({"rows": [["a", "b", "c", "d"]]}, "x.py") == [["a", "b", "c", "d"]]

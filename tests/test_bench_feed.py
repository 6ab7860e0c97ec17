"""``shardfeed bench feed``: simulated accelerators over a pipeline (MLPerf Storage's 90%
utilisation rule). The pipelines here are far from the threshold either way (a batch ready
at once against a 200 ms step; a batch every 100 ms against a 5 ms step), so the outcome
does not hang on the machine's speed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.cli.feed import feed_rate, simulate

BATCHES = [{"x": np.full((32, 4), i, np.float32), "y": np.arange(32)} for i in range(8)]


def ready():
    return sf.from_list(BATCHES).repeat()


def _slow(batch):
    time.sleep(0.1)
    return batch


def slow():
    return sf.from_list(BATCHES).map(_slow, num_parallel_calls=1).repeat()


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_a_pipeline_with_batches_ready_feeds_accelerators_and_says_how_busy_each_was():
    sim = simulate(ready, accelerators=3, step_s=0.05, seconds=0.6)
    assert sim.accelerators == 3 and len(sim.utilisation) == 3
    assert sim.batches >= 3 and sim.samples == 32 * sim.batches
    assert sim.min_utilisation >= 0.9
    # at most 4 simulated accelerators: the ready pipeline's first guess is otherwise the cap of
    # 64, whose 64 threads contend for a loaded machine's cores and may miss 90% for that alone
    result = feed_rate(ready, step_s=0.2, seconds=0.6, max_tries=2, max_accelerators=4)
    assert result.batch_size == 32 and result.accelerators >= 1
    fed = [r for r in result.runs if r.accelerators <= result.accelerators]
    assert fed and all(r.min_utilisation >= 0.9 for r in fed)
    assert result.to_dict()["per_core"] == result.accelerators / result.cores


def test_a_pipeline_slower_than_one_step_feeds_none():
    result = feed_rate(slow, step_s=0.005, seconds=0.6)
    assert result.accelerators == 0
    assert result.runs and result.runs[0].min_utilisation < 0.9


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="step time"):
        feed_rate(ready, step_s=0)
    with pytest.raises(ValueError, match="target"):
        feed_rate(ready, step_s=0.1, target=1.5)
    with pytest.raises(ValueError, match="no batch"):
        feed_rate(lambda: sf.from_list([]), step_s=0.1, seconds=0.2)


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_the_command_runs_a_users_pipeline_and_writes_json(tmp_path):
    (tmp_path / "mypipe.py").write_text(
        "import numpy as np, shardfeed as sf\n"
        "def make():\n"
        "    return sf.from_list([{'x': np.zeros((16, 2))}] * 4).repeat()\n")
    out = tmp_path / "feed.json"
    proc = subprocess.run([sys.executable, "-m", "shardfeed.cli.main", "bench", "feed", "--pipeline", "mypipe:make",
                           "--step-ms", "200", "--duration", "0.5", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "accelerators kept at >= 90%" in proc.stdout
    res = json.loads(out.read_text())
    assert res["results"][0]["name"] == "mypipe:make" and res["results"][0]["batch_size"] == 16
    assert res["results"][0]["accelerators"] >= 1
    bad = subprocess.run([sys.executable, "-m", "shardfeed.cli.main", "bench", "feed", "--pipeline", "mypipe:make"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--step-ms" in bad.stderr
    wrong = subprocess.run([sys.executable, "-m", "shardfeed.cli.main", "bench", "long_tail", "--step-ms", "5"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "bench feed" in wrong.stderr


@pytest.mark.slow  # writes the presets' data: several seconds
def test_the_presets_write_their_data_once_and_it_reads_with_their_spec(tmp_path):
    from shardfeed.cli.feed import preset

    for name, records in (("resnet50", 800), ("ctr", 20_000)):
        files, spec, batch, step = preset(name, str(tmp_path), quick=True)
        assert len(files) == 4 and step > 0 and batch in (400, 1024)
        mtimes = [f.stat().st_mtime_ns for f in sorted(tmp_path.glob(f"{name}-*.tfrecord"))]
        assert sum(len(b[next(iter(spec))]) for b in sf.read_tfrecord(files, spec=spec).batch(batch)) == records
        assert preset(name, str(tmp_path), quick=True)[0] == files  # written once: reused
        assert [f.stat().st_mtime_ns for f in sorted(tmp_path.glob(f"{name}-*.tfrecord"))] == mtimes

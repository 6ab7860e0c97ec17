"""The Ray runner on a real local Ray cluster: the same bytes as the local runner, a Ray
Dataset as the source, and a worker process SIGKILLed mid-shard (Ray retries the task: every
row once, no partial shard)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("PIL")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
from PIL import Image  # noqa: E402

import shardfeed as sf  # noqa: E402

from .test_convert_runners import OPTS, dataset, output_bytes  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def test_ray_runner_writes_the_same_bytes_as_the_local_runner(ray_cluster, tmp_path):
    src = dataset(tmp_path)
    local, on_ray = str(tmp_path / "local"), str(tmp_path / "ray")
    sf.convert(src, local, **OPTS)
    result = sf.convert(src, on_ray, runner="ray", **OPTS)
    assert output_bytes(on_ray) == output_bytes(local)
    assert result.manifest["runtime"]["runner"] == "ray"


def test_a_ray_dataset_converts_like_its_pandas_frame(ray_cluster, tmp_path):
    import pandas as pd

    df = pd.DataFrame({"id": np.arange(50), "score": np.linspace(0, 1, 50), "name": [f"n{i}" for i in range(50)]})
    schema = {"id": "int", "score": "float", "name": "string"}
    opts = {"num_samples_per_tfrecord": 16, "progress": False}
    sf.convert(df, str(tmp_path / "pandas"), schema=schema, **opts)
    sf.convert(ray.data.from_pandas(df), str(tmp_path / "ray"), schema=schema, **opts)
    assert output_bytes(tmp_path / "ray")[0] == output_bytes(tmp_path / "pandas")[0]


def _big_images(tmp_path, n: int) -> str:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        p = tmp_path / "big" / f"{i}.jpg"
        p.parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (600, 800, 3), dtype=np.uint8)).save(p, "JPEG", quality=95)
        rows.append(("train", f"big/{i}.jpg", f"c{i % 4}"))
    path = tmp_path / "big.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([("split", "image_uri", "label"), *rows])
    return str(path)


def _shard_worker_pids() -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ray::write_shard" in line]


def test_a_worker_killed_mid_shard_costs_a_retry_not_a_row(ray_cluster, tmp_path):
    n = 120
    src = _big_images(tmp_path, n)
    out = str(tmp_path / "out")
    done: dict = {}

    def run():
        try:
            done["result"] = sf.convert(src, out, runner="ray", num_samples_per_tfrecord=40, max_image_size=300,
                                        progress=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            done["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and t.is_alive() and time.monotonic() < deadline:
        pids = _shard_worker_pids()
        if pids:
            time.sleep(0.3)  # into the shard's work
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        time.sleep(0.05)
    t.join(300)
    assert killed is not None, "no shard task was seen running"
    assert "error" not in done, done.get("error")
    names = sorted(os.listdir(out))
    assert not [x for x in names if x.startswith(".") and x != ".data-state"], names  # no partial shard
    ids = [sf.decode_example(r)["image/source_id"][0].decode() for f in names if f.endswith(".tfrecord")
           for r in sf.read_records(os.path.join(out, f))]
    assert sorted(ids) == sorted(str(tmp_path / "big" / f"{i}.jpg") for i in range(n))  # each row once

"""The Spark write job's driver-side choices, A/B in one SparkSession.

Converts ``--images`` JPEGs named in a CSV (made in ``--dir`` as
``benchmarks/convert_spark.py`` makes them, and shared with it) with
``runner="spark"`` on ``--master``, alternating rounds between the runner as it is
("new") and the runner with three choices set back to what they were before
(``"old"``: adaptive execution left on for the write job, rows placed by a Python task
instead of Spark SQL, up to 4 write tasks a core). One untimed conversion first (it starts
the executors' Python workers). The framed write path is in both (it has no switch).

Usage::

    python benchmarks/spark_write_job_ab.py [--images 5000] [--rounds 4] [--dir /tmp/shardfeed-bench-convert-spark]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if os.path.isdir(SRC):
    sys.path.insert(0, SRC)
sys.path.insert(0, HERE)

import _rows
from convert_spark import make_images


def table_rows(res: dict) -> list[_rows.Row]:
    """One row: the runner as it is against the same runner with the old choices (the anchor)."""
    n = res["images"]
    return [(f"runner='spark' write job on {res['master']}, {n:,} images, one session",
             _rows.rate(n / res["medians"]["new"], "rows/s"),
             f"old choices: {_rows.rate(n / res['medians']['old'], 'rows/s')}",
             _rows.ratio(res["medians"]["old"] / res["medians"]["new"]))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-convert-spark"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--json", default=os.path.join("bench-out", "spark_write_job_ab.json"))
    args = ap.parse_args(argv)
    from shardfeed.convert import api as sc
    from shardfeed.convert import runner_spark as rs
    from shardfeed.convert import spark_write as sw

    os.makedirs(args.dir, exist_ok=True)
    inp = make_images(args.dir, args.images)
    rs.spark_session(args.master)
    kw = {"max_image_size": 128, "test_ratio": 0.1, "num_samples_per_tfrecord": 64, "progress": False}
    new = (rs.session_conf, sw.SQL_PLACE_MAX, sw.WRITE_TASK_ROWS)

    def mode(m: str) -> None:
        if m == "old":
            rs.session_conf = lambda spark, settings: contextlib.nullcontext()
            sw.SQL_PLACE_MAX, sw.WRITE_TASK_ROWS = 0, 1
        else:
            rs.session_conf, sw.SQL_PLACE_MAX, sw.WRITE_TASK_ROWS = new

    out_base = tempfile.mkdtemp(prefix="spark-ab-")
    sc.convert(inp, os.path.join(out_base, "warm"), runner="spark", **kw)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for m in (("old", "new") if r % 2 == 0 else ("new", "old")):
            mode(m)
            out = os.path.join(out_base, m)
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            sc.convert(inp, out, runner="spark", **kw)
            times[m].append(time.perf_counter() - t)
            print(f"round {r + 1} {m}: {times[m][-1]:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    mode("new")
    shutil.rmtree(out_base, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"medians: old {med['old']:.2f} s, new {med['new']:.2f} s ({med['new'] / med['old'] - 1:+.0%}); "
          f"load {os.getloadavg()[0]:.1f}")
    result = {"master": args.master, "images": args.images, "seconds": times, "medians": med,
              "load_average_end": os.getloadavg()}
    result["rows"] = table_rows(result)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

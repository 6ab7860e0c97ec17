"""The Spark runner against the local runner, on the same data, in one run.

Two inputs, written once into ``--dir``:

- images: ``--images`` JPEGs (320x240, photo-like) and a ``split,image_uri,label`` CSV,
  converted with ``max_image_size=128``;
- a table: CSV files of ``--rows`` rows (an integer label, 8 floats, a string), converted
  with a schema (no images), at two sizes (``--rows`` and ``--rows-small``).

For each input, interleaved rounds, medians: the local runner (2 threads) and
``runner="spark"`` on ``--master`` (default ``local-cluster[2,1,1024]``: two executor JVMs
of one core each, as on a cluster; the session is started once per process and its start
is reported apart, and so is a first, untimed conversion of the same input, which starts
the executors' Python workers). Every Spark conversion runs in a child process of its own so the
driver's peak memory can be read for each input size: peak RSS (``VmHWM``) of the Python
driver and of the driver JVM. Output equality is checked: the same records, as a multiset,
per split.

Usage::

    python benchmarks/convert_spark.py [--images 300] [--rows 200000] [--rows-small 20000] [--rounds 1]
                                       [--json bench-out/convert_spark.json]
    python benchmarks/convert_spark.py --rss-only --rows 2000000 --rows-small 200000

``--rss-only``: one Spark conversion per table size, no local runner and no untimed first
conversion: the driver's peak RSS (Python and JVM) at the two sizes, and the rows/s of
that single (cold) conversion.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if os.path.isdir(SRC):
    sys.path.insert(0, SRC)
sys.path.insert(0, HERE)

import _rows

SCHEMA = {"label": "integer label", **{f"f{i}": "float" for i in range(8)}, "name": "string"}


def make_images(directory: str, n: int) -> str:
    from PIL import Image

    path = os.path.join(directory, f"images-{n}.csv")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.join(directory, "img"), exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:240, 0:320].astype(np.float32)
    rows = []
    for i in range(n):
        a, b = rng.uniform(0.2, 1.0, 2)
        img = np.clip(np.stack([xx * a, yy * b, (xx + yy) / 2], 2) + rng.normal(0, 12, (240, 320, 3)), 0, 255)
        p = os.path.join(directory, "img", f"{i:05d}.jpg")
        Image.fromarray(img.astype(np.uint8)).save(p, "JPEG", quality=90)
        rows.append(("", p, ("cat", "dog", "bird")[i % 3]))
    with open(path + ".tmp", "w", newline="") as f:
        csv.writer(f).writerows([("split", "image_uri", "label"), *rows])
    os.replace(path + ".tmp", path)
    return path


def make_table(directory: str, n: int) -> str:
    path = os.path.join(directory, f"table-{n}.csv")
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(1)
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(SCHEMA))
        for start in range(0, n, 50_000):
            k = min(50_000, n - start)
            feats = np.round(rng.normal(size=(k, 8)), 4)
            labels = rng.integers(0, 10, k)
            w.writerows([int(labels[j]), *feats[j].tolist(), f"row{start + j}"] for j in range(k))
    os.replace(path + ".tmp", path)
    return path


def _vmhwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def digest(out: str) -> dict[str, list]:
    """Per split: record count and sha256 of the sorted records (a multiset digest)."""
    from shardfeed.convert import api as sc
    from shardfeed.formats.tfrecord import read_records

    m = sc.load_manifest(out)
    got = {}
    for split, info in m["splits"].items():
        recs = sorted(r for s in info["shards"] for r in read_records(os.path.join(out, s["file"])))
        h = hashlib.sha256()
        for r in recs:
            h.update(hashlib.sha256(r).digest())
        got[split] = [len(recs), h.hexdigest()]
    return got


def child(args) -> int:
    """One conversion in this process; prints a JSON line."""
    from shardfeed.convert import api as sc

    kw = json.loads(args.child_options)
    if args.child_schema:
        kw["schema"] = SCHEMA
    start = time.perf_counter()
    session_s = 0.0
    jvm_pid = None
    if args.child == "spark":
        from shardfeed.convert.runner_spark import spark_session

        spark = spark_session(args.master)
        session_s = time.perf_counter() - start
        jvm_pid = spark.sparkContext._gateway.proc.pid
        kw["runner"] = "spark"
    # a first, untimed conversion of the same input: page cache, and on Spark the executors'
    # Python workers started and shardfeed, numpy and Pillow imported in them
    t0 = time.perf_counter()
    if not args.rss_only:
        sc.convert(args.child_warm_input or args.child_input, args.child_out + "-warm", progress=False, **kw)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = sc.convert(args.child_input, args.child_out, progress=False, **kw)
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "session_s": session_s, "cold_s": cold_s, "rows": res.rows_read,
           "driver_py_peak_mib": _vmhwm_kib(os.getpid()) / 1024,
           "driver_jvm_peak_mib": _vmhwm_kib(jvm_pid) / 1024 if jvm_pid else None,
           "output": digest(args.child_out)}
    print("RESULT " + json.dumps(out))
    return 0


def run_child(runner: str, inp: str, out: str, options: dict, schema: bool, master: str, rss_only: bool = False,
              warm_input: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", runner, "--child-input", inp, "--child-out", out,
           "--child-options", json.dumps(options), "--master", master] + (["--child-schema"] if schema else []) + (
           ["--rss-only"] if rss_only else []) + (["--child-warm-input", warm_input] if warm_input else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{runner} on {inp} failed:\n{p.stderr[-3000:]}")


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows". The anchor is the local
    runner on the same input."""
    return [(f"runner='spark' on {res['master']}, {r['input']}" + ("" if r["same_output"] else " (OUTPUT DIFFERS)"),
             _rows.rate(r["spark_rows_s"], "rows/s"), f"local runner: {_rows.rate(r['local_rows_s'], 'rows/s')}",
             _rows.ratio(r["ratio"])) for r in res["results"]]


def rss_only(args) -> int:
    import shutil

    opts = {"test_ratio": 0.1, "num_samples_per_tfrecord": 20_000}
    results = []
    for n in (args.rows_small, args.rows):
        out = os.path.join(args.dir, f"out-rss-{n}")
        shutil.rmtree(out, ignore_errors=True)
        r = run_child("spark", make_table(args.dir, n), out, opts, True, args.master, rss_only=True)
        results.append({"rows": r["rows"], "spark_rows_s": r["rows"] / r["seconds"],
                        "spark_driver_py_peak_mib": r["driver_py_peak_mib"],
                        "spark_driver_jvm_peak_mib": r["driver_jvm_peak_mib"]})
        print(f"{r['rows']:>10,} rows: {r['rows'] / r['seconds']:>8,.0f} rows/s (cold), driver peak RSS "
              f"{r['driver_py_peak_mib']:.0f} MiB Python + {r['driver_jvm_peak_mib']:.0f} MiB JVM", flush=True)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"master": args.master, "rss_only": results}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rows-small", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-convert-spark"))
    ap.add_argument("--json", default=os.path.join("bench-out", "convert_spark.json"))
    ap.add_argument("--rss-only", action="store_true",
                    help="Spark only, one cold conversion per table size: the driver's peak RSS")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-input", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-options", help=argparse.SUPPRESS)
    ap.add_argument("--child-schema", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-warm-input", help=argparse.SUPPRESS)
    ap.add_argument("--cases", default="images,small,large",
                    help="which inputs to run, comma-separated: images, small (--rows-small), large (--rows)")
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    os.makedirs(args.dir, exist_ok=True)
    if args.rss_only:
        return rss_only(args)
    wanted = set(args.cases.split(","))
    if wanted - {"images", "small", "large"}:
        ap.error(f"--cases: unknown {sorted(wanted - {'images', 'small', 'large'})}")
    table_opts = {"test_ratio": 0.1, "num_samples_per_tfrecord": 20_000}
    # (name, input, options, schema, warm-up input): the untimed first conversion of the
    # large table is of the small one (it starts the workers as well; converting a
    # 2,000,000-row table twice would double the run for no information)
    cases = []
    if "images" in wanted:
        cases.append((f"{args.images:,} images", make_images(args.dir, args.images),
                      {"max_image_size": 128, "test_ratio": 0.1, "num_samples_per_tfrecord": 64}, False, None))
    if "small" in wanted:
        cases.append((f"table {args.rows_small:,} rows", make_table(args.dir, args.rows_small), table_opts, True, None))
    if "large" in wanted:
        cases.append((f"table {args.rows:,} rows", make_table(args.dir, args.rows), table_opts, True,
                      make_table(args.dir, args.rows_small)))
    results = []
    for name, inp, opts, schema, warm in cases:
        runs: dict[str, list] = {"local": [], "spark": []}
        for r in range(args.rounds):
            for runner in ("local", "spark"):
                out = os.path.join(args.dir, f"out-{runner}-{abs(hash(name))}-{r}")
                import shutil

                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(out + "-warm", ignore_errors=True)
                runs[runner].append(run_child(runner, inp, out, opts, schema, args.master, warm_input=warm))
                print(f"{name}, round {r + 1}, {runner}: {runs[runner][-1]['seconds']:.1f} s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
        loc, spk = runs["local"], runs["spark"]
        rows = loc[0]["rows"]
        row = {
            "input": name, "rows": rows,
            "local_rows_s": statistics.median(rows / x["seconds"] for x in loc),
            "spark_rows_s": statistics.median(rows / x["seconds"] for x in spk),
            "spark_session_s": statistics.median(x["session_s"] for x in spk),
            "spark_first_convert_s": statistics.median(x["cold_s"] for x in spk),
            "local_first_convert_s": statistics.median(x["cold_s"] for x in loc),
            "local_driver_peak_mib": max(x["driver_py_peak_mib"] for x in loc),
            "spark_driver_py_peak_mib": max(x["driver_py_peak_mib"] for x in spk),
            "spark_driver_jvm_peak_mib": max(x["driver_jvm_peak_mib"] for x in spk),
            "same_output": all(x["output"] == loc[0]["output"] for x in loc + spk),
            "records_per_split": {k: v[0] for k, v in loc[0]["output"].items()},
        }
        row["ratio"] = row["spark_rows_s"] / row["local_rows_s"]
        results.append(row)
    print(f"{'input':<24} {'rows':>9} {'local rows/s':>13} {'spark rows/s':>13} {'ratio':>6} "
          f"{'local RSS':>10} {'spark py RSS':>13} {'spark JVM RSS':>14} {'same':>5}")
    for r in results:
        print(f"{r['input']:<24} {r['rows']:>9,} {r['local_rows_s']:>13,.0f} {r['spark_rows_s']:>13,.0f} "
              f"{r['ratio']:>5.2f}x {r['local_driver_peak_mib']:>7.0f} MiB {r['spark_driver_py_peak_mib']:>9.0f} MiB "
              f"{r['spark_driver_jvm_peak_mib']:>10.0f} MiB {str(r['same_output']):>5}")
    print(f"Spark session start (median): {statistics.median(r['spark_session_s'] for r in results):.1f} s; first "
          "(untimed) conversion of each input, local / spark: " + ", ".join(
              f"{r['local_first_convert_s']:.1f} / {r['spark_first_convert_s']:.1f} s" for r in results)
          + "; rows/s are from the second conversion")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"master": args.master, "rounds": args.rounds, "results": results,
              "load_average_end": os.getloadavg()}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")
    return 0 if all(r["same_output"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

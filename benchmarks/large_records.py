"""Large records at memory speed: MLPerf Storage's ResNet-50 records (issue 22 #3).

Examples of 114,660 bytes (an image's bytes and a label), batch 400, files in the page
cache. Rows, interleaved in rounds, medians:

- framing + CRC alone (``iter_frame_chunks``): the ceiling of a pass over the files;
- ``read_tfrecord(files, spec).batch(400, bytes_as=...)`` with bytes as buffers and as
  objects, one thread (``num_parallel_reads=None``) and the default (one per core);
- the default with bytes as buffers over the files 4 times in one pass (a pass's start-up
  spread over more records, as in a real epoch);
- the default with bytes as buffers, its pass starting and ending with an empty batch-buffer
  pool (``SHARDFEED_POOL_IDLE_SECONDS=0``: the pool as it was before it was kept warm
  between passes; every other buffer row finds the blocks the pass before it left);
- tf.data: ``TFRecordDataset(files).batch(400).map(parse_example)`` (skipped without
  TensorFlow).

Prints records/s, GB/s and the process's CPU time per record (all threads, user + system:
what a configuration costs in cores, and a figure that holds on a machine shared with other
jobs, where records/s does not) and writes JSON::

    python benchmarks/large_records.py [--records 4000] [--rounds 3] [--no-tf] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows

import shardfeed as sf  # noqa: E402
from shardfeed.formats import bufpool  # noqa: E402
from shardfeed.formats.chunks import iter_frame_chunks  # noqa: E402

RECORD_BYTES = 114_660
BATCH = 400
SHARDS = 4
LONG_PASS = 4
SPEC = {"image/encoded": sf.FixedLen("bytes"), "image/class/label": sf.FixedLen("int64")}


def make_files(directory: str, records: int) -> list[str]:
    files = [os.path.join(directory, f"resnet50-{i:05d}-of-{SHARDS:05d}.tfrecord") for i in range(SHARDS)]
    marker = os.path.join(directory, f"READY-{records}")
    if os.path.exists(marker):
        return files
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):  # the files are rewritten: another count's marker no longer holds
        if name.startswith("READY-"):
            os.remove(os.path.join(directory, name))
    rng = np.random.default_rng(0)
    per = -(-records // SHARDS)
    for f in files:
        with sf.TFRecordWriter(f) as w:
            for j in range(per):
                w.write(sf.encode_example({"image/encoded": rng.bytes(RECORD_BYTES - 60),
                                           "image/class/label": [j % 1000]}))
    open(marker, "w").close()
    return files


def run_frames(files: list[str]) -> int:
    return sum(c.count for f in files for c in iter_frame_chunks(f))


def run_shardfeed(files: list[str], bytes_as: str, reads: int | None) -> int:
    ds = sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=reads).batch(BATCH, bytes_as=bytes_as)
    return sum(len(b["image/class/label"]) for b in ds)


def run_cold_pool(files: list[str]) -> int:
    """The default with bytes as buffers, its pass starting with no pooled batch buffers and
    freeing them when it closes (``SHARDFEED_POOL_IDLE_SECONDS=0``: how every pass ran
    before the pool was kept between passes)."""
    bufpool.release_pooled_memory()
    bufpool.set_pool_idle_seconds(0)
    try:
        return run_shardfeed(files, "buffer", sf.AUTOTUNE)
    finally:
        bufpool.set_pool_idle_seconds(None)


def run_tf(files: list[str]) -> int:
    import tensorflow as tf  # noqa: PLC0415 - optional, heavy

    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    ds = (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).batch(BATCH)
          .map(lambda x: tf.io.parse_example(x, features), num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))
    return sum(int(b["image/class/label"].shape[0]) for b in ds)


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med, gbs = res["median"], res["gb_per_s"]
    tf_rate = med.get("tf.data")
    anchor = f"tf.data: {_rows.rate(tf_rate, 'rec/s')}" if tf_rate else "- (no tf.data)"
    return [(f"{name} ({gbs[name]:.2f} GB/s)", _rows.rate(rate, "rec/s"), anchor,
             _rows.ratio(rate / tf_rate if tf_rate else None))
            for name, rate in med.items() if name != "tf.data"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "large"))
    ap.add_argument("--no-tf", action="store_true")
    ap.add_argument("--json", default=os.path.join("bench-out", "large_records.json"))
    args = ap.parse_args(argv)
    files = make_files(args.dir, args.records)
    for f in files:  # the page cache
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    total = sum(os.path.getsize(f) for f in files)
    rows = {
        "framing + CRC (ceiling)": lambda: run_frames(files),
        "shardfeed buffer, 1 thread": lambda: run_shardfeed(files, "buffer", None),
        "shardfeed object, 1 thread": lambda: run_shardfeed(files, "object", None),
        "shardfeed buffer, default": lambda: run_shardfeed(files, "buffer", sf.AUTOTUNE),
        "shardfeed object, default": lambda: run_shardfeed(files, "object", sf.AUTOTUNE),
        # the pool emptied before and after the pass (as before it was kept across passes);
        # the row after it (a long pass) starts cold too, the next round's first warm again
        "shardfeed buffer, default, pool cold": lambda: run_cold_pool(files),
        # the files 4 times in one pass: a pass's start-up (threads, the batch-buffer pool
        # starting empty) spread over 4x the records, as in an epoch of a real data set
        f"shardfeed buffer, default, one pass x{LONG_PASS}": lambda: run_shardfeed(files * LONG_PASS, "buffer",
                                                                                sf.AUTOTUNE),
    }
    if not args.no_tf:
        try:
            import tensorflow  # noqa: F401, PLC0415
            rows["tf.data"] = lambda: run_tf(files)
        except ImportError:
            print("tf.data: not run (TensorFlow is not installed)")
    runs: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    n_expected = None
    for r in range(args.rounds):
        for name, fn in rows.items():
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            n = fn()
            runs[name].append(n / (time.perf_counter() - t0))
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[name].append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / n * 1e6)
            n_expected = n_expected or n
            if n != n_expected * (LONG_PASS if "one pass x" in name else 1):
                raise RuntimeError(f"{name} read {n} records, expected {n_expected}")
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    per_record = total / n_expected
    median = {k: statistics.median(v) for k, v in runs.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    tf_rate = median.get("tf.data")
    print(f"\n{n_expected} records of {per_record:,.0f} bytes ({total / 1e6:.0f} MB, page cache), batch {BATCH}, "
          f"{os.cpu_count()} cores, median of {args.rounds}")
    print(f"{'configuration':40s} {'records/s':>12s} {'GB/s':>7s} {'vs tf.data':>11s} {'CPU us/rec':>11s}")
    for name, rate in median.items():
        vs = f"{rate / tf_rate:.2f}x" if tf_rate else "-"
        print(f"{name:40s} {rate:12,.0f} {rate * per_record / 1e9:7.2f} {vs:>11s} {cpu_med[name]:11.1f}")
    out = {"records": n_expected, "record_bytes": per_record, "batch": BATCH, "rounds": args.rounds,
           "runs": runs, "median": median, "cpu_us_per_record": cpu_med, "cpu_runs": cpu,
           "gb_per_s": {k: v * per_record / 1e9 for k, v in median.items()},
           "anchor": "tf.data" if tf_rate else None,
           "targets": {"default_gb_per_s": 3.5, "vs_tf": 3.0}}
    out["rows"] = table_rows(out)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

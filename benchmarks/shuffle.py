"""Shuffled reads against sequential ones, and against tf.data's buffer shuffle.

Same CTR-like files as ``benchmarks/read_tfrecord.py`` (page cache), batch 1024, parse to
numpy, interleaved rounds, medians:

- sequential ``read_tfrecord(files, spec).batch(1024)``;
- ``shuffle="files"`` and ``shuffle="blocks"`` (2,048-record blocks through index files);
- ``shuffle="blocks"`` followed by a 4,096-record buffer shuffle;
- ``shuffle="global"`` (one seeded permutation of all records, gathered through the index);
- a 10,000-record buffer shuffle after the source (``.shuffle(10_000, seed=0)``);
- tf.data ``TFRecordDataset(files).shuffle(10_000).batch(1024).map(parse_example)``.

Also how mixed the batches are: the mean, over batches, of the largest share of one
source file in a batch (1/8 is perfectly mixed over 8 files, 1.0 not mixed at all)::

    python benchmarks/shuffle.py [--records 250000] [--rounds 3] [--no-tf] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from read_tfrecord import BATCH, SPEC, _tf_spec, make_dataset  # noqa: E402

import shardfeed as sf  # noqa: E402


def _rate(ds) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = sum(len(b["label"]) for b in ds)
    return n, time.perf_counter() - t0


def runners(files):
    def src(**kw):
        return sf.read_tfrecord(files, spec=SPEC, **kw)

    return {
        "sequential": lambda: _rate(src().batch(BATCH)),
        "shuffle='files'": lambda: _rate(src(shuffle="files", seed=0).batch(BATCH)),
        "shuffle='blocks'": lambda: _rate(src(shuffle="blocks", seed=0).batch(BATCH)),
        "shuffle='blocks' + shuffle(4096)": lambda: _rate(src(shuffle="blocks", seed=0).shuffle(4096, seed=0)
                                                          .batch(BATCH)),
        "shuffle='global'": lambda: _rate(src(shuffle="global", seed=0).batch(BATCH)),
        "buffer shuffle(10000)": lambda: _rate(src().shuffle(10_000, seed=0).batch(BATCH)),
    }


def run_tf(files):
    import tensorflow as tf  # noqa: PLC0415

    spec = _tf_spec(tf)
    ds = tf.data.TFRecordDataset(files).shuffle(10_000, seed=0).batch(BATCH).map(lambda x: tf.io.parse_example(x, spec))
    t0 = time.perf_counter()
    n = 0
    for b in ds:
        n += len(b["label"].numpy())
    return n, time.perf_counter() - t0


def mixing(files, make) -> float:
    """Mean over batches of the largest share of one file in a batch (each serialized
    record looked up in a table of which file holds it)."""
    lookup = {}
    for fi, f in enumerate(files):
        for r in sf.read_tfrecord(f):
            lookup[r] = fi
    shares = []
    batch = []
    for r in make():
        batch.append(lookup[r])
        if len(batch) == BATCH:
            shares.append(np.bincount(batch, minlength=len(files)).max() / BATCH)
            batch = []
    return float(np.mean(shares)) if shares else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "ctr"))
    ap.add_argument("--no-tf", action="store_true")
    ap.add_argument("--json", default=os.path.join("bench-out", "shuffle.json"))
    args = ap.parse_args(argv)
    files = make_dataset(args.dir, args.records)
    for f in files:  # blocks need index files: build them once, outside the clock
        if not os.path.exists(f + ".idx"):
            sf.build_index(f)
    run = runners(files)
    if not args.no_tf:
        run["tf.data shuffle(10000)"] = lambda: run_tf(files)
    rates: dict[str, list[float]] = {k: [] for k in run}
    for r in range(args.rounds):
        for name, fn in run.items():
            n, dt = fn()
            if n != args.records:
                raise SystemExit(f"{name}: {n} records, expected {args.records}")
            rates[name].append(n / dt)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    raw = {
        "sequential": lambda: sf.read_tfrecord(files),
        "shuffle='files'": lambda: sf.read_tfrecord(files, shuffle="files", seed=0),
        "shuffle='blocks'": lambda: sf.read_tfrecord(files, shuffle="blocks", seed=0),
        "shuffle='blocks' + shuffle(4096)":
            lambda: sf.read_tfrecord(files, shuffle="blocks", seed=0).shuffle(4096, seed=0),
        "shuffle='global'": lambda: sf.read_tfrecord(files, shuffle="global", seed=0),
        "buffer shuffle(10000)": lambda: sf.read_tfrecord(files).shuffle(10_000, seed=0),
    }
    mixed = {k: mixing(files, make) for k, make in raw.items()}
    seq = med["sequential"]
    anchor = med.get("tf.data shuffle(10000)")
    print(f"\n{args.records} CTR-like records, {len(files)} files, batch {BATCH}, median of {args.rounds}")
    print(f"{'configuration':<36} {'records/s':>12} {'vs sequential':>14} {'vs tf.data':>11} "
          f"{'largest file share':>19}")
    for k, v in med.items():
        mix = f"{mixed[k]:.3f}" if k in mixed else "-"
        print(f"{k:<36} {v:>12,.0f} {v / seq:>13.2f}x {(f'{v / anchor:.2f}x' if anchor else '-'):>11} {mix:>19}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"records": args.records, "rounds": args.rounds, "rates": rates, "median": med,
                   "largest_file_share": mixed, "anchor": "tf.data shuffle(10000)" if anchor else None}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: Parquet table -> batches of 1024 numpy columns.

Compares, in one run and interleaved (median of --repeats):
  shardfeed   sf.read_table(path).batch(1024)
  pyarrow     ParquetFile.iter_batches(1024) + Array.to_numpy per column (the practical ceiling)
  pandas      pd.read_parquet + slicing 1024-row frames into numpy columns

    python benchmarks/read_table.py [--rows 5000000] [--cols 20] [--repeats 3] [--json out.json]

Targets: shardfeed >= 90% of pyarrow, >= 3x pandas.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import _rows
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH = 1024


def make_table(path: str, rows: int, cols: int) -> None:
    rng = np.random.default_rng(0)
    arrays, names = [], []
    for j in range(cols):
        kind = j % 4
        if kind == 0:
            arrays.append(pa.array(rng.integers(0, 1 << 40, rows, dtype=np.int64)))
        elif kind == 3:
            arrays.append(pa.array(rng.random(rows)))
        else:
            arrays.append(pa.array(rng.random(rows, dtype=np.float32)))
        names.append(f"c{j}")
    pq.write_table(pa.Table.from_arrays(arrays, names=names), path, row_group_size=1 << 20)


def run_shardfeed(path: str) -> int:
    import shardfeed.tables as sft

    n = 0
    for batch in sft.read_table(path, num_threads=1).batch(BATCH):
        n += len(batch[0])
    return n


def run_pyarrow(path: str) -> int:
    n = 0
    for rb in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        cols = [c.to_numpy(zero_copy_only=False) for c in rb.columns]
        n += len(cols[0])
    return n


def run_pandas(path: str) -> int:
    import pandas as pd

    df = pd.read_parquet(path)
    names = list(df.columns)
    n = 0
    for i in range(0, len(df), BATCH):
        chunk = df.iloc[i:i + BATCH]
        cols = [chunk[c].to_numpy() for c in names]
        n += len(cols[0])
    return n


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    rate = res["rows_per_s"]
    sf_rate = rate["shardfeed"]
    conf = f"{res['row_count']:,} rows x {res['cols']} cols, batch {res['batch']}"
    return [(f"{conf}, vs {k}", _rows.rate(sf_rate, "rows/s"), f"{k}: {_rows.rate(rate[k], 'rows/s')}",
             _rows.ratio(sf_rate / rate[k]))
            for k in ("pyarrow", "pandas") if rate.get(k)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--cols", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="read_table_bench.json")
    ap.add_argument("--data", default=None, help="folder to keep the generated Parquet file in")
    args = ap.parse_args(argv)
    data = args.data or tempfile.mkdtemp(prefix="sf-bench-")
    os.makedirs(data, exist_ok=True)
    path = os.path.join(data, f"table_{args.rows}x{args.cols}.parquet")
    if not os.path.exists(path):
        t = time.perf_counter()
        make_table(path, args.rows, args.cols)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
    runners = {"shardfeed": run_shardfeed, "pyarrow": run_pyarrow, "pandas": run_pandas}
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.repeats):
        for name, fn in runners.items():
            t = time.perf_counter()
            n = fn(path)
            times[name].append(time.perf_counter() - t)
            if n != args.rows:
                print(f"{name} delivered {n} rows, expected {args.rows}", file=sys.stderr)
                return 1
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.rows / v for k, v in med.items()}
    print(f"\n{args.rows:,} rows x {args.cols} columns, batches of {BATCH}, median of {args.repeats}")
    print(f"{'reader':<11} {'seconds':>8} {'rows/s':>14} {'vs pyarrow':>11}")
    for k in runners:
        print(f"{k:<11} {med[k]:>8.2f} {rate[k]:>14,.0f} {rate[k] / rate['pyarrow']:>10.0%}")
    ratio_pa = rate["shardfeed"] / rate["pyarrow"]
    ratio_pd = rate["shardfeed"] / rate["pandas"]
    print(f"\nshardfeed / pyarrow = {ratio_pa:.2f} (target >= 0.90); shardfeed / pandas = {ratio_pd:.2f} "
          "(target >= 3)")
    result = {"row_count": args.rows, "cols": args.cols, "batch": BATCH, "repeats": args.repeats,
              "seconds": times, "median_seconds": med, "rows_per_s": rate,
              "shardfeed_vs_pyarrow": ratio_pa, "shardfeed_vs_pandas": ratio_pd}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

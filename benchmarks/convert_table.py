"""Convert a table (CSV, or a pandas DataFrame) to TFRecord shards: shardfeed's local runner
against the loop most people write (``pandas.read_csv``, one ``tf.train.Example`` a row,
``tf.io.TFRecordWriter``).

Two tables, written once into ``--dir``:

- ``narrow``: an integer label, 8 floats and a string (the table of ``convert_spark.py``);
- ``ctr``: an integer label, 13 integer counts (some blank: a default fills them) and 26
  categorical strings, Criteo's layout.

Each converted, in interleaved rounds (medians), by:

- anchor: ``pd.read_csv`` then, per row, a ``tf.train.Example`` of the same features written
  with ``tf.io.TFRecordWriter`` (one file; no split, no manifest, no index: less work);
- ``shardfeed.convert(csv, schema=...)``: the local runner, ``test_ratio=0.1`` (a key-based
  split), shards of ``num_samples_per_tfrecord`` rows, an index per shard, the manifest and
  the discard report;
- ``shardfeed.convert(df, ...)`` from a DataFrame already in memory (the reading of the CSV
  not timed: compare with the anchor's rate with care, the anchor reads its CSV).

Both write the same feature values (the anchor's floats as float32, strings as UTF-8).
Prints rows/s and the ratio to the anchor; writes JSON (``--json``). Usage::

    python benchmarks/convert_table.py [--rows 200000] [--rounds 3] [--tables narrow,ctr] [--no-tf]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if os.path.isdir(SRC):
    sys.path.insert(0, SRC)

import _rows

import shardfeed
from shardfeed.convert import api as sc

SCHEMAS = {
    "narrow": {"label": "integer label", **{f"f{i}": "float" for i in range(8)}, "name": "string"},
    "ctr": {"label": "integer label", **{f"I{i}": "int" for i in range(1, 14)},
            **{f"C{i}": "string" for i in range(1, 27)}},
}
DEFAULTS = {"narrow": {}, "ctr": {f"I{i}": 0 for i in range(1, 14)}}
SHARD_ROWS = 20_000


def make_table(directory: str, kind: str, n: int) -> str:
    path = os.path.join(directory, f"{kind}-{n}.csv")
    if os.path.exists(path):
        return path
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(SCHEMAS[kind]))
        for start in range(0, n, 50_000):
            k = min(50_000, n - start)
            labels = rng.integers(0, 2 if kind == "ctr" else 10, k).tolist()
            if kind == "narrow":
                feats = np.round(rng.normal(size=(k, 8)), 4).tolist()
                w.writerows([labels[j], *feats[j], f"row{start + j}"] for j in range(k))
            else:
                counts = rng.geometric(0.05, size=(k, 13)).astype(object)
                counts[rng.random((k, 13)) < 0.1] = ""  # blank counts: the default fills them
                cats = rng.integers(0, 1 << 32, size=(k, 26))
                hexes = [[f"{c:08x}" for c in row] for row in cats.tolist()]
                w.writerows([labels[j], *counts[j].tolist(), *hexes[j]] for j in range(k))
    os.replace(path + ".tmp", path)
    return path


def anchor_loop(csv_path: str, kind: str, out: str) -> int:
    """pandas + tf.train.Example + tf.io.TFRecordWriter, one row at a time."""
    import pandas as pd
    import tensorflow as tf

    schema = SCHEMAS[kind]
    df = pd.read_csv(csv_path, dtype={c: str for c, t in schema.items() if t == "string"}, keep_default_na=False)
    ints = [c for c, t in schema.items() if t in ("int", "integer label")]
    floats = [c for c, t in schema.items() if t == "float"]
    strings = [c for c, t in schema.items() if t == "string"]
    for c in ints:  # blank counts: the same default shardfeed is given
        df[c] = pd.to_numeric(df[c].replace("", DEFAULTS[kind].get(c, 0))).astype("int64")
    os.makedirs(out, exist_ok=True)
    n = 0
    cols = [(c, "i") for c in ints] + [(c, "f") for c in floats] + [(c, "s") for c in strings]
    names = [c for c, _ in cols]
    with tf.io.TFRecordWriter(os.path.join(out, "data.tfrecord")) as w:
        for row in df[names].itertuples(index=False, name=None):
            feature = {}
            for (c, t), v in zip(cols, row):
                if t == "i":
                    feature[c] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
                elif t == "f":
                    feature[c] = tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
                else:
                    feature[c] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            n += 1
    return n


def shardfeed_run(source, kind: str, out: str) -> int:
    res = sc.convert(source, out, schema=SCHEMAS[kind], defaults=DEFAULTS[kind] or None, test_ratio=0.1,
                     num_samples_per_tfrecord=SHARD_ROWS, progress=False)
    if res.rows_discarded:
        raise SystemExit(f"shardfeed discarded {res.rows_discarded} rows of the {kind} table")
    return res.records_written


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    rows = []
    for kind, results in res["tables"].items():
        anchor = results.get("anchor", {}).get("rows_per_s")
        anchor_txt = (f"pandas + tf.train.Example loop: {_rows.rate(anchor, 'rows/s')}" if anchor
                      else "- (no TensorFlow)")
        for name, r in results.items():
            if name != "anchor":
                rows.append((f"{res['table_rows']:,}-row {kind} table: {name}", _rows.rate(r["rows_per_s"], "rows/s"),
                             anchor_txt, _rows.ratio(r["rows_per_s"] / anchor if anchor else None)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--tables", default="narrow,ctr", help="comma-separated: narrow, ctr")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-convert-table"))
    ap.add_argument("--no-tf", action="store_true", help="skip the TensorFlow anchor")
    ap.add_argument("--json", default=os.path.join("bench-out", "convert_table.json"))
    args = ap.parse_args(argv)

    import pandas as pd

    if not args.no_tf:
        import tensorflow  # noqa: F401 - imported before any timing (seconds on a cold start)

    kinds = [k.strip() for k in args.tables.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in SCHEMAS]
    if unknown:
        ap.error(f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(SCHEMAS)}")
    result = {"table_rows": args.rows, "rounds": args.rounds, "cores": os.cpu_count(),
              "shardfeed": shardfeed.__version__, "tables": {}}
    work = tempfile.mkdtemp(prefix="sf-bench-table-")
    try:
        for kind in kinds:
            print(f"preparing the {args.rows:,}-row {kind} table in {args.dir} ...", file=sys.stderr)
            path = make_table(args.dir, kind, args.rows)
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)  # cells as the CSV holds them
            cases = {
                "shardfeed.convert(csv), local runner": lambda out, p=path, k=kind: shardfeed_run(p, k, out),
                "shardfeed.convert(DataFrame), local runner": lambda out, df=frame, k=kind: shardfeed_run(df, k, out),
            }
            if not args.no_tf:
                cases = {"anchor": lambda out, p=path, k=kind: anchor_loop(p, k, out), **cases}
            times: dict[str, list[float]] = {k: [] for k in cases}
            counts: dict[str, int] = {}
            for rnd in range(args.rounds):
                for name, fn in cases.items():
                    out = os.path.join(work, f"{kind}-{rnd}-{len(counts)}")
                    t0 = time.perf_counter()
                    counts[name] = fn(out)
                    times[name].append(time.perf_counter() - t0)
                    shutil.rmtree(out, ignore_errors=True)
                    print(f"  round {rnd + 1}: {kind}: {name}: {times[name][-1]:.2f} s", file=sys.stderr)
            results = {}
            for name, ts in times.items():
                if counts[name] != args.rows:
                    raise SystemExit(f"{name} wrote {counts[name]} records of {args.rows} rows")
                med = statistics.median(ts)
                results[name] = {"seconds": med, "rows_per_s": args.rows / med, "all_seconds": ts}
            result["tables"][kind] = results
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.rows:,} rows, {os.cpu_count()} cores, median of {args.rounds}")
    print(f"{'table':<8} {'case':<44} {'rows/s':>10} {'vs anchor':>9}")
    for kind, results in result["tables"].items():
        anchor = results.get("anchor", {}).get("rows_per_s")
        for name, r in results.items():
            ratio = f"{r['rows_per_s'] / anchor:.2f}x" if anchor else "-"
            print(f"{kind:<8} {name:<44} {r['rows_per_s']:>10,.0f} {ratio:>9}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

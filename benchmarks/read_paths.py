"""Every path a user takes to read TFRecords, side by side with tf.data's best configuration.

Same CTR-like files as ``benchmarks/read_tfrecord.py`` (250,000 Examples in 8 shards, about
860 bytes each, in the page cache), batch 1024, parse to numpy columns, interleaved rounds,
medians. Paths:

- ``read_tfrecord(files, spec).batch(1024)``: the default (``num_parallel_reads=AUTOTUNE``),
  one thread (``None``), two, and with bytes as buffers;
- ``read_tfrecord(WorkQueue(files), spec).batch(1024)`` (in-process queue);
- ``read_shard(files, spec, slice_id=0, slice_count=1).batch(1024)``, and two static slices
  read at once in two threads (the rate of both together);
- ``to_torch()`` through a ``DataLoader`` with 0 and with 2 workers (worker start-up included);
- tf.data: sequential with autotune off, and ``num_parallel_reads=AUTOTUNE``; the faster is the anchor.

Also the bytes every reader of a split fetched (2 slices; 2 DataLoader workers; 8 readers of
one file through its index), against the dataset's size. Prints a table, writes JSON::

    python benchmarks/read_paths.py [--records 250000] [--rounds 3] [--no-tf] [--no-torch] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
from read_tfrecord import BATCH, SPEC, make_dataset, run_tf, settle  # noqa: E402

import shardfeed as sf  # noqa: E402
from shardfeed.adapters.torch import split_for_reader  # noqa: E402

_names = itertools.count()


def _count(ds) -> int:
    return sum(len(b["label"]) for b in ds)


def timed(fn):
    def run(files, _n):
        t0 = time.perf_counter()
        n = fn(files)
        return n, time.perf_counter() - t0
    return run


def read_default(files, **kw):
    return _count(sf.read_tfrecord(files, spec=SPEC, **kw).batch(BATCH))


def read_buffers(files):
    return _count(sf.read_tfrecord(files, spec=SPEC).batch(BATCH, bytes_as="buffer"))


def read_queue(files):
    q = sf.WorkQueue(files, backend="memory", name=f"bench-{next(_names)}", seed=0)
    return _count(sf.read_tfrecord(q, spec=SPEC).batch(BATCH))


def read_shard(files):
    return _count(sf.read_shard(files, SPEC, slice_id=0, slice_count=1).batch(BATCH))


def read_two_slices(files):
    out = [0, 0]

    def one(i):
        out[i] = _count(sf.read_shard(files, SPEC, slice_id=i, slice_count=2).batch(BATCH))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out)


def read_torch(files, workers):
    import torch.utils.data  # noqa: PLC0415

    ds = sf.read_tfrecord(files, spec=SPEC).batch(BATCH).to_torch(slice_id=0, slice_count=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    return sum(len(b["label"]) for b in loader)


def bytes_fetched(files, readers: int) -> int:
    """Frame bytes read by all ``readers`` shares of one pass (each share read in full)."""
    total = 0
    for r in range(readers):
        src = split_for_reader(sf.read_tfrecord(files, spec=SPEC), r, readers)
        _count(src.batch(BATCH))
        total += src.read_stats.bytes
    return total


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med = res["median"]
    anchor_name = res.get("anchor")
    anchor = med.get(anchor_name) if anchor_name else None
    anchor_txt = f"{anchor_name}: {_rows.rate(anchor, 'rec/s')}" if anchor else "- (no tf.data)"
    rows = [(name.strip(), _rows.rate(rate, "rec/s"), anchor_txt, _rows.ratio(rate / anchor if anchor else None))
            for name, rate in med.items() if not name.startswith("tf.data")]
    for what, ratio in res.get("bytes_fetched_ratio", {}).items():
        rows.append((f"bytes fetched, {what}", f"{ratio:.3f}x the data", "1.05x (target)", "-"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "ctr"))
    ap.add_argument("--no-tf", action="store_true", help="skip tf.data")
    ap.add_argument("--no-torch", action="store_true", help="skip the DataLoader rows")
    ap.add_argument("--json", default=os.path.join("bench-out", "read_paths.json"))
    args = ap.parse_args(argv)

    files = make_dataset(args.dir, args.records)
    total_bytes = sum(os.path.getsize(f) for f in files)
    n = args.records
    runners = {
        "read_tfrecord(files, spec).batch (default)": timed(read_default),
        "  num_parallel_reads=None (one thread)": timed(lambda f: read_default(f, num_parallel_reads=None)),
        "  num_parallel_reads=2": timed(lambda f: read_default(f, num_parallel_reads=2)),
        "  bytes_as='buffer'": timed(read_buffers),
        "read_tfrecord(WorkQueue(files), spec).batch": timed(read_queue),
        "read_shard(slice 0 of 1).batch": timed(read_shard),
        "read_shard, 2 slices in 2 threads (both)": timed(read_two_slices),
    }
    if not args.no_torch:
        try:
            import torch  # noqa: F401, PLC0415
        except ImportError:
            print("torch not installed: skipping the DataLoader rows", file=sys.stderr)
        else:
            runners["to_torch(), DataLoader 0 workers"] = timed(lambda f: read_torch(f, 0))
            runners["to_torch(), DataLoader 2 workers"] = timed(lambda f: read_torch(f, 2))
    if not args.no_tf:
        runners["tf.data sequential, autotune off"] = lambda f, k: run_tf(f, k, parallel=False)
        runners["tf.data num_parallel_reads=AUTOTUNE"] = lambda f, k: run_tf(f, k, parallel=True)
    for f in files:  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass
    rates: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(args.rounds):
        # each round in another (seeded) order: in a fixed order the default, first in the
        # list, always ran right after tf.data's AUTOTUNE run and its teardown, and came out
        # 5-10 % below its twin `num_parallel_reads=2` in every round
        names = list(runners)
        random.Random(r).shuffle(names)
        for name in names:
            fn = runners[name]
            got, dt = fn(files, n)
            settle()  # no thread of this configuration still busy while the next one is timed
            if got != n:
                raise SystemExit(f"{name}: read {got} records, expected {n}")
            rates[name].append(got / dt)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    tf_names = ("tf.data sequential, autotune off", "tf.data num_parallel_reads=AUTOTUNE")
    anchor_name = None if args.no_tf else max(tf_names, key=med.get)
    anchor = med[anchor_name] if anchor_name else None
    default = med["read_tfrecord(files, spec).batch (default)"]
    cores = os.cpu_count() or 1

    fetched = {
        "2 static slices": bytes_fetched(files, 2),
        "2 DataLoader workers": bytes_fetched(files, 2),
        "8 readers of 1 file (record ranges)": bytes_fetched(files[:1], 8),
    }
    fetched_ratio = {
        "2 static slices": fetched["2 static slices"] / total_bytes,
        "2 DataLoader workers": fetched["2 DataLoader workers"] / total_bytes,
        "8 readers of 1 file (record ranges)":
            fetched["8 readers of 1 file (record ranges)"] / os.path.getsize(files[0]),
    }

    print(f"\nCTR-like Examples: {n} records, {len(files)} shards, {total_bytes / 1e6:.0f} MB, batch {BATCH}, "
          f"{cores} cores, median of {args.rounds}; shardfeed {sf.native_info()}")
    print(f"{'path':<46} {'records/s':>12} {'vs default':>11} {'vs best tf.data':>16}")
    for name in runners:
        vs_tf = f"{med[name] / anchor:.2f}x" if anchor else "-"
        print(f"{name:<46} {med[name]:>12,.0f} {med[name] / default:>10.2f}x {vs_tf:>16}")
    print("\nbytes fetched by all readers of a split / dataset bytes:")
    for k, v in fetched_ratio.items():
        print(f"  {k:<40} {v:.3f}x")
    one = med["  num_parallel_reads=None (one thread)"]
    print(f"\ndefault / one thread: {default / one:.2f}x (target >= 1.6x on 2 cores)"
          + (f"   default / best tf.data ({anchor_name}): {default / anchor:.2f}x (target >= 5x)" if anchor else ""))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": n, "bytes": total_bytes, "rounds": args.rounds, "cores": cores,
              "native": sf.native_info(), "rates": rates, "median": med, "anchor": anchor_name,
              "default_vs_one_thread": default / one, "default_vs_best_tf": default / anchor if anchor else None,
              "bytes_fetched_ratio": fetched_ratio}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Read + parse CTR-like TFRecords to numpy: shardfeed against tf.data and a naive loop.

Writes (once, cached) 250,000 CTR-like Examples in 8 shards: an int64 label, 13 float
features, 26 short bytes features and one variable-length int64 list (41 features, about
860 bytes a record). Then, in one run on the same files, interleaved rounds, medians of 3:

- page cache: reading the bytes alone (the physical ceiling);
- shardfeed framing + CRC alone (native scan when built);
- shardfeed read + parse to numpy columns, batch 1024, one thread and two threads, with
  bytes features as numpy object arrays (the default) and as one buffer plus offsets;
- the same through the pipeline, ``read_tfrecord(files, spec).batch(1024)``;
- tf.data, batch 1024, parse_example, ``.numpy()`` on every output, (a) sequential reads
  with autotune off and (b) ``num_parallel_reads=AUTOTUNE``; the faster one is the anchor;
- a naive loop: struct framing + protobuf ``Example.FromString`` per record.

Prints a table with records/s and ratios and writes JSON (``--json``). Usage::

    python benchmarks/read_tfrecord.py [--records 250000] [--rounds 3] [--no-tf] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import threading
import time

import _rows
import numpy as np

import shardfeed as sf
from shardfeed.formats.chunks import iter_frame_chunks, iter_record_batches
from shardfeed.formats.parse import parse_batch

SHARDS = 8
BATCH = 1024
INT_FEATURES = [f"I{i}" for i in range(1, 14)]
CAT_FEATURES = [f"C{i}" for i in range(1, 27)]
SPEC = {"label": sf.FixedLen("int64"), "ids": sf.VarLen("int64")}
SPEC.update({k: sf.FixedLen("float32") for k in INT_FEATURES})
SPEC.update({k: sf.FixedLen("bytes") for k in CAT_FEATURES})


def make_dataset(directory: str, records: int) -> list[str]:
    marker = os.path.join(directory, f"READY-{records}")
    files = [os.path.join(directory, f"ctr-{s:05d}-of-{SHARDS:05d}.tfrecord") for s in range(SHARDS)]
    if os.path.exists(marker):
        return files
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-records // SHARDS)
    done = 0
    t0 = time.perf_counter()
    for url in files:
        n = min(per, records - done)
        dense = rng.normal(size=(n, 13)).astype(np.float32)
        cats = rng.integers(0, 1 << 32, size=(n, 26))
        lens = rng.integers(1, 20, size=n)
        with sf.TFRecordWriter(url) as w:
            for i in range(n):
                feats = {"label": [int(i % 2)], "ids": rng.integers(0, 1 << 40, size=lens[i])}
                for j, k in enumerate(INT_FEATURES):
                    feats[k] = [float(dense[i, j])]
                for j, k in enumerate(CAT_FEATURES):
                    feats[k] = [f"{cats[i, j]:08x}".encode()]
                w.write(sf.encode_example(feats))
        done += n
    open(marker, "w").close()
    print(f"wrote {records} records in {SHARDS} shards in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return files


# ----------------------------------------------------------------------------- runners
# Each returns (records, seconds).

def run_page_cache(files, n_records):
    t0 = time.perf_counter()
    total = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(8 << 20):
                total += len(chunk)
    return n_records, time.perf_counter() - t0


def run_framing(files, _n):
    t0 = time.perf_counter()
    n = 0
    for f in files:
        for chunk in iter_frame_chunks(f):
            n += chunk.count
    return n, time.perf_counter() - t0


def _parse_files(files, out, bytes_as="object"):
    n = 0
    for batch in iter_record_batches(files, BATCH):
        cols = parse_batch(batch, SPEC, bytes_as=bytes_as)
        n += len(cols["label"])
    out.append(n)


def run_shardfeed(files, _n, bytes_as="object"):
    out: list[int] = []
    t0 = time.perf_counter()
    _parse_files(files, out, bytes_as)
    return out[0], time.perf_counter() - t0


def run_pipeline(files, _n):
    t0 = time.perf_counter()
    n = 0
    for batch in sf.read_tfrecord(files, spec=SPEC).batch(BATCH):
        n += len(batch["label"])
    return n, time.perf_counter() - t0


def run_shardfeed_2threads(files, _n, bytes_as="object"):
    out: list[int] = []
    threads = [threading.Thread(target=_parse_files, args=(files[i::2], out, bytes_as)) for i in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out), time.perf_counter() - t0


def _tf_spec(tf):
    spec = {"label": tf.io.FixedLenFeature([], tf.int64), "ids": tf.io.VarLenFeature(tf.int64)}
    spec.update({k: tf.io.FixedLenFeature([], tf.float32) for k in INT_FEATURES})
    spec.update({k: tf.io.FixedLenFeature([], tf.string) for k in CAT_FEATURES})
    return spec


def run_tf(files, _n, parallel: bool):
    import tensorflow as tf

    spec = _tf_spec(tf)
    if parallel:
        ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        ds = ds.batch(BATCH).map(lambda x: tf.io.parse_example(x, spec), num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.prefetch(tf.data.AUTOTUNE)
    else:
        ds = tf.data.TFRecordDataset(files).batch(BATCH).map(lambda x: tf.io.parse_example(x, spec))
        opts = tf.data.Options()
        opts.autotune.enabled = False
        ds = ds.with_options(opts)
    n = 0
    t0 = time.perf_counter()
    it = iter(ds)
    for batch in it:
        cols = {k: (v.values.numpy() if isinstance(v, tf.SparseTensor) else v.numpy()) for k, v in batch.items()}
        n += len(cols["label"])
    elapsed = time.perf_counter() - t0  # the clock stops at the last batch, before teardown
    del it
    settle()
    return n, elapsed


def settle(timeout: float = 10.0) -> None:
    """Wait until this process's background threads are idle (at most ``timeout`` s).

    Dropping a tf.data iterator leaves its autotune and thread-pool teardown running for up
    to seconds: measured next, the following configuration would share a core with it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c0, t0 = time.process_time(), time.monotonic()
        time.sleep(0.1)
        if time.process_time() - c0 < 0.05 * (time.monotonic() - t0):
            return


def run_naive(files, _n):
    from tensorflow.core.example import example_pb2  # protobuf classes; any protobuf install has them too

    t0 = time.perf_counter()
    n = 0
    head = struct.Struct("<QI")
    for f in files:
        with open(f, "rb") as fh:
            while hdr := fh.read(12):
                length, _ = head.unpack(hdr)
                data = fh.read(length)
                fh.read(4)
                example_pb2.Example.FromString(data)
                n += 1
    return n, time.perf_counter() - t0


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med = res["median"]
    best = res.get("derived", {}).get("best_tf")
    anchor = med.get(best) if best else None
    rows = []
    for name, rate in med.items():
        if not name.startswith("shardfeed"):
            continue
        rows.append((name, _rows.rate(rate, "rec/s"),
                     f"{best}: {_rows.rate(anchor, 'rec/s')}" if anchor else "- (no tf.data)",
                     _rows.ratio(rate / anchor if anchor else None)))
    ceiling = med.get("page cache read (ceiling)")
    framing = med.get("shardfeed framing + CRC")
    if ceiling and framing:
        rows.append(("framing + CRC vs page-cache read", _rows.rate(framing, "rec/s"),
                     f"page cache: {_rows.rate(ceiling, 'rec/s')}", _rows.ratio(framing / ceiling)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "ctr"))
    ap.add_argument("--no-tf", action="store_true", help="skip tf.data and the protobuf loop")
    ap.add_argument("--json", default=os.path.join("bench-out", "read_tfrecord.json"))
    args = ap.parse_args(argv)

    files = make_dataset(args.dir, args.records)
    total_bytes = sum(os.path.getsize(f) for f in files)
    n_records = args.records
    runners = {
        "page cache read (ceiling)": run_page_cache,
        "shardfeed framing + CRC": run_framing,
        "shardfeed read+parse, 1 thread": run_shardfeed,
        "shardfeed read+parse, 2 threads": run_shardfeed_2threads,
        "shardfeed bytes as buffers, 1 thread": lambda f, n: run_shardfeed(f, n, "buffer"),
        "shardfeed bytes as buffers, 2 threads": lambda f, n: run_shardfeed_2threads(f, n, "buffer"),
        "shardfeed pipeline read_tfrecord(spec).batch": run_pipeline,
    }
    if not args.no_tf:
        runners["tf.data sequential, autotune off"] = lambda f, n: run_tf(f, n, parallel=False)
        runners["tf.data num_parallel_reads=AUTOTUNE"] = lambda f, n: run_tf(f, n, parallel=True)
        runners["naive loop (struct + protobuf FromString)"] = run_naive
    for f in files:  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass
    rates: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(args.rounds):
        for name, fn in runners.items():
            n, dt = fn(files, n_records)
            if n != n_records:
                raise SystemExit(f"{name}: read {n} records, expected {n_records}")
            rates[name].append(n / dt)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    tf_best_name = None
    if not args.no_tf:
        tf_best_name = max(("tf.data sequential, autotune off", "tf.data num_parallel_reads=AUTOTUNE"), key=med.get)
    anchor = med[tf_best_name] if tf_best_name else None
    rec_bytes = total_bytes / n_records
    print(f"\nCTR-like Examples: {n_records} records, {SHARDS} shards, {total_bytes / 1e6:.0f} MB "
          f"({rec_bytes:.0f} B/record), batch {BATCH}, median of {args.rounds}; shardfeed {sf.native_info()}")
    print(f"{'configuration':<44} {'records/s':>12} {'MB/s':>9} {'vs best tf.data':>16}")
    for name in runners:
        ratio = f"{med[name] / anchor:.2f}x" if anchor else "-"
        print(f"{name:<44} {med[name]:>12,.0f} {med[name] * rec_bytes / 1e6:>9,.0f} {ratio:>16}")
    derived = {
        "framing_vs_page_cache": med["shardfeed framing + CRC"] / med["page cache read (ceiling)"],
        "two_threads_vs_one": med["shardfeed read+parse, 2 threads"] / med["shardfeed read+parse, 1 thread"],
        "two_threads_vs_one_buffers": (med["shardfeed bytes as buffers, 2 threads"]
                                       / med["shardfeed bytes as buffers, 1 thread"]),
    }
    if anchor:
        derived["shardfeed_1thread_vs_best_tf"] = med["shardfeed read+parse, 1 thread"] / anchor
        derived["best_tf"] = tf_best_name
    print(f"\nframing+CRC / page cache: {derived['framing_vs_page_cache']:.0%}   "
          f"2 threads / 1 thread: {derived['two_threads_vs_one']:.2f}x "
          f"(buffers {derived['two_threads_vs_one_buffers']:.2f}x)"
          + (f"   shardfeed (1 thread) / best tf.data: {derived['shardfeed_1thread_vs_best_tf']:.2f}x"
             if anchor else ""))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": n_records, "bytes": total_bytes, "rounds": args.rounds, "native": sf.native_info(),
              "rates": rates, "median": med, "derived": derived}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``shardfeed demo``: write a sample CTR-like dataset to TFRecord shards, read it back,
check it, and print what happened."""

from __future__ import annotations

import time

import numpy as np

from .. import storage
from ..formats import tfrecord as tfr
from ..formats.example import encode_example
from ..formats.parse import parse_batch
from ..formats.spec import FixedLen, VarLen
from .progress import progress_bar

DEMO_SPEC = {
    "label": FixedLen("int64"),
    "dense": FixedLen("float32", shape=[13]),
    "cat": FixedLen("bytes", shape=[4]),
    "history": VarLen("int64"),
}


def make_records(n: int, seed: int = 0):
    """``n`` serialized Examples shaped like click-through-rate data, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(n, 13)).astype(np.float32)
    weights = np.linspace(-1.0, 1.0, 13, dtype=np.float32)
    labels = (dense @ weights + rng.normal(scale=0.5, size=n) > 0).astype(np.int64)
    cats = rng.integers(0, 1000, size=(n, 4))
    lengths = rng.integers(0, 8, size=n)
    for i in range(n):
        yield encode_example({
            "label": [int(labels[i])],
            "dense": dense[i],
            "cat": [f"c{j}_{cats[i, j]}".encode() for j in range(4)],
            "history": rng.integers(0, 10_000, size=lengths[i]),
        })


def run_demo(out: str, records: int = 20_000, shards: int = 4) -> int:
    print(f"shardfeed demo: {records} CTR-like records -> {shards} TFRecord shards in {out}")
    per_shard = -(-records // shards)
    t0 = time.perf_counter()
    gen = make_records(records)
    written = 0
    with progress_bar(total=records, desc="write", unit="rec") as bar:
        for s in range(shards):
            url = f"{out.rstrip('/')}/demo-{s:05d}-of-{shards:05d}.tfrecord"
            with tfr.TFRecordWriter(url, index=True) as w:
                for _ in range(min(per_shard, records - written)):
                    w.write(next(gen))
                    written += 1
            bar.update(w.records)
    t_write = time.perf_counter() - t0
    files = storage.expand(f"{out.rstrip('/')}/demo-*-of-*.tfrecord")
    total_bytes = sum(storage.size(u) for u in files)
    print(f"  wrote {written} records, {total_bytes / 1e6:.1f} MB in {len(files)} shards "
          f"(+ index files) in {t_write:.2f} s")

    t0 = time.perf_counter()
    n = 0
    label_sum = 0
    dense_sum = np.zeros(13, np.float64)
    batch: list[bytes] = []

    def flush():
        nonlocal n, label_sum, batch
        cols = parse_batch(batch, DEMO_SPEC)
        n += len(batch)
        label_sum += int(cols["label"].sum())
        dense_sum[:] += cols["dense"].sum(axis=0)
        batch = []

    stats = tfr.ReadStats()
    for record in tfr.read_records(files, stats=stats):
        batch.append(record)
        if len(batch) == 1024:
            flush()
    if batch:
        flush()
    t_read = time.perf_counter() - t0
    ok = n == written and stats.skipped_records == 0
    print(f"  read back {n} records (CRC-checked, parsed to numpy in batches of 1024) "
          f"in {t_read:.2f} s: {n / t_read:,.0f} records/s")
    print(f"  positive labels: {label_sum / max(n, 1):.1%}; mean of dense[0]: {dense_sum[0] / max(n, 1):+.3f}")
    shard = tfr.IndexedTFRecord(files[-1])
    print(f"  random access through {files[-1].rsplit('/', 1)[-1]}.idx: record {len(shard) - 1} "
          f"of that shard is {len(shard[len(shard) - 1])} bytes")
    print(f"  {'OK' if ok else 'MISMATCH'}: every record written was read back once")
    print(f"  try: shardfeed head -n 2 {files[0]}   |   shardfeed verify '{out.rstrip('/')}/*.tfrecord'")
    return 0 if ok else 1

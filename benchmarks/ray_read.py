"""shardfeed on Ray Data against Ray's own ``ray.data.read_tfrecords``, and against shardfeed
in-process on the same cores; images decoded by the image stage as a ``map_batches`` step.

One local Ray cluster (``ray.init(num_cpus=N)``: a raylet and worker processes), the same
files for every row, batches of 1,024 through ``iter_batches`` (numpy), interleaved rounds,
medians. Rows:

- CTR table (benchmarks/read_tfrecord.py's files: label, 13 floats, 26 short bytes, a list;
  and a copy of ``--long-records`` records, whose passes are long enough that Ray Data's
  first second of each pass, planned with no CPUs, is a small part of them):
  ``ray.data.read_tfrecords`` (its default path: Examples parsed in Python, or through
  TensorFlow when installed), ``sf.ray.read_tfrecord`` (native parse into Arrow) into numpy
  batches and into ``pyarrow`` batches, Ray Data's floor (the same parsed blocks already in the
  object store, ``materialize()`` d once, into numpy batches: what the engine's consumer side
  costs with no reading at all), and ``sf.read_tfrecord(...).batch(1024)`` in this process
  with N parse threads;
- JPEG records (500x375, about 45 KB): decoded and resized to 224x224 after
  ``sf.ray.read_tfrecord`` by ``map_batches(sf.ray.DecodeImages, concurrency=N)`` (actors) and
  by ``map_batches(sf.ray.DecodeImages(...))`` (an instance: tasks, fused with the read),
  against ``decode_images(..., num_parallel_calls=N)`` in this process.

Ratios are medians of the per-round ratios (a busy machine slows a whole round, not one row). Bytes fetched from
object storage are checked by tests/test_ray.py against a proxy's count. ::

    python benchmarks/ray_read.py [--records 200000] [--long-records 2000000] [--images 2000] [--cpus 2]
                                  [--rounds 3] [--json out.json]

Also printed: the median seconds from ``iter_batches`` to the first batch of a pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
from pipeline_images import make_jpegs, write_jpeg_records  # noqa: E402
from read_tfrecord import BATCH, SPEC, make_dataset  # noqa: E402

import shardfeed as sf  # noqa: E402

FIRST_BATCH: dict[str, list[float]] = {}
"""Seconds from ``iter_batches`` to the first batch, per row name (the row being timed)."""
_TIMING: list[str] = []  # the name of the row being timed (none in the warm-up)


def _drain_ray(ds, batch_format: str = "numpy") -> int:
    n = 0
    t0 = time.perf_counter()
    for b in ds.iter_batches(batch_size=BATCH, batch_format=batch_format):
        if n == 0 and _TIMING:
            FIRST_BATCH.setdefault(_TIMING[-1], []).append(time.perf_counter() - t0)
        n += b.num_rows if batch_format == "pyarrow" else len(next(iter(b.values())))
    return n


def tf_schema():
    """The CTR table's schema for ``read_tfrecords`` (tensorflow-metadata): without one it infers
    each Example's types, and a list feature with one value in some records and several in
    others fails to unify (``ids``: int64 vs list<int64>)."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    kinds = {"int64": schema_pb2.FeatureType.INT, "float32": schema_pb2.FeatureType.FLOAT,
             "bytes": schema_pb2.FeatureType.BYTES}
    schema = schema_pb2.Schema()
    for name, feature in SPEC.items():
        f = schema.feature.add()
        f.name, f.type = name, kinds[feature.dtype]
    return schema


def ray_builtin(files):
    import ray

    return _drain_ray(ray.data.read_tfrecords(files, tf_schema=tf_schema()))


def ours_on_ray(files, batch_format: str = "numpy"):
    return _drain_ray(sf.ray.read_tfrecord(files, SPEC), batch_format)


def ours_in_process(files, cpus):
    return sum(len(b["label"]) for b in sf.read_tfrecord(files, SPEC, num_parallel_reads=cpus).batch(BATCH))


IMAGE_SPEC = {"image/encoded": sf.FixedLen("bytes"), "image/class/label": sf.FixedLen("int64")}


def images_on_ray(files, cpus):
    """Actors: a pool of ``cpus`` started for each pass (each builds its decoder once)."""
    ds = sf.ray.read_tfrecord(files, IMAGE_SPEC).map_batches(
        sf.ray.DecodeImages, fn_constructor_args=("image/encoded", 224), concurrency=cpus, num_cpus=0.5,
        batch_size=64, batch_format="numpy")
    return _drain_ray(ds)


def images_on_ray_fused(files):
    """An instance with ``batch_size=None`` (a block a batch): Ray fuses it into the read tasks
    (no actor pool to start, the encoded images never pass through the object store)."""
    ds = sf.ray.read_tfrecord(files, IMAGE_SPEC).map_batches(
        sf.ray.DecodeImages("image/encoded", 224), batch_size=None, batch_format="numpy")
    return _drain_ray(ds)


def images_in_process(files, cpus):
    ds = sf.read_tfrecord(files, IMAGE_SPEC).batch(64).decode_images("image/encoded", 224, num_parallel_calls=cpus)
    return sum(len(b["image/class/label"]) for b in ds)


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows". The ratio is the median of
    the per-round ratios."""
    med, rates = res["median_per_s"], res["rates"]
    rows = []
    for name, anchor in res["anchors"]:  # [name, anchor] pairs
        unit = "img/s" if "JPEG" in name else "rec/s"
        per_round = [a / b for a, b in zip(rates[name], rates[anchor]) if b]
        rows.append((name, _rows.rate(med[name], unit), f"{anchor}: {_rows.rate(med[anchor], unit)}",
                     _rows.ratio(statistics.median(per_round) if per_round else None)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--long-records", type=int, default=2_000_000,
                    help="records of the long-pass rows (0: leave them out)")
    ap.add_argument("--builtin-records", type=int, default=20_000,
                    help="records for ray.data.read_tfrecords (it reads ~1k records/s: a subset of the files)")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-ray"))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    files = make_dataset(os.path.join(args.dir, "ctr"), args.records)
    long_files = make_dataset(os.path.join(args.dir, "ctr-long"), args.long_records) if args.long_records else None
    small = make_dataset(os.path.join(args.dir, "ctr-small"), args.builtin_records)
    jpegs = make_jpegs(min(args.images, 200), 500, 375)
    jpegs = (jpegs * (-(-args.images // len(jpegs))))[:args.images]
    img_files = write_jpeg_records(os.path.join(args.dir, "jpeg"), jpegs, f"jpeg{args.images}", shards=4)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False

    floor = sf.ray.read_tfrecord(files, SPEC).materialize()  # the same blocks, parsed once
    in_proc = f"sf.read_tfrecord in-process, {args.cpus} threads (CTR)"
    img_in_proc = f"in-process decode_images, {args.cpus} threads (JPEG -> 224)"
    rows = {
        "ray.data.read_tfrecords (CTR)": (lambda: ray_builtin(small), "records"),
        "sf.ray.read_tfrecord (CTR)": (lambda: ours_on_ray(files), "records"),
        "sf.ray.read_tfrecord, pyarrow batches (CTR)": (lambda: ours_on_ray(files, "pyarrow"), "records"),
        "Ray Data floor: materialized blocks to numpy batches (CTR)": (lambda: _drain_ray(floor), "records"),
        in_proc: (lambda: ours_in_process(files, args.cpus), "records"),
        "sf.ray: read + DecodeImages map_batches, actors (JPEG -> 224)": (
            lambda: images_on_ray(img_files, args.cpus), "images"),
        "sf.ray: read + DecodeImages instance, fused tasks (JPEG -> 224)": (
            lambda: images_on_ray_fused(img_files), "images"),
        img_in_proc: (lambda: images_in_process(img_files, args.cpus), "images"),
    }
    long_ray = f"sf.ray.read_tfrecord, {args.long_records:,} records (CTR)"
    long_in_proc = f"sf.read_tfrecord in-process, {args.cpus} threads, {args.long_records:,} records (CTR)"
    if long_files:
        rows[long_ray] = (lambda: ours_on_ray(long_files), "records")
        rows[long_in_proc] = (lambda: ours_in_process(long_files, args.cpus), "records")
    rates: dict[str, list[float]] = {k: [] for k in rows}
    for fn, _ in rows.values():  # warm-up: page cache, worker processes, imports
        fn()
    FIRST_BATCH.clear()
    for _ in range(args.rounds):
        for name, (fn, _) in rows.items():
            _TIMING[:] = [name]
            t0 = time.perf_counter()
            n = fn()
            rates[name].append(n / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    names = list(rows)
    # ours on Ray against Ray's reader, against in-process (what the engine costs), against Ray's
    # floor (the consumer side alone); the floor against in-process; the image steps against
    # the in-process stage
    anchors = [[names[1], names[0]], [names[1], in_proc], [names[2], in_proc], [names[1], names[3]],
               [names[3], in_proc], [names[5], img_in_proc], [names[6], img_in_proc]]
    if long_files:
        anchors.append([long_ray, long_in_proc])
    first = {k: statistics.median(v) for k, v in FIRST_BATCH.items()}
    result = {"cpus": args.cpus, "rounds": args.rounds, "median_per_s": med, "rates": rates,
              "anchors": anchors, "first_batch_s": first}
    result["rows"] = table_rows(result)
    print(f"{'path':62s} {'per second':>14s}  ratio")
    for name in names:
        unit = rows[name][1]
        print(f"{name:62s} {med[name]:>10,.0f} {unit[:3]}/s")
    for row in result["rows"]:
        print("  " + " | ".join(row))
    print("first batch of a pass (median s):")
    for name, t in first.items():
        print(f"  {name:62s} {t:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

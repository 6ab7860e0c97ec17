"""Convert JPEGs + a CSV to resized TFRecord shards: shardfeed's local runner against a
straightforward ``tf.io.TFRecordWriter`` + PIL loop.

Writes (once, cached) 5,000 JPEG images of 640x480 (photo-like: smooth gradients plus
noise, about 60 KB each) and a ``split,image_uri,label`` CSV. Then, in one run on the same
files, interleaved rounds, medians:

- anchor: the loop most people write: for each row ``Image.open``, ``convert("RGB")``,
  ``thumbnail`` to 224, JPEG encode, build a ``tf.train.Example``, ``tf.io.TFRecordWriter``;
- shardfeed ``convert(max_image_size=224)``, local runner, 2 worker threads (reduced-size
  DCT decoding with ``draft``, GIL released in Pillow);
- shardfeed with 2 worker processes.

Prints a table with images/s and the ratio to the anchor, writes JSON (``--json``). Usage::

    python benchmarks/convert.py [--images 5000] [--rounds 1] [--no-tf] [--json bench-out/convert.json]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import _rows
import numpy as np

import shardfeed
from shardfeed.convert import convert

MAX_SIZE = 224
LABELS = ("cat", "dog", "bird", "fish")


def make_dataset(directory: str, n: int) -> str:
    from PIL import Image

    csv_path = os.path.join(directory, f"images-{n}.csv")
    if os.path.exists(csv_path):
        return csv_path
    os.makedirs(os.path.join(directory, "img"), exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:480, 0:640].astype(np.float32)
    t0 = time.perf_counter()
    rows = []
    for i in range(n):
        a, b, c = rng.uniform(0.2, 1.0, 3)
        base = np.stack([xx * a / 640 * 255, yy * b / 480 * 255, (xx + yy) * c / 1120 * 255], axis=2)
        img = np.clip(base + rng.normal(0, 12, (480, 640, 3)), 0, 255).astype(np.uint8)
        path = os.path.join(directory, "img", f"{i:05d}.jpg")
        Image.fromarray(img).save(path, "JPEG", quality=90)
        rows.append(("TRAIN" if i % 10 else "TEST", path, LABELS[i % len(LABELS)]))
        if i and i % 1000 == 0:
            print(f"  generated {i} images ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    tmp = csv_path + ".tmp"
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows([("split", "image_uri", "label"), *rows])
    os.replace(tmp, csv_path)
    return csv_path


def anchor_loop(csv_path: str, out: str) -> int:
    """The straightforward conversion: one thread, full-size decode, one Example at a time."""
    import tensorflow as tf
    from PIL import Image

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    labels = {name: i for i, name in enumerate(sorted({r["label"] for r in rows}))}
    os.makedirs(out, exist_ok=True)
    writers = {s: tf.io.TFRecordWriter(os.path.join(out, f"{s}.tfrecord")) for s in ("train", "test")}
    n = 0
    for r in rows:
        im = Image.open(r["image_uri"]).convert("RGB")
        im.thumbnail((MAX_SIZE, MAX_SIZE))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        ex = tf.train.Example(features=tf.train.Features(feature={
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buf.getvalue()])),
            "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"jpeg"])),
            "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[im.height])),
            "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[im.width])),
            "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[r["label"]]])),
            "image/class/text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[r["label"].encode()])),
        }))
        writers[r["split"].lower()].write(ex.SerializeToString())
        n += 1
    for w in writers.values():
        w.close()
    return n


def shardfeed_run(csv_path: str, out: str, executor: str, workers: int) -> int:
    res = convert(csv_path, out, max_image_size=MAX_SIZE, executor=executor, read_parallel_num=workers,
                  num_samples_per_tfrecord=256, progress=False)
    return res.records_written


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    results = res["results"]
    anchor_name = next((k for k in results if k.startswith("anchor")), None)
    anchor = results[anchor_name]["images_per_s"] if anchor_name else None
    anchor_txt = f"{anchor_name.removeprefix('anchor: ')}: {_rows.rate(anchor, 'img/s')}" if anchor else None
    return [(f"{res['images']} JPEGs -> max side {res['max_image_size']}: {name}",
             _rows.rate(r["images_per_s"], "img/s"), anchor_txt or "- (no TensorFlow)",
             _rows.ratio(r["images_per_s"] / anchor if anchor else None))
            for name, r in results.items() if name != anchor_name]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians are reported")
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-convert"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-tf", action="store_true", help="skip the TensorFlow anchor")
    ap.add_argument("--json", default=os.path.join("bench-out", "convert.json"))
    args = ap.parse_args(argv)

    print(f"preparing {args.images} JPEGs 640x480 in {args.data_dir} ...", file=sys.stderr)
    csv_path = make_dataset(args.data_dir, args.images)
    cases = {
        f"shardfeed local, {args.workers} threads": lambda out: shardfeed_run(csv_path, out, "thread", args.workers),
        f"shardfeed local, {args.workers} processes": lambda out: shardfeed_run(csv_path, out, "process", args.workers),
    }
    if not args.no_tf:
        cases = {"anchor: PIL + tf.io.TFRecordWriter loop": lambda out: anchor_loop(csv_path, out), **cases}
    times: dict[str, list[float]] = {k: [] for k in cases}
    counts: dict[str, int] = {}
    work = tempfile.mkdtemp(prefix="sf-bench-out-")
    try:
        for rnd in range(args.rounds):
            for name, fn in cases.items():
                out = os.path.join(work, f"r{rnd}-{len(times[name])}-{abs(hash(name))}")
                t0 = time.perf_counter()
                counts[name] = fn(out)
                times[name].append(time.perf_counter() - t0)
                shutil.rmtree(out, ignore_errors=True)
                print(f"  round {rnd + 1}: {name}: {times[name][-1]:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    anchor = next((k for k in times if k.startswith("anchor")), None)
    results = {}
    print(f"\n{args.images} JPEGs 640x480 -> max side {MAX_SIZE}, {os.cpu_count()} cores, median of {args.rounds}")
    print(f"{'case':<44} {'seconds':>8} {'images/s':>9} {'vs anchor':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        rate = counts[name] / med
        ratio = rate / (counts[anchor] / statistics.median(times[anchor])) if anchor else None
        results[name] = {"seconds": med, "images_per_s": rate, "ratio_to_anchor": ratio, "all_seconds": ts,
                         "records": counts[name]}
        print(f"{name:<44} {med:>8.2f} {rate:>9.0f} {(f'{ratio:.2f}x' if ratio else '-'):>9}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"images": args.images, "size": [640, 480], "max_image_size": MAX_SIZE, "rounds": args.rounds,
              "cores": os.cpu_count(), "shardfeed": shardfeed.__version__, "results": results}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

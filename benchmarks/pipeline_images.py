"""JPEG records -> decode -> resize to 224x224 -> batches of 64, on 2 threads: shardfeed's
pipeline against tf.data on the same files, in one run, interleaved rounds, medians.

shardfeed: ``read_tfrecord(files, spec).batch(64)`` (records parsed natively a batch at a
time) ``.map(decode_resize, num_parallel_calls=2).prefetch(2)``, decoding with simplejpeg
(libjpeg-turbo) when installed, else Pillow, with reduced-size DCT decoding when the image
is at least twice the target. tf.data: ``TFRecordDataset -> map(parse + decode_jpeg +
resize, num_parallel_calls=2) -> batch(64) -> prefetch``, ``.numpy()`` on every batch.
Beside the user map, the same pipeline through the built-in stage:
``.batch(64).decode_images("image/encoded", 224, num_parallel_calls=2).prefetch(2)``
(JSON: its rates under the "decode_images stage" name, and ``stage_vs_map``).

    python benchmarks/pipeline_images.py [--images 3000] [--width 224 --height 224] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time

import _rows
import numpy as np

import shardfeed as sf

TARGET = 224
BATCH = 64
SPEC = {"image/encoded": sf.FixedLen("bytes"), "image/class/label": sf.FixedLen("int64")}


def make_files(directory: str, n: int, width: int, height: int, shards: int = 4) -> list[str]:
    from PIL import Image

    marker = os.path.join(directory, f"READY-{n}-{width}x{height}")
    files = [os.path.join(directory, f"img-{s:05d}-of-{shards:05d}.tfrecord") for s in range(shards)]
    if os.path.exists(marker):
        return files
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width]
    per = -(-n // shards)
    for s, url in enumerate(files):
        with sf.TFRecordWriter(url) as w:
            for i in range(min(per, n - s * per)):
                # smooth gradients plus noise: compresses like a photo (about 15 KB at 224x224)
                a, b, c = rng.uniform(0, 255, 3)
                img = np.stack([(a + xx * 0.5) % 256, (b + yy * 0.7) % 256, (c + (xx + yy) * 0.3) % 256], -1)
                img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, "JPEG", quality=85)
                w.write(sf.encode_example({"image/encoded": [buf.getvalue()], "image/class/label": [i % 10]}))
    open(marker, "w").close()
    return files


def make_decoder():
    try:
        import simplejpeg

        def decode_one(data: bytes) -> np.ndarray:
            img = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=TARGET, min_width=TARGET)
            if img.shape[:2] != (TARGET, TARGET):
                from PIL import Image

                img = np.asarray(Image.fromarray(img).resize((TARGET, TARGET), Image.BILINEAR))
            return img

        return decode_one, "simplejpeg"
    except ImportError:
        from PIL import Image

        def decode_one(data: bytes) -> np.ndarray:
            img = Image.open(io.BytesIO(data))
            img.draft("RGB", (TARGET, TARGET))  # reduced-size DCT decoding when the image is large
            return np.asarray(img.convert("RGB").resize((TARGET, TARGET), Image.BILINEAR))

        return decode_one, "Pillow"


def run_shardfeed(files, decode_one):
    def decode_batch(b):
        return np.stack([decode_one(x) for x in b["image/encoded"]]), b["image/class/label"]

    ds = sf.read_tfrecord(files, spec=SPEC).batch(BATCH).map(decode_batch, num_parallel_calls=2).prefetch(2)
    n = 0
    t0 = time.perf_counter()
    with iter(ds) as it:
        for images, labels in it:
            assert images.shape[1:] == (TARGET, TARGET, 3)
            n += len(labels)
    return n, time.perf_counter() - t0


def run_stage(files):
    ds = (sf.read_tfrecord(files, spec=SPEC).batch(BATCH)
          .decode_images("image/encoded", TARGET, num_parallel_calls=2).prefetch(2))
    n = 0
    t0 = time.perf_counter()
    with iter(ds) as it:
        for b in it:
            assert b["image/encoded"].shape[1:] == (TARGET, TARGET, 3)
            n += len(b["image/class/label"])
    return n, time.perf_counter() - t0


def run_tf(files):
    import tensorflow as tf

    feats = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
             "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(rec):
        ex = tf.io.parse_single_example(rec, feats)
        img = tf.io.decode_jpeg(ex["image/encoded"], channels=3)
        img = tf.cast(tf.image.resize(img, [TARGET, TARGET]), tf.uint8)
        return img, ex["image/class/label"]

    ds = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=2).batch(BATCH).prefetch(2)
    n = 0
    t0 = time.perf_counter()
    for images, labels in ds:
        images.numpy()
        n += len(labels.numpy())
    return n, time.perf_counter() - t0  # the clock stops at the last batch


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med = res["median"]
    anchor = med.get("tf.data, 2 threads")
    w, h = res["size"]
    return [(f"JPEG {w}x{h} -> 224, batch 64: {name}", _rows.rate(v, "img/s"),
             f"tf.data: {_rows.rate(anchor, 'img/s')}" if anchor else "- (no TensorFlow)",
             _rows.ratio(v / anchor if anchor else None))
            for name, v in med.items() if not name.startswith("tf.data")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--width", type=int, default=224)
    ap.add_argument("--height", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "images"))
    ap.add_argument("--no-tf", action="store_true")
    ap.add_argument("--json", default=os.path.join("bench-out", "pipeline_images.json"))
    args = ap.parse_args(argv)
    files = make_files(args.dir, args.images, args.width, args.height)
    decode_one, decoder = make_decoder()
    map_name = f"shardfeed pipeline ({decoder}), 2 threads"
    stage_name = "shardfeed decode_images stage, 2 threads"
    runners = {map_name: lambda: run_shardfeed(files, decode_one), stage_name: lambda: run_stage(files)}
    if not args.no_tf:
        runners["tf.data, 2 threads"] = lambda: run_tf(files)
    rates: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            n, dt = fn()
            if n != args.images:
                raise SystemExit(f"{name}: {n} images, expected {args.images}")
            rates[name].append(n / dt)
    med = {k: statistics.median(v) for k, v in rates.items()}
    anchor = med.get("tf.data, 2 threads")
    print(f"\nJPEG {args.width}x{args.height} -> {TARGET}x{TARGET}, batch {BATCH}, {args.images} images, "
          f"median of {args.rounds}")
    print(f"{'configuration':<44} {'images/s':>10} {'vs tf.data':>11}")
    for name, v in med.items():
        print(f"{name:<44} {v:>10,.0f} {(f'{v / anchor:.2f}x' if anchor else '-'):>11}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"images": args.images, "size": [args.width, args.height], "decoder": decoder, "rates": rates,
              "median": med, "stage_vs_map": med[stage_name] / med[map_name]}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

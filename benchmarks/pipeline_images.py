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

The anchors (issue 22 #5's targets), on sources the script makes (500x375 and 1,600x1,200
JPEGs, ``--sources``), resized to 224x224, interleaved rounds, medians; each row reports
images per wall second and per CPU-second of the process (its threads together):

- libjpeg-turbo's own DCT-scaled decode alone: ``simplejpeg.decode_jpeg(data,
  min_height=224, min_width=224)`` (the smallest of libjpeg-turbo's M/8 scales that still
  covers 224x224), and the same with ``fastdct=True, fastupsample=True``; one thread, and
  two threads each decoding half of the images;
- the whole stage, one thread: ``sf.DecodeImages("image", 224)`` on in-memory batches of 64
  (decode, resize, batch), with and without the fast flags;
- the stage in a pipeline, two threads: ``read_tfrecord(files, spec).batch(64)
  .decode_images("image", 224, num_parallel_calls=2)``;
- SPDL ``spdl.io.load_image_batch(batch, width=224, height=224)`` (FFmpeg's decoder and
  scaler), one thread and two threads, where spdl is installed (reported "not installed"
  otherwise);
- tf.data (``decode_jpeg`` + ``resize`` + batch, two threads), where TensorFlow is installed.

    python benchmarks/pipeline_images.py [--images 3000] [--width 224 --height 224] [--rounds 3]
        [--sources 500x375,1600x1200] [--anchor-images N]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import threading
import time

import _rows
import numpy as np
from read_tfrecord import settle

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



# -- the anchors: the decoder alone, the stage, SPDL, tf.data, on made sources -------------------
ANCHOR_BATCH = 64


def make_jpegs(n: int, width: int, height: int, seed: int = 0) -> list[bytes]:
    """Photo-like JPEGs (quality 90): smooth colour ramps, a few soft shapes and mild noise;
    about 290 KB at 1,600x1,200 and 45 KB at 500x375."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for _ in range(n):
        a, b, c = rng.uniform(0, 255, 3)
        img = np.stack([(a + xx * 0.3) % 256, (b + yy * 0.4) % 256, (c + (xx + yy) * 0.2) % 256], -1)
        for _ in range(6):  # soft discs: edges for the DCT to spend bits on
            cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0.05, 0.3) * min(width, height)
            img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
        img = np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def write_jpeg_records(directory: str, jpegs: list[bytes], tag: str, shards: int = 2) -> list[str]:
    marker = os.path.join(directory, f"READY-{tag}")
    files = [os.path.join(directory, f"{tag}-{s:05d}-of-{shards:05d}.tfrecord") for s in range(shards)]
    if os.path.exists(marker):
        return files
    os.makedirs(directory, exist_ok=True)
    per = -(-len(jpegs) // shards)
    for s, url in enumerate(files):
        with sf.TFRecordWriter(url) as w:
            for i, data in enumerate(jpegs[s * per:(s + 1) * per]):
                w.write(sf.encode_example({"image/encoded": [data], "image/class/label": [i % 10]}))
    open(marker, "w").close()
    return files


def timed(fn) -> tuple[int, float, float]:
    """(images, wall seconds, CPU seconds of the whole process) of ``fn()``, which returns images."""
    c0, t0 = time.process_time(), time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t0, time.process_time() - c0


def in_threads(parts: list, fn, threads: int) -> int:
    """``fn(part)`` for each part, the parts dealt to ``threads`` threads in contiguous chunks."""
    done = [0] * threads
    chunk = -(-len(parts) // threads)

    def work(k: int) -> None:
        done[k] = sum(fn(p) for p in parts[k * chunk:(k + 1) * chunk])

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done)


def anchor_runners(jpegs: list[bytes], files: list[str], no_tf: bool) -> dict:
    import simplejpeg

    batches = []
    for i in range(0, len(jpegs), ANCHOR_BATCH):
        col = np.empty(len(jpegs[i:i + ANCHOR_BATCH]), object)
        col[:] = jpegs[i:i + ANCHOR_BATCH]
        batches.append({"image": col, "label": np.arange(len(col))})

    def decoder(fast: bool):
        def one(data: bytes) -> int:
            simplejpeg.decode_jpeg(data, min_height=TARGET, min_width=TARGET, fastdct=fast, fastupsample=fast)
            return 1
        return one

    def stage(fast: bool):
        dec = sf.DecodeImages("image", TARGET, fast_dct=fast, fast_upsample=fast)

        def one(batch: dict) -> int:
            out = dec(batch)["image"]
            assert out.shape[1:] == (TARGET, TARGET, 3)
            return len(out)
        return one

    def pipeline(threads: int) -> int:
        ds = (sf.read_tfrecord(files, spec=SPEC).batch(ANCHOR_BATCH)
              .decode_images("image/encoded", TARGET, num_parallel_calls=threads))
        n = 0
        with iter(ds) as it:
            for b in it:
                n += len(b["image/encoded"])
        return n

    runners = {
        "libjpeg-turbo DCT-scaled decode alone, 1 thread": lambda: in_threads(jpegs, decoder(False), 1),
        "libjpeg-turbo DCT-scaled decode alone, fast flags, 1 thread": lambda: in_threads(jpegs, decoder(True), 1),
        "decode_images stage, 1 thread": lambda: in_threads(batches, stage(False), 1),
        "decode_images stage, fast flags, 1 thread": lambda: in_threads(batches, stage(True), 1),
        "libjpeg-turbo DCT-scaled decode alone, 2 threads": lambda: in_threads(jpegs, decoder(False), 2),
        "decode_images pipeline, 2 threads": lambda: pipeline(2),
    }
    try:
        import spdl.io
    except ImportError:
        pass
    else:
        lists = [list(b["image"]) for b in batches]

        def spdl_batch(srcs: list) -> int:
            buf = spdl.io.load_image_batch(srcs, width=TARGET, height=TARGET, pix_fmt="rgb24")
            arr = spdl.io.to_numpy(buf)
            assert arr.shape[1:] == (TARGET, TARGET, 3)
            return len(arr)

        runners["SPDL load_image_batch, 1 thread"] = lambda: in_threads(lists, spdl_batch, 1)
        runners["SPDL load_image_batch, 2 threads"] = lambda: in_threads(lists, spdl_batch, 2)
    if not no_tf:
        runners["tf.data, 2 threads"] = lambda: run_tf(files)[0]
    return runners


def run_anchors(args) -> dict:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return {"error": "simplejpeg is not installed: the anchors need libjpeg-turbo's decode"}
    result: dict = {}
    for source in args.sources.split(","):
        w, h = (int(v) for v in source.lower().split("x"))
        n = args.anchor_images if w * h <= 640 * 480 else max(8, args.anchor_images // 4)
        jpegs = make_jpegs(n, w, h, seed=w * h)
        files = write_jpeg_records(os.path.join(args.dir, "anchors"), jpegs, f"{w}x{h}-{n}")
        runners = anchor_runners(jpegs, files, args.no_tf)
        walls: dict[str, list[float]] = {k: [] for k in runners}
        cpus: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(args.rounds):
            for name, fn in runners.items():
                settle()  # no thread of the previous configuration (tf.data's teardown, SPDL's) still busy
                got, wall, cpu = timed(fn)
                if got != n:
                    raise SystemExit(f"{source} {name}: {got} images, expected {n}")
                walls[name].append(n / wall)
                cpus[name].append(n / cpu if cpu > 0 else float("nan"))
        med = {k: statistics.median(v) for k, v in walls.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpus.items()}
        dec = "libjpeg-turbo DCT-scaled decode alone"
        dec1, dec1f, dec2 = f"{dec}, 1 thread", f"{dec}, fast flags, 1 thread", f"{dec}, 2 threads"
        ratios = {
            "stage / decoder, 1 thread": med["decode_images stage, 1 thread"] / med[dec1],
            "stage / decoder, fast flags, 1 thread": med["decode_images stage, fast flags, 1 thread"] / med[dec1f],
            "pipeline / decoder, 2 threads": med["decode_images pipeline, 2 threads"] / med[dec2],
        }
        if "SPDL load_image_batch, 1 thread" in med:
            ratios["stage / SPDL per CPU-second"] = (med_cpu["decode_images stage, 1 thread"]
                                                    / med_cpu["SPDL load_image_batch, 1 thread"])
            ratios["stage fast flags / SPDL per CPU-second"] = (med_cpu["decode_images stage, fast flags, 1 thread"]
                                                               / med_cpu["SPDL load_image_batch, 1 thread"])
        result[f"{w}x{h}"] = {"images": n, "mean_bytes": int(np.mean([len(j) for j in jpegs])),
                              "img_per_s": walls, "img_per_cpu_s": cpus, "median": med, "median_per_cpu_s": med_cpu,
                              "ratios": ratios, "spdl": "installed" if "SPDL load_image_batch, 1 thread" in med
                              else "not installed"}
        print(f"\nJPEG {w}x{h} (mean {result[f'{w}x{h}']['mean_bytes']:,} bytes) -> {TARGET}x{TARGET}, {n} images, "
              f"median of {args.rounds}, load average {os.getloadavg()[0]:.1f}")
        print(f"{'configuration':<62} {'img/s':>8} {'img/CPU-s':>10}")
        for name in runners:
            print(f"{name:<62} {med[name]:>8,.0f} {med_cpu[name]:>10,.0f}")
        if result[f"{w}x{h}"]["spdl"] == "not installed":
            print(f"{'SPDL load_image_batch':<62} {'not installed':>19}")
        for k, v in ratios.items():
            print(f"  {k}: {v:.2f}")
    return result

def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med = res["median"]
    anchor = med.get("tf.data, 2 threads")
    w, h = res["size"]
    rows: list[_rows.Row] = [(f"JPEG {w}x{h} -> 224, batch 64: {name}", _rows.rate(v, "img/s"),
                              f"tf.data: {_rows.rate(anchor, 'img/s')}" if anchor else "- (no TensorFlow)",
                              _rows.ratio(v / anchor if anchor else None))
                             for name, v in med.items() if not name.startswith("tf.data")]
    for source, a in res.get("anchors", {}).items():
        if not isinstance(a, dict) or "median" not in a:
            continue
        m, c = a["median"], a["median_per_cpu_s"]
        pairs = [("stage, 1 thread", "decode_images stage, 1 thread", "libjpeg-turbo DCT-scaled decode alone, 1 thread",
                  m, "img/s"),
                 ("stage, fast flags, 1 thread", "decode_images stage, fast flags, 1 thread",
                  "libjpeg-turbo DCT-scaled decode alone, fast flags, 1 thread", m, "img/s"),
                 ("pipeline, 2 threads", "decode_images pipeline, 2 threads",
                  "libjpeg-turbo DCT-scaled decode alone, 2 threads", m, "img/s")]
        for label, ours, theirs, table, unit in pairs:
            rows.append((f"JPEG {source} -> 224: {label} vs libjpeg-turbo decode alone", _rows.rate(table[ours], unit),
                         f"decoder: {_rows.rate(table[theirs], unit)}", _rows.ratio(table[ours] / table[theirs])))
        spdl = "SPDL load_image_batch, 1 thread"
        for label, ours in (("stage", "decode_images stage, 1 thread"),
                            ("stage, fast flags", "decode_images stage, fast flags, 1 thread")):
            rows.append((f"JPEG {source} -> 224: {label} vs SPDL load_image_batch, per CPU-second",
                         _rows.rate(c[ours], "img/CPU-s"),
                         f"SPDL: {_rows.rate(c[spdl], 'img/CPU-s')}" if spdl in c else "- (spdl not installed)",
                         _rows.ratio(c[ours] / c[spdl] if spdl in c else None)))
        if "tf.data, 2 threads" in m:
            rows.append((f"JPEG {source} -> 224: pipeline, 2 threads vs tf.data",
                         _rows.rate(m["decode_images pipeline, 2 threads"], "img/s"),
                         f"tf.data: {_rows.rate(m['tf.data, 2 threads'], 'img/s')}",
                         _rows.ratio(m["decode_images pipeline, 2 threads"] / m["tf.data, 2 threads"])))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--width", type=int, default=224)
    ap.add_argument("--height", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "images"))
    ap.add_argument("--no-tf", action="store_true")
    ap.add_argument("--sources", default="500x375,1600x1200",
                    help="the anchors' source sizes, WxH comma-separated ('' skips the anchors)")
    ap.add_argument("--anchor-images", type=int, default=0,
                    help="images per anchor run at 640x480 and below (a quarter of it, at least 8, above); "
                         "default: --images / 8, at least 16")
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
    if args.sources:
        args.anchor_images = args.anchor_images or max(16, args.images // 8)
        result["anchors"] = run_anchors(args)
    result["load_average"] = os.getloadavg()
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

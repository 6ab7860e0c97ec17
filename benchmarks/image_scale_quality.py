"""Decoding a JPEG at a reduced DCT scale, then resizing exactly, against decoding at full
size and resizing exactly: the cost in quality and the gain, if any, in speed, for the scale
``decode_images`` picks and for the one libjpeg-turbo's own "smallest that covers" rule picks.

For each source size (``--sources``), photo-like JPEGs made as ``pipeline_images.py`` makes
its anchors' (quality 90, 4:2:0) are decoded to RGBX by simplejpeg (libjpeg-turbo) three
ways and resized to 224x224 by the native resampler (Pillow's bilinear values):

- ``full``: ``decode_jpeg(data)``, then the exact resize (the reference);
- ``stage``: what ``decode_images`` does: the full decode below twice the target, at or above
  it ``min_height=224, min_width=224, min_factor=2`` (an M/8 scale at least 2x smaller);
- ``M/8``: ``decode_jpeg(data, min_height=224, min_width=224)`` (the smallest of the sixteen
  M/8 scales that still covers 224, the scale the benchmark's anchor and Pillow's ``draft``
  use), then the exact resize.

It prints, for ``stage`` and ``M/8`` against ``full``, the PSNR, the mean, 99.9th percentile
and largest absolute difference and the share of values that differ, and each way's CPU time
per image (decode alone, and decode + resize; the thread's CPU time, interleaved rounds,
medians).

    python benchmarks/image_scale_quality.py [--sources 500x375,640x480,800x600] [--images 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _rows
import numpy as np
from pipeline_images import TARGET, make_jpegs

from shardfeed import _native


def measure(w: int, h: int, images: int, rounds: int) -> dict:
    import simplejpeg

    jpegs = make_jpegs(images, w, h, seed=w * h)
    full_kw = {} if min(w, h) < 2 * TARGET else {"min_height": TARGET, "min_width": TARGET, "min_factor": 2}
    ways = {"full": {}, "stage": full_kw, "M/8": {"min_height": TARGET, "min_width": TARGET}}
    buf = np.empty(4 * w * h + 64, np.uint8)
    out = {k: np.empty((images, TARGET, TARGET, 3), np.uint8) for k in ways}
    decode_us: dict[str, list[float]] = {k: [] for k in ways}
    total_us: dict[str, list[float]] = {k: [] for k in ways}
    scaled = {}
    for _ in range(rounds):
        for name, kw in ways.items():
            t0 = time.thread_time()
            for data in jpegs:
                simplejpeg.decode_jpeg(data, colorspace="RGBX", buffer=buf, **kw)
            decode_us[name].append((time.thread_time() - t0) / images * 1e6)
            t0 = time.thread_time()
            for i, data in enumerate(jpegs):
                a = simplejpeg.decode_jpeg(data, colorspace="RGBX", buffer=buf, **kw)
                _native.resample(a, a.shape[0], a.shape[1], 4, out[name][i], TARGET, TARGET, 3, TARGET, TARGET,
                                 0, 0, 2)
                scaled[name] = f"{a.shape[1]}x{a.shape[0]}"
            total_us[name].append((time.thread_time() - t0) / images * 1e6)
    quality = {}
    for name in ("stage", "M/8"):
        d = out["full"].astype(np.int16) - out[name].astype(np.int16)
        mse = float(np.mean(d.astype(np.float64) ** 2))
        ad = np.abs(d)
        quality[name] = {"psnr_db": 10 * np.log10(255 ** 2 / mse) if mse else float("inf"),
                         "mean_abs": float(ad.mean()), "p999_abs": float(np.percentile(ad, 99.9)),
                         "max_abs": int(ad.max()), "share_differing": float(np.mean(d != 0))}
    return {"source": f"{w}x{h}", "decoded_at": scaled, "mean_bytes": int(np.mean([len(j) for j in jpegs])),
            "quality": quality, "decode_us": {k: statistics.median(v) for k, v in decode_us.items()},
            "decode_resize_us": {k: statistics.median(v) for k, v in total_us.items()}}


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints: per source, the stage's way and the M/8 way, each
    decode + exact resize against the full decode + exact resize (ratio: the full path's CPU
    time over the way's, >1: the way is cheaper), with the way's PSNR in its name."""
    rows: list[_rows.Row] = []
    for r in res["sources"]:
        full = r["decode_resize_us"]["full"]
        for way in ("stage", "M/8"):
            q = r["quality"][way]
            us = r["decode_resize_us"][way]
            rows.append((f"{r['source']} -> {TARGET}: {way} (decoded at {r['decoded_at'][way]}, "
                         f"PSNR {q['psnr_db']:.1f} dB)", f"{us:,.0f} us/img", f"full decode: {full:,.0f} us/img",
                         _rows.ratio(full / us if us else None)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", default="500x375,640x480,800x600")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=os.path.join("bench-out", "image_scale_quality.json"))
    args = ap.parse_args(argv)
    if getattr(_native, "resample", None) is None:
        raise SystemExit("the native core's resampler is not built (python setup.py build_ext --inplace)")
    rows = []
    for source in args.sources.split(","):
        w, h = (int(v) for v in source.lower().split("x"))
        rows.append(measure(w, h, args.images, args.rounds))
    print(f"\nJPEG -> {TARGET}x{TARGET} bilinear, decoded at a DCT scale + exact resize against full decode + exact "
          f"resize; {args.images} images, median of {args.rounds}, load average {os.getloadavg()[0]:.1f}, "
          f"resampler {_native.resample_backend()}")
    print(f"{'source':<10} {'way':<6} {'decoded at':<11} {'PSNR dB':>8} {'mean':>6} {'p99.9':>6} {'max':>5} "
          f"{'differ':>7} {'decode us':>10} {'+ resize us':>12}")
    for r in rows:
        for way in ("full", "stage", "M/8"):
            q = r["quality"].get(way)
            cols = (f"{q['psnr_db']:>8.1f} {q['mean_abs']:>6.2f} {q['p999_abs']:>6.0f} {q['max_abs']:>5} "
                    f"{q['share_differing']:>7.0%}") if q else f"{'(reference)':>36}"
            print(f"{r['source']:<10} {way:<6} {r['decoded_at'][way]:<11} {cols} {r['decode_us'][way]:>10.0f} "
                  f"{r['decode_resize_us'][way]:>12.0f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    res = {"sources": rows, "load_average": os.getloadavg(), "resampler": _native.resample_backend()}
    res["rows"] = table_rows(res)
    with open(args.json, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

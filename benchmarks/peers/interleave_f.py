"""Workload (f), converting an image folder, for two checkouts of shardfeed and Mosaic's
``MDSWriter``, in interleaved rounds: each round runs every contestant once (the order
rotating) through ``benchmarks/peers/run.py --child`` of its own checkout, the same
measurement as ``shardfeed bench peers --workloads f`` (``common.measure``: wall time, CPU
seconds of the process, images written). Prints medians and writes JSON.

    python benchmarks/peers/interleave_f.py --before /path/to/main --after . \
        --rounds 6 --epochs 3 --images 2000 --dir /tmp/peers-data --json /tmp/f.json

``--before`` and ``--after`` are source checkouts (their ``src`` goes on ``PYTHONPATH``;
build the native core in each); Mosaic runs from ``--after``'s harness. The image folder
is made once under ``--dir`` (the same one ``run.py --dir`` makes and keeps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="checkout whose shardfeed is 'before'")
    ap.add_argument("--after", default=".", help="checkout whose shardfeed is 'after' (default: this one)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=3, help="conversions per child process")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--dir", required=True, help="data folder (the image folder is made here once)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    root = os.path.abspath(args.dir)
    os.makedirs(root, exist_ok=True)
    after = os.path.abspath(args.after)
    contestants = [("before", os.path.abspath(args.before), "shardfeed"), ("after", after, "shardfeed"),
                   ("mosaic", after, "mosaic")]
    res: dict[str, list[dict]] = {name: [] for name, _, _ in contestants}
    loads = []
    for r in range(args.rounds):
        for name, tree, peer in contestants[r % 3:] + contestants[:r % 3]:
            scratch = tempfile.mkdtemp(prefix="sf-peers-", dir=root)
            ctx = {"root": root, "ctr_records": 10_000, "images": args.images, "width": 500, "height": 375,
                   "scratch": scratch, "extra": {"epochs": args.epochs}}
            fd, out = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"), PYTHONWARNINGS="ignore")
            try:
                p = subprocess.run([sys.executable, os.path.join(tree, "benchmarks", "peers", "run.py"), "--child",
                                    "read", peer, "f", json.dumps(ctx), out], env=env, capture_output=True, text=True)
                with open(out) as f:
                    d = json.load(f)
            finally:
                os.unlink(out)
                shutil.rmtree(scratch, ignore_errors=True)
            if "error" in d:
                print(f"{name}: {d['error']}\n{p.stdout[-2000:]}", file=sys.stderr)
                return 1
            for e in d["epochs"]:
                if e["count"] != args.images:
                    print(f"{name}: wrote {e['count']} images, not {args.images}", file=sys.stderr)
                    return 1
                res[name].append({"images_per_s": e["count"] / e["seconds"],
                                  "cpu_us_per_image": 1e6 * e["cpu_seconds"] / e["count"]})
        loads.append(os.getloadavg()[0])
    print(f"(f) {args.images:,} JPEGs of 500x375, {args.rounds} rounds x {args.epochs} conversions per contestant, "
          f"interleaved; load average (1 min) after each round: {' '.join(f'{x:.2f}' for x in loads)}")
    print(f"{'':8s} {'images/s':>9s} {'CPU us/image':>13s}  {'images/s range':>15s}")
    summary = {}
    for name, rows in res.items():
        rate = statistics.median(x["images_per_s"] for x in rows)
        cpu = statistics.median(x["cpu_us_per_image"] for x in rows)
        lo, hi = min(x["images_per_s"] for x in rows), max(x["images_per_s"] for x in rows)
        summary[name] = {"images_per_s": rate, "cpu_us_per_image": cpu}
        print(f"{name:8s} {rate:9,.0f} {cpu:13.1f}  {lo:7,.0f}-{hi:,.0f}")
    a, m, b = summary["after"], summary["mosaic"], summary["before"]
    for other, o in (("mosaic", m), ("before", b)):
        print(f"after/{other}: {a['images_per_s'] / o['images_per_s']:.2f}x images/s, "
              f"{o['cpu_us_per_image'] / a['cpu_us_per_image']:.2f}x less CPU per image")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": res, "loads": loads, "images": args.images,
                       "rounds": args.rounds, "epochs": args.epochs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

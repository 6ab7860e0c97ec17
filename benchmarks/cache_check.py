"""The object cache's per-pass check: epoch 2 read from a full ``cache_dir`` through a
proxy that adds 20 ms per request (``benchmarks/_shaping_proxy.py``) to a moto S3 server.

Every pass checks each cached object against storage (a changed object is fetched again)
and its cached bytes (a damaged copy is never served). This script times epoch 2 of two
source trees in one run, interleaved (``--rounds`` rounds, each tree's order alternating
per round): ``--before`` (a copy of ``src/`` with an older cache, e.g. made by
``git show``) and ``--after`` (default: this checkout's ``src/``). Each epoch runs in its
own interpreter (fresh filesystems, nothing warm but the page cache) and the proxy counts
what reached storage. Each interpreter reads the cached dataset twice: its first pass (a new
process: object sizes not known yet) and the next (a training loop's epoch 2). Prints, per
tree, the median seconds of both, HEADs and other requests, and the medians of the
per-round ratios after/before. Usage::

    python benchmarks/cache_check.py --before /tmp/sf-before/src --objects 40 --total-mb 278 [--rounds 5]
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
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
import object_storage as osb  # noqa: E402
from _shaping_proxy import ShapingProxy  # noqa: E402

_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import shardfeed as sf
urls = json.loads(sys.argv[4])
ds = sf.read_tfrecord(urls, storage_options={"endpoint_url": sys.argv[2]}, cache_dir=sys.argv[3])
out = {}
for name in ("fresh", "seconds"):  # a new process's first pass (sizes unknown yet), then the next pass
    t0 = time.perf_counter()
    it = iter(ds)
    n = sum(1 for _ in it)
    out[name] = time.perf_counter() - t0
st = it.stats().storage
print(json.dumps({**out, "records": n, "hits": st.cache_hits, "misses": st.cache_misses,
                  "object_gets": st.requests}))
"""


def _epoch(src: str, proxy: ShapingProxy, cache: str, urls: list[str]) -> dict:
    before = proxy.counters()
    out = subprocess.run([sys.executable, "-c", _CHILD, src, proxy.url, cache, json.dumps(urls)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"epoch with {src} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    d = ShapingProxy.delta(proxy.counters(), before)
    res.update(gets=d["gets"], heads=d["heads"], other=d["requests"] - d["gets"] - d["heads"])
    return res


def main(argv: list[str] | None = None) -> int:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=None,
                    help="the src/ folder of the tree to compare against (default: --after itself: the "
                         "run then times this tree alone, its ratios 1.0, as `shardfeed bench` runs it)")
    ap.add_argument("--after", default=here)
    ap.add_argument("--also", action="append", default=[], metavar="NAME=SRC",
                    help="another tree to time in the same rounds (a variant to compare)")
    ap.add_argument("--objects", type=int, default=40)
    ap.add_argument("--total-mb", type=float, default=278.0)
    ap.add_argument("--record-kb", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--json", default=os.path.join("bench-out", "cache_check.json"))
    args = ap.parse_args(argv)
    if args.before is None:
        args.before = args.after

    rec = int(args.record_kb * 1000)
    per = max(1, round(args.total_mb * 1e6 / args.objects / (rec + 16)))
    counts = [per] * args.objects
    scratch = tempfile.mkdtemp(prefix="sf-cache-check-")
    moto = proxy = None
    trees = {"before": args.before, "after": args.after, **dict(a.split("=", 1) for a in args.also)}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    try:
        paths = osb.write_shards(os.path.join(scratch, "shards"), counts, rec, 0)
        total = sum(os.path.getsize(p) for p in paths)
        moto = osb.MotoServer()
        bucket = f"sf-cache-{uuid.uuid4().hex[:8]}"
        objects = osb.upload(moto.url, bucket, paths)
        shutil.rmtree(os.path.join(scratch, "shards"), ignore_errors=True)
        proxy = ShapingProxy("127.0.0.1", moto.port, latency_s=args.latency_ms / 1e3, conn_bytes_per_s=25e6).start()
        urls = [f"s3://{bucket}/{k}" for k, _ in objects]
        caches = {k: os.path.join(scratch, f"cache-{k}") for k in trees}
        for k, src in trees.items():  # epoch 1: fill each tree's own cache
            _epoch(src, proxy, caches[k], urls)
        ratios: dict[str, list[float]] = {k: [] for k in trees if k != "before"}
        fresh_ratios: dict[str, list[float]] = {k: [] for k in ratios}
        for rnd in range(args.rounds):
            order = list(trees)[rnd % len(trees):] + list(trees)[:rnd % len(trees)]  # each first in turn
            got = {k: _epoch(trees[k], proxy, caches[k], urls) for k in order}
            for k, r in got.items():
                if r["records"] != sum(counts) or r["object_gets"] or r["misses"]:
                    raise RuntimeError(f"{k}: epoch 2 was not read from the cache: {r}")
                runs[k].append(r)
            for k in ratios:
                ratios[k].append(got[k]["seconds"] / got["before"]["seconds"])
                fresh_ratios[k].append(got[k]["fresh"] / got["before"]["fresh"])
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(f"{k} {r['seconds']:.3f} s" for k, r in got.items()),
                  file=sys.stderr)
    finally:
        if proxy is not None:
            proxy.stop()
        if moto is not None:
            moto.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("fresh", "seconds", "heads", "other", "gets")}
           for k, v in runs.items()}
    print(f"\nepoch 2 from a full cache: {args.objects} objects, {total / 1e6:,.0f} MB, proxy {args.latency_ms:g} "
          f"ms/request; median of {args.rounds} interleaved rounds, {os.cpu_count()} cores")
    print("(each tree's process reads the cached dataset twice: 'new process' is its first pass, sizes not yet "
          "known; 'next pass' the one after, as a training loop's epoch 2; requests of both passes)")
    print(f"{'tree':8} {'new process s':>14} {'next pass s':>12} {'HEADs':>6} {'other req':>9} {'GETs':>5}"
          "  (GETs: listings; no object GET)")
    for k, m in med.items():
        print(f"{k:8} {m['fresh']:14.3f} {m['seconds']:12.3f} {m['heads']:6.0f} {m['other']:9.0f} {m['gets']:5.0f}")
    for k in ratios:
        print(f"{k} / before, median of per-round ratios: new process {statistics.median(fresh_ratios[k]):.2f}, "
              f"next pass {statistics.median(ratios[k]):.2f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            res = {"args": vars(args), "total_bytes": total, "median": med, "ratios": ratios,
                   "fresh_ratios": fresh_ratios, "runs": runs}
            res["rows"] = table_rows(res)
            json.dump(res, f, indent=1)
    return 0


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints: each tree's epoch 2 from the full cache (its check
    included), the before tree as the anchor."""
    before = res["median"]["before"]
    rows = []
    for k, m in res["median"].items():
        if k == "before" and len(res["median"]) > 1 and res["args"]["before"] == res["args"]["after"]:
            continue  # the same tree twice: one row
        rows.append((f"{k}: epoch 2 from cache ({m['heads']:.0f} HEADs, {m['gets']:.0f} listings)",
                     f"{m['seconds']:.3f} s", f"before: {before['seconds']:.3f} s",
                     _rows.ratio(before["seconds"] / m["seconds"])))
    return rows


if __name__ == "__main__":
    sys.exit(main())

"""Peak RSS while streaming records through a default pipeline (read_tfrecord with parallel
reads, shuffle, batch, prefetch): memory stays bounded, whatever the data size.

    python benchmarks/pipeline_memory.py [--size-mb 2048] [--record-kb 8] [--out memory.json]
The stream runs in a fresh subprocess, so its peak RSS is the pipeline's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import _rows

CHILD = r"""
import resource, sys, time
import shardfeed as sf
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
spec = {"id": sf.FixedLen("int64"), "payload": sf.FixedLen("bytes")}
ds = sf.read_tfrecord(sys.argv[1], spec=spec, num_parallel_reads=4).shuffle(1000, seed=0).batch(256).prefetch()
t = time.perf_counter(); n = 0; nbytes = 0
for b in ds:
    n += len(b["id"])
print(n, time.perf_counter() - t, base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    conf = f"peak RSS streaming {res['size_mb']} MB ({res['records']} records)"
    return [(conf, f"{res['pipeline_mb']} MB above imports", "-", "-")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--record-kb", type=int, default=8)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--out", default=os.path.join("bench-out", "pipeline_memory.json"))
    a = ap.parse_args()
    import shardfeed as sf

    rec_bytes = a.record_kb << 10
    n_records = (a.size_mb << 20) // rec_bytes
    per_file = max(1, n_records // a.files)
    with tempfile.TemporaryDirectory() as d:
        payload = os.urandom(rec_bytes)
        for f in range(a.files):
            sf.write_records(os.path.join(d, f"part-{f:04d}.tfrecord"),
                             (sf.encode_example({"id": [i], "payload": [payload]}) for i in range(per_file)))
        out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(d, "*.tfrecord")], capture_output=True,
                             text=True, check=True)
    n, secs, base_kb, peak_kb = out.stdout.split()
    res = {"size_mb": a.size_mb, "records": int(n), "record_kb": a.record_kb, "seconds": round(float(secs), 2),
           "rss_after_imports_mb": round(int(base_kb) / 1024, 1), "peak_rss_mb": round(int(peak_kb) / 1024, 1)}
    res["pipeline_mb"] = round(res["peak_rss_mb"] - res["rss_after_imports_mb"], 1)
    print(f"{'data MB':>8}{'records':>10}{'s':>8}{'RSS after import MB':>21}{'peak RSS MB':>13}{'pipeline MB':>13}")
    print(f"{a.size_mb:>8}{res['records']:>10}{res['seconds']:>8}{res['rss_after_imports_mb']:>21}"
          f"{res['peak_rss_mb']:>13}{res['pipeline_mb']:>13}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    res["rows"] = table_rows(res)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()

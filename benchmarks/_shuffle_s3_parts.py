"""Where the S3 rows of ``shuffle.py`` spend: per row, records/s, the reader's CPU-seconds
(``getrusage``), moto's and the shaping proxy's (``/proc/PID/stat``) and the requests the
proxy saw, for one pass; interleaved rounds, medians. A helper for profiling, not a
``shardfeed bench`` row (no JSON rows)::

    PYTHONPATH=src python benchmarks/_shuffle_s3_parts.py [--dir bench-out/ctr] [--rounds 3]
        [--rows seq,b2048,bytes4,bytes8]

Rows: ``seq`` (sequential), ``b2048`` (``shuffle="blocks", block_size=2048``), ``bytes4``
(``shuffle="blocks"``, the default 4 MiB cut), ``bytes8`` (the cut at 8 MiB, set through
``spans.DEFAULT_BLOCK_BYTES`` for the row). Under a profiler::

    py-spy record -r 200 -f raw -o prof.txt -- python benchmarks/_shuffle_s3_parts.py --rows b2048
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shuffle as bench  # noqa: E402

import shardfeed.pipeline.spans as spans  # noqa: E402


def _cpu(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join("bench-out", "ctr"))
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="seq,b2048,bytes4,bytes8")
    args = ap.parse_args(argv)
    files = bench.make_dataset(args.dir, args.records)
    rows = args.rows.split(",")
    default = spans.DEFAULT_BLOCK_BYTES
    s3 = bench.S3Setup(files, 20, 25)

    def source(name: str):
        spans.DEFAULT_BLOCK_BYTES = 8 << 20 if name == "bytes8" else default
        kw = {"seq": {}, "b2048": {"shuffle": "blocks", "seed": 0, "block_size": 2048},
              "bytes4": {"shuffle": "blocks", "seed": 0}, "bytes8": {"shuffle": "blocks", "seed": 0}}[name]
        return s3.source(**kw).batch(bench.BATCH)

    res: dict[str, list[tuple]] = {k: [] for k in rows}
    try:
        moto, proxy = s3.moto.proc.pid, getattr(s3.proxy._proc, "pid", None)
        for _ in range(args.rounds):
            for name in rows:
                ds = source(name)
                u0, m0, p0, q0 = resource.getrusage(resource.RUSAGE_SELF), _cpu(moto), _cpu(proxy), \
                    s3.proxy.counters()["requests"]
                n, dt = bench._rate(ds)
                u1, m1, p1, q1 = resource.getrusage(resource.RUSAGE_SELF), _cpu(moto), _cpu(proxy), \
                    s3.proxy.counters()["requests"]
                res[name].append((n / dt, u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime, m1 - m0, p1 - p0,
                                  q1 - q0))
        spans.DEFAULT_BLOCK_BYTES = default
    finally:
        s3.stop()
    first = statistics.median(x[0] for x in res[rows[0]])
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.rounds}; ratios against {rows[0]}")
    print(f"{'row':8} {'records/s':>10} {'ratio':>6} {'reader cpu s':>12} {'moto cpu s':>10} {'proxy cpu s':>11} "
          f"{'requests':>8}")
    for name, v in res.items():
        m = [statistics.median(x[i] for x in v) for i in range(5)]
        print(f"{name:8} {m[0]:10,.0f} {m[0] / first:6.2f} {m[1]:12.2f} {m[2]:10.2f} {m[3]:11.2f} {m[4]:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

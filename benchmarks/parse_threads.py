"""How parse threads scale on the default read path: ``num_parallel_reads`` 1, 2 and 3
(one thread per core is the default), bytes features as numpy object arrays and as
buffers, interleaved in one process so that the machine's drift hits every row alike.
Object batches are parsed on the native parse pool (``num_parallel_reads - 1`` threads that
never take the GIL, and the consumer); the rows "object (Python threads)" parse them the way
they were before it, on Python threads (``SHARDFEED_PARSE_POOL=0``), as the anchor for it.

Same CTR-like files as ``benchmarks/read_tfrecord.py`` (page cache), batch 1024::

    python benchmarks/parse_threads.py [--records 250000] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
from read_tfrecord import BATCH, SPEC, make_dataset  # noqa: E402

import shardfeed as sf  # noqa: E402


def run(files, threads: int, bytes_as: str, pool: bool = True, spec=SPEC) -> float:
    reads = None if threads == 1 else threads
    os.environ["SHARDFEED_PARSE_POOL"] = "1" if pool else "0"
    try:
        t0 = time.perf_counter()
        n = sum(len(b["label"]) for b in sf.read_tfrecord(files, spec=spec, num_parallel_reads=reads)
                .batch(BATCH, bytes_as=bytes_as))
        return n / (time.perf_counter() - t0)
    finally:
        os.environ.pop("SHARDFEED_PARSE_POOL", None)


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med = res["median"]
    rows = []
    for name, rate in med.items():
        one_name = name.split(",")[0] + ", 1 thread(s)"
        if name != one_name:
            rows.append((name, _rows.rate(rate, "rec/s"), f"{one_name}: {_rows.rate(med[one_name], 'rec/s')}",
                         _rows.ratio(rate / med[one_name])))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=os.path.join("bench-out", "ctr"))
    ap.add_argument("--json", default=os.path.join("bench-out", "parse_threads.json"))
    ap.add_argument("--no-bytes", action="store_true", help="the spec without its bytes features (numbers only)")
    args = ap.parse_args(argv)
    spec = {k: v for k, v in SPEC.items() if v.dtype != "bytes"} if args.no_bytes else SPEC
    files = make_dataset(args.dir, args.records)
    rates: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for bytes_as in ("object", "buffer"):
            for threads in (1, 2, 3):
                rates.setdefault(f"{bytes_as}, {threads} thread(s)", []).append(
                    run(files, threads, bytes_as, spec=spec))
        for threads in (1, 2, 3):
            rates.setdefault(f"object (Python threads), {threads} thread(s)", []).append(
                run(files, threads, "object", pool=False, spec=spec))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n{args.records} CTR-like records{' (no bytes features)' if args.no_bytes else ''}, batch {BATCH}, "
          f"{os.cpu_count()} cores, median of {args.rounds}")
    print(f"{'configuration':<46} {'records/s':>12} {'vs 1 thread':>12}")
    for k, v in med.items():
        one = med[k.split(",")[0] + ", 1 thread(s)"]
        print(f"{k:<46} {v:>12,.0f} {v / one:>11.2f}x")
    two, py_two = med["object, 2 thread(s)"], med["object (Python threads), 2 thread(s)"]
    print(f"\nobjects, 2 threads: the native pool {two:,.0f} records/s, Python threads {py_two:,.0f}: "
          f"{two / py_two:.2f}x")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": args.records, "rounds": args.rounds, "rates": rates, "median": med}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Resume cost against position: a shuffled TFRecord pipeline restored early and at 90%.

Writes (once, cached) 2,000,000 small Examples in 8 shards, then for each position runs
``read_tfrecord(files, spec).shuffle(10_000, seed=1).batch(256)`` (the fused chain) and
``read_tfrecord(files, spec).map(ids, num_parallel_calls=2).shuffle(10_000, seed=1).batch(256)``
(a map between: the unfused shuffle node) and the same with ``.filter(not_sevens)`` after the
map (one record in 7 dropped) up to that position, saves the state (JSON), and
times a fresh iterator from that state up to its first batch; for the unfused chain also from
the same state without its record offsets (the anchor rule, the way it restored before).
Also counts the records the restore read again (``read_stats.reread``: records the pass had
read before the state was saved) and all it read (``read_stats.records``: the rest is the
source going on past the saved position, a chunk at a time). Targets: under 1 s at 90% of
the epoch, at most one shuffle buffer re-read, the same at every position.

    python benchmarks/resume.py [--records 2000000] [--buffer 10000] [--chains fused,map,filter] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _rows

import shardfeed as sf

SPEC = {"id": sf.FixedLen("int64"), "x": sf.FixedLen("float32", shape=[4])}
SHARDS = 8
BATCH = 256


def make(directory: str, records: int) -> list[str]:
    files = [os.path.join(directory, f"r-{s:02d}.tfrecord") for s in range(SHARDS)]
    marker = os.path.join(directory, f"READY-{records}")
    if os.path.exists(marker):
        return files
    os.makedirs(directory, exist_ok=True)
    per = -(-records // SHARDS)
    for s, f in enumerate(files):
        lo, hi = s * per, min(records, (s + 1) * per)
        sf.write_records(f, (sf.encode_example({"id": [i], "x": [float(i)] * 4}) for i in range(lo, hi)))
    open(marker, "w").close()
    return files


def ids(x):
    return x["id"]


def not_sevens(x):
    return int(x) % 7 != 0


CHAINS = {
    "fused": lambda src, n: src.shuffle(n, seed=1).batch(BATCH),
    "map": lambda src, n: src.map(ids, num_parallel_calls=2).shuffle(n, seed=1).batch(BATCH),
    "filter": lambda src, n: src.map(ids, num_parallel_calls=2).filter(not_sevens).shuffle(n, seed=1).batch(BATCH),
}
LABELS = {"fused": "shuffle().batch()", "map": "map().shuffle().batch()",
          "map, no offsets": "map().shuffle().batch(), anchor rule",
          "filter": "map().filter().shuffle().batch()",
          "filter, no offsets": "map().filter().shuffle().batch(), anchor rule"}


def _ids(batch) -> list:
    return (batch["id"] if isinstance(batch, dict) else batch).tolist()


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    out = []
    for chain, restores in res["restores"].items():
        for frac, r in restores.items():
            out.append((f"{LABELS.get(chain, chain)}: restore at {float(frac):.0%} of {res['records']:,} records, "
                        f"shuffle {res['buffer']:,}",
                        f"{r['restore_s'] * 1e3:.0f} ms, {r['records_reread']:,} re-read", "1 s (target)",
                        _rows.ratio(1.0 / r["restore_s"] if r["restore_s"] else None)))
    return out


def restore(ds, src, state) -> tuple[float, list, int, int]:
    before, before_again = src.read_stats.records, src.read_stats.reread
    t0 = time.perf_counter()
    with ds.iter_from_state(state) as resumed:
        first = _ids(next(resumed))
        restore_s = time.perf_counter() - t0
    # read in all; read before the state was saved, read again
    return restore_s, first, src.read_stats.records - before, src.read_stats.reread - before_again


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--buffer", type=int, default=10_000)
    ap.add_argument("--chains", default="fused,map,filter", help="comma-separated: fused, map, filter")
    ap.add_argument("--dir", default=os.path.join("bench-out", "resume"))
    ap.add_argument("--json", default=os.path.join("bench-out", "resume.json"))
    args = ap.parse_args(argv)
    files = make(args.dir, args.records)
    results: dict = {}
    for chain in args.chains.split(","):
        for frac in (0.05, 0.5, 0.9):
            src = sf.read_tfrecord(files, spec=SPEC)
            ds = CHAINS[chain](src, args.buffer)
            share = 6 / 7 if chain == "filter" else 1  # the filter lets 6 records in 7 through
            steps = int(args.records * share * frac) // BATCH
            it = iter(ds)
            t0 = time.perf_counter()
            for _ in range(steps):
                next(it)
            run_s = time.perf_counter() - t0
            state = json.loads(json.dumps(it.get_state()))
            expected = _ids(next(it))
            it.close()
            tries = [(chain, state)]
            if chain != "fused":  # the same state without the offsets: from the anchor, as before
                tries.append((f"{chain}, no offsets", dict(state, root={k: v for k, v in state["root"].items()
                                                                        if k != "frames"})))
            for name, st in tries:
                restore_s, first, read, reread = restore(ds, src, st)
                assert first == expected, "resumed pass differs"
                r = {"position": steps * BATCH, "reach_s": run_s, "restore_s": restore_s, "records_reread": reread,
                     "records_read": read, "state_bytes": len(json.dumps(st))}
                results.setdefault(name, {})[frac] = r
                print(f"{LABELS.get(name, name):>40} at {frac:>4.0%} ({steps * BATCH:>9,} records): restore to "
                      f"first batch {restore_s * 1e3:8.1f} ms, re-read {reread:>8,} records ({read:,} read in all, "
                      f"the rest ahead of the saved position), state {r['state_bytes']:,} bytes (getting there "
                      f"took {run_s:.1f} s)", flush=True)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": args.records, "buffer": args.buffer, "restores": results}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

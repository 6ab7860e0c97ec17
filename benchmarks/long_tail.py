"""Long tail: 4 workers, one of them 4x slower, 400 items; epoch time with static
sharding, with the WorkQueue, and the ideal (total work / total speed), in one run.

Work is simulated with sleeps (an item costs ``--item-ms`` on a fast worker, ``slow-factor``
times that on the slow one); workers are threads, each with its own queue client, so the
queue's real per-take costs (SQLite transactions, Redis round trips) are in the numbers.

    python benchmarks/long_tail.py                      # memory and SQLite backends
    python benchmarks/long_tail.py --redis redis://127.0.0.1:6379/0 --json out.json

Target: WorkQueue <= 1.15x the ideal, where static sharding is about 3x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import _rows

from shardfeed.distributed import WorkQueue, plan_shards  # noqa: E402
from shardfeed.storage.urls import mask  # noqa: E402


def costs(workers: int, item_s: float, slow_factor: float) -> list[float]:
    return [item_s * slow_factor] + [item_s] * (workers - 1)  # worker 0 is the slow one


def run_static(works: list[str], cost: list[float]) -> float:
    plan = plan_shards(works, len(cost), strategy="uneven")

    def work(r: int) -> None:
        for _ in plan[r]:
            time.sleep(cost[r])
    return _timed(work, len(cost))


def run_queue(works: list[str], cost: list[float], backend: str) -> tuple[float, dict]:
    name = f"long-tail-{uuid.uuid4().hex[:8]}"
    WorkQueue(works, backend=backend, name=name, seed=1).close()  # created before the clock starts
    clients = [WorkQueue(works, backend=backend, name=name, seed=1, worker_id=f"w{r}") for r in range(len(cost))]

    def work(r: int) -> None:
        q = clients[r]
        item = q.take()
        while item is not None:
            time.sleep(cost[r])
            item = q.ack_and_take(item)  # what reading through the queue does: one round trip
    t = _timed(work, len(cost))
    m = clients[0].metrics()
    clients[0].reset()
    for q in clients:
        q.close()
    return t, {w: st["acked"] for w, st in sorted(m["workers"].items())}


def _timed(fn, n: int) -> float:
    threads = [threading.Thread(target=fn, args=(r,)) for r in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med, ideal = res["median_s"], res["ideal_s"]
    static = med["static"]
    conf = f"{res['workers']} workers, one {res['slow_factor']:g}x slower, {res['items']} items"
    return [(f"{k}, {conf}, epoch time", f"{t:.3f} s ({t / ideal:.2f}x ideal)",
             f"static: {static:.3f} s ({static / ideal:.2f}x ideal)", _rows.ratio(static / t))
            for k, t in med.items() if k != "static"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--slow-factor", type=float, default=4.0)
    p.add_argument("--item-ms", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=3, help="runs of each; medians are reported")
    p.add_argument("--redis", default=None, help="also run on this Redis URL")
    p.add_argument("--json", default="long_tail.json", help="where to write the results")
    args = p.parse_args(argv)

    works = [f"memory://bench/item-{i:04d}" for i in range(args.items)]
    cost = costs(args.workers, args.item_ms / 1000, args.slow_factor)
    ideal = args.items / sum(1 / c for c in cost)
    tmp = tempfile.mkdtemp(prefix="sf-long-tail-")
    backends = {"memory": "memory://long-tail", "sqlite": f"sqlite://{tmp}/queue.db"}
    if args.redis:
        backends["redis"] = args.redis
    runs: dict[str, list[float]] = {"static": [], **{f"workqueue[{b}]": [] for b in backends}}
    shares: dict[str, dict] = {}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits all alike
        runs["static"].append(run_static(works, cost))
        for b, url in backends.items():
            t, share = run_queue(works, cost, url)
            runs[f"workqueue[{b}]"].append(t)
            shares[b] = share
    rows = [("ideal", ideal)] + [(k, statistics.median(v)) for k, v in runs.items()]
    print(f"{args.workers} workers (worker 0 is {args.slow_factor:g}x slower), {args.items} items, "
          f"{args.item_ms:g} ms per item on a fast worker; medians of {args.repeats}")
    print(f"{'strategy':<22}{'epoch s':>10}{'x ideal':>10}")
    for k, t in rows:
        print(f"{k:<22}{t:>10.3f}{t / ideal:>10.2f}")
    for b, share in shares.items():
        print(f"items per worker, workqueue[{b}] (last run): {share}")
    result = {"workers": args.workers, "items": args.items, "slow_factor": args.slow_factor,
              "item_ms": args.item_ms, "repeats": args.repeats, "ideal_s": ideal,
              "median_s": {k: statistics.median(v) for k, v in runs.items()},
              "x_ideal": {k: statistics.median(v) / ideal for k, v in runs.items()}, "runs_s": runs,
              "items_per_worker": shares, "backends": {b: mask(u) for b, u in backends.items()}}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

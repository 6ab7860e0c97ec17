"""Seed-003 experiment: a 2-layer MLP (1024-1024-1) trained on 128x1024 batches that take a
fixed time to produce, fed synchronously vs through shardfeed's prefetching pipeline.

Prints a table and writes JSON. Target: consumer wait < 5% and >= 1.3x speedup.
    python benchmarks/pipeline_seed003.py [--steps 60] [--produce-ms 8] [--repeats 3] [--out seed003.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# one BLAS thread by default: training takes one core and input production the other, as a
# trainer on an accelerator leaves the host cores to input (--blas-threads to change)
_blas = next((sys.argv[i + 1] for i, v in enumerate(sys.argv[:-1]) if v == "--blas-threads"), "1")
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _blas)

import _rows
import numpy as np  # noqa: E402

from shardfeed.pipeline import from_iterable  # noqa: E402

B, D, H = 128, 1024, 1024


class MLP:
    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = (rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32)
        self.w2 = (rng.standard_normal((H, 1)) / np.sqrt(H)).astype(np.float32)

    def step(self, x: np.ndarray, y: np.ndarray, lr: float = 1e-3) -> float:
        h = np.maximum(x @ self.w1, 0)
        err = h @ self.w2 - y
        gw2 = h.T @ err / len(x)
        gh = (err @ self.w2.T) * (h > 0)
        gw1 = x.T @ gh / len(x)
        self.w1 -= lr * gw1
        self.w2 -= lr * gw2
        return float((err ** 2).mean())


def batches(steps: int, produce_s: float):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, D)).astype(np.float32)
    y = rng.standard_normal((B, 1)).astype(np.float32)

    def gen():
        for _ in range(steps):
            time.sleep(produce_s)  # fixed production cost (I/O, decoding ...), off the GIL
            yield x.copy(), y
    return gen


def run_sync(steps: int, produce_s: float) -> dict:
    model = MLP()
    gen = batches(steps, produce_s)()
    wait = 0.0
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter()
        try:
            x, y = next(gen)
        except StopIteration:
            break
        wait += time.perf_counter() - t
        model.step(x, y)
    wall = time.perf_counter() - t0
    return {"step_ms": wall / steps * 1e3, "wait_fraction": wait / wall}


def run_pipeline(steps: int, produce_s: float) -> dict:
    model = MLP()
    ds = from_iterable(batches(steps, produce_s)).prefetch(4)
    it = iter(ds)
    x, y = next(it)  # warm-up: the first batch is produced before training starts
    model.step(x, y)
    t0 = time.perf_counter()
    wait = 0.0
    n = 0
    while True:
        t = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - t
        model.step(x, y)
        n += 1
    wall = time.perf_counter() - t0
    return {"step_ms": wall / n * 1e3, "wait_fraction": wait / wall, "verdict": it.stats().verdict()}


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    pre, sync = res["shardfeed_prefetch"], res["sync"]
    conf = f"MLP train step, batch production {res['produce_ms']} ms"
    return [(conf, f"{pre['step_ms']:.2f} ms (wait {pre['wait_fraction']:.1%})",
             f"synchronous: {sync['step_ms']:.2f} ms (wait {sync['wait_fraction']:.1%})", _rows.ratio(res["speedup"]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--produce-ms", type=float, default=None, help="default: the measured train step time")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join("bench-out", "pipeline_seed003.json"))
    ap.add_argument("--blas-threads", default="1", help="BLAS threads for the model (read before numpy loads)")
    a = ap.parse_args()
    m = MLP()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, 1)).astype(np.float32)
    for _ in range(3):
        m.step(x, y)
    t = time.perf_counter()
    for _ in range(10):
        m.step(x, y)
    train_ms = (time.perf_counter() - t) / 10 * 1e3
    produce_ms = a.produce_ms if a.produce_ms is not None else round(train_ms * 0.8, 2)
    sync, pipe = [], []
    for _ in range(a.repeats):  # interleaved, medians
        sync.append(run_sync(a.steps, produce_ms / 1e3))
        pipe.append(run_pipeline(a.steps, produce_ms / 1e3))
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    res = {
        "train_step_ms_alone": round(train_ms, 3), "produce_ms": produce_ms, "steps": a.steps, "repeats": a.repeats,
        "sync": {"step_ms": round(med(sync, "step_ms"), 3), "wait_fraction": round(med(sync, "wait_fraction"), 4)},
        "shardfeed_prefetch": {"step_ms": round(med(pipe, "step_ms"), 3),
                               "wait_fraction": round(med(pipe, "wait_fraction"), 4), "verdict": pipe[-1]["verdict"]},
    }
    res["speedup"] = round(res["sync"]["step_ms"] / res["shardfeed_prefetch"]["step_ms"], 3)
    res["targets_met"] = res["speedup"] >= 1.3 and res["shardfeed_prefetch"]["wait_fraction"] < 0.05
    print(f"train step alone {train_ms:.2f} ms, batch production {produce_ms:.2f} ms, {a.steps} steps x {a.repeats}")
    print(f"{'feeding':<22}{'step ms':>10}{'wait %':>9}")
    for name, key in (("synchronous", "sync"), ("shardfeed prefetch(4)", "shardfeed_prefetch")):
        print(f"{name:<22}{res[key]['step_ms']:>10.2f}{res[key]['wait_fraction'] * 100:>8.1f}%")
    print(f"speedup {res['speedup']:.2f}x (target >= 1.3x, wait < 5%): {'met' if res['targets_met'] else 'NOT met'}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    res["rows"] = table_rows(res)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()

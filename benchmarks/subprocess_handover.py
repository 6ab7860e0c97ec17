"""The ``in_subprocess`` hand-over alone: large batches from a child that does no other work.

    python benchmarks/subprocess_handover.py [--mb 64] [--batches 40] [--rounds 5]

The child's chain is ``from_list(range(n)).map(big_batch)``, where ``big_batch`` returns the
same ``--mb`` MB ``uint8`` array (made once per process), so what is timed is the hand-over:
the child's write into a slot, the message, and the consumer's side. Configurations, each a
fresh pass (and child), interleaved over ``--rounds`` rounds, medians:

- ``zero_copy``: the default: the consumer gets views of the slot (one copy in all);
- ``copy_out``: ``in_subprocess(zero_copy=False)``: every batch copied out of its slot into
  arrays the consumer owns (two copies in all: what the stage did before views);
- ``memcpy``: the anchor, in this process: ``np.copyto`` of one such array into another
  (already faulted in), i.e. one copy at this machine's memory bandwidth.

The consumer either only takes the batches (``--touch none``) or also reads every byte
once (``--touch sum``, ``arr.sum()`` over a ``uint64`` view: what a step that uses the batch
pays, and where views of freshly written shared memory could differ from private copies).
GB/s = batch bytes x batches after the first / seconds from the first to the last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_BIG: dict[int, np.ndarray] = {}


def big_batch(i: int, mb: int = 64) -> dict:
    """Batch ``i``: the same ``mb`` MB array every time (the child makes it once)."""
    a = _BIG.get(mb)
    if a is None:
        a = _BIG[mb] = np.random.default_rng(0).integers(0, 255, mb << 20, dtype=np.uint8)
    return {"x": a, "i": i}


def run_pass(mb: int, batches: int, zero_copy: bool, touch: str, buffer_size: int) -> float:
    """GB/s delivered by one pass (after its first batch)."""
    import functools

    from shardfeed.pipeline import from_list

    ds = from_list(list(range(batches))).map(functools.partial(big_batch, mb=mb))
    first = last = None
    n = 0
    with iter(ds.in_subprocess(buffer_size=buffer_size, zero_copy=zero_copy)) as it:
        for b in it:
            if touch == "sum":
                int(b["x"].view(np.uint64).sum())
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                n += 1
            last = now
    assert first is not None and last is not None and n
    return n * (mb << 20) / (last - first) / 1e9


def epoch_gaps(mb: int = 1, batches: int = 5) -> dict:
    """Seconds from the last batch of an epoch to the first of the next through one
    ``in_subprocess`` dataset: a new ``iter()`` of it, and ``repeat(2)`` after the stage."""
    import functools

    from shardfeed.pipeline import from_list

    ds = from_list(list(range(batches))).map(functools.partial(big_batch, mb=mb)).in_subprocess(buffer_size=2)
    out = {}
    last = None
    for k in range(2):
        with iter(ds) as it:
            for i, _ in enumerate(it):
                if i == 0 and k == 1:
                    out["new_iter"] = time.perf_counter() - last
            last = time.perf_counter()
    rep = ds.repeat(2)
    prev = None
    for i, _ in enumerate(rep):
        now = time.perf_counter()
        if i == batches:
            out["repeat"] = now - prev
        prev = now
    if hasattr(ds, "close"):  # (a shardfeed before kept children had no close())
        ds.close()
    return out


def memcpy_gbs(mb: int, reps: int = 10) -> float:
    src = np.random.default_rng(0).integers(0, 255, mb << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return (mb << 20) / statistics.median(times) / 1e9


def table_rows(res: dict) -> list:
    """Rows for ``shardfeed bench``: zero-copy against copy-out and the memcpy anchor."""
    import _rows

    med = res["medians"]
    rows = []
    for touch in res["args"]["touch"].split(","):
        z, c = med.get(f"zero_copy/{touch}"), med.get(f"copy_out/{touch}")
        if z and c:
            rows.append((f"hand-over of {res['args']['mb']} MB batches, consumer touch={touch}: zero-copy vs copy-out",
                         f"{z:.2f} GB/s", f"copy-out: {c:.2f} GB/s", _rows.ratio(z / c)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="batch size in MB")
    ap.add_argument("--batches", type=int, default=40, help="batches per pass")
    ap.add_argument("--buffer-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--touch", default="none,sum", help="comma list of none, sum")
    ap.add_argument("--out", default=os.path.join("bench-out", "subprocess_handover.json"))
    a = ap.parse_args()
    touches = a.touch.split(",")
    configs = [(zc, t) for t in touches for zc in (True, False)]
    print(f"{a.mb} MB batches, {a.batches} per pass, buffer_size {a.buffer_size}; {os.cpu_count()} cores; medians "
          f"of {a.rounds} interleaved rounds; load average before {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[str, list[float]] = {f"{'zero_copy' if zc else 'copy_out'}/{t}": [] for zc, t in configs}
    results["memcpy"] = []
    for _ in range(a.rounds):
        for zc, t in configs:
            results[f"{'zero_copy' if zc else 'copy_out'}/{t}"].append(run_pass(a.mb, a.batches, zc, t, a.buffer_size))
        results["memcpy"].append(memcpy_gbs(a.mb))
    load_after = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"load average after: {load_after:.1f}")
    print(f"{'consumer':<10}{'zero_copy GB/s':>16}{'copy_out GB/s':>15}{'ratio':>8}")
    for t in touches:
        z, c = med[f"zero_copy/{t}"], med[f"copy_out/{t}"]
        print(f"{t:<10}{z:>16.2f}{c:>15.2f}{z / c:>7.2f}x")
    print(f"anchor: one memcpy of {a.mb} MB in this process: {med['memcpy']:.2f} GB/s")
    gaps = [epoch_gaps() for _ in range(a.rounds)]
    for k in ("new_iter", "repeat"):
        med[f"epoch_gap_{k}_ms"] = statistics.median(g[k] for g in gaps) * 1e3
    print(f"from an epoch's last batch to the next's first: new iter() {med['epoch_gap_new_iter_ms']:.1f} ms, "
          f"repeat() after the stage {med['epoch_gap_repeat_ms']:.1f} ms (median of {a.rounds})")
    result = {"args": vars(a), "medians": med, "rounds": results, "load_average_after": load_after}
    result["rows"] = table_rows(result)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

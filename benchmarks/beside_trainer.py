"""Input beside the trainer, not inside it: a GIL-holding training step fed a CTR-like
pipeline whose Python ``map`` needs about one core, with the pipeline on threads in the
trainer's process, in an ``in_subprocess`` stage, or in PyTorch DataLoader workers.

    python benchmarks/beside_trainer.py [--steps 100] [--batch 1024] [--step-ms 20] [--rounds 3]

Each configuration runs in a fresh process (its peak memory is its own), interleaved over
``--rounds`` rounds; the table shows medians. Configurations:

- ``alone``: the trainer over precomputed batches (the same pipeline's output, made before
  the clock starts); ``alone+busy``: the same while another process spins a plain Python
  loop on the other core (what a busy neighbour core alone costs a Python step here);
- ``threads``: ``read_tfrecord(...).batch(b).map(ctr_map, num_parallel_calls=1).prefetch(4)``
  in the trainer's process; ``subprocess``: ``...batch(b).map(ctr_map).in_subprocess(4)``
  (numeric arrays handed over as views of their slot: one copy); ``subprocess_copy``: the
  same with ``in_subprocess(4, zero_copy=False)`` (every batch copied out of its slot: two
  copies, the stage's hand-over before views);
- ``dataloader1``/``dataloader2``: ``DataLoader(...map(ctr_map).to_torch(), batch_size=None,
  num_workers=1|2)`` (each worker reads its share of the files).

Columns: the trainer's step time (only its own work, not the wait for data), records/s
delivered after the first batch, the time to the first batch, and the peak memory of the
trainer with every process it started (the sum of PSS, so shared memory counts once).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import _rows
import numpy as np

CAT = [f"C{k}" for k in range(26)]
BUCKETS = 1_000_003


def ctr_spec():
    import shardfeed as sf

    return {"label": sf.FixedLen("int64"), "dense": sf.FixedLen("float32", shape=[13]),
            **{c: sf.FixedLen("bytes") for c in CAT}, "ids": sf.VarLen("int64")}


def write_data(d: str, records: int, files: int) -> list[str]:
    import shardfeed as sf

    rng = np.random.default_rng(0)
    paths = []
    per = -(-records // files)
    for f in range(files):
        n = min(per, records - f * per)
        dense = rng.normal(size=(n, 13)).astype(np.float32)
        cats = rng.integers(0, 1 << 32, size=(n, 26))
        recs = []
        for i in range(n):
            feats = {"label": [i % 2], "dense": dense[i], "ids": rng.integers(0, 1 << 40, size=1 + i % 19)}
            feats.update({c: [b"%08x" % cats[i, k]] for k, c in enumerate(CAT)})
            recs.append(sf.encode_example(feats))
        p = os.path.join(d, f"ctr-{f:03d}.tfrecord")
        sf.write_records(p, recs, index=True)
        paths.append(p)
    return paths


def ctr_map(batch: dict, rounds: int = 1) -> dict:
    """The Python stage: hash the 26 categorical columns value by value (``rounds`` times)."""
    n = len(batch["label"])
    cat = np.empty((n, len(CAT)), np.int64)
    for _ in range(rounds):
        for j, c in enumerate(CAT):
            cat[:, j] = [zlib.crc32(v) % BUCKETS for v in batch[c]]
    ids = batch["ids"]
    return {"label": batch["label"], "dense": batch["dense"], "cat": cat,
            "ids_sum": np.add.reduceat(ids.values, ids.row_splits[:-1]) if len(ids.values) else np.zeros(n, np.int64)}


def spin(k: int) -> int:
    """The trainer's step: ``k`` iterations of pure Python (holds the GIL throughout)."""
    s = 0
    for i in range(k):
        s += i * i
    return s


def no_map(batch: dict) -> dict:
    """``--map-share 0``: the batches as parsed (26 bytes columns reach the trainer)."""
    return batch


def pipeline(files: list[str], batch: int, rounds: int):
    import shardfeed as sf

    fn = functools.partial(ctr_map, rounds=rounds) if rounds else no_map
    return sf.read_tfrecord(files, spec=ctr_spec()).batch(batch), fn


def run_config(name: str, a: argparse.Namespace, files: list[str]) -> dict:
    """One configuration, in this (fresh) process: the trainer loop and its numbers."""
    base, fn = pipeline(files, a.batch, a.map_rounds)
    it_close = None
    if fn is not no_map:
        base = base.map(fn) if not name.startswith(("alone", "threads")) else base
    if name.startswith("alone"):
        source = [fn(b) for b in base]
    elif name == "threads":
        source = iter(base.map(fn, num_parallel_calls=1).prefetch(4) if fn is not no_map else base.prefetch(4))
        it_close = source.close
    elif name in ("subprocess", "subprocess_copy"):
        source = iter(base.in_subprocess(4, zero_copy=name == "subprocess"))
        it_close = source.close
    elif name.startswith("dataloader"):
        from torch.utils.data import DataLoader

        source = DataLoader(base.to_torch(slice_id=0, slice_count=1), batch_size=None,
                            num_workers=int(name[-1]))
    else:
        raise ValueError(name)
    steps: list[float] = []
    nexts: list[tuple[float, float]] = []  # next()'s wall and trainer-thread CPU seconds
    records = 0
    t0 = time.perf_counter()
    first = last = None
    key = "cat" if fn is not no_map else "label"
    it = iter(source)
    while True:
        w, c = time.perf_counter(), time.thread_time()
        try:
            b = next(it)
        except StopIteration:
            break
        now = time.perf_counter()
        nexts.append((now - w, time.thread_time() - c))
        if first is None:
            first = now
        else:
            records += len(b["label"])
        last = now
        t = time.perf_counter()
        spin(a.spin)
        int(b[key].ravel()[0])  # the step uses the batch
        steps.append(time.perf_counter() - t)
    if it_close:
        it_close()
    return {"config": name, "step_ms": statistics.median(steps[5:] or steps) * 1e3, "batches": len(steps),
            "records_per_s": records / (last - first) if last and last > first else 0.0,
            "first_batch_s": (first or t0) - t0,
            "next_us": statistics.median(n[0] for n in nexts[5:] or nexts) * 1e6,
            "next_cpu_us": statistics.median(n[1] for n in nexts[5:] or nexts) * 1e6}


def tree_pss_kb(pid: int) -> int:
    """The sum of PSS over ``pid`` and its descendants (kB)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def measure(name: str, a: argparse.Namespace, files: list[str]) -> dict:
    """Run ``name`` in a fresh process, sampling its memory from here."""
    busy = None
    if name == "alone+busy":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    cmd = [sys.executable, os.path.abspath(__file__), "--run", name, "--files-list", ",".join(files),
           "--batch", str(a.batch), "--spin", str(a.spin), "--map-rounds", str(a.map_rounds)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_pss_kb(p.pid))
            stop.wait(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = p.communicate()
    stop.set()
    th.join()
    if busy is not None:
        busy.kill()
        busy.wait()
    if p.returncode:
        raise SystemExit(f"{name} failed (exit {p.returncode})")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_pss_mb"] = peak[0] / 1024
    return res


def calibrate(a: argparse.Namespace, files: list[str]) -> None:
    """Size the step (``spin``) to ``--step-ms`` and the map to ``--map-share`` of it."""
    k = 100_000
    t = min(_timed(spin, k) for _ in range(5))
    a.spin = max(1, int(k * a.step_ms / 1e3 / t))
    base, _ = pipeline(files, a.batch, 1)
    b = next(iter(base))
    t1 = min(_timed(ctr_map, b, 1) for _ in range(5))
    a.map_rounds = max(1, round(a.step_ms / 1e3 * a.map_share / t1)) if a.map_share else 0
    a.map_ms = t1 * a.map_rounds * 1e3


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def copy_costs(sizes_mb=(0.07, 1.0, 8.0), reps: int = 30) -> list[dict]:
    """What one element costs to hand over: the child's encode and write into a slot, the
    consumer's side as views of the slot (now) or copied out of it (``zero_copy=False``, and
    the stage before views), against pickling and unpickling it (as a pipe would)."""
    import pickle

    from shardfeed.pipeline import shm

    rows = []
    for mb in sizes_mb:
        x = {"x": np.random.default_rng(0).integers(0, 255, int(mb * (1 << 20)), dtype=np.uint8),
             "label": np.arange(256)}
        _, _, _, size = shm.encode(x)
        seg = np.zeros(size + 4096, np.uint8)  # a slot's mapping, as the consumer sees it
        interface = seg.__array_interface__  # made once per mapping, as the consumer does
        t: dict[str, list[float]] = {"encode_write": [], "views": [], "copy_out": [], "pickle_unpickle": []}
        for _ in range(reps):
            t0 = time.perf_counter()
            s, arrays, layout, _ = shm.encode(x)
            shm.write(memoryview(seg), arrays, layout)
            t1 = time.perf_counter()
            v = shm.decode(seg, s, layout, shm.SlotLease(seg, lambda: None, interface))
            t2 = time.perf_counter()
            y = shm.decode(seg, s, layout)
            t3 = time.perf_counter()
            z = pickle.loads(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))
            t4 = time.perf_counter()
            t["encode_write"].append(t1 - t0)
            t["views"].append(t2 - t1)
            t["copy_out"].append(t3 - t2)
            t["pickle_unpickle"].append(t4 - t3)
            del arrays, v, y, z
        rows.append({"mb": mb, **{k: statistics.median(v) * 1e3 for k, v in t.items()}})
    return rows


CONFIGS = ["alone", "alone+busy", "threads", "subprocess", "subprocess_copy", "dataloader1", "dataloader2"]


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med = res["medians"]
    rows = []
    ref = med.get("alone+busy")
    sub = med.get("subprocess")
    if ref and sub:
        rows.append(("trainer step: in_subprocess vs alone beside a busy core", f"{sub['step_ms']:.2f} ms",
                     f"alone+busy: {ref['step_ms']:.2f} ms", _rows.ratio(sub["step_ms"] / ref["step_ms"])))
    for name in ("threads", "dataloader1", "dataloader2"):
        other = med.get(name)
        if sub and other and other["records_per_s"]:
            rows.append((f"records/s delivered: in_subprocess vs {name}", _rows.rate(sub["records_per_s"], "rec/s"),
                         f"{name}: {_rows.rate(other['records_per_s'], 'rec/s')}",
                         _rows.ratio(sub["records_per_s"] / other["records_per_s"])))
    old = med.get("subprocess_copy")
    if sub and old and old["records_per_s"]:
        rows.append(("trainer step: in_subprocess views vs copy-out", f"{sub['step_ms']:.2f} ms",
                     f"zero_copy=False: {old['step_ms']:.2f} ms", _rows.ratio(sub["step_ms"] / old["step_ms"])))
    if sub and med.get("dataloader2"):
        rows.append(("peak memory (PSS): in_subprocess vs dataloader2", f"{sub['peak_pss_mb']:.0f} MB",
                     f"dataloader2: {med['dataloader2']['peak_pss_mb']:.0f} MB",
                     _rows.ratio(sub["peak_pss_mb"] / med["dataloader2"]["peak_pss_mb"])))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="batches in the pass")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=20.0, help="the trainer step's pure-Python work")
    ap.add_argument("--map-share", type=float, default=0.8,
                    help="the map's Python work per batch, in steps (0: no map: the parsed batches, bytes columns "
                         "and all, reach the trainer)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default=os.path.join("bench-out", "beside_trainer.json"))
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--files-list", help=argparse.SUPPRESS)
    ap.add_argument("--spin", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--map-rounds", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        print(json.dumps(run_config(a.run, a, a.files_list.split(","))))
        return
    configs = a.configs.split(",")
    if importlib.util.find_spec("torch") is None:
        print("PyTorch is not installed: the DataLoader configurations are left out")
        configs = [c for c in configs if not c.startswith("dataloader")]
    with tempfile.TemporaryDirectory() as d:
        files = write_data(d, a.steps * a.batch, a.files)
        calibrate(a, files)
        print(f"{a.steps * a.batch} CTR-like records in {a.files} files, batch {a.batch}; step {a.step_ms} ms of "
              f"Python ({a.spin} iterations); map {a.map_ms:.1f} ms of Python per batch ({a.map_rounds} rounds); "
              f"{os.cpu_count()} cores; medians of {a.rounds} interleaved rounds; load average before "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        results: dict[str, list[dict]] = {c: [] for c in configs}
        for _ in range(a.rounds):
            for c in configs:
                results[c].append(measure(c, a, files))
    load_after = os.getloadavg()[0]
    print(f"load average after: {load_after:.1f} (other processes on the machine share its cores)")
    keys = ["step_ms", "records_per_s", "first_batch_s", "peak_pss_mb", "next_us", "next_cpu_us"]
    med = {c: {k: statistics.median(r[k] for r in rs) for k in keys} for c, rs in results.items()}
    ref = med.get("alone+busy", med.get("alone"))
    print(f"{'config':<16}{'step ms':>9}{'vs alone+busy':>15}{'records/s':>11}{'first batch s':>15}"
          f"{'peak PSS MB':>13}{'next() us':>11}{'next() CPU us':>15}")
    for c in configs:
        m = med[c]
        vs = f"{m['step_ms'] / ref['step_ms']:.2f}x" if ref else "-"
        print(f"{c:<16}{m['step_ms']:>9.2f}{vs:>15}{m['records_per_s']:>11.0f}{m['first_batch_s']:>15.2f}"
              f"{m['peak_pss_mb']:>13.0f}{m['next_us']:>11.0f}{m['next_cpu_us']:>15.0f}")
    if "subprocess" in med and "dataloader1" in med:
        s, d1 = med["subprocess"], med["dataloader1"]
        ratio = s["records_per_s"] / d1["records_per_s"]
        print(f"subprocess vs dataloader1 (2 processes each): records/s {ratio:.2f}x")
    if "subprocess" in med and "dataloader2" in med:
        s, d2 = med["subprocess"], med["dataloader2"]
        print(f"subprocess vs dataloader2: peak PSS {s['peak_pss_mb']:.0f} MB vs {d2['peak_pss_mb']:.0f} MB")
    if "subprocess" in med and "subprocess_copy" in med:
        s, c = med["subprocess"], med["subprocess_copy"]
        print(f"subprocess (views) vs subprocess_copy (zero_copy=False): step {s['step_ms']:.2f} vs "
              f"{c['step_ms']:.2f} ms, records/s {s['records_per_s'] / c['records_per_s']:.2f}x")
    copies = copy_costs()
    print(f"\n{'element MB':>10}{'child: encode+write ms':>24}{'consumer: views ms':>20}{'consumer: copy out ms':>23}"
          f"{'pickle+unpickle ms':>20}")
    for r in copies:
        print(f"{r['mb']:>10}{r['encode_write']:>24.3f}{r['views']:>20.3f}{r['copy_out']:>23.3f}"
              f"{r['pickle_unpickle']:>20.3f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    result = {"args": {k: v for k, v in vars(a).items() if k not in ("run", "files_list")},
              "medians": med, "rounds": results, "handover": copies,
              "load_average_after": load_after}
    result["rows"] = table_rows(result)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

"""Two worker processes against one process on small records: ``to_torch(num_workers=2)``
iterated directly, the same inside ``DataLoader(..., batch_size=None)``, and the in-process
``read_tfrecord(files, spec).batch(1024)`` they are compared with (issue 41's ">= 0.8x the
in-process rate with 2 worker processes").

    python benchmarks/torch_workers.py [--records 100000] [--repeat 10] [--epochs 4] [--rounds 3] [--json out.json]

The CTR table of ``benchmarks/peers`` (an int64 id and label, 13 floats, one
bytes value, an int64 list; about 430 bytes a record) is written once to ``--dir``; each
pass reads the file list ``--repeat`` times over (``--repeat 10``: passes of 1M records, so
that a pass's start and end weigh little). Each form runs in a fresh process, the three
interleaved over ``--rounds`` rounds; the loop reads the ``idx`` column of every batch.
Printed per round: records/s (the median of the passes after the first, whose process
start and first reads it leaves out), the CPU microseconds a record of the main process and
of its children, and the two worker forms' ratios to the in-process rate of the same round.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import _rows

FORMS = ("in_process", "workers", "workers_in_dataloader")


def _spec() -> dict:
    import shardfeed as sf

    return {"idx": sf.FixedLen("int64"), "label": sf.FixedLen("int64"), "dense": sf.FixedLen("float32", shape=[13]),
            "cat": sf.FixedLen("bytes"), "ids": sf.VarLen("int64")}


def _children_cpu() -> float:
    total = 0.0
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        for pid in open(path).read().split():
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                pass
    return total


def run_form(form: str, files: list[str], epochs: int) -> dict:
    """One form's passes in this process: records/s and CPU a record per pass."""
    import numpy as np

    import shardfeed as sf

    ds = sf.read_tfrecord(files, _spec()).batch(1024)
    if form == "in_process":
        loader = ds
    else:
        workers = ds.to_torch(num_workers=2)
        if form == "workers":
            loader = workers
        else:
            from torch.utils.data import DataLoader

            loader = DataLoader(workers, batch_size=None)
    passes = []
    for _ in range(epochs):
        c0, r0, t0, n = _children_cpu(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
        for b in loader:
            n += int(np.asarray(b["idx"]).size)
        wall = time.perf_counter() - t0
        r1, c1 = resource.getrusage(resource.RUSAGE_SELF), _children_cpu()
        main = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        passes.append({"records": n, "rate": n / wall, "main_us": main / n * 1e6, "children_us": (c1 - c0) / n * 1e6})
    return {"passes": passes}


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints: each worker form against the in-process rate
    (medians of the per-round rates; the ratio: the median of the per-round ratios)."""
    base = res["median_rate"]["in_process"]
    return [(f"{form}, {res['records_a_pass']:,} records a pass", _rows.rate(res["median_rate"][form], "rec/s"),
             f"in-process: {_rows.rate(base, 'rec/s')}", _rows.ratio(res["median_ratio"][form]))
            for form in FORMS[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=10, help="the file list read this many times over a pass")
    ap.add_argument("--epochs", type=int, default=4, help="passes a form makes in its process (the first left out)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "sf-torch-workers"))
    ap.add_argument("--json", default=None, help="where to write the results")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        form, files = json.loads(a.child)
        print("RESULT " + json.dumps(run_form(form, files, a.epochs)))
        return
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "peers"))
    from common import ctr_records  # the peers benchmark's CTR records

    import shardfeed as sf

    folder = os.path.join(a.dir, f"ctr-{a.records}")
    if not glob.glob(os.path.join(folder, "*.tfrecord")):
        os.makedirs(folder, exist_ok=True)
        per = -(-a.records // 8)
        recs = list(ctr_records(a.records))
        for k in range(8):
            sf.write_records(os.path.join(folder, f"ctr-{k:05d}.tfrecord"),
                             [sf.encode_example(r) for r in recs[k * per:(k + 1) * per]], index=True)
    files = sorted(glob.glob(os.path.join(folder, "*.tfrecord"))) * a.repeat
    print(f"{a.records * a.repeat:,} records a pass ({a.records:,} x {a.repeat}), {a.epochs} passes a form "
          f"(the first left out), {a.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    ratios: dict[str, list[float]] = {"workers": [], "workers_in_dataloader": []}
    per_round: dict[str, list[float]] = {form: [] for form in FORMS}
    print(f"{'round':>5}  {'form':<22} {'records/s':>11} {'main us/rec':>11} {'children us/rec':>15} "
          f"{'x in-process':>12}")
    for r in range(a.rounds):
        rates = {}
        for form in FORMS:
            out = subprocess.run([sys.executable, __file__, "--epochs", str(a.epochs), "--child",
                                  json.dumps([form, files])], capture_output=True, text=True, check=True).stdout
            passes = json.loads(out.split("RESULT ", 1)[1])["passes"][1:]
            rates[form] = statistics.median(p["rate"] for p in passes)
            per_round[form].append(rates[form])
            ratio = "" if form == "in_process" else f"{rates[form] / rates['in_process']:.2f}x"
            if form != "in_process":
                ratios[form].append(rates[form] / rates["in_process"])
            main_us = statistics.median(p["main_us"] for p in passes)
            children_us = statistics.median(p["children_us"] for p in passes)
            print(f"{r + 1:>5}  {form:<22} {rates[form]:>11,.0f} {main_us:>11.2f} {children_us:>15.2f} {ratio:>12}")
    for form, rs in ratios.items():
        print(f"{form}: median of the per-round ratios to in-process {statistics.median(rs):.2f}x")
    if a.json:
        result = {"records_a_pass": a.records * a.repeat, "rounds": a.rounds, "rates": per_round,
                  "median_rate": {f: statistics.median(v) for f, v in per_round.items()},
                  "median_ratio": {f: statistics.median(v) for f, v in ratios.items()}}
        result["rows"] = table_rows(result)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

"""Annotation files read by byte range, against the whole-file parser they replaced.

A DETECTION PAI annotation CSV and an iTAG manifest of ``--rows`` records (written once into
``--dir``). Interleaved rounds, medians, records/s:

- ``whole text (before)``: the parser as it was before byte ranges, kept here as the anchor:
  ``csv.reader`` over the whole decoded text (CSV), ``str.splitlines`` (manifest), with the
  same per-record parsing;
- ``AnnotationSpan, whole file``: ``read_annotation_csv`` / ``read_itag_manifest`` now (what
  the local runner runs);
- ``AnnotationSpan, N ranges``: the file read as ``--ranges`` byte ranges one after another
  (what the Spark tasks do between them).

Times are the process's CPU time (each reader runs on one thread), so that other work on
a shared machine moves them less than wall time.

``--spark``: the Spark runner's job 1 (read, split, count: ``plan_on_spark``, no images read)
on ``--master`` for the CSV at ``--rows-small`` and ``--rows`` records, each in a child
process: the driver's peak RSS (``VmHWM``) when the driver parses the file and ships its
rows (``rows_source``, before) and when the executors read byte ranges (``annotation_source``).

Usage::

    python benchmarks/annotation_spans.py [--rows 200000] [--rounds 5] [--ranges 8]
    python benchmarks/annotation_spans.py --spark --rows 400000 --rows-small 40000
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if os.path.isdir(SRC):
    sys.path.insert(0, SRC)
sys.path.insert(0, HERE)

import _rows

from shardfeed.convert import annotations as ann  # noqa: E402
from shardfeed.convert.options import DiscardRecord, Row  # noqa: E402
from shardfeed.convert.textspans import plan_ranges  # noqa: E402


def make_files(directory: str, n: int) -> tuple[str, str]:
    csv_path, manifest = os.path.join(directory, f"det-{n}.csv"), os.path.join(directory, f"det-{n}.manifest")
    if not os.path.exists(csv_path):
        box = [{"text": json.dumps({"class*": "car"}), "coord": ["10", "10", "90", "10", "90", "60", "10", "60"]}]
        with open(csv_path + ".tmp", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["id", "raw", "answer"])
            for i in range(n):
                w.writerow([i, json.dumps({"url": f"img/{i:07d}.jpg"}), json.dumps(box)])
        os.replace(csv_path + ".tmp", csv_path)
    if not os.path.exists(manifest):
        poly = {"type": "image/polygon", "value": [[1, 1], [9, 1], [9, 6], [1, 6]], "labels": {"单选": "car"}}
        with open(manifest + ".tmp", "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({"data": {"source": f"img/{i:07d}.jpg"},
                                    "label-1": {"results": [{"data": [poly]}]}}, ensure_ascii=False) + "\n")
        os.replace(manifest + ".tmp", manifest)
    return csv_path, manifest


def whole_text_csv(url: str, model_type: str) -> tuple[list, list]:
    """The PAI CSV parser before byte ranges (the anchor)."""
    with open(url, "rb") as f:
        text = f.read().decode("utf-8-sig")
    records = [r for r in csv.reader(io.StringIO(text, newline="")) if r and any(c.strip() for c in r)]
    records = [r for r in records if not r[0].lstrip().startswith("#")]
    if records and len(records[0]) >= 2 and not records[0][1].lstrip().startswith(("{", "[")):
        records = records[1:]
    origin, base = url, os.path.dirname(os.path.abspath(url))
    rows, discards = [], []
    for number, cells in enumerate(records, start=1):
        item = ann._csv_item(number, cells, model_type, origin, base)
        (rows if isinstance(item, Row) else discards).append(item)
    return rows, discards


def whole_text_itag(url: str, model_type: str) -> tuple[list, list]:
    """The iTAG parser before byte ranges (the anchor): ``splitlines`` over the whole text."""
    with open(url, "rb") as f:
        text = f.read().decode("utf-8-sig", errors="replace")
    origin, base = url, os.path.dirname(os.path.abspath(url))
    rows, discards = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            item = ann._itag_item(number, line, model_type, origin, base)
            (rows if isinstance(item, Row) else discards).append(item)
    return rows, discards


def in_ranges(url: str, fmt: str, ranges: int) -> tuple[list, list]:
    size = os.path.getsize(url)
    rows: list[Row] = []
    discards: list[DiscardRecord] = []
    n = 0
    for start, end in plan_ranges(size, -(-size // ranges)):
        span = ann.AnnotationSpan(url, "DETECTION", fmt, start, end, first_number=n + 1)
        for item in span:
            (rows if isinstance(item, Row) else discards).append(item)  # type: ignore[arg-type]
        n += span.numbers
    return rows, discards


def parse_bench(args) -> dict:
    csv_path, manifest = make_files(args.dir, args.rows)
    cases = {
        "csv": [("whole text (before)", lambda: whole_text_csv(csv_path, "DETECTION")),
                ("AnnotationSpan, whole file", lambda: ann.read_annotation_csv(csv_path, "DETECTION")),
                (f"AnnotationSpan, {args.ranges} ranges", lambda: in_ranges(csv_path, "csv", args.ranges))],
        "itag": [("whole text (before)", lambda: whole_text_itag(manifest, "DETECTION")),
                 ("AnnotationSpan, whole file", lambda: ann.read_itag_manifest(manifest, "DETECTION")),
                 (f"AnnotationSpan, {args.ranges} ranges", lambda: in_ranges(manifest, "itag", args.ranges))],
    }
    results: dict = {}
    for fmt, fns in cases.items():
        times: dict[str, list[float]] = {name: [] for name, _ in fns}
        want = None
        for _ in range(args.rounds):
            for name, fn in fns:  # interleaved: each round runs every reader once
                t = time.process_time()  # one thread: CPU time, less moved by other processes on a busy machine
                got = fn()
                times[name].append(time.process_time() - t)
                key = ([(r.number, r.image_uri, r.annotation) for r in got[0]], got[1])
                assert want is None or key == want, (fmt, name)
                want = key
        anchor = statistics.median(times[fns[0][0]])
        print(f"\n{fmt}: {args.rows:,} records, {args.rounds} rounds (medians)")
        print(f"{'reader':<32} {'records/s':>12} {'vs before':>10}")
        for name, _ in fns:
            med = statistics.median(times[name])
            print(f"{name:<32} {args.rows / med:>12,.0f} {anchor / med:>9.2f}x")
            results.setdefault(fmt, {})[name] = {"seconds": times[name], "records_per_s": args.rows / med,
                                                 "vs_before": anchor / med}
    return results


def _vmhwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def child(args) -> int:
    """One job 1 on Spark: ``--child MODE`` (``rows``: the driver parses and ships rows;
    ``ranges``: executors read byte ranges); prints a JSON line."""
    from shardfeed.convert.options import ConvertOptions
    from shardfeed.convert.runner_spark import annotation_source, plan_on_spark, rows_source, spark_session

    spark = spark_session(args.master)
    url = args.child_input
    opts = ConvertOptions(model_type="DETECTION", test_ratio=0.1)
    base = _vmhwm_kib()
    t = time.perf_counter()
    if args.child == "rows":
        rows, discards = ann.read_annotation_csv(url, "DETECTION")
        src = rows_source(spark, rows, discards, None, url, annotated=True)
        del rows, discards
    else:
        src = annotation_source(spark, url, "csv", "DETECTION", None)
    sp = plan_on_spark(src, opts, None)
    seconds = time.perf_counter() - t
    n = sum(sp.split_rows.values())
    sp.prepared.unpersist()
    print(json.dumps({"mode": args.child, "rows": n, "seconds": seconds, "driver_peak_kib": _vmhwm_kib(),
                      "after_start_kib": base, "partitions": src.frame.rdd.getNumPartitions()}))
    spark.stop()
    return 0


def spark_bench(args) -> dict:
    results = []
    sizes = [args.rows_small, args.rows]
    for n in sizes:
        make_files(args.dir, n)
    for n in sizes:
        for mode in ("rows", "ranges"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--child-input",
                   make_files(args.dir, n)[0], "--master", args.master]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(r)
            print(f"{n:>9,} records, {mode:<6}: job 1 {r['seconds']:6.1f} s, {r['partitions']:>3} partitions, "
                  f"driver peak RSS {r['driver_peak_kib'] / 1024:7.1f} MiB")
    return {"spark": results}


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints, from this script's JSON result (written into it as
    "rows"): each ranged reader against the whole-text parser it replaced, or, with
    ``--spark``, the driver's peak RSS with byte ranges against the driver parsing the file."""
    out: list[_rows.Row] = []
    results = res["results"]
    if "spark" in results:
        by = {(r["rows"], r["mode"]): r for r in results["spark"]}
        for (n, mode), r in sorted(by.items()):
            before = by.get((n, "rows"))
            if mode == "ranges" and before is not None:
                out.append((f"Spark job 1, {n:,} records: driver peak RSS (byte ranges)",
                            f"{r['driver_peak_kib'] / 1024:.1f} MiB",
                            f"driver parses the file: {before['driver_peak_kib'] / 1024:.1f} MiB",
                            _rows.ratio(before["driver_peak_kib"] / max(1, r["driver_peak_kib"]))))
        return out
    for fmt, readers in results.items():
        names = list(readers)
        anchor = readers[names[0]]["records_per_s"]
        for name in names[1:]:
            rate = readers[name]["records_per_s"]
            out.append((f"{fmt}: {name}", _rows.rate(rate, "rec/s"), f"{names[0]}: {_rows.rate(anchor, 'rec/s')}",
                        _rows.ratio(rate / anchor)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rows-small", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranges", type=int, default=8)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-annotations"))
    ap.add_argument("--spark", action="store_true", help="the Spark runner's job 1: the driver's peak RSS")
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=("rows", "ranges"), help=argparse.SUPPRESS)
    ap.add_argument("--child-input", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    os.makedirs(args.dir, exist_ok=True)
    results = spark_bench(args) if args.spark else parse_bench(args)
    print(f"load average: {os.getloadavg()}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            res = {"records": args.rows, "results": results, "load": os.getloadavg()}
            res["rows"] = table_rows(res)
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``shardfeed bench [NAME ...] [--quick] [--json PATH]``: run the benchmark suite.

Each benchmark is a script in the source tree's ``benchmarks/`` folder (they are not
installed with the package). Every script runs in its own subprocess (so one benchmark's
threads, caches and memory never bias the next), writes its JSON, and the results are
gathered into one table (benchmark, configuration, shardfeed, anchor, ratio) and one
combined JSON file. ``--quick`` passes small sizes, for a smoke run in a minute or two;
the numbers it gives are not the ones to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = tuple[str, str, str, str]  # configuration, shardfeed, anchor, ratio


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _rate(x: float, unit: str) -> str:
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:,.2f} {unit}"


# -- how to read each script's JSON ---------------------------------------------------------------
def _rows_read_tfrecord(res: dict) -> list[Row]:
    med = res["median"]
    best = res.get("derived", {}).get("best_tf")
    anchor = med.get(best) if best else None
    rows = []
    for name, rate in med.items():
        if not name.startswith("shardfeed"):
            continue
        rows.append((name, _rate(rate, "rec/s"), f"{best}: {_rate(anchor, 'rec/s')}" if anchor else "- (no tf.data)",
                     _ratio(rate / anchor if anchor else None)))
    ceiling = med.get("page cache read (ceiling)")
    framing = med.get("shardfeed framing + CRC")
    if ceiling and framing:
        rows.append(("framing + CRC vs page-cache read", _rate(framing, "rec/s"),
                     f"page cache: {_rate(ceiling, 'rec/s')}", _ratio(framing / ceiling)))
    return rows


def _rows_read_paths(res: dict) -> list[Row]:
    med = res["median"]
    anchor_name = res.get("anchor")
    anchor = med.get(anchor_name) if anchor_name else None
    anchor_txt = f"{anchor_name}: {_rate(anchor, 'rec/s')}" if anchor else "- (no tf.data)"
    rows = [(name.strip(), _rate(rate, "rec/s"), anchor_txt, _ratio(rate / anchor if anchor else None))
            for name, rate in med.items() if not name.startswith("tf.data")]
    for what, ratio in res.get("bytes_fetched_ratio", {}).items():
        rows.append((f"bytes fetched, {what}", f"{ratio:.3f}x the data", "1.05x (target)", "-"))
    return rows


def _rows_resume(res: dict) -> list[Row]:
    out = []
    for frac, r in res["rows"].items():
        out.append((f"restore at {float(frac):.0%} of {res['records']:,} records, shuffle {res['buffer']:,}",
                    f"{r['restore_s'] * 1e3:.0f} ms, {r['records_reread']:,} re-read", "1 s (target)",
                    _ratio(1.0 / r["restore_s"] if r["restore_s"] else None)))
    return out


def _rows_shuffle(res: dict) -> list[Row]:
    med, mix = res["median"], res.get("largest_file_share", {})
    tf_name = res.get("anchor")
    s3_name = (res.get("s3") or {}).get("anchor")  # object-storage rows compare with the sequential S3 read
    rows = []
    for name, rate in med.items():
        if name == tf_name:
            continue
        anchor_name = s3_name if s3_name and name.startswith("S3 ") and name != s3_name else tf_name
        anchor = med.get(anchor_name) if anchor_name else None
        rows.append((f"{name} (largest file share {mix[name]:.3f})" if name in mix else name, _rate(rate, "rec/s"),
                     f"{anchor_name}: {_rate(anchor, 'rec/s')}" if anchor else "- (no tf.data)",
                     _ratio(rate / anchor if anchor else None)))
    return rows


def _rows_parse_threads(res: dict) -> list[Row]:
    med = res["median"]
    rows = []
    for name, rate in med.items():
        one_name = name.split(",")[0] + ", 1 thread(s)"
        if name != one_name:
            rows.append((name, _rate(rate, "rec/s"), f"{one_name}: {_rate(med[one_name], 'rec/s')}",
                         _ratio(rate / med[one_name])))
    return rows


def _rows_read_table(res: dict) -> list[Row]:
    rate = res["rows_per_s"]
    sf_rate = rate["shardfeed"]
    conf = f"{res['rows']:,} rows x {res['cols']} cols, batch {res['batch']}"
    return [(f"{conf}, vs {k}", _rate(sf_rate, "rows/s"), f"{k}: {_rate(rate[k], 'rows/s')}", _ratio(sf_rate / rate[k]))
            for k in ("pyarrow", "pandas") if rate.get(k)]


def _rows_long_tail(res: dict) -> list[Row]:
    med, ideal = res["median_s"], res["ideal_s"]
    static = med["static"]
    conf = f"{res['workers']} workers, one {res['slow_factor']:g}x slower, {res['items']} items"
    return [(f"{k}, {conf}, epoch time", f"{t:.3f} s ({t / ideal:.2f}x ideal)",
             f"static: {static:.3f} s ({static / ideal:.2f}x ideal)", _ratio(static / t))
            for k, t in med.items() if k != "static"]


def _rows_object_storage(res: dict) -> list[Row]:
    med, p = res["median"], res["proxy"]
    ceil = (med.get("ceiling (parallel ranged GETs)") or {}).get("mb_per_s")
    where = f"S3 (moto) via {p['latency_ms']:g} ms/request, {p['conn_mbps']:g} MB/s per connection"
    anchor = f"ceiling (parallel ranged GETs): {_rate(ceil, 'MB/s')}" if ceil else "-"
    rows: list[Row] = []
    for name in ("naive fsspec loop (1 connection)", "shardfeed defaults", "shardfeed cache, epoch 1"):
        r = med.get(name)
        if r:
            rows.append((f"{where}: {name}", _rate(r["mb_per_s"], "MB/s"), anchor,
                         _ratio(r["mb_per_s"] / ceil if ceil else None)))
    gets = res.get("epoch2_proxy_gets_full_cache")
    if gets is not None:
        rows.append(("full cache_dir, epoch 2: GETs", f"{gets:,}", "0 (target)", "-"))
    refetch = res.get("refetch_fraction_half_cache")
    if refetch is not None:
        rows.append(("cache_limit = half the data, epoch 2: bytes fetched again", f"{refetch:.0%}",
                     "<= 55% (target)", "-"))
    return rows


def _rows_pipeline_latency(res: dict) -> list[Row]:
    rates = list(res["records_per_s"].items())
    (base_name, base), (slow_name, slow) = rates[0], rates[1]
    conf = f"HTTP {slow_name}, num_parallel_reads={res['reads']}"
    return [(conf, _rate(slow, "rec/s"), f"{base_name}: {_rate(base, 'rec/s')}", _ratio(res["ratio"]))]


def _rows_pipeline_memory(res: dict) -> list[Row]:
    conf = f"peak RSS streaming {res['size_mb']} MB ({res['records']} records)"
    return [(conf, f"{res['pipeline_mb']} MB above imports", "-", "-")]


def _rows_pipeline_seed003(res: dict) -> list[Row]:
    pre, sync = res["shardfeed_prefetch"], res["sync"]
    conf = f"MLP train step, batch production {res['produce_ms']} ms"
    return [(conf, f"{pre['step_ms']:.2f} ms (wait {pre['wait_fraction']:.1%})",
             f"synchronous: {sync['step_ms']:.2f} ms (wait {sync['wait_fraction']:.1%})", _ratio(res["speedup"]))]


def _rows_beside_trainer(res: dict) -> list[Row]:
    med = res["medians"]
    rows = []
    ref = med.get("alone+busy")
    sub = med.get("subprocess")
    if ref and sub:
        rows.append(("trainer step: in_subprocess vs alone beside a busy core", f"{sub['step_ms']:.2f} ms",
                     f"alone+busy: {ref['step_ms']:.2f} ms", _ratio(sub["step_ms"] / ref["step_ms"])))
    for name in ("threads", "dataloader1", "dataloader2"):
        other = med.get(name)
        if sub and other and other["records_per_s"]:
            rows.append((f"records/s delivered: in_subprocess vs {name}", _rate(sub["records_per_s"], "rec/s"),
                         f"{name}: {_rate(other['records_per_s'], 'rec/s')}",
                         _ratio(sub["records_per_s"] / other["records_per_s"])))
    if sub and med.get("dataloader2"):
        rows.append(("peak memory (PSS): in_subprocess vs dataloader2", f"{sub['peak_pss_mb']:.0f} MB",
                     f"dataloader2: {med['dataloader2']['peak_pss_mb']:.0f} MB",
                     _ratio(sub["peak_pss_mb"] / med["dataloader2"]["peak_pss_mb"])))
    return rows


def _rows_convert(res: dict) -> list[Row]:
    results = res["results"]
    anchor_name = next((k for k in results if k.startswith("anchor")), None)
    anchor = results[anchor_name]["images_per_s"] if anchor_name else None
    return [(f"{res['images']} JPEGs -> max side {res['max_image_size']}: {name}", _rate(r["images_per_s"], "img/s"),
             f"{anchor_name.removeprefix('anchor: ')}: {_rate(anchor, 'img/s')}" if anchor else "- (no TensorFlow)",
             _ratio(r["images_per_s"] / anchor if anchor else None))
            for name, r in results.items() if name != anchor_name]


def _rows_pipeline_images(res: dict) -> list[Row]:
    med = res["median"]
    anchor = med.get("tf.data, 2 threads")
    w, h = res["size"]
    return [(f"JPEG {w}x{h} -> 224, batch 64: {name}", _rate(v, "img/s"),
             f"tf.data: {_rate(anchor, 'img/s')}" if anchor else "- (no TensorFlow)",
             _ratio(v / anchor if anchor else None))
            for name, v in med.items() if not name.startswith("tf.data")]


def _rows_native_micro(res: dict) -> list[Row]:
    rows: list[Row] = []
    anchor: dict | None = None  # rows are grouped: an anchor row ("1.00") and the rows it anchors
    for r in res["rows"]:
        if r["vs_anchor"] == "1.00":
            anchor = r
            continue
        ratio = r["vs_anchor"]
        if ratio == "-" or anchor is None:  # no anchor measured for this row
            rows.append((r["what"], _rate(r["rate"], r["unit"]), "-", "-"))
            continue
        rows.append((r["what"], _rate(r["rate"], r["unit"]),
                     f"{anchor['what'].removesuffix(' (anchor)')}: {_rate(anchor['rate'], anchor['unit'])}",
                     f"{ratio}x" if " " not in ratio else ratio.replace(" (", "x (", 1)))
    return rows


def _rows_sequence_parse(res: dict) -> list[Row]:
    rows = {r["path"]: r for r in res["rows"]}
    anchor = rows.get("python reference (anchor)")
    out: list[Row] = []
    for name, r in rows.items():
        if r is anchor or anchor is None:
            continue
        out.append((f"parse_sequence_example, {name}", _rate(r["records_per_s"], "rec/s"),
                    f"Python reference: {_rate(anchor['records_per_s'], 'rec/s')}", _ratio(r["speedup_vs_anchor"])))
    return out


@dataclass(frozen=True)
class Benchmark:
    name: str
    json_flag: str                                   # the script's option naming its JSON output
    full: tuple[str, ...]                            # extra arguments for a full run
    quick: tuple[str, ...]                           # small sizes for --quick
    rows: Callable[[dict], list[Row]]
    data_flag: str | None = None                     # the script's option for its data folder

    def command(self, script: Path, json_path: Path, data_dir: Path, quick: bool) -> list[str]:
        cmd = [sys.executable, str(script), *(self.quick if quick else self.full), self.json_flag, str(json_path)]
        if self.data_flag:
            cmd += [self.data_flag, str(data_dir)]
        return cmd


# the order they run in: micro-benchmarks first, the long ones last
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("native_micro", "--json", (), ("--records", "20000", "--rounds", "1"), _rows_native_micro),
    Benchmark("sequence_parse", "--json", (), ("--records", "2000", "--rounds", "1"), _rows_sequence_parse),
    Benchmark("read_tfrecord", "--json", (), ("--records", "20000", "--rounds", "1"), _rows_read_tfrecord, "--dir"),
    Benchmark("read_paths", "--json", (), ("--records", "20000", "--rounds", "1", "--no-torch"), _rows_read_paths,
              "--dir"),
    Benchmark("parse_threads", "--json", (), ("--records", "20000", "--rounds", "1"), _rows_parse_threads, "--dir"),
    Benchmark("resume", "--json", (), ("--records", "100000", "--buffer", "1000"), _rows_resume, "--dir"),
    Benchmark("shuffle", "--json", (), ("--records", "20000", "--rounds", "1"), _rows_shuffle, "--dir"),
    Benchmark("read_table", "--json", (), ("--rows", "200000", "--repeats", "1"), _rows_read_table, "--data"),
    Benchmark("pipeline_seed003", "--out", (), ("--steps", "20", "--repeats", "1"), _rows_pipeline_seed003),
    Benchmark("pipeline_latency", "--out", (), ("--files", "8", "--records", "2000", "--repeats", "1"),
              _rows_pipeline_latency),
    Benchmark("pipeline_memory", "--out", (), ("--size-mb", "64", "--files", "4"), _rows_pipeline_memory),
    Benchmark("beside_trainer", "--out", (), ("--steps", "40", "--rounds", "1"), _rows_beside_trainer),
    Benchmark("long_tail", "--json", (), ("--items", "40", "--item-ms", "2", "--repeats", "1"), _rows_long_tail),
    Benchmark("pipeline_images", "--json", (), ("--images", "256", "--rounds", "1"), _rows_pipeline_images, "--dir"),
    Benchmark("convert", "--json", (), ("--images", "100", "--rounds", "1"), _rows_convert, "--data-dir"),
    Benchmark("object_storage", "--json", (), ("--quick",), _rows_object_storage, "--dir"),
)}


def benchmarks_dir(override: str | None = None) -> Path:
    """The source tree's ``benchmarks/`` folder: ``override``, ``$SHARDFEED_BENCHMARKS_DIR``,
    or the one beside ``src/`` of the checkout shardfeed is imported from."""
    import shardfeed

    candidates = [override, os.environ.get("SHARDFEED_BENCHMARKS_DIR"),
                  str(Path(shardfeed.__file__).resolve().parents[2] / "benchmarks")]
    for c in candidates:
        if c:
            p = Path(c)
            if p.is_dir():
                return p
            if c is not candidates[-1]:
                raise FileNotFoundError(f"{p}: no such benchmarks folder")
    raise FileNotFoundError(
        f"no benchmarks folder at {candidates[-1]}: the benchmarks live in the source tree, not in the installed "
        "package; run `shardfeed bench` from a checkout installed with `pip install -e .`, or pass "
        "--benchmarks-dir (or set SHARDFEED_BENCHMARKS_DIR) to the repository's benchmarks/ folder")


def _tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_one(bench: Benchmark, script: Path, out_dir: Path, quick: bool, timeout: float | None) -> dict[str, Any]:
    json_path = out_dir / f"{bench.name}.json"
    if json_path.exists():
        json_path.unlink()
    data_dir = out_dir / f"{bench.name}-data{'-quick' if quick else ''}"
    cmd = bench.command(script, json_path, data_dir, quick)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # run the scripts against this very shardfeed
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    entry: dict[str, Any] = {"command": cmd, "json": str(json_path)}
    with tempfile.TemporaryDirectory(prefix=f"sf-bench-{bench.name}-") as cwd:  # stray outputs land here
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            entry.update(seconds=round(time.perf_counter() - t0, 2), returncode=None,
                         error=f"timed out after {timeout:g} s")
            return entry
    entry.update(seconds=round(time.perf_counter() - t0, 2), returncode=proc.returncode, stdout=proc.stdout)
    if proc.returncode != 0:
        entry["error"] = f"exit status {proc.returncode}: {_tail(proc.stderr or proc.stdout, 3)}"
        return entry
    try:
        result = json.loads(json_path.read_text())
    except (OSError, ValueError) as exc:
        entry["error"] = f"no JSON result at {json_path} ({exc})"
        return entry
    entry["result"] = result
    try:
        entry["rows"] = [list(r) for r in bench.rows(result)]
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        entry["error"] = f"unexpected JSON from {script.name} ({type(exc).__name__}: {exc})"
    return entry


def format_table(rows: list[list[str]]) -> str:
    header = ["benchmark", "configuration", "shardfeed", "anchor", "ratio"]
    cols = [header, *rows]
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(str(v).ljust(w) if i < 4 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def cmd_bench_storage(urls: list[str], as_json: str | None) -> int:
    """``shardfeed bench storage URL...``: the link to each object, and what shardfeed picks."""
    from ..storage.fetch import probe

    if not urls:
        raise ValueError("shardfeed bench storage needs the URL of an object to probe (a shard of a few MB or more)")
    results = []
    for url in urls:
        r = probe(url)
        results.append(r)
        print(f"{r['url']}: {r['object_bytes'] / 1e6:.1f} MB object")
        print(f"  latency per request   {r['latency_ms']:.1f} ms (median of 8 small GETs)")
        print(f"  one connection        {r['one_connection_mb_per_s']:.1f} MB/s")
        print(f"  shardfeed would use   {r['concurrency']} requests in flight of {r['part_bytes'] >> 20} MiB")
        print(f"  and reads at          {r['parallel_mb_per_s']:.1f} MB/s "
              f"({r['parallel_bytes'] / 1e6:.0f} MB, {r['requests']} GETs, {r['retries']} retries)")
    if as_json:
        Path(as_json).write_text(json.dumps(results, indent=1))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.names and args.names[0] == "storage":
        return cmd_bench_storage(args.names[1:], args.json if args.json != _DEFAULT_JSON else None)
    if args.names and args.names[0] == "feed":
        from .feed import cmd_bench_feed  # noqa: PLC0415

        if len(args.names) > 1:
            raise ValueError(f"shardfeed bench feed takes options, not names: {' '.join(args.names[1:])}")
        if args.json == _DEFAULT_JSON:
            args.json = os.path.join("bench-out", "feed.json")
        return cmd_bench_feed(args)
    feed_only = [o for o in ("preset", "pipeline", "step_ms", "batch_size", "duration") if getattr(args, o, None)]
    if feed_only:
        raise ValueError(f"--{feed_only[0].replace('_', '-')} is an option of `shardfeed bench feed` only")
    bdir = benchmarks_dir(args.benchmarks_dir)
    available = {n: b for n, b in BENCHMARKS.items() if (bdir / f"{n}.py").is_file()}
    names = args.names or list(available)
    unknown = [n.removesuffix(".py") for n in names if n.removesuffix(".py") not in available]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; in {bdir}: {', '.join(available) or 'none'}")
    names = list(dict.fromkeys(n.removesuffix(".py") for n in names))
    json_out = Path(args.json)
    out_dir = json_out.resolve().parent  # absolute: the scripts run in a scratch folder
    out_dir.mkdir(parents=True, exist_ok=True)
    import shardfeed

    combined: dict[str, Any] = {
        "shardfeed": shardfeed.__version__, "native": shardfeed.native_info(), "quick": args.quick,
        "python": platform.python_version(), "machine": platform.machine(), "cores": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "benchmarks_dir": str(bdir), "benchmarks": {}, "rows": [],
    }
    table: list[list[str]] = []
    failed = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        entry = run_one(available[name], bdir / f"{name}.py", out_dir, args.quick, args.timeout)
        if not args.keep_data:
            shutil.rmtree(out_dir / f"{name}-data{'-quick' if args.quick else ''}", ignore_errors=True)
        combined["benchmarks"][name] = entry
        if "error" in entry:
            failed.append(name)
            table.append([name, "FAILED", entry["error"].splitlines()[0][:120], "-", "-"])
            print(f"    {name} failed: {entry['error']}", file=sys.stderr)
        else:
            table.extend([name, *r] for r in entry["rows"])
            print(f"    done in {entry['seconds']:.1f} s", file=sys.stderr)
    combined["rows"] = [dict(zip(("benchmark", "configuration", "shardfeed", "anchor", "ratio"), r)) for r in table]
    json_out.write_text(json.dumps(combined, indent=1))
    print(f"shardfeed {shardfeed.__version__} ({shardfeed.native_info()}), {os.cpu_count()} cores"
          f"{', --quick (small sizes: not numbers to quote)' if args.quick else ''}")
    print(format_table(table))
    print("ratio: shardfeed over the anchor, higher is better (for times: anchor time / shardfeed time)")
    print(f"wrote {json_out}")
    return 1 if failed else 0


_DEFAULT_JSON = os.path.join("bench-out", "bench.json")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to the ``shardfeed`` parser's subparsers."""
    sp = subparsers.add_parser(
        "bench", help="run the benchmark suite (or the named benchmarks) and print one table",
        description="Run the scripts in the source tree's benchmarks/ folder, each in its own process, and "
                    "print one table (benchmark, configuration, shardfeed, anchor, ratio); the combined JSON "
                    f"goes to --json. Benchmarks: {', '.join(BENCHMARKS)}. `shardfeed bench storage URL` measures "
                    "the link to one object instead: latency, one connection's rate, and the concurrency "
                    "shardfeed picks (storage options from the environment). `shardfeed bench feed` says how "
                    "many simulated accelerators a pipeline keeps busy (options below).")
    sp.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all there are)")
    sp.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not numbers to quote")
    sp.add_argument("--json", default=_DEFAULT_JSON,
                    help="combined JSON output; each benchmark's own JSON goes beside it "
                         "(default bench-out/bench.json)")
    sp.add_argument("--timeout", type=float, default=None, help="seconds allowed per benchmark (default: no limit)")
    sp.add_argument("--benchmarks-dir", default=None,
                    help="the benchmarks/ folder (default: $SHARDFEED_BENCHMARKS_DIR or the checkout's)")
    sp.add_argument("--keep-data", action="store_true", help="keep generated data sets for the next run")
    feed = sp.add_argument_group(
        "shardfeed bench feed", "how many simulated accelerators a pipeline keeps at >= 90%% utilisation "
        "(MLPerf Storage's rule) on this machine, per core, beside tf.data on the same files")
    feed.add_argument("--preset", action="append", choices=["resnet50", "ctr"],
                      help="built-in workload (repeatable; default both): MLPerf ResNet-50 records or CTR-like ones")
    feed.add_argument("--pipeline", default=None, metavar="MODULE:FUNCTION",
                      help="your own pipeline: a function returning a Dataset of batches (needs --step-ms)")
    feed.add_argument("--step-ms", type=float, default=None, help="one accelerator's step time per batch")
    feed.add_argument("--batch-size", type=int, default=None, help="samples per batch (default: the pipeline's)")
    feed.add_argument("--duration", type=float, default=None,
                      help="seconds per simulation (default 5; 1.5 with --quick)")
    sp.set_defaults(func=cmd_bench)
    return sp


def main(argv: list[str] | None = None) -> int:
    """Run ``bench`` alone (``python -m shardfeed.cli.bench_cmd --quick long_tail``)."""
    parser = argparse.ArgumentParser(prog="shardfeed")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:
        print(f"shardfeed bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``shardfeed bench [NAME ...] [--quick] [--json PATH]``: run the benchmark suite.

The benchmark scripts are a source-checkout tool: they live in the repository's
``benchmarks/`` folder and are not installed with the package, so ``shardfeed bench`` (and
``shardfeed bench NAME``) needs a checkout installed with ``pip install -e .``, or
``--benchmarks-dir`` (``$SHARDFEED_BENCHMARKS_DIR``) naming that folder. ``shardfeed bench
storage URL`` and ``shardfeed bench feed`` are part of the package and work from an
installed wheel; ``shardfeed bench peers`` (shardfeed beside other loaders,
``benchmarks/peers/``) is a source-checkout tool like the scripts.

Every script runs in its own subprocess (so one benchmark's threads, caches and memory
never bias the next), prints its own table and writes its JSON, whose top-level ``"rows"``
list holds its part of the suite's table (``[configuration, shardfeed, anchor, ratio]``
strings, made by the script from its own results). This command knows nothing of what a
script measures: it prefixes each row with the benchmark's name and gathers them into one
table (benchmark, configuration, shardfeed, anchor, ratio) and one combined JSON file; a
script whose JSON has no ``"rows"`` is reported as failed. ``--quick`` passes small sizes,
for a smoke run in a minute or two; the numbers it gives are not the ones to quote.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Benchmark:
    name: str
    json_flag: str                                   # the script's option naming its JSON output
    full: tuple[str, ...]                            # extra arguments for a full run
    quick: tuple[str, ...]                           # small sizes for --quick
    data_flag: str | None = None                     # the script's option for its data folder

    def command(self, script: Path, json_path: Path, data_dir: Path, quick: bool) -> list[str]:
        cmd = [sys.executable, str(script), *(self.quick if quick else self.full), self.json_flag, str(json_path)]
        if self.data_flag:
            cmd += [self.data_flag, str(data_dir)]
        return cmd


# How to call each script, and the order they run in (micro-benchmarks first, the long ones last).
# This table holds only what `shardfeed bench` needs to start a script (its JSON and data options,
# its --quick sizes); what a script measured, and how it reads as table rows, is the script's own
# (its JSON's "rows"). The table stays here rather than as a constant in each script because the
# scripts are not importable from here (they import tensorflow, torch, moto... at the top) and one
# table shows the suite's order and its quick sizes at a glance.
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("native_micro", "--json", (), ("--records", "20000", "--rounds", "1")),
    Benchmark("sequence_parse", "--json", (), ("--records", "2000", "--rounds", "1")),
    Benchmark("read_tfrecord", "--json", (), ("--records", "20000", "--rounds", "1"), "--dir"),
    Benchmark("read_paths", "--json", (), ("--records", "20000", "--rounds", "1", "--no-torch"), "--dir"),
    Benchmark("parse_threads", "--json", (), ("--records", "20000", "--rounds", "1"), "--dir"),
    Benchmark("resume", "--json", (), ("--records", "100000", "--buffer", "1000"), "--dir"),
    Benchmark("shuffle", "--json", (), ("--records", "20000", "--rounds", "1"), "--dir"),
    Benchmark("read_table", "--json", (), ("--rows", "200000", "--repeats", "1"), "--data"),
    Benchmark("pipeline_seed003", "--out", (), ("--steps", "20", "--repeats", "1")),
    Benchmark("pipeline_latency", "--out", (), ("--files", "8", "--records", "2000", "--repeats", "1")),
    Benchmark("pipeline_memory", "--out", (), ("--size-mb", "64", "--files", "4")),
    Benchmark("beside_trainer", "--out", (), ("--steps", "40", "--rounds", "1")),
    Benchmark("subprocess_handover", "--out", (), ("--mb", "8", "--batches", "8", "--rounds", "1")),
    Benchmark("torch_workers", "--json", (), ("--records", "8000", "--repeat", "2", "--epochs", "2", "--rounds", "1"),
              "--dir"),
    Benchmark("long_tail", "--json", (), ("--items", "40", "--item-ms", "2", "--repeats", "1")),
    Benchmark("pipeline_images", "--json", (), ("--images", "256", "--rounds", "1"), "--dir"),
    Benchmark("image_scale_quality", "--json", (), ("--images", "8", "--rounds", "1", "--sources", "500x375,800x600")),
    Benchmark("convert", "--json", (), ("--images", "100", "--rounds", "1"), "--data-dir"),
    Benchmark("convert_table", "--json", (), ("--rows", "5000", "--rounds", "1"), "--dir"),
    Benchmark("annotation_spans", "--json", (), ("--rows", "2000", "--rounds", "1"), "--dir"),
    Benchmark("object_storage", "--json", (), ("--quick",), "--dir"),
    Benchmark("startup", "--json", (), ("--records", "200", "--rounds", "1"), "--dir"),
    Benchmark("cache_check", "--json", (), ("--objects", "8", "--total-mb", "8", "--rounds", "1")),
    Benchmark("large_records", "--json", (), ("--records", "400", "--rounds", "1"), "--dir"),
    # starts Spark (local-cluster, executor JVMs): about two minutes even with --quick sizes
    Benchmark("convert_spark", "--json", (), ("--images", "40", "--rows-small", "2000", "--rows", "20000"), "--dir"),
    Benchmark("spark_write_job_ab", "--json", (), ("--images", "40", "--rounds", "1"), "--dir"),
    # starts a local Ray cluster (a raylet and worker processes)
    Benchmark("ray_read", "--json", (), ("--records", "20000", "--builtin-records", "1000", "--images", "100",
                                         "--rounds", "1"), "--dir"),
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
        entry["rows"] = table_rows(result, script.name)
    except ValueError as exc:
        entry["error"] = str(exc)
    return entry


def table_rows(result: Any, script: str) -> list[list[str]]:
    """The ``"rows"`` a benchmark script wrote in its JSON ``result``: a list of
    ``[configuration, shardfeed, anchor, ratio]`` strings, the script's own part of the table.

    Raises:
        ValueError: naming ``script``, when ``result`` has no ``"rows"`` or they are not rows.
    """
    rows = result.get("rows") if isinstance(result, dict) else None
    if rows is None:
        raise ValueError(f"{script} wrote no \"rows\" in its JSON: every benchmark script that `shardfeed bench` runs "
                         "puts its table rows there ([configuration, shardfeed, anchor, ratio] strings, see "
                         "benchmarks/_rows.py)")
    if not isinstance(rows, list) or not all(
            isinstance(r, list) and len(r) == 4 and all(isinstance(v, str) for v in r) for r in rows):
        raise ValueError(f"{script} wrote \"rows\" that are not [configuration, shardfeed, anchor, ratio] strings: "
                         f"{json.dumps(rows)[:200]}")
    return [list(r) for r in rows]


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
    if args.names and args.names[0] == "peers":
        if len(args.names) > 1:
            raise ValueError(f"shardfeed bench peers takes options, not names: {' '.join(args.names[1:])}")
        return cmd_bench_peers(args)
    peers_only = [o for o in ("peers", "workloads") if getattr(args, o, None)]
    if peers_only:
        raise ValueError(f"--{peers_only[0]} is an option of `shardfeed bench peers` only")
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


def cmd_bench_peers(args: argparse.Namespace) -> int:
    """``shardfeed bench peers``: run ``benchmarks/peers/run.py`` (a source-checkout tool) in
    a subprocess against this shardfeed; it prints its own table."""
    script = benchmarks_dir(args.benchmarks_dir) / "peers" / "run.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script}: no peers benchmark there")
    json_out = Path(os.path.join("bench-out", "peers.json") if args.json == _DEFAULT_JSON else args.json).resolve()
    data_dir = json_out.parent / f"peers-data{'-quick' if args.quick else ''}"
    cmd = [sys.executable, str(script), "--json", str(json_out), "--dir", str(data_dir)]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--peers", args.peers] if args.peers else []
    cmd += ["--workloads", args.workloads] if args.workloads else []
    cmd += ["--timeout", f"{args.timeout:g}"] if args.timeout else []
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # run it against this very shardfeed
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return subprocess.run(cmd, env=env, check=False).returncode
    finally:
        if not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)


_DEFAULT_JSON = os.path.join("bench-out", "bench.json")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to the ``shardfeed`` parser's subparsers."""
    sp = subparsers.add_parser(
        "bench", help="run the benchmark suite (or the named benchmarks) and print one table",
        description="Run the scripts in a source checkout's benchmarks/ folder (or --benchmarks-dir), each "
                    "in its own process, and print one table (benchmark, configuration, shardfeed, anchor, "
                    f"ratio); the combined JSON goes to --json. Benchmarks: {', '.join(BENCHMARKS)}. "
                    "`shardfeed bench storage URL` measures the link to one object instead: latency, one "
                    "connection's rate, and the concurrency shardfeed picks (storage options from the "
                    "environment). `shardfeed bench feed` says how many simulated accelerators a pipeline keeps "
                    "busy (options below). These two are part of the package and work from an installed wheel. "
                    "`shardfeed bench peers` runs shardfeed beside other loaders (a source-checkout tool like the "
                    "scripts; options below).")
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
    peers = sp.add_argument_group(
        "shardfeed bench peers", "shardfeed beside LitData, Mosaic Streaming, WebDataset, Grain, tf.data and DALI: "
        "the same data in each one's own format, read through its documented fast path, one table "
        "(benchmarks/peers/; a missing peer is reported and skipped); --quick runs tiny data")
    peers.add_argument("--peers", default=None, metavar="A,B",
                       help="peers to run (default all: shardfeed,tf.data,webdataset,grain,litdata,mosaic,dali)")
    peers.add_argument("--workloads", default=None, metavar="A,C",
                       help="workloads to run (default all): a CTR records, b JPEG bytes, c JPEG decode + resize, "
                            "d global shuffle, e S3 behind a shaping proxy, f convert an image folder, "
                            "g PyTorch DataLoader with 2 workers")
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

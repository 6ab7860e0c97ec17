"""shardfeed beside its peers: the same data, each peer's own format and writer, each
peer's documented fast path, one table (``shardfeed bench peers``).

Peers (each an optional install; a missing one is reported and skipped): shardfeed,
tf.data, WebDataset, Grain on ArrayRecord, LitData, Mosaic Streaming, DALI. Workloads
(``common.WORKLOADS``): (a) CTR-like records into arrays, (b) JPEG bytes only, (c) JPEG
decode + resize to 224, (d) global shuffle, (e) from a moto S3 server on 127.0.0.1 behind
``_shaping_proxy.py`` (epoch 1 into the peer's cache, epoch 2 from it, each in its own
process), (f) converting an image folder into the peer's format, (g) a PyTorch DataLoader
with 2 workers, (h) JPEG decode + resize in 2 worker processes. For (g) and (h) shardfeed's
row is ``to_torch(num_workers=2)`` (its own reader processes, batches through shared-memory
slots), ``shardfeed-dl`` the form ``DataLoader(ds.to_torch(), num_workers=2)``, and the
table ends with each one's rate over shardfeed's in-process rate ((a) and (c)).

Every (peer, workload) runs in its own subprocess, so its peak RSS (the process and its
children, sampled every 20 ms from /proc) and CPU seconds (its own and its reaped
children's, over the measured epoch) are its own; a child measures ``--epochs`` epochs
(conversions for f) after building its pipeline, one for e. Each peer first writes its
copy of the data in a separate process (cached under ``--dir`` between runs). Rounds run
the (peer, workload) pairs interleaved; the table holds medians over rounds and epochs. Columns: records per epoch,
records/s, CPU microseconds per record, peak RSS, bytes read (read() calls of the process
and its DataLoader workers; for (e) the bytes through the proxy; reads through mmap are
not counted) and shardfeed's rate over the peer's. Usage::

    python benchmarks/peers/run.py [--quick] [--peers shardfeed,webdataset] [--workloads a,c]
        [--ctr-records 10000] [--images 300] [--rounds 2] [--epochs 2] [--dir DATA] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # benchmarks/: _shaping_proxy, object_storage

from common import DATA, WORKLOADS, Ctx, dir_bytes, expected, image_files, measure, worker_reads  # noqa: E402

# table name -> module (the order of the table)
PEERS = {
    "shardfeed": "sf_peer",
    "shardfeed-dl": "sf_dl_peer",
    "tf.data": "tfdata_peer",
    "webdataset": "wds_peer",
    "grain": "grain_peer",
    "litdata": "litdata_peer",
    "mosaic": "mosaic_peer",
    "dali": "dali_peer",
}
QUICK = {"ctr_records": 1000, "images": 32, "width": 320, "height": 240, "rounds": 1, "epochs": 1}
FULL = {"ctr_records": 10_000, "images": 300, "width": 500, "height": 375, "rounds": 2, "epochs": 2}


# a workload in worker processes -> the same work in one process (the "over in-process" lines)
IN_PROCESS = {"g": "a", "h": "c"}


def load(peer: str) -> Any:
    return importlib.import_module(PEERS[peer])


# -- the child: one (peer, workload) ------------------------------------------------------------------
def child(peer: str, workload: str, ctx: Ctx, epochs: int) -> dict[str, Any]:
    import PIL.Image  # noqa: F401  (the decoders' import is not part of an epoch)

    mod = load(peer)
    if workload == "f":
        out = os.path.join(ctx.scratch, "converted")
        image_files(ctx)
        if peer == "mosaic":
            mod._streaming()
        for name in mod.IMPORTS:
            importlib.import_module(name)

        def run():
            from common import Tally

            t = Tally()
            t.count = mod.convert(ctx, out)
            t.check = expected(ctx, "img")[1]  # a converter writes or fails; its count is checked
            return t

        results = []
        for _ in range(epochs):
            shutil.rmtree(out, ignore_errors=True)
            results.append(measure(run))
            results[-1]["format_bytes"] = dir_bytes(out)
        return {"epochs": results}
    epoch = mod.epoch_fn(workload, ctx)
    reads = os.environ.get("SF_PEERS_WORKER_READS")

    def run():
        t = epoch()
        if reads:
            t.worker_read_bytes = worker_reads(reads)
        return t

    return {"epochs": [measure(run) for _ in range(1 if workload == "e" else epochs)]}


def child_main(argv: list[str]) -> int:
    kind, peer, what, ctx_json, out = argv
    ctx = Ctx(**json.loads(ctx_json))
    try:
        if kind == "prepare":  # what: the data sets, comma-separated
            mod = load(peer)
            for data in what.split(","):
                mod.prepare(data, ctx, ctx.peer_dir(peer, data))
                open(os.path.join(ctx.peer_dir(peer, data), ".READY"), "w").close()
            res: dict[str, Any] = {"ok": True}
        else:
            res = child(peer, what, ctx, int(ctx.extra.get("epochs", 1)))
    except BaseException as exc:  # the runner reports it in the table
        traceback.print_exc()
        res = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
    with open(out, "w") as f:
        json.dump(res, f)
    return 0


# -- the runner -----------------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return total


def spawn(kind: str, peer: str, what: str, ctx: Ctx, timeout: float, env_extra: dict | None = None) -> dict:
    """Run a child; its JSON result plus ``peak_rss`` (bytes) and ``wall`` seconds."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out = tf.name
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore", **(env_extra or {}))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, peer, what,
           json.dumps(dataclasses.asdict(ctx)), out]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
        done.set()
        return {"error": f"timed out after {timeout:g} s"}
    finally:
        done.set()
        sampler.join()
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"error": f"exit status {proc.returncode}: {(log or '').strip().splitlines()[-1:]}"}
    finally:
        os.unlink(out)
    if "error" in res:
        res["log"] = (log or "")[-3000:]
    res["peak_rss"] = peak[0]
    res["wall"] = time.perf_counter() - t0
    return res


def _epochs(res: dict) -> list[dict]:
    """A child's result as one entry per measured epoch, each with the child's peak RSS."""
    if "error" in res or "epochs" not in res:
        return [res]
    return [dict(e, peak_rss=res["peak_rss"]) for e in res["epochs"]]


class S3:
    """A moto server and the shaping proxy in front of it, and each peer's CTR copy uploaded
    under ``<bucket>/<peer>/``."""

    def __init__(self, latency_ms: float, conn_mbps: float):
        from _shaping_proxy import ShapingProxy
        from object_storage import MotoServer

        self.moto = MotoServer()
        try:
            self.proxy = ShapingProxy("127.0.0.1", self.moto.port, latency_s=latency_ms / 1000,
                                      conn_bytes_per_s=conn_mbps * 1e6).start()
        except BaseException:
            self.moto.stop()
            raise
        self.bucket = "peers"
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.moto.url, aws_access_key_id="x", aws_secret_access_key="x",
                               region_name="us-east-1")
        self.s3.create_bucket(Bucket=self.bucket)

    def upload(self, peer: str, folder: str) -> None:
        for dirpath, _dirs, files in os.walk(folder):
            for f in files:
                path = os.path.join(dirpath, f)
                key = f"{peer}/{os.path.relpath(path, folder)}"
                self.s3.upload_file(path, self.bucket, key)

    def fetched(self) -> int:
        return self.proxy.counters()["bytes_to_client"]

    def stop(self) -> None:
        self.proxy.stop()
        self.moto.stop()


def _s3_env() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1"}


def median_row(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    row = {k: statistics.median(r[k] for r in ok) for k in ("seconds", "cpu_seconds", "read_bytes", "peak_rss")}
    row.update(count=ok[0]["count"], check=ok[0]["check"], counts=[r["count"] for r in ok],
               checks=[r["check"] for r in ok], rounds=len(ok))
    if "format_bytes" in ok[0]:
        row["format_bytes"] = ok[0]["format_bytes"]
    return row


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    peers = args.peers.split(",") if args.peers else list(PEERS)
    workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    bad = [p for p in peers if p not in PEERS] + [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ValueError(f"unknown peer or workload {', '.join(bad)}: peers are {', '.join(PEERS)}, "
                         f"workloads {', '.join(WORKLOADS)}")
    if "shardfeed" not in peers:
        peers.insert(0, "shardfeed")  # the ratio's anchor
    os.makedirs(args.dir, exist_ok=True)
    ctx = Ctx(root=os.path.abspath(args.dir), ctr_records=args.ctr_records, images=args.images,
              width=args.width, height=args.height, extra={"epochs": args.epochs})
    image_files(ctx)  # the raw image folder, once
    status: dict[str, Any] = {}
    plan: list[tuple[str, str]] = []
    for p in peers:
        mod = load(p)
        why = mod.available()
        status[p] = {"version": None if why else mod.version(), "skipped": why}
        if why:
            continue
        sup = mod.supports()
        for w in workloads:
            if w not in sup:
                status[p].setdefault("unsupported", {})[w] = "not written for this peer"
            elif sup.get(w):
                status[p].setdefault("unsupported", {})[w] = sup[w]
            else:
                plan.append((p, w))
    # each peer writes its copy of the data it needs, in its own process
    for p in dict.fromkeys(p for p, _ in plan):
        todo = [d for d in sorted({DATA[w] for q, w in plan if q == p and w != "f"})
                if not os.path.exists(os.path.join(ctx.peer_dir(p, d), ".READY"))]
        if not todo:
            continue
        for d in todo:
            shutil.rmtree(ctx.peer_dir(p, d), ignore_errors=True)
        t0 = time.perf_counter()
        res = spawn("prepare", p, ",".join(todo), ctx, args.timeout)
        if "error" in res:
            print(f"{p}: writing its {'+'.join(todo)} data failed: {res['error']}\n{res.get('log', '')}",
                  file=sys.stderr)
            status[p].setdefault("failed", {})["+".join(todo)] = res["error"]
            plan = [(q, w) for q, w in plan if not (q == p and w != "f")]
            continue
        print(f"{p}: wrote its {'+'.join(todo)} data in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    s3 = None
    if any(w == "e" for _, w in plan):
        s3 = S3(args.latency_ms, args.conn_mbps)
        ctx.s3_endpoint, ctx.s3_bucket = s3.proxy.url, s3.bucket
        for p in dict.fromkeys(p for p, w in plan if w == "e"):
            s3.upload(p, ctx.peer_dir(p, "ctr"))
    results: dict[tuple[str, str], list[dict]] = {}
    reads_dir = tempfile.mkdtemp(prefix="sf-peers-reads-")
    try:
        for rnd in range(args.rounds):
            for p, w in plan:
                print(f"round {rnd + 1}/{args.rounds}: {p} {w} ({WORKLOADS[w]})", file=sys.stderr, flush=True)
                scratch = tempfile.mkdtemp(prefix="sf-peers-", dir=args.dir)
                c = dataclasses.replace(ctx, scratch=scratch)
                env = {"SF_PEERS_WORKER_READS": reads_dir}
                try:
                    if w == "e":
                        env.update(_s3_env())
                        for ep in ("e1", "e2"):
                            before = s3.fetched()
                            res = _epochs(spawn("read", p, w, c, args.timeout, env))
                            res[0]["read_bytes"] = s3.fetched() - before
                            results.setdefault((p, ep), []).extend(res)
                    else:
                        results.setdefault((p, w), []).extend(_epochs(spawn("read", p, w, c, args.timeout, env)))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                last = results[(p, "e2" if w == "e" else w)][-1]
                if "error" in last:
                    print(f"    failed: {last['error']}\n{last.get('log', '')[-1500:]}", file=sys.stderr)
    finally:
        shutil.rmtree(reads_dir, ignore_errors=True)
        if s3:
            s3.stop()
    rows = []
    for (p, w), rs in results.items():
        row = {"peer": p, "workload": w, **median_row(rs)}
        data = DATA[w[0]]
        want = expected(ctx, data)
        if w != "f" and os.path.isdir(ctx.peer_dir(p, data)):
            row["format_bytes"] = dir_bytes(ctx.peer_dir(p, data))
        if "error" not in row:
            row["ok"] = all(c == want[0] for c in row["counts"]) and all(k == want[1] for k in row["checks"])
            row["rate"] = row["count"] / row["seconds"] if row["seconds"] > 0 else 0.0
        rows.append(row)
    by = {(r["peer"], r["workload"]): r for r in rows}
    for r in rows:
        anchor = by.get(("shardfeed", r["workload"]))
        if anchor and "rate" in anchor and r.get("rate"):
            r["shardfeed_over_peer"] = anchor["rate"] / r["rate"]
        alone = by.get(("shardfeed", IN_PROCESS.get(r["workload"], "")))
        if r["peer"].startswith("shardfeed") and alone and alone.get("rate") and r.get("rate"):
            r["over_in_process"] = r["rate"] / alone["rate"]
    return {"peers": status, "rows": rows, "sizes": {"ctr_records": ctx.ctr_records, "images": ctx.images,
                                                      "image": f"{ctx.width}x{ctx.height}"},
            "rounds": args.rounds, "epochs": args.epochs, "quick": args.quick, "python": platform.python_version(),
            "cores": os.cpu_count(), "load_average": os.getloadavg(),
            "proxy": {"latency_ms": args.latency_ms, "conn_mbps": args.conn_mbps}}


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def format_table(res: dict[str, Any]) -> str:
    header = ["workload", "peer", "records", "records/s", "CPU us/rec", "peak RSS MB", "data MB", "read MB",
              "shardfeed x"]
    lines = [header]
    order = list(WORKLOADS) + ["e1", "e2"]
    wl_of = {"e1": "e epoch 1", "e2": "e epoch 2"}
    peers = list(PEERS)
    rows = sorted(res["rows"], key=lambda r: (order.index(r["workload"]), peers.index(r["peer"])))
    for r in rows:
        name = wl_of.get(r["workload"], r["workload"])
        if "error" in r:
            lines.append([name, r["peer"], "FAILED", r["error"][:90], "", "", "", "", ""])
            continue
        lines.append([name, r["peer"], f"{r['count']:,}" + ("" if r["ok"] else " WRONG"), f"{r['rate']:,.0f}",
                      f"{r['cpu_seconds'] / max(r['count'], 1) * 1e6:,.1f}", _mb(r["peak_rss"]),
                      _mb(r.get("format_bytes", 0)), _mb(r["read_bytes"]),
                      f"{r['shardfeed_over_peer']:.2f}x" if "shardfeed_over_peer" in r else "-"])
    for p, st in res["peers"].items():
        if st.get("skipped"):
            lines.append(["all", p, "skipped", st["skipped"][:90], "", "", "", "", ""])
        for w, why in st.get("unsupported", {}).items():
            lines.append([w, p, "n/a", why[:90], "", "", "", "", ""])
        for d, why in st.get("failed", {}).items():
            lines.append([f"{d} data", p, "FAILED", why[:90], "", "", "", "", ""])
    widths = [max(len(x[i]) for x in lines if x[2] not in ("skipped", "n/a", "FAILED") or i < 3)
              for i in range(len(header))]
    out = []
    for x in lines:
        if x[2] in ("skipped", "n/a", "FAILED"):
            out.append("  ".join(v.ljust(widths[i]) for i, v in enumerate(x[:3])) + "  " + x[3])
        else:
            out.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(x, widths))))
    out.insert(1, "  ".join("-" * w for w in widths))
    legend = ", ".join(f"{k}: {v}" for k, v in WORKLOADS.items())
    for r in rows:
        if "over_in_process" in r:
            out.append(f"{r['workload']} {r['peer']}: {r['over_in_process']:.2f}x shardfeed's in-process rate "
                       f"({IN_PROCESS[r['workload']]})")
    return "\n".join(out + [f"workloads: {legend}",
                            "shardfeed x: shardfeed's records/s over the peer's on the same workload (>1: shardfeed "
                            "faster); data MB: the peer's files for the workload (for f: what it wrote); read MB: "
                            "read() bytes of the process and its DataLoader workers (mmap reads not counted), for e "
                            "the bytes through the proxy"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny data, one round: the harness runs, numbers mean little")
    ap.add_argument("--peers", default=None, help=f"comma-separated subset of {','.join(PEERS)}")
    ap.add_argument("--workloads", default=None, help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--ctr-records", type=int, default=None)
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds of every (peer, workload)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs (conversions for f) measured per child process in each round (e: always one)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="shaping proxy: per-request latency")
    ap.add_argument("--conn-mbps", type=float, default=25.0, help="shaping proxy: MB/s per connection")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per child")
    ap.add_argument("--dir", default=None, help="data folder (kept between runs; default a temporary one)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    tmp = None
    if args.dir is None:
        tmp = args.dir = tempfile.mkdtemp(prefix="sf-peers-data-")
    try:
        res = run_all(args)
    except ValueError as exc:
        print(f"benchmarks/peers/run.py: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print("peers: " + "; ".join(f"{p} {st['version'] or 'not installed'}" for p, st in res["peers"].items()))
    print(f"data: {res['sizes']['ctr_records']:,} CTR records, {res['sizes']['images']:,} JPEGs of "
          f"{res['sizes']['image']}; medians of {res['rounds']} round(s) x {res['epochs']} epoch(s); load average "
          f"{' '.join(f'{x:.2f}' for x in res['load_average'])}"
          + ("; --quick: not numbers to quote" if args.quick else ""))
    print(format_table(res))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.json}")
    bad = [r for r in res["rows"] if "error" in r or not r.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Start-up and stop: time to the first batch from a fresh process, import time, and the time
to close a pass mid-epoch (and the threads it leaves behind a second later).

Data: ``--records`` records of ``--record-kb`` KB (random bytes and a label) in ``--shards``
TFRecord shards, and a converted folder of the same size (``sf.convert`` of a DataFrame:
manifest, index files); both local, and uploaded to an S3 API server (moto) on loopback that
the readers reach directly and through a shaping proxy (``--latency-ms`` per request,
``--conn-mbps`` MB/s per connection, as benchmarks/object_storage.py). Each row is a fresh
``python`` process that times, from its first line: ``import shardfeed``, building the
dataset, the first batch of ``--batch``; then reads a few batches, breaks out of the loop and
times the close, and counts the threads alive a second later. Rows (medians of ``--rounds``):

- ``import shardfeed`` alone (and ``import numpy`` beside it);
- ``read_tfrecord(files).batch(n)`` and ``read_converted(folder)`` from local disk, S3
  direct, S3 through the proxy;
- LitData's ``StreamingDataset`` over the same records optimized to a local folder, when
  litdata is installed (its obstore client refuses a plain-http S3 endpoint: local only).

The children run with their bytecode cached (``PYTHONPYCACHEPREFIX`` under ``--dir``, and
one untimed run of each case first), as an installed package has it: pip compiles a
wheel's modules when it installs them. Where ``PYTHONDONTWRITEBYTECODE`` is set (as in
some containers), every fresh process compiled shardfeed's 60-odd modules again, about
0.1 s more per row than a user sees.

::

    python benchmarks/startup.py [--records 2000] [--record-kb 20] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
from _shaping_proxy import ShapingProxy  # noqa: E402

CHILD = textwrap.dedent("""
    import time, json, sys, threading
    t0 = time.perf_counter()
    import shardfeed as sf
    t_import = time.perf_counter() - t0
    kind, where, opts, batch = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    if kind == "files":
        ds = sf.read_tfrecord(where, {"data": sf.FixedLen("bytes"), "label": sf.FixedLen("int64")},
                              storage_options=opts or None).batch(batch)
    else:
        ds = sf.read_converted(where, storage_options=opts or None).batch(batch)
    t_build = time.perf_counter() - t0
    it = iter(ds)
    first = next(it)
    t_first = time.perf_counter() - t0
    for _ in range(3):
        next(it, None)
    before = threading.active_count()
    c0 = time.perf_counter()
    it.close()
    t_close = time.perf_counter() - c0
    time.sleep(1.0)
    print(json.dumps({"import_s": t_import, "build_s": t_build, "first_s": t_first, "close_s": t_close,
                      "threads_before_close": before, "threads_after_1s": threading.active_count() - 1}))
""")

IMPORT_ONLY = ("import time, json; t = time.perf_counter(); import {mod}; "
               "print(json.dumps({{'s': time.perf_counter() - t}}))")

LITDATA = textwrap.dedent("""
    import time, json, sys
    t0 = time.perf_counter()
    from litdata import StreamingDataset, StreamingDataLoader
    ds = StreamingDataset(sys.argv[1])
    dl = StreamingDataLoader(ds, batch_size=int(sys.argv[2]), num_workers=0, collate_fn=lambda b: b)
    next(iter(dl))
    print(json.dumps({"first_s": time.perf_counter() - t0}))
""")


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows": seconds to the first batch
    (LitData's, from a local folder, as the anchor where it ran), and the close."""
    lit = res.get("litdata_local_first_s")
    rows = []
    for name, t in res["cases"].items():
        anchor = f"LitData local: {lit:.3f} s" if lit else "-"
        rows.append((f"{name}: first batch", f"{t['first_s']:.3f} s", anchor,
                     _rows.ratio(lit / t["first_s"] if lit else None)))
        rows.append((f"{name}: close mid-epoch", f"{t['close_s'] * 1e3:.1f} ms", "-", "-"))
    imports = res["imports"]
    numpy = f"import numpy: {min(imports['numpy']):.3f} s"
    rows.append(("import shardfeed", f"{min(imports['shardfeed']):.3f} s", numpy, "-"))
    return rows


def write_data(d: str, records: int, record_kb: int, shards: int) -> tuple[list[str], str]:
    import numpy as np
    import pandas as pd

    import shardfeed as sf

    marker = os.path.join(d, f"READY-{records}-{record_kb}-{shards}")
    files = [os.path.join(d, "files", f"part-{s:05d}.tfrecord") for s in range(shards)]
    folder = os.path.join(d, "converted")
    if os.path.exists(marker):
        return files, folder
    os.makedirs(os.path.dirname(files[0]), exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-records // shards)
    for s, path in enumerate(files):
        n = min(per, records - s * per)
        sf.write_records(path, [sf.encode_example({"data": rng.bytes(record_kb * 1024), "label": s * per + i})
                                for i in range(n)])
    df = pd.DataFrame({"id": np.arange(records), "text": ["x" * (record_kb * 1024)] * records})
    sf.convert(df, folder, schema={"id": "int", "text": "string"}, num_samples_per_tfrecord=per, progress=False)
    open(marker, "w").close()
    return files, folder


def upload(endpoint: str, bucket: str, local: str, prefix: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    for root, _, names in os.walk(local):
        for n in names:
            path = os.path.join(root, n)
            key = f"{prefix}/{os.path.relpath(path, local)}"
            client.put_object(Bucket=bucket, Key=key, Body=open(path, "rb").read())


CHILD_ENV: dict[str, str] = {}


def run_child(code: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                         env={**env, **CHILD_ENV})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--record-kb", type=int, default=20)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--conn-mbps", type=float, default=20)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardfeed-bench-startup"))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing-secret-value")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server: no line a request
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = os.path.join(args.dir, "pycache")
    files, folder = write_data(args.dir, args.records, args.record_kb, args.shards)

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="startup")
    upload(endpoint, "startup", os.path.dirname(files[0]), "files")
    upload(endpoint, "startup", folder, "converted")
    proxy = ShapingProxy(host, port, latency_s=args.latency_ms / 1000, conn_bytes_per_s=args.conn_mbps * 1e6).start()
    try:
        cases = {
            "local files": ("files", os.path.dirname(files[0]) + "/*.tfrecord", {}),
            "local converted folder": ("converted", folder, {}),
            "S3 direct files": ("files", "s3://startup/files/*.tfrecord", {"endpoint_url": endpoint}),
            "S3 direct converted folder": ("converted", "s3://startup/converted", {"endpoint_url": endpoint}),
            "S3 proxy files": ("files", "s3://startup/files/*.tfrecord", {"endpoint_url": proxy.url}),
            "S3 proxy converted folder": ("converted", "s3://startup/converted", {"endpoint_url": proxy.url}),
        }
        results: dict[str, list[dict]] = {k: [] for k in cases}
        imports: dict[str, list[float]] = {"numpy": [], "shardfeed": []}
        for kind, where, opts in cases.values():  # untimed: bytecode written, files in the page cache
            run_child(CHILD, kind, where, json.dumps(opts), str(args.batch))
        for _ in range(args.rounds):
            for mod in imports:
                imports[mod].append(run_child(IMPORT_ONLY.format(mod=mod))["s"])
            for name, (kind, where, opts) in cases.items():
                results[name].append(run_child(CHILD, kind, where, json.dumps(opts), str(args.batch)))
        lit = None
        try:
            import litdata  # noqa: F401

            lit = _litdata(args, files)
        except ImportError:
            pass
    finally:
        proxy.stop()
        server.stop()

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"import numpy {statistics.median(imports['numpy']):.3f} s, "
          f"import shardfeed {statistics.median(imports['shardfeed']):.3f} s (fresh processes, medians)")
    print(f"{'case':30s} {'import s':>9s} {'build s':>8s} {'first s':>8s} {'close ms':>9s} {'threads 1 s later':>18s}")
    table = {}
    for name, rows in results.items():
        table[name] = {k: med(rows, k) for k in ("import_s", "build_s", "first_s", "close_s", "threads_after_1s")}
        t = table[name]
        print(f"{name:30s} {t['import_s']:9.3f} {t['build_s']:8.3f} {t['first_s']:8.3f} {t['close_s'] * 1e3:9.1f} "
              f"{t['threads_after_1s']:18.0f}")
    if lit is not None:
        print(f"{'LitData local (optimized)':30s} {'':9s} {'':8s} {lit:8.3f}")
    if args.json:
        result = {"imports": imports, "cases": table, "raw": results, "litdata_local_first_s": lit}
        result["rows"] = table_rows(result)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _lit_items(path: str):
    """The records of one shard as LitData items (module level: LitData's workers pickle it)."""
    import shardfeed as sf

    for i, record in enumerate(sf.read_records(path)):
        yield {"data": record, "label": i}


def _litdata(args, files: list[str]) -> float | None:
    """LitData's time to its first batch over the same records optimized to a local folder."""
    import litdata

    out = os.path.join(args.dir, "litdata")
    if not os.path.exists(os.path.join(out, "index.json")):
        litdata.optimize(fn=_lit_items, inputs=list(files), output_dir=out, chunk_bytes="16MB", num_workers=1)
    run_child(LITDATA, out, str(args.batch))  # untimed: bytecode written, files in the page cache
    times = [run_child(LITDATA, out, str(args.batch))["first_s"] for _ in range(args.rounds)]
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())

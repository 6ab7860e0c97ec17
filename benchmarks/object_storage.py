"""Object-storage reads: TFRecord shards in an S3 API server (moto) behind a proxy that
shapes loopback traffic like a remote store (20 ms per request, 25 MB/s per connection).

The shards (``--shards``, sizes drawn uniformly between ``--min-mb`` and ``--max-mb`` MB,
times ``--scale``; records of ``--record-kb`` KB of random bytes) are written locally and
uploaded straight to moto (not through the proxy). Then, on the same objects through the
proxy, in one run (``--rounds`` interleaved rounds, medians), these rows:

- naive fsspec loop: s3fs ``cat_file`` one object at a time, frames counted (one connection);
- ceiling: parallel ranged GETs (``--threads`` threads, ``--range-mb`` MiB ranges, a
  persistent connection each) with ``http.client`` on presigned URLs (moto answers an
  unsigned GET of a private bucket with 403), bytes only;
- shardfeed defaults: ``read_tfrecord(urls, storage_options={"endpoint_url": proxy})``,
  every record iterated (the time includes building the dataset: "setup s"; "first s" is
  the time from the start to the first record);
- shardfeed with ``cache_dir`` (no limit): epoch 1, and epoch 2 (should make no GET);
- shardfeed with ``cache_limit`` = half the dataset: epoch 2 after epoch 1, and the
  fraction of the dataset's bytes fetched again.

MB/s is the dataset's bytes (1e6 per MB) over the wall time; every row reads all of it.
GETs, HEADs and MB fetched are counted by the proxy (what reached the store, headers included);
"sf req" / "sf MB" are shardfeed's own counters (``iterator.stats().storage``) where it
has them. Rows shardfeed cannot run yet (an option not accepted) print "n/a".

The stand-in store has two artefacts worth knowing: moto (werkzeug) closes the connection
after every response, so every request is a new TCP connection whatever the client does
(cheap on loopback; a real store keeps them alive); and moto reads a whole object for every
ranged GET, which this script avoids by keeping each object's bytes in moto's memory once
read (``--moto-as-is`` turns that off).

Targets: shardfeed defaults >= 85% of the ceiling; no GET in epoch 2 with the full cache;
<= 55% of the bytes fetched again in epoch 2 with half the dataset cached. Usage::

    python benchmarks/object_storage.py [--shards 200] [--scale 1.0] [--rounds 1] [--json out.json]
    python benchmarks/object_storage.py --quick            # 40 shards at scale 0.1: a smoke run
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
from _shaping_proxy import ShapingProxy  # noqa: E402

# credentials for the loopback S3 server only; never real ones
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing-secret-value")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

MB = 1e6
_HEADER = struct.Struct("<Q")

# moto in its own interpreter (its own GIL): prints its port, serves until stdin closes, so
# it also goes when this process dies. Unless told otherwise it keeps each object's bytes in
# memory once read: moto reads the whole object (from a temporary file) for every GET and
# then slices the range, so a ranged GET of a 50 MB object costs ~40 ms of its CPU whatever
# the range (a real store's cost is the range's); with the bytes kept, it costs the slice.
_MOTO = """
import sys
from moto.server import ThreadedMotoServer
if sys.argv[1:] == ["keep-bytes"]:
    from moto.s3.models import FakeKey
    _value = FakeKey.value

    def _get(self):
        data = self.__dict__.get("_bench_bytes")
        if data is None:
            data = self.__dict__["_bench_bytes"] = _value.fget(self)
        return data

    def _set(self, new):
        self.__dict__.pop("_bench_bytes", None)
        _value.fset(self, new)

    FakeKey.value = property(_get, _set)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


class MotoServer:
    """A moto S3 server on 127.0.0.1 in a subprocess; ``url``, ``port``; ``stop()``.
    ``keep_bytes``: objects stay in its memory once read (see ``_MOTO``)."""

    def __init__(self, keep_bytes: bool = True, timeout: float = 60.0):
        argv = [sys.executable, "-c", _MOTO] + (["keep-bytes"] if keep_bytes else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C is ours to handle
        try:
            line = self._readline(timeout)
            self.port = int(line)
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def _readline(self, timeout: float) -> str:
        out: list[bytes] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not out or not out[0].strip():
            raise RuntimeError(f"moto server did not start within {timeout:g} s (is moto[server] installed?)")
        return out[0].decode()

    def stop(self) -> None:
        p = self.proc
        if p.poll() is not None:
            return
        try:
            p.stdin.close()
            p.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- the dataset ----------------------------------------------------------------------------------
def plan_shards(args) -> list[int]:
    """Records per shard, seeded."""
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(args.seed)
    rec = int(args.record_kb * 1000)
    sizes = rng.uniform(args.min_mb, args.max_mb, args.shards) * args.scale * MB
    return [max(1, round(s / (rec + 16))) for s in sizes]


def write_shards(directory: str, counts: list[int], record_bytes: int, seed: int) -> list[str]:
    """Write the shards (or keep those already there from the same parameters)."""
    import numpy as np  # noqa: PLC0415

    import shardfeed as sf  # noqa: PLC0415

    os.makedirs(directory, exist_ok=True)
    manifest = os.path.join(directory, "manifest.json")
    want = {"counts": counts, "record_bytes": record_bytes, "seed": seed}
    names = [f"part-{i:05d}.tfrecord" for i in range(len(counts))]
    paths = [os.path.join(directory, n) for n in names]
    try:
        with open(manifest) as f:
            if json.load(f) == want and all(os.path.getsize(p) == c * (record_bytes + 16)
                                            for p, c in zip(paths, counts)):
                return paths
    except (OSError, ValueError):
        pass
    rng = np.random.default_rng(seed + 1)
    pool = rng.bytes(16 * 1024 * 1024 + record_bytes)  # records are random slices of a random pool
    for path, n in zip(paths, counts):
        offsets = rng.integers(0, len(pool) - record_bytes, n)
        with sf.TFRecordWriter(path, compression=None) as w:
            for o in offsets:
                w.write(pool[o:o + record_bytes])
    with open(manifest, "w") as f:
        json.dump(want, f)
    return paths


def upload(endpoint: str, bucket: str, paths: list[str]) -> list[tuple[str, int]]:
    import boto3  # noqa: PLC0415

    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket=bucket)

    def one(path: str) -> tuple[str, int]:
        key = "shards/" + os.path.basename(path)
        with open(path, "rb") as f:
            s3.put_object(Bucket=bucket, Key=key, Body=f)
        return key, os.path.getsize(path)

    with ThreadPoolExecutor(4) as ex:
        return list(ex.map(one, paths))


def count_frames(data) -> tuple[int, int]:
    """Records and record bytes in a buffer of TFRecord frames (lengths only, no CRC)."""
    n = nbytes = off = 0
    end = len(data)
    while off < end:
        (length,) = _HEADER.unpack_from(data, off)
        off += 12 + length + 4
        n += 1
        nbytes += length
    if off != end:
        raise ValueError(f"truncated TFRecord data ({off} != {end})")
    return n, nbytes


# -- the rows -------------------------------------------------------------------------------------
class Ctx:
    def __init__(self, proxy: ShapingProxy, bucket: str, objects: list[tuple[str, int]], records: int, args):
        self.proxy, self.bucket, self.objects, self.records, self.args = proxy, bucket, objects, records, args
        self.total = sum(s for _, s in objects)
        self.urls = [f"s3://{bucket}/{k}" for k, _ in objects]
        self.opts = {"endpoint_url": proxy.url}


def _result(ctx: Ctx, seconds: float, records: int | None, before: dict, storage: dict | None = None,
            setup_s: float | None = None, **extra: Any) -> dict:
    d = ShapingProxy.delta(ctx.proxy.counters(), before)
    if records is not None and records != ctx.records:
        raise RuntimeError(f"read {records} records, expected {ctx.records}")
    return {"seconds": seconds, "mb_per_s": ctx.total / MB / seconds, "records_per_s": ctx.records / seconds,
            "setup_s": setup_s, "gets": d["gets"], "heads": d["heads"], "requests": d["requests"],
            "connections": d["connections"],
            "mb_fetched": d["bytes_to_client"] / MB, "storage": storage, **extra}


def row_naive(ctx: Ctx) -> dict:
    import fsspec  # noqa: PLC0415

    before = ctx.proxy.counters()
    t0 = time.perf_counter()
    fs = fsspec.filesystem("s3", endpoint_url=ctx.proxy.url, skip_instance_cache=True)
    n = 0
    for key, _ in ctx.objects:
        data = fs.cat_file(f"{ctx.bucket}/{key}")
        n += count_frames(data)[0]
    return _result(ctx, time.perf_counter() - t0, n, before)


def row_ceiling(ctx: Ctx) -> dict:
    import boto3  # noqa: PLC0415

    # moto refuses unsigned GETs of a private bucket (403): sign once per object, ahead of the
    # clock (a presigned URL signs the host, not the Range header)
    s3 = boto3.client("s3", endpoint_url=ctx.proxy.url)
    signed = {k: s3.generate_presigned_url("get_object", Params={"Bucket": ctx.bucket, "Key": k}, ExpiresIn=3600)
              for k, _ in ctx.objects}
    target = {k: u.split(ctx.proxy.url, 1)[1] for k, u in signed.items()}  # path and query
    span = int(ctx.args.range_mb * 1024 * 1024)
    tasks = [(k, a, min(a + span, size) - 1) for k, size in ctx.objects for a in range(0, size, span)]
    it = iter(tasks)
    lock = threading.Lock()
    got = []

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", ctx.proxy.port, timeout=120)
        buf = memoryview(bytearray(span))
        nbytes = 0
        try:
            while True:
                with lock:
                    task = next(it, None)
                if task is None:
                    break
                key, a, b = task
                for attempt in (0, 1):  # one retry on a fresh connection (a keep-alive the server closed)
                    try:
                        conn.request("GET", target[key], headers={"Range": f"bytes={a}-{b}"})
                        r = conn.getresponse()
                        if r.status != 206:
                            raise RuntimeError(f"GET {key} bytes={a}-{b}: HTTP {r.status} {r.read()[:200]!r}")
                        want, n = b - a + 1, 0
                        while n < want:
                            k = r.readinto(buf[n:want])
                            if not k:
                                raise http.client.IncompleteRead(b"", want - n)
                            n += k
                        r.read()
                        nbytes += n
                        break
                    except (ConnectionError, http.client.HTTPException):
                        conn.close()
                        if attempt:
                            raise
        finally:
            conn.close()
        got.append(nbytes)

    before = ctx.proxy.counters()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(min(ctx.args.threads, len(tasks))) as ex:
        for f in [ex.submit(worker) for _ in range(min(ctx.args.threads, len(tasks)))]:
            f.result()
    dt = time.perf_counter() - t0
    if sum(got) != ctx.total:
        raise RuntimeError(f"ceiling read {sum(got)} bytes, expected {ctx.total}")
    return _result(ctx, dt, None, before)


def _storage_stats(it) -> dict | None:
    stats = getattr(it, "stats", None)
    storage = getattr(stats() if callable(stats) else None, "storage", None)
    to_dict = getattr(storage, "to_dict", None)
    return to_dict() if callable(to_dict) else None


def _epoch(ctx: Ctx, ds, setup_s: float | None = None) -> dict:
    before = ctx.proxy.counters()
    t0 = time.perf_counter()
    it = iter(ds)
    n = nbytes = 0
    first = None
    for rec in it:
        if first is None:
            first = time.perf_counter() - t0 + (setup_s or 0.0)  # from the start, listing included
        n += 1
        nbytes += len(rec)
    dt = time.perf_counter() - t0 + (setup_s or 0.0)
    return _result(ctx, dt, n, before, _storage_stats(it), setup_s, record_bytes=nbytes, first_s=first)


def _build(ctx: Ctx, **kw):
    import shardfeed as sf  # noqa: PLC0415
    from shardfeed.storage import clear_cache  # noqa: PLC0415

    clear_cache()  # every row starts with fresh filesystems and connections
    t0 = time.perf_counter()
    ds = sf.read_tfrecord(ctx.urls, storage_options=ctx.opts, **kw)
    return ds, time.perf_counter() - t0


def row_shardfeed(ctx: Ctx) -> dict:
    ds, setup = _build(ctx)
    return _epoch(ctx, ds, setup)


def rows_cache(ctx: Ctx, scratch: str, limit: int | None) -> tuple[dict, dict]:
    d = tempfile.mkdtemp(prefix="cache-", dir=scratch)
    try:
        kw: dict[str, Any] = {"cache_dir": d}
        if limit is not None:
            kw["cache_limit"] = limit
        ds, setup = _build(ctx, **kw)
        e1 = _epoch(ctx, ds, setup)
        e2 = _epoch(ctx, ds)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return e1, e2


# -- the table ------------------------------------------------------------------------------------
NAIVE, CEIL, SF = "naive fsspec loop (1 connection)", "ceiling (parallel ranged GETs)", "shardfeed defaults"
C1, C2 = "shardfeed cache, epoch 1", "shardfeed cache, epoch 2"
H1, H2 = "shardfeed half cache, epoch 1", "shardfeed half cache, epoch 2"
ROWS = (NAIVE, CEIL, SF, C1, C2, H1, H2)


def _median(results: list[dict | None]) -> dict | None:
    got = [r for r in results if r is not None]
    if not got:
        return None
    out: dict[str, Any] = {}
    for k, v in got[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in got)
        elif isinstance(v, dict):
            out[k] = {kk: statistics.median(r[k][kk] for r in got if r.get(k))
                      for kk, vv in v.items() if isinstance(vv, (int, float))}
        else:
            out[k] = v
    return out


def _fmt(v: Any, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def print_table(med: dict[str, dict | None], ceiling: float | None, errors: dict[str, str]) -> None:
    head = (f"{'row':<36}{'MB/s':>9}{'records/s':>11}{'s':>8}{'setup s':>8}{'first s':>8}{'vs ceiling':>11}"
            f"{'GETs':>7}{'HEADs':>7}{'MB fetched':>11}{'sf req':>8}{'sf MB':>9}")
    print(head)
    print("-" * len(head))
    for name in ROWS:
        r = med.get(name)
        if r is None:
            why = errors.get(name, "(not run: --rows)")
            print(f"{name:<36}{'n/a':>9}   {why[:90]}")
            continue
        st = r.get("storage") or {}
        vs = r["mb_per_s"] / ceiling if ceiling else None
        sf_mb = st["bytes_fetched"] / MB if "bytes_fetched" in st else None
        print(f"{name:<36}{r['mb_per_s']:>9,.1f}{r['records_per_s']:>11,.0f}{r['seconds']:>8.2f}"
              f"{_fmt(r.get('setup_s'), '.2f'):>8}{_fmt(r.get('first_s'), '.2f'):>8}{_fmt(vs, '.0%'):>11}"
              f"{r['gets']:>7,.0f}{r['heads']:>7,.0f}"
              f"{r['mb_fetched']:>11,.1f}{_fmt(st.get('requests'), ',.0f'):>8}{_fmt(sf_mb, ',.1f'):>9}")


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med, p = res["median"], res["proxy"]
    ceil = (med.get("ceiling (parallel ranged GETs)") or {}).get("mb_per_s")
    where = f"S3 (moto) via {p['latency_ms']:g} ms/request, {p['conn_mbps']:g} MB/s per connection"
    anchor = f"ceiling (parallel ranged GETs): {_rows.rate(ceil, 'MB/s')}" if ceil else "-"
    rows: list[_rows.Row] = []
    for name in ("naive fsspec loop (1 connection)", "shardfeed defaults", "shardfeed cache, epoch 1"):
        r = med.get(name)
        if r:
            rows.append((f"{where}: {name}", _rows.rate(r["mb_per_s"], "MB/s"), anchor,
                         _rows.ratio(r["mb_per_s"] / ceil if ceil else None)))
    gets = res.get("epoch2_proxy_gets_full_cache")
    if gets is not None:
        rows.append(("full cache_dir, epoch 2: GETs", f"{gets:,}", "0 (target)", "-"))
    refetch = res.get("refetch_fraction_half_cache")
    if refetch is not None:
        rows.append(("cache_limit = half the data, epoch 2: bytes fetched again", f"{refetch:.0%}",
                     "<= 55% (target)", "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--min-mb", type=float, default=2.0, help="smallest shard, MB (before --scale)")
    ap.add_argument("--max-mb", type=float, default=50.0, help="largest shard, MB (before --scale)")
    ap.add_argument("--record-kb", type=float, default=100.0, help="record size, KB")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the shard sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="proxy: added per request")
    ap.add_argument("--conn-mbps", type=float, default=25.0, help="proxy: MB/s per connection (0: no cap)")
    ap.add_argument("--total-mbps", type=float, default=0.0, help="proxy: MB/s of all connections (0: no cap)")
    ap.add_argument("--threads", type=int, default=48, help="ceiling: parallel ranged GETs")
    ap.add_argument("--range-mb", type=float, default=8.0, help="ceiling: range size, MiB")
    ap.add_argument("--rows", default="abcde", help="which rows to run (letters a-e; default all)")
    ap.add_argument("--moto-as-is", action="store_true",
                    help="moto reads the whole object for every ranged GET (default: keep the bytes in memory)")
    ap.add_argument("--dir", default=None, help="keep the generated shards here (reused when the parameters match)")
    ap.add_argument("--quick", action="store_true", help="40 shards at scale 0.1, 1 round: a smoke run")
    ap.add_argument("--json", default=os.path.join("bench-out", "object_storage.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.shards, args.scale, args.rounds = min(args.shards, 40), min(args.scale, 0.1), 1

    counts = plan_shards(args)
    record_bytes = int(args.record_kb * 1000)
    records = sum(counts)
    scratch = tempfile.mkdtemp(prefix="sf-object-storage-")
    moto = proxy = None
    try:
        data_dir = args.dir or os.path.join(scratch, "shards")
        t = time.perf_counter()
        paths = write_shards(data_dir, counts, record_bytes, args.seed)
        total = sum(os.path.getsize(p) for p in paths)
        print(f"shards: {len(paths)} files, {records:,} records, {total / MB:,.1f} MB "
              f"({time.perf_counter() - t:.1f} s)", file=sys.stderr)
        t = time.perf_counter()
        moto = MotoServer(keep_bytes=not args.moto_as_is)
        bucket = f"sf-bench-{uuid.uuid4().hex[:8]}"
        objects = upload(moto.url, bucket, paths)
        print(f"uploaded to moto at {moto.url} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
        if not args.dir:
            shutil.rmtree(data_dir, ignore_errors=True)  # the local copy is no longer needed
        proxy = ShapingProxy("127.0.0.1", moto.port, latency_s=args.latency_ms / 1e3,
                             conn_bytes_per_s=args.conn_mbps * MB or None,
                             total_bytes_per_s=args.total_mbps * MB or None).start()
        print(f"proxy: {proxy!r}", file=sys.stderr)
        ctx = Ctx(proxy, bucket, objects, records, args)

        runs: dict[str, list[dict | None]] = {k: [] for k in ROWS}
        errors: dict[str, str] = {}

        def attempt(names: tuple[str, ...], fn: Callable[[], Any]) -> None:
            try:
                out = fn()
            except TypeError as exc:  # an option this shardfeed does not accept (yet)
                for n in names:
                    runs[n].append(None)
                    errors[n] = f"TypeError: {exc}"
                return
            out = out if isinstance(out, tuple) else (out,)
            for n, r in zip(names, out):
                runs[n].append(r)

        for rnd in range(args.rounds):
            if "a" in args.rows:
                runs[NAIVE].append(row_naive(ctx))
            if "b" in args.rows:
                runs[CEIL].append(row_ceiling(ctx))
            if "c" in args.rows:
                attempt((SF,), lambda: row_shardfeed(ctx))
            if "d" in args.rows:
                attempt((C1, C2), lambda: rows_cache(ctx, scratch, None))
            if "e" in args.rows:
                attempt((H1, H2), lambda: rows_cache(ctx, scratch, total // 2))
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
        final = proxy.counters()
    finally:
        if proxy is not None:
            proxy.stop()
        if moto is not None:
            moto.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    med = {k: _median(v) for k, v in runs.items()}
    ceiling = med[CEIL]["mb_per_s"] if med.get(CEIL) else None
    caps = f"{args.conn_mbps:g} MB/s per connection" if args.conn_mbps else "no per-connection cap"
    if args.total_mbps:
        caps += f", {args.total_mbps:g} MB/s in all"
    print(f"\n{len(objects)} TFRecord shards in moto S3, {records:,} records of {record_bytes / 1e3:g} KB, "
          f"{total / MB:,.1f} MB; proxy {args.latency_ms:g} ms/request, {caps}; ceiling {args.threads} threads x "
          f"{args.range_mb:g} MiB ranges; {os.cpu_count()} cores, median of {args.rounds}")
    print_table(med, ceiling, errors)

    # targets
    sf_ratio = med[SF]["mb_per_s"] / ceiling if med.get(SF) and ceiling else None
    e2 = med.get(C2)
    e2_gets = None if e2 is None else (e2["storage"] or {}).get("requests", e2["gets"])
    e2_proxy_gets = None if e2 is None else e2["gets"]
    h2 = med.get(H2)
    refetch = None
    if h2 is not None:
        fetched = (h2["storage"] or {}).get("bytes_fetched")
        refetch = (fetched if fetched is not None else h2["mb_fetched"] * MB) / total
    naive = med[NAIVE]["mb_per_s"] if med.get(NAIVE) else None
    if naive and ceiling:
        print(f"\nceiling / naive loop: {ceiling / naive:.1f}x")
    met = {"shardfeed_vs_ceiling": None if sf_ratio is None else sf_ratio >= 0.85,
           "epoch2_gets_full_cache": None if e2_proxy_gets is None else e2_proxy_gets == 0,
           "refetch_half_cache": None if refetch is None else refetch <= 0.55}

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "NOT met")

    print(f"targets: shardfeed {_fmt(sf_ratio, '.0%')} of the ceiling "
          f"(>= 85%: {verdict(met['shardfeed_vs_ceiling'])}); "
          f"epoch-2 GETs with the full cache {_fmt(e2_proxy_gets, ',.0f')} "
          f"(== 0: {verdict(met['epoch2_gets_full_cache'])}); "
          f"refetched with half cached {_fmt(refetch, '.0%')} (<= 55%: {verdict(met['refetch_half_cache'])})")
    print(f"proxy totals: {final['connections']:,} connections, {final['requests']:,} requests "
          f"({final['gets']:,} GET, {final['heads']:,} HEAD), {final['bytes_to_client'] / MB:,.1f} MB served")

    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    result = {"shards": len(objects), "records": records, "record_bytes": record_bytes, "bytes": total,
              "scale": args.scale, "rounds": args.rounds, "cores": os.cpu_count(),
              "proxy": {"latency_ms": args.latency_ms, "conn_mbps": args.conn_mbps,
                        "total_mbps": args.total_mbps or None},
              "ceiling": {"threads": args.threads, "range_mib": args.range_mb},
              "runs": runs, "median": med, "errors": errors,
              "mb_per_s": {k: v["mb_per_s"] for k, v in med.items() if v},
              "shardfeed_vs_ceiling": sf_ratio, "ceiling_vs_naive": ceiling / naive if naive and ceiling else None,
              "epoch2_gets_full_cache": e2_gets, "epoch2_proxy_gets_full_cache": e2_proxy_gets,
              "refetch_fraction_half_cache": refetch, "targets_met": met}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)

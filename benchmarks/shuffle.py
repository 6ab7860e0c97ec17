"""Shuffled reads against sequential ones: page cache, object storage, tf.data and Grain.

Same CTR-like files as ``benchmarks/read_tfrecord.py``, batch 1024, parse to numpy,
interleaved rounds (every row once per round), medians. From the page cache:

- sequential ``read_tfrecord(files, spec).batch(1024)``;
- ``shuffle="files"`` and ``shuffle="blocks"`` (the default blocks: the records starting in each
  4 MiB of a file, cut through its index file);
- ``shuffle="blocks"`` followed by a 4,096-record buffer shuffle;
- ``shuffle="global"`` (one seeded permutation of all records, gathered through the index);
- the same with the permutation computed by its numpy reference (the path before the native
  ``permute.c``, and where the extension is not built: the before/after of issue 40);
- a 10,000-record buffer shuffle after the source (``.shuffle(10_000, seed=0)``);
- tf.data ``TFRecordDataset(files).shuffle(10_000).batch(1024).map(parse_example)``;
- two record sets of issue 40's targets (``--set-records`` each, default ``--records``, in 8
  files; ``0`` skips): about 190 bytes (11 features: a label, a list of ids, 5 floats, 4 short
  bytes) and about 1 KB (26 features: 12 floats, 12 bytes values of 50 bytes); per set:
  sequential, ``shuffle="global"`` (records parsed where they lie in the mapped shards, every
  frame checked by the parsing threads), the same with each window's records copied and checked
  first (``gather.IN_PLACE = False``: the path before), with the reference gather (a copy per file
  of each window, then the frame scan: the gather before the native ``gather_frames``), and
  ``shuffle="blocks"``;
- large records (``--image-records``, 3,000 of 100 KB, an image-like bytes value and a label,
  in 4 files): ``batch(64)``, ``.shuffle(1000, seed=0).batch(64)``, and the same with each
  batch's records copied into one buffer (the gather before issue 40) (``0`` skips).

From object storage (``--no-s3`` skips): the same shards and their ``.idx`` files uploaded
straight to a moto S3 server on 127.0.0.1 (``object_storage.py``'s ``MotoServer``), read
through ``_shaping_proxy.py`` (``--latency-ms`` per request, default 20; ``--conn-mbps``
per connection, default 25) as ``read_tfrecord("s3://...", spec, storage_options=
{"endpoint_url": proxy})``:

- sequential; ``shuffle="blocks"``; ``shuffle="blocks", block_size=2048`` (the default before
  blocks were cut by bytes: 2,048 records, about 1.8 MB here);
- ``shuffle="global"`` without a cache: a ranged GET per run of a window's records of one file
  lying within 128 KiB of each other (often one per record; 16 at once), so only
  the first ``--global-nocache-records`` (2,048: one window) records are read (the rate is
  over that prefix), with ``num_parallel_reads=None`` (no window read ahead past them);
- ``shuffle="global"`` with a fresh ``cache_dir``: epoch 1 (whole shards fetched into the
  cache) and epoch 2 (from the cache).

Grain on ArrayRecord (``--no-grain`` skips; skipped with the reason when ``grain`` or
``array_record`` do not import; neither is a shardfeed dependency): the same records
written once to ArrayRecord files (one per shard, ``group_size:1``), read in a global
shuffle and parsed with shardfeed's native ``parse_batch`` (the same parse as the rows
above), batch 1024:

- ``MapDataset.range(n).shuffle(seed=0).batch(1024).map(ids -> parse_batch(source.__getitems__(ids)))``;
- ``DataLoader(IndexSampler(n, shuffle=True, seed=0, num_epochs=1), [Batch(1024, batch_fn=parse_batch)],
  worker_count=0)`` (the documented form; it reads record by record, so only the first
  ``--grain-loader-records`` (32,768) records are read).

Also how mixed the batches are: the mean, over batches, of the largest share of one
source file in a batch (1/8 is perfectly mixed over 8 files, 1.0 not mixed at all); the
S3 rows deliver the same order as their page-cache twins.

Targets (issue 12): S3 ``shuffle="blocks"`` >= 80% of S3 sequential; page-cache
``shuffle="global"`` >= 50% of page-cache sequential. Usage::

    python benchmarks/shuffle.py [--records 250000] [--rounds 3] [--no-tf] [--no-s3] [--no-grain] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _rows
import numpy as np  # noqa: E402
from read_tfrecord import BATCH, SPEC, _tf_spec, make_dataset  # noqa: E402

import shardfeed as sf  # noqa: E402

SEQ, BLOCKS, GLOBAL = "sequential", "shuffle='blocks'", "shuffle='global'"
S3_SEQ, S3_BLOCKS = "S3 sequential", "S3 shuffle='blocks'"
S3_BLOCKS_2048 = "S3 shuffle='blocks', block_size=2048"
BLOCKS_2048 = "shuffle='blocks', block_size=2048 (order only)"
S3_GLOBAL_NOCACHE = "S3 shuffle='global', no cache (prefix)"
S3_GLOBAL_E1, S3_GLOBAL_E2 = "S3 shuffle='global' + cache_dir, epoch 1", "S3 shuffle='global' + cache_dir, epoch 2"
TF = "tf.data shuffle(10000)"
GRAIN_MAP = "grain MapDataset shuffle + __getitems__"
GRAIN_LOADER = "grain DataLoader(IndexSampler shuffle)"
GLOBAL_PY = "shuffle='global', numpy permutation"
IMG_SEQ, IMG_SHUF = "100 KB records: batch(64)", "100 KB records: shuffle(1000).batch(64)"
IMG_SHUF_COPY = "100 KB records: shuffle(1000).batch(64), copied"
IMG_SPEC = {"image": sf.FixedLen("bytes"), "label": sf.FixedLen("int64")}
PREFIX_ROWS = (S3_GLOBAL_NOCACHE, GRAIN_LOADER)  # slow rows that read only their first records
# record sets of issue 40's targets: (name, float features, bytes features, bytes value length, ids up to)
SETS = {"190 B": (5, 4, 2, 2), "1 KB": (12, 12, 50, 19)}


def set_spec(kind: str) -> dict:
    """The spec of record set ``kind`` (see :data:`SETS`): a label, a list of ids, floats, bytes."""
    floats, strings, _, _ = SETS[kind]
    spec = {"label": sf.FixedLen("int64"), "ids": sf.VarLen("int64")}
    spec.update({f"d{j}": sf.FixedLen("float32") for j in range(floats)})
    spec.update({f"c{j}": sf.FixedLen("bytes") for j in range(strings)})
    return spec


def set_files(directory: str, records: int, kind: str) -> list[str]:
    """``records`` records of set ``kind`` in 8 files (index files beside them), written once."""
    floats, strings, width, most = SETS[kind]
    tag = kind.replace(" ", "")
    files = [os.path.join(directory, f"set{tag}-{i}-of-8-{records}.tfrecord") for i in range(8)]
    if all(os.path.exists(f + ".idx") for f in files):
        return files
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(1)
    for i, f in enumerate(files):
        n = len(range(i, records, 8))
        dense = rng.normal(size=(n, floats)).astype(np.float32)
        cats = rng.integers(0, 1 << 62, size=(n, strings))
        lens = rng.integers(1, most + 1, size=n)
        with sf.TFRecordWriter(f) as w:
            for k in range(n):
                feats = {"label": [k % 2], "ids": rng.integers(0, 1 << 40, size=lens[k])}
                for j in range(floats):
                    feats[f"d{j}"] = [float(dense[k, j])]
                for j in range(strings):
                    feats[f"c{j}"] = [(b"%016x" % cats[k, j] * 4)[:width]]
                w.write(sf.encode_example(feats))
        sf.build_index(f)
    return files


def set_runners(files: list[str], kind: str) -> dict[str, Callable[[], Any]]:
    """Sequential, global and blocks over record set ``kind``, batch 1024."""
    spec = set_spec(kind)

    def src(**kw):
        return sf.read_tfrecord(files, spec=spec, **kw)

    return {f"{kind}: sequential": lambda: _rate(src().batch(BATCH)),
            f"{kind}: shuffle='global'": lambda: _rate(src(shuffle="global", seed=0).batch(BATCH)),
            f"{kind}: shuffle='global', copied gather": lambda: _copied_gather(
                lambda: _rate(src(shuffle="global", seed=0).batch(BATCH))),
            f"{kind}: shuffle='global', reference gather": lambda: _reference_gather(
                lambda: _rate(src(shuffle="global", seed=0).batch(BATCH))),
            f"{kind}: shuffle='blocks'": lambda: _rate(src(shuffle="blocks", seed=0).batch(BATCH))}


def _copied_gather(fn: Callable[[], Any]) -> Any:
    """``fn()`` with each window's records copied and checked by ``gather_frames`` before
    the parse (the path before records were parsed in place)."""
    from shardfeed.pipeline import gather  # noqa: PLC0415

    saved, gather.IN_PLACE = gather.IN_PLACE, False
    try:
        return fn()
    finally:
        gather.IN_PLACE = saved


def _reference_gather(fn: Callable[[], Any]) -> Any:
    """``fn()`` with the global shuffle's windows gathered by the reference path (one copy
    per file of each window, then the frame scan: the gather before the native
    ``gather_frames`` of issue 40 item 2)."""
    from shardfeed.pipeline import gather  # noqa: PLC0415

    native, gather._gather_frames = gather._gather_frames, None
    try:
        return fn()
    finally:
        gather._gather_frames = native


def _rate(ds, limit: int | None = None) -> tuple[int, float]:
    """Records delivered and the seconds to the last of them (``limit``: stop at or just
    past that many; the time to tear the iterator down is not counted)."""
    t0 = time.perf_counter()
    n = 0
    it = iter(ds)
    for b in it:
        n += len(b["label"])
        if limit is not None and n >= limit:
            break
    dt = time.perf_counter() - t0
    close = getattr(it, "close", None)
    if callable(close):
        close()
    return n, dt


def _numpy_permutation(fn: Callable[[], Any]) -> Any:
    """``fn()`` with the global shuffle's permutation computed by the numpy reference."""
    from shardfeed.pipeline import permute  # noqa: PLC0415

    native, permute._native_permute = getattr(permute, "_native_permute", None), None
    try:
        return fn()
    finally:
        permute._native_permute = native


def runners(files):
    def src(**kw):
        return sf.read_tfrecord(files, spec=SPEC, **kw)

    return {
        SEQ: lambda: _rate(src().batch(BATCH)),
        "shuffle='files'": lambda: _rate(src(shuffle="files", seed=0).batch(BATCH)),
        BLOCKS: lambda: _rate(src(shuffle="blocks", seed=0).batch(BATCH)),
        "shuffle='blocks' + shuffle(4096)": lambda: _rate(src(shuffle="blocks", seed=0).shuffle(4096, seed=0)
                                                          .batch(BATCH)),
        GLOBAL: lambda: _rate(src(shuffle="global", seed=0).batch(BATCH)),
        GLOBAL_PY: lambda: _numpy_permutation(lambda: _rate(src(shuffle="global", seed=0).batch(BATCH))),
        "buffer shuffle(10000)": lambda: _rate(src().shuffle(10_000, seed=0).batch(BATCH)),
    }


def image_files(directory: str, records: int) -> list[str]:
    """``records`` records of a 100 KB bytes value (pieces of one random blob) and a label, in
    4 files, written once."""
    files = [os.path.join(directory, f"img-{i}-of-4-{records}.tfrecord") for i in range(4)]
    if all(os.path.exists(f) for f in files):
        return files
    os.makedirs(directory, exist_ok=True)
    blob = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    for i, f in enumerate(files):
        with sf.TFRecordWriter(f) as w:
            for k in range(i, records, 4):
                w.write(sf.encode_example({"image": blob[(k * 7919) % 100_000:][:100_000], "label": k}))
    return files


def _records_copied(fn: Callable[[], Any]) -> Any:
    """``fn()`` with the fused buffer shuffle's batches copied into one buffer, one slice a
    record joined (its gather before it passed records by reference)."""
    from shardfeed.formats.chunks import FrameChunk  # noqa: PLC0415
    from shardfeed.formats.native import Buffers  # noqa: PLC0415
    from shardfeed.pipeline.shuffle_batch import ShuffledBatches  # noqa: PLC0415

    by_reference = ShuffledBatches._gather

    def copied(self, positions):
        batch, urls = by_reference(self, positions)
        buf = batch.buffer
        bufs, which = (buf.buffers, buf.which.tolist()) if isinstance(buf, Buffers) else ((buf,), [0] * batch.count)
        views = [memoryview(b).cast("B") for b in bufs]
        pieces = [views[w][o:o + n] for w, o, n in zip(which, batch.offsets.tolist(), batch.lengths.tolist())]
        offs = np.zeros(batch.count, np.int64)
        np.cumsum(batch.lengths[:-1], out=offs[1:])
        return FrameChunk(b"".join(pieces), offs, batch.lengths, batch.positions, batch.sources), urls

    ShuffledBatches._gather = copied
    try:
        return fn()
    finally:
        ShuffledBatches._gather = by_reference


def image_runners(files: list[str]) -> dict[str, Callable[[], Any]]:
    def src():
        return sf.read_tfrecord(files, spec=IMG_SPEC)

    return {IMG_SEQ: lambda: _rate(src().batch(64)),
            IMG_SHUF: lambda: _rate(src().shuffle(1000, seed=0).batch(64)),
            IMG_SHUF_COPY: lambda: _records_copied(lambda: _rate(src().shuffle(1000, seed=0).batch(64)))}


def run_tf(files):
    import tensorflow as tf  # noqa: PLC0415

    spec = _tf_spec(tf)
    ds = tf.data.TFRecordDataset(files).shuffle(10_000, seed=0).batch(BATCH).map(lambda x: tf.io.parse_example(x, spec))
    t0 = time.perf_counter()
    n = 0
    for b in ds:
        n += len(b["label"].numpy())
    return n, time.perf_counter() - t0


# -- object storage -------------------------------------------------------------------------------
class S3Setup:
    """The shards and their index files in a moto server, behind the shaping proxy."""

    def __init__(self, files: list[str], latency_ms: float, conn_mbps: float):
        from _shaping_proxy import ShapingProxy  # noqa: PLC0415
        from object_storage import MotoServer, upload  # noqa: PLC0415 (also sets test-only AWS credentials)

        self.moto = self.proxy = None
        try:
            self.moto = MotoServer()
            self.bucket = f"sf-shuffle-{uuid.uuid4().hex[:8]}"
            # upload() keys objects "shards/<basename>": every shard lands beside its .idx
            objects = upload(self.moto.url, self.bucket, files + [f + ".idx" for f in files])
            self.bytes = sum(s for k, s in objects if not k.endswith(".idx"))
            self.urls = [f"s3://{self.bucket}/shards/{os.path.basename(f)}" for f in files]
            self.proxy = ShapingProxy("127.0.0.1", self.moto.port, latency_s=latency_ms / 1e3,
                                      conn_bytes_per_s=conn_mbps * 1e6 or None).start()
        except BaseException:
            self.stop()
            raise
        self.opts = {"endpoint_url": self.proxy.url}

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.moto is not None:
            self.moto.stop()

    def source(self, **kw):
        from shardfeed.storage import clear_cache  # noqa: PLC0415

        clear_cache()  # every row starts with fresh filesystems and connections
        return sf.read_tfrecord(self.urls, spec=SPEC, storage_options=self.opts, **kw)


def s3_runners(s3: S3Setup, scratch: str, nocache_records: int) -> dict[str, Callable[[], Any]]:
    epoch2: dict[str, Any] = {}

    def global_cached_epoch1():
        d = tempfile.mkdtemp(prefix="cache-", dir=scratch)
        ds = s3.source(shuffle="global", seed=0, cache_dir=d).batch(BATCH)
        epoch2["ds"], epoch2["dir"] = ds, d
        return _rate(ds)

    def global_cached_epoch2():
        ds, d = epoch2.pop("ds"), epoch2.pop("dir")
        try:
            return _rate(ds)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    return {
        S3_SEQ: lambda: _rate(s3.source().batch(BATCH)),
        S3_BLOCKS: lambda: _rate(s3.source(shuffle="blocks", seed=0).batch(BATCH)),
        S3_BLOCKS_2048: lambda: _rate(s3.source(shuffle="blocks", seed=0, block_size=2048).batch(BATCH)),
        # no read-ahead here: windows gathered ahead would each take their 2,048 GETs and
        # keep the proxy busy after the row stops
        S3_GLOBAL_NOCACHE: lambda: _rate(s3.source(shuffle="global", seed=0, num_parallel_reads=None).batch(BATCH),
                                         nocache_records),
        S3_GLOBAL_E1: global_cached_epoch1,
        S3_GLOBAL_E2: global_cached_epoch2,  # runs right after epoch 1, on the same dataset
    }


# -- Grain on ArrayRecord -------------------------------------------------------------------------
def grain_missing() -> str | None:
    """Why Grain cannot run here (the import error), or ``None``."""
    try:
        import grain.python  # noqa: F401, PLC0415
        from array_record.python import array_record_module  # noqa: F401, PLC0415
    except Exception as exc:  # noqa: BLE001 (any import failure means: skip, and say why)
        return f"{type(exc).__name__}: {exc} (pip install grain array-record)"
    return None


def write_array_records(files: list[str], directory: str, records: int) -> list[str]:
    """The records of ``files`` in ArrayRecord files, one per shard (kept when already there)."""
    from array_record.python.array_record_module import ArrayRecordWriter  # noqa: PLC0415

    out = [os.path.join(directory, os.path.basename(f).replace(".tfrecord", ".array_record")) for f in files]
    marker = os.path.join(directory, f"READY-{records}")
    if os.path.exists(marker):
        return out
    os.makedirs(directory, exist_ok=True)
    t0 = time.perf_counter()
    for f, path in zip(files, out):
        w = ArrayRecordWriter(path, "group_size:1")  # one record per chunk: random access without reading neighbours
        try:
            for r in sf.read_tfrecord(f):
                w.write(r)
        finally:
            w.close()
    open(marker, "w").close()
    print(f"wrote {len(out)} ArrayRecord files in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def grain_runners(paths: list[str], loader_records: int) -> dict[str, Callable[[], Any]]:
    import grain.python as gp  # noqa: PLC0415

    from shardfeed.formats.parse import parse_batch  # noqa: PLC0415

    source = gp.ArrayRecordDataSource(paths)
    n = len(source)

    def mapdataset():
        ds = gp.MapDataset.range(n).shuffle(seed=0).batch(BATCH).map(
            lambda ids: parse_batch(source.__getitems__(ids.tolist()), SPEC))
        return _rate(ds)

    def dataloader():
        loader = gp.DataLoader(data_source=source,
                               sampler=gp.IndexSampler(n, shuffle=True, seed=0, num_epochs=1),
                               operations=[gp.Batch(BATCH, batch_fn=lambda recs: parse_batch(list(recs), SPEC))],
                               worker_count=0)
        return _rate(loader, loader_records)

    return {GRAIN_MAP: mapdataset, GRAIN_LOADER: dataloader}


def grain_mixing(paths: list[str]) -> float:
    """Largest file share per batch of the MapDataset order (indices map to files by the
    files' record counts)."""
    import grain.python as gp  # noqa: PLC0415

    source = gp.ArrayRecordDataSource(paths)
    ends = np.cumsum([len(gp.ArrayRecordDataSource([p])) for p in paths])
    order = np.fromiter(gp.MapDataset.range(len(source)).shuffle(seed=0), dtype=np.int64)
    which = np.searchsorted(ends, order, "right")
    full = len(which) // BATCH * BATCH
    shares = [np.bincount(b, minlength=len(paths)).max() / BATCH for b in which[:full].reshape(-1, BATCH)]
    return float(np.mean(shares)) if shares else float("nan")


def mixing(files, make) -> float:
    """Mean over batches of the largest share of one file in a batch (each serialized
    record looked up in a table of which file holds it)."""
    lookup = {}
    for fi, f in enumerate(files):
        for r in sf.read_tfrecord(f):
            lookup[r] = fi
    shares = []
    batch = []
    for r in make():
        batch.append(lookup[r])
        if len(batch) == BATCH:
            shares.append(np.bincount(batch, minlength=len(files)).max() / BATCH)
            batch = []
    return float(np.mean(shares)) if shares else float("nan")


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    med, mix = res["median"], res.get("largest_file_share", {})
    tf_name = res.get("anchor")
    s3_name = (res.get("s3") or {}).get("anchor")  # object-storage rows compare with the sequential S3 read
    rows = []
    for name, rate in med.items():
        if name == tf_name:
            continue
        anchor_name = s3_name if s3_name and name.startswith("S3 ") and name != s3_name else tf_name
        anchor = med.get(anchor_name) if anchor_name else None
        rows.append((f"{name} (largest file share {mix[name]:.3f})" if name in mix else name, _rows.rate(rate, "rec/s"),
                     f"{anchor_name}: {_rows.rate(anchor, 'rec/s')}" if anchor else "- (no tf.data)",
                     _rows.ratio(rate / anchor if anchor else None)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join("bench-out", "ctr"))
    ap.add_argument("--no-tf", action="store_true")
    ap.add_argument("--no-s3", action="store_true", help="skip the object-storage rows")
    ap.add_argument("--no-grain", action="store_true", help="skip the Grain rows")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="proxy: added per request")
    ap.add_argument("--conn-mbps", type=float, default=25.0, help="proxy: MB/s per connection (0: no cap)")
    ap.add_argument("--global-nocache-records", type=int, default=2048,
                    help="S3 global shuffle without a cache: records read (one GET each)")
    ap.add_argument("--grain-loader-records", type=int, default=32768,
                    help="Grain DataLoader row: records read (it goes record by record)")
    ap.add_argument("--image-records", type=int, default=3000, help="100 KB records for the buffer-shuffle rows "
                    "(0: skip them)")
    ap.add_argument("--set-records", type=int, default=None, help="records of each of the 190 B (11 features) "
                    "and 1 KB (26 features) sets (default: --records; 0: skip them)")
    ap.add_argument("--json", default=os.path.join("bench-out", "shuffle.json"))
    args = ap.parse_args(argv)
    files = make_dataset(args.dir, args.records)
    for f in files:  # blocks need index files: build them once, outside the clock
        if not os.path.exists(f + ".idx"):
            sf.build_index(f)
    run = runners(files)
    if not args.no_tf:
        run[TF] = lambda: run_tf(files)
    expected = {k: args.records for k in run}
    if args.image_records:
        run.update(image_runners(image_files(args.dir, args.image_records)))
        expected[IMG_SEQ] = expected[IMG_SHUF] = expected[IMG_SHUF_COPY] = args.image_records
    set_records = args.records if args.set_records is None else args.set_records
    for kind in SETS if set_records else ():
        rows = set_runners(set_files(args.dir, set_records, kind), kind)
        run.update(rows)
        expected.update({k: set_records for k in rows})
    skipped: dict[str, str] = {}

    grain_paths = None
    if args.no_grain:
        skipped["grain"] = "--no-grain"
    elif (why := grain_missing()) is not None:
        skipped["grain"] = why
    else:
        grain_paths = write_array_records(files, os.path.join(args.dir, "array_record"), args.records)
        expected[GRAIN_MAP] = args.records
        expected[GRAIN_LOADER] = min(args.grain_loader_records, args.records)
        run.update(grain_runners(grain_paths, expected[GRAIN_LOADER]))

    s3 = None
    scratch = tempfile.mkdtemp(prefix="sf-shuffle-")
    try:
        if args.no_s3:
            skipped["s3"] = "--no-s3"
        else:
            t = time.perf_counter()
            s3 = S3Setup(files, args.latency_ms, args.conn_mbps)
            print(f"uploaded to moto, proxy {s3.proxy!r} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
            nocache = min(args.global_nocache_records, args.records)
            run.update(s3_runners(s3, scratch, nocache))
            expected.update({k: args.records for k in (S3_SEQ, S3_BLOCKS, S3_BLOCKS_2048, S3_GLOBAL_E1, S3_GLOBAL_E2)})
            expected[S3_GLOBAL_NOCACHE] = nocache
        rates: dict[str, list[float]] = {k: [] for k in run}
        # records per CPU-second of this process (every thread): what a row costs, which the
        # other processes of a shared machine disturb far less than its wall-clock rate
        cpu_rates: dict[str, list[float]] = {k: [] for k in run}
        for r in range(args.rounds):
            for name, fn in run.items():
                cpu = time.process_time()
                n, dt = fn()
                cpu_rates[name].append(n / max(time.process_time() - cpu, 1e-9))
                want = expected[name]
                # a prefix stops at the end of the batch that reaches it
                if n != want and not (name in PREFIX_ROWS and want <= n < want + BATCH):
                    raise SystemExit(f"{name}: {n} records, expected {want}")
                rates[name].append(n / dt)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        proxy_totals = s3.proxy.counters() if s3 is not None else None
    finally:
        if s3 is not None:
            s3.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in rates.items()}
    raw = {
        SEQ: lambda: sf.read_tfrecord(files),
        "shuffle='files'": lambda: sf.read_tfrecord(files, shuffle="files", seed=0),
        BLOCKS: lambda: sf.read_tfrecord(files, shuffle="blocks", seed=0),
        "shuffle='blocks' + shuffle(4096)":
            lambda: sf.read_tfrecord(files, shuffle="blocks", seed=0).shuffle(4096, seed=0),
        GLOBAL: lambda: sf.read_tfrecord(files, shuffle="global", seed=0),
        BLOCKS_2048: lambda: sf.read_tfrecord(files, shuffle="blocks", seed=0, block_size=2048),
        "buffer shuffle(10000)": lambda: sf.read_tfrecord(files).shuffle(10_000, seed=0),
    }
    mixed = {k: mixing(files, make) for k, make in raw.items()}
    if grain_paths is not None:
        mixed[GRAIN_MAP] = mixed[GRAIN_LOADER] = grain_mixing(grain_paths)
    twin = {S3_SEQ: SEQ, S3_BLOCKS: BLOCKS, S3_BLOCKS_2048: BLOCKS_2048, S3_GLOBAL_NOCACHE: GLOBAL,
            S3_GLOBAL_E1: GLOBAL, S3_GLOBAL_E2: GLOBAL}
    for k, t in twin.items():
        if k in med:
            mixed[k] = mixed[t]
    del mixed[BLOCKS_2048]  # measured for its S3 twin only

    seq = med[SEQ]
    s3_seq = med.get(S3_SEQ)
    anchor = med.get(TF)
    where = (f"; S3: moto via proxy {args.latency_ms:g} ms/request, "
             f"{f'{args.conn_mbps:g} MB/s per connection' if args.conn_mbps else 'no per-connection cap'}"
             if s3 is not None else "")
    print(f"\n{args.records} CTR-like records, {len(files)} files, batch {BATCH}, median of {args.rounds}{where}")
    head = (f"{'configuration':<44} {'records/s':>12} {'vs sequential':>14} {'vs S3 seq':>10} {'vs tf.data':>11} "
            f"{'largest file share':>19}")
    print(head)
    print("-" * len(head))
    for k, v in med.items():
        mix = f"{mixed[k]:.3f}" if k in mixed else "-"
        vs_s3 = f"{v / s3_seq:.2f}x" if s3_seq and k.startswith("S3") else "-"
        print(f"{k:<44} {v:>12,.0f} {v / seq:>13.2f}x {vs_s3:>10} {(f'{v / anchor:.2f}x' if anchor else '-'):>11} "
              f"{mix:>19}")
    for what, why in skipped.items():
        print(f"{what + ': not run':<44} {why}")
    for k in PREFIX_ROWS:
        if k in med and expected[k] < args.records:
            print(f"({k}: the first {expected[k]:,} records only)")

    if IMG_SHUF in med:
        print(f"100 KB records: shuffle(1000).batch(64) {med[IMG_SHUF] / med[IMG_SEQ]:.2f}x of batch(64) "
              f"(target >= 0.8x; {med[IMG_SHUF_COPY] / med[IMG_SEQ]:.2f}x with the records copied)")
    cpu_med = {k: statistics.median(v) for k, v in cpu_rates.items()}
    print("records per CPU-second (median; per-round ratio to the sequential row of the same records):")
    for k, v in cpu_med.items():
        base = (f"{k.split(':')[0]}: sequential" if any(k.startswith(f"{kind}:") for kind in SETS) else
                IMG_SEQ if k.startswith("100 KB") else SEQ)
        ratios = [a / b for a, b in zip(cpu_rates[k], cpu_rates[base])] if base in cpu_rates else []
        print(f"  {k:<44} {v:>12,.0f} {statistics.median(ratios) if ratios else float('nan'):>8.2f}x  "
              f"({', '.join(f'{x:.2f}' for x in ratios)})")
    for kind in SETS if set_records else ():
        seq_k = med[f"{kind}: sequential"]
        print(f"{kind} records ({len(set_spec(kind))} features): shuffle='global' "
              f"{med[f'{kind}: shuffle={chr(39)}global{chr(39)}'] / seq_k:.2f}x, shuffle='blocks' "
              f"{med[f'{kind}: shuffle={chr(39)}blocks{chr(39)}'] / seq_k:.2f}x of sequential (median rates); per "
              "round: global " + ", ".join(f"{g / q:.2f}" for g, q in zip(rates[f"{kind}: shuffle='global'"],
                                                                          rates[f"{kind}: sequential"])))
    print(f"page cache: shuffle='global' {med[GLOBAL] / seq:.2f}x (numpy permutation {med[GLOBAL_PY] / seq:.2f}x) "
          f"and shuffle='blocks' {med[BLOCKS] / seq:.2f}x of sequential (targets >= 0.5x, >= 0.9x); load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    blocks_vs_s3 = med[S3_BLOCKS] / s3_seq if s3_seq else None
    global_vs_seq = med[GLOBAL] / seq
    met = {"s3_blocks_vs_s3_sequential": None if blocks_vs_s3 is None else blocks_vs_s3 >= 0.80,
           "global_vs_sequential_page_cache": global_vs_seq >= 0.50}

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "NOT met")

    print(f"targets: S3 blocks {'n/a' if blocks_vs_s3 is None else f'{blocks_vs_s3:.0%}'} of S3 sequential "
          f"(>= 80%: {verdict(met['s3_blocks_vs_s3_sequential'])}); page-cache global {global_vs_seq:.0%} of "
          f"sequential (>= 50%: {verdict(met['global_vs_sequential_page_cache'])})")
    if proxy_totals is not None:
        print(f"proxy totals: {proxy_totals['connections']:,} connections, {proxy_totals['requests']:,} requests, "
              f"{proxy_totals['bytes_to_client'] / 1e6:,.1f} MB served", file=sys.stderr)

    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": args.records, "rounds": args.rounds, "rates": rates, "median": med, "cpu_rates": cpu_rates,
              "largest_file_share": mixed, "anchor": TF if anchor else None,
              "s3": None if s3 is None else {"latency_ms": args.latency_ms, "conn_mbps": args.conn_mbps,
                                             "bytes": s3.bytes, "anchor": S3_SEQ,
                                             "global_nocache_records": expected.get(S3_GLOBAL_NOCACHE),
                                             "proxy_totals": proxy_totals},
              "prefix_records": {k: expected[k] for k in PREFIX_ROWS if k in expected},
              "skipped": skipped, "targets": {"s3_blocks_vs_s3_sequential": blocks_vs_s3,
                                              "global_vs_sequential_page_cache": global_vs_seq},
              "targets_met": met}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

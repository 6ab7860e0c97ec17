"""Micro-benchmarks of the native core: CRC-32C, framing scan, Example parsing.

In one run, interleaved, best of ``--rounds``:

- CRC-32C over 64 MiB: native (``shardfeed._native``) against the ``crc32c`` package (the anchor);
- a TFRecord file of CTR-like records (about 860 bytes each) in the page cache: reading
  its bytes alone (the anchor), then reading + ``scan_frames`` with CRC checks; the ratio
  is the share of page-cache read speed that framing + CRC keep;
- parsing the same records into numpy columns, batch 1024: the pure-Python reference on a
  sample, the native parser with bytes as object arrays and as ``BytesBuffer``, on one
  thread and on two threads (each parsing its own batches).

Prints a table and writes JSON (``--json``, default ``bench-out/native_micro.json``)::

    python benchmarks/native_micro.py [--records 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time

import _rows
import numpy as np

from shardfeed.formats import example as ex
from shardfeed.formats import native as nv
from shardfeed.formats.spec import FixedLen, VarLen
from shardfeed.formats.tfrecord import frame

SPEC = {"label": FixedLen("int64"), **{f"I{k}": FixedLen("float32") for k in range(13)},
        **{f"C{k}": FixedLen("bytes") for k in range(26)}, "ids": VarLen("int64")}
BATCH = 1024


def ctr_records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(n, 13)).astype(np.float32)
    cats = rng.integers(0, 1 << 32, size=(n, 26))
    lens = rng.integers(1, 20, size=n)
    out = []
    for i in range(n):
        f = {"label": int(i % 2)}
        f.update({f"I{k}": dense[i, k:k + 1] for k in range(13)})
        f.update({f"C{k}": [b"%08x" % cats[i, k]] for k in range(26)})
        f["ids"] = rng.integers(0, 1 << 40, size=lens[i])
        out.append(ex.encode_example(f))
    return out


def best(fn, rounds: int) -> float:
    t = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    rows: list[_rows.Row] = []
    anchor: dict | None = None  # rows are grouped: an anchor row ("1.00") and the rows it anchors
    for r in res["measurements"]:
        if r["vs_anchor"] == "1.00":
            anchor = r
            continue
        ratio = r["vs_anchor"]
        if ratio == "-" or anchor is None:  # no anchor measured for this row
            rows.append((r["what"], _rows.rate(r["rate"], r["unit"]), "-", "-"))
            continue
        rows.append((r["what"], _rows.rate(r["rate"], r["unit"]),
                     f"{anchor['what'].removesuffix(' (anchor)')}: {_rows.rate(anchor['rate'], anchor['unit'])}",
                     f"{ratio}x" if " " not in ratio else ratio.replace(" (", "x (", 1)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=os.path.join("bench-out", "native_micro.json"))
    args = ap.parse_args()
    if not nv.native_available():
        raise SystemExit(f"the native extension is not built: {nv.native_info()}")
    rows: list[tuple[str, float, str, str]] = []

    # --- CRC
    data = random.Random(0).randbytes(64 << 20)
    try:
        import crc32c as crc_pkg  # type: ignore[import-not-found]
    except ImportError:
        crc_pkg = None
    t_nat = best(lambda: nv.crc32c(data), args.rounds)
    anchor = None
    if crc_pkg is not None:
        t_pkg = best(lambda: crc_pkg.crc32c(data), args.rounds)
        anchor = len(data) / t_pkg / 1e9
        rows.append(("crc32c package (anchor)", anchor, "GB/s", "1.00"))
    rows.append((f"native crc32c ({nv.native_info()})", len(data) / t_nat / 1e9, "GB/s",
                 f"{t_pkg / t_nat:.2f}" if anchor else "-"))

    # --- framing
    records = ctr_records(args.records)
    fd, path = tempfile.mkstemp(suffix=".tfrecord")
    with os.fdopen(fd, "wb") as f:
        for r in records:
            f.write(frame(r))
    size = os.path.getsize(path)

    chunk = 8 << 20

    def read_only() -> None:
        buf = bytearray(2 * chunk)
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    def read_scan() -> None:
        # one thread: read a chunk, scan it, keep the cut-off frame for the next round
        buf = bytearray(4 * chunk)
        mv = memoryview(buf)
        have = 0
        with open(path, "rb", buffering=0) as f:
            while True:
                got = f.readinto(mv[have:have + chunk])
                if not got:
                    break
                have += got
                _, _, consumed, err = nv.scan_frames(mv[:have])
                assert err is None
                buf[:have - consumed] = buf[consumed:have]
                have -= consumed

    def read_scan_overlapped() -> None:
        # a reader thread and the scanning thread overlap (both release the GIL)
        import queue

        q: "queue.Queue[bytes | None]" = queue.Queue(maxsize=4)

        def reader() -> None:
            with open(path, "rb", buffering=0) as f:
                while True:
                    b = f.read(chunk)
                    q.put(b or None)
                    if not b:
                        return

        t = threading.Thread(target=reader)
        t.start()
        rest = b""
        while True:
            b = q.get()
            if b is None:
                break
            buf = rest + b if rest else b
            _, _, consumed, err = nv.scan_frames(buf)
            assert err is None
            rest = buf[consumed:]
        t.join()

    read_only()
    t_read = best(read_only, args.rounds)
    t_scan = best(read_scan, args.rounds)
    t_over = best(read_scan_overlapped, args.rounds)
    rows.append(("page-cache read (anchor)", size / t_read / 1e9, "GB/s", "1.00"))
    rows.append(("read + scan_frames + CRC, one thread", size / t_scan / 1e9, "GB/s", f"{t_read / t_scan:.2f}"))
    rows.append(("read + scan_frames + CRC, reader thread", size / t_over / 1e9, "GB/s", f"{t_read / t_over:.2f}"))
    with open(path, "rb") as f:
        blob = f.read()
    os.unlink(path)
    t_scan_mem = best(lambda: nv.scan_frames(blob), args.rounds)
    rows.append(("scan_frames + CRC, in memory", size / t_scan_mem / 1e9, "GB/s", "-"))

    # --- parsing
    offsets, lengths, _, _ = nv.scan_frames(blob)
    triples = [(blob, offsets[i:i + BATCH], lengths[i:i + BATCH]) for i in range(0, len(offsets), BATCH)]
    compiled = nv.compile_spec(SPEC)
    sample = records[:2000]
    t_ref = best(lambda: [ex.parse_example(sample[i:i + BATCH], SPEC) for i in range(0, len(sample), BATCH)], 1)
    ref_rate = len(sample) / t_ref
    rows.append(("pure-Python reference parse", ref_rate, "records/s", "1.00"))
    for mode in ("object", "buffer"):
        def one(mode: str = mode, parts: list = triples) -> None:
            for t in parts:
                nv.parse_example_batch(t, compiled, bytes_as=mode)

        def two(mode: str = mode) -> None:
            halves = [triples[0::2], triples[1::2]]
            ts = [threading.Thread(target=one, args=(mode, h)) for h in halves]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        t1 = best(one, args.rounds)
        t2 = best(two, args.rounds)
        n = len(offsets)
        rows.append((f"native parse, bytes_as={mode}, 1 thread", n / t1, "records/s", f"{n / t1 / ref_rate:.1f}"))
        rows.append((f"native parse, bytes_as={mode}, 2 threads", n / t2, "records/s",
                     f"{n / t2 / ref_rate:.1f} ({t1 / t2:.2f}x 1 thread)"))

    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'rate':>14}  unit       vs anchor")
    for name, rate, unit, ratio in rows:
        print(f"{name:<{width}}  {rate:>14,.2f}  {unit:<9}  {ratio}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": args.records, "record_bytes": size / len(records), "info": nv.native_info(),
              "measurements": [dict(zip(("what", "rate", "unit", "vs_anchor"), r)) for r in rows]}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

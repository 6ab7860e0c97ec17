"""Two or more builds of the native core side by side in one process: the batch parser's CPU
time per record (this thread's CPU time, so other jobs on a shared machine disturb it less
than wall time), bytes as object arrays and as buffers, interleaved rounds, medians.

Each build is a ``shardfeed/_native*.so`` file (for example one built in a checkout of
``main`` and one in a branch); the records are the CTR-like ones of ``native_micro.py``
(48 batches of 1024, about 40 MB, parsed from one buffer with their data CRCs, as the
read path hands them over). Not part of `shardfeed bench` (it needs two builds)::

    python benchmarks/_parse_ab.py before=../main/src/shardfeed/_native.cpython-311-x86_64-linux-gnu.so \\
        after=src/shardfeed/_native.cpython-311-x86_64-linux-gnu.so [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from native_micro import SPEC, ctr_records  # noqa: E402

from shardfeed.formats import native as nv  # noqa: E402

BATCH = 1024


def load(path: str):
    """The extension module in `path`, loaded beside the one shardfeed imported. Loaded from a
    fresh copy: loading the file shardfeed already imported (or one loaded before) gave the
    already-initialised module back here, so two "builds" ran the same code."""
    copy = os.path.join(tempfile.mkdtemp(prefix="parse_ab-"), os.path.basename(path))
    shutil.copy(path, copy)
    spec = importlib.util.spec_from_file_location("shardfeed._native", copy)
    if spec is None or spec.loader is None:
        raise SystemExit(f"not an extension module: {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="NAME=PATH of a _native .so; the first is the anchor")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batches", type=int, default=48)
    args = ap.parse_args(argv)
    if nv._ext is None:
        raise SystemExit(f"the native extension is not built: {nv.native_info()}")
    builds = {}
    for b in args.builds:
        name, _, path = b.partition("=")
        builds[name] = load(path)
    recs = ctr_records(BATCH * args.batches)
    buf = b"".join(recs)
    lens = np.array([len(r) for r in recs], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    crcs = np.array([nv.masked_crc32c(r) for r in recs], dtype=np.uint32)
    specs = {}
    own = nv._ext
    try:
        for name, mod in builds.items():
            nv._ext = mod
            specs[name] = nv.CompiledSpec(SPEC)

        def run(name: str, mode: str) -> float:
            nv._ext = builds[name]
            t0 = time.thread_time()
            for j in range(args.batches):
                sl = slice(j * BATCH, (j + 1) * BATCH)
                out = nv.parse_example_batch((buf, offs[sl], lens[sl]), specs[name], bytes_as=mode, crcs=crcs[sl])
                del out
            return (time.thread_time() - t0) / (args.batches * BATCH) * 1e6

        res: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for mode in ("object", "buffer"):
                for name in builds:
                    res.setdefault((mode, name), []).append(run(name, mode))
    finally:
        nv._ext = own
    print(f"{len(recs)} CTR-like records, batch {BATCH}, CPU time of the parsing thread, median of {args.rounds}")
    print(f"{'bytes as':<8} {'build':<12} {'us/record':>10} {'vs ' + next(iter(builds)):>12}")
    for mode in ("object", "buffer"):
        anchor = statistics.median(res[(mode, next(iter(builds)))])
        for name in builds:
            m = statistics.median(res[(mode, name)])
            print(f"{mode:<8} {name:<12} {m:>10.3f} {m / anchor:>11.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

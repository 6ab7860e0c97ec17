"""SequenceExample batch parsing: the pure-Python reference (the anchor) against the native
path, and ``tf.io.parse_sequence_example`` when TensorFlow is installed (``--tf``).

Records: a context (an int64 id, a bytes name, a few float weights) and three feature
lists, 5 to 40 steps each: ``tok`` (FixedLenSequence int64, 2 per step), ``emb``
(FixedLenSequence float32, 8 per step) and ``words`` (VarLen bytes, 0 to 3 per step),
plus one feature list the spec does not ask for. One batch of ``--records``; best of
``--rounds``, interleaved; both paths' results are checked equal first.

Prints a table and writes JSON (``--json``, default ``bench-out/sequence_parse.json``)::

    python benchmarks/sequence_parse.py [--records 10000] [--rounds 3] [--tf]
"""

from __future__ import annotations

import argparse
import json
import os

import _rows
import numpy as np
from native_micro import best  # the same timing helper (this folder is on sys.path)

import shardfeed as sf
from shardfeed.formats import native as nv
from shardfeed.formats import sequence as sq

CONTEXT = {"id": sf.FixedLen("int64"), "name": sf.FixedLen("bytes", default=b""), "w": sf.VarLen("float32")}
SEQUENCE = {"tok": sf.FixedLenSequence("int64", shape=[2]), "emb": sf.FixedLenSequence("float32", shape=[8]),
            "words": sf.VarLen("bytes")}


def records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        steps = int(rng.integers(5, 41))
        ctx = {"id": [i], "name": b"rec-%d" % i, "w": rng.normal(size=int(rng.integers(0, 4))).astype(np.float32)}
        lists = {
            "tok": [rng.integers(0, 50_000, 2) for _ in range(steps)],
            "emb": [rng.normal(size=8).astype(np.float32) for _ in range(steps)],
            "words": [[b"w%d" % int(x) for x in rng.integers(0, 1000, int(rng.integers(0, 4)))] for _ in range(steps)],
            "unused": [rng.integers(0, 9, 3) for _ in range(steps)],
        }
        out.append(sf.encode_sequence_example(ctx, lists))
    return out


def _check_equal(a, b) -> None:
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            xa, ya = x[k], y[k]
            if isinstance(xa, sf.SparseColumn):
                assert np.array_equal(xa.indices, ya.indices) and list(xa.values) == list(ya.values)
            elif isinstance(xa, sf.RaggedColumn):
                assert np.array_equal(xa.row_splits, ya.row_splits) and np.array_equal(xa.values, ya.values)
            else:
                assert xa.dtype == ya.dtype and np.array_equal(xa, ya)


def table_rows(res: dict) -> list[_rows.Row]:
    """The rows `shardfeed bench` prints (configuration, shardfeed, anchor, ratio), from this
    script's JSON result; written into that result as "rows"."""
    rows = {r["path"]: r for r in res["paths"]}
    anchor = rows.get("python reference (anchor)")
    out: list[_rows.Row] = []
    for name, r in rows.items():
        if r is anchor or anchor is None:
            continue
        out.append((f"parse_sequence_example, {name}", _rows.rate(r["records_per_s"], "rec/s"),
                    f"Python reference: {_rows.rate(anchor['records_per_s'], 'rec/s')}",
                    _rows.ratio(r["speedup_vs_anchor"])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tf", action="store_true", help="add tf.io.parse_sequence_example (imports TensorFlow)")
    ap.add_argument("--json", default=os.path.join("bench-out", "sequence_parse.json"))
    args = ap.parse_args()
    if not nv.native_available():
        raise SystemExit(f"the native extension is not built: {nv.native_info()}")
    recs = records(args.records)
    size = sum(len(r) for r in recs)
    _check_equal(sq.parse_sequence_example_py(recs, CONTEXT, SEQUENCE),
                 sf.parse_sequence_example(recs, CONTEXT, SEQUENCE))

    paths = {"python reference (anchor)": lambda: sq.parse_sequence_example_py(recs, CONTEXT, SEQUENCE),
             "native": lambda: sf.parse_sequence_example(recs, CONTEXT, SEQUENCE)}
    if args.tf:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        tf_ctx = {"id": tf.io.FixedLenFeature([], tf.int64), "name": tf.io.FixedLenFeature([], tf.string, b""),
                  "w": tf.io.VarLenFeature(tf.float32)}
        tf_seq = {"tok": tf.io.FixedLenSequenceFeature([2], tf.int64),
                  "emb": tf.io.FixedLenSequenceFeature([8], tf.float32), "words": tf.io.VarLenFeature(tf.string)}
        paths["tf.io.parse_sequence_example (eager, to numpy)"] = lambda: [
            t.numpy() if hasattr(t, "numpy") else t.values.numpy()
            for d in tf.io.parse_sequence_example(recs, context_features=tf_ctx, sequence_features=tf_seq)
            for t in d.values()]
    times = {name: float("inf") for name in paths}
    for _ in range(args.rounds):  # interleaved, so load from other processes hits every path alike
        for name, fn in paths.items():
            times[name] = min(times[name], best(fn, 1))

    anchor = times["python reference (anchor)"]
    print(f"{args.records} SequenceExamples, {size / 1e6:.1f} MB, one batch, best of {args.rounds}")
    print(f"{'path':48} {'seconds':>9} {'records/s':>11} {'MB/s':>8} {'vs anchor':>10}")
    rows = []
    for name, t in times.items():
        rows.append({"path": name, "seconds": t, "records_per_s": args.records / t, "mb_per_s": size / t / 1e6,
                     "speedup_vs_anchor": anchor / t})
        print(f"{name:48} {t:9.3f} {args.records / t:11,.0f} {size / t / 1e6:8.1f} {anchor / t:9.1f}x")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    result = {"records": args.records, "bytes": size, "rounds": args.rounds, "native": nv.native_info(),
              "paths": rows}
    result["rows"] = table_rows(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

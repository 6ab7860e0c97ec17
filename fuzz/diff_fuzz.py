"""Differential fuzzing: mutate seed records and check that the native parser and the
pure-Python reference agree (same columns, or the same error type, message, feature and
record); and that the native Example encoder writes the Python encoder's bytes for the
features of every record that decodes, each value given in a random form (a list, a numpy
array of another dtype, a scalar, numpy scalars, str for bytes), or leaves it to Python. Pure Python driver, no atheris needed; memory safety is the libFuzzer harnesses'
job. Examples and SequenceExamples (``--kind``; both by default, alternating): for
SequenceExamples, ``parse_sequence_example`` (and, for one record, the single-record
form) against ``parse_sequence_example_py``, and the decoders' verdicts
(``validate_sequence_example``). Run from the repository root::

    python fuzz/diff_fuzz.py --seconds 300 [--seed 1] [--kind example|sequence|both]

Prints any disagreement (with the input as a Python bytes literal) and exits 1.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import numpy as np  # noqa: E402
from test_native import CTR_SPEC, HOSTILE, ODD, ODD_SPECS, _outcome, _same_values, check_same, ctr_record  # noqa: E402

import shardfeed as sf  # noqa: E402
from shardfeed import _native  # noqa: E402
from shardfeed.formats import example_encode  # noqa: E402
from shardfeed.formats import native as nv  # noqa: E402
from shardfeed.formats.example import decode_example  # noqa: E402
from shardfeed.formats.wire import encode_varint  # noqa: E402
from tests.test_native_sequence import (  # noqa: E402
    HOSTILE_SEQ,
    ODD_SEQ,
    SPEC_RANDOM,
    SPECS,
    _reference_decode_error,
    check_same_seq,
    random_sequence_example,
)

TOKENS = [b"\x08", b"\x0a", b"\x12", b"\x1a", b"\x0b", b"\x0c", b"\x0d", b"\x09", b"\x80", b"\xff", b"\x00",
          b"\x7f", b"\x0a\x01a", b"\x0a\x01b", b"\x0a\x01c", b"\x0a\x03ids", b"\x0a\x02zz", b"\x0a\x03tok",
          b"\x0a\x00", b"\x12\x00"]


def mutate(rng: random.Random, rec: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(rec)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(6)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and b:
            del b[pos:pos + rng.randrange(1, 4)]
        elif op == 3:
            other = rng.choice(pool)
            a = rng.randrange(len(other) + 1)
            b[pos:pos] = other[a:a + rng.randrange(1, 20)]
        elif op == 4 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        else:
            b = b[:pos]
    return bytes(b)


def sequence_record(rng: random.Random, pool: list[bytes], valid: list[bytes]) -> bytes:
    """A fresh random record, a valid seed, or a seed mutated; most mutations break the
    record, so valid ones are drawn often enough that values get compared too."""
    r = rng.random()
    if r < 0.15:
        return sf.encode_sequence_example(*random_sequence_example(rng))
    seed = rng.choice(valid if r < 0.75 else pool)
    return seed if rng.random() < 0.3 else mutate(rng, seed, pool)


def sequence_case(rng: random.Random, pool: list[bytes], valid: list[bytes], n: int) -> None:
    """One batch of SequenceExamples through both paths (AssertionError if they differ)."""
    recs = [sequence_record(rng, pool, valid) for _ in range(rng.randrange(1, 5))]
    ctx, seq = rng.choice(SPECS + [SPEC_RANDOM])
    try:
        check_same_seq(recs, ctx, seq)
        if len(recs) == 1:
            check_same_seq(recs, ctx, seq, single=True)
        if n % 4 == 0:
            assert nv.validate_sequence_example(recs[0]) == _reference_decode_error(recs[0])
    except AssertionError as e:
        raise AssertionError(f"records={recs!r} context={ctx!r} sequence={seq!r}\n{e}") from None
    if rng.random() < 0.02:
        pool.append(recs[0])


def pool_case(ppool: nv.ParsePool, batches: list[list[bytes]], spec) -> None:
    """The batches through a ParsePool (submitted together, taken in order) against
    ``parse_example_batch`` one by one: the same columns or the same error."""
    want = [_outcome(lambda b=b: nv.parse_example_batch(b, spec)) for b in batches]
    queued = []
    for b in batches:
        out = _outcome(lambda b=b: ppool.submit(b, spec))
        queued.append(out if out[0] == "err" else None)  # None: taken below, in turn
    for w, q in zip(want, queued):
        got = q if q is not None else _outcome(ppool.take)
        assert w[0] == got[0], (w, got)
        if w[0] == "err":
            assert w[1] == got[1], (w, got)
        else:
            assert list(w[1]) == list(got[1])
            for k in w[1]:
                _same_values(w[1][k], got[1][k])


_INT_DTYPES = (np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)


def _random_form(rng: random.Random, vals: np.ndarray):
    """One of the forms a converter or a user hands encode_example for ``vals``."""
    r = rng.random()
    if not isinstance(vals, np.ndarray):  # bytes values: a list
        items = [v.decode("utf-8", "surrogateescape") if rng.random() < 0.3 else v for v in vals]
        return items[0] if r < 0.3 and items else items if r < 0.9 else tuple(items)
    if r < 0.25 and len(vals):  # a scalar: Python's or numpy's
        v = vals[0]
        return v if rng.random() < 0.5 else v.item()
    if r < 0.5:
        return vals.tolist() if rng.random() < 0.8 else tuple(vals.tolist())
    with np.errstate(over="ignore", invalid="ignore"):  # float16 overflows to inf, as the encoder's float32 does
        if vals.dtype.kind == "f":
            return vals.astype(rng.choice((np.float32, np.float64, np.float16)))
        a = vals.astype(rng.choice(_INT_DTYPES))
    return a[::2] if rng.random() < 0.1 else a  # a strided view: not C-contiguous


def encode_case(rng: random.Random, pool: list[bytes]) -> bool:
    """The native encoder against the Python one on a record's features; False when the
    record does not decode."""
    try:
        feats = decode_example(rng.choice(pool))
    except Exception:  # noqa: BLE001 - a hostile record: nothing to encode
        return False
    features = {k: _random_form(rng, v) for k, v in feats.items()}
    native = _native.encode_example(features)
    try:
        parts, size = example_encode._features_parts(features, False, example_encode._encode_feature)
        python = b"\x0a" + encode_varint(size) + b"".join(parts)
    except (TypeError, ValueError) as exc:
        assert native is None, f"native encoded what Python refuses ({exc}): {features!r}"
        return True
    assert native is None or native == python, f"encoders disagree on {features!r}"
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kind", choices=("example", "sequence", "both"), default="both")
    args = ap.parse_args()
    if not nv.native_available():
        print(f"the native extension is not built: {nv.native_info()}")
        return 2
    rng = random.Random(args.seed)
    pool = list(ODD.values()) + list(HOSTILE.values()) + [ctr_record(rng) for _ in range(10)]
    seq_valid = list(ODD_SEQ.values()) + [sf.encode_sequence_example(*random_sequence_example(rng)) for _ in range(20)]
    seq_pool = seq_valid + list(HOSTILE_SEQ.values())
    specs = ODD_SPECS + [CTR_SPEC]
    deadline = time.monotonic() + args.seconds
    n = n_seq = n_pool = n_enc = 0
    ppool = nv.ParsePool(2) if nv.parse_pool_available() else None
    while time.monotonic() < deadline:
        if args.kind == "sequence" or (args.kind == "both" and n % 2):
            try:
                sequence_case(rng, seq_pool, seq_valid, n_seq)
            except AssertionError as e:
                print(f"DISAGREEMENT after {n} cases (SequenceExample): {e}")
                return 1
            n += 1
            n_seq += 1
            continue
        if n % 3 == 0:
            # one record, then copies of it mutated: the entries before and after a mutation
            # start with the bytes of the first record's entries (the parser's entry templates)
            base = rng.choice(pool)
            recs = [base] + [base if rng.random() < 0.3 else mutate(rng, base, pool) for _ in range(rng.randrange(1, 5))]
        else:
            recs = [mutate(rng, rng.choice(pool), pool) for _ in range(rng.randrange(1, 4))]
        spec = rng.choice(specs)
        try:
            if n % 4 == 2:
                n_enc += encode_case(rng, pool + recs)
            check_same(recs, spec, triple=True, buffer=n % 10 == 0)
            if ppool is not None and n % 5 == 1:  # several batches in flight on the native pool
                batches = [recs] + [[mutate(rng, r, pool) for r in recs] for _ in range(rng.randrange(0, 4))]
                pool_case(ppool, batches, spec)
                n_pool += 1
        except AssertionError as e:
            print(f"DISAGREEMENT after {n} cases: records={recs!r} spec={spec!r}\n{e}")
            return 1
        n += 1
        if rng.random() < 0.02:
            pool.append(recs[0])
    print(f"ok: {n} cases ({n - n_seq} Example batches, {n_seq} SequenceExample batches, {n_pool} of them "
          f"also through the native parse pool; {n_enc} records' features encoded both ways), no disagreement")
    return 0


if __name__ == "__main__":
    sys.exit(main())

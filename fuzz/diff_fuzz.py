"""Differential fuzzing: mutate seed records and check that the native parser and the
pure-Python reference agree (same columns, or the same error type, message, feature and
record). Pure Python driver, no atheris needed; memory safety is the libFuzzer harnesses'
job. Run from the repository root::

    python fuzz/diff_fuzz.py --seconds 300 [--seed 1]

Prints any disagreement (with the input as a Python bytes literal) and exits 1.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from test_native import CTR_SPEC, HOSTILE, ODD, ODD_SPECS, check_same, ctr_record  # noqa: E402

TOKENS = [b"\x08", b"\x0a", b"\x12", b"\x1a", b"\x0b", b"\x0c", b"\x0d", b"\x09", b"\x80", b"\xff", b"\x00",
          b"\x7f", b"\x0a\x01a", b"\x0a\x01b", b"\x0a\x01c", b"\x0a\x03ids"]


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pool = list(ODD.values()) + list(HOSTILE.values()) + [ctr_record(rng) for _ in range(10)]
    specs = ODD_SPECS + [CTR_SPEC]
    deadline = time.monotonic() + args.seconds
    n = 0
    while time.monotonic() < deadline:
        recs = [mutate(rng, rng.choice(pool), pool) for _ in range(rng.randrange(1, 4))]
        spec = rng.choice(specs)
        try:
            check_same(recs, spec, triple=True, buffer=n % 10 == 0)
        except AssertionError as e:
            print(f"DISAGREEMENT after {n} cases: records={recs!r} spec={spec!r}\n{e}")
            return 1
        n += 1
        if rng.random() < 0.02:
            pool.append(recs[0])
    print(f"ok: {n} cases, no disagreement")
    return 0


if __name__ == "__main__":
    sys.exit(main())

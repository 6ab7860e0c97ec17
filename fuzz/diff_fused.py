"""Differential fuzzing of the read paths under corruption (issue 36 item 1): small shards
mutated (bits flipped, bytes overwritten, inserted or deleted, cut off, length fields edited
with and without their length CRC fixed, a length that swallows whole later frames, data
CRCs, frames duplicated or dropped; every fourth case GZIP, some with the compressed stream
cut) and read by the record-by-record reader and by the fused
``read_tfrecord(files, spec).batch(n)``, under ``on_error="skip"`` and ``"raise"``, with a
random batch size (1, 2, 7, 1024) and parallelism. Both must deliver the same records (values
equal after parsing), skip the same frames (check, file, offset, record number) with the same
counts, and raise the same error. The case maker is the test suite's
(``tests/test_fused_corruption.py``); run from the repository root::

    python fuzz/diff_fused.py --seconds 300 [--seed 1]

Prints the first disagreement (its seed: ``run_case(tmp, seed)`` in the test module replays
it) and exits 1; otherwise how many cases and mutated files it tried.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from test_fused_corruption import run_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1, help="first case's seed (cases are seed, seed+1, ...)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # every skipped frame is logged; thousands here
    deadline = time.monotonic() + args.seconds
    seed = args.seed * 1_000_000
    cases = files = mutated = 0
    while time.monotonic() < deadline:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="diff-fused-"))
        try:
            mutated += run_case(tmp, seed)
        except AssertionError:
            print(f"DISAGREEMENT at seed {seed} (files kept in {tmp}):")
            traceback.print_exc()
            return 1
        files += sum(1 for _ in tmp.iterdir())
        shutil.rmtree(tmp, ignore_errors=True)
        cases += 1
        seed += 1
    print(f"{cases} cases, {files} files of which {mutated} mutated (each case read both ways under skip and "
          "raise), no disagreement")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write a few Examples to sharded TFRecords (with index files), then read them back:
record by record with a spec, and in batches of numpy columns through the fast path.

    python examples/tfrecord_roundtrip.py [OUT_URL]     # default: a temporary directory
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

import shardfeed as sf
from shardfeed.formats.chunks import iter_record_batches
from shardfeed.formats.parse import parse_batch

SPEC = {
    "label": sf.FixedLen("int64"),
    "features": sf.FixedLen("float32", shape=[4]),
    "words": sf.VarLen("bytes"),
}


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    for shard in range(2):
        with sf.TFRecordWriter(f"{out}/data-{shard:05d}-of-00002.tfrecord", index=True) as w:
            for i in range(100):
                w.write(sf.encode_example({
                    "label": int(rng.integers(0, 2)),
                    "features": rng.normal(size=4).astype(np.float32),
                    "words": ["hello", "world"][: i % 3],
                }))

    first = next(iter(sf.read_tfrecord(f"{out}/*.tfrecord", spec=SPEC)))
    print("first example:", {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in first.items()})

    total = 0
    for batch in iter_record_batches(f"{out}/*.tfrecord", batch_size=64):
        cols = parse_batch(batch, SPEC)
        total += len(cols["label"])
    print(f"read {total} records in batches of 64; native core: {sf.native_available()}")

    shard = sf.IndexedTFRecord(f"{out}/data-00001-of-00002.tfrecord")
    print("record 42 of shard 1 has label", sf.parse_single_example(shard[42], SPEC)["label"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="shardfeed-example-"))

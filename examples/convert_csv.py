"""Turn a CSV of images (AutoML layout ``split,image_uri,label``) into sharded, indexed
TFRecords, then read one split back with the spec the manifest records.

    python examples/convert_csv.py OUTDIR

Makes 24 small JPEGs (one of them broken, to show the discard report) and a CSV under
OUTDIR/raw, converts them to OUTDIR/tfrecords, and prints what happened.
"""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
from PIL import Image

from shardfeed.convert import convert, read_dataset


def make_input(raw: str) -> str:
    os.makedirs(os.path.join(raw, "images"), exist_ok=True)
    rng = np.random.default_rng(0)
    rows = [("split", "image_uri", "label")]
    for i in range(24):
        name = f"images/{i:02d}.jpg"
        label = ("cat", "dog", "bird")[i % 3]
        pixels = rng.integers(0, 255, (120 + 10 * (i % 4), 160, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(raw, name), "JPEG")
        split = "TEST" if i % 6 == 0 else "TRAIN"
        rows.append((split, name, label))
    with open(os.path.join(raw, "images", "broken.jpg"), "wb") as f:
        f.write(b"this is not a JPEG")
    rows.append(("TRAIN", "images/broken.jpg", "cat"))
    path = os.path.join(raw, "images.csv")
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def main(out: str) -> None:
    csv_path = make_input(os.path.join(out, "raw"))
    dest = os.path.join(out, "tfrecords")
    result = convert(csv_path, dest, max_image_size=64, num_samples_per_tfrecord=8, progress=False)
    print(result)
    for info in result.splits.values():
        for shard in info["shards"]:
            print(f"  {shard['file']}: {shard['records']} records")
    print(f"classes: {result.manifest['classes']}")
    with open(result.discards_url, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            print(f"discarded row {row['row']} ({os.path.basename(row['source'])}): {row['reason']}")

    batch = next(iter(read_dataset(dest, "train").batch(4)))
    print(f"first train batch: labels {batch['image/class/label'].tolist()}, "
          f"sizes {list(zip(batch['image/width'].tolist(), batch['image/height'].tolist()))}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "convert-example-out")

"""From a CSV of tabular rows to training in PyTorch and in tf.data (the README's snippet).

    python examples/csv_to_training.py OUTDIR

Writes OUTDIR/clicks.csv (500 rows), converts it to sharded TFRecords with a user schema,
then trains a logistic regression for one epoch with PyTorch (if installed) and counts
the batches tf.data sees (if TensorFlow is installed).
"""

from __future__ import annotations

import csv
import os
import sys

import numpy as np

import shardfeed as sf


def make_csv(path: str, rows: int = 500) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["split", "age", "clicks", "label"])
        for i in range(rows):
            age, clicks = rng.uniform(18, 80), int(rng.integers(0, 50))
            w.writerow(["TEST" if i % 5 == 0 else "TRAIN", f"{age:.1f}", clicks, int(clicks > 25)])


def features(batch):
    """A batch of numpy columns -> (inputs [B, 2], labels [B])."""
    x = np.stack([batch["age"] / 80.0, batch["clicks"] / 50.0], axis=1).astype(np.float32)
    return x, batch["image/class/label"].astype(np.float32)


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    make_csv(f"{out}/clicks.csv")
    # --- the README's snippet --------------------------------------------------------
    sf.convert(f"{out}/clicks.csv", f"{out}/shards", progress=False,
               schema={"split": "split", "age": "float", "clicks": "int", "label": "integer label"})
    train = sf.read_dataset(f"{out}/shards", split="train").shuffle(1000, seed=0).batch(64).map(features)
    # ----------------------------------------------------------------------------------
    print(sf.load_manifest(f"{out}/shards")["counts"])
    try:
        import torch
    except ImportError:
        print("PyTorch not installed: skipping the PyTorch loop")
    else:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loader = torch.utils.data.DataLoader(train.to_torch(), batch_size=None)
        for x, y in loader:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"PyTorch: one epoch done, last loss {loss.item():.3f}")
    try:
        import tensorflow as tf  # noqa: F401
    except ImportError:
        print("TensorFlow not installed: skipping tf.data")
    else:
        batches = sum(1 for _ in train.to_tf())
        print(f"tf.data: {batches} batches of (inputs, labels)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "csv-to-training-out")

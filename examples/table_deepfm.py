"""The PAI-TF DeepFM table input function, on a DuckDB table.

    python examples/table_deepfm.py OUTDIR

Creates OUTDIR/ctr.db with a small Avazu-like table (label plus categorical fields),
and builds the document's input function: ``TableRecordDataset([...], record_defaults,
slice_count, slice_id).batch(batch_size).repeat(epoch).map(parse, num_parallel_calls=8)
.prefetch(100)``, for two simulated workers (slices). Each batch becomes
``({field: hashed ids}, label)``; a tiny FM (first-order + pairwise embedding
interactions) is trained on it with PyTorch when installed, else with numpy.
"""

from __future__ import annotations

import os
import sys
import zlib

import numpy as np

FIELDS = ["hour", "c1", "banner_pos", "site_id", "app_id", "device_model"]
HASH_BUCKETS = {"hour": 50, "c1": 10, "banner_pos": 10, "site_id": 1000, "app_id": 1000, "device_model": 500}


def make_table(db_path: str, rows: int = 4000) -> str:
    import duckdb

    rng = np.random.default_rng(1)
    con = duckdb.connect(db_path)
    cols = ", ".join(f"{f} VARCHAR" for f in FIELDS)
    con.execute(f"CREATE OR REPLACE TABLE train (label BIGINT, {cols})")
    data = []
    for _ in range(rows):
        vals = [str(rng.integers(0, 24)), str(rng.integers(1000, 1010)), str(rng.integers(0, 3)),
                f"s{rng.integers(0, 300)}", f"a{rng.integers(0, 300)}", f"m{rng.integers(0, 200)}"]
        label = int((int(vals[0]) > 12) ^ (vals[2] == "1"))
        data.append((label, *vals))
    import pyarrow as pa

    cols_data = list(zip(*data))
    con.register("rows_tbl", pa.table({n: list(c) for n, c in zip(["label", *FIELDS], cols_data)}))
    con.execute("INSERT INTO train SELECT * FROM rows_tbl")
    con.close()
    return f"duckdb://{db_path}/train"


def _hash(values: np.ndarray, buckets: int) -> np.ndarray:
    return np.fromiter((zlib.crc32(v.encode()) % buckets for v in values), np.int64, len(values))


def parse_batch_for_tabledataset(*args):
    label = np.reshape(args[0], [-1])
    fields = [_hash(np.reshape(v, [-1]), HASH_BUCKETS[f]) for f, v in zip(FIELDS, args[1:])]
    return dict(zip(FIELDS, fields)), label


def train_input_fn(data_path: str, epoch: int = 2, batch_size: int = 256, slice_id: int = 0, slice_count: int = 1):
    import shardfeed.tables as sf  # also exported as shardfeed.TableRecordDataset

    record_defaults = [0] + ["0"] * len(FIELDS)
    dataset = sf.TableRecordDataset([data_path], record_defaults=record_defaults,
                                    slice_count=slice_count, slice_id=slice_id)
    dataset = dataset.batch(batch_size).repeat(epoch)
    dataset = dataset.map(lambda b: parse_batch_for_tabledataset(*b), num_parallel_calls=8).prefetch(100)
    return dataset


def train(dataset, dim: int = 4) -> tuple[int, float]:
    try:
        import torch
    except ImportError:
        torch = None
    offsets = np.cumsum([0] + [HASH_BUCKETS[f] for f in FIELDS])[:-1]
    total = sum(HASH_BUCKETS.values())
    rows, loss_v = 0, float("nan")
    if torch is not None:
        torch.manual_seed(0)
        emb = torch.nn.Embedding(total, dim)
        lin = torch.nn.Embedding(total, 1)
        opt = torch.optim.Adam(list(emb.parameters()) + list(lin.parameters()), lr=0.01)
        for feats, label in dataset:
            ids = torch.from_numpy(np.stack([feats[f] + o for f, o in zip(FIELDS, offsets)], axis=1))
            e = emb(ids)
            pair = 0.5 * ((e.sum(1) ** 2) - (e ** 2).sum(1)).sum(1)
            logit = lin(ids).sum((1, 2)) + pair
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, torch.from_numpy(label).float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            rows += len(label)
            loss_v = float(loss)
        return rows, loss_v
    w = np.zeros(total, np.float32)  # numpy fallback: first-order (logistic) part only
    for feats, label in dataset:
        ids = np.stack([feats[f] + o for f, o in zip(FIELDS, offsets)], axis=1)
        p = 1 / (1 + np.exp(-w[ids].sum(1)))
        loss_v = float(-np.mean(label * np.log(p + 1e-9) + (1 - label) * np.log(1 - p + 1e-9)))
        np.add.at(w, ids, -0.1 * (p - label)[:, None])
        rows += len(label)
    return rows, loss_v


def main(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    table = make_table(os.path.join(outdir, "ctr.db"))
    for slice_id in range(2):
        rows, loss = train(train_input_fn(table, slice_id=slice_id, slice_count=2))
        print(f"worker {slice_id}/2: trained on {rows} rows (2 epochs of its slice), last loss {loss:.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

"""The PAI-TF TableRecordDataset logistic-regression example, on a DuckDB table.

    python examples/table_logistic_regression.py OUTDIR

Creates OUTDIR/lr.db with table ``sample (col1, col2, col3, col4 double)`` (as the
document's sample.csv: three features and a 0/1 label), reads it with
``TableRecordDataset([...], record_defaults=[1.0]*4).repeat().batch(128)`` and trains a
2-class softmax regression with gradient descent in numpy, printing the loss.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def make_table(db_path: str, rows: int = 2000) -> str:
    import duckdb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 3))
    label = (x @ np.array([1.5, -2.0, 0.5]) > 0).astype(np.float64)
    con = duckdb.connect(db_path)
    import pyarrow as pa

    rows_tbl = pa.table({"col1": x[:, 0], "col2": x[:, 1], "col3": x[:, 2], "col4": label})
    con.register("rows_tbl", rows_tbl)
    con.execute("CREATE OR REPLACE TABLE sample AS SELECT * FROM rows_tbl")
    con.close()
    return f"duckdb://{db_path}/sample"


def input_fn(table: str):
    import shardfeed.tables as sf  # also exported as shardfeed.TableRecordDataset

    dataset = sf.TableRecordDataset([table], record_defaults=[1.0] * 4).repeat().batch(128)
    for v1, v2, v3, v4 in dataset:
        labels = v4.astype(np.int32).reshape(128)
        features = np.stack([v1, v2, v3], axis=1)
        yield features, labels


def main(outdir: str, steps: int = 300) -> None:
    os.makedirs(outdir, exist_ok=True)
    table = make_table(os.path.join(outdir, "lr.db"))
    w, b = np.zeros((3, 2), np.float32), np.zeros(2, np.float32)
    for step, (features, labels) in enumerate(input_fn(table)):
        logits = features @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(len(labels)), labels] + 1e-12))
        grad = p
        grad[np.arange(len(labels)), labels] -= 1
        grad /= len(labels)
        w -= 0.5 * features.T @ grad
        b -= 0.5 * grad.sum(axis=0)
        if step % 100 == 0:
            print(f"step {step}: loss {loss:.4f}")
        if step + 1 >= steps:
            break
    print(f"trained {steps} steps of 128 rows from {table}; final loss {loss:.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

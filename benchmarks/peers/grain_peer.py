"""Grain on ArrayRecord: records pickled into ArrayRecord files by ``ArrayRecordWriter``
(``group_size:1``, so any record is one read), read through ``ArrayRecordDataSource`` in
Grain's fast batched form ``MapDataset.range(n)[.shuffle(seed)].batch(k).map(ids ->
source.__getitems__(ids))`` (the documented ``source(...).shuffle().batch()`` reads record
by record, about 8x slower here), unpickled and collated; images decoded with Pillow.
ArrayRecord reads local files only (no S3 row); Grain's loader is not a PyTorch dataset
(no DataLoader row)."""

from __future__ import annotations

import glob
import os
import pickle
from typing import Any

import numpy as np
from common import (
    CTR_BATCH,
    IMG_BATCH,
    Ctx,
    collate_ctr,
    ctr_records,
    epoch_over,
    image_files,
    not_installed,
    pil_decode_resize,
)

# imported before a conversion is timed (workload f times the writing, not the imports)
IMPORTS = ("grain", "array_record.python.array_record_module")
NAME = "grain"
SHARDS = 8


def available() -> str | None:
    return not_installed(IMPORTS)


def version() -> str:
    from importlib.metadata import version as v

    return f"grain {v('grain')}, array-record {v('array-record')}"


def supports() -> dict[str, str | None]:
    return {"a": None, "b": None, "c": None, "d": None,
            "e": "ArrayRecord reads local files only", "f": None, "g": "Grain's loader is not a PyTorch dataset"}


def _write(out: str, payloads: Any, total: int) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(out, exist_ok=True)
    per = -(-total // SHARDS)
    it = iter(payloads)
    for s in range(SHARDS):
        w = ArrayRecordWriter(os.path.join(out, f"data-{s:05d}.array_record"), "group_size:1")
        for _ in range(min(per, total - s * per)):
            w.write(pickle.dumps(next(it), protocol=5))
        w.close()


def convert(ctx: Ctx, out: str) -> int:
    files = image_files(ctx)

    def payloads():
        for path, label in files:
            with open(path, "rb") as f:
                yield {"jpg": f.read(), "label": label}

    _write(out, payloads(), len(files))
    return len(files)


def prepare(data: str, ctx: Ctx, out: str) -> None:
    if data == "img":
        convert(ctx, out)
    else:
        _write(out, ctr_records(ctx.ctr_records), ctx.ctr_records)


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    import grain

    data = "img" if workload in "bc" else "ctr"
    paths = sorted(glob.glob(os.path.join(ctx.peer_dir(NAME, data), "*.array_record")))
    source = grain.sources.ArrayRecordDataSource(paths)
    n = len(source)
    ds = grain.MapDataset.range(n)
    if workload == "d":
        ds = ds.shuffle(seed=0)
    ds = ds.batch(CTR_BATCH if data == "ctr" else IMG_BATCH)

    if data == "ctr":
        def load(ids):
            return collate_ctr([pickle.loads(b) for b in source.__getitems__(list(ids))])
    elif workload == "b":
        def load(ids):
            recs = [pickle.loads(b) for b in source.__getitems__(list(ids))]
            return {"label": np.array([r["label"] for r in recs]), "image": [r["jpg"] for r in recs]}
    else:
        def load(ids):
            recs = [pickle.loads(b) for b in source.__getitems__(list(ids))]
            return {"label": np.array([r["label"] for r in recs]),
                    "image": np.stack([pil_decode_resize(r["jpg"]) for r in recs])}
    ds = ds.map(load)

    return epoch_over(ds, data == "ctr")

"""LitData: chunks written by ``litdata.optimize(fn, inputs, output_dir, chunk_bytes=...)``
(its own serializers: numpy arrays, integers, raw bytes), read with
``StreamingDataset(dir)`` + ``StreamingDataLoader(batch_size=..., collate_fn=...)`` (its
default collate cannot stack variable-length arrays or bytes, so the loader gets the one a
user writes); ``shuffle=True`` for (d) (chunk order plus a shuffle within each worker's
chunks: LitData's global shuffle); images decoded with Pillow in the collate. LitData
fetches object storage through obstore, which refuses plain-http endpoints such as a
loopback S3 server (``BadScheme``; ``AWS_ALLOW_HTTP`` does not help), so it has no (e) row."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from common import (
    CTR_BATCH,
    IMG_BATCH,
    Ctx,
    collate_ctr,
    ctr_record,
    epoch_over,
    image_files,
    not_installed,
    pil_decode_resize,
)

# imported before a conversion is timed (workload f times the writing, not the imports)
IMPORTS = ("litdata",)
NAME = "litdata"


def available() -> str | None:
    return not_installed(IMPORTS)


def version() -> str:
    import litdata

    return f"litdata {litdata.__version__}"


def supports() -> dict[str, str | None]:
    return {"a": None, "b": None, "c": None, "d": None,
            "e": "cannot run against a loopback server: obstore refuses plain-http endpoints (BadScheme)",
            "f": None, "g": None, "h": None}


def _ctr_item(i: int) -> dict[str, Any]:
    r = ctr_record(i)
    return {"idx": r["idx"], "label": r["label"], "dense": r["dense"], "cat": r["cat"], "ids": r["ids"]}


def _img_item(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "label": label}


def _optimize(fn: Any, inputs: list, out: str) -> None:
    import litdata

    litdata.optimize(fn=fn, inputs=inputs, output_dir=out, chunk_bytes="32MB", num_workers=2, verbose=False,
                     reorder_files=False, keep_data_ordered=True)


def convert(ctx: Ctx, out: str) -> int:
    files = image_files(ctx)
    _optimize(_img_item, files, out)
    return len(files)


def prepare(data: str, ctx: Ctx, out: str) -> None:
    if data == "img":
        convert(ctx, out)
    else:
        _optimize(_ctr_item, list(range(ctx.ctr_records)), out)


def _collate_ctr(samples):
    # LitData hands out ``bytes`` fields as memoryviews into its chunk: copy them, or a
    # DataLoader worker cannot pickle the batch (and the batch is lost)
    b = collate_ctr(samples)
    b["cat"] = [bytes(c) for c in b["cat"]]
    return b


def _collate_img(samples):
    return {"label": np.array([s["label"] for s in samples]), "image": [bytes(s["jpg"]) for s in samples]}


def _collate_dec(samples):
    return {"label": np.array([s["label"] for s in samples]),
            "image": np.stack([pil_decode_resize(s["jpg"]) for s in samples])}


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    from common import worker_init_reads
    from litdata import StreamingDataLoader, StreamingDataset

    data = "img" if workload in "bch" else "ctr"
    ds = StreamingDataset(ctx.peer_dir(NAME, data), shuffle=workload == "d", seed=0,
                          cache_dir=os.path.join(ctx.scratch, "cache"))
    collate = {"b": _collate_img, "c": _collate_dec, "h": _collate_dec}.get(workload, _collate_ctr)
    kw: dict[str, Any] = {"num_workers": 2, "worker_init_fn": worker_init_reads} if workload in "gh" else {}
    loader = StreamingDataLoader(ds, batch_size=CTR_BATCH if data == "ctr" else IMG_BATCH, collate_fn=collate, **kw)

    return epoch_over(loader, data == "ctr")

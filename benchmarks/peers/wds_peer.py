"""WebDataset: tar shards written by ``wds.ShardWriter`` (one sample per key: ``.cls``
integers, ``.npy`` arrays, ``.bin`` raw bytes, ``.jpg`` images), read with
``wds.WebDataset(urls).decode(...).to_tuple(...).batched(n)``; images decoded by
``.decode("pil")`` and resized with Pillow; from S3 through plain HTTP GETs of the shards
(``pipe:curl``-free: WebDataset's own ``gopen`` of an ``http://`` URL) with ``cache_dir`` so
epoch 2 reads the local copies; in a DataLoader each worker reads its own shards."""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

import numpy as np
from common import (
    CTR_BATCH,
    IMG_BATCH,
    IMG_SIZE,
    Ctx,
    collate_ctr,
    ctr_records,
    epoch_over,
    image_files,
    not_installed,
    worker_init_reads,
)

# imported before a conversion is timed (workload f times the writing, not the imports)
IMPORTS = ("webdataset",)
NAME = "webdataset"
SHARDS = 8


def available() -> str | None:
    return not_installed(IMPORTS)


def version() -> str:
    from importlib.metadata import version as v

    return f"webdataset {v('webdataset')}"


def supports() -> dict[str, str | None]:
    return {"a": None, "b": None, "c": None, "d": "no global shuffle: shard shuffle + sample buffer only",
            "e": None, "f": None, "g": None if importlib.util.find_spec("torch") else "PyTorch is not installed"}


def _write(out: str, samples: Any, total: int) -> None:
    import webdataset as wds

    os.makedirs(out, exist_ok=True)
    per = -(-total // SHARDS)
    with wds.ShardWriter(os.path.join(out, "shard-%05d.tar"), maxcount=per, verbose=0) as w:
        for s in samples:
            w.write(s)


def convert(ctx: Ctx, out: str) -> int:
    files = image_files(ctx)

    def samples():
        for i, (path, label) in enumerate(files):
            with open(path, "rb") as f:
                yield {"__key__": f"{i:08d}", "jpg": f.read(), "cls": label}

    _write(out, samples(), len(files))
    return len(files)


def prepare(data: str, ctx: Ctx, out: str) -> None:
    if data == "img":
        convert(ctx, out)
        return

    def samples():
        for r in ctr_records(ctx.ctr_records):
            yield {"__key__": f"{r['idx']:09d}", "idx.cls": r["idx"], "label.cls": r["label"], "dense.npy": r["dense"],
                   "cat.bin": r["cat"], "ids.npy": r["ids"]}

    _write(out, samples(), ctx.ctr_records)


def _collate_ctr(samples):
    return collate_ctr([{"idx": s[0], "label": s[1], "dense": s[2], "cat": s[3], "ids": s[4]} for s in samples])


def _collate_img(samples):
    return {"label": np.array([s[1] for s in samples], np.int64), "image": [s[0] for s in samples]}


def _collate_dec(samples):
    return {"label": np.array([s[1] for s in samples], np.int64),
            "image": np.stack([np.asarray(s[0].convert("RGB").resize((IMG_SIZE, IMG_SIZE), _bilinear()))
                               for s in samples])}


def _bilinear():
    from PIL import Image

    return Image.BILINEAR


def _ctr_pipeline(urls: list[str], **kw: Any) -> Any:
    import webdataset as wds

    return (wds.WebDataset(urls, shardshuffle=False, empty_check=False, **kw).decode()
            .to_tuple("idx.cls", "label.cls", "dense.npy", "cat.bin", "ids.npy")
            .batched(CTR_BATCH, collation_fn=_collate_ctr, partial=True))


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    import webdataset as wds

    ctr = sorted(glob.glob(os.path.join(ctx.peer_dir(NAME, "ctr"), "*.tar")))
    img = sorted(glob.glob(os.path.join(ctx.peer_dir(NAME, "img"), "*.tar")))
    if workload == "a":
        ds = _ctr_pipeline(ctr)
    elif workload == "e":
        import boto3  # presigned GETs: the shards are private objects, curl fetches them as plain HTTP

        s3 = boto3.client("s3", endpoint_url=ctx.s3_endpoint)
        urls = [s3.generate_presigned_url("get_object", Params={"Bucket": ctx.s3_bucket,
                                                                "Key": f"{NAME}/{os.path.basename(f)}"})
                for f in ctr]
        os.makedirs(os.path.join(ctx.scratch, "cache"), exist_ok=True)
        ds = _ctr_pipeline(urls, cache_dir=os.path.join(ctx.scratch, "cache"))
    elif workload == "b":
        ds = (wds.WebDataset(img, shardshuffle=False, empty_check=False).to_tuple("jpg", "cls")
              .map_tuple(lambda x: x, lambda c: int(c)).batched(IMG_BATCH, collation_fn=_collate_img, partial=True))
    elif workload == "c":
        ds = (wds.WebDataset(img, shardshuffle=False, empty_check=False).decode("pil").to_tuple("jpg", "cls")
              .batched(IMG_BATCH, collation_fn=_collate_dec, partial=True))
    elif workload == "g":
        from torch.utils.data import DataLoader

        ds = DataLoader(_ctr_pipeline(ctr), batch_size=None, num_workers=2, worker_init_fn=worker_init_reads)
    else:
        raise ValueError(workload)

    return epoch_over(ds, workload in "aeg")



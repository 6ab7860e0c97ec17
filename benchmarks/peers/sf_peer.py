"""shardfeed itself: TFRecord + index files written by ``sf.TFRecordWriter``, images by
``sf.convert``; read with ``read_tfrecord(...).batch(n)`` (parsed natively into numpy).
(g) and (h), 2 worker processes: ``to_torch(num_workers=2)`` in ``DataLoader(batch_size=None)``
(its own reader processes, batches through shared-memory slots); the ``shardfeed-dl`` peer
(``sf_dl_peer``) is the form users write, ``DataLoader(ds.to_torch(), num_workers=2)``."""

from __future__ import annotations

import glob
import os
from typing import Any

from common import CTR_BATCH, IMG_BATCH, IMG_SIZE, Ctx, Tally, ctr_records, epoch_over, image_files, worker_init_reads

# imported before a conversion is timed (workload f times the writing, not the imports)
IMPORTS = ("shardfeed", "shardfeed.convert")
NAME = "shardfeed"
SHARDS = 8
IMG_LABEL = "image/class/label"


def available() -> str | None:
    return None


def version() -> str:
    import shardfeed as sf

    return f"{sf.__version__} ({sf.native_info()})"


def supports() -> dict[str, str | None]:
    import importlib.util

    out: dict[str, str | None] = dict.fromkeys("abcdef")
    out["g"] = out["h"] = None if importlib.util.find_spec("torch") else "PyTorch is not installed"
    return out


def _spec() -> dict[str, Any]:
    import shardfeed as sf

    return {"idx": sf.FixedLen("int64"), "label": sf.FixedLen("int64"), "dense": sf.FixedLen("float32", shape=[13]),
            "cat": sf.FixedLen("bytes"), "ids": sf.VarLen("int64")}


def _img_spec() -> dict[str, Any]:
    import shardfeed as sf

    return {"image/encoded": sf.FixedLen("bytes"), IMG_LABEL: sf.FixedLen("int64")}


def write_ctr(out: str, n: int) -> None:
    import shardfeed as sf

    os.makedirs(out, exist_ok=True)
    per = -(-n // SHARDS)
    recs = ctr_records(n)
    for s in range(SHARDS):
        with sf.TFRecordWriter(os.path.join(out, f"ctr-{s:05d}.tfrecord"), index=True) as w:
            for _ in range(min(per, n - s * per)):
                r = next(recs)
                w.write(sf.encode_example({"idx": [r["idx"]], "label": [r["label"]], "dense": r["dense"],
                                           "cat": [r["cat"]], "ids": r["ids"]}))


def convert(ctx: Ctx, out: str) -> int:
    from shardfeed.convert import convert as sf_convert

    image_files(ctx)
    res = sf_convert(ctx.image_folder, out, progress=False, num_samples_per_tfrecord=max(64, ctx.images // 8))
    return res.records_written


def prepare(data: str, ctx: Ctx, out: str) -> None:
    if data == "ctr":
        write_ctr(out, ctx.ctr_records)
    else:
        convert(ctx, out)


def _files(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "**", "*.tfrecord"), recursive=True))


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    import shardfeed as sf

    ctr, img = _files(ctx.peer_dir(NAME, "ctr")), _files(ctx.peer_dir(NAME, "img"))
    if workload == "a":
        ds = sf.read_tfrecord(ctr, _spec()).batch(CTR_BATCH)
    elif workload == "d":
        ds = sf.read_tfrecord(ctr, _spec(), shuffle="global", seed=0).batch(CTR_BATCH)
    elif workload == "b":
        ds = sf.read_tfrecord(img, _img_spec()).batch(IMG_BATCH)
    elif workload == "c":
        ds = sf.read_tfrecord(img, _img_spec()).batch(IMG_BATCH).decode_images("image/encoded", IMG_SIZE)
    elif workload == "e":
        urls = [f"s3://{ctx.s3_bucket}/{NAME}/{os.path.basename(f)}" for f in ctr]
        ds = sf.read_tfrecord(urls, _spec(), storage_options={"endpoint_url": ctx.s3_endpoint},
                              cache_dir=os.path.join(ctx.scratch, "cache")).batch(CTR_BATCH)
    elif workload == "g":
        return loader_epoch(sf.read_tfrecord(ctr, _spec()).batch(CTR_BATCH), True, FORM)
    elif workload == "h":
        ds = sf.read_tfrecord(img, _img_spec()).batch(IMG_BATCH).decode_images("image/encoded", IMG_SIZE)
        return loader_epoch(ds, False, FORM)
    else:
        raise ValueError(workload)

    return epoch_over(ds, workload in "ade", IMG_LABEL, "image/encoded")


FORM = "workers"  # (g), (h): to_torch(num_workers=2); sf_dl_peer sets "dataloader"


def loader_epoch(ds: Any, ctr: bool, form: str) -> Any:
    """An epoch through 2 worker processes: ``to_torch(num_workers=2)`` (``form="workers"``,
    made once: its processes serve every epoch) or ``DataLoader(ds.to_torch(), num_workers=2)``
    (``"dataloader"``)."""
    from torch.utils.data import DataLoader

    if form == "workers":
        loader = DataLoader(ds.to_torch(num_workers=2), batch_size=None)
    else:
        loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2, worker_init_fn=worker_init_reads)

    def epoch() -> Tally:
        t = Tally()
        for b in loader:
            if ctr:
                t.ctr(b["idx"])
            else:
                t.images(b[IMG_LABEL], b["image/encoded"])
        return t

    return epoch

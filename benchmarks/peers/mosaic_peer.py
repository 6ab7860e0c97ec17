"""Mosaic Streaming: MDS shards written by ``streaming.MDSWriter`` (columns ``int64``,
``ndarray:float32:13``, ``bytes``, ``ndarray:int64``; images as ``bytes``), read with
``StreamingDataset(local=...)`` (or ``remote="s3://..."`` + ``local`` cache for (e): the
``S3_ENDPOINT_URL`` it documents, epoch 2 from the local copy) and a ``torch`` DataLoader
with the collate a user writes (variable-length arrays do not stack); ``shuffle=True``
(its default ``py1e`` shuffle: shard blocks, then samples within a block window) for (d);
images decoded with Pillow in the collate.

``import streaming`` imports its vision datasets, which import torchvision. The torchvision
wheels reachable here are CUDA builds that do not load beside the CPU torch 2.13, so where
torchvision does not import, a placeholder module with the two names those classes use is
put in its place before ``streaming`` is imported; the benchmark uses no vision class."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from typing import Any

import numpy as np
from common import CTR_BATCH, IMG_BATCH, Ctx, collate_ctr, ctr_records, epoch_over, image_files, pil_decode_resize

IMPORTS = ("streaming",)  # through _streaming(): see the module docstring
NAME = "mosaic"
COLUMNS = {"idx": "int64", "label": "int64", "dense": "ndarray:float32:13", "cat": "bytes", "ids": "ndarray:int64"}


def _streaming() -> Any:
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or a CUDA build that fails to load beside CPU torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        tv, ds, tr, fn = (types.ModuleType(n) for n in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                                                         "torchvision.transforms.functional"))

        class VisionDataset:  # only subclassed by streaming.vision, never used here
            pass

        def to_tensor(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("torchvision is not installed (placeholder from benchmarks/peers/mosaic_peer.py)")

        ds.VisionDataset, fn.to_tensor = VisionDataset, to_tensor
        for m in (tv, ds, tr, fn):  # transformers asks importlib for torchvision's spec
            m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
        tv.datasets, tv.transforms, tr.functional = ds, tr, fn
        sys.modules.update({"torchvision": tv, "torchvision.datasets": ds, "torchvision.transforms": tr,
                            "torchvision.transforms.functional": fn})
    import streaming

    return streaming


def available() -> str | None:
    try:
        _streaming()
    except ImportError as exc:
        return f"not installed ({exc})"
    except Exception as exc:
        return f"does not import here: {type(exc).__name__}: {exc}"[:200]
    return None


def version() -> str:
    return f"mosaicml-streaming {_streaming().__version__}"


def supports() -> dict[str, str | None]:
    return {"a": None, "b": None, "c": None, "d": None, "e": None, "f": None, "g": None}


def _write(out: str, columns: dict[str, str], samples: Any) -> None:
    streaming = _streaming()
    with streaming.MDSWriter(out=out, columns=columns, size_limit="32mb") as w:
        for s in samples:
            w.write(s)


def convert(ctx: Ctx, out: str) -> int:
    files = image_files(ctx)

    def samples():
        for path, label in files:
            with open(path, "rb") as f:
                yield {"jpg": f.read(), "label": label}

    _write(out, {"jpg": "bytes", "label": "int64"}, samples())
    return len(files)


def prepare(data: str, ctx: Ctx, out: str) -> None:
    if data == "img":
        convert(ctx, out)
    else:
        _write(out, COLUMNS, ({k: r[k] for k in COLUMNS} for r in ctr_records(ctx.ctr_records)))


def _collate_img(samples):
    return {"label": np.array([s["label"] for s in samples]), "image": [s["jpg"] for s in samples]}


def _collate_dec(samples):
    return {"label": np.array([s["label"] for s in samples]),
            "image": np.stack([pil_decode_resize(s["jpg"]) for s in samples])}


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    from common import worker_init_reads
    from torch.utils.data import DataLoader

    streaming = _streaming()
    data = "img" if workload in "bc" else "ctr"
    batch = CTR_BATCH if data == "ctr" else IMG_BATCH
    if workload == "e":
        os.environ["S3_ENDPOINT_URL"] = ctx.s3_endpoint or ""
        ds = streaming.StreamingDataset(remote=f"s3://{ctx.s3_bucket}/{NAME}", local=os.path.join(ctx.scratch, "cache"),
                                        batch_size=batch, shuffle=False)
    else:
        ds = streaming.StreamingDataset(local=ctx.peer_dir(NAME, data), batch_size=batch, shuffle=workload == "d",
                                        shuffle_seed=0)
    collate = {"b": _collate_img, "c": _collate_dec}.get(workload, collate_ctr)
    kw: dict[str, Any] = {"num_workers": 2, "worker_init_fn": worker_init_reads} if workload == "g" else {}
    loader = DataLoader(ds, batch_size=batch, collate_fn=collate, **kw)

    return epoch_over(loader, data == "ctr")

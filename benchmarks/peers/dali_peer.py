"""NVIDIA DALI: its TFRecord reader (``fn.readers.tfrecord`` with the index files shardfeed
writes) on CPU-only pipelines (``device_id=None``) where ``nvidia.dali`` imports. DALI
ships only as CUDA builds (``nvidia-dali-cuda120``, a wheel of several hundred MB that is
not in the ``peers`` extra); without it this peer is reported as not installed."""

from __future__ import annotations

import glob
import os
from typing import Any

from common import CTR_BATCH, IMG_BATCH, IMG_SIZE, Ctx, Tally

# imported before a conversion is timed (workload f times the writing, not the imports)
IMPORTS = ("nvidia.dali",)
NAME = "dali"


def available() -> str | None:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return ("not installed: DALI ships only as CUDA wheels (nvidia-dali-cuda120, several hundred MB); "
                "install it to add this row")
    except Exception as exc:  # a CUDA build that cannot load without a GPU
        return f"cannot load here: {type(exc).__name__}: {exc}"[:200]
    return None


def version() -> str:
    import nvidia.dali as dali

    return f"nvidia-dali {dali.__version__}"


def supports() -> dict[str, str | None]:
    return {"a": None, "b": None, "c": None, "d": "no global shuffle: random_shuffle buffer only",
            "e": "reads local files (S3 only in newer GPU builds)", "f": "no writer: reads TFRecord (shardfeed's data)",
            "g": "not a PyTorch dataset"}


def prepare(data: str, ctx: Ctx, out: str) -> None:
    """DALI reads TFRecord + index files: shardfeed's writer makes both."""
    import sf_peer

    sf_peer.prepare(data, ctx, out)


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    data = "ctr" if workload == "a" else "img"
    files = sorted(glob.glob(os.path.join(ctx.peer_dir(NAME, data), "**", "*.tfrecord"), recursive=True))
    idx = [f + ".idx" for f in files]
    n = ctx.ctr_records if data == "ctr" else ctx.images
    batch = CTR_BATCH if data == "ctr" else IMG_BATCH

    @pipeline_def(batch_size=batch, num_threads=2, device_id=None)
    def pipe():
        if data == "ctr":
            f = fn.readers.tfrecord(path=files, index_path=idx, name="r", pad_last_batch=False, features={
                "idx": tfrec.FixedLenFeature([1], tfrec.int64, 0),
                "dense": tfrec.FixedLenFeature([13], tfrec.float32, 0.0)})
            return f["idx"], f["dense"]
        f = fn.readers.tfrecord(path=files, index_path=idx, name="r", features={
            "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
            "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        img = f["image/encoded"]
        if workload == "c":
            img = fn.resize(fn.decoders.image(img, device="cpu", output_type=types.RGB),
                            resize_x=IMG_SIZE, resize_y=IMG_SIZE)
        return f["image/class/label"], img

    p = pipe()
    p.build()

    def epoch() -> Tally:
        t = Tally()
        left = n
        while left > 0:
            a, _b = p.run()
            arr = a.as_array().reshape(-1)[:left]  # DALI pads the last batch
            left -= arr.size
            (t.ctr if data == "ctr" else t.images)(arr)
        p.reset()
        return t

    return epoch

"""tf.data: TFRecord files written by ``tf.io.TFRecordWriter`` (``tf.train.Example``), read
with ``TFRecordDataset(files).batch(n).map(parse_example)``, each tensor turned into numpy
(the fast form: parse a batch at once, sequential reads; ``as_numpy_iterator`` turns a batch
of strings into numpy at a few hundred records/s here), images decoded with
``tf.io.decode_jpeg`` + ``tf.image.resize`` in a ``map(num_parallel_calls=AUTOTUNE)``."""

from __future__ import annotations

import glob
import os
from typing import Any

from common import CTR_BATCH, IMG_BATCH, IMG_SIZE, Ctx, Tally, ctr_records, image_files, not_installed

# imported before a conversion is timed (workload f times the writing, not the imports)
IMPORTS = ("tensorflow",)
NAME = "tf.data"
SHARDS = 8


def available() -> str | None:
    return not_installed(IMPORTS)


def version() -> str:
    import tensorflow as tf

    return f"tensorflow {tf.__version__}"


def supports() -> dict[str, str | None]:
    return {"a": None, "b": None, "c": None,
            "d": "no global shuffle: shuffle(buffer) only",
            "e": "no s3:// filesystem in TensorFlow 2.21 (moved to tensorflow-io)",
            "f": None,
            "g": "not a PyTorch dataset"}


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def _ctr_example(tf, r: dict[str, Any]) -> bytes:
    f = tf.train.Feature
    return tf.train.Example(features=tf.train.Features(feature={
        "idx": f(int64_list=tf.train.Int64List(value=[r["idx"]])),
        "label": f(int64_list=tf.train.Int64List(value=[r["label"]])),
        "dense": f(float_list=tf.train.FloatList(value=r["dense"])),
        "cat": f(bytes_list=tf.train.BytesList(value=[r["cat"]])),
        "ids": f(int64_list=tf.train.Int64List(value=r["ids"])),
    })).SerializeToString()


def convert(ctx: Ctx, out: str) -> int:
    """The image folder to TFRecords with TensorFlow's own writer (bytes kept as they are)."""
    tf = _tf()
    files = image_files(ctx)
    os.makedirs(out, exist_ok=True)
    per = -(-len(files) // SHARDS)
    f = tf.train.Feature
    for s in range(SHARDS):
        with tf.io.TFRecordWriter(os.path.join(out, f"img-{s:05d}.tfrecord")) as w:
            for path, label in files[s * per:(s + 1) * per]:
                data = tf.io.gfile.GFile(path, "rb").read()
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "image/encoded": f(bytes_list=tf.train.BytesList(value=[data])),
                    "image/class/label": f(int64_list=tf.train.Int64List(value=[label])),
                })).SerializeToString())
    return len(files)


def prepare(data: str, ctx: Ctx, out: str) -> None:
    if data == "img":
        convert(ctx, out)
        return
    tf = _tf()
    os.makedirs(out, exist_ok=True)
    n = ctx.ctr_records
    per = -(-n // SHARDS)
    recs = ctr_records(n)
    for s in range(SHARDS):
        with tf.io.TFRecordWriter(os.path.join(out, f"ctr-{s:05d}.tfrecord")) as w:
            for _ in range(min(per, n - s * per)):
                w.write(_ctr_example(tf, next(recs)))


def epoch_fn(workload: str, ctx: Ctx) -> Any:
    tf = _tf()
    files = sorted(glob.glob(os.path.join(ctx.peer_dir(NAME, "ctr" if workload == "a" else "img"), "*.tfrecord")))
    if workload == "a":
        spec = {"idx": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
                "dense": tf.io.FixedLenFeature([13], tf.float32), "cat": tf.io.FixedLenFeature([], tf.string),
                "ids": tf.io.VarLenFeature(tf.int64)}
        ds = tf.data.TFRecordDataset(files).batch(CTR_BATCH).map(lambda x: tf.io.parse_example(x, spec))
    else:
        spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
        if workload == "b":  # the fast form: parse a whole batch at once
            ds = tf.data.TFRecordDataset(files).batch(IMG_BATCH).map(lambda x: tf.io.parse_example(x, spec))
        else:
            def dec(x):
                x = tf.io.parse_single_example(x, spec)
                img = tf.image.resize(tf.io.decode_jpeg(x["image/encoded"], channels=3), [IMG_SIZE, IMG_SIZE])
                return {"image": tf.cast(img, tf.uint8), "image/class/label": x["image/class/label"]}
            ds = tf.data.TFRecordDataset(files).map(dec, num_parallel_calls=tf.data.AUTOTUNE).batch(IMG_BATCH)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    def epoch() -> Tally:
        t = Tally()
        for tb in ds:  # per tensor: as_numpy_iterator turns a batch of strings into numpy at ~200 records/s
            b = {k: (v.values.numpy() if isinstance(v, tf.SparseTensor) else v.numpy()) for k, v in tb.items()}
            if workload == "a":
                t.ctr(b["idx"])
            else:
                t.images(b["image/class/label"], b["image"] if workload == "c" else list(b["image/encoded"]))
        return t

    return epoch

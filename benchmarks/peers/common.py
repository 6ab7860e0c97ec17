"""What every peer module shares: the raw data (made once, seeded), the workloads, the
context a (peer, workload) child gets, and the checks a reading loop reports.

The raw data is the same for every peer; each peer writes it in its own format with its own
writer (``prepare``) and reads it back through its own documented fast path (``readers``).

- CTR-like records: ``idx`` (int64, the record's number), ``label`` (int64), ``dense``
  (13 float32), ``cat`` (26 categorical ids of 8 bytes packed in one 208-byte string) and
  ``ids`` (1-19 int64, variable length); about 400 bytes of payload each.
- JPEG images: an image folder ``class{c}/img-{i:06d}.jpg`` (4 classes, photo-like
  gradients plus noise) that workload (f) converts and (b), (c) read back.

A reader delivers batches into a training loop and reports ``count`` (records delivered)
and ``check`` (the sum of ``idx`` for CTR records, of labels for images): a record lost or
delivered twice changes them.
"""

from __future__ import annotations

import importlib
import io
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CTR_BATCH = 1024
IMG_BATCH = 64
IMG_SIZE = 224
CLASSES = 4
CAT_BYTES = 26 * 8

# workload key -> what it measures (the table's words)
WORKLOADS = {
    "a": "CTR records into arrays",
    "b": "JPEG bytes only",
    "c": "JPEG decode + resize 224",
    "d": "global shuffle, CTR records",
    "e": "S3 behind a shaping proxy, CTR records",
    "f": "convert an image folder",
    "g": "PyTorch DataLoader, 2 workers, CTR records",
    "h": "PyTorch, 2 worker processes, JPEG decode + resize 224",
}
# which data set a workload reads ("ctr" or "img") and how many epochs it reports
DATA = {"a": "ctr", "b": "img", "c": "img", "d": "ctr", "e": "ctr", "f": "img", "g": "ctr", "h": "img"}


@dataclass
class Ctx:
    """What a (peer, workload) child needs: where the raw data and each peer's copy live,
    the sizes, and (workload e) the S3 endpoint and bucket."""

    root: str
    ctr_records: int
    images: int
    width: int = 500
    height: int = 375
    s3_endpoint: str | None = None        # the shaping proxy's URL
    s3_bucket: str | None = None
    scratch: str = ""                      # a fresh folder for this child (caches, conversion output)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def image_folder(self) -> str:
        return os.path.join(self.root, f"images-{self.images}-{self.width}x{self.height}")

    def peer_dir(self, peer: str, data: str) -> str:
        n = self.ctr_records if data == "ctr" else self.images
        return os.path.join(self.root, f"{peer}-{data}-{n}")


def not_installed(modules: tuple[str, ...]) -> str | None:
    """A peer's ``available()`` when importing its modules is the whole test: ``None``, or
    ``"not installed (...)"`` naming the import that failed."""
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError as exc:
        return f"not installed ({exc})"
    return None


def ctr_record(i: int) -> dict[str, Any]:
    """Record ``i`` of the CTR-like data set (the same for every peer and every run)."""
    rng = np.random.default_rng(i)
    n_ids = int(rng.integers(1, 20))
    return {"idx": i, "label": i % 2, "dense": rng.normal(size=13).astype(np.float32),
            "cat": rng.bytes(CAT_BYTES), "ids": rng.integers(0, 1 << 40, size=n_ids, dtype=np.int64)}


def ctr_records(n: int) -> Iterator[dict[str, Any]]:
    return (ctr_record(i) for i in range(n))


def image_files(ctx: Ctx) -> list[tuple[str, int]]:
    """``(path, label)`` of every image in the folder, sorted by path; made (once) if missing."""
    folder = ctx.image_folder
    marker = os.path.join(folder, ".READY")
    if not os.path.exists(marker):
        make_image_folder(folder, ctx.images, ctx.width, ctx.height)
        open(marker, "w").close()
    out = []
    for c in range(CLASSES):
        d = os.path.join(folder, f"class{c}")
        out.extend((os.path.join(d, f), c) for f in sorted(os.listdir(d)))
    return sorted(out)


def make_image_folder(folder: str, n: int, width: int, height: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width]
    for c in range(CLASSES):
        os.makedirs(os.path.join(folder, f"class{c}"), exist_ok=True)
    for i in range(n):
        # smooth gradients plus noise: compresses like a photo
        a, b, c = rng.uniform(0, 255, 3)
        img = np.stack([(a + xx * 0.5) % 256, (b + yy * 0.7) % 256, (c + (xx + yy) * 0.3) % 256], -1)
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=85)
        with open(os.path.join(folder, f"class{i % CLASSES}", f"img-{i:06d}.jpg"), "wb") as f:
            f.write(buf.getvalue())


def expected(ctx: Ctx, data: str) -> tuple[int, int]:
    """``(count, check)`` one epoch must deliver."""
    if data == "ctr":
        n = ctx.ctr_records
        return n, n * (n - 1) // 2
    n = ctx.images
    return n, sum(i % CLASSES for i in range(n))


def pil_decode_resize(data: bytes) -> np.ndarray:
    """The decode most peers' examples show: Pillow, RGB, bilinear resize to 224x224."""
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB").resize((IMG_SIZE, IMG_SIZE), Image.BILINEAR)
    return np.asarray(img)


def collate_ctr(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of CTR records into columns (the collate a peer's user writes: ``ids`` varies
    in length, so it stays a list)."""
    return {"idx": np.array([s["idx"] for s in samples], np.int64),
            "label": np.array([s["label"] for s in samples], np.int64),
            "dense": np.stack([s["dense"] for s in samples]),
            "cat": [s["cat"] for s in samples], "ids": [s["ids"] for s in samples]}


class Tally:
    """The training loop's view: records and their check sum, per epoch."""

    def __init__(self) -> None:
        self.count = 0
        self.check = 0
        self.nbytes = 0
        self.worker_read_bytes = 0  # what DataLoader workers read (workload g)

    def ctr(self, idx: Any) -> None:
        a = np.asarray(idx)
        self.count += int(a.size)
        self.check += int(a.sum())

    def images(self, labels: Any, batch: Any = None) -> None:
        a = np.asarray(labels)
        self.count += int(a.size)
        self.check += int(a.sum())
        if batch is not None:
            self.nbytes += int(np.asarray(batch).nbytes) if not isinstance(batch, list) else sum(map(len, batch))


def epoch_over(batches: Any, ctr: bool, label: str = "label", image: str = "image") -> Callable[[], Tally]:
    """The epoch function of a peer whose batches are dicts: each pass over ``batches`` (an
    iterable that starts over when iterated again) tallied as CTR ids (``ctr``) or as images
    (``label``, ``image`` keys)."""

    def epoch() -> Tally:
        t = Tally()
        for b in batches:
            if ctr:
                t.ctr(b["idx"])
            else:
                t.images(b[label], b[image])
        return t

    return epoch


def rchar() -> int:
    """Bytes this process read through read()-like calls (``/proc/self/io``; reads through
    mmap are not counted)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def measure(fn: Callable[[], Tally]) -> dict[str, Any]:
    """Run one epoch (``fn``), with wall time, CPU time (this process and its reaped
    children: DataLoader workers, writer processes) and read bytes."""
    r0, c0, t0 = rchar(), cpu_seconds(), time.perf_counter()
    tally = fn()
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "cpu_seconds": cpu_seconds() - c0, "count": tally.count, "check": tally.check,
            "read_bytes": rchar() - r0 + tally.worker_read_bytes}


def dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


# -- bytes read by DataLoader workers (workload g) ---------------------------------------------------
_READS_DIR = "SF_PEERS_WORKER_READS"


def worker_init_reads(_worker_id: int) -> None:
    """``worker_init_fn`` that records, when the worker process exits, the bytes it read
    (``/proc/self/io`` rchar since it started) in ``$SF_PEERS_WORKER_READS/<pid>``."""
    import multiprocessing.util as mpu

    folder = os.environ.get(_READS_DIR)
    if not folder:
        return
    start = rchar()

    def _write() -> None:
        with open(os.path.join(folder, str(os.getpid())), "w") as f:
            f.write(str(rchar() - start))

    mpu.Finalize(None, _write, exitpriority=100)


def worker_reads(folder: str) -> int:
    """The bytes the exited workers recorded in ``folder`` (and clear them)."""
    total = 0
    for name in os.listdir(folder):
        p = os.path.join(folder, name)
        with open(p) as f:
            total += int(f.read() or 0)
        os.unlink(p)
    return total

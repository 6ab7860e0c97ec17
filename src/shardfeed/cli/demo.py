"""``shardfeed demo``: the main job end to end on data made on the spot.

1. Draws a labeled image dataset (shapes of four classes on varied backgrounds).
2. Converts it to sharded, indexed TFRecords (``sf.convert``, with a progress bar).
3. Trains a small classifier (numpy MLP) reading through the pipeline from a
   :class:`~shardfeed.WorkQueue` holding every epoch (other ranks would share it), with a
   progress bar; prints accuracy per epoch, records/s, each stage's own time and the
   pipeline's own verdict (input-bound or not, the stage that bounds it, the fix).
4. Trains the same model fed the naive way (read, decode and train one after another in
   one thread) for comparison.
5. Writes a PNG chart of where the time went, and ``summary.json``.

Each training step is the MLP's numpy step plus a simulated accelerator step (``step_ms``,
25 ms by default, about a ResNet-50 step on a batch of 32 on a current GPU): the device
computes while the host CPU is free, as MLPerf Storage simulates accelerators. The MLP
alone is far lighter than any real network, so without it the demo would compare input
pipelines against a model that takes no time, which no user trains.
"""

from __future__ import annotations

import io
import json
import os
import time
import uuid

import numpy as np

from ..progress import progress_bar

CLASSES = ("circle", "square", "triangle", "cross")
IMAGE = 48  # pixels, as drawn
SIZE = 24  # pixels, as converted and trained on
BATCH = 32
HIDDEN = 512
SHUFFLE = 256
STEP_MS = 25.0  # the simulated accelerator's time per batch


def _need_pillow():
    try:
        from PIL import Image, ImageDraw  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - the demo's install step brings Pillow
        raise ImportError("the demo draws images with Pillow: pip install 'shardfeed[convert]'") from exc
    return Image, ImageDraw


def draw_shapes(folder: str, n: int, seed: int = 0) -> None:
    """``n`` JPEGs in ``folder/<class>/<i>.jpg``: one shape each, random size, place, colours."""
    Image, ImageDraw = _need_pillow()
    rng = np.random.default_rng(seed)
    for c in CLASSES:
        os.makedirs(os.path.join(folder, c), exist_ok=True)
    for i in range(n):
        label = CLASSES[i % len(CLASSES)]
        bg = int(rng.integers(0, 256))
        fg = (bg + int(rng.integers(90, 166))) % 256  # always well apart from the background
        img = Image.new("RGB", (IMAGE, IMAGE), tuple(int(x) for x in np.clip(bg + rng.integers(-30, 31, 3), 0, 255)))
        d = ImageDraw.Draw(img)
        r = int(rng.integers(10, 19))
        cx, cy = (int(v) for v in rng.integers(r + 2, IMAGE - r - 2, 2))
        colour = tuple(int(x) for x in np.clip(fg + rng.integers(-30, 31, 3), 0, 255))
        if label == "circle":
            d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
        elif label == "square":
            d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
        elif label == "triangle":
            d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
        else:
            w = max(3, r // 3)
            d.rectangle((cx - r, cy - w, cx + r, cy + w), fill=colour)
            d.rectangle((cx - w, cy - r, cx + w, cy + r), fill=colour)
        pixels = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (IMAGE, IMAGE, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            os.path.join(folder, label, f"{i:05d}.jpg"), quality=90)


def _pixels(encoded: bytes) -> np.ndarray:
    """Encoded image -> grayscale pixels, standardised per image, the shape's polarity
    removed (a light shape on dark ground looks like a dark one on light ground)."""
    Image, _ = _need_pillow()
    img = Image.open(io.BytesIO(encoded)).convert("L")
    if img.size != (SIZE, SIZE):
        img = img.resize((SIZE, SIZE))
    x = np.asarray(img, dtype=np.float32).reshape(-1)
    x = np.abs(x - np.median(x))
    return x / (x.std() + 1e-3) - 1.0


def decode(example: dict) -> tuple[np.ndarray, int]:
    """One example of the converted dataset -> (pixels, label)."""
    encoded = example["image/encoded"]
    return _pixels(encoded if isinstance(encoded, bytes) else bytes(encoded)), int(example["image/class/label"])


def decode_batch(columns: dict) -> tuple[np.ndarray, np.ndarray]:
    """A parsed batch (numpy columns) -> (pixels [B, SIZE*SIZE], labels [B]): images decoded
    one by one, then standardised all at once (as :func:`_pixels` does for one)."""
    Image, _ = _need_pillow()
    raw = np.stack([np.asarray(_gray(Image, b), dtype=np.uint8).reshape(-1) for b in columns["image/encoded"]])
    x = raw.astype(np.float32)
    x = np.abs(x - np.median(x, axis=1, keepdims=True))
    x /= x.std(axis=1, keepdims=True) + 1e-3
    x -= 1.0
    return x, np.asarray(columns["image/class/label"], dtype=np.int64).reshape(-1)


def _gray(Image, encoded: bytes):
    img = Image.open(io.BytesIO(encoded)).convert("L")
    return img if img.size == (SIZE, SIZE) else img.resize((SIZE, SIZE))


class MLP:
    """A two-layer perceptron trained with SGD and momentum, in numpy."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int, seed: int = 0, lr: float = 0.01):
        rng = np.random.default_rng(seed)
        self.w1 = rng.normal(0, np.sqrt(2 / n_in), (n_in, n_hidden)).astype(np.float32)
        self.b1 = np.zeros(n_hidden, np.float32)
        self.w2 = rng.normal(0, np.sqrt(2 / n_hidden), (n_hidden, n_out)).astype(np.float32)
        self.b2 = np.zeros(n_out, np.float32)
        self.v = [np.zeros_like(p) for p in self.params]
        self.lr = lr

    @property
    def params(self) -> list[np.ndarray]:
        return [self.w1, self.b1, self.w2, self.b2]

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ self.w1 + self.b1, 0) @ self.w2 + self.b2

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        h = np.maximum(x @ self.w1 + self.b1, 0)
        z = h @ self.w2 + self.b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
        g = p
        g[np.arange(len(y)), y] -= 1
        g /= len(y)
        gw2, gb2 = h.T @ g, g.sum(0)
        gh = (g @ self.w2.T) * (h > 0)
        grads = [x.T @ gh, gh.sum(0), gw2, gb2]
        for param, vel, grad in zip(self.params, self.v, grads):
            vel *= 0.9
            vel += grad
            param -= self.lr * vel
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float((self.logits(x).argmax(1) == y).mean())


def train_pipeline(files, spec, test_xy, epochs: int, backend: str, step_s: float, seed: int = 0):
    """The trainer reads through one pipeline from a WorkQueue holding every epoch (ranks
    of a job would share it; here there is one) and trains as batches come, the decoding
    in two threads. Returns (model, per-epoch rows, timings, the pass's stats);
    an epoch ends when an epoch's worth of records has been trained on."""
    import shardfeed as sf  # noqa: PLC0415

    model = MLP(SIZE * SIZE, HIDDEN, len(CLASSES), seed=seed)
    q = sf.WorkQueue(files, num_epochs=epochs, shuffle=True, seed=seed, num_slices=len(files) * 2,
                     backend=backend, name=f"demo-{uuid.uuid4().hex[:8]}", lease_timeout=60)
    per_epoch = sum(int(n) for n in (sf.IndexedTFRecord(f).index.shape[0] for f in files))
    ds = (sf.read_tfrecord(q, spec=spec)
          .shuffle(SHUFFLE, seed=seed)
          .batch(BATCH)  # parsed natively, a whole batch at once
          # Pillow decodes with the GIL released: two threads, no process to start
          .map(decode_batch, num_parallel_calls=2)
          .prefetch(8))
    rows = []
    t_compute = 0.0
    records = 0
    t0 = time.perf_counter()
    bar = progress_bar(total=per_epoch * epochs, desc="      training", unit="rec")
    try:
        with iter(ds) as it:
            for x, y in it:
                tc = time.perf_counter()
                model.step(x, y)
                time.sleep(step_s)  # the accelerator's part of the step: the host CPU is free
                t_compute += time.perf_counter() - tc
                records += len(y)
                bar.update(len(y))
                if records >= per_epoch * (len(rows) + 1):
                    rows.append((len(rows) + 1, model.accuracy(*test_xy)))
            stats = it.stats()
    finally:
        bar.close()
        q.close()
    wall = time.perf_counter() - t0
    return model, rows, {"wall_s": wall, "wait_s": stats.consumer_wait_s, "compute_s": t_compute,
                         "records": records}, stats


def _shuffled(records, rng, size: int = SHUFFLE):
    buffer: list = []
    for r in records:
        if len(buffer) < size:
            buffer.append(r)
            continue
        i = int(rng.integers(size))
        buffer[i], r = r, buffer[i]
        yield r
    rng.shuffle(buffer)
    yield from buffer


def train_naive(files, test_xy, epochs: int, step_s: float, seed: int = 0):
    """The same training fed the straightforward way: one thread reads a record, decodes it,
    and trains when a batch is full (records shuffled through a buffer of the same size)."""
    from ..formats.example import decode_example  # noqa: PLC0415
    from ..formats.tfrecord import read_records  # noqa: PLC0415

    model = MLP(SIZE * SIZE, HIDDEN, len(CLASSES), seed=seed)
    t_input = t_compute = 0.0
    records = 0
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(epochs):
        xs, ys = [], []
        order = list(files)
        rng.shuffle(order)
        ti = time.perf_counter()
        for record in _shuffled(read_records(order), rng):
            x, y = decode({k: v[0] for k, v in decode_example(record).items() if len(v)})
            xs.append(x)
            ys.append(y)
            if len(xs) == BATCH:
                t_input += time.perf_counter() - ti
                tc = time.perf_counter()
                model.step(np.stack(xs), np.array(ys))
                time.sleep(step_s)
                t_compute += time.perf_counter() - tc
                records += len(xs)
                xs, ys = [], []
                ti = time.perf_counter()
        t_input += time.perf_counter() - ti
        if xs:
            tc = time.perf_counter()
            model.step(np.stack(xs), np.array(ys))
            time.sleep(step_s)
            t_compute += time.perf_counter() - tc
            records += len(xs)
    wall = time.perf_counter() - t0
    return model, {"wall_s": wall, "input_s": t_input, "compute_s": t_compute, "records": records,
                   "accuracy": model.accuracy(*test_xy)}


def chart(path: str, pipe: dict, naive: dict, stages: list[tuple[str, float]]) -> None:
    """A PNG bar chart of where the time went, drawn with Pillow."""
    Image, ImageDraw = _need_pillow()
    rows = [("pipeline: wall time", pipe["wall_s"], (40, 110, 200)),
            ("pipeline: trainer stepping", pipe["compute_s"], (60, 170, 90)),
            ("pipeline: trainer waiting for input", pipe["wait_s"], (220, 80, 60))]
    rows += [(f"  stage {name} (its own time)", s, (150, 150, 200)) for name, s in stages]
    rows += [("naive: wall time", naive["wall_s"], (40, 110, 200)),
             ("naive: stepping", naive["compute_s"], (60, 170, 90)),
             ("naive: reading + decoding", naive["input_s"], (220, 80, 60))]
    width, left, bar_h = 900, 330, 22
    img = Image.new("RGB", (width, 60 + bar_h * len(rows) + 30), "white")
    d = ImageDraw.Draw(img)
    d.text((10, 10), "shardfeed demo: where the time went (seconds)", fill="black")
    top = max(v for _, v, _ in rows) or 1.0
    for i, (label, value, colour) in enumerate(rows):
        y = 40 + i * bar_h
        d.text((10, y + 5), label, fill="black")
        d.rectangle((left, y + 3, left + int((width - left - 80) * value / top), y + bar_h - 3), fill=colour)
        d.text((left + int((width - left - 80) * value / top) + 6, y + 5), f"{value:.2f}", fill="black")
    img.save(path)


def _one_blas_thread() -> str:
    """The model's maths on one thread: a BLAS thread pool spinning on both cores would fight
    the input pipeline's threads for them (a real accelerator does not)."""
    try:
        from threadpoolctl import threadpool_limits  # noqa: PLC0415
    except ImportError:
        return "BLAS threads: library default (pip install threadpoolctl to pin them to 1)"
    threadpool_limits(1)
    return "BLAS threads: 1"


def run_demo(out: str = "demo-out", images: int = 2000, epochs: int = 6, seed: int = 0,
             step_ms: float = STEP_MS) -> int:
    import shardfeed as sf  # noqa: PLC0415

    blas = _one_blas_thread()
    step_s = step_ms / 1e3

    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    t_all = time.perf_counter()
    folder = os.path.join(out, "images")
    print(f"shardfeed demo -> {out} ({blas})")
    print(f"[1/5] drawing {images} labeled images ({', '.join(CLASSES)}) in {folder}")
    draw_shapes(folder, images, seed)

    print(f"[2/5] converting them to sharded, indexed TFRecords (resized to {SIZE}px, 20% held out for test)")
    shards = os.path.join(out, "shards")
    result = sf.convert(folder, shards, test_ratio=0.2, max_image_size=SIZE, image_format="png",
                        num_samples_per_tfrecord=max(50, images // 8), seed=seed)
    print(f"      {result}")
    train_files = result.files("train")
    manifest_spec = sf.read_dataset(shards, split="train").spec
    spec = {k: manifest_spec[k] for k in ("image/encoded", "image/class/label")}
    test = [decode(e) for e in sf.read_dataset(shards, split="test")]
    test_xy = (np.stack([x for x, _ in test]), np.array([y for _, y in test]))

    print(f"[3/5] training a {SIZE * SIZE}-{HIDDEN}-{len(CLASSES)} MLP for {epochs} epochs, each step also "
          f"{step_ms:g} ms of simulated accelerator time, reading read_tfrecord(queue, spec).shuffle({SHUFFLE})"
          f".batch({BATCH}).map(decode_batch, num_parallel_calls=2).prefetch(8)")
    backend = f"sqlite:///{os.path.join(out, 'workqueue.sqlite3')}"
    _, rows, pipe, stats = train_pipeline(train_files, spec, test_xy, epochs, backend, step_s, seed)
    for epoch, acc in rows:
        print(f"      epoch {epoch}: test accuracy {acc:.1%}")
    pipe_rate = pipe["records"] / pipe["wall_s"]
    stages = [(st.name.split(":", 1)[-1], st.busy_s, st.parallelism) for st in stats.stages]
    print(f"      {pipe_rate:,.0f} records/s; the pipeline's verdict: {stats.verdict()}")
    print("      each stage's own time (exclusive; a stage with several workers adds theirs): "
          + ", ".join(f"{name} {busy:.2f} s" + (f" over {par} workers" if par > 1 else "")
                      for name, busy, par in stages))

    print("[4/5] the same training fed the naive way (read, decode, train one after another)")
    _, naive = train_naive(train_files, test_xy, epochs, step_s, seed)
    naive_rate = naive["records"] / naive["wall_s"]
    print(f"      {naive_rate:,.0f} records/s, test accuracy {naive['accuracy']:.1%}; "
          f"the trainer waited for reading + decoding {naive['input_s'] / naive['wall_s']:.0%} of "
          f"{naive['wall_s']:.2f} s")
    print(f"      the trainer waited {stats.wait_fraction:.1%} of the time with shardfeed against "
          f"{naive['input_s'] / naive['wall_s']:.0%} fed naively; {pipe_rate / naive_rate:.2f}x the records/s")

    png = os.path.join(out, "where-time-went.png")
    chart(png, pipe, naive, sorted(((n, b) for n, b, _ in stages), key=lambda kv: -kv[1])[:5])
    summary = {"records_per_s": pipe_rate, "naive_records_per_s": naive_rate, "wait_fraction": stats.wait_fraction,
               "naive_wait_fraction": naive["input_s"] / naive["wall_s"], "step_ms": step_ms,
               "verdict": stats.verdict(), "stats": stats.to_dict(),
               "accuracy": [acc for _, acc in rows], "naive_accuracy": naive["accuracy"]}
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"[5/5] chart of where the time went: {png} (numbers in {os.path.join(out, 'summary.json')})")
    print(f"done in {time.perf_counter() - t_all:.1f} s. Try: shardfeed inspect {shards}   |   "
          f"shardfeed verify '{shards}/*.tfrecord'")
    best = max(acc for _, acc in rows)
    if best <= 1.0 / len(CLASSES) + 0.05:
        print(f"note: accuracy stayed near chance ({best:.1%}); more --images or --epochs help the model learn")
    return 0

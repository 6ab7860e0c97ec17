"""``shardfeed bench feed``: how many accelerators a pipeline keeps busy on this machine.

MLPerf Storage's rule: a simulated accelerator takes a batch, "computes" for a fixed step
time (a sleep: the host CPU is free meanwhile, as with a real device), and counts as fed
while its utilisation, step time over wall time, stays at 90% or more. Here ``n``
simulated accelerators (threads) share one pipeline, each taking the next batch from it
as it finishes a step; :func:`feed_rate` finds the largest ``n`` that keeps every one of
them at the target, starting from the pipeline's own rate measured alone, and checking
each guess by simulation. That answers "how many GPUs will this keep busy, and how many
cores do I need per GPU" before anyone buys hardware.

Presets (``--preset``): ``resnet50``, MLPerf Storage's ResNet-50 workload (Examples of
114,660 bytes: image bytes and a label; batch 400; a step of 224 ms, which makes an H100
need 1,607 samples/s at 90%), and ``ctr``, the CTR-like records of
``benchmarks/read_tfrecord.py`` (39 features; batch 1,024; a 20 ms step, an assumption:
a small recommendation model's step on one accelerator). ``--pipeline module:function``
runs the user's own (a function returning a :class:`~shardfeed.pipeline.dataset.Dataset`
of batches; ``--step-ms`` and ``--batch-size`` say what one accelerator takes).
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ..pipeline.tree import tree_leaves

TARGET_UTILISATION = 0.9
"""MLPerf Storage's accelerator utilisation (AU) threshold."""


@dataclass
class Simulation:
    """One run of ``accelerators`` simulated accelerators on one pipeline."""

    accelerators: int
    step_s: float
    seconds: float
    batches: int
    samples: int
    utilisation: list[float] = field(default_factory=list)  # per accelerator, step time over wall time

    @property
    def min_utilisation(self) -> float:
        return min(self.utilisation) if self.utilisation else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


@dataclass
class FeedResult:
    """What :func:`feed_rate` found: ``accelerators`` kept at ``target`` or more."""

    name: str
    step_s: float
    batch_size: int
    target: float
    pipeline_samples_per_s: float  # the pipeline alone, drained as fast as it goes
    accelerators: int
    cores: int
    runs: list[Simulation] = field(default_factory=list)
    capped: bool = False  # fed as many as it was allowed to try: it could feed more

    @property
    def per_core(self) -> float:
        return self.accelerators / self.cores if self.cores else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["per_core"] = self.per_core
        d["runs"] = [{**asdict(r), "min_utilisation": r.min_utilisation, "samples_per_s": r.samples_per_s}
                     for r in self.runs]
        return d


def _len(batch: Any) -> int:
    """Samples in a batch: the length of its first leaf (dicts and tuples walked)."""
    leaves = tree_leaves(batch)
    if not leaves:
        return 0
    return len(leaves[0]) if hasattr(leaves[0], "__len__") else 1


def _endless(make: Callable[[], Any]) -> Iterator[Any]:
    """Batches of ``make()``'s dataset, pass after pass, never ending."""
    while True:
        empty = True
        it = iter(make())
        try:
            for batch in it:
                empty = False
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if empty:
            raise ValueError("the pipeline yielded no batch: nothing to feed the accelerators")


def drain_rate(make: Callable[[], Any], seconds: float, warmup: int = 2) -> tuple[float, int]:
    """``(samples/s, batch size)`` of the pipeline alone over about ``seconds``, after
    ``warmup`` batches (threads started, files opened)."""
    it = _endless(make)
    try:
        size = 0
        for _ in range(warmup):
            size = max(size, _len(next(it)))
        n = 0
        t0 = time.perf_counter()
        while True:
            b = next(it)
            size = max(size, _len(b))
            n += _len(b)
            if time.perf_counter() - t0 >= seconds:
                break
        return n / (time.perf_counter() - t0), size
    finally:
        it.close()


def simulate(make: Callable[[], Any], accelerators: int, step_s: float, seconds: float,
             warmup: int = 2) -> Simulation:
    """Run ``accelerators`` simulated accelerators over one pipeline for about
    ``seconds`` (after each took ``warmup`` batches): each takes the next batch (waiting
    for it), then sleeps ``step_s``. Utilisation is counted from the end of the warm-up."""
    it = _endless(make)
    lock = threading.Lock()
    started = threading.Barrier(accelerators + 1)
    stop = threading.Event()
    busy = [0.0] * accelerators
    counts = [0] * accelerators
    samples = [0] * accelerators
    errors: list[BaseException] = []
    windows = [(0.0, 0.0)] * accelerators

    def take() -> Any:
        with lock:
            return next(it)

    def accelerator(k: int) -> None:
        try:
            for _ in range(warmup):
                take()
                time.sleep(step_s)
        except BaseException as exc:  # noqa: BLE001 - raised by the caller
            errors.append(exc)
        try:
            started.wait()
        except threading.BrokenBarrierError:
            return
        t0 = time.perf_counter()
        try:
            while not stop.is_set():
                batch = take()
                s = time.perf_counter()
                time.sleep(step_s)
                busy[k] += time.perf_counter() - s
                counts[k] += 1
                samples[k] += _len(batch)
        except BaseException as exc:  # noqa: BLE001 - raised by the caller
            errors.append(exc)
        windows[k] = (t0, time.perf_counter())

    threads = [threading.Thread(target=accelerator, args=(k,), name=f"accelerator-{k}", daemon=True)
               for k in range(accelerators)]
    try:
        for t in threads:
            t.start()
        try:
            started.wait(timeout=max(60.0, 10 * warmup * step_s))
        except threading.BrokenBarrierError:
            stop.set()
            for t in threads:
                t.join()
            if errors:
                raise errors[0] from None
            raise TimeoutError("the accelerators' warm-up batches did not arrive in 60 s") from None
        t0 = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        with lock:
            it.close()
    if errors:
        raise errors[0]
    util = [b / max(1e-9, end - start) for b, (start, end) in zip(busy, windows)]
    return Simulation(accelerators, step_s, wall, sum(counts), sum(samples), util)


def feed_rate(make: Callable[[], Any], step_s: float, batch_size: int | None = None, *, name: str = "pipeline",
              target: float = TARGET_UTILISATION, seconds: float = 5.0, max_tries: int = 6,
              max_accelerators: int = 64, progress: Callable[[str], None] | None = None) -> FeedResult:
    """The largest number of simulated accelerators (``step_s`` a batch) that ``make()``'s
    pipeline keeps at ``target`` utilisation or more, each of them. The pipeline's rate
    alone gives the first guess (``rate * target... / (batch / step)``); each guess is
    checked by :func:`simulate`, and the answer is the largest number that passed (0 when
    even one accelerator waits more than ``1 - target`` of its time), at most
    ``max_accelerators`` (``FeedResult.capped`` says the pipeline could feed more)."""
    if step_s <= 0:
        raise ValueError(f"step time must be positive, got {step_s!r} s")
    if not 0 < target < 1:
        raise ValueError(f"target utilisation must be in (0, 1), got {target!r}")
    say = progress or (lambda _msg: None)
    rate, seen = drain_rate(make, seconds)
    size = int(batch_size or seen)
    per_accelerator = target * size / step_s  # samples/s one accelerator takes at the target
    guess = min(max_accelerators, max(1, int(rate / per_accelerator)))
    say(f"{name}: {rate:,.0f} samples/s alone, batch {size}: first guess {guess} accelerator(s)")
    result = FeedResult(name, step_s, size, target, rate, 0, os.cpu_count() or 1)
    passed, failed = 0, None
    n = guess
    for _ in range(max_tries):
        sim = simulate(make, n, step_s, seconds)
        result.runs.append(sim)
        ok = sim.min_utilisation >= target
        say(f"  {n} accelerator(s): utilisation min {sim.min_utilisation:.1%}, mean "
            f"{statistics.mean(sim.utilisation):.1%} -> {'fed' if ok else 'starved'}")
        if ok:
            passed = max(passed, n)
        else:
            failed = n if failed is None else min(failed, n)
        if failed is not None and failed == passed + 1:
            break
        if ok and n >= max_accelerators:
            break
        if ok:
            n = n + 1 if failed is None else (n + failed) // 2
        else:
            if n == 1:
                break
            n = max(1, (passed + n) // 2 if passed else n // 2)
        if n <= passed or (failed is not None and n >= failed):
            break
    result.accelerators = passed
    result.capped = passed >= max_accelerators
    return result


# -- presets ---------------------------------------------------------------------------------------
RESNET50 = {"record_bytes": 114_660, "batch": 400, "step_s": 400 / (1607 / TARGET_UTILISATION)}
CTR = {"batch": 1024, "step_s": 0.020}


def _written_once(directory: str, name: str, records: int, write: Callable[[Any, Any, int], None]) -> list[str]:
    """Four shards of ``records`` records for preset ``name`` in ``directory``, written once
    (``write(writer, rng, count)`` fills one shard) and reused while their marker stands."""
    import numpy as np  # noqa: PLC0415

    import shardfeed as sf  # noqa: PLC0415

    files = [os.path.join(directory, f"{name}-{i:05d}-of-00004.tfrecord") for i in range(4)]
    marker = os.path.join(directory, f"READY-{name}-{records}")
    if os.path.exists(marker):
        return files
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-records // len(files))
    for f in files:
        with sf.TFRecordWriter(f) as w:
            write(w, rng, per)
    open(marker, "w").close()
    return files


def _resnet50_shard(w: Any, rng: Any, n: int) -> None:
    from ..formats.example_encode import encode_example  # noqa: PLC0415

    image_bytes = RESNET50["record_bytes"] - 60  # the Example's framing and label take the rest
    for j in range(n):
        w.write(encode_example({"image/encoded": rng.bytes(image_bytes), "image/class/label": [j % 1000]}))


def _ctr_shard(w: Any, rng: Any, n: int) -> None:
    import numpy as np  # noqa: PLC0415

    from ..formats.example_encode import encode_example  # noqa: PLC0415

    dense = rng.normal(size=(n, 13)).astype(np.float32)
    cats = rng.integers(0, 1 << 32, size=(n, 26))
    for j in range(n):
        ex: dict[str, Any] = {"label": [int(j % 2)], "ids": [int(x) for x in cats[j, :3]]}
        ex.update({f"I{i + 1}": [float(dense[j, i])] for i in range(13)})
        ex.update({f"C{i + 1}": [f"{int(cats[j, i]):08x}".encode()] for i in range(26)})
        w.write(encode_example(ex))


def preset(name: str, directory: str, quick: bool) -> tuple[list[str], dict, int, float]:
    """``(files, spec, batch size, step seconds)`` of a preset, its data written once to
    ``directory``."""
    import shardfeed as sf  # noqa: PLC0415

    if name == "resnet50":
        files = _written_once(directory, "resnet50", 800 if quick else 4000, _resnet50_shard)
        spec = {"image/encoded": sf.FixedLen("bytes"), "image/class/label": sf.FixedLen("int64")}
        return files, spec, RESNET50["batch"], RESNET50["step_s"]
    if name == "ctr":
        files = _written_once(directory, "ctr", 20_000 if quick else 200_000, _ctr_shard)
        spec: dict[str, Any] = {"label": sf.FixedLen("int64"), "ids": sf.VarLen("int64")}
        spec.update({f"I{i}": sf.FixedLen("float32") for i in range(1, 14)})
        spec.update({f"C{i}": sf.FixedLen("bytes") for i in range(1, 27)})
        return files, spec, CTR["batch"], CTR["step_s"]
    raise ValueError(f"unknown preset {name!r}: resnet50 or ctr")


def _tf_pipeline(files: list[str], spec: dict, batch: int) -> Callable[[], Any] | None:
    """tf.data on the same files (TFRecordDataset, repeat, batch, parse_example, prefetch),
    or None without TensorFlow."""
    try:
        import tensorflow as tf  # noqa: PLC0415 - optional, heavy
    except ImportError:
        return None
    from ..formats.spec import BYTES, FixedLen, VarLen  # noqa: PLC0415

    def tf_spec(s: Any) -> Any:
        dtype = {BYTES: tf.string, "float32": tf.float32, "int64": tf.int64}[s.dtype]
        if isinstance(s, FixedLen):
            return tf.io.FixedLenFeature(list(s.shape), dtype)
        if isinstance(s, VarLen):
            return tf.io.VarLenFeature(dtype)
        raise ValueError(f"no tf.data twin for {s!r}")

    features = {k: tf_spec(s) for k, s in spec.items()}

    def make() -> Any:
        ds = (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).repeat().batch(batch)
              .map(lambda x: tf.io.parse_example(x, features), num_parallel_calls=tf.data.AUTOTUNE)
              .prefetch(tf.data.AUTOTUNE))
        # each tensor's .numpy() (as the read benchmarks do): as_numpy_iterator() turns
        # string tensors into numpy far more slowly (about 200 CTR records/s here)
        for b in ds:
            yield {k: (v.values.numpy() if isinstance(v, tf.SparseTensor) else v.numpy()) for k, v in b.items()}

    return make


def _load_pipeline(target: str) -> Callable[[], Any]:
    module, _, func = target.partition(":")
    if not module or not func:
        raise ValueError(f"--pipeline wants module:function (a function returning a Dataset of batches), "
                         f"got {target!r}")
    sys.path.insert(0, os.getcwd())
    fn = getattr(importlib.import_module(module), func, None)
    if not callable(fn):
        raise ValueError(f"--pipeline {target}: {module} has no function {func!r}")
    return fn


def cmd_bench_feed(args: Any) -> int:
    """``shardfeed bench feed``: the presets (or ``--pipeline``), shardfeed and tf.data."""
    import json  # noqa: PLC0415

    import shardfeed as sf  # noqa: PLC0415

    seconds = args.duration if args.duration else (1.5 if args.quick else 5.0)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    results: list[FeedResult] = []
    if args.pipeline:
        if not args.step_ms:
            raise ValueError("--pipeline needs --step-ms (one accelerator's step time)")
        results.append(feed_rate(_load_pipeline(args.pipeline), args.step_ms / 1e3, args.batch_size,
                                 name=args.pipeline, seconds=seconds, progress=say))
    else:
        directory = os.path.join(os.path.dirname(os.path.abspath(args.json)), "feed-data")
        for name in args.preset or ["resnet50", "ctr"]:
            files, spec, batch, step = preset(name, directory, args.quick)
            step = args.step_ms / 1e3 if args.step_ms else step
            batch = args.batch_size or batch

            def make(files: list[str] = files, spec: dict = spec, batch: int = batch) -> Any:
                return sf.read_tfrecord(files, spec=spec).repeat().batch(batch).prefetch(2)

            results.append(feed_rate(make, step, batch, name=f"{name}: shardfeed", seconds=seconds, progress=say))
            tf_make = _tf_pipeline(files, spec, batch)
            if tf_make is not None:
                results.append(feed_rate(tf_make, step, batch, name=f"{name}: tf.data", seconds=seconds,
                                         progress=say))
    cores = os.cpu_count() or 1
    print(f"accelerators kept at >= {TARGET_UTILISATION:.0%} utilisation (MLPerf Storage's rule), {cores} cores")
    print(f"{'pipeline':28s} {'batch':>6s} {'step':>9s} {'samples/s alone':>16s} {'accelerators':>13s} "
          f"{'per core':>9s}")
    for r in results:
        fed = f"{'>=' if r.capped else ''}{r.accelerators}"
        print(f"{r.name:28s} {r.batch_size:6d} {r.step_s * 1e3:7.1f}ms {r.pipeline_samples_per_s:16,.0f} "
              f"{fed:>13s} {r.per_core:9.2f}")
    by_name = {r.name: r for r in results}
    for r in results:
        if r.name.endswith(": shardfeed"):
            tf_r = by_name.get(r.name.replace(": shardfeed", ": tf.data"))
            if tf_r is not None and tf_r.accelerators:
                print(f"{r.name.split(':')[0]}: shardfeed feeds {r.accelerators / tf_r.accelerators:.2f}x the "
                      "accelerators tf.data feeds")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"target": TARGET_UTILISATION, "cores": cores, "quick": bool(args.quick),
                   "results": [r.to_dict() for r in results]}, f, indent=1)
    print(f"wrote {args.json}")
    return 0

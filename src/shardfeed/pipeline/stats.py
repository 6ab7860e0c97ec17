"""Where a pipeline's time went: per-stage counters and a one-line verdict.

Every stage counts the elements and bytes it delivered and the time spent inside its
``next`` as its consumer saw it (``inclusive_s``). A synchronous stage's own busy time is
that minus its upstream's inclusive time; a threaded stage (prefetch, parallel map,
parallel interleave) reports the time its workers spent working (``work_s``) and how many
worked at once. The consumer's wait is the time the training loop spent inside
``next(iterator)``: when that is a large part of the wall time, training is input-bound.

Two more measurements cost nothing per element: the consumer's waits that took at least
:data:`WAIT_MIN_S` go into a histogram (one comparison per ``next``), and every
:data:`CPU_SAMPLE_S` or so the iterator reads ``time.thread_time()`` of the consumer's
thread around one gap between two ``next`` calls, so that the consumer's CPU time outside
``next`` can be compared with its wall time there (a trainer thread that holds less CPU
than wall time is waiting: on the GIL held by pipeline threads, or on something else).
:mod:`shardfeed.pipeline.remedy` turns these numbers into the fix the verdict names.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..storage.counters import IOCounters
from .policy import ErrorLog
from .remedy import INPUT_BOUND_WAIT_FRACTION, Remedy, choose_remedy

logger = logging.getLogger(__name__)

WAIT_MIN_S = 1e-4
"""Consumer waits shorter than this (an element that was ready) are not put in the histogram."""

WAIT_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
"""Upper bounds (seconds) of the consumer wait histogram's buckets; one more holds the rest."""

CPU_SAMPLE_S = 0.005
"""How often (wall seconds) the iterator samples the consumer thread's CPU time."""

__all__ = ["CPU_SAMPLE_S", "INPUT_BOUND_WAIT_FRACTION", "PipelineStats", "Remedy", "StageStats", "WAIT_BOUNDS_S",
           "WAIT_MIN_S"]


@dataclass
class StageStats:
    """Counters of one stage (one per dataset in the chain, shared by its copies)."""

    name: str
    elements: int = 0
    bytes: int = 0
    inclusive_s: float = 0.0
    work_s: float = 0.0
    # a threaded stage whose elements also pass one thread in order (the fused batch's
    # reader: the frames, the objects, waiting for the parse it needs next): the time its
    # consumer waited on it, a floor under the stage's time per worker however many parse
    # beside it
    serial_s: float = 0.0
    parallelism: int = 1
    threaded: bool = False
    includes_upstream: bool = False  # its workers' time includes pulling from its upstream (prefetch)
    upstream: list["StageStats"] = field(default_factory=list, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    queue_fill_sum: float = 0.0
    queue_samples: int = 0
    mix_share_sum: float = 0.0  # per batch: the largest share of its records from one file
    mix_batches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # stage-specific counters (mix: "drawn" per input)

    def add_work(self, seconds: float) -> None:
        with self.lock:
            self.work_s += seconds

    def sample_queue(self, fraction: float) -> None:
        """Record how full this stage's queue was when its consumer came for more."""
        self.queue_fill_sum += fraction
        self.queue_samples += 1

    def add_mix(self, sources: Any) -> None:
        """Record how mixed one batch is: ``sources`` says which file each record came from."""
        counts = np.bincount(sources)
        self.mix_share_sum += float(counts.max()) / len(sources)
        self.mix_batches += 1

    @property
    def largest_file_share(self) -> float | None:
        """Mean over batches of the largest fraction of a batch's records that came from one
        file (``None``: not measured): 1.0 means every batch came from a single file (not
        mixed at all); a well-shuffled pass over F equal files tends to about 1/F plus noise."""
        return self.mix_share_sum / self.mix_batches if self.mix_batches else None

    @property
    def fraction_of_queue_full(self) -> float | None:
        """Mean fill of the stage's queue as its consumer found it (``None``: no queue).
        Near 0: the consumer drains it as fast as it fills (input-bound); near 1: input
        is ready ahead of need."""
        return self.queue_fill_sum / self.queue_samples if self.queue_samples else None

    @property
    def busy_s(self) -> float:
        if self.threaded:
            if self.includes_upstream:  # a buffer: its workers' time is its upstream's, less that
                return max(0.0, self.work_s - sum(u.inclusive_s for u in self.upstream))
            return self.work_s
        # a synchronous stage's time includes the time it waited on its upstream stages
        return max(0.0, self.inclusive_s - sum(u.inclusive_s for u in self.upstream))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name, "elements": self.elements, "bytes": self.bytes,
            "busy_s": round(self.busy_s, 6), "parallelism": self.parallelism,
            "threaded": self.threaded,
        }
        if self.serial_s:
            out["serial_s"] = round(self.serial_s, 6)
        if self.queue_samples:
            out["fraction_of_queue_full"] = round(self.fraction_of_queue_full, 4)
        if self.mix_batches:
            out["largest_file_share"] = round(self.largest_file_share, 4)
        out.update((k, list(v) if isinstance(v, list) else v) for k, v in self.extra.items())
        return out


class PipelineStats:
    """The stages of one iterator, in pipeline order (source first), and the consumer."""

    def __init__(self) -> None:
        self.stages: list[StageStats] = []
        self._by_key: dict[Any, StageStats] = {}
        self.consumer_wait_s = 0.0
        self.consumer_elements = 0
        self.storage = IOCounters()  # what reading remote objects cost this pass
        self.errors = ErrorLog()  # what on_error skipped this pass
        self.started: float | None = None
        self.last: float | None = None
        # consumer waits of at least WAIT_MIN_S, by WAIT_BOUNDS_S bucket
        self.waits = [0] * (len(WAIT_BOUNDS_S) + 1)
        self.wait_max_s = 0.0
        self.waits_sum_s = 0.0
        # the consumer thread's CPU time in sampled gaps between two next() calls
        self.cpu_sampled_s = 0.0
        self.cpu_sampled_wall_s = 0.0
        # CPU time the process's other threads used in those gaps (pipeline threads holding the GIL)
        self.cpu_sampled_others_s = 0.0
        self.cpu_samples = 0
        self.cpu_next = 0.0  # perf_counter time after which the next gap is sampled
        self.cpu_open = False
        self._cpu_t0 = 0.0
        self._cpu_c0 = 0.0
        self._cpu_p0 = 0.0
        self._cpu_thread = 0

    # -- what the iterator records (kept cheap: it runs on every next()) ----------------
    def add_wait(self, seconds: float) -> None:
        """Count one consumer wait of ``seconds`` (the iterator calls it for waits >= WAIT_MIN_S)."""
        self.waits[bisect_left(WAIT_BOUNDS_S, seconds)] += 1
        self.waits_sum_s += seconds
        if seconds > self.wait_max_s:
            self.wait_max_s = seconds

    def open_cpu_sample(self, now: float) -> None:
        """Start a CPU sample of the consumer's thread at ``now`` (the end of a ``next``)."""
        self._cpu_t0 = now
        self._cpu_thread = threading.get_ident()
        self._cpu_c0 = time.thread_time()
        self._cpu_p0 = time.process_time()
        self.cpu_open = True
        self.cpu_next = now + CPU_SAMPLE_S

    def close_cpu_sample(self, now: float) -> None:
        """End the open CPU sample at ``now`` (the start of the next ``next``)."""
        cpu = time.thread_time()
        proc = time.process_time()
        self.cpu_open = False
        if threading.get_ident() == self._cpu_thread:  # thread_time is per thread
            own = cpu - self._cpu_c0
            self.cpu_sampled_s += own
            self.cpu_sampled_others_s += max(0.0, proc - self._cpu_p0 - own)
            self.cpu_sampled_wall_s += now - self._cpu_t0
            self.cpu_samples += 1

    @property
    def consumer_own_s(self) -> float:
        """Wall time the consumer spent outside ``next`` (its own work: the training step)."""
        return max(0.0, self.wall_s - self.consumer_wait_s)

    @property
    def consumer_cpu_fraction(self) -> float | None:
        """The consumer thread's CPU time over its wall time outside ``next``, from the
        samples (``None``: no sample yet). Near 1: its own work ran freely; well below 1:
        it waited for something (the GIL, a device, a sleep) while outside ``next``."""
        if self.cpu_sampled_wall_s <= 0:
            return None
        return min(1.0, self.cpu_sampled_s / self.cpu_sampled_wall_s)

    @property
    def consumer_lost_to_threads(self) -> float | None:
        """Of the wall time the consumer's thread went without CPU outside ``next`` (in the
        samples), the share during which this process's other threads ran (``None``: no
        sample, or no time lost). Near 1: it waited on them (the GIL); near 0: on something
        outside the process (a sleep, a device, other processes on the cores)."""
        lost = self.cpu_sampled_wall_s - self.cpu_sampled_s
        if self.cpu_sampled_wall_s <= 0 or lost <= 1e-9:
            return None
        return min(1.0, self.cpu_sampled_others_s / lost)

    @property
    def long_waits(self) -> int:
        """``next`` calls whose wait was over a millisecond."""
        # bucket i + 1 holds (bounds[i], bounds[i + 1]]
        return sum(n for n, lower in zip(self.waits[1:], WAIT_BOUNDS_S) if lower >= 0.001)

    @property
    def waited_calls(self) -> int:
        """``next`` calls whose wait was at least WAIT_MIN_S."""
        return sum(self.waits)

    def stage(self, key: Any, name: str) -> StageStats:
        st = self._by_key.get(key)
        if st is None:
            st = StageStats(f"{len(self.stages)}:{name}")
            self._by_key[key] = st
            self.stages.append(st)
        return st

    @property
    def wall_s(self) -> float:
        if self.started is None:
            return 0.0
        return (self.last or time.perf_counter()) - self.started

    @property
    def wait_fraction(self) -> float:
        wall = self.wall_s
        return self.consumer_wait_s / wall if wall > 0 else 0.0

    def slowest_stage(self) -> StageStats | None:
        if not self.stages:
            return None
        return max(self.stages, key=lambda s: s.busy_s / max(1, s.parallelism))

    def remedy(self) -> Remedy:
        """Which known fix applies and how much it should gain, from this pass's numbers
        (see :mod:`shardfeed.pipeline.remedy`)."""
        return choose_remedy(self)

    def verdict(self) -> str:
        """One line: input-bound or not, the slowest stage, and the fix with its expected gain."""
        if self.started is None:
            return "not started: no element was taken yet"
        frac = self.wait_fraction
        slow = self.slowest_stage()
        slow_txt = (f"; slowest stage {slow.name} ({slow.busy_s:.3f} s busy over {slow.parallelism} worker(s))"
                    if slow else "")
        fix = self.remedy()
        fix_txt = f"; fix ({fix.id}): {fix.text} (expected {fix.expected_gain:.2f}x the elements/s)"
        if frac >= INPUT_BOUND_WAIT_FRACTION:
            return f"input-bound: the consumer waited {frac:.0%} of {self.wall_s:.2f} s{slow_txt}{fix_txt}"
        return f"not input-bound: the consumer waited {frac:.1%} of {self.wall_s:.2f} s{slow_txt}{fix_txt}"

    def consumer_dict(self) -> dict[str, Any]:
        """The consumer's own numbers: time outside ``next``, its CPU share there, its waits."""
        cpu, covered = self.consumer_cpu_fraction, self.consumer_lost_to_threads
        return {
            "own_s": round(self.consumer_own_s, 6),
            "cpu_fraction": None if cpu is None else round(cpu, 4), "cpu_samples": self.cpu_samples,
            "lost_to_threads": None if covered is None else round(covered, 4),
            "waits": {"min_s": WAIT_MIN_S, "bounds_s": list(WAIT_BOUNDS_S), "counts": list(self.waits),
                      "sum_s": round(self.waits_sum_s, 6), "max_s": round(self.wait_max_s, 6)},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 6), "consumer_wait_s": round(self.consumer_wait_s, 6),
            "consumer_wait_fraction": round(self.wait_fraction, 6), "elements": self.consumer_elements,
            "input_bound": self.wait_fraction >= INPUT_BOUND_WAIT_FRACTION and self.started is not None,
            "verdict": self.verdict(), "remedy": self.remedy().to_dict(), "consumer": self.consumer_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "storage": self.storage.to_dict(), "skipped": self.errors.to_dict(),
        }

    def to_json(self, path: str | None = None) -> str:
        """The statistics as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def write_tensorboard(self, logdir: str, step: int) -> bool:
        """Write scalars with ``tf.summary`` when TensorFlow and TensorBoard are installed;
        False (and nothing written) otherwise."""
        from .tensorboard import write_scalars  # noqa: PLC0415 - the one TensorBoard writer

        scalars = {"shardfeed/consumer_wait_fraction": self.wait_fraction}
        for s in self.stages:
            scalars[f"shardfeed/{s.name}/busy_s"] = s.busy_s
            scalars[f"shardfeed/{s.name}/elements"] = s.elements
            if s.queue_samples:  # as PAI's queue summaries: how full each queue ran
                scalars[f"shardfeed/{s.name}/fraction_of_queue_full"] = s.fraction_of_queue_full
        return write_scalars(scalars, step, logdir=logdir, what="the pipeline's statistics")

    def __str__(self) -> str:
        lines = [f"{'stage':<28}{'elements':>12}{'MB':>10}{'busy s':>10}{'workers':>9}"]
        for s in self.stages:
            lines.append(f"{s.name:<28}{s.elements:>12}{s.bytes / 1e6:>10.1f}{s.busy_s:>10.3f}{s.parallelism:>9}")
        st = self.storage
        if st.requests or st.cache_hits or st.cache_bypassed:
            lines.append(f"storage: {st.bytes_fetched / 1e6:.1f} MB in {st.requests} GETs ({st.retries} retries, "
                         f"{st.mb_per_s:.1f} MB/s); cache {st.cache_hits} hits, {st.cache_misses} misses, "
                         f"{st.cache_bypassed} read around it")
            median, p90 = st.latency_quantile(0.5), st.latency_quantile(0.9)
            if median is not None and p90 is not None:
                lines.append(f"storage latency: median <= {median * 1e3:g} ms, 90% <= "
                             f"{p90 * 1e3:g} ms over {st.latency_count} requests; requests in "
                             f"flight {st.waiting_s:.2f} s")
        for s in self.stages:
            if s.mix_batches:
                lines.append(f"mixing ({s.name}): on average {s.largest_file_share:.0%} of a batch's records came "
                             f"from one file ({s.mix_batches} batches)")
        if self.errors.total:
            by = ", ".join(f"{n} in {stage}" for stage, n in sorted(self.errors.by_stage.items()))
            lines.append(f"skipped: {self.errors.total} errors ({by}); see to_dict()['skipped']")
        if self.started is not None:
            cpu = self.consumer_cpu_fraction
            cpu_txt = f", CPU for {cpu:.0%} of it" if cpu is not None else ""
            lines.append(f"consumer: {self.consumer_own_s:.2f} s outside next(){cpu_txt}; {self.long_waits} of "
                         f"{self.consumer_elements + 1} next() calls waited 1 ms or more (longest "
                         f"{self.wait_max_s * 1e3:.0f} ms)")
        lines.append(self.verdict())
        return "\n".join(lines)

    __repr__ = __str__

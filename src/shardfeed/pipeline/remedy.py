"""Which fix a pass's statistics point to, and how much it should gain.

:func:`choose_remedy` reads one pass's :class:`~shardfeed.pipeline.stats.PipelineStats`
and names one of the known remedies, checked in this order (the first that applies wins):

``in_subprocess``
    The trainer thread is starved: outside ``next`` (in its own step) the consumer thread
    had CPU for less than :data:`STARVED_CPU_FRACTION` of the wall time, the time it lost
    is at least :data:`MIN_SHARE` of the pass, and the pipeline's threads worked at least
    that long meanwhile, or the process's other threads ran for at least
    :data:`GIL_COVERED_SHARE` of the time it went without CPU (they held the GIL it waited
    for; a sleep, a device or other processes leave them idle). Fix: run the Python stages in
    their own process, ``Dataset.in_subprocess()``. Gain: the step gets the lost time back,
    ``wall / (wall - lost)`` with ``lost = own * (1 - cpu_fraction)``.
``input_fast_enough``
    The consumer waited less than :data:`INPUT_BOUND_WAIT_FRACTION` of the pass: look at
    the model. Gain: the most any input change can give, ``wall / (wall - wait)``.
``cache``
    Input-bound, and storage requests (GET or HEAD) were in flight at least
    :data:`STORAGE_SHARE` of the pass with no local cache in use. Fix: ``cache_dir=``.
    Gain from the second epoch: ``wall / (wall - min(wait, storage waiting))``.
``larger_prefetch``
    Input-bound, but the slowest stage was busy (per worker) less than
    :data:`SATURATED_UTILIZATION` of the pass and fewer than :data:`BURSTY_CALL_SHARE` of
    the ``next`` calls waited a millisecond or more: the stages keep up on average and the
    waits come in bursts. Fix: ``.prefetch(n)`` last, ``n`` the elements the consumer takes
    during the longest wait. Gain: ``wall / max(own, slowest stage's busy time per worker)``.
``more_parallelism``
    Input-bound with a saturated stage (a reader busy while the others idle). Fix: twice
    its workers (``num_parallel_reads`` for a reader, ``num_parallel_calls`` for a map).
    Gain: ``wall / (own + wait')``, the wait shrunk in proportion to the bottleneck's busy
    time per worker once the stage's is halved (the next slowest stage then may bound it),
    or less where the process has fewer cores than twice the workers; with as many
    workers as cores already, the fix is more cores for the input (gain 1.0 here).

Gains are estimates from this pass's own numbers (a factor on the consumer's elements per
second; 1.0 means none); ``gain_basis`` says how each was computed and from what.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .stats import PipelineStats, StageStats

INPUT_BOUND_WAIT_FRACTION = 0.10
"""The consumer waiting this share of the wall time or more means input-bound."""

STARVED_CPU_FRACTION = 0.75
"""Consumer CPU over wall outside ``next`` below this: the trainer thread is starved."""

MIN_SHARE = 0.10
"""A remedy for lost or waited time must be about at least this share of the pass."""

GIL_COVERED_SHARE = 0.5
"""The consumer is starved by the pipeline's threads when they ran for at least this share
of the time its thread went without CPU outside ``next``."""

STORAGE_SHARE = 0.5
"""Storage requests in flight this share of the pass or more: storage latency dominates."""

SATURATED_UTILIZATION = 0.6
"""A stage busy per worker this share of the pass or more is saturated."""

BURSTY_CALL_SHARE = 0.5
"""Fewer than this share of ``next`` calls waiting >= 1 ms: the waits are bursts."""

READER_KINDS = frozenset({"tfrecord", "text", "csv", "table", "files", "duckdb", "postgresql", "odps", "source",
                          "from_list", "from_iterable", "interleave", "mix", "batch", "unbatch"})
CALL_KINDS = frozenset({"map", "filter", "decode_images"})


@dataclass(frozen=True)
class Remedy:
    """One fix: ``id`` (stable: ``in_subprocess``, ``input_fast_enough``, ``cache``,
    ``larger_prefetch``, ``more_parallelism``, ``not_started``), ``text`` (a sentence for a
    person), ``expected_gain`` (factor on the consumer's elements/s), ``gain_basis`` (how
    it was computed), ``stage`` (the stage it is about, if one) and ``measured`` (the
    numbers it used)."""

    id: str
    text: str
    expected_gain: float
    gain_basis: str
    stage: str | None = None
    measured: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The remedy as a JSON-able dict (the ``remedy`` entry of ``stats().to_dict()``)."""
        return {"id": self.id, "text": self.text, "expected_gain": round(self.expected_gain, 3),
                "gain_basis": self.gain_basis, "stage": self.stage,
                "measured": {k: round(v, 6) if isinstance(v, float) else v for k, v in self.measured.items()}}


def _per_worker(s: "StageStats") -> float:
    """The stage's busy time per worker: its work spread over its workers, or the time of
    the one thread every element passes (``serial_s``), whichever is longer."""
    return max(s.busy_s / max(1, s.parallelism), s.serial_s if s.threaded else 0.0)


def _kind(s: "StageStats") -> str:
    return s.name.split(":", 1)[-1].rsplit("/", 1)[-1]


def _ratio(num: float, den: float) -> float:
    return num / den if den > 1e-12 else 1.0


def choose_remedy(st: "PipelineStats") -> Remedy:
    """The remedy this pass's numbers point to (see the module docstring)."""
    if st.started is None:
        return Remedy("not_started", "take some elements first: nothing was measured yet", 1.0, "nothing measured")
    wall, wait = st.wall_s, st.consumer_wait_s
    own = max(0.0, wall - wait)
    frac = _ratio(wait, wall) if wall > 0 else 0.0

    starved = _starved(st, wall, own)
    if starved is not None:
        return starved
    if frac < INPUT_BOUND_WAIT_FRACTION:
        return Remedy(
            "input_fast_enough",
            f"the input is fast enough: look at the model (the consumer waited {frac:.1%} of the pass; "
            "faster input cannot give more than the expected gain)",
            _ratio(wall, own), "wall / (wall - wait): the most any input change can give, the whole wait removed",
            measured={"wall_s": wall, "wait_s": wait})
    for check in (_cache, _prefetch):
        found = check(st, wall, wait, own)
        if found is not None:
            return found
    return _parallelism(st, wall, wait, own)


def _starved(st: "PipelineStats", wall: float, own: float) -> Remedy | None:
    cpu = st.consumer_cpu_fraction
    if cpu is None or own < MIN_SHARE * wall or cpu >= STARVED_CPU_FRACTION:
        return None
    lost = own * (1.0 - cpu)
    threads = sum(s.work_s for s in st.stages if s.threaded)
    # Pipeline threads that worked as long as the consumer lost explain the loss. But their work
    # is no bound on it: each time the consumer gives the GIL up it may wait a whole switch
    # interval (5 ms) to get it back, so a 1 ms map starves a Python step of more than the map's
    # time. Then what tells the GIL from a sleep, a device or other processes on the cores is
    # whether this process's other threads ran while the consumer had no CPU.
    covered = st.consumer_lost_to_threads
    by_gil = threads >= lost or (threads > 0 and covered is not None and covered >= GIL_COVERED_SHARE)
    if lost < MIN_SHARE * wall or not by_gil:
        return None
    return Remedy(
        "in_subprocess",
        f"move the Python stages off the trainer: end the chain with .in_subprocess() (Dataset.in_subprocess()); "
        f"outside next() the consumer thread had CPU for only {cpu:.0%} of its {own:.2f} s while pipeline "
        f"threads worked {threads:.2f} s (they held the GIL it waited for)",
        _ratio(wall, wall - lost),
        f"wall / (wall - lost): lost = own x (1 - cpu_fraction) = {own:.3f} x (1 - {cpu:.3f}) = {lost:.3f} s of "
        f"{wall:.3f} s the step would not spend waiting",
        measured={"wall_s": wall, "own_s": own, "cpu_fraction": cpu, "lost_s": lost, "thread_work_s": threads,
                  "lost_to_threads": covered, "cpu_samples": st.cpu_samples})


def _cache(st: "PipelineStats", wall: float, wait: float, own: float) -> Remedy | None:
    io = st.storage
    if io.waiting_s < STORAGE_SHARE * wall or io.cache_hits or io.cache_misses or io.cache_bypassed:
        return None
    saved = min(wait, io.waiting_s)
    median = io.latency_quantile(0.5)
    n = io.latency_count
    return Remedy(
        "cache",
        f"cache the objects on local disk: read_tfrecord(..., cache_dir=...); storage requests were in flight "
        f"{io.waiting_s / wall:.0%} of the pass ({n} requests, median latency <= {median * 1e3:.0f} ms): "
        "from the second epoch they are read locally",
        _ratio(wall, wall - saved),
        f"wall / (wall - min(wait, storage waiting)) = {wall:.3f} / ({wall:.3f} - {saved:.3f}), from the second "
        "epoch on (the first still downloads)",
        measured={"wall_s": wall, "wait_s": wait, "storage_waiting_s": io.waiting_s, "requests": n,
                  "median_latency_le_s": median})


def _prefetch(st: "PipelineStats", wall: float, wait: float, own: float) -> Remedy | None:
    slow = _bottleneck(st)
    per = _per_worker(slow) if slow is not None else 0.0
    calls = st.consumer_elements + 1
    long_waits = st.long_waits
    if per >= SATURATED_UTILIZATION * wall or long_waits >= BURSTY_CALL_SHARE * calls:
        return None
    rate = _ratio(st.consumer_elements, own) if own > 0 else float(st.consumer_elements)
    size = max(2, math.ceil(st.wait_max_s * rate) + 1)
    return Remedy(
        "larger_prefetch",
        f"a larger prefetch: end the chain with .prefetch({size}); the consumer waited a millisecond or more in "
        f"{long_waits} of {calls} next() calls (longest {st.wait_max_s * 1e3:.0f} ms) while the busiest stage "
        f"was busy {per / wall:.0%} of the pass: {size} elements cover the longest wait at the consumer's pace "
        f"({rate:.0f} elements/s)",
        _ratio(wall, max(own, per)),
        f"wall / max(own, busiest stage's busy time per worker) = {wall:.3f} / max({own:.3f}, {per:.3f}): the "
        "stages keep up on average, and the waits go once the buffer absorbs the bursts",
        stage=slow.name if slow is not None else None,
        measured={"wall_s": wall, "wait_s": wait, "own_s": own, "long_waits": long_waits, "calls": calls,
                  "wait_max_s": st.wait_max_s, "busiest_per_worker_s": per, "buffer": size})


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _bottleneck(st: "PipelineStats") -> "StageStats | None":
    return max(st.stages, key=_per_worker) if st.stages else None


def _parallelism(st: "PipelineStats", wall: float, wait: float, own: float) -> Remedy:
    slow = _bottleneck(st)
    if slow is None or _per_worker(slow) <= 0:
        return Remedy("more_parallelism", "more parallelism upstream: no stage reported busy time", 1.0,
                      "no stage measured", measured={"wall_s": wall, "wait_s": wait})
    per = _per_worker(slow)
    n = max(1, slow.parallelism)
    others = max((_per_worker(s) for s in st.stages if s is not slow), default=0.0)
    cores = _cores()
    room = min(2 * n, max(cores, n)) / n  # more workers than cores run no faster
    if room <= 1:
        return Remedy(
            "more_parallelism",
            f"more cores for the input: stage {slow.name} was busy {per / wall:.0%} of the pass per worker with "
            f"{n} worker(s) on the {cores} core(s) this process may use, so more workers cannot help here; give "
            "the input more cores (another machine: Ray Data, or DataLoader-style readers elsewhere) or less "
            "work per element",
            1.0, f"{n} worker(s) already on {cores} core(s): twice the workers would share the same cores",
            stage=slow.name,
            measured={"wall_s": wall, "wait_s": wait, "own_s": own, "busy_per_worker_s": per, "workers": n,
                      "cores": cores, "next_busiest_per_worker_s": others})
    after = max(per / room, others)
    new_wait = wait * after / per
    kind = _kind(slow)
    if kind in CALL_KINDS:
        knob = f"num_parallel_calls={2 * n} on stage {slow.name}"
    elif kind in READER_KINDS:
        knob = (f"more read parallelism for stage {slow.name}: num_parallel_reads={2 * n} on read_tfrecord "
                f"(interleave(..., num_parallel_calls={2 * n}) over other sources), a .prefetch() after it")
    else:
        knob = f"twice the workers for stage {slow.name} (or a .prefetch() after it, to move it off the consumer)"
    return Remedy(
        "more_parallelism",
        f"{knob}: it was busy {per / wall:.0%} of the pass per worker ({n} worker(s)) while the next busiest stage "
        f"was busy {others / wall:.0%}",
        _ratio(wall, own + new_wait),
        f"wall / (own + wait x after / before) = {wall:.3f} / ({own:.3f} + {wait:.3f} x {after:.3f} / {per:.3f}): "
        "the stage's busy time per worker halved, bounded by the next busiest stage",
        stage=slow.name,
        measured={"wall_s": wall, "wait_s": wait, "own_s": own, "busy_per_worker_s": per, "workers": n,
                  "next_busiest_per_worker_s": others})

"""``mix``: draw from several datasets in seeded proportions, with exact resume.

Draw ``i`` is the ``i``-th value ``u`` of numpy's PCG64 seeded from ``(seed, epoch path)``
(as :mod:`shardfeed.pipeline.shuffle` seeds its stream); it picks the input whose slice
of the cumulative weights of the inputs still live holds ``u * total``. So the choice
depends only on the seed, the pass, ``i`` and which inputs are live, never on the data,
and a restore finds the stream at draw ``i`` in constant time (``advance``), whatever
the position. ``i`` counts the elements delivered: when the chosen input turns out to be
empty and the mix goes on (``"drop"``), the same ``u`` chooses again among the others,
with their weights renormalised.

What an input that runs out does (``on_empty``):

- ``"stop"`` (the default): the mix ends at the first draw of an empty input, so every
  element delivered came in the proportions asked for (``tf.data``'s
  ``stop_on_empty_dataset=True``, the setting TensorFlow recommends);
- ``"drop"``: the input leaves the draw and the others go on, their weights renormalised,
  until all are empty: every element of every input is delivered once, but the tail of
  the pass is no longer in the proportions asked for (``stop_on_empty_dataset=False``);
- ``"cycle"``: the input starts a new pass (as ``ds.repeat()`` would: a new epoch, so a
  seeded shuffle in it reshuffles) and the proportions hold forever; an input whose new
  pass is empty at once is dropped, so the mix of inputs that are all empty ends.

The state is the seed, the draw count, and per input its own state, whether it is
exhausted, how many elements it gave and (``"cycle"``) which of its passes it is in.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .dataset import Dataset, dataset_list
from .node import Build, Node
from .shuffle import derive_seed

ON_EMPTY = ("stop", "drop", "cycle")
_DRAWS = 4096  # draws taken from the generator at once


def _check_weights(weights: Any, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    if isinstance(weights, (str, bytes, Mapping)) or not hasattr(weights, "__len__"):
        raise TypeError(f"mix weights must be a sequence of {n} positive numbers (one per dataset), "
                        f"got {type(weights).__name__}")
    out = []
    for i, w in enumerate(list(weights)):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise TypeError(f"mix weights[{i}] must be a number, got {w!r}")
        try:
            f = float(w)
        except OverflowError:  # an int past the largest float
            f = math.inf
        if not math.isfinite(f) or f <= 0:
            raise ValueError(f"mix weights[{i}] must be positive and finite, got {w!r}; "
                             "leave a dataset out of the list to give it no share")
        out.append(f)
    if len(out) != n:
        raise ValueError(f"mix got {n} datasets but {len(out)} weights: give one weight per dataset "
                         "(or none, for equal shares)")
    return out


def _on_empty_of(on_empty: str | None, stop_on_empty_dataset: bool | None) -> str:
    if on_empty is not None and on_empty not in ON_EMPTY:
        raise ValueError(f"on_empty must be one of {ON_EMPTY}, got {on_empty!r}")
    if stop_on_empty_dataset is None:
        return on_empty or "stop"
    if not isinstance(stop_on_empty_dataset, (bool, np.bool_)):
        raise TypeError(f"stop_on_empty_dataset must be True or False, got {stop_on_empty_dataset!r}")
    tf_mode = "stop" if stop_on_empty_dataset else "drop"
    if on_empty is not None and on_empty != tf_mode:
        raise ValueError(f"on_empty={on_empty!r} and stop_on_empty_dataset={stop_on_empty_dataset!r} disagree: "
                         "give on_empty only")
    return tf_mode


def _same_spec(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    try:
        return a is b or (a.keys() == b.keys() and all(bool(a[k] == b[k]) for k in a))
    except (TypeError, ValueError):  # a default that is an array: equal or not, parse apart
        return False


class MixDataset(Dataset):
    """Elements drawn from ``datasets`` at random in proportion to ``weights`` (see :func:`mix`)."""

    kind = "mix"

    def __init__(self, datasets: Sequence[Dataset], weights: Sequence[float] | None = None,
                 seed: int | None = None, on_empty: str | None = None, stop_on_empty_dataset: bool | None = None,
                 rerandomize_each_iteration: bool = True) -> None:
        dataset_list(datasets, "mix", ": mix([ds_a, ds_b], ...)")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        self.datasets = list(datasets)
        self.weights = _check_weights(weights, len(self.datasets))
        self.seed = seed
        self.on_empty = _on_empty_of(on_empty, stop_on_empty_dataset)
        self.rerandomize_each_iteration = bool(rerandomize_each_iteration)

    def cardinality(self) -> int | float | None:
        """``"drop"``: the sum of the inputs' (every element is delivered once);
        ``"cycle"``: ``math.inf`` once some input is known not to be empty; ``"stop"``:
        ``math.inf`` when every input is endless, else ``None`` (where the first input
        runs out depends on the draws) unless there is only one input."""
        ns = [ds.cardinality() for ds in self.datasets]
        if self.on_empty == "drop":
            if math.inf in ns:
                return math.inf
            return None if None in ns else sum(n for n in ns if n is not None)
        if self.on_empty == "cycle":
            if any(n is not None and n > 0 for n in ns):
                return math.inf
            return 0 if all(n == 0 for n in ns) else None
        if len(ns) == 1 or all(n == math.inf for n in ns):
            return ns[0]
        return None

    def _deferred_spec(self) -> Mapping[str, Any] | None:
        """Serialized records pass through to a following ``batch`` only when every input
        has the same spec and the same error policy; otherwise each input parses its own."""
        specs = [ds._deferred_spec() for ds in self.datasets]
        first = specs[0]
        if first is None or any(s is None or not _same_spec(first, s) for s in specs[1:]):
            return None
        policies = [ds._deferred_policy() for ds in self.datasets]
        key = [(getattr(p, "mode", None), getattr(p, "handler", None)) for p in policies]
        if any(k != key[0] for k in key[1:]):
            return None
        return first

    def _deferred_policy(self) -> Any:
        return self.datasets[0]._deferred_policy() if self._deferred_spec() is not None else None

    def _split(self, index: int, count: int, threads: int | None = None) -> "MixDataset":
        """Reader ``index`` of ``count``'s share: the mix of each input's share, each split
        near its source (on spans where it reads them), never the mixed elements dealt
        (which would have every reader read every input). The same weights and mode; the
        choices seeded per reader from ``seed`` (each reader makes its own without one)."""
        from .slicing import split_near_source  # noqa: PLC0415 - slicing imports nothing of this

        seed = self.seed
        if seed is not None and count > 1:
            seed = int(np.random.SeedSequence([seed, index, count]).generate_state(1, np.uint64)[0] >> np.uint64(1))
        return MixDataset([split_near_source(ds, index, count, threads) for ds in self.datasets], self.weights, seed,
                          self.on_empty, None, self.rerandomize_each_iteration)

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _MixNode(b, self, state)

    def __repr__(self) -> str:
        return (f"mix([{', '.join(repr(d) for d in self.datasets)}], weights={self.weights}, "
                f"on_empty={self.on_empty!r})")


class _MixNode(Node):
    def __init__(self, b: Build, ds: MixDataset, state: Mapping[str, Any] | None) -> None:
        n = len(ds.datasets)
        self.ds = ds
        self.b = b.but(raw=b.raw and ds._deferred_spec() is not None)
        self.cycle = ds.on_empty == "cycle"
        if state is not None:
            if len(state["inputs"]) != n:
                raise ValueError(f"this state is of a mix of {len(state['inputs'])} datasets; this mix has {n}: "
                                 "resume with the datasets it was saved with")
            self.seed = int(state["seed"])
            self.draws = int(state["draws"])
            self.exhausted = [bool(x) for x in state["exhausted"]]
            self.drawn = [int(x) for x in state["drawn"]]
            self.passes = [int(x) for x in state["passes"]]
            self.stopped = bool(state["stopped"])
            input_states = list(state["inputs"])
        else:
            # no seed given: draw one now and keep it in the state, so a resume still matches
            self.seed = ds.seed if ds.seed is not None else secrets.randbits(63)
            self.draws = 0
            self.exhausted = [False] * n
            self.drawn = [0] * n
            self.passes = [0] * n
            self.stopped = False
            input_states = [None] * n
        self.inputs: list[Node | None] = [None] * n
        self.closed = False
        if not self.stopped:
            for k in range(n):
                if not self.exhausted[k]:
                    self.inputs[k] = self._open(k, input_states[k])
        super().__init__(b, ds, [x for x in self.inputs if x is not None])
        self.stats.extra["drawn"] = self.stats.extra.get("drawn") or [0] * n
        epoch = b.epoch if ds.rerandomize_each_iteration else ()
        self.rng = np.random.Generator(np.random.PCG64(derive_seed(self.seed, epoch)))
        start = self.draws - self.draws % _DRAWS
        self.rng.bit_generator.advance(start)  # one 64-bit step per draw: constant time
        self.block = self.rng.random(_DRAWS)
        self.choices: list[int] = []
        self._choose_from(self.draws % _DRAWS)
        b.ctx.on_close(self.close)

    def _open(self, k: int, state: Any) -> Node:
        """Input ``k``, its current pass; ``"cycle"`` gives each pass its own epoch, as ``repeat`` does."""
        b = self.b.but(epoch=self.b.epoch + (self.passes[k],)) if self.cycle else self.b
        return self.ds.datasets[k]._build(b, state)

    def _choose_from(self, di: int) -> None:
        """The choices of the draws ``di ...`` of the current block among the live inputs."""
        live = [k for k, e in enumerate(self.exhausted) if not e]
        if not live:
            self.choices = []
            return
        w = np.array([self.ds.weights[k] for k in live])
        # scaled to the largest first: weights near the float maximum would sum to inf and
        # subnormal ones lose their ratio (found from outside: 1e308 and 1e308 gave 0/100%)
        cum = np.cumsum(w / w.max())
        picks = np.searchsorted(cum, self.block[di:] * cum[-1], side="right")
        np.minimum(picks, len(live) - 1, out=picks)  # rounding at the top of the last slice
        self.choices = [0] * di + np.asarray(live)[picks].tolist()

    def _next(self) -> Any:
        if self.stopped:
            raise StopIteration
        restarted = -1  # the input restarted at this draw ("cycle"), if one was
        while True:
            if not self.choices:
                raise StopIteration  # every input is exhausted
            k = self.choices[self.draws % _DRAWS]
            try:
                x = next(self.inputs[k])  # type: ignore[arg-type]
            except StopIteration:
                self.inputs[k].close()  # type: ignore[union-attr]
                self.inputs[k] = None
                if self.ds.on_empty == "stop":
                    self.stopped = True
                    self.close()
                    self.inputs = [None] * len(self.inputs)
                    raise
                if self.cycle and k != restarted:
                    self.passes[k] += 1
                    self.inputs[k] = self._open(k, None)
                    restarted = k
                    continue
                # "drop", or a new pass that was empty at once (cycling it would never yield)
                self.exhausted[k] = True
                self._choose_from(self.draws % _DRAWS)
                continue
            self.drawn[k] += 1
            drawn = self.stats.extra["drawn"]
            if k < len(drawn):
                drawn[k] += 1
            self.draws += 1
            if self.draws % _DRAWS == 0:
                self.block = self.rng.random(_DRAWS)
                self._choose_from(0)
            return x

    def get_state(self) -> dict:
        return {"seed": self.seed, "draws": self.draws, "stopped": self.stopped,
                "exhausted": list(self.exhausted), "drawn": list(self.drawn), "passes": list(self.passes),
                "inputs": [x.get_state() if x is not None else None for x in self.inputs]}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True  # the inputs stay, so that get_state still says where they were
        for x in self.inputs:
            if x is not None:
                x.close()


def mix(datasets: Sequence[Dataset], weights: Sequence[float] | None = None, seed: int | None = None, *,
        on_empty: str | None = None, stop_on_empty_dataset: bool | None = None,
        rerandomize_each_iteration: bool = True) -> MixDataset:
    """Draw each element from one of ``datasets`` at random, dataset ``k`` with
    probability ``weights[k] / sum(weights)`` (default: equal shares), with exact resume.

    ``seed`` (an int >= 0) makes the choices the same in every run; without it one is
    drawn per pass and kept in the iterator state. Each pass (each ``iter()``, each
    ``repeat`` epoch) derives its own choices from the seed unless
    ``rerandomize_each_iteration=False``. The choice of draw ``i`` depends only on the
    seed, the pass, ``i`` and which inputs are still live, never on the data.

    ``on_empty`` says what happens when the chosen dataset has run out: ``"stop"`` (the
    default) ends the mix, so every element came in the proportions asked for;
    ``"drop"`` leaves it out and draws among the others, weights renormalised, until all
    are empty; ``"cycle"`` starts it again (a new epoch of it, as ``repeat`` would), so
    the mix never ends. ``stop_on_empty_dataset`` is TensorFlow's spelling
    (``sample_from_datasets``): ``True`` is ``"stop"``, ``False`` is ``"drop"``.

    When every dataset is a TFRecord source with the same spec and error policy, a
    following ``batch`` gets serialized records and parses each batch at once; otherwise
    each dataset parses its own elements. Raises ``TypeError``/``ValueError`` for a
    dataset that is not one, weights that are not positive finite numbers one per
    dataset, a bad ``seed`` or ``on_empty``.
    """
    return MixDataset(datasets, weights, seed, on_empty, stop_on_empty_dataset, rerandomize_each_iteration)

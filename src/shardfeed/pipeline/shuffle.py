"""``shuffle``: a seeded buffer shuffle whose state is a seed and a count.

The buffer fills with ``buffer_size`` elements; each output is a random slot of it, refilled
from upstream. The random stream is numpy's PCG64 seeded from ``(seed, epoch path)``, so
the same seed gives the same order in every run. The state holds no buffered data: the
upstream state at the start of the pass and how many elements were delivered; resuming
replays that prefix (upstream records are read again, nothing is delivered twice).
Serialized records pass through untouched, so a following ``batch`` still parses them.
"""

from __future__ import annotations

import secrets
from typing import Any, Mapping

import numpy as np

from .dataset import Dataset, UnaryDataset, positive_int
from .node import Build, Node

_DRAWS = 4096


def derive_seed(seed: int, epoch: tuple) -> int:
    """A 64-bit seed for one epoch path, stable across runs, platforms and versions."""
    return int(np.random.SeedSequence([seed, *epoch]).generate_state(1, np.uint64)[0])


class ShuffleDataset(UnaryDataset):
    kind = "shuffle"

    def __init__(self, parent: Dataset, buffer_size: int, seed: int | None = None,
                 reshuffle_each_iteration: bool = True) -> None:
        super().__init__(parent)
        self.buffer_size = positive_int("shuffle buffer_size", buffer_size)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        self.seed = seed
        self.reshuffle_each_iteration = bool(reshuffle_each_iteration)

    def _deferred_spec(self):
        return self.parent._deferred_spec()

    def _build(self, b: Build, state: Mapping[str, Any] | None) -> Node:
        return _ShuffleNode(b, self, state)


class _ShuffleNode(Node):
    def __init__(self, b: Build, ds: ShuffleDataset, state: Mapping[str, Any] | None) -> None:
        if state is not None:
            seed = int(state["seed"])
            self.parent_start = state["parent_start"]
            replay = int(state["consumed"])
        else:
            # no seed given: draw one now and keep it in the state, so a resume still matches
            seed = ds.seed if ds.seed is not None else secrets.randbits(63)
            self.parent_start = None
            replay = 0
        self.seed = seed
        epoch = b.epoch if ds.reshuffle_each_iteration else ()
        self.parent = ds.parent._build(b, self.parent_start)
        super().__init__(b, ds, [self.parent])
        self.rng = np.random.Generator(np.random.PCG64(derive_seed(seed, epoch)))
        self.size = ds.buffer_size
        self.buf: list = []
        self.exhausted = False
        self.draws = np.empty(0)
        self.di = 0
        self.consumed = 0
        for _ in range(replay):
            self._shuffled_next()

    def _shuffled_next(self) -> Any:
        buf = self.buf
        parent = self.parent
        if not self.exhausted and len(buf) < self.size:
            try:
                while len(buf) < self.size:
                    buf.append(next(parent))
            except StopIteration:
                self.exhausted = True
        if not buf:
            raise StopIteration
        if self.di >= len(self.draws):
            self.draws = self.rng.random(_DRAWS)
            self.di = 0
        i = int(self.draws[self.di] * len(buf))
        self.di += 1
        x = buf[i]
        if not self.exhausted:
            try:
                buf[i] = next(parent)
            except StopIteration:
                self.exhausted = True
        if self.exhausted:
            buf[i] = buf[-1]
            buf.pop()
        self.consumed += 1
        return x

    _next = _shuffled_next

    def get_state(self) -> dict:
        return {"seed": self.seed, "parent_start": self.parent_start, "consumed": self.consumed}

    def close(self) -> None:
        self.buf = []
        self.parent.close()

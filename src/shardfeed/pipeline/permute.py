"""A seeded permutation of ``[0, n)`` that is computed, never stored.

A balanced Feistel network over the smallest even number of bits that holds ``n - 1``,
with a SplitMix64 round function keyed from ``numpy.random.SeedSequence``; values that
land at or past ``n`` walk the cycle again (fewer than four steps on average), so the
result is a bijection of ``[0, n)``. Memory does not grow with ``n``, any position is one
call, and the same ``(n, seed)`` gives the same order on every platform and version.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROUNDS = 6

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class Permutation:
    """``p[i]`` for ``i`` in ``[0, n)`` (an int or an integer array): a seeded bijection.

    ``seed`` is an int or a sequence of ints (say ``(seed, epoch)``)."""

    def __init__(self, n: int, seed: int | Sequence[int]) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"a permutation needs a size n >= 0, got {n!r}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        entropy = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
        self.keys = np.random.SeedSequence(entropy).generate_state(ROUNDS, np.uint64)

    def _once(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        with np.errstate(over="ignore"):
            for k in self.keys:
                left, right = right, left ^ (_mix(right ^ k) & self.mask)
        return (left << self.half) | right

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int | np.ndarray) -> int | np.ndarray:
        scalar = np.isscalar(i)
        x = np.atleast_1d(np.asarray(i, dtype=np.int64))
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"permutation positions must be in [0, {self.n})")
        y = self._once(x.astype(np.uint64))
        n = np.uint64(self.n)
        out = y >= n
        while out.any():  # cycle walking: stay inside [0, n)
            y[out] = self._once(y[out])
            out = y >= n
        y = y.astype(np.int64)
        return int(y[0]) if scalar else y

    def take(self, start: int, stop: int, step: int = 1) -> np.ndarray:
        """``p[start:stop:step]`` as an array."""
        return self[np.arange(start, min(stop, self.n), step, dtype=np.int64)]  # type: ignore[return-value]

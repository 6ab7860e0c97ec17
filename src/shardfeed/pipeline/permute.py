"""A seeded permutation of ``[0, n)`` that is computed, never stored.

A balanced Feistel network over the smallest even number of bits that holds ``n - 1``,
with a SplitMix64 round function keyed from ``numpy.random.SeedSequence``; values that
land at or past ``n`` walk the cycle again (fewer than four steps on average), so the
result is a bijection of ``[0, n)``. Memory does not grow with ``n``, any position is one
call, and the same ``(n, seed)`` gives the same order on every platform and version.

The native core computes it (``_native.permute``, a window at a time into one int64
array, without the GIL); the numpy code here is the reference it is checked against
bit for bit, and the path taken where the extension is not built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

try:
    from .._native import permute as _native_permute  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _native_permute = None

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

    ``seed`` is an int or a sequence of ints (say ``(seed, epoch)``). ``native=False``
    computes it with the numpy reference even where the extension is built."""

    def __init__(self, n: int, seed: int | Sequence[int], native: bool = True) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"a permutation needs a size n >= 0, got {n!r}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        entropy = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
        self.keys = np.random.SeedSequence(entropy).generate_state(ROUNDS, np.uint64)
        self._native = _native_permute if native else None

    def _once(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        with np.errstate(over="ignore"):
            for k in self.keys:
                left, right = right, left ^ (_mix(right ^ k) & self.mask)
        return (left << self.half) | right

    def _walk(self, x: np.ndarray) -> np.ndarray:
        """The reference: ``p[x]`` for positions ``x`` (int64, checked) with numpy."""
        y = self._once(x.astype(np.uint64))
        n = np.uint64(self.n)
        out = y >= n
        while out.any():  # cycle walking: stay inside [0, n)
            y[out] = self._once(y[out])
            out = y >= n
        return y.astype(np.int64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int | np.ndarray) -> int | np.ndarray:
        scalar = np.isscalar(i)
        x = np.atleast_1d(np.asarray(i, dtype=np.int64))
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"permutation positions must be in [0, {self.n})")
        if self._native is not None:
            y = np.empty(x.shape, dtype=np.int64)
            self._native(y, self.n, int(self.half), self.keys, 0, 0, np.ascontiguousarray(x))
        else:
            y = self._walk(x)
        return int(y.flat[0]) if scalar else y

    def take(self, start: int, stop: int, step: int = 1) -> np.ndarray:
        """``p[start:stop:step]`` as an array (``0 <= start``, ``step >= 1``): 8 bytes a
        position, computed without the GIL where the extension is built."""
        stop = min(stop, self.n)
        if self._native is None or step < 1 or start < 0:
            return self[np.arange(start, stop, step, dtype=np.int64)]  # type: ignore[return-value]
        out = np.empty(len(range(start, stop, step)), dtype=np.int64)
        self._native(out, self.n, int(self.half), self.keys, start, step)
        return out

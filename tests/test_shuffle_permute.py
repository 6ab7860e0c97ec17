"""The seeded permutation behind shuffle="global": the native window (permute.c) gives
exactly the numpy reference's order, so saved states resume unchanged, in 8 bytes a
position."""

import tracemalloc

import numpy as np
import pytest

from shardfeed.pipeline import permute
from shardfeed.pipeline.permute import Permutation

needs_native = pytest.mark.skipif(permute._native_permute is None, reason="the native extension is not built")


def test_order_is_pinned_across_versions():
    # values of the order every saved state of a global shuffle was written against
    assert Permutation(1000, (7, 0)).take(0, 12).tolist() == [674, 688, 916, 341, 370, 71, 810, 718, 295, 525,
                                                             428, 240]
    assert Permutation(400000, (3, 2, 1)).take(5, 400000, 99991).tolist() == [92274, 195754, 292575, 107473,
                                                                               395776]
    big = 2**40 + 3
    assert Permutation(big, (1,)).take(big - 8, big).tolist() == [
        67058214260, 214426057519, 50864829368, 84165763924, 113733975776, 1033760759765, 102983575968,
        741934953793]


@needs_native
def test_native_window_equals_the_reference_bit_for_bit():
    rng = np.random.default_rng(40)
    sizes = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 255, 256, 257, 1023, 4096, 65537, 400_000, 2**31 + 11,
             2**62 + 5]
    for n in sizes:
        for _ in range(6):
            seed = (int(rng.integers(2**32)), *rng.integers(0, 50, int(rng.integers(0, 3))).tolist())
            fast, ref = Permutation(n, seed), Permutation(n, seed, native=False)
            if n <= 70_000:
                assert np.array_equal(fast.take(0, n), ref.take(0, n)), (n, seed)
            for _ in range(4):  # windows of a reader's positions: start, stop, step (readers)
                start = int(rng.integers(0, max(n, 1)))
                step = int(rng.integers(1, 9))
                stop = start + step * int(rng.integers(0, 3000))
                a, b = fast.take(start, stop, step), ref.take(start, stop, step)
                assert a.dtype == np.int64 and np.array_equal(a, b), (n, seed, start, stop, step)
            if n:
                pos = rng.integers(0, n, 500, dtype=np.int64)
                assert np.array_equal(fast[pos], ref[pos])
                assert fast[int(pos[0])] == ref[int(pos[0])]


@needs_native
def test_window_takes_under_16_bytes_a_position():
    n = 1_000_000
    p = Permutation(n, (1, 2))
    tracemalloc.start()
    try:
        out = p.take(3, n, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(out) == (n - 3 + 1) // 2
    assert peak < 16 * len(out)


def test_out_of_range_positions_raise():
    p = Permutation(10, 1)
    with pytest.raises(IndexError):
        p[10]
    with pytest.raises(IndexError):
        p[np.array([0, -1])]
    assert p.take(8, 100).tolist() == Permutation(10, 1, native=False).take(8, 100).tolist()
    assert p.take(10, 20).size == 0


@needs_native
def test_the_native_window_refuses_positions_it_would_walk_forever():
    keys = Permutation(10, 1).keys
    out = np.empty(3, np.int64)
    for n, half, first, step in ((0, 1, 0, 1), (10, 2, 8, 1), (10, 2, -1, 1), (10, 2, 0, -1), (100, 2, 0, 1)):
        with pytest.raises(IndexError, match="permute: positions"):
            permute._native_permute(out, n, half, keys, first, step)
    with pytest.raises(IndexError):
        permute._native_permute(out, 10, 2, keys, 0, 0, np.array([0, 10, 1], np.int64))

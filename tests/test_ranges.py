"""The one range splitter (shardfeed.pipeline.ranges) and the call sites that used to
carry their own copies."""

from __future__ import annotations

import pytest

from shardfeed.distributed.items import split_ranges as items_split_ranges
from shardfeed.pipeline.ranges import slice_range, split_ranges
from shardfeed.tables import slice_range as tables_slice_range


def _old_slice_range(total, slice_id, slice_count):  # tables/reader.py before the merge
    base, extra = divmod(total, slice_count)
    start = slice_id * base + min(slice_id, extra)
    return start, start + base + (1 if slice_id < extra else 0)


def _old_split_ranges(n, parts):  # distributed/items.py before the merge
    parts = max(1, min(parts, n)) if n else 1
    q, r = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        stop = start + q + (1 if k < r else 0)
        out.append((start, stop))
        start = stop
    return out


SIZES = [0, 1, 2, 3, 5, 7, 10, 16, 100, 1000, 1001, 4097]
PARTS = [1, 2, 3, 4, 7, 8, 16, 33, 999, 1001, 5000]


def test_old_call_sites_give_the_same_ranges():
    for n in SIZES:
        for k in PARTS:
            assert split_ranges(n, k) == items_split_ranges(n, k) == _old_split_ranges(n, k), (n, k)
            for i in range(k):
                assert slice_range(n, i, k) == tables_slice_range(n, i, k) == _old_slice_range(n, i, k), (n, i, k)


def test_split_ranges_is_the_nonempty_slices_in_order():
    for n in SIZES:
        for k in PARTS:
            got = split_ranges(n, k)
            assert got == [slice_range(n, i, k) for i in range(len(got))]
            assert got[0][0] == 0 and got[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
            assert n == 0 or all(b > a for a, b in got)


@pytest.mark.parametrize("args, said", [
    ((-1, 0, 1), "total must be >= 0"),
    ((5, 0, 0), "slice_id=0, slice_count=0"),
    ((5, 3, 3), "slice_id=3, slice_count=3"),
    ((5, -1, 3), "slice_id=-1"),
])
def test_slice_range_refuses_bad_arguments(args, said):
    with pytest.raises(ValueError, match=said):
        slice_range(*args)

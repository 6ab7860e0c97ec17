"""The one rule for cutting ``total`` units among readers: contiguous ranges in order,
sizes differing by at most one, the first ``total % count`` ranges one longer.

Every place that splits rows or records among readers or work items uses it (the table
reader's slices, the record-range split of span readers, a ``WorkQueue``'s slices of a
file or table, static sharding), so the same ``(total, count)`` gives the same ranges
everywhere.
"""

from __future__ import annotations


def slice_range(total: int, slice_id: int, slice_count: int) -> tuple[int, int]:
    """Units ``[start, stop)`` of slice ``slice_id`` of ``slice_count`` over ``total`` units
    (empty when there are more slices than units). Raises ``ValueError`` for a negative
    ``total``, ``slice_count < 1`` or ``slice_id`` outside ``0..slice_count-1``."""
    if total < 0:
        raise ValueError(f"slice_range: total must be >= 0, got {total}")
    if slice_count < 1 or not 0 <= slice_id < slice_count:
        raise ValueError(f"slice_range: need 0 <= slice_id < slice_count, got slice_id={slice_id}, "
                         f"slice_count={slice_count}")
    base, extra = divmod(total, slice_count)
    start = slice_id * base + min(slice_id, extra)
    return start, start + base + (1 if slice_id < extra else 0)


def split_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``0..n-1`` (:func:`slice_range` for each part),
    never an empty one: at most ``n`` parts, and ``[(0, 0)]`` when ``n`` is 0."""
    parts = max(1, min(parts, n)) if n else 1
    return [slice_range(n, k, parts) for k in range(parts)]


__all__ = ["slice_range", "split_ranges"]

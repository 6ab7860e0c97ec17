"""Checking that a pipeline resumes exactly: save and restore at every step.

:func:`check_resume_everywhere` is the one helper the tests use for every stage (as
torchdata does): for each step ``k`` it takes ``k`` elements, saves the iterator state
(through JSON, to prove it is small and plain), resumes in a fresh iterator, and checks that
the rest equals what an uninterrupted pass yielded after step ``k``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..formats.spec import RaggedColumn, SparseColumn
from .dataset import Dataset
from .tree import StructureMismatch, tree_leaves, tree_map


def elements_equal(a: Any, b: Any) -> bool:
    """Deep equality for pipeline elements (dicts, tuples, numpy arrays, ragged columns);
    lists and tuples compare alike, object arrays value by value."""
    try:
        same = tree_map(_leaves_equal, a, b, sequences=(tuple, list))
    except StructureMismatch:
        return False
    return all(tree_leaves(same))


def _leaves_equal(a: Any, b: Any) -> bool:
    if isinstance(a, (RaggedColumn, SparseColumn)):
        return a == b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == object or b.dtype == object:
            return a.shape == b.shape and all(x == y for x, y in zip(a.ravel(), b.ravel()))
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def check_resume_everywhere(ds: Dataset, max_steps: int | None = None, every: int = 1,
                            max_state_bytes: int = 64 << 10) -> int:
    """Save and restore ``ds``'s iterator at steps ``0, every, 2*every ...`` (up to
    ``max_steps``) and check each resumed pass against an uninterrupted one.

    Also checks ``set_state`` on a live iterator, and that every state is JSON of at most
    ``max_state_bytes``. Returns how many steps were checked; raises ``AssertionError``
    describing the first mismatch.
    """
    with iter(ds) as first:
        start = first.get_state()
    with ds.iter_from_state(start) as it:
        reference = list(it)
    n = len(reference) if max_steps is None else min(len(reference), max_steps)
    checked = 0
    for k in range(0, n + 1, every):
        with ds.iter_from_state(start) as it:
            for i in range(k):
                got = next(it)
                if not elements_equal(got, reference[i]):
                    raise AssertionError(f"pass from the same start state differs at element {i}")
            text = json.dumps(it.get_state())
            if len(text) > max_state_bytes:
                raise AssertionError(f"state at step {k} is {len(text)} bytes of JSON (limit {max_state_bytes})")
            state = json.loads(text)
            if k % 2:
                it.set_state(state)  # resume in place on odd steps, in a new iterator on even ones
                rest = list(it)
            else:
                with ds.iter_from_state(state) as resumed:
                    rest = list(resumed)
        expected = reference[k:]
        if len(rest) != len(expected):
            raise AssertionError(f"resumed at step {k}: got {len(rest)} elements, expected {len(expected)}")
        for i, (x, y) in enumerate(zip(rest, expected)):
            if not elements_equal(x, y):
                raise AssertionError(f"resumed at step {k}: element {k + i} differs: {x!r:.200} != {y!r:.200}")
        checked += 1
    return checked

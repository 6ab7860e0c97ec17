"""The control block of an ``in_subprocess`` ring (pipeline/shm_ring.py), both sides in one
process on one real shared-memory segment, and the plans that build batches from a slot."""

from __future__ import annotations

import multiprocessing
import pickle
import secrets

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.pipeline import shm, shm_plan, shm_ring
from shardfeed.pipeline.state import elements_equal


@pytest.fixture
def block_pair():
    """``(child's view, consumer's view)`` of one control block of 3 slots."""
    name = f"sf_test_{secrets.token_hex(4)}_ctl"
    shm.create(name, shm_ring.block_bytes(3)).close()
    try:
        yield shm_ring.open_block(name, 3), shm_ring.open_block(name, 3)
    finally:
        assert shm.unlink_quietly(name)


def test_ring_wraps_around_in_order_with_slots_handed_back_out_of_order(block_pair):
    child, consumer = block_pair
    held: list[int] = []
    published = taken = 0
    order = []
    for n in range(40):  # 13 times round a ring of 3
        while (k := child.free_slot()) is None:  # the ring is full: the consumer hands back its oldest but one
            consumer.hand_back(held.pop(1 if len(held) > 1 else 0))
        child.publish(k, n // 7, 64 * n, None if n % 3 else n, 128, (8, 2, 3, 4, n % 2), n / 4)
        published += 1
        if n % 2:  # the consumer takes every other time round, then all that wait
            while (d := consumer.take()) is not None:
                slot, gen, size, ref, at, lengths, work_s = d
                m = size // 64
                assert (gen, ref, at, lengths, work_s) == (m // 7, None if m % 3 else m, 128, (8, 2, 3, 4, m % 2), m / 4)
                order.append(m)
                held.append(slot)
                taken += 1
        assert consumer.waiting() == published - taken <= 3
    assert order == list(range(40))
    assert consumer.take() is None


def test_slot_reused_only_after_its_hand_back(block_pair):
    child, consumer = block_pair
    got = []
    for _ in range(3):
        k = child.free_slot()
        child.publish(k, 0, 0, None, 0, (0, 0, 0, 0, 0), 0.0)
        got.append(consumer.take()[0])
    assert sorted(got) == [0, 1, 2] and child.free_slot() is None  # all three held
    assert consumer.hand_back(1) is False  # the child is not asleep: nothing to wake
    assert child.free_slot() == 1
    child.publish(1, 0, 0, None, 0, (0, 0, 0, 0, 0), 0.0)
    assert child.free_slot() is None  # slot 1 is filled again: not free until handed back again
    child.sleeping(True)
    assert consumer.hand_back(2) is True  # the child sleeps: the caller posts ``free``
    child.sleeping(False)
    assert child.free_slot() == 2


def test_child_sleeping_on_free_is_woken_by_a_hand_back():
    """The semaphore a sleeping child waits on, posted from the consumer's side."""
    free = multiprocessing.get_context("spawn").Semaphore(0)
    assert not free.acquire(timeout=0.01)
    free.release()
    assert free.acquire(timeout=5)


def _plan_for(x, uses: int = 2):
    structure, arrays, layout, size = shm.encode(x)
    kinds, numbers = shm_plan.split_layout(layout)
    mapping = np.zeros(size + 64, np.uint8)
    shm.write(memoryview(mapping), arrays, layout)
    plan = shm_plan.plan(structure, pickle.dumps(kinds), None)
    return plan, mapping, numbers, layout, structure


def _batches():
    rc = sf.RaggedColumn(np.arange(5, dtype=np.int64), np.array([0, 2, 5], np.int64))
    rb = sf.RaggedColumn(np.array([b"a", b"bc", b""], object), np.array([0, 1, 3], np.int64))
    return [
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "k": 3, "s": "x", "ids": rc,
         "tok": np.array([b"t1", b"t22"], object), "empty": np.zeros((0, 4), np.int16)},
        {"tags": rb, "n": None, "v": np.arange(3)},  # bytes inside an object: made at once
        (np.arange(3), {"x": np.ones(2)}),  # not a dict: unpickled every time
    ]


@pytest.mark.parametrize("i", range(3))
def test_a_plan_builds_what_decode_builds(i):
    x = _batches()[i]
    plan, mapping, numbers, layout, structure = _plan_for(x)
    released = []
    for use in range(3):  # the second use makes the template
        got = plan.build(mapping, numbers, shm.SlotLease(mapping, lambda use=use: released.append(use)))
        want = shm.decode(mapping, structure, layout)
        assert type(got) in (dict, shm.LazyBatch, tuple) and elements_equal(dict(got) if isinstance(got, dict) else got,
                                                                            want)
        assert elements_equal(dict(got) if isinstance(got, dict) else got, x)
        del got
    assert released == [0, 1, 2]  # each batch's lease ended with it
    assert (plan.template is not None) == (i < 2)


def test_a_new_layout_gets_a_new_plan_and_the_same_layout_keeps_it():
    a, b = _batches()[:2]
    pa, *_ = _plan_for(a)
    structure, _, layout, _ = shm.encode(a)
    kinds, _ = shm_plan.split_layout(layout)
    assert shm_plan.plan(structure, pickle.dumps(kinds), pa) is pa
    a2 = dict(a, ids=sf.RaggedColumn(np.arange(9, dtype=np.int64), np.array([0, 9], np.int64)))  # other sizes
    structure2, _, layout2, _ = shm.encode(a2)
    kinds2, numbers2 = shm_plan.split_layout(layout2)
    assert structure2 == structure and pickle.dumps(kinds2) == pickle.dumps(kinds)  # only the numbers differ
    structure_b, _, layout_b, _ = shm.encode(b)
    kinds_b, _ = shm_plan.split_layout(layout_b)
    pb = shm_plan.plan(structure_b, pickle.dumps(kinds_b), pa)
    assert pb is not pa and pb.kinds == kinds_b


def test_a_limit_keeps_the_child_from_having_more_slots_out(block_pair):
    child, consumer = block_pair
    assert [shm_ring.in_flight_limit(16, None, 10), shm_ring.in_flight_limit(16, 64 << 20, 1 << 20),
            shm_ring.in_flight_limit(16, 64 << 20, 10 << 20), shm_ring.in_flight_limit(3, 100, 1), shm_ring.in_flight_limit(16, 64 << 20, 100 << 20)] == [16, 16, 6, 3, 4]
    for _ in range(2):
        k = child.free_slot(2)
        child.publish(k, 0, 0, None, 0, (0, 0, 0, 0, 0), 0.0)
    assert child.free_slot() == 2 and child.free_slot(2) is None and child.free_slot(3) == 2  # 2 out: the limit
    consumer.take()
    assert child.free_slot(2) is None  # taken and held is still out
    consumer.hand_back(0)
    assert child.free_slot(2) == 0


def _flat_batches(n: int) -> list[dict]:
    """Flat batches of ``n`` rows (one signature for every ``n``): numeric, bytes as objects
    and as :class:`BytesObjects`, ragged columns of numbers and of bytes, an empty array."""
    from shardfeed.formats.native import pack_bytes

    toks = np.array([b"t%d" % i * (i % 3) for i in range(n)], object)
    splits = np.arange(n + 1, dtype=np.int64) * 2
    return [{"a": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "tok": toks,
             "buf": shm.BytesObjects(pack_bytes(toks), (n,)),
             "ids": sf.RaggedColumn(np.arange(2 * n, dtype=np.int64), splits),
             "tags": sf.RaggedColumn(np.repeat(toks, 2), splits.copy()),
             "empty": np.zeros((0, 4), np.int16)}]


def _encoded(x):
    structure, arrays, layout, size = shm.encode(x)
    mapping = np.zeros(max(size, 1), np.uint8)
    shm.write(memoryview(mapping), arrays, layout)
    return structure, layout, size, shm.decode(mapping, structure, layout)


def _want(x):
    """``x`` as the consumer reads it (BytesObjects arrive as object arrays)."""
    def plain(v):
        if type(v) is shm.BytesObjects:
            return v.buffer.to_numpy().reshape(v.shape)
        if isinstance(v, sf.RaggedColumn):
            return sf.RaggedColumn(plain(v.values), v.row_splits)
        return v
    return {k: plain(v) for k, v in x.items()}


@pytest.mark.parametrize("rows", [(3, 5), (1, 7), (4, 0)])
def test_a_flat_batch_of_a_kept_signature_encodes_as_the_pickler_does(rows):
    """The second batch of a signature skips the pickler: its structure, layout and decoded
    values are what the pickler gives for it (other row counts: other positions and shapes).
    With no rows its empty object arrays stay in the pickle: pickled, and the kept structure
    is left as it was for the batches after it."""
    shm._flat.clear()
    first, second, third = (_flat_batches(n)[0] for n in (*rows, 2))
    got_first = _encoded(first)
    assert len(shm._flat) == 1
    got, got_third = _encoded(second), _encoded(third)  # from the kept structure (with rows)
    for x, g in ((second, got), (third, got_third)):
        shm._flat.clear()
        assert g[:3] == _encoded(x)[:3]  # what the pickler gives
        assert elements_equal(dict(g[3]), _want(x))
    assert (got[0] == got_first[0]) == (rows[1] > 0) and got_third[0] == got_first[0]
    assert elements_equal(dict(got_first[3]), _want(first))


def test_batches_the_kept_structure_cannot_describe_are_pickled():
    """A value in two places, an object array that does not pack, a key that is not a
    string, a ragged column with more attributes: each pickled, and decoded as it was."""
    shm._flat.clear()
    base = _flat_batches(2)[0]
    _encoded(base)
    shared = np.arange(4)
    strs = dict(base, tok=np.array(["x", "y"], object))  # the kept signature, but str values
    extra = sf.RaggedColumn(np.arange(3), np.array([0, 1, 3], np.int64))
    extra.note = "kept"  # type: ignore[attr-defined]
    cases = [dict(base, a=shared, b=shared), strs, {1: np.arange(2)}, dict(base, ids=extra),
             dict(base, ids=sf.RaggedColumn(base["a"], np.array([0, 1, 2], np.int64)))]
    for x in cases:
        _, _, _, back = _encoded(x)
        assert elements_equal(dict(back), _want(x)), x
    assert getattr(_encoded(cases[3])[3]["ids"], "note", None) == "kept"
    assert len(shm._flat) == 1  # none of them kept a structure

"""User functions at the pipeline's call sites: a ``StopIteration`` they raise is their error
(PEP 479's rule for generators), never the end of the data. Issue 39, item 1: a ``map`` that
raised it ended the pass as if the data had ended (640 of 16,000 records, no error).

Tests that start processes have "process" or "subprocess" in their names (marked slow).
"""

from __future__ import annotations

import pytest

import shardfeed as sf
from shardfeed.pipeline import from_list

N = 16_000
STOP_AT = 640


def stop_at_640(x):
    """A user function with a bug: a ``next()`` on an exhausted iterator leaks out of it."""
    if x == STOP_AT:
        next(iter(()))
    return x


def keep_but_stop_at_640(x):
    if x == STOP_AT:
        raise StopIteration
    return True


def per_element(x):
    if x == 3:
        raise StopIteration("from the interleave function")
    return from_list([x, x])


def stopping_handler(exc, context):
    raise StopIteration


def fail_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def _delivered(ds, got: list) -> None:
    for x in ds:
        got.append(x)


@pytest.mark.parametrize("parallel", [None, 1, 4], ids=["sequential", "one thread", "four threads"])
def test_map_stop_iteration_is_an_error_naming_the_stage_and_function(parallel):
    got: list = []
    with pytest.raises(RuntimeError, match=r"the map stage's function .*stop_at_640 raised StopIteration") as info:
        _delivered(from_list(list(range(N))).map(stop_at_640, num_parallel_calls=parallel), got)
    assert isinstance(info.value.__cause__, StopIteration)  # where it came from, in the traceback
    assert got == list(range(len(got))) and len(got) <= STOP_AT
    if parallel is None:
        assert len(got) == STOP_AT


def test_map_in_processes_stop_iteration_is_an_error():
    with pytest.raises(RuntimeError, match=r"the map stage's function .*stop_at_640 raised StopIteration"):
        list(from_list(list(range(2000))).map(stop_at_640, num_parallel_calls=2, use_processes=True))


@pytest.mark.parametrize("parallel", [None, 2], ids=["sequential", "threads"])
def test_map_stop_iteration_under_skip_is_counted_like_any_error(parallel):
    ds = from_list(list(range(N))).map(stop_at_640, num_parallel_calls=parallel, on_error="skip")
    it = iter(ds)
    got = list(it)
    assert got == [x for x in range(N) if x != STOP_AT]
    skipped = it.stats().errors
    assert skipped.total == 1 and skipped.examples[0]["element"] == STOP_AT
    assert skipped.examples[0]["error"].startswith("RuntimeError: the map stage's function")


def test_filter_stop_iteration_is_an_error_naming_the_predicate():
    got: list = []
    with pytest.raises(RuntimeError, match=r"the filter stage's predicate .*keep_but_stop_at_640 raised StopIteration"):
        _delivered(from_list(list(range(N))).filter(keep_but_stop_at_640), got)
    assert got == list(range(STOP_AT))


@pytest.mark.parametrize("parallel", [None, 2], ids=["sequential", "threads"])
def test_interleave_function_stop_iteration_is_an_error(parallel):
    ds = from_list(list(range(10))).interleave(per_element, cycle_length=2, num_parallel_calls=parallel)
    with pytest.raises(RuntimeError, match=r"the interleave stage's function .*per_element raised StopIteration"):
        list(ds)


def test_on_error_handler_stop_iteration_is_an_error_naming_the_handler():
    ds = from_list(list(range(10))).map(fail_odd, on_error=stopping_handler)
    got: list = []
    with pytest.raises(RuntimeError, match=r"the map stage's on_error handler .*stopping_handler raised StopIteration"):
        _delivered(ds, got)
    assert got == [0]


def test_decode_images_handler_stop_iteration_is_an_error():
    pytest.importorskip("PIL.Image")
    import numpy as np

    col = np.empty(2, object)
    col[:] = [b"not an image", b"nor this"]
    ds = from_list([{"image": col}]).decode_images("image", 8, on_error=stopping_handler)
    with pytest.raises(RuntimeError, match=r"the decode_images stage's on_error handler .*stopping_handler"):
        list(ds)


@pytest.mark.parametrize("on_empty", ["stop", "drop"])
def test_mix_input_whose_map_raises_stop_iteration_is_an_error_not_an_empty_input(on_empty):
    a = from_list(list(range(N))).map(stop_at_640)
    b = from_list(list(range(N, 2 * N)))
    with pytest.raises(RuntimeError, match="stop_at_640 raised StopIteration"):
        list(sf.mix([a, b], seed=1, on_empty=on_empty))


def test_subprocess_child_map_stop_iteration_is_an_error():
    ds = from_list(list(range(N))).map(stop_at_640).in_subprocess()
    got: list = []
    with pytest.raises(RuntimeError, match=r"the map stage's function .*stop_at_640 raised StopIteration") as info:
        _delivered(ds, got)
    assert got == list(range(STOP_AT))
    assert "stop_at_640" in str(info.value.__cause__)  # the child's traceback


def test_torch_loader_over_a_map_that_raises_stop_iteration_is_an_error():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    loader = DataLoader(from_list(list(range(N))).map(stop_at_640).to_torch(), batch_size=None, num_workers=0)
    with pytest.raises(RuntimeError, match="stop_at_640 raised StopIteration"):
        list(loader)


def takes(resource, x):
    return x


def test_map_in_processes_names_an_unpicklable_function_at_once():
    import functools
    import threading

    with pytest.raises(TypeError, match=r"map\(use_processes=True\) .* but .*<lambda> is a lambda"):
        from_list([1]).map(lambda x: x, num_parallel_calls=2, use_processes=True)
    with pytest.raises(TypeError, match=r"but functools\.partial\(tests\.test_pipeline_user_functions\.takes, \.\.\.\) "
                                        r"cannot be pickled: its args\[0\] \(<unlocked _thread\.lock"):
        from_list([1]).map(functools.partial(takes, threading.Lock()), num_parallel_calls=2, use_processes=True)


def open_item_stopping_at_b(item):
    """A reader of work items with a bug: the call itself raises StopIteration for item b."""
    if item.work.endswith("/b"):
        next(iter(()))
    return iter([item.work + "-1", item.work + "-2"])


def test_open_item_raising_stopiteration_is_an_error_in_a_static_shard():
    ds = sf.read_shard(["/w/a", "/w/b", "/w/c"], slice_id=0, slice_count=1, open_item=open_item_stopping_at_b)
    # before: ['/w/a-1', '/w/a-2'] and the end of the pass, items b and c lost without a word
    with pytest.raises(RuntimeError, match="open_item_stopping_at_b raised StopIteration") as info:
        list(ds)
    assert isinstance(info.value.__cause__, StopIteration)


def test_open_item_raising_stopiteration_is_an_error_over_a_queue():
    import uuid

    q = sf.WorkQueue(["/w/a", "/w/b", "/w/c"], backend=f"memory://{uuid.uuid4().hex}", name="stop", shuffle=False)
    got = []
    with pytest.raises(RuntimeError, match="open_item_stopping_at_b raised StopIteration"):
        for x in sf.read_queue(q, open_item=open_item_stopping_at_b):
            got.append(x)
    assert got == ["/w/a-1", "/w/a-2"]
    m = q.metrics()
    assert m["done"] == 1 and not m["drained"]  # b given back, c never taken: nothing acknowledged unread


def test_resuming_an_item_that_now_has_fewer_rows_names_it():
    rows = {"/w/a": 3, "/w/b": 3}

    def open_item(item):
        return iter(range(rows[item.work]))

    ds = sf.read_shard(["/w/a", "/w/b"], slice_id=0, slice_count=1, open_item=open_item)
    it = iter(ds)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 0, 1]
    state = it.get_state()
    rows["/w/b"] = 1  # the item shrank meanwhile
    with pytest.raises(ValueError, match="gives 1 rows for item /w/b now, the state says 2 were delivered"):
        list(ds.iter_from_state(state))

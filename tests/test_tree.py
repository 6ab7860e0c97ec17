"""The one element walker (shardfeed.pipeline.tree) and the stages that use it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from shardfeed import RaggedColumn, SparseColumn
from shardfeed.adapters.jax import to_numpy
from shardfeed.pipeline.batch import nbytes, split, stack
from shardfeed.pipeline.state import elements_equal
from shardfeed.pipeline.tree import (
    StructureMismatch,
    keystr,
    tree_flatten,
    tree_leaves,
    tree_leaves_with_path,
    tree_map,
    tree_map_with_path,
    tree_unflatten,
)


def _tree():
    ragged = RaggedColumn(np.arange(3), np.array([0, 1, 3]))
    sparse = SparseColumn(np.array([[0, 0]]), np.array([5]), np.array([2, 2]))
    return {"a": np.arange(4), "b": (b"x", {"c": ragged, "d": 7}), "e": [1, 2], "f": sparse}


def test_leaves_and_paths_in_key_and_index_order():
    t = _tree()
    got = [(keystr(p), type(x).__name__) for p, x in tree_leaves_with_path(t)]
    assert got == [("['a']", "ndarray"), ("['b'][0]", "bytes"), ("['b'][1]['c']", "RaggedColumn"),
                   ("['b'][1]['d']", "int"), ("['e']", "list"), ("['f']", "SparseColumn")]
    assert tree_leaves(t)[4] == [1, 2]  # a list is a leaf by default
    assert tree_leaves(t, sequences=(tuple, list))[4:6] == [1, 2]
    assert keystr(()) == ""


def test_map_with_path_passes_the_path_of_each_leaf():
    out = tree_map_with_path(lambda p, x: keystr(p), {"k": (1, {"j": 2})})
    assert out == {"k": ("['k'][0]", {"j": "['k'][1]['j']"})}


def test_map_of_several_trees_matches_keys_not_order():
    out = tree_map(lambda x, y: x + y, {"a": 1, "b": (2, 3)}, {"b": (20, 30), "a": 10})
    assert out == {"a": 11, "b": (22, 33)}
    assert list(out) == ["a", "b"]  # the first tree's order


def test_a_leaf_of_the_first_tree_takes_the_others_whole():
    assert tree_map(lambda x, y: (x, y), {"a": 1}, {"a": {"deep": 2}}) == {"a": (1, {"deep": 2})}


@pytest.mark.parametrize("other, where, said", [
    ({"a": 1, "b": {"x": 2}}, "['b']", "keys ['x', 'y'], another has keys ['x']"),
    ({"a": 1, "b": {"x": 2, "y": (3, 4)}}, "['b']['y']", "a sequence of 1, another one of 2"),
    ({"a": 1, "b": {"x": 2, "y": 5}}, "['b']['y']", "a sequence of 1, another has a int"),
    ({"a": 1, "b": [2]}, "['b']", "another has a list"),
    ((1,), "the root", "another has a tuple"),
    ({"a": 1, "b": {"x": 2, "y": [3]}}, "['b']['y']", "a sequence of 1, another has a list"),  # lists are leaves
])
def test_mismatched_structures_raise_naming_the_path(other, where, said):
    first = {"a": 1, "b": {"x": 2, "y": (3,)}}
    with pytest.raises(StructureMismatch, match=f"trees differ at {re.escape(where)}: .*{re.escape(said)}") as e:
        tree_map(lambda *x: x, first, other)
    assert isinstance(e.value, ValueError)


def test_flatten_unflatten_round_trip_and_structure_equality():
    t = _tree()
    leaves, d = tree_flatten(t)
    assert d.num_leaves == len(leaves) == 6
    back = tree_unflatten(d, leaves)
    assert back.keys() == t.keys() and back["b"][1]["d"] == 7 and back["e"] == [1, 2]
    assert tree_flatten({"x": (1, 2)})[1] == tree_flatten({"x": (5, 6)})[1]
    assert tree_flatten({"x": (1, 2)})[1] != tree_flatten({"x": (1, 2, 3)})[1]
    assert tree_flatten({"x": [1, 2]}, sequences=(tuple, list))[1] == tree_flatten({"x": (1, 2)})[1]
    assert tree_unflatten(tree_flatten(5)[1], [6]) == 6
    with pytest.raises(ValueError, match="holds 6 leaves, got 5"):
        tree_unflatten(d, leaves[:5])


def test_stack_keeps_its_messages_naming_the_place():
    with pytest.raises(ValueError, match=r"cannot batch: element\['b'\]s have different keys \(\['x'\] vs \['y'\]\)"):
        stack([{"b": {"x": 1}}, {"b": {"y": 1}}])
    with pytest.raises(ValueError, match=r"cannot batch: element\[1\]s are tuples of different lengths"):
        stack([(1, (2, 3)), (1, (2,))])
    with pytest.raises(ValueError, match=r"element\['v'\]s have different shapes"):
        stack([{"v": np.zeros((2, 2))}, {"v": np.zeros((3, 2))}])
    with pytest.raises(ValueError, match=r"elements have different keys \(\['a'\] vs int\)"):
        stack([{"a": 1}, 5])


def test_stack_split_round_trip():
    rows = [{"a": np.int64(i), "t": (b"r%d" % i, np.arange(i + 1))} for i in range(3)]
    b = stack(rows)
    assert isinstance(b["t"][1], RaggedColumn) and b["t"][0].dtype == object
    assert elements_equal(split(b), rows)


def test_split_refuses_columns_of_different_lengths_in_tuples_too():
    with pytest.raises(ValueError, match=r"different lengths \[2, 3\]"):
        split({"a": np.arange(2), "b": np.arange(3)})
    with pytest.raises(ValueError, match=r"different lengths \[2, 3\]"):  # zip() used to drop the third row
        split((np.arange(2), np.arange(3)))
    with pytest.raises(TypeError, match="cannot unbatch a SparseColumn"):
        split({"s": _tree()["f"]})


def test_nbytes_counts_arrays_object_values_and_lists():
    obj = np.empty(4, dtype=object)
    obj[:] = [b"abcd"] * 4
    ragged = RaggedColumn(np.zeros(5, np.int32), np.array([0, 5], np.int64))
    assert nbytes({"a": np.zeros(3, np.float64), "b": (obj, [ragged]), "c": 7}) == 24 + obj.nbytes + 16 + 20 + 16


def test_elements_equal_lists_like_tuples_and_structure_differences():
    assert elements_equal({"a": [1, (2, 3)]}, {"a": (1, [2, 3])})
    assert not elements_equal({"a": 1}, {"b": 1})
    assert not elements_equal((1, 2), (1, 2, 3))
    obj = np.array([b"x", b"y"], dtype=object)
    assert elements_equal({"s": obj}, {"s": np.array([b"x", b"y"], dtype=object)})
    assert not elements_equal({"s": obj}, {"s": np.array([b"x", b"z"], dtype=object)})


def test_to_numpy_keeps_structure_and_columns():
    t = _tree()
    out = to_numpy(t)
    assert isinstance(out["b"][1]["d"], np.ndarray) and out["b"][1]["c"] is t["b"][1]["c"]
    assert isinstance(out["e"], np.ndarray) and out["f"] is t["f"]

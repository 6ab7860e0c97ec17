"""One walker for pipeline elements: dicts and tuples of leaves.

An element or a batch is a *tree*: a mapping (a ``dict`` of features) or a tuple is a node,
everything else (numpy arrays, :class:`~shardfeed.RaggedColumn`,
:class:`~shardfeed.SparseColumn`, scalars, bytes, str, lists) is a leaf. Functions that
take ``sequences=`` can treat more types as sequence nodes (``(tuple, list)`` makes lists
nodes too); a sequence node is rebuilt as a tuple, a mapping as a ``dict`` in the first
tree's key order.

A *path* names a leaf from the root: the mapping keys and tuple indices on the way, and
:func:`keystr` writes it the way Python indexes it (``['image'][0]``). Every stage that
walks an element (batching, byte counts, the adapters, the resume checks) goes through
these functions, so they all agree on what a node is and name a place the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

Path = tuple[Any, ...]
"""Mapping keys and tuple indices from the root to a node or leaf."""

_TUPLE: tuple[type, ...] = (tuple,)


def keystr(path: Path) -> str:
    """``path`` as Python indexing: ``('image', 0)`` -> ``"['image'][0]"`` (``""`` for the root)."""
    return "".join(f"[{k!r}]" for k in path)


class StructureMismatch(ValueError):
    """Trees given together have different structures.

    ``path`` is where (from the root), ``first`` the first tree's node there and ``other``
    the node of the tree that differs."""

    def __init__(self, path: Path, first: Any, other: Any) -> None:
        self.path, self.first, self.other = path, first, other
        where = keystr(path) or "the root"
        if isinstance(first, Mapping):
            got = f"keys {list(other)}" if isinstance(other, Mapping) else f"a {type(other).__name__}"
            detail = f"the first tree has keys {list(first)}, another has {got}"
        elif isinstance(other, tuple | list) and len(other) != len(first):
            detail = f"the first tree has a sequence of {len(first)}, another one of {len(other)}"
        else:
            detail = f"the first tree has a sequence of {len(first)}, another has a {type(other).__name__}"
        super().__init__(f"trees differ at {where}: {detail}")


@dataclass(frozen=True)
class TreeDef:
    """The structure of a tree without its leaves (from :func:`tree_flatten`).

    ``kind`` is ``"leaf"``, ``"mapping"`` or ``"sequence"``; ``keys`` the mapping's keys in
    order; ``children`` the structures below. Two trees with equal ``TreeDef`` have the same
    nodes, keys (in the same order) and number of leaves."""

    kind: str
    keys: tuple = ()
    children: tuple[TreeDef, ...] = ()

    @property
    def num_leaves(self) -> int:
        """How many leaves a tree of this structure has."""
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)


_LEAF = TreeDef("leaf")


def tree_map_with_path(fn: Callable[..., Any], tree: Any, *rest: Any,
                       sequences: tuple[type, ...] = _TUPLE) -> Any:
    """``tree`` with each leaf replaced by ``fn(path, leaf, *the leaves of rest at path)``.

    ``rest`` must have the structure of ``tree`` (the same mapping keys, in any order, and
    sequence lengths); where ``tree`` has a leaf, the others' values there are passed whole,
    whatever they are. Raises :class:`StructureMismatch` (a ``ValueError``) naming the path
    where they differ."""
    return _map(fn, (), tree, rest, sequences)


def _map(fn: Callable[..., Any], path: Path, tree: Any, rest: tuple, sequences: tuple[type, ...]) -> Any:
    if isinstance(tree, Mapping):
        for o in rest:
            if not isinstance(o, Mapping) or o.keys() != tree.keys():
                raise StructureMismatch(path, tree, o)
        return {k: _map(fn, (*path, k), v, tuple(o[k] for o in rest), sequences) for k, v in tree.items()}
    if isinstance(tree, sequences):
        seq = cast(Sequence[Any], tree)
        n = len(seq)
        for o in rest:
            if not isinstance(o, sequences) or isinstance(o, Mapping) or len(cast(Sequence[Any], o)) != n:
                raise StructureMismatch(path, tree, o)
        return tuple(_map(fn, (*path, i), v, tuple(o[i] for o in rest), sequences) for i, v in enumerate(seq))
    return fn(path, tree, *rest)


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any, sequences: tuple[type, ...] = _TUPLE) -> Any:
    """``tree`` with each leaf replaced by ``fn(leaf, *the leaves of rest there)``; see
    :func:`tree_map_with_path` for the structure rule and the error."""
    return _map(lambda _path, *leaves: fn(*leaves), (), tree, rest, sequences)


def tree_leaves_with_path(tree: Any, sequences: tuple[type, ...] = _TUPLE) -> list[tuple[Path, Any]]:
    """``(path, leaf)`` for every leaf of ``tree``, depth first in key and index order."""
    out: list[tuple[Path, Any]] = []
    _map(lambda p, x: out.append((p, x)), (), tree, (), sequences)
    return out


def tree_leaves(tree: Any, sequences: tuple[type, ...] = _TUPLE) -> list:
    """The leaves of ``tree``, depth first in key and index order."""
    out: list = []
    _map(lambda _p, x: out.append(x), (), tree, (), sequences)
    return out


def tree_flatten(tree: Any, sequences: tuple[type, ...] = _TUPLE) -> tuple[list, TreeDef]:
    """``(leaves, treedef)``: the leaves as :func:`tree_leaves` lists them and the structure
    that :func:`tree_unflatten` puts them back into."""
    leaves: list = []

    def walk(x: Any) -> TreeDef:
        if isinstance(x, Mapping):
            return TreeDef("mapping", tuple(x), tuple(walk(v) for v in x.values()))
        if isinstance(x, sequences):
            return TreeDef("sequence", (), tuple(walk(v) for v in cast(Sequence[Any], x)))
        leaves.append(x)
        return _LEAF

    return leaves, walk(tree)


def tree_unflatten(treedef: TreeDef, leaves: list | tuple) -> Any:
    """The tree of structure ``treedef`` holding ``leaves`` (in :func:`tree_leaves` order):
    mappings as ``dict``, sequences as ``tuple``. Raises ``ValueError`` when the number of
    leaves is not ``treedef.num_leaves``."""
    if len(leaves) != treedef.num_leaves:
        raise ValueError(f"tree_unflatten: the structure holds {treedef.num_leaves} leaves, got {len(leaves)}")
    it = iter(leaves)

    def build(d: TreeDef) -> Any:
        if d.kind == "mapping":
            return {k: build(c) for k, c in zip(d.keys, d.children)}
        if d.kind == "sequence":
            return tuple(build(c) for c in d.children)
        return next(it)

    return build(treedef)


__all__ = ["Path", "StructureMismatch", "TreeDef", "keystr", "tree_flatten", "tree_leaves",
           "tree_leaves_with_path", "tree_map", "tree_map_with_path", "tree_unflatten"]

"""Plans: how the consumer builds elements of one structure and layout from a slot, made
once and kept while the elements that follow have the same (a batch's structure and layout
kinds are almost always its predecessor's; only the numbers of its layout change). See
:mod:`shardfeed.pipeline.shm` for the layout and :func:`~shardfeed.pipeline.shm.decode`,
which a plan falls back to.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from .shm import _LAZY, _NUMERIC, LazyBatch, LazyBytes, SlotLease, _array, _dtype, _entry, decode, views_slot


def split_layout(layout: list) -> tuple[tuple, list[int]]:
    """``(kinds, numbers)``: what of ``layout`` stays the same from batch to batch (each
    entry's kind, dtype and rank) and its numbers (positions, shapes, counts and sizes, which
    vary with the batch: a ragged column's values, a bytes column's data), flat."""
    kinds: list[tuple] = []
    numbers: list[int] = []
    for w in layout:
        if w[0] == _NUMERIC:
            _, pos, dtype, shape = w
            kinds.append((_NUMERIC, dtype, len(shape)))
            numbers.append(pos)
            numbers += shape
        else:
            kind, pos, shape, count, data_at, size = w
            kinds.append((kind, len(shape)))
            numbers.append(pos)
            numbers += shape
            numbers += (count, data_at, size)
    return tuple(kinds), numbers


class _Hole:
    """Where array ``i`` goes, in a structure unpickled once to make a :class:`Plan`."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


_ATOMS = (type(None), bool, int, float, complex, str, bytes)  # immutable: shared by every batch of a plan


def _plain_object(v: Any) -> bool:
    """Whether pickle rebuilds ``v`` as ``cls.__new__(cls)`` plus its ``__dict__`` (a
    dataclass such as ``RaggedColumn``), which a plan can do without unpickling."""
    cls = type(v)
    return (hasattr(v, "__dict__") and not hasattr(cls, "__slots__") and not hasattr(cls, "__setstate__")
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and cls.__new__ is object.__new__)


class Plan:
    """How elements of one structure and one layout's kinds are built from a slot, made
    once: the consumer keeps the last plan and compares bytes.
    A dict element whose values are arrays, immutable scalars, or plain objects of those
    (``RaggedColumn``) gets a template: a batch is a C-level copy of it (its bytes columns
    :class:`LazyBytes` markers shared by every batch) plus one ``np.ndarray`` call per
    numeric array; any other element is unpickled (:func:`decode`)."""

    __slots__ = ("structure", "kinds_bytes", "kinds", "at", "lazy", "template", "numeric", "objects", "uses")

    def __init__(self, structure: bytes, kinds_bytes: bytes, kinds: tuple) -> None:
        self.structure, self.kinds_bytes, self.kinds = structure, kinds_bytes, kinds
        self.at: list[int] = []  # where each entry's numbers start
        i = 0
        for k in kinds:
            self.at.append(i)
            i += 1 + (k[2] if k[0] == _NUMERIC else k[1] + 3)
        self.lazy = any(k[0] == _LAZY for k in kinds)  # a bytes column in the slot: the element views it
        self.template: dict | None = None
        self.numeric: list[tuple] = []  # (key, dtype, where its numbers start, rank)
        self.objects: list[tuple] = []  # (key, class, its fields in order)
        self.uses = 0

    def layout(self, numbers: Sequence[int]) -> list:
        """The full layout (as :func:`encode` made it) of the element with ``numbers``."""
        return [_entry(k, numbers, i) for k, i in zip(self.kinds, self.at)]

    def views(self, numbers: Sequence[int]) -> bool:
        """Whether the element with ``numbers`` leaves anything viewing the slot (:func:`views_slot`)."""
        return self.lazy or views_slot(self.layout(numbers))

    def _compile(self) -> None:
        holes: list[_Hole] = []

        def hole(i: Any) -> _Hole:
            holes.append(_Hole(i))
            return holes[-1]

        u = pickle.Unpickler(io.BytesIO(self.structure))
        u.persistent_load = hole
        x = u.load()
        if type(x) is not dict:
            return
        template: dict = {}
        numeric, objects = [], []
        for k, v in x.items():
            if type(v) is _Hole:
                kind = self.kinds[v.i]
                if kind[0] == _LAZY:
                    template[k] = LazyBytes(None, (kind, self.at[v.i]))
                elif kind[0] == _NUMERIC:
                    dtype = kind[1]
                    numeric.append((k, _dtype(dtype) if type(dtype) is str else dtype, self.at[v.i], kind[2]))
                else:
                    return
            elif type(v) in _ATOMS:
                template[k] = v
            elif _plain_object(v) and all(type(f) is _Hole or type(f) in _ATOMS for f in v.__dict__.values()):
                # (name, value, None), (name, dtype, (where its numbers start, rank)) or (name, None, (entry,))
                fields = []
                for f, a in v.__dict__.items():
                    if type(a) is not _Hole:
                        fields.append((f, a, None))
                        continue
                    kind = self.kinds[a.i]
                    if kind[0] == _LAZY:
                        return
                    if kind[0] == _NUMERIC:
                        dtype = _dtype(kind[1]) if type(kind[1]) is str else kind[1]
                        fields.append((f, dtype, (self.at[a.i], kind[2])))
                    else:  # bytes inside an object: made into objects here (as decode does)
                        fields.append((f, None, (a.i,)))
                objects.append((k, type(v), fields))
            else:
                return
        self.template, self.numeric, self.objects = template, numeric, objects

    def build(self, mapping: np.ndarray, numbers: Sequence[int], lease: SlotLease) -> Any:
        """The element with ``numbers``, its arrays views of ``mapping`` hanging from
        ``lease`` (see :func:`decode`)."""
        self.uses += 1
        if self.uses == 2:  # the structure came back: worth a template (made once)
            self._compile()
        if self.template is None:
            return decode(mapping, self.structure, self.layout(numbers), lease)
        root = lease
        ndarray = np.ndarray
        if self.lazy:
            x: dict = LazyBatch(self.template)
            x._root, x._numbers = root, numbers  # type: ignore[attr-defined]
        else:
            x = self.template.copy()
        for k, dtype, i, rank in self.numeric:
            x[k] = ndarray((numbers[i + 1],) if rank == 1 else tuple(numbers[i + 1:i + 1 + rank]), dtype, root,
                           numbers[i])
        for k, cls, fields in self.objects:
            o = cls.__new__(cls)
            d = o.__dict__
            for f, v, e in fields:
                if e is None:
                    d[f] = v
                elif v is not None:
                    i, rank = e
                    d[f] = ndarray((numbers[i + 1],) if rank == 1 else tuple(numbers[i + 1:i + 1 + rank]), v, root,
                                   numbers[i])
                else:
                    d[f] = _array(root, _entry(self.kinds[e[0]], numbers, self.at[e[0]]))
            dict.__setitem__(x, k, o)
        return x


def plan(structure: Any, kinds_bytes: Any, last: Plan | None) -> Plan:
    """The plan for an element of ``structure`` and ``kinds_bytes`` (its layout's kinds,
    pickled; bytes or any buffer): ``last`` when both are its own, else a new one (with
    ``last``'s kinds when only the structure differs: a scalar in it that changes from batch
    to batch, say)."""
    if last is not None and last.kinds_bytes == kinds_bytes:
        if last.structure == structure:
            return last
        return Plan(bytes(structure), last.kinds_bytes, last.kinds)
    kinds_bytes = bytes(kinds_bytes)
    return Plan(bytes(structure), kinds_bytes, pickle.loads(kinds_bytes))


__all__ = ["Plan", "plan", "split_layout"]

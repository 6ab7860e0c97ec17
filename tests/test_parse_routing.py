"""sf.parse_example and sf.parse_single_example take the native parser when it is built
(issue 22: a user's own random-access loop no longer gets the pure-Python path), with the
reference's values, dtypes, shapes and errors."""

from __future__ import annotations

import random

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import DecodeError, ParseError
from shardfeed.formats import example as ex
from shardfeed.formats import parse as fast
from shardfeed.formats.native import native_available
from shardfeed.formats.spec import FixedLen, FixedLenSequence, Sparse, VarLen

from .test_native import CTR_SPEC, HOSTILE, ODD, ODD_SPECS, ctr_record

pytestmark = pytest.mark.skipif(not native_available(), reason="the native core is not built")

SPECS = ODD_SPECS + [CTR_SPEC, {
    "a": VarLen("int64"), "seq": FixedLenSequence("float32", [2], allow_missing=True),
    "sp": Sparse(index_key=["i"], value_key="v", dtype="float32", size=[10]),
    "name": FixedLen("bytes", default=b"none"),
}]


def _same(a, b) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype == np.float32:
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
        else:
            assert a.tolist() == b.tolist()
    elif isinstance(a, sf.SparseColumn):
        _same(a.indices, b.indices)
        _same(a.values, b.values)
        _same(a.dense_shape, b.dense_shape)
    else:
        assert a == b


def _outcome(fn):
    try:
        return "ok", fn()
    except (DecodeError, ParseError, TypeError, ValueError) as e:
        return "err", (type(e), str(e))


def _records():
    rng = random.Random(5)
    out = [ctr_record(rng) for _ in range(20)] + list(ODD.values()) + list(HOSTILE.values())
    out.append(sf.encode_example({"a": [1, 2], "seq": [0.5, 1.5, 2.5, 3.5], "i": [3, 7], "v": [0.25, 0.75],
                                  "name": [b"x"]}))
    out.append(sf.encode_example({"a": [], "i": [3], "v": [0.5, 0.5]}))  # index/value counts differ
    out.append(sf.encode_example({"i": [11], "v": [1.0]}))  # index out of range
    return out


@pytest.mark.parametrize("k", range(len(SPECS)))
def test_single_records_give_the_references_values_and_errors(k):
    spec = SPECS[k]
    for rec in _records():
        ref = _outcome(lambda rec=rec: ex.parse_single_example(rec, spec))
        nat = _outcome(lambda rec=rec: fast.parse_single_example(rec, spec))
        assert ref[0] == nat[0], (rec, ref, nat)
        if ref[0] == "err":
            assert ref[1] == nat[1]
        else:
            assert list(ref[1]) == list(nat[1])
            for name in ref[1]:
                _same(ref[1][name], nat[1][name])


def test_the_public_names_are_the_native_routed_ones():
    assert sf.parse_example is fast.parse_example and sf.parse_single_example is fast.parse_single_example
    rng = random.Random(1)
    recs = [ctr_record(rng) for _ in range(50)]
    got, ref = sf.parse_example(recs, CTR_SPEC), ex.parse_example(recs, CTR_SPEC)
    assert list(got) == list(ref)
    with pytest.raises(TypeError, match="record must be bytes"):
        sf.parse_single_example("not bytes", CTR_SPEC)

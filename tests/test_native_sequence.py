"""Native SequenceExample parsing (sequence_native.py, sf_parse_sequence_batch) against the
pure-Python reference (sequence.parse_sequence_example_py): the same columns (values, float
bits, dtypes, shapes) or the same error (type, message, feature, record index), on odd
encodings, hostile bytes, every truncation, random byte flips and error-order cases.
TensorFlow's side is in test_tf_compat_sequence.py.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import DecodeError
from shardfeed.formats import example as ex
from shardfeed.formats import native as nv
from shardfeed.formats import sequence as sq
from shardfeed.formats.spec import FixedLen, FixedLenSequence, VarLen

from .test_native import HOSTILE, ODD, _outcome, _same_values, bytes_list, entry, f32, float_list, int_list, ld, tag, vi

pytestmark = pytest.mark.skipif(not nv.native_available(), reason=f"native extension not built: {nv.native_info()}")


# ----------------------------------------------------------------------------- helpers


def step_list(key: bytes, *steps: bytes) -> bytes:
    """A FeatureLists map entry: ``key`` and a FeatureList of ``steps`` (Feature bytes)."""
    return ld(1, ld(1, key) + ld(2, b"".join(ld(1, s) for s in steps)))


def seq_example(context: bytes = b"", lists: bytes = b"") -> bytes:
    """A SequenceExample of context map entries and feature-list map entries."""
    return ld(1, context) + ld(2, lists)


def _same_item(a, b) -> None:
    if isinstance(a, (np.generic, bytes)):  # a single record's scalar
        assert type(a) is type(b), (type(a), type(b))
        if isinstance(a, np.floating):
            assert np.array([a]).view(np.uint32)[0] == np.array([b]).view(np.uint32)[0]
        else:
            assert a == b
    else:
        _same_values(a, b)


def check_same_seq(records, context, sequence, *, single: bool = False):
    """Reference vs native on the same records and specs, identical in every part. Returns
    the reference outcome."""
    ref = _outcome(lambda: sq.parse_sequence_example_py(records, context, sequence, single=single))
    if single:
        nat = _outcome(lambda: sf.parse_single_sequence_example(records[0], context, sequence))
    else:
        nat = _outcome(lambda: sf.parse_sequence_example(records, context, sequence))
    assert ref[0] == nat[0], (ref, nat)
    if ref[0] == "err":
        assert ref[1] == nat[1]
        return ref
    for want, got in zip(ref[1], nat[1]):
        assert list(want) == list(got)
        for k in want:
            _same_item(want[k], got[k])
    if not single:
        assert len(nat[1]) == 3
    return ref


SPECS = [
    ({"a": VarLen("int64"), "b": FixedLen("float32", [2], default=0.0), "c": VarLen("bytes")},
     {"a": VarLen("int64"), "b": VarLen("float32"), "c": VarLen("bytes"), "": VarLen("int64")}),
    ({"a": FixedLen("int64", default=-1)},
     {"a": FixedLenSequence("int64", allow_missing=True), "b": FixedLenSequence("float32", shape=[2], allow_missing=True),
      "c": FixedLenSequence("bytes", allow_missing=True)}),
    ({"zz": VarLen("int64")}, {"zz": VarLen("int64"), "ключ": FixedLenSequence("int64")}),
    ({}, {"a": FixedLenSequence("int64", shape=[0], allow_missing=True), "\ud800": VarLen("float32")}),
]


def check_all_specs(records) -> None:
    for ctx, seq in SPECS:
        check_same_seq(records, ctx, seq)
        if len(records) == 1:
            check_same_seq(records, ctx, seq, single=True)


# ----------------------------------------------------------------------------- odd encodings

A_STEPS = step_list(b"a", int_list(1), int_list(2))
ODD_SEQ = {
    "plain": seq_example(entry(b"a", int_list(5)), step_list(b"a", int_list(1), int_list(2))
                         + step_list(b"b", float_list(1.0, 2.0)) + step_list(b"c", bytes_list(b"x"), bytes_list(b""))),
    "no feature lists field": ld(1, entry(b"a", int_list(5))),
    "feature lists only": ld(2, A_STEPS),
    "empty": b"",
    "unpacked ints in steps": ld(2, step_list(b"a", ld(3, vi(1, 5) + vi(1, 2**64 - 1)), ld(3, vi(1, 7)))),
    "unpacked floats in steps": ld(2, step_list(b"b", ld(2, f32(1, 1.5) + f32(1, -2.0)))),
    "signaling nan steps": ld(2, step_list(b"b", ld(2, f32(1, b"\x01\x00\x80\x7f") + f32(1, b"\x01\x00\x80\xff")),
                                            ld(2, ld(1, b"\x01\x00\x80\x7f\x00\x00\xc0\x7f")))),
    "packed in chunks": ld(2, step_list(b"a", ld(3, ld(1, b"\x01\x02") + ld(1, b"") + ld(1, b"\x03") + vi(1, 4)))),
    "oneof switch inside a step": ld(2, step_list(b"a", int_list(1) + bytes_list(b"x") + int_list(9))),
    "oneof same kind merges in a step": ld(2, step_list(b"a", int_list(1) + int_list(2))),
    "kindless steps": ld(2, step_list(b"a", b"", int_list(3), b"") + step_list(b"c", b"")),
    "empty lists of a kind": ld(2, step_list(b"a", ld(3, b"")) + step_list(b"b", ld(2, b"")) + step_list(b"c", ld(1, b""))),
    "no steps": ld(2, step_list(b"a") + step_list(b"b") + step_list(b"c")),
    "missing value": ld(2, ld(1, ld(1, b"a"))),
    "missing key": ld(2, ld(1, ld(2, ld(1, int_list(4))))),
    "value before key": ld(2, ld(1, ld(2, ld(1, int_list(4))) + ld(1, b"a"))),
    "key twice": ld(2, ld(1, ld(1, b"zz") + ld(2, ld(1, int_list(3))) + ld(1, b"a"))),
    "unwanted key then wanted": ld(2, ld(1, ld(1, b"q") + ld(2, ld(1, int_list(3))) + ld(1, b"a"))),
    "wanted key then unwanted": ld(2, ld(1, ld(1, b"a") + ld(2, ld(1, int_list(3))) + ld(1, b"q"))),
    "value twice appends steps": ld(2, ld(1, ld(1, b"a") + ld(2, ld(1, int_list(1))) + ld(2, ld(1, int_list(2)) + ld(1, b"")))),
    "duplicate entries last wins": ld(2, step_list(b"a", int_list(1), int_list(2)) + step_list(b"b", float_list(1.0))
                                      + step_list(b"a", int_list(3))),
    "duplicate entry with no steps wins": ld(2, step_list(b"a", int_list(1)) + step_list(b"a")),
    "feature lists twice merge": ld(2, step_list(b"a", int_list(1))) + ld(2, step_list(b"b", float_list(2.0, 3.0))),
    "feature lists twice, same key": ld(2, step_list(b"a", int_list(1))) + ld(2, step_list(b"a", int_list(2), int_list(3))),
    "context after lists, twice": ld(2, A_STEPS) + ld(1, entry(b"a", int_list(1))) + ld(1, entry(b"b", float_list(1, 2))),
    "same key in context and lists": seq_example(entry(b"zz", int_list(7)), step_list(b"zz", int_list(8))),
    "unknown fields everywhere": (
        vi(3, 5) + f32(4, 1.0) + tag(5, 3) + vi(1, 1) + tag(5, 4)
        + ld(2, vi(2, 1) + ld(1, vi(3, 1) + ld(1, b"a") + tag(7, 3) + tag(7, 4)
                              + ld(2, vi(2, 1) + f32(3, 0.5) + ld(1, vi(4, 1) + ld(3, vi(2, 9) + ld(1, b"\x05")))
                                   + tag(6, 1) + b"\0" * 8)) + ld(9, b"junk"))
    ),
    "known fields wrong wire type": ld(2, vi(1, 3) + ld(1, vi(1, 1) + ld(1, b"a") + vi(2, 4) + ld(2, vi(1, 1) + ld(1, int_list(6)))))
    + vi(2, 1) + vi(1, 1),
    "groups at every level": ld(2, tag(8, 3) * 20 + tag(8, 4) * 20 + ld(1, ld(1, b"a") + tag(8, 3) + tag(8, 4) + ld(
        2, tag(8, 3) * 5 + tag(8, 4) * 5 + ld(1, tag(8, 3) + tag(8, 4) + ld(3, tag(8, 3) + tag(8, 4) + ld(1, b"\x01")))))),
    "wrong kind steps": ld(2, step_list(b"a", int_list(1), float_list(1.0)) + step_list(b"c", int_list(1))),
    "wrong count steps": ld(2, step_list(b"b", float_list(1.0, 2.0), float_list(3.0)) + step_list(b"a", int_list(1, 2))),
    "many steps": ld(2, step_list(b"a", *[int_list(i) for i in range(300)])
                     + step_list(b"c", *[bytes_list(b"%d" % i) for i in range(300)])),
    "long steps": ld(2, step_list(b"a", int_list(*range(-500, 500)), int_list(*range(9)))
                     + step_list(b"b", float_list(*range(200)), float_list(1, 2))),
    "big key": ld(2, step_list(b"k" * 300, int_list(1)) + step_list(b"a", int_list(2))),
    "non-ascii key": ld(2, step_list("ключ".encode(), int_list(1), int_list(2)) + step_list(b"zz", int_list(3))),
    "empty key": ld(2, step_list(b"", int_list(1), int_list(2, 3))),
}
ODD_SEQ.update({f"example: {k}": v for k, v in ODD.items()})


@pytest.mark.parametrize("name", list(ODD_SEQ))
def test_odd_encodings_same_on_both_paths(name):
    rec = ODD_SEQ[name]
    ex.decode_sequence_example(rec)  # valid for the reference
    assert nv.validate_sequence_example(rec) is None
    check_all_specs([rec])
    check_all_specs([rec, ODD_SEQ["plain"], rec])


def test_batches_of_odd_encodings():
    rng = random.Random(3)
    recs = list(ODD_SEQ.values())
    for _ in range(40):
        check_all_specs(rng.sample(recs, rng.randrange(0, 6)))
    check_all_specs([])


# ----------------------------------------------------------------------------- hostile bytes


HOSTILE_SEQ = {
    "step length past end": ld(2, ld(1, ld(1, b"a") + ld(2, b"\x0a\x05\x1a"))),
    "step huge length": ld(2, ld(1, ld(1, b"a") + ld(2, b"\x0a" + sf.formats.wire.encode_varint(2**63) + b"x"))),
    "list length over 2GiB": ld(2, ld(1, ld(1, b"a") + b"\x12" + sf.formats.wire.encode_varint(2**31) + b"x")),
    "entry length past lists": ld(2, b"\x0a\x09\x0a\x01a"),
    "lists length past record": b"\x12\x05ab",
    "lists not a message": ld(2, b"\x07"),
    "feature list not a message": ld(2, ld(1, ld(1, b"a") + ld(2, b"\x0f"))),
    "truncated tag in a step": ld(2, step_list(b"a", b"\x8a")),
    "field zero in a feature list": ld(2, ld(1, ld(1, b"a") + ld(2, b"\x02\x00"))),
    "end group in lists": ld(2, tag(3, 4)),
    "end group in entry": ld(2, ld(1, ld(1, b"a") + tag(3, 4))),
    "end group in feature list": ld(2, ld(1, ld(1, b"a") + ld(2, tag(2, 4)))),
    "end group in step": ld(2, step_list(b"a", tag(4, 4))),
    "end group in step's list": ld(2, step_list(b"a", ld(3, tag(1, 4)))),
    "group never closed in a feature list": ld(2, ld(1, ld(1, b"a") + ld(2, tag(5, 3) + vi(1, 1)))),
    "packed float bad length in a step": ld(2, step_list(b"b", float_list(1.0), ld(2, ld(1, b"\0\0\0")))),
    "packed float bad length, unwanted key": ld(2, step_list(b"q", ld(2, ld(1, b"\0\0\0")))),
    "truncated float in a step": ld(2, step_list(b"b", ld(2, tag(1, 5) + b"\0\0"))),
    "long packed varint too long in a step": ld(2, step_list(b"a", ld(3, ld(1, b"\x01" * 95 + b"\x80" * 10 + b"\x01")))),
    "short packed varint truncated in a step": ld(2, step_list(b"a", ld(3, ld(1, b"\x01\x80")))),
    "bad utf8 list key": ld(2, step_list(b"\xc3\x28", int_list(1))),
    "bad utf8 second list key": ld(2, ld(1, ld(1, b"a") + ld(1, b"\xff"))),
    "bad utf8 key after the steps": ld(2, ld(1, ld(2, ld(1, int_list(1))) + ld(1, b"\xed\xa0\x80"))),
    "error in a dropped duplicate list": ld(2, step_list(b"a", ld(3, ld(1, b"\x80"))) + step_list(b"a", int_list(1))),
    "context error before lists error": ld(1, entry(b"a", ld(3, ld(1, b"\x80")))) + ld(2, b"\x07"),
    "lists error before context error": ld(2, b"\x07") + ld(1, entry(b"a", ld(3, ld(1, b"\x80")))),
    "decode error after a spec error": ld(2, step_list(b"a", float_list(1.0)) + step_list(b"q", ld(3, ld(1, b"\xff")))),
}
for depth in (94, 95, 96, 97, 98, 99, 100):
    g = tag(5, 3) * depth + tag(5, 4) * depth
    HOSTILE_SEQ[f"groups {depth} deep in lists"] = ld(2, g)
    HOSTILE_SEQ[f"groups {depth} deep in an entry"] = ld(2, ld(1, ld(1, b"a") + g))
    HOSTILE_SEQ[f"groups {depth} deep in a feature list"] = ld(2, ld(1, ld(1, b"a") + ld(2, g)))
    HOSTILE_SEQ[f"groups {depth} deep in a step"] = ld(2, step_list(b"a", g))
    HOSTILE_SEQ[f"groups {depth} deep in a step's list"] = ld(2, step_list(b"a", ld(3, g)))
    HOSTILE_SEQ[f"groups {depth} deep at the top"] = tag(5, 3) * depth + tag(5, 4) * depth
HOSTILE_SEQ.update({f"example: {k}": v for k, v in HOSTILE.items()})
# an Example's hostile features read as feature lists: the same bytes under field 2
HOSTILE_SEQ.update({f"as lists: {k}": b"\x12" + v[1:] for k, v in HOSTILE.items() if v[:1] == b"\x0a"})


def _reference_decode_error(rec: bytes) -> str | None:
    try:
        ex.decode_sequence_example(rec)
    except DecodeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", list(HOSTILE_SEQ))
def test_hostile_records_same_error_on_both_paths(name):
    rec = HOSTILE_SEQ[name]
    good = ODD_SEQ["plain"]
    for ctx, seq in SPECS:
        check_same_seq([good, rec], ctx, seq)
        check_same_seq([rec], ctx, seq, single=True)
    assert nv.validate_sequence_example(rec) == _reference_decode_error(rec)


def test_every_truncation_and_random_flips_same_on_both_paths():
    rng = random.Random(19)
    pool = [ODD_SEQ[k] for k in ("plain", "unknown fields everywhere", "groups at every level", "value twice appends steps",
                                 "long steps", "signaling nan steps", "context after lists, twice")]
    for rec in pool:
        for cut in range(len(rec)):
            ctx, seq = SPECS[cut % len(SPECS)]
            check_same_seq([rec[:cut]], ctx, seq)
            assert nv.validate_sequence_example(rec[:cut]) == _reference_decode_error(rec[:cut])
    for _ in range(2000):
        rec = bytearray(rng.choice(pool))
        for _ in range(rng.randrange(1, 4)):
            op, pos = rng.randrange(3), rng.randrange(len(rec))
            if op == 0:
                rec[pos] = rng.randrange(256)
            elif op == 1:
                rec.insert(pos, rng.choice([0x08, 0x0A, 0x12, 0x1A, 0x80, 0xFF, 0x0B, 0x0C, 0x0D, 0x00]))
            elif len(rec) > 1:
                del rec[pos]
        ctx, seq = rng.choice(SPECS)
        check_same_seq([bytes(rec)], ctx, seq)


# ----------------------------------------------------------------------------- error order


def test_a_decode_error_in_a_later_record_beats_spec_errors_in_earlier_ones():
    ctx, seq = {"id": FixedLen("int64")}, {"a": FixedLenSequence("int64")}
    no_id = seq_example(b"", step_list(b"a", int_list(1)))
    bad = b"\x12\x05ab"
    out = check_same_seq([no_id, bad], ctx, seq)
    assert out[1][0] is DecodeError and out[1][3] == 1
    out = check_same_seq([seq_example(entry(b"id", int_list(1))), bad], ctx, seq)  # no list "a" in record 0
    assert out[1][0] is DecodeError and out[1][3] == 1


def test_context_errors_come_before_feature_list_errors_then_columns_in_spec_order():
    ctx = {"id": FixedLen("int64")}
    seq = {"a": FixedLenSequence("int64"), "b": VarLen("float32")}
    ok = seq_example(entry(b"id", int_list(1)), step_list(b"a", int_list(1)) + step_list(b"b", float_list(1)))
    b_bad = seq_example(entry(b"id", int_list(1)), step_list(b"a", int_list(1)) + step_list(b"b", int_list(1)))
    a_bad = seq_example(entry(b"id", int_list(1)), step_list(b"a", int_list(1, 2)) + step_list(b"b", float_list(1)))
    both_bad = seq_example(entry(b"id", int_list(1)), step_list(b"a", int_list(1), b"") + step_list(b"b", int_list(1)))
    no_id = seq_example(b"", step_list(b"a", int_list(1)) + step_list(b"b", float_list(1)))
    cases = [
        ([ok, b_bad, a_bad], "a", 2),      # an earlier column wins over an earlier record
        ([b_bad, ok, no_id], "id", 2),     # a context error wins over any feature-list error
        ([both_bad, b_bad], "a", 0),       # in one record: the first column in spec order
        ([ok, both_bad, no_id, a_bad], "id", 2),
        ([b_bad, b_bad], "b", 0),
    ]
    for recs, feature, record in cases:
        out = check_same_seq(recs, ctx, seq)
        assert out[0] == "err" and out[1][2:] == (feature, record), out


def test_record_types_and_spec_errors_same_on_both_paths():
    ctx, seq = {"id": FixedLen("int64")}, {"a": VarLen("int64")}
    rec = seq_example(entry(b"id", int_list(1)), step_list(b"a", int_list(1)))
    no_id = seq_example(b"", step_list(b"a", int_list(1)))
    check_same_seq([bytearray(rec), memoryview(rec), rec], ctx, seq)
    check_same_seq((rec, rec), ctx, seq)
    check_same_seq(np.array([rec, rec], dtype=object), ctx, seq)
    out = check_same_seq([no_id, "text"], ctx, seq)  # every record is decoded before any is checked
    assert out[1][0] is TypeError and "record #1" in out[1][1]
    out = check_same_seq([b"\x12\x05ab", 5], ctx, seq)
    assert out[1][0] is DecodeError
    check_same_seq(rec, ctx, seq)
    for bad_ctx in ({"id": FixedLen("int64", [2], default=[1, 2, 3])}, {"id": FixedLen("int64", default="x")},
                    {"id": sf.Sparse("i", "v", "int64", 4)}, {"id": FixedLenSequence("int64", allow_missing=True)}):
        check_same_seq([b"\x12\x05ab"], bad_ctx, seq)  # the spec error, before any record
    check_same_seq([rec], {}, {})
    check_same_seq([rec], ctx, {"a": FixedLenSequence("int64", default=1)})
    check_same_seq([rec], ctx, {"a": FixedLen("int64")})


def test_single_record_values_and_errors_have_no_batch_dimension():
    ctx = {"id": FixedLen("int64"), "name": FixedLen("bytes", default=b"-"), "f": FixedLen("float32", [2], default=0.5),
           "v": VarLen("bytes")}
    seq = {"a": FixedLenSequence("int64"), "b": VarLen("float32")}
    rec = seq_example(entry(b"id", int_list(3)) + entry(b"v", bytes_list(b"p", b"q")),
                      step_list(b"a", int_list(1), int_list(2)) + step_list(b"b", float_list(1), b"", float_list(2, 3)))
    check_same_seq([rec], ctx, seq, single=True)
    out = check_same_seq([seq_example(entry(b"id", int_list(3)))], ctx, seq, single=True)
    assert out[1][2:] == ("a", None)


def test_compiled_specs_are_cached_by_content():
    from shardfeed.formats import sequence_native as sqn

    ctx, seq = sq.check_sequence_specs({"id": FixedLen("int64")}, {"a": VarLen("int64")})
    one = sqn.compile_sequence_spec(ctx, seq)
    assert sqn.compile_sequence_spec(dict(ctx), dict(seq)) is one
    assert sqn.compile_sequence_spec(ctx, {"a": VarLen("float32")}) is not one
    unhashable = {"id": FixedLen("int64", [2], default=[1, 2])}
    assert sqn.compile_sequence_spec(unhashable, seq) is not sqn.compile_sequence_spec(unhashable, seq)


def test_pure_python_path_when_the_extension_is_missing(monkeypatch):
    ctx, seq = {"id": FixedLen("int64")}, {"a": FixedLenSequence("int64"), "b": VarLen("bytes")}
    recs = [seq_example(entry(b"id", int_list(i)), step_list(b"a", *[int_list(j) for j in range(i)])
                        + step_list(b"b", bytes_list(b"x" * i))) for i in range(5)]
    native_out = sf.parse_sequence_example(recs, ctx, seq)
    monkeypatch.setattr(nv, "_ext", None)
    py_out = sf.parse_sequence_example(recs, ctx, seq)
    for want, got in zip(py_out, native_out):
        for k in want:
            _same_item(want[k], got[k])


# ----------------------------------------------------------------------------- random records


def random_sequence_example(rng: random.Random) -> tuple[dict, dict]:
    """Context and feature lists that fit SPEC_RANDOM (lists sometimes missing)."""
    ctx = {"id": [rng.randrange(-(2**63), 2**63)], "w": np.array([rng.uniform(-9, 9) for _ in range(rng.randrange(4))],
                                                                  np.float32)}
    lists = {}
    if rng.random() < 0.9:
        lists["tok"] = [[rng.randrange(-(2**40), 2**40) for _ in range(2)] for _ in range(rng.randrange(6))]
    if rng.random() < 0.9:
        lists["txt"] = [[rng.randbytes(rng.randrange(4)) for _ in range(rng.randrange(4))] for _ in range(rng.randrange(5))]
    if rng.random() < 0.9:
        lists["x"] = [np.array([rng.uniform(-1, 1) for _ in range(rng.randrange(3))], np.float32)
                      for _ in range(rng.randrange(5))]
    if rng.random() < 0.5:
        lists["other"] = [[1], [b"x"]]
    return ctx, lists


SPEC_RANDOM = ({"id": FixedLen("int64"), "w": VarLen("float32")},
               {"tok": FixedLenSequence("int64", shape=[2], allow_missing=True), "txt": VarLen("bytes"),
                "x": VarLen("float32")})


def test_random_batches_same_on_both_paths():
    rng = random.Random(5)
    for _ in range(30):
        recs = [sf.encode_sequence_example(*random_sequence_example(rng)) for _ in range(rng.randrange(1, 30))]
        out = check_same_seq(recs, *SPEC_RANDOM)
        assert out[0] == "ok"

"""Batch parsing against a spec: FixedLen, VarLen, Sparse, errors.

Expected values here are written by hand; tests/test_tf_compat_example.py checks the
same rules against tf.io.parse_example.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import DecodeError, ParseError
from shardfeed.formats.example import decode_example, encode_example, parse_example, parse_single_example
from shardfeed.formats.spec import FixedLen, RaggedColumn, Sparse, SparseColumn, VarLen
from shardfeed.formats.wire import encode_tag, encode_varint


def ld(field: int, payload: bytes) -> bytes:
    return encode_tag(field, 2) + encode_varint(len(payload)) + payload


# ----------------------------------------------------------------------------- FixedLen


def test_fixed_len_scalars_of_each_dtype():
    recs = [encode_example({"i": 3, "f": 0.5, "b": b"x"}), encode_example({"i": -4, "f": 1.5, "b": "é"})]
    out = parse_example(recs, {"i": FixedLen("int64"), "f": FixedLen("float32"), "b": FixedLen("bytes")})
    assert out["i"].dtype == np.int64 and out["i"].shape == (2,) and out["i"].tolist() == [3, -4]
    assert out["f"].dtype == np.float32 and out["f"].tolist() == [0.5, 1.5]
    assert out["b"].dtype == object and out["b"].tolist() == [b"x", "é".encode()]


def test_fixed_len_shape_reshapes_row_major():
    recs = [encode_example({"m": list(range(6))}), encode_example({"m": list(range(10, 16))})]
    out = parse_example(recs, {"m": FixedLen("int64", shape=(2, 3))})
    assert out["m"].shape == (2, 2, 3)
    assert out["m"][1].tolist() == [[10, 11, 12], [13, 14, 15]]


def test_fixed_len_bytes_with_shape():
    recs = [encode_example({"b": [b"a", b"", b"c"]})]
    out = parse_example(recs, {"b": FixedLen("bytes", shape=[3])})
    assert out["b"].shape == (1, 3) and out["b"].tolist() == [[b"a", b"", b"c"]]


def test_missing_feature_takes_scalar_default_broadcast():
    recs = [encode_example({"x": [1, 2, 3]}), encode_example({"other": 1})]
    out = parse_example(recs, {"x": FixedLen("int64", shape=[3], default=7)})
    assert out["x"].tolist() == [[1, 2, 3], [7, 7, 7]]


def test_missing_feature_takes_full_default_reshaped():
    recs = [encode_example({})]
    out = parse_example(recs, {"x": FixedLen("float32", shape=[2, 2], default=[1, 2, 3, 4]),
                               "b": FixedLen("bytes", shape=[2], default=["p", b"q"])})
    assert out["x"].tolist() == [[[1.0, 2.0], [3.0, 4.0]]]
    assert out["b"].tolist() == [[b"p", b"q"]]


def test_feature_with_no_kind_counts_as_missing():
    recs = [encode_example({"x": []})]
    assert parse_example(recs, {"x": FixedLen("int64", default=5)})["x"].tolist() == [5]
    with pytest.raises(ParseError, match="required feature is missing"):
        parse_example(recs, {"x": FixedLen("int64")})


def test_missing_without_default_names_feature_and_record():
    recs = [encode_example({"x": 1}), encode_example({"y": 1})]
    with pytest.raises(ParseError, match=r"feature 'x', record #1: required feature is missing") as e:
        parse_example(recs, {"x": FixedLen("int64")})
    assert e.value.feature == "x" and e.value.record_index == 1


def test_wrong_number_of_values_says_expected_and_got():
    recs = [encode_example({"x": [1, 2, 3]}), encode_example({"x": [1, 2]})]
    with pytest.raises(ParseError, match=r"feature 'x', record #1: expected 3 int64 values for shape \[3\], got 2"):
        parse_example(recs, {"x": FixedLen("int64", shape=[3])})


@pytest.mark.parametrize(
    "value,spec_dtype,held",
    [([b"a"], "int64", "bytes_list"), ([1], "float32", "int64_list"), ([0.5], "bytes", "float_list"),
     (np.array([], np.float32), "int64", "float_list")],
)
def test_wrong_kind_is_a_parse_error_even_when_empty(value, spec_dtype, held):
    recs = [encode_example({"x": value})]
    with pytest.raises(ParseError, match=rf"feature 'x', record #0: the feature holds {held} values"):
        parse_example(recs, {"x": FixedLen(spec_dtype, shape=[len(value)])})
    with pytest.raises(ParseError, match=rf"holds {held} values"):
        parse_example(recs, {"x": VarLen(spec_dtype)})


@pytest.mark.parametrize(
    "spec,error,match",
    [
        (FixedLen("int64", shape=[3], default=[1, 2]), ValueError, r"default of feature 'x' has 2 values but shape \[3\] needs 3"),
        (FixedLen("int64", default=1.5), ValueError, "non-integer"),
        (FixedLen("int64", default=2**63), ValueError, "outside the int64 range"),
        (FixedLen("float32", default="a"), TypeError, "must be numeric"),
        (FixedLen("bytes", default=[1]), TypeError, "bytes_list values must be bytes or str"),
    ],
)
def test_bad_default_is_rejected_up_front(spec, error, match):
    with pytest.raises(error, match=match):
        parse_example([], {"x": spec})


def test_zero_size_shape_accepts_an_empty_list_of_the_right_kind():
    out = parse_example([encode_example({"x": np.array([], np.int64)})], {"x": FixedLen("int64", shape=[0])})
    assert out["x"].shape == (1, 0)


# ----------------------------------------------------------------------------- VarLen


def test_var_len_gives_values_and_row_splits():
    recs = [encode_example({"v": [1, 2]}), encode_example({}), encode_example({"v": []}),
            encode_example({"v": [3]})]
    out = parse_example(recs, {"v": VarLen("int64")})
    col = out["v"]
    assert isinstance(col, RaggedColumn)
    assert col.values.dtype == np.int64 and col.values.tolist() == [1, 2, 3]
    assert col.row_splits.dtype == np.int64 and col.row_splits.tolist() == [0, 2, 2, 2, 3]


def test_var_len_bytes_and_floats():
    recs = [encode_example({"b": [b"x", b""], "f": [0.5]}), encode_example({"b": [b"\x00"], "f": []})]
    out = parse_example(recs, {"b": VarLen("bytes"), "f": VarLen("float32")})
    assert out["b"].values.dtype == object and out["b"].values.tolist() == [b"x", b"", b"\x00"]
    assert out["b"].row_splits.tolist() == [0, 2, 3]
    assert out["f"].values.dtype == np.float32 and out["f"].row_splits.tolist() == [0, 1, 1]


def test_zero_records_give_empty_columns():
    out = parse_example([], {"a": FixedLen("int64", shape=[2]), "b": VarLen("bytes"),
                             "s": Sparse("i", "v", "float32", 4)})
    assert out["a"].shape == (0, 2) and out["a"].dtype == np.int64
    assert out["b"].row_splits.tolist() == [0] and len(out["b"].values) == 0
    assert out["s"].dense_shape.tolist() == [0, 4] and out["s"].indices.shape == (0, 2)


# ----------------------------------------------------------------------------- Sparse


def test_sparse_sorts_indices_per_record():
    recs = [encode_example({"i": [3, 1], "v": [0.3, 0.1]}), encode_example({"i": [4], "v": [0.4]}), encode_example({})]
    out = parse_example(recs, {"s": Sparse("i", "v", "float32", 5)})
    s = out["s"]
    assert isinstance(s, SparseColumn)
    assert s.indices.tolist() == [[0, 1], [0, 3], [1, 4]]
    np.testing.assert_array_equal(s.values, np.array([0.1, 0.3, 0.4], np.float32))
    assert s.dense_shape.tolist() == [3, 5]


def test_sparse_duplicate_indices_keep_their_order():
    recs = [encode_example({"i": [3, 3, 1], "v": [b"a", b"b", b"c"]})]
    s = parse_example(recs, {"s": Sparse("i", "v", "bytes", 5)})["s"]
    assert s.indices.tolist() == [[0, 1], [0, 3], [0, 3]]
    assert s.values.tolist() == [b"c", b"a", b"b"]


def test_sparse_already_sorted_keeps_record_order():
    recs = [encode_example({"i": [3, 1], "v": [30, 10]})]
    s = parse_example(recs, {"s": Sparse("i", "v", "int64", 5, already_sorted=True)})["s"]
    assert s.indices.tolist() == [[0, 3], [0, 1]] and s.values.tolist() == [30, 10]


def test_sparse_with_two_index_dimensions():
    recs = [encode_example({"r": [1, 0, 1], "c": [2, 3, 0], "v": [1.0, 2.0, 3.0]})]
    s = parse_example(recs, {"s": Sparse(["r", "c"], "v", "float32", [2, 4])})["s"]
    assert s.indices.tolist() == [[0, 0, 3], [0, 1, 0], [0, 1, 2]]
    assert s.values.tolist() == [2.0, 3.0, 1.0]
    assert s.dense_shape.tolist() == [1, 2, 4]


def test_sparse_count_mismatch_is_a_parse_error():
    recs = [encode_example({"i": [1, 2], "v": [0.5]})]
    with pytest.raises(ParseError, match=r"feature 's', record #0: index feature 'i' has 2 values but value feature 'v' has 1"):
        parse_example(recs, {"s": Sparse("i", "v", "float32", 5)})
    with pytest.raises(ParseError, match="index feature 'i' has 0 values"):
        parse_example([encode_example({"v": [0.5]})], {"s": Sparse("i", "v", "float32", 5)})


@pytest.mark.parametrize("bad", [5, -1])
def test_sparse_index_out_of_range_is_a_parse_error(bad):
    recs = [encode_example({"i": [0], "v": [0]}), encode_example({"i": [1, bad], "v": [1, 2]})]
    with pytest.raises(ParseError, match=rf"feature 's', record #1: index feature 'i' holds {bad}, outside \[0, 5\)"):
        parse_example(recs, {"s": Sparse("i", "v", "int64", 5)})


def test_sparse_index_must_be_int64():
    recs = [encode_example({"i": [1.0], "v": [1.0]})]
    with pytest.raises(ParseError, match="index feature 'i' holds float_list values"):
        parse_example(recs, {"s": Sparse("i", "v", "float32", 5)})


# ----------------------------------------------------------------------------- records


def test_features_outside_the_spec_are_ignored():
    recs = [encode_example({"x": 1, "junk": [b"a"] * 3, "more": [0.5]})]
    assert list(parse_example(recs, {"x": FixedLen("int64")})) == ["x"]


def test_malformed_feature_outside_the_spec_is_still_an_error():
    good = encode_example({"x": 1})
    bad = ld(1, ld(1, ld(1, b"x") + ld(2, ld(3, ld(1, b"\x02")))) + ld(1, ld(1, b"junk") + ld(2, ld(2, ld(1, b"abc")))))
    with pytest.raises(DecodeError, match=r"not a multiple of 4.*record #1") as e:
        parse_example([good, bad], {"x": FixedLen("int64")})
    assert e.value.record_index == 1


@pytest.mark.parametrize("record", [b"\xff" * 10, b"\x0a\x05ab", b"\x0a" + encode_varint(2**40)])
def test_record_that_is_not_an_example_names_its_index(record):
    recs = [encode_example({"x": 1}), encode_example({"x": 2}), record]
    with pytest.raises(DecodeError, match=r"not a valid tf.train.Example: .*byte \d+.*, record #2") as e:
        parse_example(recs, {"x": FixedLen("int64")})
    assert e.value.record_index == 2


def test_duplicate_key_last_wins_when_parsing():
    rec = ld(1, ld(1, ld(1, b"x") + ld(2, ld(3, ld(1, b"\x01")))) + ld(1, ld(1, b"x") + ld(2, ld(3, ld(1, b"\x02")))))
    assert parse_example([rec], {"x": FixedLen("int64")})["x"].tolist() == [2]


def test_records_may_be_memoryviews_bytearrays_or_object_arrays():
    data = encode_example({"x": 4})
    recs = np.array([data, memoryview(data), bytearray(data)], dtype=object)
    assert parse_example(recs, {"x": FixedLen("int64")})["x"].tolist() == [4, 4, 4]


def test_bad_records_argument_is_rejected():
    data = encode_example({"x": 0})  # ends with a NUL byte
    with pytest.raises(TypeError, match="parse_single_example"):
        parse_example(data, {"x": FixedLen("int64")})
    with pytest.raises(TypeError, match="drops trailing NUL bytes"):
        parse_example(np.array([data]), {"x": FixedLen("int64")})
    with pytest.raises(TypeError, match="record #1: .*bytes"):
        parse_example([data, "text"], {"x": FixedLen("int64")})


def test_bad_spec_is_rejected():
    with pytest.raises(TypeError, match="spec\\['x'\\] is str"):
        parse_example([], {"x": "int64"})


def test_returned_arrays_are_writable_and_independent():
    rec = encode_example({"v": [1.0, 2.0], "i": [1, 2]})
    out = parse_example([rec], {"v": VarLen("float32"), "i": FixedLen("int64", shape=[2])})
    out["v"].values[0] = 9  # raises if read-only
    out["i"][0, 0] = 9
    d = decode_example(rec)
    d["v"][0] = 7
    d["i"][0] = 7
    assert decode_example(rec)["v"].tolist() == [1.0, 2.0]
    assert parse_example([rec], {"v": VarLen("float32")})["v"].values.tolist() == [1.0, 2.0]


# ----------------------------------------------------------------------------- single record


def test_parse_single_example_drops_the_batch_dimension():
    rec = encode_example({"f": [1.0, 2.0], "v": [b"a", b"b"], "i": [2, 0], "w": [5, 6], "n": 3})
    out = parse_single_example(rec, {
        "f": FixedLen("float32", shape=[2]), "n": FixedLen("int64"), "v": VarLen("bytes"),
        "s": Sparse("i", "w", "int64", 4), "d": FixedLen("int64", default=-1),
    })
    assert out["f"].shape == (2,) and out["f"].tolist() == [1.0, 2.0]
    assert isinstance(out["n"], np.int64) and int(out["n"]) == 3
    assert out["v"].dtype == object and out["v"].tolist() == [b"a", b"b"]
    assert out["s"].indices.tolist() == [[0], [2]] and out["s"].values.tolist() == [6, 5]
    assert out["s"].dense_shape.tolist() == [4]
    assert int(out["d"]) == -1
    name = parse_single_example(encode_example({"b": b"img"}), {"b": FixedLen("bytes")})["b"]
    assert isinstance(name, bytes) and name == b"img"


def test_parse_single_example_errors_have_no_record_index():
    with pytest.raises(ParseError) as e:
        parse_single_example(encode_example({}), {"x": FixedLen("int64")})
    assert e.value.record_index is None and "record #" not in str(e.value)
    with pytest.raises(DecodeError) as e:
        parse_single_example(b"\xff", {"x": FixedLen("int64")})
    assert e.value.record_index is None
    with pytest.raises(TypeError):
        parse_single_example([encode_example({})], {"x": VarLen("int64")})


# ----------------------------------------------------------------------------- property


rows = st.lists(
    st.fixed_dictionaries({}, optional={
        "a": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
        "b": st.lists(st.binary(max_size=5), max_size=5),
        "c": st.lists(st.floats(width=32, allow_nan=False), min_size=2, max_size=2),
    }),
    max_size=12,
)


@settings(max_examples=200)
@given(rows)
def test_batch_parse_equals_per_record_decode(batch):
    recs = [encode_example({k: (np.array(v, np.int64) if k == "a" else np.array(v, np.float32) if k == "c" else v)
                            for k, v in row.items()}) for row in batch]
    out = parse_example(recs, {"a": VarLen("int64"), "b": VarLen("bytes"),
                               "c": FixedLen("float32", shape=[2], default=[0, -1])})
    for i, row in enumerate(batch):
        assert out["a"][i].tolist() == row.get("a", [])
        assert out["b"][i].tolist() == row.get("b", [])
        expected_c = np.array(row.get("c", [0, -1]), np.float32)
        assert out["c"][i].tobytes() == expected_c.tobytes()
        single = parse_single_example(recs[i], {"a": VarLen("int64")})
        assert single["a"].tolist() == row.get("a", [])


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_features_the_spec_does_not_ask_for_are_checked_but_never_built():
    """A wide Example read for one feature: no value of the others is built (issue 15 #8)."""
    import tracemalloc

    feats = {f"f{i}": np.arange(i % 5 + 1, dtype=np.int64) for i in range(50_000)}
    feats.update({f"s{i}": [b"x" * 20] for i in range(20_000)})
    feats.update({f"r{i}": np.full(3, 0.5, np.float32) for i in range(20_000)})
    feats["label"] = np.array([7])
    rec = encode_example(feats)
    tracemalloc.start()
    try:
        out = parse_example([rec], {"label": FixedLen("int64"), "f3": VarLen("int64"), "s7": VarLen("bytes")})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out["label"].tolist() == [7]
    assert out["f3"].values.tolist() == [0, 1, 2, 3] and out["s7"].values.tolist() == [b"x" * 20]
    # building every feature costs tens of MB (a dict entry, a list and an array each)
    assert peak < len(rec) // 2, peak


@pytest.mark.parametrize(
    "bad, error",
    [
        (b"\x1a\x02\x0a\x80", "truncated varint"),  # int64_list holding a cut varint
        (b"\x12\x03\x0a\x01\x00", "not a multiple of 4"),  # float_list of 1 byte
        (b"\x0a\x04\x0a\x05ab", "runs past the end"),  # bytes_list value longer than its list
    ],
)
def test_a_malformed_feature_the_spec_does_not_ask_for_is_still_an_error(bad, error):
    """Skipping a feature never skips checking it: the same error as when it is read."""
    entry = b"\x0a\x05other\x12" + bytes([len(bad)]) + bad
    good = b"\x0a\x09\x0a\x01a\x12\x04\x1a\x02\x0a\x00"  # a: int64_list [0]
    features = good + b"\x0a" + bytes([len(entry)]) + entry
    rec = b"\x0a" + bytes([len(features)]) + features
    with pytest.raises(DecodeError, match=error):
        parse_example([rec], {"a": FixedLen("int64")})
    with pytest.raises(DecodeError, match=error):
        parse_example([rec], {"a": FixedLen("int64"), "other": VarLen("int64")})


def test_an_entry_whose_second_key_field_names_a_wanted_feature_is_built():
    """A map entry may carry its key field twice; the last one names the feature."""
    entry = b"\x0a\x02zT\x12\x05\x1a\x03\x0a\x01\x03\x0a\x01a"  # key zT, value [3], key a
    rec = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert parse_example([rec], {"a": FixedLen("int64")})["a"].tolist() == [3]
    assert decode_example(rec)["a"].tolist() == [3]

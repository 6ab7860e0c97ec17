"""Example bytes and batch parsing agree with TensorFlow, value for value."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

from shardfeed.errors import ParseError  # noqa: E402
from shardfeed.formats.example import (  # noqa: E402
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
    parse_example,
    parse_single_example,
)
from shardfeed.formats.spec import FixedLen, Sparse, VarLen  # noqa: E402
from shardfeed.formats.wire import encode_tag, encode_varint  # noqa: E402

pytestmark = pytest.mark.tf


def tf_feature(value):
    if isinstance(value, list) and not value:
        return tf.train.Feature()
    if isinstance(value, np.ndarray) and value.dtype == np.int64:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=value.tolist()))
    if isinstance(value, np.ndarray):
        return tf.train.Feature(float_list=tf.train.FloatList(value=value.tolist()))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=value))


def tf_example(features: dict) -> bytes:
    return tf.train.Example(
        features=tf.train.Features(feature={k: tf_feature(v) for k, v in features.items()})
    ).SerializeToString(deterministic=True)


def assert_values_equal(got, expected):
    if isinstance(expected, list):
        assert got == expected
    else:
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def make_features(seed: int, count: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(count):
        kind = i % 4
        n = int(rng.integers(0, 6))
        if kind == 0:
            out[f"i{i}"] = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
        elif kind == 1:
            out[f"f{i}"] = rng.standard_normal(n).astype(np.float32)
        elif kind == 2:
            out[f"b{i}"] = [bytes(rng.integers(0, 256, size=int(rng.integers(0, 9)), dtype=np.uint8)) for _ in range(n)]
        else:
            out[f"e{i}"] = []
    return out


# ----------------------------------------------------------------------------- bytes


def test_encoding_is_byte_identical_to_tf_for_every_kind():
    features = {"int": np.array([0, -1, 2**63 - 1, 300], np.int64),
                "float": np.array([0.5, np.nan, -np.inf], np.float32),
                "bytes": [b"", b"\x00", "é".encode()], "label": np.array([1], np.int64),
                "label_id": np.array([2], np.int64), "empty": []}
    assert encode_example(features, sort_keys=True) == tf_example(features)


def test_hundreds_of_features_are_byte_identical_and_parse_in_tf():
    features = make_features(seed=3, count=400)
    data = encode_example(features, sort_keys=True)
    assert data == tf_example(features)
    spec = {}
    for k in features:
        spec[k] = tf.io.VarLenFeature({"i": tf.int64, "f": tf.float32, "b": tf.string, "e": tf.int64}[k[0]])
    parsed = tf.io.parse_single_example(encode_example(features), spec)
    for k, v in features.items():
        got = parsed[k].values.numpy()
        if isinstance(v, list):
            assert got.tolist() == v
        else:
            np.testing.assert_array_equal(got, v)


def test_tf_made_examples_decode_equal():
    for seed in range(5):
        features = make_features(seed=seed, count=40)
        got = decode_example(tf_example(features))
        assert set(got) == set(features)
        for k, v in features.items():
            assert_values_equal(got[k], v)


def test_value_over_16_mib_roundtrips_through_tf():
    big = bytes(np.random.default_rng(0).integers(0, 256, size=(16 << 20) + 17, dtype=np.uint8))
    data = encode_example({"blob": [big], "n": 1})
    parsed = tf.io.parse_single_example(data, {"blob": tf.io.FixedLenFeature([], tf.string),
                                               "n": tf.io.FixedLenFeature([], tf.int64)})
    assert parsed["blob"].numpy() == big and int(parsed["n"]) == 1
    tf_data = tf.train.Example(features=tf.train.Features(feature={
        "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[big]))})).SerializeToString()
    assert decode_example(tf_data)["blob"] == [big]
    assert parse_single_example(tf_data, {"blob": FixedLen("bytes")})["blob"] == big


def test_empty_lists_parse_in_tf_as_empty_for_every_dtype():
    data = encode_example({"x": [], "i": np.array([], np.int64), "f": np.array([], np.float32),
                           "b": np.array([], object)})
    for dtype in (tf.int64, tf.float32, tf.string):
        parsed = tf.io.parse_single_example(data, {"x": tf.io.VarLenFeature(dtype)})
        assert parsed["x"].values.numpy().size == 0
    parsed = tf.io.parse_single_example(data, {"i": tf.io.VarLenFeature(tf.int64), "f": tf.io.VarLenFeature(tf.float32),
                                               "b": tf.io.VarLenFeature(tf.string)})
    assert all(parsed[k].values.numpy().size == 0 for k in "ifb")


def test_odd_encodings_decode_like_tf_protobuf():
    from tensorflow.core.example import example_pb2

    def ld(field, payload):
        return encode_tag(field, 2) + encode_varint(len(payload)) + payload

    i64 = lambda *v: ld(3, ld(1, b"".join(encode_varint(x) for x in v)))  # noqa: E731
    cases = [
        ld(1, ld(1, ld(1, b"x") + ld(2, i64(1) + i64(2)))),                          # same kind merges
        ld(1, ld(1, ld(1, b"x") + ld(2, i64(1) + ld(1, ld(1, b"a")) + i64(9)))),     # oneof switches
        ld(1, ld(1, ld(1, b"x") + ld(2, i64(1)))) + ld(1, ld(1, ld(1, b"x") + ld(2, i64(2)))),  # last wins
        ld(1, ld(1, ld(2, i64(3)) + ld(1, b"k"))) + encode_tag(7, 3) + encode_tag(7, 4),
    ]
    for data in cases:
        m = example_pb2.Example.FromString(data)
        got = decode_example(data)
        assert set(got) == set(m.features.feature)
        for k, f in m.features.feature.items():
            kind = f.WhichOneof("kind")
            assert (got[k] if isinstance(got[k], list) else got[k].tolist()) == list(getattr(f, kind).value)


# ----------------------------------------------------------------------------- parse_example


def _batch():
    rows = [
        {"label": 1, "dense": [0.5, 1.5, 2.5], "ids": [4, 5], "name": b"a", "si": [3, 1], "sv": [0.3, 0.1],
         "r": [1, 0], "c": [2, 2], "m": [1.0, 2.0]},
        {"label": 0, "ids": [], "name": "é", "si": [2], "sv": [0.2], "tags": [b"x", b"y"]},
        {"label": 7, "dense": [1.0, 2.0, 3.0], "ids": [9], "empty": [], "si": [4, 4, 0], "sv": [1.0, 2.0, 3.0],
         "r": [0], "c": [1], "m": [5.0]},
        {"label": -2, "grid": list(range(6)), "tags": [b""]},
    ]
    return [encode_example(r) for r in rows]


def test_parse_example_matches_tf_parse_example():
    recs = _batch()
    ours = parse_example(recs, {
        "label": FixedLen("int64"),
        "dense": FixedLen("float32", shape=[3], default=[9.0, 8.0, 7.0]),
        "grid": FixedLen("int64", shape=[2, 3], default=-1),  # scalar default: ours broadcasts
        "name": FixedLen("bytes", default=b"?"),
        "ids": VarLen("int64"), "tags": VarLen("bytes"), "empty": VarLen("float32"),
        "sp": Sparse("si", "sv", "float32", 5),
        "sp2": Sparse(["r", "c"], "m", "float32", [2, 3]),
    })
    theirs = tf.io.parse_example(recs, {
        "label": tf.io.FixedLenFeature([], tf.int64),
        "dense": tf.io.FixedLenFeature([3], tf.float32, default_value=[9.0, 8.0, 7.0]),
        "grid": tf.io.FixedLenFeature([2, 3], tf.int64, default_value=[-1] * 6),
        "name": tf.io.FixedLenFeature([], tf.string, default_value=b"?"),
        "ids": tf.io.VarLenFeature(tf.int64), "tags": tf.io.VarLenFeature(tf.string),
        "empty": tf.io.VarLenFeature(tf.float32),
        "sp": tf.io.SparseFeature("si", "sv", tf.float32, 5),
        "sp2": tf.io.SparseFeature(["r", "c"], "m", tf.float32, [2, 3]),
    })
    for k in ("label", "dense", "grid", "name"):
        assert ours[k].dtype == theirs[k].numpy().dtype, k
        np.testing.assert_array_equal(ours[k], theirs[k].numpy())
    for k in ("ids", "tags", "empty", "sp", "sp2"):
        got = ours[k].to_sparse() if k in ("ids", "tags", "empty") else ours[k]
        assert got.indices.tolist() == theirs[k].indices.numpy().tolist(), k
        assert got.values.tolist() == theirs[k].values.numpy().tolist(), k
        assert got.values.dtype == theirs[k].values.numpy().dtype, k
        assert got.dense_shape.tolist() == theirs[k].dense_shape.numpy().tolist(), k


def test_parse_single_example_matches_tf():
    rec = _batch()[0]
    ours = parse_single_example(rec, {"dense": FixedLen("float32", shape=[3]), "ids": VarLen("int64"),
                                      "sp": Sparse("si", "sv", "float32", 5)})
    theirs = tf.io.parse_single_example(rec, {"dense": tf.io.FixedLenFeature([3], tf.float32),
                                              "ids": tf.io.VarLenFeature(tf.int64),
                                              "sp": tf.io.SparseFeature("si", "sv", tf.float32, 5)})
    np.testing.assert_array_equal(ours["dense"], theirs["dense"].numpy())
    assert ours["ids"].tolist() == theirs["ids"].values.numpy().tolist()
    assert ours["sp"].indices.tolist() == theirs["sp"].indices.numpy().tolist()
    assert ours["sp"].dense_shape.tolist() == theirs["sp"].dense_shape.numpy().tolist()


@pytest.mark.parametrize(
    "good,bad,ours_spec,tf_spec",
    [
        (1, {"y": 1}, FixedLen("int64"), tf.io.FixedLenFeature([], tf.int64)),                       # missing
        (0.5, {"x": []}, FixedLen("float32"), tf.io.FixedLenFeature([], tf.float32)),                # no kind
        ([1, 2, 3], {"x": [1, 2]}, FixedLen("int64", shape=[3]), tf.io.FixedLenFeature([3], tf.int64)),  # count
        (1, {"x": [b"a"]}, FixedLen("int64"), tf.io.FixedLenFeature([], tf.int64)),                  # kind
        ([1], {"x": np.array([], np.float32)}, VarLen("int64"), tf.io.VarLenFeature(tf.int64)),      # empty, kind
    ],
    ids=["missing", "no-kind", "count", "kind", "empty-other-kind"],
)
def test_spec_violations_fail_in_both(good, bad, ours_spec, tf_spec):
    recs = [encode_example({"x": good}), encode_example(bad)]
    tf.io.parse_example(recs[:1], {"x": tf_spec})  # the good record is fine in TF
    parse_example(recs[:1], {"x": ours_spec})       # and here
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(recs, {"x": tf_spec})
    with pytest.raises(ParseError) as e:
        parse_example(recs, {"x": ours_spec})
    assert e.value.feature == "x" and e.value.record_index == 1


def test_feature_with_no_kind_takes_the_default_in_both():
    recs = [encode_example({"x": []})]
    theirs = tf.io.parse_example(recs, {"x": tf.io.FixedLenFeature([2], tf.int64, default_value=[4, 5])})
    ours = parse_example(recs, {"x": FixedLen("int64", shape=[2], default=[4, 5])})
    np.testing.assert_array_equal(ours["x"], theirs["x"].numpy())



@pytest.mark.parametrize("tf_dtype,ours", [(tf.int32, "int32"), (tf.float64, "float64"), (tf.float64, np.float64),
                                           (tf.int32, tf.int32)])
def test_dtypes_the_record_cannot_hold_are_refused_in_both(tf_dtype, ours):
    # TF refuses them; giving int64/float32 instead of what was asked would be a quiet difference
    recs = [encode_example({"x": [1]})]
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(recs, {"x": tf.io.FixedLenFeature([1], tf_dtype)})
    stored = "int64" if tf_dtype == tf.int32 else "float32"
    for kind in (lambda d: FixedLen(d, shape=[1]), VarLen):
        with pytest.raises(TypeError, match=f"ask for '{stored}' and cast"):
            kind(ours)


def test_scalar_default_is_broadcast_where_tf_refuses_it():
    # a documented extension (docs/migration.md): every spec TF accepts parses the same
    recs = [encode_example({"y": [1]})]
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(recs, {"x": tf.io.FixedLenFeature([3], tf.int64, default_value=7)})
    theirs = tf.io.parse_example(recs, {"x": tf.io.FixedLenFeature([3], tf.int64, default_value=[7, 7, 7])})
    ours = parse_example(recs, {"x": FixedLen("int64", shape=[3], default=7)})
    np.testing.assert_array_equal(ours["x"], theirs["x"].numpy())


# ----------------------------------------------------------------------------- SequenceExample


def test_sequence_example_matches_tf():
    context = {"id": [7], "name": "abc"}
    lists = {"tok": [[1, 2], [3], []], "emb": [[0.5, 1.5], [2.5, 3.5], [4.5, 5.5]], "w": [[b"a"], [b"b", b"c"], [b""]]}
    data = encode_sequence_example(context, lists, sort_keys=True)
    m = tf.train.SequenceExample(
        context=tf.train.Features(feature={
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[7])),
            "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"abc"]))}),
        feature_lists=tf.train.FeatureLists(feature_list={
            "tok": tf.train.FeatureList(feature=[tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for v in lists["tok"][:2]]
                                        + [tf.train.Feature()]),
            "emb": tf.train.FeatureList(feature=[tf.train.Feature(float_list=tf.train.FloatList(value=v)) for v in lists["emb"]]),
            "w": tf.train.FeatureList(feature=[tf.train.Feature(bytes_list=tf.train.BytesList(value=v)) for v in lists["w"]]),
        }))
    assert data == m.SerializeToString(deterministic=True)
    ctx, seq = tf.io.parse_single_sequence_example(
        data,
        context_features={"id": tf.io.FixedLenFeature([], tf.int64), "name": tf.io.VarLenFeature(tf.string)},
        sequence_features={"tok": tf.io.VarLenFeature(tf.int64), "emb": tf.io.FixedLenSequenceFeature([2], tf.float32),
                           "w": tf.io.VarLenFeature(tf.string)},
    )
    our_ctx, our_seq = decode_sequence_example(m.SerializeToString())
    assert our_ctx["id"].tolist() == [int(ctx["id"])]
    assert our_ctx["name"] == ctx["name"].values.numpy().tolist()
    np.testing.assert_array_equal(np.stack(our_seq["emb"]), seq["emb"].numpy())
    for k in ("tok", "w"):
        sp = seq[k]
        rows = [[] for _ in range(int(sp.dense_shape[0]))]
        for (t, _), v in zip(sp.indices.numpy().tolist(), sp.values.numpy().tolist()):
            rows[t].append(v)
        assert [v if isinstance(v, list) else v.tolist() for v in our_seq[k]] == rows, k

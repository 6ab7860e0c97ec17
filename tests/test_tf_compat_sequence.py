"""FixedLenSequence and SequenceExample parsing agree with TensorFlow's own parsers on the
same bytes, value for value (tf.io.parse_example, tf.io.parse_sequence_example), on both
paths: the pure-Python reference and the native core."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

import shardfeed as sf  # noqa: E402
from shardfeed.errors import ParseError  # noqa: E402
from shardfeed.formats import example as reference  # noqa: E402
from shardfeed.formats import sequence as sequence_reference  # noqa: E402
from shardfeed.formats.native import native_available, parse_example_batch  # noqa: E402

pytestmark = pytest.mark.tf

PARSERS = [pytest.param(reference.parse_example, id="python"),
           pytest.param(parse_example_batch, id="native",
                        marks=pytest.mark.skipif(not native_available(), reason="the C extension is not built"))]
NATIVE_ONLY = pytest.mark.skipif(not native_available(), reason="the C extension is not built")
# (batch parser, single-record parser) of SequenceExamples: the reference, and the public
# functions, which take the native path when the extension is built
SEQUENCE_PARSERS = [
    pytest.param((sequence_reference.parse_sequence_example_py,
                  lambda r, c, s: sequence_reference.parse_sequence_example_py([r], c, s, single=True)[:2]), id="python"),
    pytest.param((sf.parse_sequence_example, sf.parse_single_sequence_example), id="native", marks=NATIVE_ONLY),
]


def same(ours, theirs):
    """``ours`` (numpy, RaggedColumn or SparseColumn) equals the TF tensor ``theirs``."""
    if isinstance(theirs, tf.SparseTensor):
        assert isinstance(ours, sf.SparseColumn)
        assert ours.indices.tolist() == theirs.indices.numpy().tolist()
        assert ours.dense_shape.tolist() == theirs.dense_shape.numpy().tolist()
        assert list(ours.values) == theirs.values.numpy().tolist()
        return
    t = theirs.numpy()
    assert ours.shape == t.shape
    assert ours.dtype == t.dtype
    assert ours.tolist() == t.tolist()


# -- FixedLenSequence in Examples --------------------------------------------------------------------------

EXAMPLES = [
    {"i": [1, 2, 3, 4], "f": np.array([0.5, 1.5, 2.5], np.float32), "s": [b"a", b"bc"]},
    {"other": [7]},                                                  # every feature missing
    {"i": [5, 6], "f": np.array([], np.float32), "s": [b""]},       # an empty list of the right kind
    {"i": [], "f": [], "s": []},                                     # kindless (empty) features
    {"i": np.arange(10, dtype=np.int64), "f": np.array([9.0], np.float32), "s": [b"x", b"y", b"z"]},
]


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("batch", [EXAMPLES, EXAMPLES[1:2], EXAMPLES[3:4], EXAMPLES[:3]],
                         ids=["varying", "all-missing", "all-empty", "first-three"])
def test_fixed_len_sequence_pads_like_tf(parse, batch):
    recs = [sf.encode_example(e) for e in batch]
    ours = parse(recs, {"i": sf.FixedLenSequence("int64", shape=[2], allow_missing=True, default=-1),
                        "f": sf.FixedLenSequence("float32", allow_missing=True),
                        "s": sf.FixedLenSequence("bytes", allow_missing=True, default="?")})
    theirs = tf.io.parse_example(recs, {
        "i": tf.io.FixedLenSequenceFeature([2], tf.int64, allow_missing=True, default_value=-1),
        "f": tf.io.FixedLenSequenceFeature([], tf.float32, allow_missing=True),
        "s": tf.io.FixedLenSequenceFeature([], tf.string, allow_missing=True, default_value=b"?")})
    for k in ("i", "f", "s"):
        same(ours[k], theirs[k])


def test_fixed_len_sequence_in_the_pipeline_and_single_example(tmp_path):
    recs = [sf.encode_example(e) for e in EXAMPLES]
    path = str(tmp_path / "a.tfrecord")
    sf.write_records(path, recs)
    spec = {"i": sf.FixedLenSequence("int64", shape=[2], allow_missing=True)}
    tf_spec = {"i": tf.io.FixedLenSequenceFeature([2], tf.int64, allow_missing=True)}
    (batch,) = list(sf.read_tfrecord(path, spec=spec).batch(len(recs)))
    same(batch["i"], tf.io.parse_example(recs, tf_spec)["i"])
    for r in recs:
        same(sf.parse_single_example(r, spec)["i"], tf.io.parse_single_example(r, tf_spec)["i"])


@pytest.mark.parametrize("parse", PARSERS)
def test_fixed_len_sequence_violations_fail_in_both(parse):
    recs = [sf.encode_example({"i": [1, 2]}), sf.encode_example({"i": [1, 2, 3]})]
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(recs, {"i": tf.io.FixedLenSequenceFeature([2], tf.int64, allow_missing=True)})
    with pytest.raises(ParseError, match="multiple of 2") as e:
        parse(recs, {"i": sf.FixedLenSequence("int64", shape=[2], allow_missing=True)})
    assert e.value.feature == "i" and e.value.record_index == 1
    kind = [sf.encode_example({"i": [b"x"]})]
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(kind, {"i": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True)})
    with pytest.raises(ParseError, match="bytes_list"):
        parse(kind, {"i": sf.FixedLenSequence("int64", allow_missing=True)})
    # TF refuses allow_missing=False and a padding value that is not a scalar; so does shardfeed
    with pytest.raises(ValueError, match="allow_missing"):
        tf.io.parse_example(recs[:1], {"i": tf.io.FixedLenSequenceFeature([2], tf.int64)})
    with pytest.raises(ValueError, match="allow_missing=True"):
        parse(recs[:1], {"i": sf.FixedLenSequence("int64", shape=[2])})
    with pytest.raises(ValueError, match="scalar"):
        sf.FixedLenSequence("int64", shape=[2], allow_missing=True, default=[1, 2])


# -- SequenceExample ----------------------------------------------------------------------------------

SEQUENCES = [
    ({"id": [7], "name": b"abc", "ctx_ids": [1, 2, 3]},
     {"tok": [[1, 2], [3, 4], [5, 6]], "w": [[b"a"], [b"b", b"c"]], "f": [[0.5], [1.5]],
      "v": [[1], [], [2, 3, 4]]}),
    ({"id": [8]},                                                     # name, ctx_ids missing: default, none
     {"tok": [[9, 9]], "w": [], "f": [], "v": [[], []]}),             # empty lists; v steps without values
    ({"id": [9], "name": "é"},
     {"tok": [], "w": [[b"", b"x"]], "f": [[2.5], [3.5], [4.5], [5.5]]}),  # no v at all
]
CONTEXT = ({"id": sf.FixedLen("int64"), "name": sf.FixedLen("bytes", default=b"-"), "ctx_ids": sf.VarLen("int64")},
           {"id": tf.io.FixedLenFeature([], tf.int64), "name": tf.io.FixedLenFeature([], tf.string, default_value=b"-"),
            "ctx_ids": tf.io.VarLenFeature(tf.int64)})
SEQUENCE = ({"tok": sf.FixedLenSequence("int64", shape=[2]), "w": sf.VarLen("bytes"),
             "f": sf.FixedLenSequence("float32"), "v": sf.VarLen("int64"),
             "m": sf.FixedLenSequence("int64", allow_missing=True)},
            {"tok": tf.io.FixedLenSequenceFeature([2], tf.int64), "w": tf.io.VarLenFeature(tf.string),
             "f": tf.io.FixedLenSequenceFeature([], tf.float32), "v": tf.io.VarLenFeature(tf.int64),
             "m": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True)})


def _same_context(ours, theirs):
    for k, t in theirs.items():
        if isinstance(t, tf.SparseTensor):  # our VarLen context is ragged; .to_sparse() is TF's layout
            same(ours[k].to_sparse(), t)
        else:
            same(ours[k], t)


@pytest.mark.parametrize("parsers", SEQUENCE_PARSERS)
@pytest.mark.parametrize("batch", [SEQUENCES, SEQUENCES[1:2], SEQUENCES[::-1]], ids=["all", "one-empty", "reversed"])
def test_parse_sequence_example_matches_tf(parsers, batch):
    recs = [sf.encode_sequence_example(c, fl) for c, fl in batch]
    ctx, lists, lengths = parsers[0](recs, CONTEXT[0], SEQUENCE[0])
    t_ctx, t_lists, t_lengths = tf.io.parse_sequence_example(recs, context_features=CONTEXT[1],
                                                             sequence_features=SEQUENCE[1])
    _same_context(ctx, t_ctx)
    assert sorted(lists) == sorted(t_lists)
    for k in t_lists:
        same(lists[k], t_lists[k])
    assert sorted(lengths) == sorted(t_lengths) == ["f", "m", "tok"]  # FixedLenSequence features only
    for k in t_lengths:
        same(lengths[k], t_lengths[k])


@pytest.mark.parametrize("parsers", SEQUENCE_PARSERS)
def test_parse_single_sequence_example_matches_tf(parsers):
    for c, fl in SEQUENCES:
        rec = sf.encode_sequence_example(c, fl)
        ctx, lists = parsers[1](rec, CONTEXT[0], SEQUENCE[0])
        t_ctx, t_lists = tf.io.parse_single_sequence_example(rec, context_features=CONTEXT[1],
                                                             sequence_features=SEQUENCE[1])
        for k, t in t_ctx.items():
            if isinstance(t, tf.SparseTensor):
                assert ctx[k].tolist() == t.values.numpy().tolist()
            else:  # a scalar, as parse_single_example gives it (bytes, or a numpy scalar)
                assert ctx[k] == t.numpy() and type(ctx[k]) is type(t.numpy())
        for k in t_lists:
            same(lists[k], t_lists[k])


@pytest.mark.parametrize("lists,spec,tf_spec,what", [
    ({"tok": [[1, 2], [3]]}, sf.FixedLenSequence("int64", shape=[2]), tf.io.FixedLenSequenceFeature([2], tf.int64),
     "step 1 .* 1 values, expected 2"),
    ({"tok": [[1], []]}, sf.FixedLenSequence("int64"), tf.io.FixedLenSequenceFeature([], tf.int64),
     "step 1 .* 0 values"),
    ({"other": [[1]]}, sf.FixedLenSequence("int64"), tf.io.FixedLenSequenceFeature([], tf.int64),
     "feature list is missing"),
    ({"tok": [[1], [b"x"]]}, sf.VarLen("int64"), tf.io.VarLenFeature(tf.int64), "step 1 .*bytes_list"),
], ids=["count", "empty-step", "missing", "kind"])
@pytest.mark.parametrize("parsers", SEQUENCE_PARSERS)
def test_sequence_violations_fail_in_both(parsers, lists, spec, tf_spec, what):
    recs = [sf.encode_sequence_example({}, {"tok": [[5]] if not isinstance(spec, sf.FixedLenSequence)
                                            or spec.shape == () else [[5, 6]]}),
            sf.encode_sequence_example({}, lists)]
    tf.io.parse_sequence_example(recs[:1], sequence_features={"tok": tf_spec})  # the good record is fine in both
    parsers[0](recs[:1], sequence_features={"tok": spec})
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_sequence_example(recs, sequence_features={"tok": tf_spec})
    with pytest.raises(ParseError, match=what) as e:
        parsers[0](recs, sequence_features={"tok": spec})
    assert e.value.feature == "tok" and e.value.record_index == 1


@pytest.mark.parametrize("parsers", SEQUENCE_PARSERS)
def test_sequence_specs_tf_refuses_are_refused(parsers):
    parse = parsers[0]
    rec = [sf.encode_sequence_example({}, {"f": [[1.0]]})]
    with pytest.raises(ValueError, match="must be None"):
        tf.io.parse_sequence_example(rec, sequence_features={
            "f": tf.io.FixedLenSequenceFeature([], tf.float32, default_value=-1.0)})
    with pytest.raises(ValueError, match="takes no default"):
        parse(rec, sequence_features={"f": sf.FixedLenSequence("float32", default=-1.0)})
    with pytest.raises(TypeError, match="FixedLenSequence or VarLen"):
        parse(rec, sequence_features={"f": sf.FixedLen("float32")})
    with pytest.raises(sf.DecodeError):
        parse([b"\x0a\x05ab"], sequence_features={"f": sf.VarLen("float32")})


def _random_sequence(rng: np.random.Generator) -> tuple[dict, dict]:
    ctx = {"id": [int(rng.integers(-(2**63), 2**63 - 1))]}
    if rng.random() < 0.7:
        ctx["ctx_ids"] = rng.integers(-(2**40), 2**40, rng.integers(0, 4)).tolist()
    lists = {"tok": [rng.integers(-(2**62), 2**62, 2).tolist() for _ in range(rng.integers(0, 5))],
             "f": [np.float32(rng.standard_normal(1)) for _ in range(rng.integers(0, 4))],
             "w": [[bytes(rng.integers(0, 256, rng.integers(0, 4)).astype(np.uint8)) for _ in range(rng.integers(0, 3))]
                   for _ in range(rng.integers(0, 4))],
             "v": [rng.integers(-9, 9, rng.integers(0, 4)).tolist() for _ in range(rng.integers(0, 4))]}
    if rng.random() < 0.3:
        lists["m"] = [[int(rng.integers(0, 100))] for _ in range(rng.integers(0, 3))]
    for k in ("w", "v"):
        if rng.random() < 0.2:
            del lists[k]
    # a step [] has no kind; TF reads it as an empty list of any kind, as we do
    return ctx, lists


@pytest.mark.parametrize("parsers", SEQUENCE_PARSERS)
def test_random_sequence_batches_match_tf(parsers):
    rng = np.random.default_rng(7)
    for _ in range(20):
        recs = [sf.encode_sequence_example(*_random_sequence(rng), sort_keys=bool(rng.random() < 0.5))
                for _ in range(int(rng.integers(1, 12)))]
        ctx, lists, lengths = parsers[0](recs, CONTEXT[0], SEQUENCE[0])
        t_ctx, t_lists, t_lengths = tf.io.parse_sequence_example(recs, context_features=CONTEXT[1],
                                                                 sequence_features=SEQUENCE[1])
        _same_context(ctx, t_ctx)
        for k in t_lists:
            same(lists[k], t_lists[k])
        for k in t_lengths:
            same(lengths[k], t_lengths[k])

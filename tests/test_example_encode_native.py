"""The C Example encoder (``_native.encode_example``) against the Python one it stands in for.

Every dict it takes must give the Python encoder's bytes exactly (which the TensorFlow
tests hold to ``tf.train.Example``); every dict it leaves (None) must be one the Python
encoder encodes differently or refuses, with its own error naming the feature.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.formats import example_encode
from shardfeed.formats.example import decode_example, encode_example
from shardfeed.formats.wire import encode_varint

_native = pytest.importorskip("shardfeed._native")
if not hasattr(_native, "encode_example"):
    pytest.skip("the C extension is not built", allow_module_level=True)


def python_bytes(features):
    parts, size = example_encode._features_parts(features, False, example_encode._encode_feature)
    return b"\x0a" + encode_varint(size) + b"".join(parts)


INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)  # doubles: out-of-range ones become inf
NUMERIC_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.float32,
                  np.float64]


def _array(dtype, shape_len):
    if dtype is np.bool_:
        elems = st.booleans()
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        elems = st.integers(int(info.min), int(info.max))
    else:
        elems = st.floats(width=32 if dtype is np.float32 else 64)
    return st.lists(elems, max_size=shape_len).map(lambda v: np.array(v, dtype))


values_c_takes = st.one_of(
    INT64, st.booleans(), FLOATS, st.text(max_size=40), st.binary(max_size=300),
    INT64.map(np.int64), st.floats(width=32).map(np.float32), FLOATS.map(np.float64),
    st.integers(-(2**31), 2**31 - 1).map(np.int32), st.booleans().map(np.bool_),
    st.sampled_from(NUMERIC_DTYPES).flatmap(lambda d: _array(d, 30)),
    st.lists(INT64, max_size=20), st.lists(FLOATS, max_size=20), st.lists(st.text(max_size=10), max_size=10),
    st.lists(st.one_of(st.binary(max_size=10), st.text(max_size=5)), max_size=10),
    st.lists(st.booleans(), max_size=5).map(tuple), st.just([]), st.just(()),
)


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.text(max_size=12), values_c_takes, max_size=12))
def test_every_dict_of_common_values_gives_the_python_encoders_bytes(features):
    got = _native.encode_example(features)
    assert got is not None
    assert got == python_bytes(features)
    assert encode_example(features) == got


@pytest.mark.parametrize("features", [
    {"big": 2**63}, {"neg": -(2**63) - 1},  # outside int64: the Python encoder raises, naming it
    {"u": np.array([2**63], np.uint64)}, {"u64": np.uint64(2**64 - 1)},
    {"mix": [1, 2.5]}, {"mix": ["a", 1]}, {"none": None}, {"obj": np.array(["a"], object)},
    {"half": np.float16(1.5)}, {"halfs": np.ones(3, np.float16)}, {"strs": np.array(["a", "b"])},
    {"surrogate": "x\ud800"}, {"surrogates": ["ok", "\udc00"]}, {"strided": np.arange(10)[::3]},
    {"swapped": np.arange(3, dtype=">i4")}, {"bytearray": bytearray(b"x")}, {1: 1},
])
def test_values_it_leaves_are_encoded_or_refused_by_python_with_the_same_result(features):
    assert _native.encode_example(features) is None
    try:
        want = python_bytes(features)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc), match="feature|must be str"):
            encode_example(features)
    else:
        assert encode_example(features) == want


def test_a_mapping_that_is_not_a_dict_takes_the_python_path():
    from collections import OrderedDict

    od = OrderedDict(b=1, a=[1.5])
    assert _native.encode_example(od) is None
    assert encode_example(od) == encode_example(dict(od))


def test_a_lone_bytes_value_over_max_copy_is_left_to_python():
    image = bytes(range(256)) * 40
    assert _native.encode_example({"image": image}, len(image) - 1) is None
    assert _native.encode_example({"image": image}, len(image)) == python_bytes({"image": image})
    pieces, n = example_encode.example_pieces({"image": image, "label": 1})
    assert any(p is image for p in pieces) and n == len(b"".join(pieces))


def test_varint_and_length_boundaries():
    for n in (0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152):
        feats = {"k" * (n % 300): b"x" * n, "i": 2**(n % 64) - 1, "f": np.zeros(n // 4, np.float32)}
        assert _native.encode_example(feats) == python_bytes(feats)
    many = {f"feature_{i}": i for i in range(500)}  # more entries than the C side keeps on its stack
    assert _native.encode_example(many) == python_bytes(many)


def test_floats_round_like_numpy_and_keep_nan_and_inf():
    values = [0.1, 1e-46, 3.4028235677973366e38, 3.5e38, -1e300, math.inf, -math.inf, math.nan, -0.0]
    feats = {"l": values, "a": np.array(values), **{f"s{i}": v for i, v in enumerate(values)}}
    got = _native.encode_example(feats)
    assert got == python_bytes(feats)
    back = decode_example(got)["l"]
    with np.errstate(over="ignore"):  # 3.5e38 and -1e300 are out of float32's range: inf
        want = np.array(values, np.float32)
    assert np.array_equal(np.array(back, np.float32), want, equal_nan=True)


class _Meddler(np.int64):
    """A numpy integer subclass whose __index__ changes the dict being encoded (a review
    under AddressSanitizer found the encoder calling it between its two passes)."""

    target: dict = {}

    def __index__(self):
        self.target["a"] = 0  # frees the list the first pass sized
        for i in range(100):  # and grows the dict past what was sized
            self.target[f"new{i}"] = i
        return 99  # and lies about the value


def test_a_numpy_scalar_subclass_is_left_to_python_and_never_runs_between_the_passes():
    d = {"a": [10**6] * 1000, "b": _Meddler(1)}
    _Meddler.target = d
    assert _native.encode_example(d) is None
    assert list(d) == ["a", "b"] and d["a"] == [10**6] * 1000  # its __index__ never ran
    assert decode_example(encode_example({"b": _Meddler(7)}))["b"] == [7]  # Python reads the stored value


@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.int32, np.uint32, np.int64, np.float32, np.float64])
def test_an_unaligned_array_gives_the_python_encoders_bytes(dtype):
    raw = np.arange(1, 1 + 8 * np.dtype(dtype).itemsize + 1, dtype=np.uint8)
    a = raw[1:].view(dtype)  # C-contiguous, native order, at an odd address
    assert not a.flags.aligned and a.flags.c_contiguous
    assert _native.encode_example({"x": a}) == python_bytes({"x": a})

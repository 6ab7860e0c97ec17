"""Encoding ``tf.train.Example`` / ``SequenceExample`` messages (deterministic bytes;
the rules: :mod:`shardfeed.formats.example`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .example_decode import (
    _INT64_MAX,
    _INT64_MIN,
    _KIND_BYTES,
    _KIND_FLOAT,
    _KIND_INT64,
)
from .wire import (
    encode_packed_varints,
    encode_varint,
)

try:  # the common values encoded in C (same bytes); anything else, and every error, here
    from .._native import encode_example as _native_encode  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _native_encode = None

PIECE_BYTES = 4096
"""A lone bytes value longer than this is its own piece in :func:`example_pieces` (not copied
into the record's other bytes)."""

# ----------------------------------------------------------------------------- encoding

_BYTES_TYPES = (bytes, bytearray, memoryview, str, np.bytes_, np.str_)
_INT_TYPES = (int, np.integer, np.bool_)  # bool is an int
_FLOAT_TYPES = (float, np.floating)


def _len_prefixed(field_tag: bytes, payload: bytes) -> bytes:
    return field_tag + encode_varint(len(payload)) + payload


def _to_bytes(name: str, v: Any) -> bytes:
    if isinstance(v, (str, np.str_)):
        try:
            return str(v).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"feature {name!r}: string value cannot be encoded as UTF-8 ({e.reason})") from None
    if isinstance(v, (bytes, bytearray, memoryview, np.bytes_)):
        return bytes(v)
    raise TypeError(f"feature {name!r}: bytes_list values must be bytes or str, got {type(v).__name__}")


def _classify(name: str, values: Sequence) -> int | None:
    types = {type(v) for v in values}
    if not types:
        return None
    if all(issubclass(t, _INT_TYPES) for t in types):
        return _KIND_INT64
    if all(issubclass(t, _INT_TYPES + _FLOAT_TYPES) for t in types):
        return _KIND_FLOAT
    if all(issubclass(t, _BYTES_TYPES) for t in types):
        return _KIND_BYTES
    names = sorted(t.__name__ for t in types)
    raise TypeError(
        f"feature {name!r}: values must all be ints, all numbers, or all bytes/str; got a mix of {names}"
    )


def _int64_array(name: str, arr: Any) -> np.ndarray:
    a = np.asarray(arr) if not isinstance(arr, np.ndarray) or arr.dtype == object else arr
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and int(a.max()) > _INT64_MAX:
        raise ValueError(f"feature {name!r}: value {int(a.max())} is outside the int64 range")
    if a.dtype == object or a.dtype.kind not in "biu":
        ints = [int(v) for v in np.ravel(a)]
        lo, hi = min(ints, default=0), max(ints, default=0)
        if lo < _INT64_MIN or hi > _INT64_MAX:
            bad = lo if lo < _INT64_MIN else hi
            raise ValueError(f"feature {name!r}: value {bad} is outside the int64 range")
        return np.array(ints, np.int64)
    return np.ravel(a).astype(np.int64)


def _encode_feature(name: str, value: Any) -> bytes:
    """The serialized Feature message for one value (see :func:`encode_example`)."""
    if type(value) is int or type(value) is bool:  # the common scalar, without numpy (a third of the time)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"feature {name!r}: value {value} is outside the int64 range")
        v = encode_varint(int(value))  # at most 10 bytes: both lengths below are one byte
        return b"".join((b"\x1a", bytes((len(v) + 2,)), b"\x0a", bytes((len(v),)), v))
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        k = value.dtype.kind
        seq: Any = value.ravel()
        if k in "biu":
            kind = _KIND_INT64
        elif k == "f":
            kind = _KIND_FLOAT
        elif k in "SU":
            kind, seq = _KIND_BYTES, seq.tolist()
        elif k == "O":  # an object array holds Python scalars: classify them like a list
            seq = seq.tolist()
            kind = _classify(name, seq) or _KIND_BYTES
        else:
            raise TypeError(f"feature {name!r}: cannot store numpy dtype {value.dtype} in an Example")
    elif isinstance(value, _BYTES_TYPES):
        kind, seq = _KIND_BYTES, [value]
    elif isinstance(value, _INT_TYPES):
        kind, seq = _KIND_INT64, [value]
    elif isinstance(value, _FLOAT_TYPES):
        kind, seq = _KIND_FLOAT, [value]
    elif isinstance(value, (list, tuple)):
        kind, seq = _classify(name, value), value
        if kind is None:
            return b""  # empty list: a Feature with no kind, like tf.train.Feature()
    else:
        raise TypeError(
            f"feature {name!r}: expected a numpy array, a scalar (int, float, bytes, str) or a "
            f"list of them, got {type(value).__name__}"
        )
    if kind == _KIND_INT64:
        payload = encode_packed_varints(_int64_array(name, seq))
        return _len_prefixed(b"\x1a", _len_prefixed(b"\x0a", payload) if payload else b"")
    if kind == _KIND_FLOAT:
        try:
            with np.errstate(over="ignore"):  # out-of-range doubles become inf, as protobuf does
                payload = np.asarray(seq, dtype="<f4").ravel().tobytes()
        except OverflowError:
            raise ValueError(f"feature {name!r}: an int is too large to convert to float32") from None
        return _len_prefixed(b"\x12", _len_prefixed(b"\x0a", payload) if payload else b"")
    # one copy of each value (large image bytes): the pieces are joined once
    parts = [b"\x0a", b""]
    size = 0
    for v in seq:
        b = _to_bytes(name, v)
        n = encode_varint(len(b))
        parts += (b"\x0a", n, b)
        size += 1 + len(n) + len(b)
    parts[1] = encode_varint(size)
    return b"".join(parts)


# Whole map entries of small scalar features (a label, a format, a height) seen before: a
# converter writes the same few values in every record. Bounded; emptied when full.
_ENTRY_CACHE: dict[tuple, tuple[bytes, bytes]] = {}
_ENTRY_CACHE_MAX = 4096


_KEY_HEADS: dict[str, tuple[bytes, bytes]] = {}  # name -> (key, map entry's key field and value tag)
_KEY_HEADS_MAX = 4096
_V1 = [bytes((i,)) for i in range(128)]  # one-byte varints


def _key_head(name: Any) -> tuple[bytes, bytes]:
    kh = _KEY_HEADS.get(name) if type(name) is str else None
    if kh is None:
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {name!r}")
        key = name.encode("utf-8")
        kh = (key, b"\x0a" + encode_varint(len(key)) + key + b"\x12")
        if type(name) is str and len(_KEY_HEADS) < _KEY_HEADS_MAX:
            _KEY_HEADS[name] = kh
    return kh


def _features_parts(features: Mapping[str, Any], sort_keys: bool, encode_value) -> tuple[list[bytes], int]:
    """The map entries of a Features message as pieces to join (values are not copied
    here), and their total size."""
    if not isinstance(features, Mapping):
        raise TypeError(f"features must be a mapping of name to values, got {type(features).__name__}")
    keys: list[bytes] = []
    parts: list[bytes] = []  # entry head, value piece, entry head, value piece, ...
    size = 0
    cacheable = encode_value is _encode_feature
    cache = _ENTRY_CACHE
    for name, value in features.items():
        t = type(value)
        ck = (name, t, value) if cacheable and (t is int or t is bool or (t is str and len(value) <= 64)) else None
        if ck is not None:
            hit = cache.get(ck)
            if hit is not None:
                keys.append(hit[0])
                parts += (hit[1], b"")
                size += len(hit[1])
                continue
        key, khead = _key_head(name)
        if cacheable and (t is bytes or t is str):
            # one bytes value (an image): the value stays a piece of its own, never copied here
            data = value if t is bytes else _to_bytes(name, value)
            n = len(data)
            vl = _V1[n] if n < 128 else encode_varint(n)  # BytesList.value
            m = 1 + len(vl) + n
            il = _V1[m] if m < 128 else encode_varint(m)  # Feature.bytes_list
            flen = 1 + len(il) + m
            fl = _V1[flen] if flen < 128 else encode_varint(flen)
            head = b"".join((b"\x0a", encode_varint(len(khead) + len(fl) + flen), khead, fl, b"\x0a", il,
                             b"\x0a", vl))
            feat: bytes = data
        else:
            feat = encode_value(name, value)
            fl = encode_varint(len(feat))
            head = b"\x0a" + encode_varint(len(khead) + len(fl) + len(feat)) + khead + fl
        if ck is not None:
            head, feat = head + feat, b""
            if len(cache) >= _ENTRY_CACHE_MAX:
                cache.clear()
            cache[ck] = (key, head)
        keys.append(key)
        parts += (head, feat)
        size += len(head) + len(feat)
    if sort_keys and len(keys) > 1:
        # protobuf-python (upb) deterministic order: byte-wise, except that a key sorts
        # after the keys it is a prefix of ("label_id" before "label"; C++ puts it first).
        order = sorted(range(len(keys)), key=lambda i: (*keys[i], 256))
        parts = [p for i in order for p in (parts[2 * i], parts[2 * i + 1])]
    return parts, size


def _encode_features(features: Mapping[str, Any], sort_keys: bool, encode_value) -> bytes:
    return b"".join(_features_parts(features, sort_keys, encode_value)[0])


def encode_example(features: Mapping[str, Any], *, sort_keys: bool = False) -> bytes:
    """Serialize ``{name: values}`` as a ``tf.train.Example``.

    A value is a numpy array (bool/int/uint dtypes give int64_list, float dtypes
    float_list, bytes/str bytes_list, object arrays as the list of their elements; n-d
    arrays are flattened in C order), a scalar
    (int, bool, float, bytes, str, numpy scalar), or a list/tuple of scalars: all ints gives
    int64_list, ints and floats float_list, bytes/str bytes_list (str as UTF-8). An empty
    list/tuple gives a Feature with no kind (``tf.train.Feature()``), which TensorFlow
    reads as an empty list of any dtype; to pin a kind, pass an empty numpy array.
    Floats are stored as float32 (NaN and inf kept). Map entries are written in the
    mapping's order; with ``sort_keys=True`` the bytes equal TensorFlow's
    ``tf.train.Example(...).SerializeToString(deterministic=True)`` (protobuf-python's
    order; plain ``SerializeToString()`` uses hash-table order, which nothing can match).

    Raises TypeError for an unsupported value type or mixed kinds, ValueError for an int
    outside int64, both naming the feature.
    """
    if _native_encode is not None and not sort_keys:
        done = _native_encode(features)
        if done is not None:
            return done
    return b"".join(_python_pieces(features, sort_keys)[0])  # the C encoder said no: not asked again


def example_pieces(features: Mapping[str, Any], *, sort_keys: bool = False) -> tuple[list[bytes], int]:
    """:func:`encode_example`'s bytes as pieces that join into them, and their total length:
    for a writer that copies the pieces once, straight into its output
    (``formats.native.frame_records``), rather than joining a record first. Raises as
    :func:`encode_example` does."""
    if _native_encode is not None and not sort_keys:
        # one piece, every value copied into it in C; a large bytes value (an image) stays a
        # piece of its own instead, so that it is copied once, by the framing
        done = _native_encode(features, PIECE_BYTES)
        if done is not None:
            return [done], len(done)
    return _python_pieces(features, sort_keys)


def _python_pieces(features: Mapping[str, Any], sort_keys: bool) -> tuple[list[bytes], int]:
    parts, size = _features_parts(features, sort_keys, _encode_feature)
    head = encode_varint(size)
    return [b"\x0a", head, *parts], 1 + len(head) + size


def features_entries(features: Mapping[str, Any]) -> bytes:
    """The map entries of :func:`encode_example`'s ``Features`` message, without the
    Example's own field head: pieces of a record another encoder completes (the native
    image rows append a row's label features to theirs)."""
    data = encode_example(features)
    at = 1  # past Example.features' tag; then its varint length
    while data[at] & 0x80:
        at += 1
    return data[at + 1:]


def _encode_feature_list(name: str, values: Any) -> bytes:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"feature list {name!r}: expected a list of per-step values, got {type(values).__name__}")
    return b"".join(_len_prefixed(b"\x0a", _encode_feature(name, v)) for v in values)


def encode_sequence_example(
    context: Mapping[str, Any], feature_lists: Mapping[str, Sequence[Any]], *, sort_keys: bool = False
) -> bytes:
    """Serialize a ``tf.train.SequenceExample``: ``context`` as :func:`encode_example` takes
    it, ``feature_lists`` as ``{name: [values of step 0, values of step 1, ...]}``.

    Raises TypeError/ValueError naming the feature for values it cannot store.
    """
    ctx = _encode_features(context, sort_keys, _encode_feature)
    fls = _encode_features(feature_lists, sort_keys, _encode_feature_list)
    return _len_prefixed(b"\x0a", ctx) + _len_prefixed(b"\x12", fls)

"""``tf.train.Example`` / ``SequenceExample`` codec and batch parser, in pure Python.

This is the reference implementation: the native parser must give the same values and
the same accept/reject decisions. It needs neither ``protobuf`` nor TensorFlow.

Messages (tensorflow/core/example/{example,feature}.proto)::

    Example         { Features features = 1; }
    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
    Features        { map<string, Feature> feature = 1; }      // entry: key = 1, value = 2
    FeatureLists    { map<string, FeatureList> feature_list = 1; }
    FeatureList     { repeated Feature feature = 1; }
    Feature         { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

Decoding follows protobuf exactly (checked against it in tests/test_example.py):

- Fields may come in any order; unknown fields (any wire type, groups included) are
  skipped at every level; a known field number with an unexpected wire type is an unknown
  field. Wire-level errors are those of :mod:`shardfeed.formats.wire`.
- Repeated scalars: int64 values may be packed (wire type 2) or not (0), floats packed (2)
  or not (5), mixed freely and split in any number of chunks; values concatenate in order.
- A singular message field that appears more than once is merged: ``Example.features``
  twice merges the two maps; a map entry's ``value`` twice merges the two Features.
- Map entries: a missing key is ``""``, a missing value an empty Feature, a key given
  twice in one entry takes the last. A key that appears in several entries takes the last
  entry, whole (no merge). Unknown fields inside an entry are skipped and the entry kept
  (protobuf C++ and the pure-Python protobuf do this; upb alone drops such an entry).
  Keys must be valid UTF-8 (proto3 ``string``), else DecodeError.
- Feature ``kind`` is a oneof: a list field of another kind than the current one replaces
  it; the same kind again merges (values concatenate). So int64, bytes, int64 keeps only
  the last int64 list.
- An empty Feature (no kind set) decodes to ``[]``, an untyped empty list.
  ``tf.io.parse_example`` treats such a feature as *absent* (FixedLen uses the default or
  fails as missing; VarLen/Sparse get no values), and so does :func:`parse_example`.

TensorFlow's own fast parser is stricter/looser on some legal but non-canonical encodings
(it errors on a Feature whose first field is unknown, on mixed packed/unpacked lists and
on unknown fields in lists and entries, and keeps the *first* list when a Feature holds
two); records written by protobuf or by :func:`encode_example` parse identically in both.

Batch parsing (:func:`parse_example`) matches ``tf.io.parse_example``:

- FixedLen: the feature must hold exactly ``prod(shape)`` values of the spec's kind; an
  absent (or empty-kind) feature takes ``default`` (a scalar is broadcast, anything else
  must have ``prod(shape)`` elements and is reshaped, as TF reshapes it), else ParseError.
  A list of another kind is a ParseError even when empty, as in TF.
- VarLen: any number of values of the spec's kind; absent means none.
- FixedLenSequence (``allow_missing=True`` required): a multiple of ``prod(shape)``
  values, absent means length 0; the batch is padded to its longest record with the
  spec's scalar default (0 or ``b""`` without one), shape ``(n, longest, *shape)``.
- Sparse: per record, every index feature (int64) and the value feature must have the same
  number of values; indices must be in ``[0, size)`` (TF does not check and builds an
  invalid SparseTensor; we raise ParseError). Entries are sorted row-major by
  ``(record, index...)`` with a stable sort unless ``already_sorted``, as TF does.
- Features not in the spec are ignored but must be well formed. Every value array
  returned is a fresh, writable array.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DecodeError, ParseError
from .padding import pad_rows
from .spec import (
    BYTES,
    FLOAT32,
    INT64,
    FeatureSpec,
    FixedLen,
    FixedLenSequence,
    RaggedColumn,
    SparseColumn,
    VarLen,
    normalize_spec,
)
from .wire import (
    MAX_DEPTH,
    WIRETYPE_END_GROUP,
    WIRETYPE_FIXED32,
    WIRETYPE_LENGTH_DELIMITED,
    WIRETYPE_VARINT,
    check_packed_varints,
    decode_packed_float32,
    decode_packed_varints,
    decode_varint,
    encode_packed_varints,
    encode_varint,
    read_length_delimited,
    read_tag,
    skip_field,
)

FeatureValue = np.ndarray | list
_KIND_BYTES, _KIND_FLOAT, _KIND_INT64 = 1, 2, 3  # Feature field numbers
_KIND_NAMES = {None: "no list", _KIND_BYTES: "bytes_list", _KIND_FLOAT: "float_list", _KIND_INT64: "int64_list"}
_DTYPE_KIND = {BYTES: _KIND_BYTES, FLOAT32: _KIND_FLOAT, INT64: _KIND_INT64}
_FLOAT = struct.Struct("<f")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# ----------------------------------------------------------------------------- decoding


class _Feature:
    """A Feature being decoded: its oneof kind and the value chunks seen so far."""

    __slots__ = ("kind", "parts")

    def __init__(self) -> None:
        self.kind: int | None = None
        self.parts: list = []

    def values(self) -> FeatureValue:
        kind, parts = self.kind, self.parts
        if kind is None:
            return []
        if kind == _KIND_BYTES:
            return list(parts)
        dtype = np.int64 if kind == _KIND_INT64 else np.float32
        if len(parts) == 1 and isinstance(parts[0], np.ndarray):
            return parts[0].astype(dtype)  # copies: chunks may be read-only views of the record
        chunks, pending = [], []
        for p in parts:
            if isinstance(p, np.ndarray):
                if pending:
                    chunks.append(np.array(pending, dtype))
                    pending = []
                chunks.append(p)
            else:
                pending.append(p)
        if pending:
            chunks.append(np.array(pending, dtype))
        return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.empty(0, dtype)

    def count(self) -> int:
        if self.kind == _KIND_BYTES:
            return len(self.parts)
        return sum(len(p) if isinstance(p, np.ndarray) else 1 for p in self.parts)


def _sub(buf: bytes, pos: int, end: int, depth: int) -> tuple[int, int, int]:
    """Bounds of a length-delimited sub-message at ``pos``, and the depth budget inside it."""
    if depth <= 0:
        raise DecodeError(f"message nested deeper than {MAX_DEPTH} levels at byte {pos}")
    start, stop = read_length_delimited(buf, pos, end)
    return start, stop, depth - 1


def _end_group(field: int, pos: int) -> DecodeError:
    return DecodeError(f"unexpected end-group tag for field {field} at byte {pos}: no group is open")


def _parse_list(buf: bytes, pos: int, end: int, kind: int, parts: list, depth: int) -> None:
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if field == 1:
            if wt == WIRETYPE_LENGTH_DELIMITED:
                start, stop = read_length_delimited(buf, pos, end)
                if kind == _KIND_BYTES:
                    parts.append(bytes(buf[start:stop]))
                elif kind == _KIND_FLOAT:
                    parts.append(decode_packed_float32(buf, start, stop))
                else:
                    parts.append(decode_packed_varints(buf, start, stop))
                pos = stop
                continue
            if wt == WIRETYPE_VARINT and kind == _KIND_INT64:
                v, pos = decode_varint(buf, pos, end)
                parts.append(v - (1 << 64) if v >= (1 << 63) else v)
                continue
            if wt == WIRETYPE_FIXED32 and kind == _KIND_FLOAT:
                if end - pos < 4:
                    raise DecodeError(f"truncated float at byte {pos}: needs 4 bytes, {end - pos} left")
                parts.append(_FLOAT.unpack_from(buf, pos)[0])
                pos += 4
                continue
        if wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        pos = skip_field(buf, pos, end, field, wt, depth)


def _parse_feature_into(buf: bytes, pos: int, end: int, feat: _Feature, depth: int) -> None:
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if wt == WIRETYPE_LENGTH_DELIMITED and 1 <= field <= 3:
            start, stop, inner = _sub(buf, pos, end, depth)
            if feat.kind != field:  # oneof: another kind replaces, the same kind merges
                feat.kind = field
                feat.parts = []
            _parse_list(buf, start, stop, field, feat.parts, inner)
            pos = stop
        elif wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        else:
            pos = skip_field(buf, pos, end, field, wt, depth)


def _decode_key(buf: bytes, start: int, stop: int) -> str:
    try:
        return str(buf[start:stop], "utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"feature name at byte {start} is not valid UTF-8 ({e.reason})") from None


def _check_list(buf: bytes, pos: int, end: int, kind: int, depth: int) -> None:
    """Check a list message as :func:`_parse_list` reads it (the same errors in the same
    order), keeping no value."""
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if field == 1:
            if wt == WIRETYPE_LENGTH_DELIMITED:
                start, stop = read_length_delimited(buf, pos, end)
                if kind == _KIND_FLOAT:
                    if (stop - start) % 4:
                        raise DecodeError(
                            f"packed float field at byte {start} has {stop - start} bytes, not a multiple of 4")
                elif kind == _KIND_INT64:
                    check_packed_varints(buf, start, stop)
                pos = stop
                continue
            if wt == WIRETYPE_VARINT and kind == _KIND_INT64:
                pos = decode_varint(buf, pos, end)[1]
                continue
            if wt == WIRETYPE_FIXED32 and kind == _KIND_FLOAT:
                if end - pos < 4:
                    raise DecodeError(f"truncated float at byte {pos}: needs 4 bytes, {end - pos} left")
                pos += 4
                continue
        if wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        pos = skip_field(buf, pos, end, field, wt, depth)


def _check_feature(buf: bytes, pos: int, end: int, depth: int) -> None:
    """Check a Feature message as :func:`_parse_feature_into` reads it, keeping nothing:
    a feature the spec does not ask for is validated (as the native parser does) but
    never built."""
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if wt == WIRETYPE_LENGTH_DELIMITED and 1 <= field <= 3:
            start, stop, inner = _sub(buf, pos, end, depth)
            _check_list(buf, start, stop, field, inner)
            pos = stop
        elif wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        else:
            pos = skip_field(buf, pos, end, field, wt, depth)


def _skip_unwanted_entry(buf: bytes, start: int, stop: int, wanted: Any) -> bool:
    """True when the map entry ``buf[start:stop]`` is in the common short encoding (key,
    then one Feature holding at most one list, every length one byte), is well formed,
    and names a feature not in ``wanted``: then it needs nothing more. False for anything
    else, which the general path reads (and reports, if it is malformed)."""
    if stop - start < 4 or buf[start] != 0x0A:
        return False
    kn = buf[start + 1]
    ke = start + 2 + kn
    if kn >= 0x80 or ke + 2 > stop or buf[ke] != 0x12 or buf[ke + 1] >= 0x80 or ke + 2 + buf[ke + 1] != stop:
        return False
    try:
        if str(buf[start + 2: ke], "utf-8") in wanted:
            return False
    except UnicodeDecodeError:
        return False
    p = ke + 2
    if p == stop:
        return True  # a Feature with no kind
    kind = buf[p]
    if stop - p < 2 or kind not in (0x0A, 0x12, 0x1A) or buf[p + 1] >= 0x80 or p + 2 + buf[p + 1] != stop:
        return False
    p += 2
    while p < stop:  # the list's field 1 values, each with a one-byte length
        if buf[p] != 0x0A or p + 1 >= stop or buf[p + 1] >= 0x80:
            return False
        s, e = p + 2, p + 2 + buf[p + 1]
        if e > stop:
            return False
        if kind == 0x12:
            if (e - s) % 4:
                return False
        elif kind == 0x1A and e > s and max(buf[s:e]) >= 0x80:
            return False  # multi-byte varints: the general path checks them
        p = e
    return True


def _parse_map_into(buf: bytes, pos: int, end: int, out: dict, depth: int, value_parser, new_value,
                    wanted: Any = None) -> None:
    """Parse a message whose field 1 is a ``map<string, V>`` into ``out`` (merging).

    ``wanted``: when given (a container of keys, with Feature values), an entry whose key
    is not in it is checked but neither built nor kept."""
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if field == 1 and wt == WIRETYPE_LENGTH_DELIMITED:
            start, stop, inner = _sub(buf, pos, end, depth)
            if wanted is not None and inner > 2 and _skip_unwanted_entry(buf, start, stop, wanted):
                pos = stop
                continue
            key, value = "", new_value()
            key_seen = checked_only = False
            p = start
            while p < stop:
                etag = p
                f, w, p = read_tag(buf, p, stop)
                if w == WIRETYPE_LENGTH_DELIMITED and (f == 1 or f == 2):
                    if f == 1:
                        s, e = read_length_delimited(buf, p, stop)
                        key = _decode_key(buf, s, e)
                        key_seen = True
                        p = e
                    else:
                        s, e, vdepth = _sub(buf, p, stop, inner)
                        if wanted is not None and key_seen and key not in wanted:
                            _check_feature(buf, s, e, vdepth)
                            checked_only = True
                        else:
                            value_parser(buf, s, e, value, vdepth)
                        p = e
                elif w == WIRETYPE_END_GROUP:
                    raise _end_group(f, etag)
                else:
                    p = skip_field(buf, p, stop, f, w, inner)
            if wanted is None or key in wanted:
                if checked_only:  # a later key field named a wanted feature: build it after all
                    _parse_map_into(buf, tag_pos, stop, out, depth, value_parser, new_value)
                else:
                    out[key] = value  # a repeated key: the last entry wins, whole
            pos = stop
        elif wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        else:
            pos = skip_field(buf, pos, end, field, wt, depth)


def _parse_features_into(buf: bytes, pos: int, end: int, out: dict, depth: int, wanted: Any = None) -> None:
    _parse_map_into(buf, pos, end, out, depth, _parse_feature_into, _Feature, wanted)


def _parse_feature_list_into(buf: bytes, pos: int, end: int, out: list, depth: int) -> None:
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if field == 1 and wt == WIRETYPE_LENGTH_DELIMITED:
            start, stop, inner = _sub(buf, pos, end, depth)
            feat = _Feature()
            _parse_feature_into(buf, start, stop, feat, inner)
            out.append(feat)
            pos = stop
        elif wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        else:
            pos = skip_field(buf, pos, end, field, wt, depth)


def _as_buffer(record: Any) -> bytes:
    if isinstance(record, bytes):
        return record
    if isinstance(record, (bytearray, memoryview)):
        return bytes(record)
    raise TypeError(f"a serialized record must be bytes, bytearray or memoryview, got {type(record).__name__}")


def _decode_example_raw(record: Any, wanted: Any = None) -> dict[str, _Feature]:
    """The Features of one Example by name; with ``wanted`` (a container of names) only
    those are built, every other one is checked and dropped."""
    buf = _as_buffer(record)
    out: dict[str, _Feature] = {}
    pos, end = 0, len(buf)
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if field == 1 and wt == WIRETYPE_LENGTH_DELIMITED:
            start, stop, inner = _sub(buf, pos, end, MAX_DEPTH)
            _parse_features_into(buf, start, stop, out, inner, wanted)
            pos = stop
        elif wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        else:
            pos = skip_field(buf, pos, end, field, wt, MAX_DEPTH)
    return out


def decode_example(record: bytes | memoryview) -> dict[str, FeatureValue]:
    """Decode a serialized ``tf.train.Example`` into ``{name: values}``.

    int64_list gives an int64 array, float_list a float32 array, bytes_list a
    ``list[bytes]``, and a Feature with no kind set ``[]`` (see the module docstring for
    every merge rule). Raises DecodeError, naming what was wrong and the byte position,
    when ``record`` is not a valid Example.
    """
    return {k: f.values() for k, f in _decode_example_raw(record).items()}


def decode_sequence_example(
    record: bytes | memoryview,
) -> tuple[dict[str, FeatureValue], dict[str, list[FeatureValue]]]:
    """Decode a serialized ``tf.train.SequenceExample`` into ``(context, feature_lists)``.

    ``context`` is as :func:`decode_example` returns; ``feature_lists`` maps each name to
    the list of its Features' values, in order. Raises DecodeError for invalid bytes.
    """
    context, lists = decode_sequence_raw(record)
    return (
        {k: f.values() for k, f in context.items()},
        {k: [f.values() for f in fl] for k, fl in lists.items()},
    )


def decode_sequence_raw(record: Any) -> tuple[dict[str, "_Feature"], dict[str, list["_Feature"]]]:
    """The context Features and the feature lists of a serialized SequenceExample, kinds
    kept (for spec-driven parsing: :mod:`shardfeed.formats.sequence`)."""
    buf = _as_buffer(record)
    context: dict[str, _Feature] = {}
    lists: dict[str, list] = {}
    pos, end = 0, len(buf)
    while pos < end:
        tag_pos = pos
        field, wt, pos = read_tag(buf, pos, end)
        if wt == WIRETYPE_LENGTH_DELIMITED and (field == 1 or field == 2):
            start, stop, inner = _sub(buf, pos, end, MAX_DEPTH)
            if field == 1:
                _parse_features_into(buf, start, stop, context, inner)
            else:
                _parse_map_into(buf, start, stop, lists, inner, _parse_feature_list_into, list)
            pos = stop
        elif wt == WIRETYPE_END_GROUP:
            raise _end_group(field, tag_pos)
        else:
            pos = skip_field(buf, pos, end, field, wt, MAX_DEPTH)
    return context, lists


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
    payload = b"".join(_len_prefixed(b"\x0a", _to_bytes(name, v)) for v in seq)
    return _len_prefixed(b"\x0a", payload)


def _encode_features(features: Mapping[str, Any], sort_keys: bool, encode_value) -> bytes:
    if not isinstance(features, Mapping):
        raise TypeError(f"features must be a mapping of name to values, got {type(features).__name__}")
    items = []
    for name, value in features.items():
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {name!r}")
        key = name.encode("utf-8")
        entry = _len_prefixed(b"\x0a", key) + _len_prefixed(b"\x12", encode_value(name, value))
        items.append((key, _len_prefixed(b"\x0a", entry)))
    if sort_keys:
        # protobuf-python (upb) deterministic order: byte-wise, except that a key sorts
        # after the keys it is a prefix of ("label_id" before "label"; C++ puts it first).
        items.sort(key=lambda kv: (*kv[0], 256))
    return b"".join(e for _, e in items)


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
    return _len_prefixed(b"\x0a", _encode_features(features, sort_keys, _encode_feature))


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


# ----------------------------------------------------------------------------- batch parsing


def _object_array(values: list) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = values
    return out


def _fixed_default(name: str, fl: FixedLen) -> np.ndarray | None:
    """The default of ``fl`` as a flat array of ``fl.size`` values, or None."""
    d = fl.default
    if d is None:
        return None
    if fl.dtype == BYTES:
        if isinstance(d, _BYTES_TYPES):
            flat = _object_array([_to_bytes(name, d)])
        else:
            flat = _object_array([_to_bytes(name, v) for v in np.asarray(d, dtype=object).ravel()])
    else:
        a = np.asarray(d)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"FixedLen default of feature {name!r} must be numeric for dtype {fl.dtype}, got {d!r}")
        if fl.dtype == INT64:
            if a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.trunc(a))):
                raise ValueError(f"FixedLen default of feature {name!r} has non-integer values for dtype int64: {d!r}")
            flat = _int64_array(name, a.astype(object) if a.dtype.kind == "f" else a)
        else:
            flat = a.astype(np.float32).ravel()
    if flat.size == 1 and fl.size != 1:
        flat = np.repeat(flat, fl.size)
    elif flat.size != fl.size:
        raise ValueError(
            f"FixedLen default of feature {name!r} has {flat.size} values but shape {list(fl.shape)} "
            f"needs {fl.size}; give a scalar or {fl.size} values"
        )
    return flat


def _present(feats: dict, key: str, kind: int, name: str, ri: int | None, what: str) -> _Feature | None:
    """The Feature ``key`` if it holds values of ``kind``; None if absent or kindless."""
    f = feats.get(key)
    if f is None or f.kind is None:
        return None
    if f.kind != kind:
        raise ParseError(
            f"{what} holds {_KIND_NAMES[f.kind]} values but the spec expects {_KIND_NAMES[kind]}",
            feature=name, record_index=ri,
        )
    return f


def _flat_values(f: _Feature | None, kind: int) -> FeatureValue:
    if f is None:
        return [] if kind == _KIND_BYTES else np.empty(0, np.int64 if kind == _KIND_INT64 else np.float32)
    return f.parts if kind == _KIND_BYTES else f.values()


def check_example_spec(spec: Mapping[str, FeatureSpec]) -> dict[str, FeatureSpec]:
    """``spec`` checked for parsing Examples: a FixedLenSequence there needs
    ``allow_missing=True`` (ValueError otherwise, as in TensorFlow)."""
    spec = normalize_spec(spec)
    for name, s in spec.items():
        if isinstance(s, FixedLenSequence) and not s.allow_missing:
            raise ValueError(f"spec[{name!r}]: a FixedLenSequence in an Example needs allow_missing=True (a missing "
                             "feature then has length 0), as tf.io.parse_example requires")
    return spec


def _parse(records: Sequence[bytes], spec: Mapping[str, FeatureSpec], single: bool,
           decoded: Sequence[dict] | None = None) -> dict[str, Any]:
    """The batch parse; ``decoded``: the records' Features already decoded (a
    SequenceExample's context), in place of decoding ``records``."""
    spec = check_example_spec(spec)
    if isinstance(records, (bytes, bytearray, memoryview, str)):
        raise TypeError("records must be a sequence of serialized Examples; for one record use parse_single_example")
    if isinstance(records, np.ndarray) and records.dtype.kind != "O":
        raise TypeError(
            f"records is a numpy array of dtype {records.dtype}, which drops trailing NUL bytes; "
            "pass a list or an object array of bytes"
        )
    n = len(records)
    fixed, ragged, sparse = {}, {}, {}
    for name, s in spec.items():
        kind = _DTYPE_KIND[s.dtype]
        if isinstance(s, FixedLen):
            out = np.empty((n, s.size), object) if s.dtype == BYTES else np.empty((n, s.size), np.dtype(s.dtype))
            fixed[name] = (s, kind, _fixed_default(name, s), out)
        elif isinstance(s, (VarLen, FixedLenSequence)):
            ragged[name] = (kind, [], np.zeros(n, np.int64))
        else:
            sparse[name] = (s, kind, [], [[] for _ in s.index_key], [])
    wanted = set(fixed) | set(ragged)  # every other feature is checked, never built
    for s, *_ in sparse.values():
        wanted.add(s.value_key)
        wanted.update(s.index_key)
    for i, rec in enumerate(records):
        ri = None if single else i
        try:
            feats = decoded[i] if decoded is not None else _decode_example_raw(rec, wanted)
        except DecodeError as e:
            raise DecodeError(f"not a valid tf.train.Example: {e}", record_index=ri) from None
        except TypeError as e:
            raise TypeError(f"record #{i}: {e}") from None
        for name, (s, kind, default, out) in fixed.items():
            f = _present(feats, name, kind, name, ri, "the feature")
            if f is None:
                if default is None:
                    raise ParseError(
                        f"required feature is missing (FixedLen {s.dtype} shape {list(s.shape)} has no default)",
                        feature=name, record_index=ri,
                    )
                out[i] = default
                continue
            got = f.count()
            if got != s.size:
                raise ParseError(
                    f"expected {s.size} {s.dtype} values for shape {list(s.shape)}, got {got}",
                    feature=name, record_index=ri,
                )
            out[i] = _flat_values(f, kind)
        for name, (kind, chunks, lengths) in ragged.items():
            f = _present(feats, name, kind, name, ri, "the feature")
            if f is not None:
                vals = _flat_values(f, kind)
                chunks.append(vals)
                lengths[i] = len(vals)
        for name, (s, kind, rows, idx, vals) in sparse.items():
            v = _flat_values(_present(feats, s.value_key, kind, name, ri, f"value feature {s.value_key!r}"), kind)
            for d, (key, size) in enumerate(zip(s.index_key, s.size)):
                ix = _flat_values(_present(feats, key, _KIND_INT64, name, ri, f"index feature {key!r}"), _KIND_INT64)
                if len(ix) != len(v):
                    raise ParseError(
                        f"index feature {key!r} has {len(ix)} values but value feature {s.value_key!r} has {len(v)}",
                        feature=name, record_index=ri,
                    )
                if len(ix) and (int(ix.min()) < 0 or int(ix.max()) >= size):
                    bad = int(ix.min()) if int(ix.min()) < 0 else int(ix.max())
                    raise ParseError(
                        f"index feature {key!r} holds {bad}, outside [0, {size})", feature=name, record_index=ri
                    )
                idx[d].append(ix)
            if len(v):
                rows.append(np.full(len(v), i, np.int64))
                vals.append(v)

    result: dict[str, Any] = {}
    for name, s in spec.items():
        if name in fixed:
            out = fixed[name][3].reshape((n, *s.shape))
            result[name] = out[0] if single else out
        elif name in ragged:
            kind, chunks, lengths = ragged[name]
            values = _concat(chunks, kind)
            splits = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=splits[1:])
            if isinstance(s, FixedLenSequence):
                padded = pad_rows(values, splits, s, name, single)[0]
                result[name] = padded[0] if single else padded
            else:
                result[name] = values if single else RaggedColumn(values, splits)
        else:
            s, kind, rows, idx, vals = sparse[name]
            cols = [np.concatenate(rows) if rows else np.empty(0, np.int64)]
            cols += [np.concatenate(c) if c else np.empty(0, np.int64) for c in idx]
            values = _concat(vals, kind)
            if not s.already_sorted:
                order = np.lexsort(cols[::-1])  # stable, so duplicates keep their order as in TF
                cols = [c[order] for c in cols]
                values = values[order]
            indices = np.stack(cols, axis=1).astype(np.int64)
            shape = np.array([n, *s.size], np.int64)
            result[name] = (SparseColumn(indices[:, 1:], values, shape[1:]) if single
                            else SparseColumn(indices, values, shape))
    return result


def _concat(chunks: list, kind: int) -> np.ndarray:
    if kind == _KIND_BYTES:
        return _object_array([b for c in chunks for b in c])
    dtype = np.int64 if kind == _KIND_INT64 else np.float32
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.empty(0, dtype)


def parse_example(
    records: Sequence[bytes], spec: Mapping[str, FeatureSpec]
) -> dict[str, np.ndarray | RaggedColumn | SparseColumn]:
    """Parse a batch of serialized Examples into columns, as ``tf.io.parse_example`` does.

    FixedLen gives an array of shape ``(len(records), *shape)`` (int64, float32, or object
    holding bytes); FixedLenSequence one of shape ``(len(records), longest, *shape)``,
    padded; VarLen a :class:`RaggedColumn`; Sparse a :class:`SparseColumn` with
    indices ``[nnz, 1 + rank]`` (record first) and dense shape ``[len(records), *size]``.
    Raises DecodeError (with ``record_index``) for a record that is not an Example,
    ParseError (with ``feature`` and ``record_index``) for one that does not fit the spec,
    ValueError/TypeError for a bad spec default or a bad ``records`` argument.
    """
    return _parse(records, spec, single=False)


def parse_single_example(
    record: bytes | memoryview, spec: Mapping[str, FeatureSpec]
) -> dict[str, np.ndarray | SparseColumn]:
    """Parse one serialized Example, as ``tf.io.parse_single_example`` does.

    FixedLen gives an array of shape ``shape`` (for shape ``()`` a numpy scalar, or
    ``bytes``, as a TF scalar's ``.numpy()``); VarLen a 1-D array (object for bytes);
    Sparse a :class:`SparseColumn` with indices ``[nnz, rank]`` and dense shape ``size``.
    Raises as :func:`parse_example`, without a record index.
    """
    if not isinstance(record, (bytes, bytearray, memoryview)):
        raise TypeError(f"record must be bytes, bytearray or memoryview, got {type(record).__name__}")
    return _parse([record], spec, single=True)


__all__ = [
    "decode_example", "encode_example", "decode_sequence_example", "encode_sequence_example",
    "parse_example", "parse_single_example",
]

"""Decoding ``tf.train.Example`` / ``SequenceExample`` messages in pure Python, the
reference the native parser must agree with (the rules: :mod:`shardfeed.formats.example`).

A feature the spec does not ask for is checked but never built."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import DecodeError
from .spec import (
    BYTES,
    FLOAT32,
    INT64,
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

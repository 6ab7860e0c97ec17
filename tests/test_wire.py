"""Wire-format primitives: varints, tags, lengths, skipping, packed values."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import DecodeError
from shardfeed.formats import wire

U64 = st.integers(min_value=0, max_value=2**64 - 1)
I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _varint_by_hand(value: int) -> bytes:
    # The textbook definition, independent of wire.encode_varint's shortcuts.
    value &= 2**64 - 1
    out = []
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


# ----------------------------------------------------------------------------- varints


def test_varint_known_encodings():
    # Examples from the protobuf encoding guide.
    assert wire.encode_varint(1) == b"\x01"
    assert wire.encode_varint(150) == b"\x96\x01"
    assert wire.encode_varint(300) == b"\xac\x02"
    assert wire.encode_varint(-1) == b"\xff" * 9 + b"\x01"
    assert wire.decode_varint(b"\x96\x01", 0, 2) == (150, 2)


@pytest.mark.parametrize("value", [0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 0xFFFFFFF, 0x10000000])
def test_varint_lengths_change_at_the_seven_bit_boundaries(value):
    data = wire.encode_varint(value)
    assert data == _varint_by_hand(value)
    assert wire.decode_varint(data, 0, len(data)) == (value, len(data))


@settings(max_examples=200)
@given(U64)
def test_varint_roundtrip_unsigned(value):
    data = wire.encode_varint(value)
    assert data == _varint_by_hand(value)
    assert wire.decode_varint(data, 0, len(data)) == (value, len(data))


@settings(max_examples=200)
@given(I64)
def test_varint_roundtrip_int64(value):
    data = wire.encode_varint(value)
    raw, pos = wire.decode_varint(b"xx" + data, 2, 2 + len(data))
    assert pos == 2 + len(data)
    assert wire.to_int64(raw) == value


def test_encode_varint_rejects_values_outside_64_bits():
    with pytest.raises(ValueError, match="int64"):
        wire.encode_varint(-(2**63) - 1)
    with pytest.raises(ValueError, match="64 bits"):
        wire.encode_varint(2**64)


def test_truncated_varint_names_its_start():
    with pytest.raises(DecodeError, match=r"truncated varint starting at byte 3"):
        wire.decode_varint(b"abc\x80\x80", 3, 5)
    with pytest.raises(DecodeError, match=r"truncated varint at byte 2"):
        wire.decode_varint(b"ab", 2, 2)


def test_varint_end_bound_is_respected_even_if_bytes_follow():
    with pytest.raises(DecodeError, match="truncated varint"):
        wire.decode_varint(b"\x80\x01", 0, 1)


def test_eleven_byte_varint_is_rejected():
    with pytest.raises(DecodeError, match=r"longer than 10 bytes at byte 0"):
        wire.decode_varint(b"\xff" * 10 + b"\x01", 0, 11)


def test_tenth_varint_byte_high_bits_are_dropped():
    # 9 bytes of 7 one-bits = 2**63 - 1; the 10th byte 0x02 sets bit 64, which drops.
    assert wire.decode_varint(b"\xff" * 9 + b"\x02", 0, 10) == (2**63 - 1, 10)
    assert wire.decode_varint(b"\xff" * 9 + b"\x7f", 0, 10) == (2**64 - 1, 10)


# ----------------------------------------------------------------------------- tags


def test_read_tag_splits_field_and_wire_type():
    assert wire.read_tag(b"\x08", 0, 1) == (1, 0, 1)
    assert wire.read_tag(b"\x1a", 0, 1) == (3, 2, 1)
    assert wire.read_tag(b"\x88\x00", 0, 2) == (1, 0, 2)  # zero-padded: legal
    big = wire.encode_varint(((2**29 - 1) << 3) | 5)
    assert wire.read_tag(big, 0, len(big)) == (2**29 - 1, 5, len(big))


def test_field_number_zero_is_rejected():
    with pytest.raises(DecodeError, match="bad tag at byte 0: field number 0 is illegal"):
        wire.read_tag(b"\x02", 0, 1)


@pytest.mark.parametrize("wt", [6, 7])
def test_wire_types_6_and_7_are_rejected(wt):
    with pytest.raises(DecodeError, match=rf"bad wire type {wt} for field 5 at byte 1"):
        wire.read_tag(b"\x00" + bytes([5 << 3 | wt]), 1, 2)


def test_tag_over_32_bits_or_5_bytes_is_rejected():
    with pytest.raises(DecodeError, match="bad tag at byte 0"):
        wire.read_tag(b"\x80\x80\x80\x80\x10", 0, 5)  # 2**32
    with pytest.raises(DecodeError, match="bad tag at byte 0"):
        wire.read_tag(b"\x88\x80\x80\x80\x80\x00", 0, 6)  # small value, 6 bytes


# ----------------------------------------------------------------------------- lengths


def test_length_delimited_bounds():
    data = b"\x03abcde"
    assert wire.read_length_delimited(data, 0, len(data)) == (1, 4)


def test_length_past_end_is_rejected_before_reading():
    with pytest.raises(DecodeError, match=r"length 10 at byte 0 runs past the end .*2 bytes left"):
        wire.read_length_delimited(b"\x0aab", 0, 3)
    # The enclosing message's end counts, not the buffer's.
    with pytest.raises(DecodeError, match="runs past the end"):
        wire.read_length_delimited(b"\x03abc", 0, 3)


def test_huge_length_is_rejected():
    data = wire.encode_varint(2**62) + b"abc"
    with pytest.raises(DecodeError, match=rf"length {2**62} at byte 0 runs past the end"):
        wire.read_length_delimited(data, 0, len(data))


# ----------------------------------------------------------------------------- skipping


@pytest.mark.parametrize(
    "field_bytes",
    [
        wire.encode_tag(7, 0) + wire.encode_varint(2**64 - 1),
        wire.encode_tag(7, 1) + b"12345678",
        wire.encode_tag(7, 2) + b"\x03abc",
        wire.encode_tag(7, 5) + b"1234",
        wire.encode_tag(7, 3) + wire.encode_tag(1, 0) + b"\x05" + wire.encode_tag(7, 4),
        wire.encode_tag(7, 3) + wire.encode_tag(8, 3) + wire.encode_tag(9, 2) + b"\x01x"
        + wire.encode_tag(8, 4) + wire.encode_tag(7, 4),
        wire.encode_tag(7, 3) + wire.encode_tag(7, 4),
    ],
    ids=["varint", "fixed64", "length-delimited", "fixed32", "group", "nested-group", "empty-group"],
)
def test_skip_field_skips_every_wire_type(field_bytes):
    data = field_bytes + b"\x08\x01"  # a following field that must be left alone
    field, wt, pos = wire.read_tag(data, 0, len(data))
    end = wire.skip_field(data, pos, len(data), field, wt, wire.MAX_DEPTH)
    assert end == len(field_bytes)


@pytest.mark.parametrize("wt,size", [(1, 8), (5, 4)])
def test_truncated_fixed_field_is_rejected(wt, size):
    data = wire.encode_tag(3, wt) + b"\x00" * (size - 1)
    with pytest.raises(DecodeError, match=rf"truncated fixed{size * 8} field 3 at byte 1: needs {size} bytes, {size - 1} left"):
        wire.skip_field(data, 1, len(data), 3, wt, wire.MAX_DEPTH)


def test_unterminated_group_is_rejected():
    data = wire.encode_tag(5, 3) + wire.encode_tag(1, 0) + b"\x01"
    with pytest.raises(DecodeError, match="group .*field 5.* never closed"):
        wire.skip_field(data, 1, len(data), 5, 3, wire.MAX_DEPTH)


def test_group_closed_by_other_field_is_rejected():
    data = wire.encode_tag(5, 3) + wire.encode_tag(6, 4)
    with pytest.raises(DecodeError, match="end-group tag for field 6 at byte 1 does not match .*field 5"):
        wire.skip_field(data, 1, len(data), 5, 3, wire.MAX_DEPTH)


def test_end_group_without_start_is_rejected():
    data = wire.encode_tag(5, 4)
    with pytest.raises(DecodeError, match="unexpected end-group tag for field 5 at byte 0"):
        wire.skip_field(data, 1, len(data), 5, 4, wire.MAX_DEPTH)


def test_group_nesting_is_limited_by_depth_budget():
    def nested(n):
        return wire.encode_tag(5, 3) * n + wire.encode_tag(5, 4) * n

    ok = nested(10)
    assert wire.skip_field(ok, 1, len(ok), 5, 3, 10) == len(ok)
    bad = nested(11)
    with pytest.raises(DecodeError, match="nested deeper than 100 levels"):
        wire.skip_field(bad, 1, len(bad), 5, 3, 10)
    deep = nested(100_000)  # must not hit Python's recursion limit
    with pytest.raises(DecodeError, match="nested deeper"):
        wire.skip_field(deep, 1, len(deep), 5, 3, wire.MAX_DEPTH)


# ----------------------------------------------------------------------------- packed values


@settings(max_examples=200)
@given(st.lists(I64, max_size=40))
def test_packed_varints_roundtrip(values):
    payload = b"".join(_varint_by_hand(v) for v in values)
    assert wire.encode_packed_varints(np.array(values, np.int64)) == payload
    data = b"\x01\x02" + payload + b"\x03"
    got = wire.decode_packed_varints(data, 2, 2 + len(payload))
    assert got.dtype == np.int64
    assert got.tolist() == values


@pytest.mark.parametrize("high", [2**7, 2**14, 2**35, 2**63])
def test_long_packed_varints_roundtrip_on_the_vectorized_paths(high):
    rng = np.random.default_rng(high)
    values = rng.integers(-high, high, size=500, dtype=np.int64).tolist() + [-(2**63), 2**63 - 1, 0, -1]
    payload = b"".join(_varint_by_hand(v) for v in values)
    assert len(payload) > 96  # past the Python-loop threshold
    assert wire.encode_packed_varints(np.array(values, np.int64)) == payload
    assert wire.decode_packed_varints(payload, 0, len(payload)).tolist() == values


@settings(max_examples=100)
@given(st.lists(st.integers(min_value=0, max_value=127), min_size=9, max_size=200))
def test_packed_small_varints_fast_path(values):
    payload = bytes(values)
    assert wire.encode_packed_varints(np.array(values)) == payload
    assert wire.decode_packed_varints(payload, 0, len(payload)).tolist() == values


@pytest.mark.parametrize("prefix", [b"", b"\x01" * 100], ids=["small", "vectorized"])
def test_packed_varint_truncated_is_rejected(prefix):
    data = prefix + b"\x96"
    with pytest.raises(DecodeError, match=rf"truncated varint starting at byte {len(prefix)}"):
        wire.decode_packed_varints(data, 0, len(data))


@pytest.mark.parametrize("prefix", [b"", b"\x01" * 100], ids=["small", "vectorized"])
def test_packed_varint_over_10_bytes_is_rejected(prefix):
    data = prefix + b"\xff" * 10 + b"\x01" + b"\x01" * 5
    with pytest.raises(DecodeError, match=rf"longer than 10 bytes at byte {len(prefix)}"):
        wire.decode_packed_varints(data, 0, len(data))


def test_packed_varint_tenth_byte_truncates_like_scalar():
    one = b"\xff" * 9 + b"\x02"
    data = one * 3
    expected = wire.to_int64(wire.decode_varint(one, 0, 10)[0])
    assert wire.decode_packed_varints(data, 0, len(data)).tolist() == [expected] * 3


def test_packed_float32_reads_little_endian():
    values = [1.5, -0.0, float("inf"), 3.25]
    data = b"zz" + struct.pack("<4f", *values)
    got = wire.decode_packed_float32(data, 2, len(data))
    assert got.tolist() == values


def test_packed_float32_length_must_be_multiple_of_4():
    with pytest.raises(DecodeError, match="packed float field at byte 1 has 5 bytes, not a multiple of 4"):
        wire.decode_packed_float32(b"x12345", 1, 6)

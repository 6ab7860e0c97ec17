"""Protocol-buffer wire-format primitives (decode and encode), in pure Python.

The rules are those of the protobuf C++/upb parsers, so that a message we accept is one
protobuf accepts and vice versa:

- A varint is at most 10 bytes; bits past the 64th are dropped (a 10th byte above 1 is
  legal and truncated, as protobuf does). Values are returned unsigned (0 .. 2**64-1);
  callers that want int64 use :func:`to_int64`.
- A tag is a varint of at most 5 bytes whose value fits in 32 bits; field number 0 and
  wire types 6 and 7 are errors. Over-long (zero-padded) tags within 5 bytes are legal.
- A length prefix must fit in the bytes left in the enclosing message (never allocate on
  an unchecked length) and be below 2**31.
- Unknown fields of every wire type are skipped: varint, fixed64, length-delimited,
  fixed32, and groups (start-group 3 ... matching end-group 4, nested groups included).
  Inside a skipped group, field number 0 is tolerated (upb and pure-Python protobuf do).
  An end-group tag with no matching start, a group that is never closed, or one closed
  with another field number is an error.
- Nesting: each sub-message and each group costs one level out of :data:`MAX_DEPTH` (100,
  upb's default); the top-level message costs none.

Every malformed input raises :class:`shardfeed.errors.DecodeError` whose message says what
was wrong and at which byte position (offset from the start of the buffer given).
Positions passed around are absolute offsets into one ``bytes``-like buffer; ``end`` is the
exclusive end of the enclosing message.
"""

from __future__ import annotations

import numpy as np

from ..errors import DecodeError

WIRETYPE_VARINT = 0
WIRETYPE_FIXED64 = 1
WIRETYPE_LENGTH_DELIMITED = 2
WIRETYPE_START_GROUP = 3
WIRETYPE_END_GROUP = 4
WIRETYPE_FIXED32 = 5

MAX_VARINT_BYTES = 10
MAX_DEPTH = 100
MAX_LENGTH = 2**31 - 1
_U64 = 0xFFFFFFFFFFFFFFFF
_U32 = 0xFFFFFFFF

_WIRETYPE_NAMES = {0: "varint", 1: "fixed64", 2: "length-delimited", 3: "start-group", 4: "end-group", 5: "fixed32"}


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Read a varint at ``pos``; return ``(value, next_pos)`` with value in 0 .. 2**64-1.

    Raises DecodeError for a varint cut off by ``end`` or longer than 10 bytes.
    """
    if pos >= end:
        raise DecodeError(f"truncated varint at byte {pos}: message ends at byte {end}")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    p = pos + 1
    while True:
        if p >= end:
            raise DecodeError(f"truncated varint starting at byte {pos}: message ends at byte {end}")
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _U64, p
        shift += 7
        if shift >= 7 * MAX_VARINT_BYTES:
            raise DecodeError(f"varint longer than {MAX_VARINT_BYTES} bytes at byte {pos}")


def to_int64(value: int) -> int:
    """Reinterpret an unsigned 64-bit varint value as a signed int64 (two's complement)."""
    return value - (1 << 64) if value >= (1 << 63) else value


def read_tag(buf: bytes, pos: int, end: int, allow_field_zero: bool = False) -> tuple[int, int, int]:
    """Read a field tag at ``pos``; return ``(field_number, wire_type, next_pos)``.

    Raises DecodeError for a truncated or over-long tag, field number 0 (unless
    ``allow_field_zero``: protobuf allows it inside skipped groups), or wire type 6/7.
    """
    b = buf[pos] if pos < end else 0x80
    if b < 0x80:
        key = b
        nxt = pos + 1
    else:
        key, nxt = decode_varint(buf, pos, end)
        if nxt - pos > 5 or key > _U32:
            raise DecodeError(f"bad tag at byte {pos}: a tag must be a varint of at most 5 bytes that fits in 32 bits")
    field = key >> 3
    wire_type = key & 7
    if field == 0 and not allow_field_zero:
        raise DecodeError(f"bad tag at byte {pos}: field number 0 is illegal")
    if wire_type > 5:
        raise DecodeError(f"bad wire type {wire_type} for field {field} at byte {pos}")
    return field, wire_type, nxt


def read_length_delimited(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Read a length prefix at ``pos``; return ``(start, stop)`` of the payload it announces.

    Raises DecodeError when the length runs past ``end`` (checked before anything is read).
    """
    length, start = decode_varint(buf, pos, end)
    if length > end - start or length > MAX_LENGTH:
        raise DecodeError(
            f"length {length} at byte {pos} runs past the end of the message "
            f"({end - start} bytes left before byte {end})"
        )
    return start, start + length


def skip_field(buf: bytes, pos: int, end: int, field: int, wire_type: int, depth: int) -> int:
    """Skip the value of a field whose tag was just read (``pos`` is just after the tag).

    ``depth`` is the nesting budget left at the current message; a group costs one level.
    Returns the position after the value. Raises DecodeError for anything malformed,
    including an end-group tag (wire type 4), which has no value to skip.
    """
    if wire_type == WIRETYPE_VARINT:
        return decode_varint(buf, pos, end)[1]
    if wire_type == WIRETYPE_LENGTH_DELIMITED:
        return read_length_delimited(buf, pos, end)[1]
    if wire_type == WIRETYPE_FIXED32 or wire_type == WIRETYPE_FIXED64:
        size = 4 if wire_type == WIRETYPE_FIXED32 else 8
        if end - pos < size:
            raise DecodeError(
                f"truncated {_WIRETYPE_NAMES[wire_type]} field {field} at byte {pos}: "
                f"needs {size} bytes, {end - pos} left"
            )
        return pos + size
    if wire_type == WIRETYPE_START_GROUP:
        return _skip_group(buf, pos, end, field, depth)
    if wire_type == WIRETYPE_END_GROUP:
        raise DecodeError(f"unexpected end-group tag for field {field} at byte {pos - 1}: no group is open")
    raise DecodeError(f"bad wire type {wire_type} for field {field} near byte {pos}")


def _skip_group(buf: bytes, pos: int, end: int, field: int, depth: int) -> int:
    # Iterative, so that hostile nesting hits MAX_DEPTH, never Python's recursion limit.
    open_fields = [field]
    start = pos
    if depth - 1 < 0:
        raise DecodeError(f"message nested deeper than {MAX_DEPTH} levels at byte {pos}")
    while open_fields:
        if pos >= end:
            raise DecodeError(
                f"group (field {open_fields[-1]}) opened before byte {start} is never closed: "
                f"message ends at byte {end}"
            )
        tag_pos = pos
        f, wt, pos = read_tag(buf, pos, end, allow_field_zero=True)
        if wt == WIRETYPE_END_GROUP:
            if f != open_fields[-1]:
                raise DecodeError(
                    f"end-group tag for field {f} at byte {tag_pos} does not match the open group "
                    f"(field {open_fields[-1]})"
                )
            open_fields.pop()
        elif wt == WIRETYPE_START_GROUP:
            if depth - 1 - len(open_fields) < 0:
                raise DecodeError(f"message nested deeper than {MAX_DEPTH} levels at byte {tag_pos}")
            open_fields.append(f)
        else:
            pos = skip_field(buf, pos, end, f, wt, 0)
    return pos


def decode_packed_varints(buf: bytes, start: int, stop: int) -> np.ndarray:
    """Decode the packed varints in ``buf[start:stop]`` into an int64 array (vectorized).

    Raises DecodeError for a varint cut off at ``stop`` or longer than 10 bytes.
    """
    n = stop - start
    if n == 0:
        return np.empty(0, np.int64)
    if n <= 96:  # below this, numpy's fixed cost (~25 us) outweighs the Python loop
        out = []
        pos = start
        while pos < stop:
            v, pos = decode_varint(buf, pos, stop)
            out.append(v - (1 << 64) if v >= (1 << 63) else v)
        return np.array(out, np.int64)
    a = np.frombuffer(buf, np.uint8, n, start)
    if a[-1] >= 0x80:
        last = np.flatnonzero(a < 0x80)
        first = int(last[-1]) + 1 if len(last) else 0
        raise DecodeError(f"truncated varint starting at byte {start + first}: packed field ends at byte {stop}")
    term = a < 0x80
    if term.all():
        return a.astype(np.int64)
    ends = np.flatnonzero(term)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > MAX_VARINT_BYTES:
        bad = int(starts[np.argmax(lengths > MAX_VARINT_BYTES)])
        raise DecodeError(f"varint longer than {MAX_VARINT_BYTES} bytes at byte {start + bad}")
    shifts = ((np.arange(n) - np.repeat(starts, lengths)) * 7).astype(np.uint64)
    vals = (a & 0x7F).astype(np.uint64) << shifts  # shifts <= 63: bits past 64 drop, as protobuf
    return np.bitwise_or.reduceat(vals, starts).view(np.int64)


def check_packed_varints(buf: bytes, start: int, stop: int) -> None:
    """Check the packed varints in ``buf[start:stop]`` as :func:`decode_packed_varints`
    does (same errors, same order), without decoding them."""
    n = stop - start
    if n <= 96:
        pos = start
        while pos < stop:
            pos = decode_varint(buf, pos, stop)[1]
        return
    a = np.frombuffer(buf, np.uint8, n, start)
    if a[-1] >= 0x80:
        last = np.flatnonzero(a < 0x80)
        first = int(last[-1]) + 1 if len(last) else 0
        raise DecodeError(f"truncated varint starting at byte {start + first}: packed field ends at byte {stop}")
    ends = np.flatnonzero(a < 0x80)
    if len(ends) == n:
        return
    lengths = np.diff(ends, prepend=-1)
    if lengths.max() > MAX_VARINT_BYTES:
        bad = int(ends[np.argmax(lengths > MAX_VARINT_BYTES)] - lengths[np.argmax(lengths > MAX_VARINT_BYTES)] + 1)
        raise DecodeError(f"varint longer than {MAX_VARINT_BYTES} bytes at byte {start + bad}")


def decode_packed_float32(buf: bytes, start: int, stop: int) -> np.ndarray:
    """The little-endian float32 values packed in ``buf[start:stop]`` (a read-only view).

    Raises DecodeError when the length is not a multiple of 4.
    """
    n = stop - start
    if n % 4:
        raise DecodeError(f"packed float field at byte {start} has {n} bytes, not a multiple of 4")
    return np.frombuffer(buf, "<f4", n // 4, start)


def encode_varint(value: int) -> bytes:
    """The varint bytes of ``value``; negative values are written as 64-bit two's complement
    (10 bytes), as protobuf writes int64. Raises ValueError outside -2**63 .. 2**64-1."""
    if value < 0:
        if value < -(1 << 63):
            raise ValueError(f"{value} is below the int64 range")
        value += 1 << 64
    elif value > _U64:
        raise ValueError(f"{value} does not fit in 64 bits")
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:  # lengths of fields up to 16 KiB, and of records up to 2 MiB, below: no loop
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_tag(field: int, wire_type: int) -> bytes:
    """The tag bytes of ``field`` with ``wire_type``."""
    return encode_varint((field << 3) | wire_type)


def encode_length_delimited(field: int, payload: bytes) -> bytes:
    """Field ``field`` holding ``payload`` as a length-delimited value (tag, length, bytes)."""
    return encode_tag(field, WIRETYPE_LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)


def encode_packed_varints(values: np.ndarray) -> bytes:
    """The varints of int64 ``values`` back to back (the payload of a packed field), vectorized."""
    v = np.ascontiguousarray(values, np.int64).view(np.uint64)
    if len(v) == 0:
        return b""
    if int(v.max()) < 0x80:
        return v.astype(np.uint8).tobytes()
    if len(v) <= 32:
        return b"".join([encode_varint(x) for x in v.view(np.int64).tolist()])
    nbytes = np.searchsorted(_VARINT_LIMITS, v, side="right") + 1
    k = np.arange(int(nbytes.max()), dtype=np.uint64)
    groups = ((v[:, None] >> (k * np.uint64(7))) & np.uint64(0x7F)).astype(np.uint8)
    groups |= ((k[None, :] + 1) < nbytes[:, None]).astype(np.uint8) << 7  # continuation bits
    return groups[k[None, :] < nbytes[:, None]].tobytes()  # row-major: each value's bytes in order


__all__ = [
    "WIRETYPE_VARINT", "WIRETYPE_FIXED64", "WIRETYPE_LENGTH_DELIMITED", "WIRETYPE_START_GROUP",
    "WIRETYPE_END_GROUP", "WIRETYPE_FIXED32", "MAX_VARINT_BYTES", "MAX_DEPTH", "MAX_LENGTH",
    "decode_varint", "to_int64", "read_tag", "read_length_delimited", "skip_field",
    "decode_packed_varints", "check_packed_varints", "decode_packed_float32", "encode_varint", "encode_tag",
    "encode_length_delimited", "encode_packed_varints",
]

"""The native core (C): CRC-32C, TFRecord framing scan, batched Example parsing
(SequenceExamples: :mod:`.sequence_native`).

Everything here has a pure-Python twin that is the reference (:mod:`.crc`,
:mod:`.tfrecord`, :mod:`.example`); the native versions give identical values and raise
the same errors, only faster, and they release the GIL while they work so that threads
parse batches in parallel. When the extension is not built (no compiler at install time)
every function here still works, through the pure-Python path; :func:`native_info` says
which path is in use and why.

Typical use, from a large read or an ``mmap`` to numpy columns with no per-record
``bytes`` objects::

    offsets, lengths, consumed, error = scan_frames(buf)
    columns = parse_example_batch((buf, offsets, lengths), spec)
"""

from __future__ import annotations

import collections
import os
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptRecordError, DecodeError, ParseError
from . import crc as _crc
from .padding import pad_rows
from .spec import (
    BYTES,
    FLOAT32,
    INT64,
    FeatureSpec,
    FixedLen,
    FixedLenSequence,
    RaggedColumn,
    Sparse,
    SparseColumn,
    VarLen,
)

try:
    from .. import _native as _ext  # type: ignore[attr-defined]

    _WHY_NOT = ""
    if not hasattr(_ext, "parse_batch"):  # the C sources' folder, imported as a namespace package
        _ext = None
        _WHY_NOT = "the C extension is not built (shardfeed._native is only its source folder)"
except ImportError as _exc:  # pragma: no cover - depends on the build
    _ext = None
    _WHY_NOT = f"the C extension is not built ({_exc})"
    import logging as _logging

    _logging.getLogger(__name__).warning(
        "shardfeed: %s; using the pure-Python path (same results, slower framing and parsing). "
        "Reinstall with a C compiler and the Python headers to build it.", _WHY_NOT)


def _large_objects_off_gil_allowed() -> bool:
    """Whether parse threads may make object-form ``bytes`` values of 512 bytes or more
    without the GIL (the native module also checks the allocators on every batch): not under
    a non-default ``PYTHONMALLOC`` (debug hooks, mimalloc), in development mode, in a debug
    build, or with ``SHARDFEED_LARGE_OBJECTS_OFF_GIL=0``."""
    if os.environ.get("SHARDFEED_LARGE_OBJECTS_OFF_GIL", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if os.environ.get("PYTHONMALLOC", "") not in ("", "pymalloc", "malloc"):
        return False
    return not sys.flags.dev_mode and not hasattr(sys, "gettotalrefcount")


if _ext is not None and hasattr(_ext, "set_large_objects_off_gil"):
    _ext.set_large_objects_off_gil(_large_objects_off_gil_allowed())

__all__ = [
    "gather",
    "native_available", "native_info", "scan_frames", "scan_frames_deferred", "Buffers", "crc32c", "masked_crc32c",
    "parse_example_batch", "ParsePool", "parse_pool_available",
    "compile_spec", "CompiledSpec", "BytesBuffer", "pack_bytes", "release_pooled_memory", "validate_example",
    "validate_sequence_example", "image_check", "ImageHeader", "image_rows",
    "FRAME_CHECKS",
]

# frame check names, as tfrecord.py and CorruptRecordError name them
FRAME_CHECKS = {1: "length crc", 2: "data crc", 3: "absurd length"}
TRUNCATED_WHILE_READ = "the file was truncated while this pass read it, and the record lies past its new end"
"""The detail of a ``"truncated data"`` error found by the native core's truncation guard."""
_MAX_RECORD_BYTES = (1 << 31) - 1
_KIND = {BYTES: 1, FLOAT32: 2, INT64: 3}
_KIND_NAMES = {1: "bytes_list", 2: "float_list", 3: "int64_list"}
_FIXED, _VAR, _SPARSE = 0, 1, 2


def native_available() -> bool:
    """True when the C extension is built and importable."""
    return _ext is not None


def native_info() -> str:
    """Which path is in use: ``"native (sse4.2 crc)"`` or ``"pure-python: <why>"``."""
    if _ext is None:
        return f"pure-python: {_WHY_NOT}"
    return f"native ({_ext.crc_backend()} crc)"


# ----------------------------------------------------------------------------- CRC


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` (any contiguous bytes-like object), continuing from ``value``."""
    if _ext is None:
        return _crc.crc32c(data, value)
    return _ext.crc32c(data, value)


def masked_crc32c(data: Any) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    if _ext is None:
        return _crc.masked_crc32c(data)
    return _ext.masked_crc32c(data)


# ----------------------------------------------------------------------------- framing

_HEADER = struct.Struct("<QI")


def _scan_frames_py(buf: Any, verify_crc: bool, max_record_bytes: int):
    mv = memoryview(buf).cast("B")
    n = len(mv)
    pos = 0
    offsets: list[int] = []
    lengths: list[int] = []
    error = None
    while n - pos >= 12:
        length, length_crc = _HEADER.unpack_from(mv, pos)
        if verify_crc and _crc.masked_length_crc(length) != length_crc:
            error = ("length crc", pos)
            break
        if length > max_record_bytes:
            error = ("absurd length", pos)
            break
        if n - pos < 16 + length:
            break
        start = pos + 12
        if verify_crc:
            (dc,) = struct.unpack_from("<I", mv, start + length)
            if _crc.masked_crc32c(mv[start:start + length]) != dc:
                error = ("data crc", pos)
                break
        offsets.append(start)
        lengths.append(length)
        pos = start + length + 4
    return np.array(offsets, np.int64), np.array(lengths, np.int64), pos, error


def _frame_records_py(records: Sequence[Any]) -> bytes:
    out: list[Any] = []
    for rec in records:
        parts = rec if isinstance(rec, (list, tuple)) else (rec,)
        data = b"".join(parts)
        n = len(data)
        out += (_HEADER.pack(n, _crc.masked_length_crc(n)), data, struct.pack("<I", _crc.masked_crc32c(data)))
    return b"".join(out)


def frame_records(records: Sequence[Any], *, pooled: bool = False) -> Any:
    """Each record in a TFRecord frame (length, masked CRC of the length, data, masked
    CRC of the data), joined: the bytes ``TFRecordWriter.write`` puts in a file for them.

    A record is a bytes-like object or a list/tuple of bytes-like pieces (joined into the
    record: the native core copies each byte once, into the output, checksumming it in the
    same pass, with the GIL released). Returns bytes, or with ``pooled=True`` a 1-D uint8
    array whose memory (for a megabyte or more) comes back to a pool when the array dies,
    so chunk after chunk is framed into pages already mapped (a fresh buffer's page faults
    cost about as much as the copy). Raises TypeError for a piece that is not bytes-like.
    """
    if not isinstance(records, (list, tuple)):
        raise TypeError(f"frame_records takes a list or tuple of records, got {type(records).__name__}")
    if _ext is None:
        out = _frame_records_py(records)
        return np.frombuffer(out, np.uint8) if pooled else out
    return _ext.frame_records(records, pooled)


def gather(dst: Any, dst_offsets: np.ndarray, src: Any, src_offsets: np.ndarray, lengths: np.ndarray) -> None:
    """Copy ``src[src_offsets[k]:][:lengths[k]]`` to ``dst[dst_offsets[k]:]`` for every
    ``k`` (``dst`` a writable buffer, ``src`` any buffer: an ``mmap`` of a shard, say);
    native ``memcpy`` with the GIL released. ``IndexError`` naming the first range that
    does not fit in either buffer (nothing is copied then)."""
    d = np.ascontiguousarray(dst_offsets, dtype=np.int64)
    s = np.ascontiguousarray(src_offsets, dtype=np.int64)
    n = np.ascontiguousarray(lengths, dtype=np.int64)
    if not len(d) == len(s) == len(n):
        raise ValueError("gather: offsets and lengths must have one length")
    if _ext is not None:
        done = _ext.gather(dst, d, src, s, n)
    else:
        dv, sv = memoryview(dst).cast("B"), memoryview(src).cast("B")
        done = len(n)
        for k, (a, b, ln) in enumerate(zip(d.tolist(), s.tolist(), n.tolist())):
            if min(a, b, ln) < 0 or a + ln > len(dv) or b + ln > len(sv):
                done = k
                break
        if done == len(n):
            for a, b, ln in zip(d.tolist(), s.tolist(), n.tolist()):
                dv[a:a + ln] = sv[b:b + ln]
    if done != len(n):
        raise IndexError(f"gather: range {done} (source offset {int(s[done])}, {int(n[done])} bytes, destination "
                         f"offset {int(d[done])}) does not fit in a buffer of {len(memoryview(src).cast('B'))} "
                         f"bytes (source) or {len(memoryview(dst).cast('B'))} (destination)")


def scan_frames(
    buf: Any, verify_crc: bool = True, max_record_bytes: int = _MAX_RECORD_BYTES
) -> tuple[np.ndarray, np.ndarray, int, None | tuple[str, int]]:
    """Find the whole TFRecord frames at the start of ``buf`` (bytes, bytearray,
    memoryview, mmap, numpy uint8 array: any contiguous buffer).

    Returns ``(offsets, lengths, consumed, error)``: int64 arrays of each record's data
    start and length (offsets into ``buf``), the bytes of whole good frames from the start
    (where the next scan should begin after a refill), and ``None`` or
    ``(check, frame_offset)`` for the first frame that failed a check, ``check`` being
    ``"length crc"``, ``"data crc"`` or ``"absurd length"`` (as in
    :class:`~shardfeed.errors.CorruptRecordError`); frames before it are returned. The scan
    stops without error at a frame cut off by the end of ``buf``. Releases the GIL.
    """
    if not 0 <= max_record_bytes < 1 << 64:
        raise ValueError(f"max_record_bytes must be in 0 .. 2**64-1, got {max_record_bytes}")
    if _ext is None:
        return _scan_frames_py(buf, verify_crc, max_record_bytes)
    offsets, lengths, consumed, err, err_off = _ext.scan_frames(buf, bool(verify_crc), int(max_record_bytes))
    return offsets, lengths, consumed, (FRAME_CHECKS[err], err_off) if err else None


def scan_frames_deferred(
    buf: Any, max_record_bytes: int = _MAX_RECORD_BYTES
) -> tuple[np.ndarray, np.ndarray, int, None | tuple[str, int], np.ndarray]:
    """:func:`scan_frames` checking each frame's length CRC but not its data CRC: returns
    ``(offsets, lengths, consumed, error, crcs)``, ``crcs`` each frame's stored masked data
    CRC (uint32), for :func:`parse_example_batch` (``crcs=``) to check in the pass that
    copies the values out. Native core only (``RuntimeError`` without it)."""
    if _ext is None:
        raise RuntimeError("scan_frames_deferred needs the native core")
    if not 0 <= max_record_bytes < 1 << 64:
        raise ValueError(f"max_record_bytes must be in 0 .. 2**64-1, got {max_record_bytes}")
    offsets, lengths, consumed, err, err_off, crcs = _ext.scan_frames(buf, True, int(max_record_bytes), True)
    return offsets, lengths, consumed, (FRAME_CHECKS[err], err_off) if err else None, crcs


# ----------------------------------------------------------------------------- Example parsing


class Buffers(NamedTuple):
    """Records in several buffers, for a ``(buffer, offsets, lengths)`` triple whose records
    lie in more than one (a batch spanning two mapped files, joined without a copy): record
    ``k`` is ``buffers[which[k]][offsets[k]:][:lengths[k]]``."""

    buffers: tuple
    which: np.ndarray

    def record(self, k: int, offset: int, length: int) -> bytes:
        """Record ``k`` (at ``offset``, ``length`` bytes in its buffer) as bytes."""
        return bytes(memoryview(self.buffers[int(self.which[k])]).cast("B")[offset:offset + length])


class _InFrame:
    """The type of :data:`IN_FRAME`."""

    def __repr__(self) -> str:
        return "IN_FRAME"

    def __reduce__(self) -> str:
        return "IN_FRAME"


IN_FRAME = _InFrame()
"""``crcs=IN_FRAME``: each record's data lies in its whole TFRecord frame in its buffer (the
length and its masked CRC in the 12 bytes before it, the masked data CRC in the 4 after),
and the parser checks the frame: the length field, its CRC and the data CRC. How a global
shuffle hands the parser records straight from the mapped shards, every check made by
the parsing threads (a failed one is a CorruptRecordError ``"data crc"`` naming the
record, as a failed deferred CRC is; the reader's reference path then names the check)."""


def frame_crcs(buffer: Any, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The stored data CRCs of records in their frames (:data:`IN_FRAME`), as a ``crcs``
    array; a record whose length field or length CRC is wrong gets a CRC that fails (its
    stored one flipped), so the parser stops there as at a bad data CRC."""
    out = np.empty(len(offsets), dtype=np.uint32)
    for k, (o, n) in enumerate(zip(np.asarray(offsets).tolist(), np.asarray(lengths).tolist())):
        src = buffer.buffers[int(buffer.which[k])] if isinstance(buffer, Buffers) else buffer
        mv = memoryview(src).cast("B")
        head = bytes(mv[o - 12:o])
        (stored,) = struct.unpack("<I", bytes(mv[o + n:o + n + 4]))
        length, length_crc = struct.unpack("<QI", head)
        good = length == n and _crc.masked_crc32c(head[:8]) == length_crc
        out[k] = stored if good else stored ^ 1
    return out


class BytesBuffer(NamedTuple):
    """A bytes column without a Python object per value: value ``k`` is
    ``data[offsets[k]:offsets[k + 1]]`` (``data`` uint8, ``offsets`` int64 of ``count + 1``).
    A FixedLen bytes column lists its values record by record in C order."""

    data: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.offsets) - 1

    def value(self, k: int) -> bytes:
        return self.data[self.offsets[k]:self.offsets[k + 1]].tobytes()

    def to_list(self) -> list[bytes]:
        d, o = self.data.tobytes(), self.offsets.tolist()
        return [d[o[k]:o[k + 1]] for k in range(len(o) - 1)]

    def to_numpy(self) -> np.ndarray:
        """The values as a 1-D numpy object array of bytes."""
        if _ext is not None:
            return _ext.unpack_bytes(self.data, self.offsets)
        out = np.empty(len(self), object)
        out[:] = self.to_list()
        return out


def release_pooled_memory() -> None:
    """Free the recycled blocks kept for the next large buffer-form batches (none are in
    use by an array: those stay valid). Unused blocks also go back by themselves once idle
    for a while (:mod:`.bufpool`: ``$SHARDFEED_POOL_IDLE_SECONDS``), so a later pass starts
    warm; call this to give them back now."""
    if _ext is not None:
        _ext.pool_clear()


def pack_bytes(values: np.ndarray) -> BytesBuffer | None:
    """An object array whose values are all exactly ``bytes`` as one :class:`BytesBuffer`
    (its values in C order; ``to_numpy().reshape(values.shape)`` gives them back), or
    ``None`` when one is not (a ``str``, ``None``, a subclass of ``bytes``...)."""
    if _ext is not None:
        packed = _ext.pack_bytes(values)
        return None if packed is None else BytesBuffer(*packed)
    flat = values.ravel().tolist()
    if not all(type(v) is bytes for v in flat):
        return None
    offsets = np.zeros(len(flat) + 1, np.int64)
    np.cumsum([len(v) for v in flat], out=offsets[1:])
    return BytesBuffer(np.frombuffer(b"".join(flat), np.uint8).copy(), offsets)


def _key_bytes(name: str) -> bytes | None:
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError:
        return None  # no record can hold this key (record keys are valid UTF-8)


class CompiledSpec:
    """A feature spec prepared once for the native parser (see :func:`compile_spec`)."""

    def __init__(self, spec: Mapping[str, FeatureSpec]):
        from .example_parse import _fixed_default, check_example_spec  # the reference's rules

        self.spec = check_example_spec(spec)
        # a FixedLenSequence is read as a VarLen (values and row splits) and padded after
        order = ([n for n, s in self.spec.items() if isinstance(s, FixedLen)]
                 + [n for n, s in self.spec.items() if isinstance(s, (VarLen, FixedLenSequence))]
                 + [n for n, s in self.spec.items() if isinstance(s, Sparse)])
        self.names = order
        cols = []
        for name in order:
            s = self.spec[name]
            kind = _KIND[s.dtype]
            if isinstance(s, FixedLen):
                d = _fixed_default(name, s)
                if d is not None:
                    d = list(d) if s.dtype == BYTES else np.ascontiguousarray(d, np.dtype(s.dtype))
                cols.append((_FIXED, kind, _key_bytes(name), s.size, d, (), ()))
            elif isinstance(s, (VarLen, FixedLenSequence)):
                cols.append((_VAR, kind, _key_bytes(name), 0, None, (), ()))
            else:
                cols.append((_SPARSE, kind, _key_bytes(s.value_key), 0, None,
                             tuple(_key_bytes(k) for k in s.index_key), np.array(s.size, np.int64)))
        self._native = _ext.CompiledSpec(cols) if _ext is not None else None


_cache_by_id: dict[int, tuple[Any, CompiledSpec]] = {}
_cache_lock = threading.Lock()


def _same_items(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] is y[1] for x, y in zip(a, b))


def compile_spec(spec: Mapping[str, FeatureSpec] | CompiledSpec) -> CompiledSpec:
    """The :class:`CompiledSpec` of ``spec``, cached per spec object (a dict is compiled
    again only when its contents changed). Raises as ``parse_example`` does for a bad spec."""
    if isinstance(spec, CompiledSpec):
        return spec
    key = id(spec)
    items = tuple(spec.items()) if isinstance(spec, Mapping) else None
    with _cache_lock:
        hit = _cache_by_id.get(key)
    if hit is not None and hit[0] is spec and items is not None and _same_items(hit[1]._items, items):
        return hit[1]
    compiled = CompiledSpec(spec)
    compiled._items = items  # type: ignore[attr-defined]
    with _cache_lock:
        if len(_cache_by_id) > 256:
            _cache_by_id.clear()
        _cache_by_id[key] = (spec, compiled)
    return compiled


def _check_records(records: Any) -> None:
    if isinstance(records, (bytes, bytearray, memoryview, str)):
        raise TypeError("records must be a sequence of serialized Examples; for one record use parse_single_example")
    if isinstance(records, np.ndarray) and records.dtype.kind != "O":
        raise TypeError(
            f"records is a numpy array of dtype {records.dtype}, which drops trailing NUL bytes; "
            "pass a list or an object array of bytes"
        )


def _raise(err: tuple, cs: CompiledSpec) -> None:
    kind, code, ri, ci, a, b, c, msg = err
    if kind == "type":
        raise TypeError(f"record #{ri}: a serialized record must be bytes, bytearray or memoryview, got {msg}")
    if kind == "decode":
        raise DecodeError(f"not a valid tf.train.Example: {msg}", record_index=ri)
    name = cs.names[ci]
    raise ParseError(parse_error_message(code, a, b, c, cs.spec[name]), feature=name, record_index=ri)


def parse_error_message(code: int, a: int, b: int, c: int, s: FeatureSpec) -> str:
    """The reference's ParseError message for a native error ``code`` (``SF_P_*`` in
    example_parse.h) with its numbers ``a``, ``b``, ``c``, about a column of spec ``s``."""
    if code == 1:  # kind mismatch
        if a == 0:
            what = "the feature"
        elif a == 1:
            what = f"value feature {s.value_key!r}"
        else:
            what = f"index feature {s.index_key[a - 2]!r}"
        message = f"{what} holds {_KIND_NAMES[b]} values but the spec expects {_KIND_NAMES[c]}"
    elif code == 2:
        message = f"required feature is missing (FixedLen {s.dtype} shape {list(s.shape)} has no default)"
    elif code == 3:
        message = f"expected {s.size} {s.dtype} values for shape {list(s.shape)}, got {a}"
    elif code == 4:
        message = f"index feature {s.index_key[a]!r} has {b} values but value feature {s.value_key!r} has {c}"
    elif code == 5:
        message = f"index feature {s.index_key[a]!r} holds {b}, outside [0, {s.size[a]})"
    elif code == 6:
        message = "required feature list is missing (FixedLenSequence without allow_missing)"
    elif code == 7:
        message = (f"step {a} of the feature list holds {_KIND_NAMES[b]} values but the spec expects "
                   f"{_KIND_NAMES[c]}")
    elif code == 8:
        message = f"step {a} of the feature list has {b} values, expected {s.size}"
    else:  # pragma: no cover - the C side has no other codes
        message = f"parse error code {code}"
    return message


def _sparse_column(s: Sparse, n: int, values: Any, splits: np.ndarray, idx: list, as_buffer: bool) -> SparseColumn:
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(splits))
    cols = [rows, *idx]
    if not s.already_sorted and len(rows):
        order = np.lexsort(cols[::-1])  # stable, as the reference (and TF) sort
        cols = [c[order] for c in cols]
        if isinstance(values, tuple):  # (data, offsets): reorder the values' slices
            data, offs = values
            lens = np.diff(offs)[order]
            new_offs = np.zeros(len(lens) + 1, np.int64)
            np.cumsum(lens, out=new_offs[1:])
            pieces = [data[offs[k]:offs[k + 1]] for k in order]
            data = np.concatenate(pieces) if pieces else data[:0]
            values = (data, new_offs)
        else:
            values = values[order]
    indices = np.stack(cols, axis=1).astype(np.int64) if cols else np.empty((0, 0), np.int64)
    if as_buffer and isinstance(values, tuple):
        values = BytesBuffer(*values)
    return SparseColumn(indices, values, np.array([n, *s.size], np.int64))


def parse_example_batch(
    records: Sequence[bytes] | tuple[Any, np.ndarray, np.ndarray],
    spec: Mapping[str, FeatureSpec] | CompiledSpec,
    *,
    bytes_as: str = "object",
    crcs: np.ndarray | None = None,
) -> dict[str, np.ndarray | RaggedColumn | SparseColumn | BytesBuffer]:
    """Parse a batch of serialized Examples into columns; same result and errors as
    :func:`shardfeed.formats.example.parse_example`, natively (GIL released).

    ``records`` is a sequence of bytes-like records, or a triple ``(buffer, offsets,
    lengths)`` naming records inside one buffer (what :func:`scan_frames` returns), so no
    per-record ``bytes`` object is made. ``spec`` may be a :class:`CompiledSpec`.
    ``bytes_as="buffer"`` returns each bytes column as a :class:`BytesBuffer` (``data``,
    ``offsets``) instead of a numpy object array: for a FixedLen feature of shape ``S``
    the values of record ``i`` are ``prod(S)`` consecutive entries; a VarLen feature gives
    a :class:`RaggedColumn` whose ``values`` is a BytesBuffer.

    ``crcs`` (with a triple only): each record's stored masked data CRC (uint32, what
    :func:`scan_frames_deferred` returns); every record's CRC is checked, a buffer-form
    FixedLen/VarLen bytes column's values copied out in the same pass. A record whose CRC
    fails raises CorruptRecordError (``check`` "data crc", ``url`` None, ``offset`` its
    frame's start in ``buffer``, ``record_index`` its index in the batch), before any
    DecodeError or ParseError of that record or a later one.

    Raises DecodeError (``record_index``) for a record that is not an Example, ParseError
    (``feature``, ``record_index``) for one that does not fit the spec, TypeError/ValueError
    for bad arguments.
    """
    cs, triple, as_buffer, crcs = _checked(records, spec, bytes_as, crcs)
    if _ext is None:
        if crcs is IN_FRAME:
            crcs = frame_crcs(*records)
        if crcs is not None:
            _check_crcs_py(records, crcs)
        return _parse_py(records, cs, triple, as_buffer)
    args, n, offsets = _native_args(records, cs, triple, as_buffer, crcs)
    return _native_columns(_ext.parse_batch(*args), cs, n, offsets, as_buffer)


def _checked(records: Any, spec: Any, bytes_as: str,
             crcs: np.ndarray | None) -> tuple[CompiledSpec, bool, bool, np.ndarray | None]:
    """A batch parse's arguments checked: ``(compiled spec, records are a triple, bytes as
    buffers, crcs as uint32)``; ValueError for a bad ``bytes_as`` or ``crcs``."""
    if bytes_as not in ("object", "buffer"):
        raise ValueError(f"bytes_as must be 'object' or 'buffer', got {bytes_as!r}")
    triple = isinstance(records, tuple) and len(records) == 3 and isinstance(records[1], (np.ndarray, list, tuple))
    if crcs is not None:
        if not triple:
            raise ValueError("crcs: only with records given as (buffer, offsets, lengths)")
        if crcs is IN_FRAME:
            return compile_spec(spec), triple, bytes_as == "buffer", crcs
        crcs = np.ascontiguousarray(crcs, dtype=np.uint32)
        if len(crcs) != len(records[1]):
            raise ValueError(f"crcs: {len(crcs)} CRCs for {len(records[1])} records")
    return compile_spec(spec), triple, bytes_as == "buffer", crcs


def _native_args(records: Any, cs: CompiledSpec, triple: bool, as_buffer: bool,
                 crcs: np.ndarray | None) -> tuple[tuple, int, Any]:
    """The native ``parse_batch``'s arguments for ``records``: ``(args, n, offsets)``."""
    if triple:
        buf, offsets, lengths = records
        flag = True if crcs is IN_FRAME else crcs  # the C core's "the CRCs are in the frames"
        if isinstance(buf, Buffers):
            return ((cs._native, tuple(buf.buffers), offsets, lengths, as_buffer, flag,
                     np.ascontiguousarray(buf.which, dtype=np.int64)), len(offsets), offsets)
        return (cs._native, buf, offsets, lengths, as_buffer, flag), len(offsets), offsets
    _check_records(records)
    return (cs._native, records, None, None, as_buffer), len(records), None


def _native_columns(parsed: tuple, cs: CompiledSpec, n: int, offsets: Any,
                    as_buffer: bool) -> dict[str, np.ndarray | RaggedColumn | SparseColumn | BytesBuffer]:
    """The columns of a native ``parse_batch`` result ``(cols, err)``, or its error raised."""
    cols, err = parsed
    if err is not None and err[0] == "crc":
        ri = err[2]
        if err[-1] == "truncated data":
            raise CorruptRecordError("truncated data", None, int(offsets[ri]) - 12, ri, TRUNCATED_WHILE_READ)
        raise CorruptRecordError("data crc", None, int(offsets[ri]) - 12, ri)
    if err is not None:
        _raise(err, cs)
    out: dict[str, Any] = {}
    by_name = dict(zip(cs.names, cols))
    for name, s in cs.spec.items():
        col = by_name[name]
        if isinstance(s, FixedLen):
            if s.dtype == BYTES and as_buffer:
                out[name] = BytesBuffer(*col)
            else:
                out[name] = col.reshape((n, *s.shape))
        elif isinstance(s, FixedLenSequence):
            values, splits = col
            if isinstance(values, tuple):
                values = BytesBuffer(*values).to_numpy()
            padded = pad_rows(values, splits, s, name)[0]
            out[name] = _buffer_of(padded) if s.dtype == BYTES and as_buffer else padded
        elif isinstance(s, VarLen):
            values, splits = col
            out[name] = RaggedColumn(BytesBuffer(*values) if isinstance(values, tuple) else values, splits)
        else:
            values, splits, idx = col
            out[name] = _sparse_column(s, n, values, splits, idx, as_buffer)
    return out


class ParsePool:
    """Example batches parsed on ``threads`` native threads that never take the GIL, results
    taken in submission order: :meth:`submit` hands a batch over (what
    :func:`parse_example_batch` takes), :meth:`take` returns the oldest batch's columns, or
    raises its error, exactly as :func:`parse_example_batch` would. The values' Python
    objects are made by the thread that takes, which keeps the GIL while the pool parses
    the batches behind: no batch hands the GIL between threads. One consumer thread; not
    across ``fork``. Needs the C core (:func:`parse_pool_available`)."""

    def __init__(self, threads: int) -> None:
        if _ext is None or not hasattr(_ext, "ParsePool"):
            raise RuntimeError(f"ParsePool needs the C core: {_WHY_NOT or 'this build has no ParsePool'}")
        self._pool = _ext.ParsePool(int(threads))
        self._meta: collections.deque[tuple[CompiledSpec, int, Any, bool]] = collections.deque()
        self.take_s = 0.0  # time take() spent in the pool: waiting for a parse, or parsing

    def submit(self, records: Any, spec: Mapping[str, FeatureSpec] | CompiledSpec, *, bytes_as: str = "object",
               crcs: np.ndarray | None = None) -> None:
        """Queue ``records`` (a FrameChunk's triple, a ``(buffer, offsets, lengths)`` triple,
        or a sequence of records) for parsing. Bad arguments raise here, as
        :func:`parse_example_batch` raises them."""
        cs, triple, as_buffer, crcs = _checked(records, spec, bytes_as, crcs)
        args, n, offsets = _native_args(records, cs, triple, as_buffer, crcs)
        self._pool.submit(*args)
        self._meta.append((cs, n, offsets, as_buffer))

    def take(self) -> dict[str, Any]:
        """The oldest submitted batch's columns (waits for its parse); its error raised."""
        if not self._meta:
            raise IndexError("take: no batch was submitted")
        cs, n, offsets, as_buffer = self._meta.popleft()
        t = time.perf_counter()
        try:
            raw = self._pool.take()
        finally:
            self.take_s += time.perf_counter() - t
        return _native_columns(raw, cs, n, offsets, as_buffer)

    @property
    def busy(self) -> tuple[float, float]:
        """Seconds spent parsing, summed over the pool's threads and :meth:`take`'s caller,
        and of them the caller's (a batch no pool thread had started when it was taken)."""
        return self._pool.busy

    @property
    def pending(self) -> int:
        """Batches submitted and not taken yet."""
        return len(self._meta)

    def close(self) -> None:
        """Join the threads (a batch being parsed is finished first); drop batches not taken.
        Idempotent."""
        self._pool.close()
        self._meta.clear()


def parse_pool_available() -> bool:
    """Whether :class:`ParsePool` can run here (the C core is built, with it), and is not
    turned off by ``SHARDFEED_PARSE_POOL=0`` (then parse threads are Python threads)."""
    if _ext is None or not hasattr(_ext, "ParsePool"):
        return False
    return os.environ.get("SHARDFEED_PARSE_POOL", "1").strip().lower() not in ("0", "false", "no", "off")


def _records_of(triple: tuple) -> list[bytes]:
    buf, offsets, lengths = triple
    pairs = zip(np.asarray(offsets).tolist(), np.asarray(lengths).tolist())
    if isinstance(buf, Buffers):
        return [buf.record(k, o, n) for k, (o, n) in enumerate(pairs)]
    mv = memoryview(buf).cast("B")
    return [bytes(mv[o:o + n]) for o, n in pairs]


def _check_crcs_py(records: tuple, crcs: np.ndarray) -> None:
    for k, rec in enumerate(_records_of(records)):
        if _crc.masked_crc32c(rec) != int(crcs[k]):
            raise CorruptRecordError("data crc", None, int(records[1][k]) - 12, k)


def _buffer_of(values: np.ndarray) -> BytesBuffer:
    """A bytes array's values, in C order, as a :class:`BytesBuffer`."""
    vals = [bytes(v) for v in np.ravel(values)]
    offs = np.zeros(len(vals) + 1, np.int64)
    np.cumsum([len(v) for v in vals], out=offs[1:])
    return BytesBuffer(np.frombuffer(b"".join(vals), np.uint8).copy(), offs)


def _parse_py(records: Any, cs: CompiledSpec, triple: bool, as_buffer: bool) -> dict[str, Any]:
    from .example import parse_example

    if triple:
        records = _records_of(records)
    out = parse_example(records, cs.spec)
    if not as_buffer:
        return out
    buffer_of = _buffer_of
    for name, s in cs.spec.items():
        if s.dtype != BYTES:
            continue
        col = out[name]
        if isinstance(col, RaggedColumn):
            out[name] = RaggedColumn(buffer_of(col.values), col.row_splits)
        elif isinstance(col, SparseColumn):
            out[name] = SparseColumn(col.indices, buffer_of(col.values), col.dense_shape)
        else:
            out[name] = buffer_of(col)
    return out


def validate_example(record: Any) -> str | None:
    """None if ``record`` is a valid serialized Example, else the DecodeError message
    (the reference decoder's). For tests and fuzzing."""
    if _ext is None:
        from .example import decode_example

        try:
            decode_example(record)
        except DecodeError as e:
            return str(e)
        return None
    return _ext.validate_example(record)


def validate_sequence_example(record: Any) -> str | None:
    """None if ``record`` is a valid serialized SequenceExample, else the DecodeError
    message (the reference decoder's). For tests and fuzzing."""
    if _ext is None:
        from .example import decode_sequence_example

        try:
            decode_sequence_example(record)
        except DecodeError as e:
            return str(e)
        return None
    return _ext.validate_sequence_example(record)


class ImageHeader(NamedTuple):
    """What :func:`image_check` read from a file's headers (see ``_native/imgcheck.h``)."""

    format: str          # "jpeg", "png", or "" (neither signature)
    width: int
    height: int
    components: int      # JPEG: frame components; PNG: channels of the colour type
    color_type: int      # PNG colour type; -1 for JPEG
    bit_depth: int
    orientation: int     # EXIF orientation, 0 when the file has none
    unusual: bool        # a file only a full decoder should judge (12-bit, lossless, arithmetic, DNL, MPO, ...)
    orientation_unsure: bool  # orientation may come from metadata the check does not read
    error: str | None    # what is wrong with the structure, or None
    error_offset: int    # where (bytes from the start)


_IMG_FORMATS = {0: "", 1: "jpeg", 2: "png"}


def image_check(data: Any) -> ImageHeader | None:
    """The native structural check of a JPEG or PNG file: a marker walk (JPEG: SOI, frame,
    tables, scans, EOI, segment lengths; PNG: signature, IHDR, every chunk's CRC-32, IEND)
    without decoding pixels, the GIL released for large files. ``None`` when the native core
    is not built (the caller then decodes)."""
    if _ext is None or not hasattr(_ext, "image_check"):
        return None
    fmt, w, h, comps, ct, depth, orient, flags, err, off = _ext.image_check(data)
    return ImageHeader(_IMG_FORMATS.get(fmt, ""), w, h, comps, ct, depth, orient, bool(flags & 0x02),
                       bool(flags & 0x04), err, off)


def jpeg_scans(data: Any, stop_after: int) -> tuple[int, int, int] | None:
    """``(scans, width, height)`` of a JPEG as a lenient decoder walks it (bytes where a
    marker should be skipped, as libjpeg does): its scans (SOS markers) counted up to
    ``stop_after + 1``, and its frame header's size (0 without one). A walk of the markers
    and the entropy-coded data, no decoding (about 4 us for 100 KB). ``None`` when the
    native core is not built."""
    if _ext is None or not hasattr(_ext, "jpeg_scans"):
        return None
    return _ext.jpeg_scans(data, stop_after)


def image_rows(paths: list, tails: list, max_sizes: list, want: str, max_pixels: int) -> tuple[Any, list] | None:
    """Rows of an image-folder conversion read, judged and framed by the native core, the
    GIL released (``_native/imgrows.h``): ``paths[i]`` the local file of row ``i`` (also its
    ``image/source_id``) or ``None``, ``tails[i]`` the encoded map entries of its label
    features, ``max_sizes[i]`` the longest side it may have as it is (0: no limit), ``want``
    ``"jpeg"`` or ``"png"``. Gives ``(frames, results)``: the TFRecord frames of the kept rows
    in row order (a pooled uint8 array), and per row the record's length, why it is discarded
    (``("empty", 0, 0)``, ``("corrupt", message, byte offset)`` or ``("bomb", width,
    height)``: ``convert.images`` words them), or ``None`` for a row the general path must
    convert. ``None`` when the core is not built."""
    if _ext is None or not hasattr(_ext, "image_rows"):
        return None
    return _ext.image_rows(paths, tails, max_sizes, 2 if want == "png" else 1, max_pixels)

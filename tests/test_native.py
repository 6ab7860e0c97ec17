"""Conformance of the native core (shardfeed._native) with the pure-Python reference.

Every case runs through the reference (``example.parse_example``, ``crc``, ``TFRecordReader``)
and the native path, and the results must be identical: values (float bits included),
dtypes, shapes, and for errors the type, the message, the feature and the record index.
Hand-built odd encodings and hostile bytes included; fuzzer finds are at the end.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
import sys
import threading
import time

import numpy as np
import pytest

from shardfeed.errors import DecodeError, ParseError
from shardfeed.formats import crc as pycrc
from shardfeed.formats import example as ex
from shardfeed.formats import native as nv
from shardfeed.formats.spec import FixedLen, RaggedColumn, Sparse, SparseColumn, VarLen
from shardfeed.formats.tfrecord import TFRecordReader, frame
from shardfeed.formats.wire import encode_varint

needs_native = pytest.mark.skipif(not nv.native_available(), reason=f"native extension not built: {nv.native_info()}")


# ----------------------------------------------------------------------------- helpers


def tag(field: int, wt: int) -> bytes:
    return encode_varint(field << 3 | wt)


def ld(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + encode_varint(len(payload)) + payload


def vi(field: int, value: int) -> bytes:
    return tag(field, 0) + encode_varint(value)


def f32(field: int, value: float | bytes) -> bytes:
    return tag(field, 5) + (value if isinstance(value, bytes) else struct.pack("<f", value))


def entry(key: bytes, feature: bytes) -> bytes:
    return ld(1, ld(1, key) + ld(2, feature))


def example(*entries: bytes) -> bytes:
    return ld(1, b"".join(entries))


def int_list(*vals: int) -> bytes:
    return ld(3, ld(1, b"".join(encode_varint(v & (2**64 - 1)) for v in vals)))


def float_list(*vals: float) -> bytes:
    return ld(2, ld(1, struct.pack(f"<{len(vals)}f", *vals)))


def bytes_list(*vals: bytes) -> bytes:
    return ld(1, b"".join(ld(1, v) for v in vals))


def _same_values(a, b) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype == object:
            assert all(type(x) is bytes and type(y) is bytes and x == y for x, y in zip(a.ravel(), b.ravel()))
        elif a.dtype == np.float32:
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))  # NaN payloads too
        else:
            assert np.array_equal(a, b)
        assert b.flags.writeable
    elif isinstance(a, RaggedColumn):
        _same_values(a.values, b.values)
        _same_values(a.row_splits, b.row_splits)
    elif isinstance(a, SparseColumn):
        _same_values(a.indices, b.indices)
        _same_values(a.values, b.values)
        _same_values(a.dense_shape, b.dense_shape)
    else:
        raise AssertionError(f"unexpected column type {type(a)}")


def _outcome(fn):
    try:
        return "ok", fn()
    except (DecodeError, ParseError, TypeError, ValueError) as e:
        return "err", (type(e), str(e), getattr(e, "feature", None), getattr(e, "record_index", None))


def check_same(records, spec, *, triple: bool = True, buffer: bool = True):
    """Reference vs native (list input; and the (buffer, offsets, lengths) form; and
    bytes_as="buffer"), all identical. Returns the reference outcome."""
    ref = _outcome(lambda: ex.parse_example(records, spec))
    nat = _outcome(lambda: nv.parse_example_batch(records, spec))
    assert ref[0] == nat[0], (ref, nat)
    if ref[0] == "err":
        assert ref[1] == nat[1]
    else:
        assert list(ref[1]) == list(nat[1])
        for k in ref[1]:
            _same_values(ref[1][k], nat[1][k])
    if triple and isinstance(records, list) and all(isinstance(r, bytes) for r in records):
        buf = b"".join(records)
        lens = np.array([len(r) for r in records], np.int64)
        offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) if len(records) else lens
        tri = _outcome(lambda: nv.parse_example_batch((buf, offs, lens), spec))
        assert tri[0] == ref[0], (ref, tri)
        if ref[0] == "err":
            assert tri[1] == ref[1]
        else:
            for k in ref[1]:
                _same_values(ref[1][k], tri[1][k])
    if buffer and ref[0] == "ok":
        got = nv.parse_example_batch(records, spec, bytes_as="buffer")
        for k, col in ref[1].items():
            _same_buffer(col, got[k])
    return ref


def _same_buffer(ref_col, got) -> None:
    if isinstance(ref_col, np.ndarray):
        if ref_col.dtype != object:
            _same_values(ref_col, got)
            return
        assert isinstance(got, nv.BytesBuffer)
        assert got.data.dtype == np.uint8 and got.offsets.dtype == np.int64
        assert got.to_list() == list(ref_col.ravel())
    elif isinstance(ref_col, RaggedColumn):
        _same_values(ref_col.row_splits, got.row_splits)
        _same_buffer(ref_col.values, got.values)
    else:
        _same_values(ref_col.indices, got.indices)
        _same_values(ref_col.dense_shape, got.dense_shape)
        _same_buffer(ref_col.values, got.values)


def ctr_record(rng: random.Random) -> bytes:
    f = {"label": rng.randrange(2)}
    for k in range(13):
        f[f"I{k}"] = [rng.random() * 100]
    for k in range(26):
        f[f"C{k}"] = [rng.randbytes(4).hex().encode()]
    f["ids"] = [rng.randrange(-(2**63), 2**63) for _ in range(rng.randrange(0, 20))]
    return ex.encode_example(f)


CTR_SPEC = {
    "label": FixedLen("int64"),
    **{f"I{k}": FixedLen("float32") for k in range(13)},
    **{f"C{k}": FixedLen("bytes") for k in range(26)},
    "ids": VarLen("int64"),
}


# ----------------------------------------------------------------------------- info, CRC


def test_native_info_names_the_path():
    info = nv.native_info()
    if nv.native_available():
        assert info.startswith("native (") and info.endswith(" crc)")
    else:
        assert info.startswith("pure-python: ")


@needs_native
@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 1000, 8192 * 3, 8192 * 3 + 13, 100_000])
def test_crc32c_matches_reference(length):
    rng = random.Random(length)
    data = rng.randbytes(length + 7)
    for off in (0, 1, 3, 7):
        buf = data[off:off + length]
        assert nv.crc32c(buf) == pycrc.crc32c(buf)
        assert nv.masked_crc32c(buf) == pycrc.masked_crc32c(buf)
        cut = length // 3
        assert nv.crc32c(buf[cut:], nv.crc32c(buf[:cut])) == pycrc.crc32c(buf)
    assert nv.crc32c(memoryview(bytearray(data))) == pycrc.crc32c(data)


@needs_native
def test_crc32c_known_value_and_bad_seed():
    assert nv.crc32c(b"123456789") == 0xE3069283
    with pytest.raises(ValueError):
        nv.crc32c(b"x", 1 << 32)


# ----------------------------------------------------------------------------- framing


def _frames_file(records: list[bytes]) -> bytes:
    return b"".join(frame(r) for r in records)


def _read_all(tmp_path, data: bytes, name: str = "f.tfrecord"):
    p = tmp_path / name
    p.write_bytes(data)
    return list(TFRecordReader(str(p), compression=None))


@needs_native
def test_scan_frames_matches_reader(tmp_path):
    rng = random.Random(1)
    records = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(200)]
    data = _frames_file(records)
    offsets, lengths, consumed, error = nv.scan_frames(data)
    assert error is None and consumed == len(data)
    assert offsets.dtype == np.int64 and lengths.dtype == np.int64
    got = [data[o:o + n] for o, n in zip(offsets, lengths)]
    assert got == _read_all(tmp_path, data) == records
    # the pure-Python twin agrees
    po, pl, pc, pe = nv._scan_frames_py(data, True, 2**31 - 1)
    assert np.array_equal(po, offsets) and np.array_equal(pl, lengths) and pc == consumed and pe is None


@needs_native
def test_scan_frames_accepts_any_buffer(tmp_path):
    records = [b"a" * 10, b"", b"xyz"]
    data = _frames_file(records)
    p = tmp_path / "m.tfrecord"
    p.write_bytes(data)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        o, n, c, e = nv.scan_frames(m)
        assert [m[a:a + b] for a, b in zip(o, n)] == records and c == len(data) and e is None
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        o, n, c, e = nv.scan_frames(buf)
        assert list(n) == [10, 0, 3] and c == len(data)


@needs_native
def test_scan_frames_stops_at_incomplete_frame_for_refill():
    records = [bytes([i]) * (100 + i) for i in range(20)]
    data = _frames_file(records)
    for cut in (0, 5, 11, 12, 13, 100, 115, 116, len(data) - 1):
        o, n, consumed, err = nv.scan_frames(data[:cut])
        assert err is None
        assert consumed <= cut
        assert [data[a:a + b] for a, b in zip(o, n)] == records[: len(o)]
        # refill: scanning the rest from `consumed` gives the remaining records
        o2, n2, c2, e2 = nv.scan_frames(data[consumed:])
        assert e2 is None and consumed + c2 == len(data)
        assert len(o) + len(o2) == len(records)


@needs_native
@pytest.mark.parametrize("where", ["length crc", "data crc"])
def test_scan_frames_reports_corrupt_frame_like_reader(tmp_path, where):
    records = [b"r%d" % i * 30 for i in range(5)]
    data = bytearray(_frames_file(records))
    start = len(frame(records[0])) * 2  # the third frame
    data[start + (9 if where == "length crc" else 20)] ^= 0x40
    data = bytes(data)
    o, n, consumed, err = nv.scan_frames(data)
    assert err == (where, start) and consumed == start and len(o) == 2
    with pytest.raises(Exception) as info:
        _read_all(tmp_path, data)
    assert info.value.check == where and info.value.offset == start
    assert nv._scan_frames_py(data, True, 2**31 - 1)[3] == err
    # verify_crc=False skips both checks (a flipped length-crc byte leaves the length intact)
    o, n, consumed, err = nv.scan_frames(data, verify_crc=False)
    assert err is None and len(o) == 5


@needs_native
def test_scan_frames_absurd_length():
    from shardfeed.formats.crc import masked_length_crc

    good = frame(b"hello")
    bad = struct.pack("<QI", 1 << 40, masked_length_crc(1 << 40)) + b"x" * 100
    o, n, c, e = nv.scan_frames(good + bad)
    assert list(n) == [5] and e == ("absurd length", len(good)) and c == len(good)
    o, n, c, e = nv.scan_frames(good + frame(b"y" * 100), max_record_bytes=50)
    assert e == ("absurd length", len(good))
    assert nv._scan_frames_py(good + bad, True, 2**31 - 1)[3] == e[:1] + (len(good),)


@needs_native
def test_scan_frames_hostile_bytes_never_crash():
    rng = random.Random(5)
    base = _frames_file([rng.randbytes(rng.randrange(0, 50)) for _ in range(10)])
    for i in range(2000):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[: rng.randrange(len(data) + 1)])
        verify = bool(i % 2)
        o, n, c, e = nv.scan_frames(data, verify_crc=verify)
        po, pl, pc, pe = nv._scan_frames_py(data, verify, 2**31 - 1)
        assert np.array_equal(o, po) and np.array_equal(n, pl) and c == pc and e == pe


# ----------------------------------------------------------------------------- parsing: specs


@needs_native
def test_ctr_batch_identical():
    rng = random.Random(7)
    records = [ctr_record(rng) for _ in range(300)]
    check_same(records, CTR_SPEC)


@needs_native
@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 3), (0,), (2, 0)])
@pytest.mark.parametrize("dtype", ["int64", "float32", "bytes"])
def test_fixedlen_shapes(shape, dtype):
    size = int(np.prod(shape)) if shape else 1
    vals = {"int64": list(range(-3, size - 3)), "float32": [i * 0.5 for i in range(size)],
            "bytes": [b"v%d" % i for i in range(size)]}[dtype]
    arr = np.array(vals, dtype=object if dtype == "bytes" else dtype)
    rec = ex.encode_example({"f": arr})
    check_same([rec, rec], {"f": FixedLen(dtype, shape)})
    # wrong count, missing, missing with default (scalar and full)
    check_same([rec, ex.encode_example({"f": np.array(vals[:-1] if vals else [0], dtype=arr.dtype)})],
               {"f": FixedLen(dtype, shape)})
    other = ex.encode_example({"g": 1})
    check_same([rec, other], {"f": FixedLen(dtype, shape)})
    scalar = {"int64": 9, "float32": 2.5, "bytes": b"dflt"}[dtype]
    check_same([other, rec, other], {"f": FixedLen(dtype, shape, default=scalar)})
    check_same([other, rec], {"f": FixedLen(dtype, shape, default=vals)})


@needs_native
@pytest.mark.parametrize("dtype", ["int64", "float32", "bytes"])
def test_varlen_every_dtype(dtype):
    rng = random.Random(dtype)
    recs = []
    for i in range(30):
        k = rng.randrange(0, 6)
        if dtype == "int64":
            v = np.array([rng.randrange(-(2**63), 2**63) for _ in range(k)], np.int64)
        elif dtype == "float32":
            v = np.array([rng.uniform(-1e30, 1e30) for _ in range(k)], np.float32)
        else:
            v = np.array([rng.randbytes(rng.randrange(0, 9)) for _ in range(k)], object)
        recs.append(ex.encode_example({"v": v} if i % 7 else {"other": [1]}))
    check_same(recs, {"v": VarLen(dtype)})
    check_same([], {"v": VarLen(dtype)})


@needs_native
def test_kind_mismatch_is_parse_error_even_when_empty():
    rec = ex.encode_example({"a": np.zeros(0, np.float32)})
    for s in (FixedLen("int64"), FixedLen("int64", default=1), VarLen("int64"), VarLen("bytes")):
        out = check_same([ex.encode_example({"a": 1.0}), rec], {"a": s})
        assert out[0] == "err" and out[1][0] is ParseError and out[1][3] == 0


@needs_native
def test_sparse_features():
    recs = [
        ex.encode_example({"v": [1.0, 2.0, 3.0], "i": [5, 1, 5], "j": [2, 0, 1]}),
        ex.encode_example({"x": 1}),
        ex.encode_example({"v": [4.0], "i": [0], "j": [3]}),
    ]
    for already_sorted in (False, True):
        check_same(recs, {"sp": Sparse("i", "v", "float32", 10, already_sorted)})
        check_same(recs, {"sp": Sparse(["i", "j"], "v", "float32", [10, 4], already_sorted)})
    brecs = [ex.encode_example({"v": [b"a", b"bb"], "i": [3, 1]}), ex.encode_example({"v": [b"c"], "i": [2]})]
    check_same(brecs, {"sp": Sparse("i", "v", "bytes", 4), "v": VarLen("bytes"), "i": FixedLen("int64", [2], default=0)})
    # errors: length mismatch, out of range (both ends), wrong kinds
    check_same([recs[0], ex.encode_example({"v": [1.0], "i": [1, 2]})], {"sp": Sparse("i", "v", "float32", 10)})
    check_same([ex.encode_example({"v": [1.0], "i": [10]})], {"sp": Sparse("i", "v", "float32", 10)})
    check_same([ex.encode_example({"v": [1.0], "i": [-1]})], {"sp": Sparse("i", "v", "float32", 10)})
    check_same([ex.encode_example({"v": [1], "i": [1]})], {"sp": Sparse("i", "v", "float32", 10)})
    check_same([ex.encode_example({"v": [1.0], "i": [1.0]})], {"sp": Sparse("i", "v", "float32", 10)})
    check_same([ex.encode_example({"v": [1.0], "i": [1], "j": [9]})], {"sp": Sparse(["i", "j"], "v", "float32", [2, 4])})


@needs_native
def test_error_order_fixed_then_varlen_then_sparse_then_next_record():
    spec = {"s": Sparse("i", "v", "int64", 3), "r": VarLen("int64"), "f": FixedLen("int64")}
    bad_all = ex.encode_example({"v": [1], "i": [7], "r": [1.0], "f": [1, 2]})
    out = check_same([bad_all], spec)
    assert out[1][2] == "f"
    out = check_same([ex.encode_example({"v": [1], "i": [7], "r": [1.0], "f": 1})], spec)
    assert out[1][2] == "r"
    # a decode error in record 1 comes after a parse error in record 0
    out = check_same([ex.encode_example({"f": 1.0}), b"\x0a\x05"], spec)
    assert out[1][0] is ParseError and out[1][3] == 0
    out = check_same([ex.encode_example({"f": 1, "r": [1], "v": [1], "i": [0]}), b"\x0a\x05"], spec)
    assert out[1][0] is DecodeError and out[1][3] == 1


@needs_native
def test_same_key_in_several_columns_and_unencodable_name():
    recs = [ex.encode_example({"a": [1, 2], "b": [b"x"]})]
    check_same(recs, {"a": FixedLen("int64", [2]), "a2": VarLen("int64"), "b": VarLen("bytes"),
                      "s": Sparse("a", "a", "int64", 5)})
    check_same(recs, {"\ud800": FixedLen("int64", default=3), "\ud800x": VarLen("float32")})
    check_same([ex.encode_example({"": [1]})], {"": FixedLen("int64")})


@needs_native
def test_sparse_index_key_does_not_fill_the_first_fixedlen_column():
    # an index key read by nothing else once counted as an eager key of column 0
    spec = {"f": FixedLen("int64"), "s": Sparse("i", "v", "int64", 3), "g": FixedLen("float32")}
    out = check_same([ex.encode_example({"f": 2, "v": [1], "i": [0], "g": 1.5}),
                      ex.encode_example({"i": [2], "v": [5], "g": 0.5, "f": 7})], spec)
    assert out[1]["f"].tolist() == [2, 7]


# ----------------------------------------------------------------------------- parsing: the repeated layout
# Each record's keys are first compared with the key at the same position in the previous
# record, and a FixedLen feature's values go straight to its row: records that break the
# previous record's layout must still parse as the reference says.

LAYOUT_SPEC = {"label": FixedLen("int64"), "x": FixedLen("float32", [2]), "c": FixedLen("bytes"),
               "cc": FixedLen("bytes", [2]), "ids": VarLen("int64"), "long_key_name_over_8": FixedLen("bytes")}


def _layout_record(i: int, order=None, **extra) -> bytes:
    f = {"label": i, "x": [float(i), -float(i)], "c": [b"c%d" % i], "cc": [b"a", b"b" * i], "ids": list(range(i % 4)),
         "long_key_name_over_8": [b"L%d" % i]}
    f.update(extra)
    keys = order or list(f)
    return example(*(ex_entry(k, f[k]) for k in keys))


def ex_entry(key: str, vals) -> bytes:
    one = ex.encode_example({key: vals})  # Example{features{feature{key: ...}}}: its one entry
    return one[2:] if one[1] < 0x80 else one[3:]


@needs_native
def test_records_whose_key_order_changes_from_the_previous_one():
    keys = list(LAYOUT_SPEC)
    recs = [_layout_record(i) for i in range(3)]
    recs.append(_layout_record(3, order=keys[::-1]))  # reversed
    recs.append(_layout_record(4, order=keys[1:] + keys[:1]))  # rotated
    recs.append(_layout_record(5))
    recs.append(_layout_record(6, order=["x", "label", "zz", "c", "cc", "ids", "long_key_name_over_8"], zz=[1]))
    out = check_same(recs, LAYOUT_SPEC)
    assert out[1]["label"].tolist() == list(range(7))


@needs_native
def test_key_matching_the_previous_records_key_by_prefix_only():
    recs = [_layout_record(0)]
    # same position, same first bytes, other lengths or one byte off: not the predicted key
    for key in ("labe", "labelx", "label\x00", "lab\x00l", "long_key_name_over_", "long_key_name_over_9",
                "long_key_name_over_8x", "C", "c\x00", "cc\x00", "ccc"):
        r = example(ex_entry(key, [1]), *(ex_entry(k, v) for k, v in [("label", 9), ("x", [1.0, 2.0]), ("c", [b"c"]),
                                                                      ("cc", [b"1", b"2"]),
                                                                      ("long_key_name_over_8", [b"z"])]))
        recs.append(r)
        recs.append(_layout_record(1))
    out = check_same(recs, LAYOUT_SPEC)
    assert out[1]["label"].tolist()[:3] == [0, 9, 1]


@needs_native
def test_repeated_key_after_a_fitting_entry_replaces_it():
    base = [("x", [1.0, 2.0]), ("c", [b"c"]), ("cc", [b"1", b"2"]), ("long_key_name_over_8", [b"z"])]
    good = [_layout_record(0)]
    for again in (("label", 5), ("c", [b"second"]), ("cc", [b"p", b"q"]), ("x", [3.0, 4.0])):
        r = example(ex_entry("label", 1), *(ex_entry(k, v) for k, v in base), ex_entry(*again))
        out = check_same(good + [r], LAYOUT_SPEC)
        assert out[0] == "ok"
    # a later entry of the same key that does not fit: the error the reference gives
    for again in (("label", [5, 6]), ("c", [b"a", b"b"]), ("cc", [b"p"]), ("x", [3.0]), ("c", [1]), ("x", []),
                  ("cc", [b"a", b"b", b"c"]), ("label", [1.0]), ("c", [])):
        r = example(ex_entry("label", 1), *(ex_entry(k, v) for k, v in base), ex_entry(*again))
        assert check_same(good + [r], LAYOUT_SPEC)[0] == "err"
    # one that does not fit, then one that does: the last one wins
    r = example(ex_entry("label", 1), *(ex_entry(k, v) for k, v in base), ex_entry("cc", [b"p"]),
                ex_entry("cc", [b"x", b"y"]), ex_entry("c", [b"a", b"b"]), ex_entry("c", [b"last"]))
    out = check_same(good + [r], LAYOUT_SPEC)
    assert out[1]["cc"][1].tolist() == [b"x", b"y"] and out[1]["c"][1] == b"last"


@needs_native
def test_fixedlen_of_zero_values_and_empty_lists_in_the_fast_path():
    spec = {"e": FixedLen("bytes", [0]), "n": FixedLen("int64", [0]), "f": FixedLen("float32", [0]),
            "label": FixedLen("int64")}
    recs = [example(ex_entry("e", []), ex_entry("n", []), ex_entry("f", []), ex_entry("label", i)) for i in range(3)]
    check_same(recs, spec)
    recs.append(example(ex_entry("e", [b"x"]), ex_entry("label", 1)))
    assert check_same(recs, spec)[0] == "err"


@needs_native
def test_entry_with_the_previous_records_header_but_other_varints():
    # same bytes up to the packed payload as the entry before it (the template), other contents
    pad = entry(b"pad", bytes_list(b"p" * 40))  # the window of the header compare stays inside
    spec = {"label": FixedLen("int64"), "x": FixedLen("float32")}
    first = example(entry(b"label", int_list(300)), entry(b"zz", int_list(300)), entry(b"x", float_list(1.0)), pad)
    # label [1, 2]: two values where the template saw one
    out = check_same([first, example(entry(b"label", int_list(1, 2)), entry(b"zz", int_list(300)),
                                     entry(b"x", float_list(2.0)), pad)], spec)
    assert out[0] == "err" and out[1][0] is ParseError and out[1][2] == "label" and out[1][3] == 1
    # an ignored key's payload no longer valid varints (truncated; 11 bytes)
    for bad in (b"\x80\x80", b"\xff" * 10 + b"\x01"):
        r = example(entry(b"label", int_list(5)), entry(b"zz", ld(3, ld(1, bad))), entry(b"x", float_list(1.0)), pad)
        base = example(entry(b"label", int_list(5)), entry(b"zz", ld(3, ld(1, b"\x01" * len(bad)))),
                       entry(b"x", float_list(1.0)), pad)
        out = check_same([base, base, r], spec)
        assert out[0] == "err" and out[1][0] is DecodeError and out[1][3] == 2
    # the label's payload: three varints, then one three-byte varint; other floats
    recs = [example(entry(b"label", ld(3, ld(1, v))), entry(b"x", float_list(f)), pad)
            for v, f in ((b"\x01\x02\x03", 1.0), (b"\x81\x82\x03", float("nan")), (b"\x01\x02\x03", -0.0))]
    out = check_same(recs, {"label": FixedLen("int64", [3]), "x": FixedLen("float32")})
    assert out[0] == "err" and out[1][3] == 1
    out = check_same([recs[0], recs[2]], {"label": FixedLen("int64", [3]), "x": FixedLen("float32")})
    assert out[1]["label"].tolist() == [[1, 2, 3], [1, 2, 3]]


@needs_native
def test_entry_like_the_previous_one_near_the_end_of_its_record():
    spec = {"a": FixedLen("bytes"), "b": FixedLen("float32")}
    recs = [example(entry(b"a", bytes_list(b"v%d" % i)), entry(b"b", float_list(i)), *(
        [entry(b"pad", bytes_list(b"p" * (40 - 4 * i)))] if i < 10 else [])) for i in range(12)]
    recs.append(example(entry(b"a", bytes_list(b"v1")), entry(b"b", float_list(1.0)))[:-3])  # cut short
    out = check_same(recs, spec)
    assert out[0] == "err" and out[1][0] is DecodeError and out[1][3] == 12
    assert check_same(recs[:-1], spec)[1]["a"].tolist() == [b"v%d" % i for i in range(12)]


@needs_native
def test_bytes_values_of_every_length_are_ordinary_bytes_objects():
    lengths = [0, 1, 2, 7, 8, 9, 15, 16, 17, 100, 5000]
    recs = [ex.encode_example({"v": [bytes(range(k % 7, k % 7 + 1)) * n for k, n in enumerate(lengths)],
                               "c": [b"%d" % n * n]}) for n in lengths]
    spec = {"v": FixedLen("bytes", [len(lengths)]), "c": FixedLen("bytes")}
    out = nv.parse_example_batch(recs, spec)
    ref = ex.parse_example(recs, spec)
    for name in spec:
        for got, want in zip(out[name].ravel(), ref[name].ravel()):
            assert type(got) is bytes and got == want and len(got) == len(want)
            assert hash(got) == hash(bytes(want)) and got.decode("latin-1").encode("latin-1") == want
            assert got + b"" == want and got[:1] == want[:1] and got[-1:] == want[-1:]
    assert out["v"][0, 0] == b"" and out["v"][0, 1] == bytes([1])


# ----------------------------------------------------------------------------- parsing: odd encodings


ODD = {
    "unpacked ints": example(entry(b"a", ld(3, vi(1, 5) + vi(1, 2**64 - 1) + vi(1, 7)))),
    "unpacked floats": example(entry(b"b", ld(2, f32(1, 1.5) + f32(1, -2.0)))),
    "signaling nan unpacked": example(entry(b"b", ld(2, f32(1, b"\x01\x00\x80\x7f") + f32(1, b"\x01\x00\x80\xff")))),
    "signaling nan packed": example(entry(b"b", ld(2, ld(1, b"\x01\x00\x80\x7f" + b"\x00\x00\xc0\x7f")))),
    "packed in chunks": example(entry(b"a", ld(3, ld(1, b"\x01\x02") + ld(1, b"") + ld(1, b"\x03") + vi(1, 4)))),
    "float chunks mixed": example(entry(b"b", ld(2, ld(1, struct.pack("<f", 1.0)) + f32(1, 2.0) + ld(1, struct.pack("<2f", 3, 4))))),
    "value before key": example(ld(1, ld(2, int_list(42)) + ld(1, b"a"))),
    "missing key": example(ld(1, ld(2, int_list(1)))),
    "missing value": example(ld(1, ld(1, b"a"))),
    "key twice": example(ld(1, ld(1, b"zz") + ld(2, int_list(3)) + ld(1, b"a"))),
    "value twice merges": example(ld(1, ld(1, b"a") + ld(2, int_list(1, 2)) + ld(2, int_list(3)))),
    "value twice switches kind": example(ld(1, ld(1, b"a") + ld(2, int_list(1, 2)) + ld(2, float_list(3.0)))),
    "oneof int bytes int": example(entry(b"a", int_list(1) + bytes_list(b"x") + int_list(9, 8))),
    "oneof same kind merges": example(entry(b"a", int_list(1) + int_list(2))),
    "duplicate entries last wins": example(entry(b"a", int_list(1)), entry(b"b", float_list(1)), entry(b"a", int_list(2))),
    "duplicate entry empty feature": example(entry(b"a", int_list(1)), entry(b"a", b"")),
    "features twice merge": example(entry(b"a", int_list(1))) + example(entry(b"b", float_list(2.0))),
    "empty lists": example(entry(b"a", ld(3, b"")), entry(b"b", ld(2, b"")), entry(b"c", ld(1, b""))),
    "empty example": b"",
    "empty features": ld(1, b""),
    "unknown fields everywhere": (
        vi(2, 5) + f32(3, 1.0) + tag(4, 1) + b"\0" * 8 + ld(5, b"junk") + tag(6, 3) + vi(1, 1) + tag(6, 4)
        + ld(1, vi(2, 1) + ld(1, vi(3, 1) + ld(1, b"a") + tag(7, 3) + tag(8, 3) + tag(8, 4) + tag(7, 4)
                                  + ld(2, vi(4, 1) + ld(3, vi(2, 9) + ld(1, b"\x05") + f32(3, 1.0) + ld(9, b"")) + f32(5, 0.0))))
    ),
    "known field wrong wire type": example(entry(b"a", tag(3, 0) + b"\x05" + int_list(4) + tag(2, 5) + b"\0\0\0\0"))
    + tag(1, 0) + b"\x01",
    "list value wrong wire type": example(entry(b"a", ld(3, f32(1, 1.0) + vi(1, 3))), entry(b"b", ld(2, vi(1, 3) + f32(1, 1.0)))),
    "bytes list with varint value": example(entry(b"c", ld(1, vi(1, 3) + ld(1, b"q")))),
    "over-long tags": example(ld(1, b"\x8a\x80\x80\x80\x00" + encode_varint(1) + b"a" + b"\x92\x80\x00" + encode_varint(len(int_list(5))) + int_list(5))),
    "ten byte varint": example(entry(b"a", ld(3, vi(1, 1) + tag(1, 0) + b"\xff" * 9 + b"\x7f"))),
    "ten byte packed varint": example(entry(b"a", ld(3, ld(1, b"\x80" * 9 + b"\x03" + b"\x05")))),
    "nested groups": example(entry(b"a", int_list(1))) + tag(9, 3) * 50 + tag(9, 4) * 50,
    "field zero inside group": tag(9, 3) + b"\x00\x05" + b"\x03" + b"\x04" + tag(9, 4) + example(entry(b"a", int_list(1))),
    "big key": example(entry(b"k" * 300, int_list(1)), entry(b"a", int_list(2))),
    "long list": example(entry(b"a", int_list(*range(-500, 500))), entry(b"c", bytes_list(*[b"%d" % i for i in range(300)]))),
    "non-ascii key": example(entry("ключ".encode(), int_list(1)), entry(b"a", int_list(1))),
}
ODD_SPECS = [
    {"a": VarLen("int64"), "b": VarLen("float32"), "c": VarLen("bytes"), "": VarLen("int64")},
    {"a": FixedLen("int64", default=0), "b": FixedLen("float32", [2], default=0.0)},
    {"zz": VarLen("int64"), "ключ": VarLen("int64")},
]


@needs_native
@pytest.mark.parametrize("name", list(ODD))
def test_odd_encodings(name):
    rec = ODD[name]
    ex.decode_example(rec)  # valid for the reference
    for spec in ODD_SPECS:
        check_same([rec, rec], spec)
    assert nv.validate_example(rec) is None


# ----------------------------------------------------------------------------- parsing: hostile bytes


HOSTILE = {
    "truncated tag": b"\x8a",
    "tag too long": b"\x8a\x80\x80\x80\x80\x00",
    "tag over 32 bits": b"\xfa\xff\xff\xff\x7f",
    "field zero": b"\x02\x00",
    "wire type 6": b"\x0e",
    "wire type 7 inside": example(ld(1, b"\x0f")),
    "length past end": b"\x0a\x05abc",
    "huge length": b"\x0a" + encode_varint(2**63) + b"x",
    "length over 2GiB": b"\x0a" + encode_varint(2**31) + b"x",
    "varint too long": b"\x08" + b"\xff" * 10 + b"\x01",
    "truncated varint": b"\x08\xff",
    "truncated fixed32": b"\x0d\x00\x00",
    "truncated fixed64": b"\x09" + b"\0" * 7,
    "end group without start": b"\x0c",
    "end group in entry": example(ld(1, ld(1, b"a") + tag(3, 4))),
    "end group in list": example(entry(b"a", ld(3, tag(1, 4)))),
    "group never closed": tag(5, 3) + vi(1, 1),
    "group closed by other field": tag(5, 3) + tag(6, 4),
    "groups too deep": tag(5, 3) * 101 + tag(5, 4) * 101,
    "groups too deep inside list": example(entry(b"a", ld(3, tag(5, 3) * 97 + tag(5, 4) * 97))),
    "groups just deep enough inside list": example(entry(b"a", ld(3, tag(5, 3) * 96 + tag(5, 4) * 96))),
    "packed float bad length": example(entry(b"b", ld(2, ld(1, b"\0\0\0\0\0")))),
    "packed float bad length unused key": example(entry(b"zz_unused", ld(2, ld(1, b"\0\0\0")))),
    "truncated float": example(entry(b"b", ld(2, tag(1, 5) + b"\0\0"))),
    "short packed varint truncated": example(entry(b"a", ld(3, ld(1, b"\x01\x80")))),
    "long packed varint truncated": example(entry(b"a", ld(3, ld(1, b"\x01" * 9 + b"\x80\x80")))),
    "longer packed varint truncated": example(entry(b"a", ld(3, ld(1, b"\x01" * 99 + b"\x80\x80")))),
    "longer packed all continuation": example(entry(b"a", ld(3, ld(1, b"\x80" * 120)))),
    "longer packed varint too long": example(entry(b"a", ld(3, ld(1, b"\x01" * 95 + b"\x80" * 10 + b"\x01")))),
    "long packed all continuation": example(entry(b"a", ld(3, ld(1, b"\x80" * 12)))),
    "long packed varint too long": example(entry(b"a", ld(3, ld(1, b"\x01" * 5 + b"\x80" * 10 + b"\x01")))),
    "bad utf8 start": example(entry(b"\x80abc", int_list(1))),
    "bad utf8 continuation": example(entry(b"\xc3\x28", int_list(1))),
    "bad utf8 end": example(entry(b"ab\xe2\x82", int_list(1))),
    "bad utf8 surrogate": example(entry(b"\xed\xa0\x80", int_list(1))),
    "bad utf8 overlong": example(entry(b"\xe0\x80\x80", int_list(1))),
    "bad utf8 too big": example(entry(b"\xf4\x90\x80\x80", int_list(1))),
    "bad utf8 f5": example(entry(b"\xf5\x80\x80\x80", int_list(1))),
    "bad utf8 4byte end": example(entry(b"\xf0\x9f\x98", int_list(1))),
    "bad utf8 4byte cont": example(entry(b"\xf0\x9f\x28\x80", int_list(1))),
    "bad utf8 key in second key": example(ld(1, ld(1, b"a") + ld(1, b"\xff"))),
    "error in dropped duplicate": example(entry(b"a", ld(3, ld(1, b"\x80"))), entry(b"a", int_list(1))),
    "error after parse-level problem": example(entry(b"a", float_list(1.0)), entry(b"q", ld(3, ld(1, b"\xff")))),
    "features not a message": example(b"\x07"),
    "entry length past features": ld(1, b"\x0a\x09\x0a\x01a"),
}


@needs_native
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_records_same_error(name):
    rec = HOSTILE[name]
    for spec in ODD_SPECS + [CTR_SPEC]:
        check_same([ex.encode_example({"a": [1]}), rec], spec)
    try:
        ex.decode_example(rec)
        expected = None
    except DecodeError as e:
        expected = str(e)
    assert nv.validate_example(rec) == expected


@needs_native
def test_every_truncation_and_byte_flip_of_odd_records():
    rng = random.Random(11)
    spec = ODD_SPECS[0]
    pool = list(ODD.values()) + [ctr_record(rng) for _ in range(5)]
    for rec in pool:
        for cut in range(len(rec)):
            check_same([rec[:cut]], spec, triple=False, buffer=False)
    for _ in range(3000):
        rec = bytearray(rng.choice(pool))
        if not rec:
            continue
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3)
            pos = rng.randrange(len(rec))
            if op == 0:
                rec[pos] = rng.randrange(256)
            elif op == 1:
                rec.insert(pos, rng.choice([0x08, 0x0A, 0x12, 0x1A, 0x80, 0xFF, 0x0B, 0x0C, 0x0D, 0x00]))
            elif len(rec) > 1:
                del rec[pos]
        check_same([bytes(rec)], rng.choice(ODD_SPECS + [CTR_SPEC]), triple=False, buffer=False)


# ----------------------------------------------------------------------------- API forms


@needs_native
def test_record_forms_and_type_errors():
    rec = ex.encode_example({"a": [1, 2]})
    spec = {"a": VarLen("int64")}
    check_same([bytearray(rec), memoryview(rec), rec], spec)
    check_same((rec, rec), spec)
    check_same(np.array([rec, rec], dtype=object), spec)
    check_same([rec, "text", rec], spec)
    check_same([b"\x0a\x05", 5], spec)  # the earlier record's error wins
    check_same(rec, spec)
    check_same(np.array([rec, rec]), spec)


@needs_native
def test_triple_from_scan_frames_feeds_parser():
    rng = random.Random(3)
    records = [ctr_record(rng) for _ in range(100)]
    data = _frames_file(records)
    offsets, lengths, consumed, err = nv.scan_frames(data)
    got = nv.parse_example_batch((data, offsets, lengths), CTR_SPEC)
    want = ex.parse_example(records, CTR_SPEC)
    for k in want:
        _same_values(want[k], got[k])
    with pytest.raises(ValueError, match="outside the buffer"):
        nv.parse_example_batch((data, offsets + 10**9, lengths), CTR_SPEC)
    with pytest.raises(ValueError, match="outside the buffer"):
        nv.parse_example_batch((data, offsets, -lengths - 1), CTR_SPEC)
    with pytest.raises(ValueError):
        nv.parse_example_batch((data, offsets, lengths[:-1]), CTR_SPEC)


@needs_native
def test_compiled_spec_is_cached_and_follows_changes():
    spec = {"a": VarLen("int64")}
    c1 = nv.compile_spec(spec)
    assert nv.compile_spec(spec) is c1
    spec["b"] = FixedLen("int64", default=1)
    c2 = nv.compile_spec(spec)
    assert c2 is not c1 and "b" in c2.names
    assert nv.compile_spec(c2) is c2
    rec = ex.encode_example({"a": [1]})
    assert nv.parse_example_batch([rec], c2)["b"].tolist() == [1]


@needs_native
def test_bad_spec_errors_match_reference():
    rec = ex.encode_example({"a": [1]})
    for spec in ({"a": FixedLen("int64", [2], default=[1, 2, 3])}, {"a": FixedLen("int64", default="x")},
                 {"a": "notaspec"}, {"a": FixedLen("int64", default=1.5)}):
        check_same([rec], spec)


def test_pure_python_fallback_same_results(monkeypatch):
    rng = random.Random(9)
    records = [ctr_record(rng) for _ in range(20)]
    data = _frames_file(records)
    native_out = nv.parse_example_batch(records, CTR_SPEC)
    native_scan = nv.scan_frames(data)
    monkeypatch.setattr(nv, "_ext", None)
    monkeypatch.setattr(nv, "_WHY_NOT", "test")
    assert nv.native_info() == "pure-python: test"
    o, n, c, e = nv.scan_frames(data)
    assert np.array_equal(o, native_scan[0]) and c == native_scan[2] and e is None
    py = nv.parse_example_batch((data, o, n), dict(CTR_SPEC))
    for k in native_out:
        _same_values(native_out[k], py[k])
    buf = nv.parse_example_batch(records, dict(CTR_SPEC), bytes_as="buffer")
    assert buf["C0"].to_list() == list(native_out["C0"].ravel())
    assert nv.crc32c(b"123456789") == 0xE3069283


# ----------------------------------------------------------------------------- threads


@needs_native
def test_two_threads_parse_concurrently():
    rng = random.Random(4)
    batches = [[ctr_record(rng) for _ in range(400)] for _ in range(2)]
    want = [ex.parse_example(b, CTR_SPEC) for b in batches]
    compiled = nv.compile_spec(CTR_SPEC)
    results: dict[int, list] = {0: [], 1: []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(20):
                results[i].append(nv.parse_example_batch(batches[i], compiled))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(2):
        for got in results[i]:
            for k in want[i]:
                _same_values(want[i][k], got[k])


# ----------------------------------------------------------------------------- fuzzer finds
# Inputs found by fuzz/ (libFuzzer + ASan) that once crashed or disagreed; see fuzz/README.md.

# No fuzzer input crashed the native code under ASan/UBSan. Replaying the fuzzers' corpora
# through both paths found one disagreement: a 12-15 byte buffer whose header fails its
# length CRC was not checked (no room for a whole frame meant no look at the header).
FRAME_REGRESSIONS = {
    "bad length crc, buffer shorter than a frame": bytes.fromhex("29000a0a012d723200105e00c9ab"),
    "bad length crc, 12 bytes": b"\x05" + b"\0" * 7 + b"\0\0\0\0",
    "absurd length, 15 bytes": struct.pack("<QI", 1 << 40, pycrc.masked_length_crc(1 << 40)) + b"abc",
}


@needs_native
@pytest.mark.parametrize("name", list(FRAME_REGRESSIONS))
def test_frame_scan_regressions(name):
    data = FRAME_REGRESSIONS[name]
    o, n, c, e = nv.scan_frames(data)
    po, pl, pc, pe = nv._scan_frames_py(data, True, 2**31 - 1)
    assert np.array_equal(o, po) and np.array_equal(n, pl) and (c, e) == (pc, pe)
    assert e is not None and e[1] == 0


@needs_native
def test_fuzz_seed_corpus_runs():
    here = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus")
    if not os.path.isdir(here):
        pytest.skip("no fuzz corpus in this checkout")
    for name in sorted(os.listdir(os.path.join(here, "example"))):
        with open(os.path.join(here, "example", name), "rb") as f:
            data = f.read()
        recs = data[1:].split(b"\xff\xfe\xfd")
        for spec in ODD_SPECS:
            check_same(recs, spec, triple=False, buffer=False)
    for name in sorted(os.listdir(os.path.join(here, "frames"))):
        with open(os.path.join(here, "frames", name), "rb") as f:
            data = f.read()[1:]
        assert tuple(map(str, nv.scan_frames(data)[2:])) == tuple(map(str, nv._scan_frames_py(data, True, 2**31 - 1)[2:]))


@needs_native
def test_parse_releases_the_gil():
    rng = random.Random(8)
    records = [ctr_record(rng) for _ in range(200)] * 1500  # a batch that takes about 200 ms
    spec = {k: v for k, v in CTR_SPEC.items() if v.dtype != "bytes"}  # no object creation
    compiled = nv.compile_spec(spec)
    progress = [0]
    stop = threading.Event()
    spinning = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            progress[0] += 1
            spinning.set()
            time.sleep(0)  # hands the GIL over at once to a thread that waits for it

    # no forced GIL switch within a second: a parse that held the GIL would run to its end
    # and the count be read before the spinner got it back (with the default 5 ms, the
    # spinner took it between the parse's end and the read, and the check could not fail)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        # the spinner is running before the parse starts (on a loaded machine a new thread
        # may not get a core for a while), so only a GIL held through the parse stops it
        assert spinning.wait(30), "the spinning thread never ran"
        before = progress[0]
        nv.parse_example_batch(records, compiled)
        during = progress[0] - before
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(switch)
    assert during > 0  # a pure-Python thread ran while the batch was parsed


def test_gather_matches_a_python_copy_and_refuses_every_range_that_does_not_fit():
    import random

    from shardfeed.formats import native

    rng = random.Random(11)
    big = (1 << 63) - 1
    for trial in range(3000):
        src = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        dst = bytearray(rng.randrange(0, 64))
        n = rng.randrange(0, 6)
        pick = [0, 1, len(src), len(dst), -1, big, big - 3, -big - 1]

        def val(pick: list = pick) -> int:
            return rng.choice(pick) if rng.random() < 0.2 else rng.randrange(0, 40)

        d = np.array([val() for _ in range(n)], dtype=np.int64)
        s = np.array([val() for _ in range(n)], dtype=np.int64)
        ln = np.array([val() for _ in range(n)], dtype=np.int64)
        fits = all(0 <= a and 0 <= b and 0 <= k and a + k <= len(dst) and b + k <= len(src)
                   for a, b, k in zip(d.tolist(), s.tolist(), ln.tolist()))
        before = bytes(dst)
        if fits:
            want = bytearray(dst)
            for a, b, k in zip(d.tolist(), s.tolist(), ln.tolist()):
                want[a:a + k] = src[b:b + k]
            native.gather(dst, d, src, s, ln)
            assert dst == want, trial
        else:
            with pytest.raises(IndexError, match="does not fit"):
                native.gather(dst, d, src, s, ln)
            assert bytes(dst) == before  # nothing copied
    with pytest.raises(ValueError, match="one length"):
        native.gather(bytearray(4), np.zeros(2, np.int64), b"abcd", np.zeros(1, np.int64), np.zeros(2, np.int64))
    with pytest.raises(TypeError):
        native.gather(b"read-only", np.zeros(1, np.int64), b"abcd", np.zeros(1, np.int64), np.ones(1, np.int64))


# ----------------------------------------------------------------------------- recycled batch buffers


def _large_records(n: int, size: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(size + 97 * k) for k in range(n)]


@needs_native
def test_large_buffer_columns_come_from_recycled_blocks_and_hold_their_values():
    """A bytes column of a megabyte or more in the buffer form is copied into pooled memory:
    a batch whose arrays died gives its block to a later batch, while a batch the caller
    still holds keeps its own values intact."""
    from shardfeed import _native  # noqa: PLC0415

    spec = {"img": FixedLen("bytes"), "n": FixedLen("int64")}
    _native.pool_clear()
    before = _native.pool_info()
    kept = None
    for round_ in range(6):
        values = _large_records(4, 400_000, round_)
        records = [ex.encode_example({"img": [v], "n": [k]}) for k, v in enumerate(values)]
        got = nv.parse_example_batch(records, spec, bytes_as="buffer")
        col = got["img"]
        assert col.data.base is not None and col.data.flags.c_contiguous and col.data.flags.writeable
        assert col.to_list() == values
        if round_ == 0:
            kept = (col, values)  # held: its block must not be handed out again
        del got, col
    assert kept[0].to_list() == kept[1]
    blocks, held, reused, allocated = _native.pool_info()
    assert reused - before[2] >= 4  # rounds 2..5 reused the block of the round before
    assert allocated - before[3] == 2
    assert blocks <= 8 and held <= 512 << 20
    _native.pool_clear()
    assert _native.pool_info()[:2] == (0, 0)
    assert kept[0].to_list() == kept[1]  # clearing the pool never frees memory in use


@needs_native
def test_pooled_buffers_bound_the_memory_kept_for_later():
    """However many large batches were alive at once, the pool keeps at most 8 blocks once
    they die; the rest goes back to the system. Small columns never use the pool."""
    from shardfeed import _native  # noqa: PLC0415

    spec = {"img": FixedLen("bytes")}
    _native.pool_clear()
    alive = [nv.parse_example_batch([ex.encode_example({"img": [v]}) for v in _large_records(2, 600_000, s)],
                                    spec, bytes_as="buffer") for s in range(12)]
    assert _native.pool_info()[0] == 0
    del alive
    blocks, held, _, _ = _native.pool_info()
    assert 1 <= blocks <= 8 and held >= blocks * 1_200_000
    small = nv.parse_example_batch([ex.encode_example({"img": [b"x" * 100]})], spec, bytes_as="buffer")
    assert small["img"].data.base is None  # numpy's own memory
    _native.pool_clear()


@needs_native
def test_pooled_buffer_arrays_pickle_and_outlive_threads():
    import pickle  # noqa: PLC0415

    spec = {"img": FixedLen("bytes")}
    values = _large_records(3, 500_000, 7)
    out: list = []
    t = threading.Thread(target=lambda: out.append(nv.parse_example_batch(
        [ex.encode_example({"img": [v]}) for v in values], spec, bytes_as="buffer")))
    t.start()
    t.join()
    col = out[0]["img"]
    again = pickle.loads(pickle.dumps(col))
    assert again.to_list() == values == col.to_list()


@needs_native
@pytest.mark.parametrize("shape", [(0,), (5,), (3, 4)])
def test_pack_and_unpack_bytes_round_trip_like_the_python_path(shape, monkeypatch):
    rng = random.Random(3)
    n = int(np.prod(shape))
    values = np.empty(n, object)
    values[:] = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(n)]
    values = values.reshape(shape)
    packed = nv.pack_bytes(values)
    assert packed.to_numpy().reshape(shape).tolist() == values.tolist()
    monkeypatch.setattr(nv, "_ext", None)
    slow = nv.pack_bytes(values)
    assert slow.data.tobytes() == packed.data.tobytes() and slow.offsets.tolist() == packed.offsets.tolist()
    assert slow.to_numpy().tolist() == packed.to_numpy().tolist()


@needs_native
def test_pack_bytes_refuses_other_values_and_unpack_refuses_offsets_outside_the_data():
    from shardfeed import _native  # noqa: PLC0415

    for bad in ([b"a", "b"], [b"a", None], [bytearray(b"a")]):
        arr = np.empty(len(bad), object)
        arr[:] = bad
        assert nv.pack_bytes(arr) is None
    with pytest.raises(TypeError):
        _native.pack_bytes(np.arange(3))
    data = np.frombuffer(b"abcdef", np.uint8)
    for offs in ([0, 7], [0, 3, 2], [1, 2], []):
        with pytest.raises(ValueError, match="offsets"):
            _native.unpack_bytes(data, np.array(offs, np.int64))
    assert _native.unpack_bytes(data, np.array([0, 2, 2, 6])).tolist() == [b"ab", b"", b"cdef"]


@needs_native
def test_a_closed_pass_keeps_no_pooled_memory_when_the_idle_time_is_zero(tmp_path, monkeypatch):
    """Large buffer-form batches reuse the pool during a pass; with
    ``SHARDFEED_POOL_IDLE_SECONDS=0`` closing the pass frees what it kept (by default the
    next pass gets it: tests/test_bufpool.py), while a batch the caller holds stays valid."""
    import shardfeed as sf  # noqa: PLC0415
    from shardfeed import _native  # noqa: PLC0415

    monkeypatch.setenv("SHARDFEED_POOL_IDLE_SECONDS", "0")

    url = str(tmp_path / "big.tfrecord")
    values = _large_records(12, 300_000, 5)
    with sf.TFRecordWriter(url) as w:
        for v in values:
            w.write(ex.encode_example({"img": [v]}))
    _native.pool_clear()
    ds = sf.read_tfrecord(url, spec={"img": FixedLen("bytes")}, num_parallel_reads=None).batch(4, bytes_as="buffer")
    it = iter(ds)
    col = next(it)["img"]
    del col  # its block goes back to the pool
    assert _native.pool_info()[0] == 1
    held = next(it)["img"]  # takes that block
    assert _native.pool_info()[0] == 0
    col = next(it)["img"]
    del col
    assert _native.pool_info()[0] == 1
    it.close()
    assert _native.pool_info()[:2] == (0, 0)
    assert held.to_list() == values[4:8]


# ----------------------------------------------------------------------------- frame_records


FRAME_CASES = [
    [],
    [b""],
    [os.urandom(n) for n in (0, 1, 7, 100, 5000, 70_000)],  # 70 KB: the GIL is released
    [[b"ab", bytearray(b"cd"), memoryview(b"xyz")], [], (), (b"",), [os.urandom(20_000), b"tail"]],
    [np.arange(10, dtype=np.uint8), b"plain", [b"a", np.frombuffer(b"bc", np.uint8)]],
]


@pytest.mark.parametrize("records", FRAME_CASES, ids=range(len(FRAME_CASES)))
def test_frame_records_gives_the_frames_the_writer_writes(records):
    def joined(r):
        return b"".join(bytes(p) for p in r) if isinstance(r, (list, tuple)) else bytes(r)

    want = b"".join(frame(joined(r)) for r in records)
    assert nv._frame_records_py(records) == want
    assert nv.frame_records(records) == want
    assert nv.frame_records(tuple(records)) == want
    pooled = nv.frame_records(records, pooled=True)
    assert isinstance(pooled, np.ndarray) and pooled.dtype == np.uint8 and pooled.tobytes() == want


@needs_native
def test_pooled_frames_of_a_megabyte_reuse_the_pools_memory():
    from shardfeed import _native

    records = [os.urandom(300_000) for _ in range(4)]
    want = b"".join(frame(r) for r in records)
    first = nv.frame_records(records, pooled=True)
    assert first.tobytes() == want
    del first  # its block goes back to the pool
    reused = _native.pool_info()[2]
    again = nv.frame_records(records, pooled=True)
    assert again.tobytes() == want and _native.pool_info()[2] == reused + 1


@needs_native
def test_native_frame_records_names_the_piece_that_is_not_bytes():
    with pytest.raises(TypeError, match=r"record 1, piece 2 is not bytes-like \(str\)"):
        nv.frame_records([b"ok", [b"a", b"b", "text"]])
    with pytest.raises(TypeError, match=r"record 0, piece 0 is not bytes-like \(int\)"):
        nv.frame_records([7])


def test_frame_records_takes_a_list_or_tuple_only():
    with pytest.raises(TypeError, match="list or tuple of records, got generator"):
        nv.frame_records(b for b in [b"x"])

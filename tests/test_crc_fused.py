"""Data CRCs checked by the batch parser in the pass that copies the values out (issue 22
#3): the framing scan checks only each frame's length CRC and hands the stored data CRCs on
(``scan_frames_deferred``), ``parse_example_batch(..., crcs=)`` checks every record, and a
``read_tfrecord(...).batch(n)`` pass reports a bad one with its file and byte offset, per
the corrupt policy, as the framing reader does."""

from __future__ import annotations

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import CorruptRecordError, DecodeError
from shardfeed.formats import native as nv
from shardfeed.formats.chunks import iter_frame_chunks
from shardfeed.formats.example import encode_example
from shardfeed.formats.tfrecord import frame

needs_native = pytest.mark.skipif(not nv.native_available(), reason=f"native extension not built: {nv.native_info()}")

SPEC = {"image": sf.FixedLen("bytes"), "label": sf.FixedLen("int64"), "tags": sf.VarLen("bytes")}


def _records(n: int, size: int = 3000, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [encode_example({"image": rng.bytes(size + 37 * i), "label": [i],
                            "tags": [rng.bytes(k + 1) for k in range(i % 4)]}) for i in range(n)]


def _file(records: list[bytes]) -> tuple[bytes, list[int]]:
    frames = [frame(r) for r in records]
    starts = list(np.cumsum([0] + [len(f) for f in frames[:-1]]))
    return b"".join(frames), [int(s) for s in starts]


def _flip_in_image(data: bytearray, start: int, record: bytes) -> None:
    """Flip a byte in the middle of the record's image value (the data CRC then fails, the
    record still parses)."""
    data[start + 12 + len(record) // 2] ^= 0x20


@needs_native
def test_deferred_scan_checks_the_length_crc_and_hands_out_the_stored_data_crcs(tmp_path):
    recs = _records(6)
    data, starts = _file(recs)
    o, n, consumed, err, crcs = nv.scan_frames_deferred(data)
    assert err is None and consumed == len(data) and crcs.dtype == np.uint32
    assert [data[a:a + b] for a, b in zip(o, n)] == recs
    assert list(crcs) == [nv.masked_crc32c(r) for r in recs]
    bad = bytearray(data)
    _flip_in_image(bad, starts[2], recs[2])
    o, n, consumed, err, crcs = nv.scan_frames_deferred(bytes(bad))
    assert err is None and len(o) == 6  # the data CRC is left to the parser
    assert nv.scan_frames(bytes(bad))[3] == ("data crc", starts[2])  # the plain scan still checks it
    # a fused batch pass reads local files this way; plain record reads still check in the scan
    path = tmp_path / "b.tfrecord"
    path.write_bytes(bytes(bad))
    chunks = list(iter_frame_chunks(str(path), defer_data_crc=True))
    assert sum(c.count for c in chunks) == 6 and all(c.crcs is not None for c in chunks)
    with pytest.raises(CorruptRecordError):
        list(iter_frame_chunks(str(path)))
    bad[starts[3] + 9] ^= 1  # a length CRC: still the scan's
    assert nv.scan_frames_deferred(bytes(bad))[3] == ("length crc", starts[3])


@needs_native
@pytest.mark.parametrize("bytes_as", ["buffer", "object"])
def test_parse_with_crcs_gives_the_same_columns_and_names_the_first_bad_record(bytes_as):
    recs = _records(12)
    data, starts = _file(recs)
    o, n, _, _, crcs = nv.scan_frames_deferred(data)
    plain = nv.parse_example_batch((data, o, n), SPEC, bytes_as=bytes_as)
    checked = nv.parse_example_batch((data, o, n), SPEC, bytes_as=bytes_as, crcs=crcs)
    for name in SPEC:
        a, b = plain[name], checked[name]
        if bytes_as == "buffer" and name == "image":
            assert a.to_numpy().tolist() == b.to_numpy().tolist()
            assert bytes(b.data) == b"".join(sf.parse_single_example(r, SPEC)["image"] for r in recs)
        elif name == "tags":
            va, vb = a.values, b.values
            if bytes_as == "buffer":
                va, vb = va.to_numpy(), vb.to_numpy()
            assert list(va) == list(vb) and list(a.row_splits) == list(b.row_splits)
        else:
            assert np.array_equal(a, b)
    for k in (0, 7, 11):
        bad = bytearray(data)
        _flip_in_image(bad, starts[k], recs[k])
        with pytest.raises(CorruptRecordError) as info:
            nv.parse_example_batch((bytes(bad), o, n), SPEC, bytes_as=bytes_as, crcs=crcs)
        assert info.value.check == "data crc" and info.value.record_index == k
        assert info.value.offset == starts[k]


@needs_native
def test_a_damaged_record_that_no_longer_parses_is_reported_as_its_crc():
    recs = _records(5)
    data, starts = _file(recs)
    o, n, _, _, crcs = nv.scan_frames_deferred(data)
    bad = bytearray(data)
    bad[starts[3] + 12] = 0xFF  # the first tag byte: not an Example any more
    with pytest.raises(DecodeError):  # without the CRCs: a decode error
        nv.parse_example_batch((bytes(bad), o, n), SPEC, bytes_as="buffer")
    with pytest.raises(CorruptRecordError) as info:
        nv.parse_example_batch((bytes(bad), o, n), SPEC, bytes_as="buffer", crcs=crcs)
    assert info.value.record_index == 3 and info.value.offset == starts[3]
    # a CRC failure after a record that does not parse: the parse error comes first
    bad2 = bytearray(data)
    bad2[starts[1] + 12] = 0xFF
    crcs2 = crcs.copy()
    crcs2[1] = nv.masked_crc32c(bytes(bad2[starts[1] + 12: starts[1] + 12 + len(recs[1])]))
    _flip_in_image(bad2, starts[4], recs[4])
    with pytest.raises(DecodeError) as dec:
        nv.parse_example_batch((bytes(bad2), o, n), SPEC, bytes_as="buffer", crcs=crcs2)
    assert dec.value.record_index == 1


@needs_native
def test_crcs_must_match_the_records():
    recs = _records(3)
    data, _ = _file(recs)
    o, n, _, _, crcs = nv.scan_frames_deferred(data)
    with pytest.raises(ValueError, match="2 CRCs for 3 records"):
        nv.parse_example_batch((data, o, n), SPEC, crcs=crcs[:2])
    with pytest.raises(ValueError, match="only with records given as"):
        nv.parse_example_batch(recs, SPEC, crcs=crcs)


@needs_native
def test_fused_copy_checksums_values_anywhere_in_the_record_and_defaults_outside_it():
    # a default value lies outside the record: copied, not checksummed; values of two columns
    # interleave in the record in key order, not column order
    spec = {"z": sf.FixedLen("bytes", default=b"dflt"), "a": sf.VarLen("bytes"), "m": sf.FixedLen("bytes")}
    recs = [encode_example({"a": [b"x" * 5000, b"y" * 7], "m": [b"m" * (3000 + i)]}) for i in range(4)]
    recs.append(encode_example({"a": [], "m": [b""], "z": [b"zz" * 4000]}))
    data, starts = _file(recs)
    o, n, _, _, crcs = nv.scan_frames_deferred(data)
    got = nv.parse_example_batch((data, o, n), spec, bytes_as="buffer", crcs=crcs)
    want = nv.parse_example_batch((data, o, n), spec, bytes_as="object")
    assert got["z"].to_numpy().tolist() == want["z"].ravel().tolist()
    assert got["m"].to_numpy().tolist() == want["m"].ravel().tolist()
    assert got["a"].values.to_numpy().tolist() == list(want["a"].values)
    for k in range(len(recs)):
        bad = bytearray(data)
        bad[starts[k] + 12 + len(recs[k]) - 1] ^= 1  # the record's last byte
        with pytest.raises(CorruptRecordError) as info:
            nv.parse_example_batch((bytes(bad), o, n), spec, bytes_as="buffer", crcs=crcs)
        assert info.value.record_index == k


def _write_big(tmp_path, name: str, records: list[bytes], flip: int | None):
    data, starts = _file(records)
    data = bytearray(data)
    if flip is not None:
        _flip_in_image(data, starts[flip], records[flip])
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return str(path), starts


@needs_native
def test_records_in_several_buffers_parse_as_if_joined():
    recs = _records(9)
    a, _ = _file(recs[:4])
    b, _ = _file(recs[4:])
    oa, na, _, _, ca = nv.scan_frames_deferred(a)
    ob, nb, _, _, cb = nv.scan_frames_deferred(b)
    which = np.array([0] * 4 + [1] * 5)
    triple = (nv.Buffers((a, b), which), np.concatenate([oa, ob]), np.concatenate([na, nb]))
    crcs = np.concatenate([ca, cb])
    joined, _ = _file(recs)
    oj, nj, _, _, _ = nv.scan_frames_deferred(joined)
    for bytes_as in ("buffer", "object"):
        got = nv.parse_example_batch(triple, SPEC, bytes_as=bytes_as, crcs=crcs)
        want = nv.parse_example_batch((joined, oj, nj), SPEC, bytes_as=bytes_as)
        assert np.array_equal(got["label"], want["label"])
        img = got["image"].to_numpy() if bytes_as == "buffer" else got["image"]
        img2 = want["image"].to_numpy() if bytes_as == "buffer" else want["image"]
        assert img.tolist() == img2.tolist()
    bad_b = bytearray(b)
    _flip_in_image(bad_b, int(ob[2]) - 12, recs[6])
    with pytest.raises(CorruptRecordError) as info:
        nv.parse_example_batch((nv.Buffers((a, bytes(bad_b)), which), *triple[1:]), SPEC, bytes_as="buffer",
                               crcs=crcs)
    assert info.value.record_index == 6
    with pytest.raises(ValueError, match="buffer 2 of 2"):
        nv.parse_example_batch((nv.Buffers((a, b), which * 2), *triple[1:]), SPEC, crcs=crcs)


@needs_native
@pytest.mark.parametrize("reads", [None, sf.AUTOTUNE])
@pytest.mark.parametrize("bytes_as", ["buffer", "object"])
@pytest.mark.parametrize("flip", [1, 17])  # 1: in the batch that spans both files
def test_a_bad_data_crc_found_on_the_fused_path_names_its_file_and_offset(tmp_path, reads, bytes_as, flip):
    recs = _records(30, size=20_000)
    good, _ = _write_big(tmp_path, "a.tfrecord", recs, None)
    bad, starts = _write_big(tmp_path, "b.tfrecord", recs, flip)
    ds = sf.read_tfrecord([good, bad], SPEC, num_parallel_reads=reads).batch(8, bytes_as=bytes_as)
    with pytest.raises(CorruptRecordError) as info:
        for _ in ds:
            pass
    assert info.value.check == "data crc" and info.value.offset == starts[flip]
    assert info.value.url.endswith("b.tfrecord")
    assert f"b.tfrecord at byte offset {starts[flip]}: data crc" in str(info.value)


@needs_native
@pytest.mark.parametrize("bytes_as", ["buffer", "object"])
@pytest.mark.parametrize("flip", [1, 5])  # 1: in the batch that spans both files
def test_skip_drops_a_record_whose_crc_fails_on_the_fused_path_and_counts_it(tmp_path, bytes_as, flip):
    recs = _records(30, size=20_000)
    good, _ = _write_big(tmp_path, "a.tfrecord", recs, None)
    bad, starts = _write_big(tmp_path, "b.tfrecord", recs, flip)
    src = sf.read_tfrecord([good, bad], SPEC, on_corrupt="skip")
    it = iter(src.batch(8, bytes_as=bytes_as))
    labels = []
    for b in it:
        labels += b["label"].ravel().tolist()
    assert labels == list(range(30)) + [i for i in range(30) if i != flip]
    st = src.read_stats
    assert st.skipped_records == 1 and st.records == 59
    assert st.corrupt[0].check == "data crc" and st.corrupt[0].offset == starts[flip]
    assert st.corrupt[0].url.endswith("b.tfrecord")
    skipped = it.stats().to_dict()["skipped"]
    assert skipped["by_stage"] == {"read": 1} and skipped["examples"][0]["offset"] == starts[flip]


@needs_native
def test_without_crc_checks_a_damaged_value_goes_through(tmp_path):
    recs = _records(10, size=20_000)
    bad, _ = _write_big(tmp_path, "b.tfrecord", recs, 4)
    got = [b["label"].ravel().tolist() for b in sf.read_tfrecord(bad, SPEC, verify_crc=False).batch(5)]
    assert sum(got, []) == list(range(10))

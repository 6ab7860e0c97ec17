"""TFRecord framing: round trips on every storage, compressions, corrupt and hostile input,
index files and random access."""

from __future__ import annotations

import os
import struct
import tracemalloc

import numpy as np
import pytest

import shardfeed as sf
from shardfeed import storage
from shardfeed.errors import CorruptRecordError
from shardfeed.formats import tfrecord as tfr
from shardfeed.formats.crc import masked_crc32c, masked_length_crc
from shardfeed.formats.index import IndexedTFRecord, StaleIndexError, build_index, read_index

RECORDS = [os.urandom(n) for n in (0, 1, 7, 100, 5000, 12)]


def _write(path, records=RECORDS, compression=None, index=False):
    tfr.write_records(str(path), records, compression=compression, index=index)
    return str(path)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_roundtrip_every_compression(tmp_path, compression):
    url = _write(tmp_path / "a.tfrecord", compression=compression)
    assert list(tfr.read_records(url, compression=compression)) == RECORDS


def test_auto_compression_by_extension(tmp_path):
    gz = _write(tmp_path / "a.tfrecord.gz", compression="auto")
    zz = _write(tmp_path / "a.tfrecord.zz", compression="auto")
    with open(gz, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    assert list(tfr.read_records(gz)) == RECORDS
    assert list(tfr.read_records(zz)) == RECORDS


def test_gzip_output_is_deterministic(tmp_path):
    a = _write(tmp_path / "a.gz", compression="GZIP")
    b = _write(tmp_path / "b.gz", compression="GZIP")
    assert open(a, "rb").read() == open(b, "rb").read()


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_roundtrip_on_s3_and_memory(s3_bucket, compression):
    bucket, opts = s3_bucket
    for base in (f"s3://{bucket}/t", "memory://tfr-test"):
        url = f"{base}/x.tfrecord"
        tfr.write_records(url, RECORDS, compression=compression, storage_options=opts)
        assert list(tfr.read_records(url, compression=compression, storage_options=opts)) == RECORDS


def test_reading_many_files_by_glob_in_order(tmp_path):
    for i in range(3):
        _write(tmp_path / f"part-{i}.tfrecord", [bytes([i]) * 3, bytes([i])])
    got = list(tfr.read_records(str(tmp_path / "part-*.tfrecord")))
    assert got == [b"\x00" * 3, b"\x00", b"\x01" * 3, b"\x01", b"\x02" * 3, b"\x02"]


def test_large_record_over_16_mib(tmp_path):
    big = os.urandom(17 << 20)
    url = _write(tmp_path / "big.tfrecord", [b"a", big, b"b"])
    assert list(tfr.read_records(url)) == [b"a", big, b"b"]


def test_empty_file_has_no_records(tmp_path):
    p = tmp_path / "empty.tfrecord"
    p.write_bytes(b"")
    assert list(tfr.read_records(str(p))) == []


def test_file_of_zeros_fails_the_length_crc(tmp_path):
    p = tmp_path / "zeros.tfrecord"
    p.write_bytes(b"\x00" * 64)
    with pytest.raises(CorruptRecordError) as info:
        list(tfr.read_records(str(p)))
    e = info.value
    assert e.check == "length crc" and e.offset == 0 and str(p) in str(e)


def _corrupt_copy(tmp_path, mutate, name="bad.tfrecord"):
    data = bytearray(open(_write(tmp_path / "good.tfrecord"), "rb").read())
    mutate(data)
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return str(p)


def _offsets():
    out, off = [], 0
    for r in RECORDS:
        out.append(off)
        off += len(r) + 16
    return out


@pytest.mark.parametrize(
    "cut, check",
    [
        (lambda n: n - 3, "truncated data crc"),  # footer cut
        (lambda n: n - 4 - 5, "truncated data"),  # data cut
        (lambda n: n - 16 - 12 + 10, "truncated length crc"),  # length crc cut
        (lambda n: n - 16 - 12 + 5, "truncated length"),  # length cut
    ],
)
def test_truncated_last_record_is_reported(tmp_path, cut, check):
    good = open(_write(tmp_path / "good.tfrecord"), "rb").read()
    p = tmp_path / "trunc.tfrecord"
    p.write_bytes(good[: cut(len(good))])
    with pytest.raises(CorruptRecordError) as info:
        list(tfr.read_records(str(p)))
    assert info.value.check == check
    assert info.value.offset == _offsets()[-1]
    assert info.value.record_index == len(RECORDS) - 1
    # with skip: every whole record before it, and the damage counted
    stats = tfr.ReadStats()
    assert list(tfr.read_records(str(p), on_corrupt="skip", stats=stats)) == RECORDS[:-1]
    assert stats.skipped_records == 1 and stats.corrupt[0].check == check


def test_flipped_bit_in_data_names_file_offset_and_check(tmp_path):
    off = _offsets()[3]
    p = _corrupt_copy(tmp_path, lambda d: d.__setitem__(off + 12 + 50, d[off + 12 + 50] ^ 0x10))
    with pytest.raises(CorruptRecordError, match=rf"bad.tfrecord at byte offset {off}: data crc") as info:
        list(tfr.read_records(p))
    assert info.value.record_index == 3
    stats = tfr.ReadStats()
    got = list(tfr.read_records(p, on_corrupt="skip", stats=stats))
    assert got == RECORDS[:3] + RECORDS[4:]
    assert stats.skipped_records == 1 and stats.records == len(RECORDS) - 1
    assert stats.corrupt[0].offset == off


def test_flipped_bit_in_length_is_caught_and_skip_resynchronises(tmp_path):
    off = _offsets()[2]
    p = _corrupt_copy(tmp_path, lambda d: d.__setitem__(off + 1, d[off + 1] ^ 0x01))
    with pytest.raises(CorruptRecordError) as info:
        list(tfr.read_records(p))
    assert (info.value.check, info.value.offset) == ("length crc", off)
    stats = tfr.ReadStats()
    got = list(tfr.read_records(p, on_corrupt="skip", stats=stats))
    assert got == RECORDS[:2] + RECORDS[3:]
    assert stats.skipped_records == 1
    assert stats.skipped_bytes == len(RECORDS[2]) + 16


def test_crc_checks_can_be_turned_off(tmp_path):
    off = _offsets()[3]
    p = _corrupt_copy(tmp_path, lambda d: d.__setitem__(off + 12, d[off + 12] ^ 0xFF))
    got = list(tfr.read_records(p, verify_crc=False))
    assert len(got) == len(RECORDS) and got[3] != RECORDS[3]


def test_absurd_length_is_reported_without_allocating(tmp_path):
    absurd = (1 << 62) + 5
    p = tmp_path / "absurd.tfrecord"
    p.write_bytes(struct.pack("<QI", absurd, masked_length_crc(absurd)) + b"x" * 100)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError) as info:
            list(tfr.read_records(str(p)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.check == "absurd length"
    assert peak < 64 << 20


def test_length_past_end_of_file_is_truncation_not_allocation(tmp_path):
    claimed = 1 << 30  # plausible length, valid CRC, but the file holds 100 bytes
    p = tmp_path / "short.tfrecord"
    p.write_bytes(struct.pack("<QI", claimed, masked_length_crc(claimed)) + b"x" * 100)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError) as info:
            list(tfr.read_records(str(p)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.check == "truncated data"
    assert peak < 64 << 20


def test_gzip_file_read_as_uncompressed_hints_at_compression(tmp_path):
    src = _write(tmp_path / "a.tfrecord", compression="GZIP")
    with pytest.raises(CorruptRecordError, match="compression='GZIP'"):
        list(tfr.read_records(src, compression=None))


def test_truncated_gzip_stream_is_reported(tmp_path):
    src = _write(tmp_path / "a.tfrecord.gz", [os.urandom(3000) for _ in range(20)], compression="GZIP")
    data = open(src, "rb").read()
    p = tmp_path / "cut.tfrecord.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptRecordError) as info:
        list(tfr.read_records(str(p)))
    assert info.value.check in ("compressed stream", "truncated data", "truncated data crc", "truncated length")
    assert "cut.tfrecord.gz" in str(info.value)


def test_missing_file_is_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tfrecord"):
        list(tfr.read_records(str(tmp_path / "nope.tfrecord")))


def test_writer_failure_leaves_no_file(tmp_path):
    url = str(tmp_path / "out.tfrecord")
    with pytest.raises(RuntimeError):
        with tfr.TFRecordWriter(url, index=True) as w:
            w.write(b"abc")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_writer_rejects_non_bytes(tmp_path):
    with tfr.TFRecordWriter(str(tmp_path / "x.tfrecord")) as w:
        with pytest.raises(TypeError, match="bytes"):
            w.write("text")  # type: ignore[arg-type]


def test_index_written_by_writer_matches_build_index(tmp_path):
    url = _write(tmp_path / "i.tfrecord", index=True)
    lines = open(url + ".idx").read().split("\n")
    assert lines[0] == f"0 {len(RECORDS[0]) + 16}"
    built = build_index(url, url + ".idx2")
    assert built.tolist() == read_index(url + ".idx").tolist()
    assert [o for o, _ in built.tolist()] == _offsets()


def test_random_access_through_index(s3_bucket):
    bucket, opts = s3_bucket
    url = f"s3://{bucket}/ix/data.tfrecord"
    tfr.write_records(url, RECORDS, index=True, storage_options=opts)
    shard = IndexedTFRecord(url, storage_options=opts)
    assert len(shard) == len(RECORDS)
    assert shard[4] == RECORDS[4] and shard[-1] == RECORDS[-1]
    assert shard.read_range(1, 4) == RECORDS[1:4]
    with pytest.raises(IndexError, match="out of range"):
        shard[len(RECORDS)]


def test_stale_index_is_detected(tmp_path):
    url = _write(tmp_path / "s.tfrecord", index=True)
    _write(tmp_path / "s.tfrecord", [b"different", b"content"])
    with pytest.raises(StaleIndexError, match="stale index"):
        IndexedTFRecord(url)[3]  # refused when opened: its frames do not tile the file (issue 39 item 2)


def test_malformed_index_line_names_file_and_line(tmp_path):
    url = _write(tmp_path / "m.tfrecord")
    (tmp_path / "m.tfrecord.idx").write_text("0 16\nbanana\n")
    with pytest.raises(Exception, match=r"m.tfrecord.idx: line 2"):
        IndexedTFRecord(url)


@pytest.mark.parametrize("text", ["0 16\n16 99999999999999999999\n", "0 16\n16 2.5\n", "0 16\n-16 20\n",
                                  "0 16\n16 8\n", "0 16\n16 20 5\n20\n"])
def test_an_index_number_out_of_range_names_its_line_not_clamped(tmp_path, text):
    (tmp_path / "o.tfrecord.idx").write_text(text)
    with pytest.raises(Exception, match=r"o.tfrecord.idx: line 2"):
        read_index(str(tmp_path / "o.tfrecord.idx"))


def test_index_parsing_from_many_threads_leaves_the_warning_filters_alone(tmp_path):
    import threading
    import warnings

    from shardfeed.formats.index import _parse_index_fast

    before = list(warnings.filters)
    good, bad = b"0 16\n16 20\n" * 500, b"0 16\n16 x\n" * 500
    threads = [threading.Thread(target=lambda: [_parse_index_fast(d) for _ in range(200) for d in (good, bad)])
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(warnings.filters) == before
    assert _parse_index_fast(bad) is None and _parse_index_fast(good).shape == (1000, 2)


def test_a_large_index_parses_to_the_numbers_written(tmp_path):
    rows = [(o, 16 + o % 977) for o in range(0, 40_000 * 1000, 1000)]
    (tmp_path / "big.idx").write_text("".join(f"{o} {n}\n" for o, n in rows))
    assert read_index(str(tmp_path / "big.idx")).tolist() == [list(r) for r in rows]


def test_index_refuses_compressed(tmp_path):
    with pytest.raises(ValueError, match="uncompressed"):
        tfr.TFRecordWriter(str(tmp_path / "x.gz"), compression="GZIP", index=True)


def test_frame_matches_masked_crc_definition():
    data = b"hello"
    f = tfr.frame(data)
    assert struct.unpack("<Q", f[:8])[0] == 5
    assert struct.unpack("<I", f[8:12])[0] == masked_length_crc(5)
    assert struct.unpack("<I", f[-4:])[0] == masked_crc32c(data)
    # the known CRC-32C check value
    from shardfeed.formats.crc import crc32c

    assert crc32c(b"123456789") == 0xE3069283


def test_reading_through_http(http_dir):
    directory, base = http_dir
    _write(directory / "h.tfrecord")
    assert list(tfr.read_records(f"{base}/h.tfrecord")) == RECORDS
    assert storage.size(f"{base}/h.tfrecord") == sum(len(r) + 16 for r in RECORDS)


frame = tfr.frame


def _frames(records):
    return b"".join(frame(r) for r in records)


def _read_skipping(path: str, p) -> tuple:
    """The records of ``p`` under ``on_corrupt="skip"`` and what was skipped, through the
    reference reader or the pipeline."""
    if path == "reference":
        reader = sf.TFRecordReader(str(p), on_corrupt="skip")
        return list(reader), reader.stats
    ds = sf.read_tfrecord(str(p), on_corrupt="skip")
    return list(ds), ds.read_stats


@pytest.mark.parametrize("path", ["reference", "pipeline"])
def test_skip_resyncs_after_a_length_that_passes_its_crc_but_is_absurd(tmp_path, path):
    import struct as _struct

    from shardfeed.formats.crc import masked_length_crc

    good = [f"rec-{i}".encode() * 3 for i in range(25)]
    bad_len = (1 << 63) + 5
    bad = _struct.pack("<QI", bad_len, masked_length_crc(bad_len)) + b"junk-junk"
    p = tmp_path / "absurd.tfrecord"
    p.write_bytes(_frames(good[:1]) + bad + _frames(good[1:]))
    got, stats = _read_skipping(path, p)
    assert got == good  # every intact record, the 24 after the bad frame included
    assert stats.skipped_records == 1 and stats.skipped_bytes == len(bad)


@pytest.mark.parametrize("path", ["reference", "pipeline"])
def test_skip_keeps_the_records_after_a_half_written_frame_of_concatenated_files(tmp_path, path):
    a = [f"a{i}".encode() * 10 for i in range(5)]
    b = [f"b{i}".encode() * 10 for i in range(7)]
    half = frame(b"x" * 200)[:60]  # part-a ended in a half-written frame; part-b was appended
    p = tmp_path / "cat.tfrecord"
    p.write_bytes(_frames(a) + half + _frames(b))
    got, stats = _read_skipping(path, p)
    assert got == a + b
    assert stats.skipped_records == 1 and stats.skipped_bytes == len(half)


def test_empty_gzip_and_zlib_files_both_read_as_empty_and_a_cut_header_is_still_an_error(tmp_path):
    import shardfeed as sf

    for ext in (".gz", ".zz"):
        p = tmp_path / f"empty.tfrecord{ext}"
        p.write_bytes(b"")
        assert list(sf.read_tfrecord(str(p))) == []
        assert list(sf.read_tfrecord(str(p), on_corrupt="skip")) == []
    cut = tmp_path / "cut.tfrecord.zz"
    cut.write_bytes(b"\x78")  # the first byte of a zlib header, nothing more
    with pytest.raises(sf.CorruptRecordError, match="ZLIB stream ends before its end marker"):
        list(sf.read_tfrecord(str(cut)))


def _whole_frames_inflatable(packed: bytes, compression: str) -> list[int]:
    """Frame offsets of the whole frames that inflate from ``packed`` (zlib's own count)."""
    import zlib

    return _whole_frames_inflatable_raw(zlib.decompressobj(31 if compression == "GZIP" else 15).decompress(packed))


def _read_every_path(p, on_corrupt):
    """(records, error) read from ``p`` by each read path."""
    from shardfeed.formats.chunks import iter_frame_chunks

    def collect(it):
        got = []
        try:
            for x in it:
                got.extend(x.records() if hasattr(x, "records") else [x])
        except CorruptRecordError as exc:
            return got, exc
        return got, None

    return {
        "reference": collect(sf.TFRecordReader(str(p), on_corrupt=on_corrupt)),
        "chunks": collect(iter_frame_chunks(str(p), on_corrupt=on_corrupt)),
        "pipeline": collect(sf.read_tfrecord(str(p), on_corrupt=on_corrupt)),
        "pipeline, no threads": collect(sf.read_tfrecord(str(p), on_corrupt=on_corrupt, num_parallel_reads=None)),
    }


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
def test_a_compressed_shard_cut_in_half_delivers_every_whole_record_on_every_path(tmp_path, compression,
                                                                                 on_corrupt):
    import random

    rng = random.Random(7)
    records = [rng.randbytes(rng.randint(50, 3000)) for _ in range(400)]
    ext = ".gz" if compression == "GZIP" else ".zz"
    src = _write(tmp_path / f"a.tfrecord{ext}", records, compression=compression)
    packed = open(src, "rb").read()
    p = tmp_path / f"cut.tfrecord{ext}"
    p.write_bytes(packed[: len(packed) // 2])
    whole = _whole_frames_inflatable(packed[: len(packed) // 2], compression)
    assert 150 < len(whole) < 250
    for path, (got, err) in _read_every_path(p, on_corrupt).items():
        assert got == records[: len(whole)], path
        if on_corrupt == "raise":
            # named at the first frame not delivered, an offset in the uncompressed stream
            assert err is not None and err.record_index == len(whole), path
            first_lost = whole[-1] + 16 + len(records[len(whole) - 1])
            assert err.offset == first_lost, path
            assert "uncompressed stream" in str(err) and "cut.tfrecord" in str(err), path
        else:
            assert err is None, path


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_damage_in_the_middle_of_a_compressed_shard_keeps_every_record_before_it(tmp_path, compression):
    import random

    rng = random.Random(3)
    records = [rng.randbytes(rng.randint(50, 2000)) for _ in range(300)]
    ext = ".gz" if compression == "GZIP" else ".zz"
    src = _write(tmp_path / f"a.tfrecord{ext}", records, compression=compression)
    packed = bytearray(open(src, "rb").read())
    at = len(packed) // 2
    packed[at: at + 64] = bytes(64)  # a run of zeros in the deflate data
    p = tmp_path / f"bad.tfrecord{ext}"
    p.write_bytes(bytes(packed))
    # the records whose frames lie wholly in the part that inflates to the original bytes
    import zlib

    original = open(src, "rb").read()
    original = zlib.decompressobj(31 if compression == "GZIP" else 15).decompress(original)
    d = zlib.decompressobj(31 if compression == "GZIP" else 15)
    parts = []
    for k in range(0, len(packed), 4096):  # 4 KiB at a time; the failing piece byte by byte
        keep = d.copy()
        try:
            parts.append(d.decompress(bytes(packed[k: k + 4096])))
            continue
        except zlib.error:
            d = keep
        for j in range(k, min(k + 4096, len(packed))):
            try:
                parts.append(d.decompress(bytes(packed[j: j + 1])))
            except zlib.error:
                break
        break
    good = b"".join(parts)
    mismatch = np.flatnonzero(np.frombuffer(good[: len(original)], np.uint8)
                              != np.frombuffer(original[: len(good)], np.uint8))
    same = int(mismatch[0]) if len(mismatch) else min(len(good), len(original))
    n = sum(1 for off in _whole_frames_inflatable_raw(original) if off + 16 + 0 <= same
            and off + 16 + struct.unpack_from("<Q", original, off)[0] <= same)
    assert 100 < n < 300
    for on_corrupt in ("raise", "skip"):
        for path, (got, err) in _read_every_path(p, on_corrupt).items():
            assert len(got) >= n and got[:n] == records[:n], (path, on_corrupt)
            if on_corrupt == "raise":
                assert err is not None and got == records[: len(got)], path
            else:  # what resynchronises after the damage is intact and in order
                rest = iter(records[n:])
                assert all(any(r == x for x in rest) for r in got[n:]), path


def _whole_frames_inflatable_raw(raw: bytes) -> list[int]:
    """Frame offsets of the whole frames in the uncompressed stream ``raw``."""
    offsets, pos = [], 0
    while pos + 12 <= len(raw):
        (length,) = struct.unpack_from("<Q", raw, pos)
        if pos + 16 + length > len(raw):
            break
        offsets.append(pos)
        pos += 16 + length
    return offsets


def test_concatenated_gzip_members_and_zero_padding_read_as_one_stream(tmp_path):
    a = [os.urandom(100) for _ in range(30)]
    b = [os.urandom(200) for _ in range(20)]
    pa = _write(tmp_path / "a.tfrecord.gz", a, compression="GZIP")
    pb = _write(tmp_path / "b.tfrecord.gz", b, compression="GZIP")
    p = tmp_path / "ab.tfrecord.gz"
    p.write_bytes(open(pa, "rb").read() + bytes(10) + open(pb, "rb").read() + bytes(5))
    for path, (got, err) in _read_every_path(p, "raise").items():
        assert err is None and got == a + b, path


def test_a_gzip_member_followed_by_garbage_is_an_error_after_its_records(tmp_path):
    a = [os.urandom(100) for _ in range(30)]
    pa = _write(tmp_path / "a.tfrecord.gz", a, compression="GZIP")
    p = tmp_path / "junk.tfrecord.gz"
    p.write_bytes(open(pa, "rb").read() + b"not gzip at all")
    for path, (got, err) in _read_every_path(p, "raise").items():
        assert got == a and err is not None and err.check == "compressed stream", path
        assert "GZIP" in str(err), path


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_write_frames_gives_the_same_file_and_index_as_write(tmp_path, compression):
    from shardfeed.formats.native import frame_records

    index = compression is None
    a = _write(tmp_path / "a.tfrecord", compression=compression, index=index)
    b = str(tmp_path / "b.tfrecord")
    with tfr.TFRecordWriter(b, compression=compression, index=index) as w:
        w.write(RECORDS[0])  # frames after a plain write, and in two calls
        w.write_frames(frame_records(RECORDS[1:4]), [len(r) for r in RECORDS[1:4]])
        w.write_frames(b"", [])
        w.write_frames(bytearray(frame_records(RECORDS[4:])), [len(r) for r in RECORDS[4:]])
        assert w.records == len(RECORDS)
    assert open(a, "rb").read() == open(b, "rb").read()
    if index:
        assert open(a + ".idx", "rb").read() == open(b + ".idx", "rb").read()


def test_write_frames_rejects_lengths_that_do_not_add_up(tmp_path):
    from shardfeed.formats.native import frame_records

    with tfr.TFRecordWriter(str(tmp_path / "a.tfrecord")) as w:
        with pytest.raises(ValueError, match=r"22 bytes of frames, but the 1 record lengths frame 21"):
            w.write_frames(frame_records([b"abcdef"]), [5])
        w.write(b"x")
    assert [bytes(r) for r in tfr.read_records(str(tmp_path / "a.tfrecord"))] == [b"x"]


def test_an_index_over_its_own_shard_is_refused_and_the_shard_kept(tmp_path):
    """build_index(url, url) and TFRecordWriter(url, index=url) replaced the records with
    their index, without an error (found from outside); also through another spelling of the
    same path."""
    from shardfeed.formats.index import build_index

    url = str(tmp_path / "a.tfrecord")
    recs = [sf.encode_example({"id": [i]}) for i in range(20)]
    sf.write_records(url, recs)
    before = open(url, "rb").read()
    for same in (url, str(tmp_path / "." / "a.tfrecord"), "file://" + url):
        with pytest.raises(ValueError, match="would be the shard itself"):
            build_index(url, same)
        assert open(url, "rb").read() == before
    other = str(tmp_path / "b.tfrecord")
    with pytest.raises(ValueError, match="would be the shard itself"):
        sf.TFRecordWriter(other, index=other)
    assert list(sf.read_records(url)) == recs


@pytest.mark.parametrize("compression, level", [("GZIP", 10), ("GZIP", -1), ("ZLIB", -5), ("ZLIB", 10),
                                                ("GZIP", "6"), ("ZLIB", 2.5)])
def test_a_compression_level_out_of_range_names_the_argument_and_the_file(tmp_path, compression, level):
    """zlib said "Invalid initialization option" about a hidden temporary file (found from
    outside); nothing is written."""
    url = str(tmp_path / "x.tfrecord")
    with pytest.raises(ValueError, match=rf"x\.tfrecord: compression_level for {compression} must be an int"):
        sf.TFRecordWriter(url, compression=compression, compression_level=level)
    assert os.listdir(tmp_path) == []

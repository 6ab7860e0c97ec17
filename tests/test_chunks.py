"""The chunked fast read path gives exactly what the reference reader gives: the same
records, the same errors at the same offsets, the same skip counts."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import CorruptRecordError
from shardfeed.formats import tfrecord as tfr
from shardfeed.formats.chunks import iter_frame_chunks, iter_record_batches, rebatch
from shardfeed.formats.crc import masked_length_crc
from shardfeed.formats.parse import parse_batch

RNG = np.random.default_rng(3)
RECORDS = [os.urandom(int(n)) for n in RNG.integers(0, 3000, size=400)]


def _flatten(chunks):
    return [r for c in chunks for r in c.records()]


@pytest.mark.parametrize("chunk_size", [1, 100, 4096, 1 << 20])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_chunks_hold_every_record_in_order(tmp_path, chunk_size, compression):
    url = str(tmp_path / "a.tfrecord")
    tfr.write_records(url, RECORDS, compression=compression)
    stats = tfr.ReadStats()
    got = _flatten(iter_frame_chunks(url, compression=compression, chunk_size=chunk_size, stats=stats))
    assert got == RECORDS
    assert stats.records == len(RECORDS)
    assert stats.bytes == sum(len(r) + 16 for r in RECORDS)


def test_record_larger_than_chunk(tmp_path):
    big = os.urandom(3 << 20)
    url = str(tmp_path / "big.tfrecord")
    tfr.write_records(url, [b"a", big, b"b"])
    assert _flatten(iter_frame_chunks(url, chunk_size=1 << 16)) == [b"a", big, b"b"]


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_rebatch_gives_exact_batches_across_chunks_and_files(tmp_path, batch_size):
    for i in range(3):
        tfr.write_records(str(tmp_path / f"p{i}.tfrecord"), RECORDS[i * 100:(i + 1) * 100 + 33])
    expected = list(tfr.read_records(str(tmp_path / "p*.tfrecord")))
    batches = list(iter_record_batches(str(tmp_path / "p*.tfrecord"), batch_size, chunk_size=5000))
    assert [b.count for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert 0 < batches[-1].count <= batch_size
    assert _flatten(batches) == expected
    dropped = list(iter_record_batches(str(tmp_path / "p*.tfrecord"), batch_size, chunk_size=5000,
                                       drop_remainder=True))
    assert all(b.count == batch_size for b in dropped)
    assert len(dropped) == len(expected) // batch_size


def test_a_batch_across_chunks_of_one_mapped_file_is_not_copied(tmp_path):
    # the chunks of a mapped file all view its whole map: a batch spanning several of them
    # is their offsets joined, not a copy of their bytes; a batch across two files (two
    # buffers) is copied into one
    tfr.write_records(str(tmp_path / "a.tfrecord"), RECORDS[:300])
    tfr.write_records(str(tmp_path / "b.tfrecord"), RECORDS[300:])
    chunks = list(iter_frame_chunks(str(tmp_path / "a.tfrecord"), chunk_size=5000))
    assert len(chunks) > 10 and len({id(c.buffer) for c in chunks}) == 1
    batches = list(rebatch(iter(chunks), 120))
    assert all(b.buffer is chunks[0].buffer for b in batches)
    assert _flatten(batches) == RECORDS[:300]
    both = list(iter_record_batches(str(tmp_path / "*.tfrecord"), 120, chunk_size=5000))
    assert _flatten(both) == RECORDS
    straddling = both[2]  # records 240-359: the end of a.tfrecord and the start of b.tfrecord
    assert isinstance(straddling.buffer, bytes) and straddling.records() == RECORDS[240:360]


def test_rebatch_rejects_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        list(rebatch([], 0))


def _corrupt(tmp_path, where, flip):
    url = str(tmp_path / "c.tfrecord")
    tfr.write_records(url, RECORDS[:50])
    data = bytearray(open(url, "rb").read())
    off = sum(len(r) + 16 for r in RECORDS[:where])
    data[off + flip] ^= 0x04
    open(url, "wb").write(bytes(data))
    return url, off


@pytest.mark.parametrize("flip, check", [(1, "length crc"), (12, "data crc")])
def test_corruption_raises_like_the_reference(tmp_path, flip, check):
    url, off = _corrupt(tmp_path, 20, flip)
    if len(RECORDS[20]) == 0 and check == "data crc":
        pytest.skip("empty record has no data byte to flip")
    with pytest.raises(CorruptRecordError) as ours:
        _flatten(iter_frame_chunks(url, chunk_size=3000))
    with pytest.raises(CorruptRecordError) as ref:
        list(tfr.read_records(url))
    assert (ours.value.check, ours.value.offset, ours.value.record_index) == \
        (ref.value.check, ref.value.offset, ref.value.record_index) == (check, off, 20)


@pytest.mark.parametrize("flip", [1, 12])
def test_corruption_skip_matches_the_reference(tmp_path, flip):
    url, _ = _corrupt(tmp_path, 20, flip)
    ours, ref = tfr.ReadStats(), tfr.ReadStats()
    got = _flatten(iter_frame_chunks(url, on_corrupt="skip", chunk_size=3000, stats=ours))
    want = list(tfr.read_records(url, on_corrupt="skip", stats=ref))
    assert got == want
    assert (ours.records, ours.skipped_records, ours.skipped_bytes) == \
        (ref.records, ref.skipped_records, ref.skipped_bytes)


def test_truncated_file_reports_like_the_reference(tmp_path):
    url = str(tmp_path / "t.tfrecord")
    tfr.write_records(url, RECORDS[:30])
    data = open(url, "rb").read()
    open(url, "wb").write(data[:-7])
    with pytest.raises(CorruptRecordError) as ours:
        _flatten(iter_frame_chunks(url, chunk_size=2048))
    assert ours.value.check.startswith("truncated") and ours.value.record_index == 29


def test_absurd_length_does_not_allocate(tmp_path):
    url = str(tmp_path / "absurd.tfrecord")
    n = 1 << 30
    open(url, "wb").write(struct.pack("<QI", n, masked_length_crc(n)) + b"x" * 64)
    with pytest.raises(CorruptRecordError, match="truncated data"):
        _flatten(iter_frame_chunks(url))


def test_parse_batch_on_chunks_equals_parse_example(tmp_path):
    records = [sf.encode_example({"a": [i], "b": [float(i)] * (i % 4), "c": [str(i).encode()]}) for i in range(300)]
    url = str(tmp_path / "e.tfrecord")
    tfr.write_records(url, records)
    spec = {"a": sf.FixedLen("int64"), "b": sf.VarLen("float32"), "c": sf.FixedLen("bytes")}
    start = 0
    for batch in iter_record_batches(url, 128, chunk_size=4000):
        ours = parse_batch(batch, spec)
        ref = sf.parse_example(records[start:start + batch.count], spec)
        np.testing.assert_array_equal(ours["a"], ref["a"])
        assert ours["b"] == ref["b"]
        assert ours["c"].tolist() == ref["c"].tolist()
        start += batch.count
    assert start == 300


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_positions_are_frame_offsets_and_start_offset_resumes(tmp_path, compression):
    url = str(tmp_path / "p.tfrecord")
    tfr.write_records(url, RECORDS[:60], compression=compression)
    expected_positions = np.cumsum([0] + [len(r) + 16 for r in RECORDS[:59]])
    chunks = list(iter_frame_chunks(url, compression=compression, chunk_size=5000))
    positions = np.concatenate([c.positions for c in chunks])
    np.testing.assert_array_equal(positions, expected_positions)
    start = int(expected_positions[25])
    resumed = _flatten(iter_frame_chunks(url, compression=compression, chunk_size=5000, start_offset=start))
    assert resumed == RECORDS[25:60]
    batches = list(rebatch(iter(chunks), 7))
    np.testing.assert_array_equal(np.concatenate([b.positions for b in batches]), expected_positions)


def test_positions_of_records_after_skipped_corruption(tmp_path):
    url, off = _corrupt(tmp_path, 20, 12)
    chunks = list(iter_frame_chunks(url, on_corrupt="skip", chunk_size=3000))
    positions = np.concatenate([c.positions for c in chunks]).tolist()
    expected = np.cumsum([0] + [len(r) + 16 for r in RECORDS[:49]]).tolist()
    assert positions == expected[:20] + expected[21:]


@pytest.mark.parametrize("compression, suffix", [("GZIP", ".gz"), ("ZLIB", ".zz")])
def test_truncated_compressed_file_is_reported_and_skip_keeps_what_inflates(tmp_path, compression, suffix):
    records = [os.urandom(200) for _ in range(1000)]
    url = str(tmp_path / f"t.tfrecord{suffix}")
    tfr.write_records(url, records, compression=compression)
    data = open(url, "rb").read()
    open(url, "wb").write(data[:-20])
    with pytest.raises(CorruptRecordError) as info:
        _flatten(iter_frame_chunks(url))
    assert "t.tfrecord" in str(info.value)
    ours, ref = tfr.ReadStats(), tfr.ReadStats()
    got = _flatten(iter_frame_chunks(url, on_corrupt="skip", stats=ours))
    want = list(tfr.read_records(url, on_corrupt="skip", stats=ref))
    assert got == want == records[:len(got)]
    assert len(got) >= 900  # everything the damaged stream still inflates, not nothing
    assert ours.corrupt and ours.records == len(got)


def test_tiny_chunk_size_and_stray_tail_bytes_do_not_hang(tmp_path):
    url = str(tmp_path / "s.tfrecord")
    tfr.write_records(url, [b"abc", b"defgh"])
    data = open(url, "rb").read()
    open(url, "wb").write(data[:-15])
    stats = tfr.ReadStats()
    got = _flatten(iter_frame_chunks(url, chunk_size=5, on_corrupt="skip", stats=stats))
    assert got == [b"abc"] and stats.skipped_records == 1

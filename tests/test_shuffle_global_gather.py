"""The gather of shuffle="global": one native copy per chunk that checks every frame, the
reference path at a bad one, the same records in the same order, a small index."""

from __future__ import annotations

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.formats.index import load_index
from shardfeed.pipeline import gather as gather_mod
from shardfeed.pipeline.permute import Permutation
from shardfeed.pipeline.spans import GlobalIndex, file_spans

from .test_pipeline_helpers import SPEC, write_sized_shards

native = pytest.importorskip("shardfeed._native")
SIZES = [50, 70, 30]


def _files(tmp_path, sizes=SIZES):
    return write_sized_shards(tmp_path, sizes, index=True, prefix="g")


def _ids(ds):
    return [int(v) for b in ds for v in np.atleast_1d(b["id"])]


def _expected(files, seed):
    """Every record's id in the order of the global permutation (reader 0 of 1, epoch 0)."""
    ids = [f * 1000 + i for f, n in enumerate(SIZES) for i in range(n)]
    return [ids[k] for k in Permutation(len(ids), (seed, 0)).take(0, len(ids)).tolist()]


def _frame_of(url, record):
    idx = load_index(url, None, build=False)
    return int(idx[record, 0]), int(idx[record, 1])


@pytest.mark.parametrize("window", [7, 64, None])
def test_fused_gather_delivers_the_permutation_order(tmp_path, window):
    files = _files(tmp_path)
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=4, block_size=window).batch(16)
    assert _ids(ds) == _expected(files, 4)
    assert _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=4, block_size=window)) == _expected(files, 4)


@pytest.mark.parametrize("where, check", [(14, "data crc"), (9, "length crc")])
def test_corrupt_record_in_fused_global_batches_names_file_and_offset(tmp_path, where, check):
    files = _files(tmp_path)
    start, length = _frame_of(files[1], 33)
    with open(files[1], "r+b") as f:
        f.seek(start + where)  # 14: inside the record's data; 9: inside its length's CRC
        b = f.read(1)
        f.seek(start + where)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(sf.CorruptRecordError) as info:
        _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=4, block_size=32).batch(8))
    assert info.value.check == check and info.value.offset == start and "g-001" in str(info.value)
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=4, block_size=32, on_corrupt="skip")
    got = _ids(ds.batch(8))
    assert got == [i for i in _expected(files, 4) if i != 1033]
    assert ds.read_stats.skipped_records == 1 and ds.read_stats.records == sum(SIZES) - 1


def test_a_file_shorter_than_its_index_is_named(tmp_path):
    files = _files(tmp_path)
    start, _ = _frame_of(files[2], 20)
    with open(files[2], "r+b") as f:
        f.truncate(start + 5)
    with pytest.raises(sf.CorruptRecordError, match=r"g-002.*truncated"):
        _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=1).batch(10))


def test_gather_frames_checks_every_frame(tmp_path):
    files = _files(tmp_path, [5])
    data = open(files[0], "rb").read()
    idx = np.asarray(load_index(files[0], None, build=False), dtype=np.int64)
    offs, lens = idx[::-1, 0].copy(), idx[::-1, 1].copy()  # backwards: the order is the caller's
    dst = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.int64)
    which = np.zeros(len(offs), np.int64)
    size = int(lens.sum())
    buf, bad, code = native.gather_frames(size, dst, (data,), which, offs, lens, None, True)
    assert (bad, code) == (5, 0)
    assert bytes(buf) == b"".join(data[o:o + n] for o, n in zip(offs.tolist(), lens.tolist()))
    order = np.array([4, 0, 3, 1, 2], np.int64)
    again, bad, code = native.gather_frames(size, dst, (data,), which, offs, lens, order, True)
    assert (bad, code) == (5, 0) and bytes(again) == bytes(buf)
    for what, src, ln, want in [
        ("data crc", data[:offs[2] + 20] + bytes([data[offs[2] + 20] ^ 1]) + data[offs[2] + 21:], lens, (2, 2)),
        ("length crc", data[:offs[3] + 9] + bytes([data[offs[3] + 9] ^ 1]) + data[offs[3] + 10:], lens, (3, 1)),
        ("length mismatch", data, lens + np.array([0, 1, 0, 0, 0]), (1, 3)),
        ("past the source", data[:offs[0]], lens, (0, 4)),
    ]:
        _, bad, code = native.gather_frames(size + 1, dst, (src,), which, offs, ln, None, True)
        assert (bad, code) == want, what
    # without CRCs, a bad CRC goes through (the scan checks nothing more either)
    flipped = data[:offs[2] + 20] + bytes([data[offs[2] + 20] ^ 1]) + data[offs[2] + 21:]
    assert native.gather_frames(size, dst, (flipped,), which, offs, lens, None, False)[1:] == (5, 0)
    # ranges outside the destination, or a source that does not exist, are refused
    assert native.gather_frames(size - 1, dst, (data,), which, offs, lens, None, True)[1:] == (4, 4)
    assert native.gather_frames(size, dst, (data,), which + 1, offs, lens, None, True)[1:] == (0, 4)
    assert native.gather_frames(size, dst, (data,), which, offs, lens, order + 1, True)[1:] == (0, 4)
    with pytest.raises(ValueError):
        native.gather_frames(size, dst[:2], (data,), which, offs, lens, None, True)


def test_global_index_keeps_under_16_bytes_a_record(tmp_path):
    files = _files(tmp_path, [300, 200])
    g = GlobalIndex.of(file_spans(files), None, None, None)
    assert g.n == 500 and g.nbytes / g.n < 16
    ids = np.array([0, 299, 300, 499, 17], np.int64)
    plan = g.plan(ids)
    assert plan.files.tolist() == [0, 0, 1, 1, 0]
    idx0 = load_index(files[0], None, build=False)
    assert int(plan.offsets[1]) == int(idx0[299, 0]) and int(plan.lengths[1]) == int(idx0[299, 1])


def test_reference_path_without_the_native_gather(tmp_path, monkeypatch):
    files = _files(tmp_path)
    fused = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=9, block_size=40).batch(8))
    monkeypatch.setattr(gather_mod, "_gather_frames", None)
    assert _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=9, block_size=40).batch(8)) == fused


def _damage(files, records=(33, 7)):
    """Two shards damaged with no index beside them: one record's data byte flipped in the
    second, one record's length CRC in the third (``records``: which); the ids lost."""
    lost = []
    for f, record, where in [(1, records[0], 14), (2, records[1], 9)]:
        start, _ = _frame_of(files[f], record)
        with open(files[f], "r+b") as fh:
            fh.seek(start + where)
            b = fh.read(1)
            fh.seek(start + where)
            fh.write(bytes([b[0] ^ 0xFF]))
        lost.append(f * 1000 + record)
    for f in files:
        import os

        os.remove(f + ".idx")
    return lost


@pytest.mark.parametrize("records", [(33, 7), (32, 29), (0, 16)])  # inside a block; at a block's edge, the end, the start
@pytest.mark.parametrize("shuffle, block_size", [("global", None), ("global", 16), ("blocks", None), ("blocks", 16)])
def test_a_shuffle_building_the_index_of_a_corrupt_shard_skips_and_counts_as_the_record_reader_does(
        tmp_path, shuffle, block_size, records):
    import os

    files = _files(tmp_path)
    lost = _damage(files, records)
    every = {f * 1000 + i for f, n in enumerate(SIZES) for i in range(n)}
    seq = sf.read_tfrecord(files, spec=SPEC, on_corrupt="skip")
    want = _ids(seq.batch(8))
    assert sorted(want) == sorted(every - set(lost))  # the sequential reader's own skips, for reference
    with pytest.raises(sf.CorruptRecordError, match=r"g-00[12].*(data|length) crc"):
        _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=shuffle, seed=3, block_size=block_size).batch(8))
    seen = []
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle=shuffle, seed=3, block_size=block_size, on_corrupt="skip",
                          on_error=lambda err, ctx: seen.append((ctx["url"], ctx["offset"])) or None)
    for epoch in range(2):  # every pass reports what it misses, not only the one that built the index
        seen.clear()
        got = _ids(ds.batch(8))
        assert sorted(got) == sorted(want), epoch
        assert seq.read_stats.skipped_records == 2
        assert ds.read_stats.skipped_records == 2 * (epoch + 1)  # read_stats adds up the passes
        assert sorted(os.path.basename(u) for u, _ in seen) == ["g-001.tfrecord", "g-002.tfrecord"]
    # the damaged shards' indexes were not saved (a saved index tiles its shard); the intact one's was
    assert [os.path.exists(f + ".idx") for f in files] == [True, False, False]


@pytest.mark.parametrize("records", [(33, 7), (32, 29), (0, 16)])
@pytest.mark.parametrize("shuffle", ["global", "blocks"])
def test_readers_of_a_shuffle_over_a_corrupt_shard_report_its_damage_once_between_them(tmp_path, shuffle, records):
    files = _files(tmp_path)
    lost = _damage(files, records)
    got, skipped = [], 0
    for i in range(3):
        ds = sf.read_tfrecord(files, spec=SPEC, shuffle=shuffle, seed=5, block_size=8, on_corrupt="skip",
                              slice_id=i, slice_count=3)
        got += _ids(ds.batch(4))
        skipped += ds.read_stats.skipped_records
    assert sorted(got) == sorted({f * 1000 + i for f, n in enumerate(SIZES) for i in range(n)} - set(lost))
    assert skipped == 2


def test_a_global_shuffle_over_a_shard_cut_after_its_index_was_made_skips_the_cut_frame(tmp_path):
    files = _files(tmp_path)
    start, _ = _frame_of(files[2], 29)  # the last record of g-002
    with open(files[2], "r+b") as f:
        f.truncate(start + 20)
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=1, on_corrupt="skip")
    got = _ids(ds.batch(10))
    assert sorted(got) == sorted({f * 1000 + i for f, n in enumerate(SIZES) for i in range(n)} - {2029})
    assert ds.read_stats.skipped_records == 1


@pytest.mark.parametrize("shuffle, block_size", [("global", None), ("blocks", None), ("blocks", 16)])
def test_a_shard_of_garbage_without_a_record_is_counted_once_under_a_shuffle(tmp_path, shuffle, block_size):
    files = _files(tmp_path)
    junk = str(tmp_path / "g-003.tfrecord")
    with open(junk, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    files.append(junk)
    seq = sf.read_tfrecord(files, spec=SPEC, on_corrupt="skip")
    want = sorted(_ids(seq.batch(8)))
    for seed in range(4):
        # epochs of repeat(4) deal the garbage file's block to one reader, then the other; a later
        # epoch finds its index loaded (found from outside: then counted by both)
        got, skipped = [], 0
        for i in range(2):
            ds = sf.read_tfrecord(files, spec=SPEC, shuffle=shuffle, seed=seed, block_size=block_size,
                                  on_corrupt="skip", slice_id=i, slice_count=2)
            got += _ids(ds.repeat(4).batch(8))
            skipped += ds.read_stats.skipped_records
        assert sorted(got) == sorted(4 * want) and len(want) == sum(SIZES)
        assert skipped == 4 * seq.read_stats.skipped_records >= 4, seed


def _run(files, in_place, batch, window, policy):
    from shardfeed.pipeline import gather as gather_mod

    saved = gather_mod.IN_PLACE
    gather_mod.IN_PLACE = in_place
    try:
        ds = sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=9, block_size=window, on_corrupt=policy)
        try:
            return _ids(ds.batch(batch)), ds.read_stats.skipped_records, ds.read_stats.records, None
        except sf.CorruptRecordError as exc:
            return None, None, None, (exc.check, exc.offset, exc.url)
    finally:
        gather_mod.IN_PLACE = saved


@pytest.mark.parametrize("seed", range(12))
def test_records_parsed_in_place_agree_with_the_copying_gather_on_damaged_shards(tmp_path, seed):
    """The parse threads' frame checks (records left in the mapped files) against the gather
    that copies and checks each frame: the same records in the same order, the same skips,
    the same error, on random damage (bit flips in headers, data and footers; a length field
    edited with its CRC made right, so only the index disagrees)."""
    import struct

    from shardfeed.formats.crc import masked_crc32c

    rng = np.random.default_rng(seed)
    files = _files(tmp_path)
    for _ in range(int(rng.integers(1, 4))):
        f = files[int(rng.integers(0, len(files)))]
        idx = load_index(f, None, build=False)
        r = int(rng.integers(0, len(idx)))
        start, length = int(idx[r, 0]), int(idx[r, 1])
        data = bytearray(open(f, "rb").read())
        if rng.random() < 0.3:  # a length that lies, with its CRC recomputed
            n = struct.unpack_from("<Q", data, start)[0] + int(rng.choice([-3, 5, 100]))
            struct.pack_into("<QI", data, start, n, masked_crc32c(struct.pack("<Q", n)))
        else:
            data[start + int(rng.integers(0, length))] ^= 1 << int(rng.integers(0, 8))
        open(f, "wb").write(bytes(data))
    batch, window = int(rng.choice([1, 7, 64])), int(rng.choice([5, 13, 64]))
    for policy in ("skip", "raise"):
        assert _run(files, True, batch, window, policy) == _run(files, False, batch, window, policy), policy


def test_frames_in_place_are_checked_by_the_parser():
    from shardfeed.formats.crc import masked_crc32c
    from shardfeed.formats.native import IN_FRAME, Buffers, parse_example_batch

    from .test_pipeline_helpers import example

    recs = [example(i) for i in range(5)]
    frames = [len(r).to_bytes(8, "little") + masked_crc32c(len(r).to_bytes(8, "little")).to_bytes(4, "little") + r
              + masked_crc32c(r).to_bytes(4, "little") for r in recs]
    a, b = b"".join(frames[:3]), b"".join(frames[3:])
    starts = [0, len(frames[0]), len(frames[0]) + len(frames[1]), 0, len(frames[3])]
    offsets = np.array([s + 12 for s in starts], np.int64)
    lengths = np.array([len(r) for r in recs], np.int64)
    which = np.array([0, 0, 0, 1, 1], np.int64)
    cols = parse_example_batch((Buffers((a, b), which), offsets, lengths), SPEC, crcs=IN_FRAME)
    assert cols["id"].ravel().tolist() == [0, 1, 2, 3, 4]
    for where, at in [(starts[1] + 3, 1), (starts[1] + 9, 1), (starts[2] + 20, 2), (len(a) - 2, 2)]:
        bad = bytearray(a)  # the length field, its CRC, the data, the data CRC of one record
        bad[where] ^= 4
        with pytest.raises(sf.CorruptRecordError) as info:
            parse_example_batch((Buffers((bytes(bad), b), which), offsets, lengths), SPEC, crcs=IN_FRAME)
        assert info.value.record_index == at
    with pytest.raises(ValueError, match="outside the buffer"):  # a frame that would start before its buffer
        parse_example_batch((a, offsets[:1] - 12, lengths[:1]), SPEC, crcs=IN_FRAME)


def test_shuffles_over_more_files_than_open_files_allowed(tmp_path):
    """Every file of a pass stays mapped while the pass gathers from it, and a buffer shuffle
    holds chunks (maps) of the files its buffer spans: the maps must not hold a descriptor
    each (under a limit of 128 open files, 300 files)."""
    import subprocess
    import sys
    import textwrap

    files = write_sized_shards(tmp_path, [3] * 300, index=True, prefix="m")
    script = textwrap.dedent(f"""
        import resource, sys
        import shardfeed as sf
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        files = {files!r}
        spec = {{"id": sf.FixedLen("int64")}}
        want = sorted(f * 1000 + i for f in range(300) for i in range(3))
        for ds in (sf.read_tfrecord(files, spec, shuffle="global", seed=1).batch(64),
                   sf.read_tfrecord(files, spec).shuffle(800, seed=1).batch(64),  # chunks of ~270 files held
                   sf.read_tfrecord(files, spec, shuffle="blocks", seed=1).batch(64)):
            ids = sorted(int(v) for b in ds for v in b["id"])
            assert ids == want, len(ids)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_map_file_maps_the_whole_file_and_keeps_no_descriptor(tmp_path):
    import os

    p = tmp_path / "x.bin"
    p.write_bytes(bytes(range(256)) * 40)
    before = set(os.listdir("/proc/self/fd"))
    m = native.map_file(str(p))
    assert set(os.listdir("/proc/self/fd")) == before  # nothing left open
    assert len(m) == 10240 and bytes(memoryview(m)) == p.read_bytes() and memoryview(m).readonly
    (tmp_path / "empty").write_bytes(b"")
    assert native.map_file(str(tmp_path / "empty")) == b""
    with pytest.raises(FileNotFoundError):
        native.map_file(str(tmp_path / "missing"))
    view = memoryview(m)
    del m  # a view keeps the map alive
    assert bytes(view[:3]) == b"\x00\x01\x02"


@pytest.mark.parametrize("wide", [False, True])
def test_native_window_plan_matches_numpy(monkeypatch, wide):
    # files of 5, 0 (empty), 7 and 3 records; the second-to-last's numbers unknown (-1);
    # lengths uint32, or int64 where a frame is 4 GiB or more
    from shardfeed.pipeline import spans as spans_mod

    rng = np.random.default_rng(3)
    sizes = [5, 0, 7, 3]
    indexes = []
    for n in sizes:
        offs = np.cumsum(rng.integers(20, 90, n)) if n else np.zeros(0, np.int64)
        lens = rng.integers(4, 60, n) + (1 << 33 if wide else 0)
        indexes.append(np.stack([offs, lens], axis=1).astype(np.int64).reshape(n, 2))
    g = GlobalIndex([f"f{i}" for i in range(4)], indexes, first=[3, 0, -1, 10])
    assert g.lengths.dtype == (np.int64 if wide else np.uint32)
    ids = rng.permutation(g.n)
    native = g.plan(ids)
    assert spans_mod._native_plan_window is not None
    monkeypatch.setattr(spans_mod, "_native_plan_window", None)
    ref = g.plan(ids)
    for name in ("files", "offsets", "lengths", "virtual", "numbers"):
        assert np.array_equal(getattr(native, name), getattr(ref, name)), name
    assert native.numbers.tolist().count(-1) == 7  # the records of the file whose numbers are unknown
    from shardfeed._native import plan_window

    out = np.empty((5, 1), np.int64)
    for bad in (g.n, -1):  # the binding refuses an id outside the records
        with pytest.raises(ValueError, match="plan_window"):
            plan_window(np.array([bad]), g.offsets, g.lengths, g.before, g.first, *out)


def test_maps_kept_between_windows_let_go_of_deleted_and_changed_files(tmp_path, monkeypatch):
    """The files a global shuffle keeps mapped for later windows and datasets (found from
    outside: 180 maps of deleted files over 90 datasets, their disk space still in use): a
    file changed since is mapped afresh and its old map let go at once; one deleted is let go
    at the next look (every ``PRUNE_EVERY`` maps made)."""
    import os

    from shardfeed.pipeline import gather as gather_mod

    monkeypatch.setattr(gather_mod, "PRUNE_EVERY", 1)
    spec = {"x": sf.FixedLen("int64")}

    def write(path: str, n: int) -> None:
        with sf.TFRecordWriter(path, index=True) as w:
            for i in range(n):
                w.write(sf.encode_example({"x": [i]}))

    def kept(path: str) -> int:
        return sum(1 for k in list(gather_mod._maps) if k[0] == path)

    a, b = str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")
    write(a, 50)
    write(b, 60)
    assert len(list(sf.read_tfrecord(a, spec, shuffle="global", seed=1))) == 50 and kept(a) == 1
    write(a, 70)  # changed: a new map, the old one gone
    assert len(list(sf.read_tfrecord(a, spec, shuffle="global", seed=1))) == 70 and kept(a) == 1
    os.remove(a)
    os.remove(a + ".idx")
    assert len(list(sf.read_tfrecord(b, spec, shuffle="global", seed=1))) == 60
    assert kept(a) == 0 and kept(b) == 1

"""Shuffle modes on the source: seeded file and block orders, split among readers, resumable."""

from __future__ import annotations

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.pipeline import check_resume_everywhere
from shardfeed.pipeline.permute import Permutation

from .test_pipeline_helpers import SPEC, example, write_sized_shards

SIZES = [40, 3, 25, 0, 17, 60]


def _files(tmp_path, sizes=SIZES, index=False):
    return write_sized_shards(tmp_path, sizes, index=index, prefix="m")


def _all(sizes=SIZES):
    return sorted(f * 1000 + i for f, n in enumerate(sizes) for i in range(n))


def _ids(ds):
    return [int(v) for b in ds for v in np.atleast_1d(b["id"])]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 64, 1000, 4097])
def test_permutation_is_a_seeded_bijection(n):
    p = Permutation(n, (7, 0))
    got = p.take(0, n).tolist()
    assert sorted(got) == list(range(n))
    assert got == Permutation(n, (7, 0)).take(0, n).tolist()
    if n > 8:
        assert got != Permutation(n, (7, 1)).take(0, n).tolist()
        assert got != list(range(n))
        assert [p[i] for i in (0, n // 2, n - 1)] == [got[0], got[n // 2], got[-1]]
    with pytest.raises(IndexError):
        p[n]


@pytest.mark.parametrize("mode", ["files", "blocks", "global"])
@pytest.mark.parametrize("readers", [1, 2, 3, 7])
def test_every_record_once_per_epoch_across_readers(tmp_path, mode, readers):
    files = _files(tmp_path)
    got = []
    for r in range(readers):
        ds = sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=5, block_size=8, slice_id=r, slice_count=readers)
        got += _ids(ds.batch(4))
    assert sorted(got) == _all()


@pytest.mark.parametrize("mode", ["files", "blocks", "global"])
def test_same_seed_same_order_and_each_epoch_differs(tmp_path, mode):
    files = _files(tmp_path)
    one = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=3, block_size=8).batch(5))
    two = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=3, block_size=8).batch(5))
    other = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=4, block_size=8).batch(5))
    assert one == two and sorted(one) == _all()
    assert one != other
    epochs = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=3, block_size=8).repeat(2).batch(5))
    first, second = epochs[: len(one)], epochs[len(one):]
    assert sorted(first) == sorted(second) == _all() and first != second
    if mode == "blocks":  # blocks of one file are read in sequence, in an order across files
        runs = sum(1 for a, b in zip(one, one[1:]) if b != a + 1)
        assert runs >= 8  # far more breaks than the 5 file boundaries of the plain order


@pytest.mark.parametrize("mode", ["files", "blocks", "global"])
def test_shuffled_source_resumes_at_every_step(tmp_path, mode):
    files = _files(tmp_path, [9, 4, 7])
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=2, block_size=3, num_parallel_reads=2).batch(2)
    assert check_resume_everywhere(ds) >= 10
    assert check_resume_everywhere(sf.read_tfrecord(files, shuffle=mode, seed=2, block_size=3).repeat(2), every=3)


def test_shuffle_needs_a_seed_and_a_known_mode(tmp_path):
    files = _files(tmp_path, [3])
    with pytest.raises(ValueError, match="needs a seed"):
        sf.read_tfrecord(files, shuffle="files")
    with pytest.raises(ValueError, match="shuffle must be one of"):
        sf.read_tfrecord(files, shuffle="global!", seed=1)
    with pytest.raises(ValueError, match="slice_id and slice_count"):
        sf.read_tfrecord(files, slice_id=0)


def test_blocks_of_a_compressed_file_say_why_not(tmp_path):
    p = str(tmp_path / "z.tfrecord.gz")
    sf.write_records(p, [example(i) for i in range(5)], compression="GZIP")
    with pytest.raises(ValueError, match="compressed"):
        list(sf.read_tfrecord(p, shuffle="blocks", seed=1))
    with pytest.raises(ValueError, match="compressed"):
        list(sf.read_tfrecord(p, shuffle="global", seed=1))
    assert sorted(int(r) for r in (sf.decode_example(x)["id"][0] for x in sf.read_tfrecord(p, shuffle="files", seed=1))) \
        == list(range(5))


def test_a_queue_refuses_a_source_shuffle(tmp_path):
    q = sf.WorkQueue(_files(tmp_path, [3]), backend="memory", name="no-source-shuffle")
    with pytest.raises(ValueError, match="WorkQueue"):
        sf.read_tfrecord(q, shuffle="files", seed=1)


def test_to_torch_readers_take_their_share_of_each_epoch(tmp_path):
    from shardfeed.adapters.torch import split_for_reader

    files = _files(tmp_path)
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle="blocks", seed=9, block_size=6).batch(4)
    got = [_ids(split_for_reader(ds, r, 3)) for r in range(3)]
    assert sorted(got[0] + got[1] + got[2]) == _all()
    assert all(got)


# -- shuffle="global" -------------------------------------------------------------------------
def test_global_shuffle_mixes_every_file_into_every_window(tmp_path):
    files = _files(tmp_path, [200, 200, 200, 200])
    ids = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=9, block_size=64).batch(100))
    assert sorted(ids) == sorted(f * 1000 + i for f in range(4) for i in range(200))
    for b in range(0, 800, 100):  # each batch of 100 draws from all four files, none dominating
        share = np.bincount([i // 1000 for i in ids[b:b + 100]], minlength=4).max() / 100
        assert share < 0.45
    order = Permutation(800, (9, 0)).take(0, 800).tolist()
    ranks = [f * 200 + i for f, i in ((x // 1000, x % 1000) for x in ids)]
    assert ranks == order  # exactly the permutation of the epoch


@pytest.mark.parametrize("before,after", [(4, 2), (4, 8), (3, 5), (2, 1)])
def test_global_shuffle_resumes_on_another_number_of_readers(tmp_path, before, after):
    files = _files(tmp_path, [300, 7, 250, 120])
    every = sorted(f * 1000 + i for f, n in enumerate([300, 7, 250, 120]) for i in range(n))

    def reader(k, count):
        return sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=4, block_size=32, slice_id=k,
                                slice_count=count).batch(10)

    seen, states = [], []
    for k in range(before):  # every reader delivers the same number of batches, then saves
        it = iter(reader(k, before))
        for _ in range(7):
            seen += [int(v) for v in next(it)["id"]]
        states.append(it.get_state())
    rest = []
    for k in range(after):
        it = iter(reader(k, after))
        it.set_state(states[k % before])  # any reader's state
        rest += [int(v) for b in it for v in b["id"]]
    assert sorted(seen + rest) == every  # every record exactly once, none missing


def test_global_shuffle_state_is_small_and_resumes_without_a_replay(tmp_path):
    import json

    from shardfeed.pipeline.spans import DEFAULT_WINDOW

    files = _files(tmp_path, [5000, 5000])
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=1).batch(64)
    it = iter(ds)
    for _ in range(120):  # 7,680 records taken
        next(it)
    state = it.get_state()
    assert len(json.dumps(state)) < 1024
    source = sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=1)  # its own read_stats
    it2 = iter(source.batch(64))
    it2.set_state(state)
    first = next(it2)
    it2.close()  # what it read is counted in source.read_stats by now
    # the work done, not a wall time: the resumed pass gathered from the saved window on (a
    # window of 2,048 positions; allow one more read ahead), never the 7,680 records before
    # the saved position again
    assert 64 <= source.read_stats.records <= 2 * DEFAULT_WINDOW, source.read_stats
    assert [int(v) for v in first["id"]] == [int(v) for v in next(it)["id"]]


def test_global_shuffle_names_a_corrupt_record_in_its_own_file(tmp_path):
    files = _files(tmp_path, [50, 50], index=True)
    with open(files[1], "r+b") as f:
        f.seek(16 * 20 + 200)  # inside some record's data
        f.write(b"\xff\xff\xff")
    with pytest.raises(sf.CorruptRecordError, match=r"m.*1.*byte offset"):
        list(sf.read_tfrecord(files, shuffle="global", seed=2, block_size=16))
    ds = sf.read_tfrecord(files, shuffle="global", seed=2, block_size=16, on_corrupt="skip")
    got = list(ds)
    assert len(got) == 99 and ds.read_stats.skipped_records == 1


def test_global_shuffle_builds_missing_indexes(tmp_path):
    import os

    files = _files(tmp_path, [30, 30])
    assert not os.path.exists(files[0] + ".idx")
    assert len(list(sf.read_tfrecord(files, shuffle="global", seed=1))) == 60
    assert os.path.exists(files[0] + ".idx")  # built on the fly beside the shard


def test_a_state_of_another_shuffle_mode_is_refused_clearly(tmp_path):
    files = _files(tmp_path, [30, 30])
    it = iter(sf.read_tfrecord(files, shuffle="files", seed=1))
    next(it)
    state = it.get_state()
    it2 = iter(sf.read_tfrecord(files, shuffle="global", seed=1, slice_id=0, slice_count=2))
    with pytest.raises(ValueError, match="shuffle='global'"):
        it2.set_state(state)
        next(it2)


# -- blocks by bytes (block_size=None, the default) -------------------------------------------

def _block_bytes(monkeypatch, n):
    import shardfeed.pipeline.spans as spans

    monkeypatch.setattr(spans, "DEFAULT_BLOCK_BYTES", n)


def test_default_blocks_are_cut_by_bytes_through_the_record_offsets(tmp_path, monkeypatch):
    import os

    from shardfeed.formats.index import load_index
    from shardfeed.pipeline.spans import STEP, Span, block_spans, cut_step

    _block_bytes(monkeypatch, 1000)
    small = str(tmp_path / "small.tfrecord")
    big = str(tmp_path / "big.tfrecord")
    sf.write_records(small, [b"s" * 40] * 100, index=False)  # 56-byte frames
    sf.write_records(big, [b"b" * 300] * 20 + [b"x" * 5000] + [b"b" * 300] * 3, index=False)  # 316, one 5016
    steps = block_spans([Span(small), Span(big)], None)
    # the cut needs the files' sizes only: no index file was read or built for it
    assert not os.path.exists(small + ".idx") and not os.path.exists(big + ".idx")
    assert all(s.handle == STEP for s in steps)
    assert [(s.url, s.offset, s.end) for s in steps] == [(small, k * 1000, min(5600, k * 1000 + 1000)) for k in
                                                         range(6)] + [(big, k * 1000, min(12284, k * 1000 + 1000))
                                                                      for k in range(13)]
    cut = [cut_step(s, load_index(s.url, build=True)) for s in steps]
    blocks = [b for b in cut if b is not None]
    # the 5,016-byte record spans steps 7 to 10; nothing starts in the last 284 bytes
    assert [k for k, b in enumerate(cut[6:]) if b is None] == [7, 8, 9, 10, 12]
    assert [b.records for b in blocks if b.url == small] == [18] * 5 + [10]  # 18 * 56 = 1008 >= 1000
    # 316-byte frames at 0, 316, ...; the 5,016-byte record 20 starts at 6,320 (with 19
    # in the seventh step), and the three after it start in the twelfth
    assert [b.records for b in blocks if b.url == big] == [4, 3, 3, 3, 3, 3, 2, 3]
    for mine, b in zip(blocks, blocks[1:]):  # in order, no gap, no overlap
        assert b.start == (mine.stop if b.url == mine.url else 0)
    for b in blocks:  # each block: the frames that start within one 1,000-byte step of its file
        idx = load_index(b.url)
        assert len({int(o) // 1000 for o in idx[b.start:b.stop, 0]}) == 1
        assert b.end - b.offset < 1000 + int(idx[b.stop - 1, 1])


@pytest.mark.parametrize("readers", [1, 3])
def test_default_blocks_deliver_every_record_once_and_resume(tmp_path, monkeypatch, readers):
    _block_bytes(monkeypatch, 600)  # about 15 of these records a block
    files = _files(tmp_path)
    got = []
    for r in range(readers):
        ds = sf.read_tfrecord(files, spec=SPEC, shuffle="blocks", seed=5, slice_id=r, slice_count=readers)
        got += _ids(ds.batch(4))
    assert sorted(got) == _all()
    runs = sum(1 for a, b in zip(got, got[1:]) if b != a + 1)
    assert runs >= 6  # blocks of files, not whole files in sequence
    ds = sf.read_tfrecord(files[:3], spec=SPEC, shuffle="blocks", seed=2, num_parallel_reads=2).batch(3)
    assert check_resume_everywhere(ds, every=2) >= 5


def test_default_block_order_depends_on_the_files_not_on_where_they_are(tmp_path, monkeypatch):
    import fsspec

    _block_bytes(monkeypatch, 600)
    files = _files(tmp_path)
    mem = fsspec.filesystem("memory")
    remote = []
    for f in files:
        url = f"memory://order-{uuid4_hex()}/{f.rsplit('/', 1)[-1]}"
        with open(f, "rb") as src, mem.open(url, "wb") as dst:
            dst.write(src.read())
        remote.append(url)
    local = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="blocks", seed=11).batch(7))
    elsewhere = _ids(sf.read_tfrecord(remote, spec=SPEC, shuffle="blocks", seed=11).batch(7))
    assert local == elsewhere and sorted(local) == _all()
    again = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle="blocks", seed=11).batch(7))
    assert again == local


def uuid4_hex():
    import uuid

    return uuid.uuid4().hex[:8]


def test_a_blocks_state_resumes_only_with_the_block_cut_it_was_saved_with(tmp_path):
    files = _files(tmp_path, [40, 30])

    def state_after(n, **kw):
        it = iter(sf.read_tfrecord(files, shuffle="blocks", seed=1, **kw))
        for _ in range(n):
            next(it)
        return it.get_state()

    import json

    by_records = state_after(9, block_size=8)
    assert by_records["root"]["spans"]["blocks"] == "records:8"
    assert len(json.dumps(state_after(9))) < 1024  # the cut costs the state a few bytes
    it = iter(sf.read_tfrecord(files, shuffle="blocks", seed=1))  # default: by bytes
    with pytest.raises(ValueError, match=r"records:8.*block_size=8"):
        it.set_state(by_records)
        next(it)
    by_bytes = state_after(9)
    it = iter(sf.read_tfrecord(files, shuffle="blocks", seed=1, block_size=8))
    with pytest.raises(ValueError, match=r"bytes:.*block_size=None"):
        it.set_state(by_bytes)
        next(it)
    # a state saved before blocks were cut by bytes has no "blocks": by records, as given then
    legacy = {**by_records, "root": {**by_records["root"], "spans": {"i": by_records["root"]["spans"]["i"]}}}
    it = iter(sf.read_tfrecord(files, shuffle="blocks", seed=1))
    with pytest.raises(ValueError, match="earlier version.*block_size=2048"):
        it.set_state(legacy)
        next(it)
    whole = list(sf.read_tfrecord(files, shuffle="blocks", seed=1, block_size=8))
    it = iter(sf.read_tfrecord(files, shuffle="blocks", seed=1, block_size=8))
    it.set_state(legacy)
    assert list(it) == whole[9:]


def test_remote_records_close_together_share_one_ranged_read():
    from shardfeed.pipeline.gather import coalesce

    # (file, offset, length, destination): file 1's first two are 10 bytes apart, its third
    # 200 bytes after; file 0's two touch; the last would make a read past the limit
    records = [(1, 100, 50, 0), (0, 0, 30, 50), (1, 160, 40, 80), (1, 400, 10, 120), (0, 30, 20, 130),
               (0, 60, 100, 150)]
    assert coalesce(records, gap=20, limit=120) == [
        (0, 0, 50, [(0, 30, 50), (30, 20, 130)]),
        (0, 60, 160, [(60, 100, 150)]),  # 0..160 would be 160 bytes > 120
        (1, 100, 200, [(100, 50, 0), (160, 40, 80)]),
        (1, 400, 410, [(400, 10, 120)]),
    ]
    assert len(coalesce(records, gap=-1, limit=10_000)) == len(records)  # nothing shared: one read a record
    assert len(coalesce(records, gap=1000, limit=10_000)) == 2  # one read a file


def test_default_blocks_of_record_ranges_count_their_steps_from_the_first_record(tmp_path, monkeypatch):
    from shardfeed.formats.index import load_index
    from shardfeed.pipeline.spans import StaticSpans, block_spans, range_spans

    _block_bytes(monkeypatch, 600)
    files = _files(tmp_path, [40, 60], index=True)
    idx = [load_index(f) for f in files]
    ranges = range_spans(files[0], idx[0], 5, 37) + range_spans(files[1], idx[1], 11, 60)
    for b in block_spans(ranges, None):  # cut at once, through the index
        first = ranges[0] if b.url == files[0] else ranges[1]
        i = idx[0] if b.url == files[0] else idx[1]
        assert len({(int(o) - first.offset) // 600 for o in i[b.start:b.stop, 0]}) == 1
    got = _ids(sf.read_tfrecord(StaticSpans(ranges), spec=SPEC, shuffle="blocks", seed=4).batch(5))
    assert sorted(got) == list(range(5, 37)) + list(range(1011, 1060))


def test_a_blocks_shuffled_source_pickles_with_its_order(tmp_path):
    import pickle

    files = _files(tmp_path)
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle="blocks", seed=6, block_size=None).batch(4)
    first = _ids(ds)  # the indexes are loaded now, and travel with the provider
    assert _ids(pickle.loads(pickle.dumps(ds))) == first and sorted(first) == _all()


@pytest.mark.parametrize("mode", ["files", "blocks"])
def test_repeat_goes_on_past_an_epoch_in_which_a_reader_was_dealt_only_empty_files(tmp_path, mode):
    """Found from outside: three readers of three files, one of them empty; an epoch in which
    a reader's share was the empty file ended its repeat(2), and its records of the next
    epoch were never delivered (100 of 200, for 3 seeds of 6)."""
    files = write_sized_shards(tmp_path, [30, 0, 30], prefix="r")
    want = sorted(2 * [f * 1000 + i for f, n in enumerate([30, 0, 30]) for i in range(n)])
    for seed in range(6):
        got = []
        for r in range(3):
            got += _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=seed, slice_id=r, slice_count=3)
                        .repeat(2))
        assert sorted(got) == want, seed
    # forever: an epoch of nothing is not the end either, while later epochs give records
    ds = sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=1, slice_id=0, slice_count=3).repeat()
    assert len(_ids(ds.take(200))) == 200


@pytest.mark.parametrize("batched", [False, True])
def test_an_error_names_the_frame_by_its_number_in_the_file_whatever_block_it_was_read_in(tmp_path, batched):
    """Found from outside: under shuffle="blocks" with block_size=50 the same bad frame was
    record #12 (counted within its block) where every other read says #462."""
    from shardfeed.formats.index import load_index

    files = write_sized_shards(tmp_path, [60, 80], index=True, prefix="x")
    start = int(load_index(files[1], None)[37, 0])
    with open(files[1], "r+b") as f:
        f.seek(start + 14)
        b = f.read(1)
        f.seek(start + 14)
        f.write(bytes([b[0] ^ 0xFF]))
    for kw in ({}, {"shuffle": "files", "seed": 1}, {"shuffle": "blocks", "seed": 1, "block_size": 10},
               {"shuffle": "blocks", "seed": 1}, {"shuffle": "global", "seed": 1}, {"slice_id": 2, "slice_count": 3}):
        for policy in ("raise", "skip"):
            ds = sf.read_tfrecord(files, spec=SPEC, on_corrupt=policy, **kw)
            ds = ds.batch(7) if batched else ds
            if policy == "raise":
                with pytest.raises(sf.CorruptRecordError) as info:
                    list(ds)
                got = (info.value.offset, info.value.record_index)
            else:
                with iter(ds) as it:
                    for _ in it:
                        pass
                    ex = it.stats().to_dict()["skipped"]["examples"][0]
                got = (ex["offset"], ex.get("record_index"))
            assert got == (start, 37), (kw, policy, got)


@pytest.mark.parametrize("mode", ["global", "blocks"])
@pytest.mark.parametrize("with_index", [False, True])
def test_a_shard_rewritten_between_two_passes_of_one_dataset_is_read_as_it_is_now(tmp_path, mode, with_index):
    """Found from outside: the second pass of the same dataset object read a rewritten shard
    through the index of the first (skip: 40 records skipped and none of the 60 new ones)."""
    import os
    import time

    files = write_sized_shards(tmp_path, [40, 20], index=with_index, prefix="w")
    for policy in ("skip", "raise"):
        ds = sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=1, on_corrupt=policy)
        assert sorted(_ids(ds.batch(8))) == sorted([i for i in range(40)] + [1000 + i for i in range(20)])
        time.sleep(0.01)
        sf.write_records(files[0], [example(500 + i) for i in range(60)], index=with_index)
        os.utime(files[0])
        assert sorted(_ids(ds.batch(8))) == sorted([500 + i for i in range(60)] + [1000 + i for i in range(20)])
        assert ds.read_stats.skipped_records == 0
        sf.write_records(files[0], [example(i) for i in range(40)], index=with_index)  # back, for the next policy

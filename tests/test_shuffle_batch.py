"""``source.shuffle(n).batch(k)`` fused: the same batches and states as the unfused chain."""

from __future__ import annotations

import collections
import json
import random
import re

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.formats.native import Buffers
from shardfeed.pipeline import check_resume_everywhere
from shardfeed.pipeline.shuffle_batch import ShuffledBatches
from shardfeed.pipeline.state import elements_equal

from .test_pipeline_helpers import SPEC, example, example_files


def _unfused(files, size, k, seed, **kw):
    # a pass-through stage between the source and the shuffle keeps them apart
    return sf.read_tfrecord(files, spec=SPEC).take(-1).shuffle(size, seed=seed).batch(k, **kw)


def _fused(files, size, k, seed, **kw):
    return sf.read_tfrecord(files, spec=SPEC).shuffle(size, seed=seed).batch(k, **kw)


def test_the_fused_node_is_used(tmp_path):
    files = example_files(tmp_path, [10])
    with iter(_fused(files, 4, 3, 1)) as it:
        assert type(it._root).__name__ == "SourceBatchNode"
    with iter(_unfused(files, 4, 3, 1)) as it:
        assert type(it._root).__name__ != "SourceBatchNode"


def test_same_batches_as_the_unfused_chain_for_many_shapes(tmp_path):
    rnd = random.Random(5)
    for trial in range(40):
        sizes = [rnd.randint(0, 30) for _ in range(rnd.randint(1, 4))]
        files = example_files(tmp_path, sizes, f"t{trial}")
        size, k, seed = rnd.randint(1, 40), rnd.randint(1, 7), rnd.randint(0, 9)
        drop = rnd.random() < 0.3
        a = [b["id"].tolist() for b in _fused(files, size, k, seed, drop_remainder=drop)]
        b = [b["id"].tolist() for b in _unfused(files, size, k, seed, drop_remainder=drop)]
        assert a == b, (sizes, size, k, seed, drop)


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_large_pass_with_compaction_matches_and_resumes_across_chains(tmp_path):
    files = example_files(tmp_path, [30_000, 20_000, 45_000])  # about 30 bytes a record: several 1 MiB chunks
    fused, unfused = _fused(files, 3000, 500, 7), _unfused(files, 3000, 500, 7)
    with iter(fused) as it:
        start = it.get_state()
    ref = [b["id"] for b in fused.iter_from_state(start)]
    ustart = dict(start, root=None)
    assert elements_equal(ref, [b["id"] for b in unfused.iter_from_state(ustart)])
    for stop in (1, 77, len(ref) - 1):
        with fused.iter_from_state(start) as it:
            for _ in range(stop):
                next(it)
            state = json.loads(json.dumps(it.get_state()))
        # small: the cursors, and a few bytes for each buffered record's file offset (the
        # "frames" a restore reads back, instead of ~buffer * ln(buffer) records from the anchor)
        assert len(json.dumps(state)) < 2048 + 3 * 3000
        rest = [b["id"] for b in fused.iter_from_state(state)]
        assert elements_equal(rest, ref[stop:])
        # the unfused chain reads the same state (its upstream states wrapped by the take stage)
        root = dict(state["root"])
        root["anchor"] = [root["anchor"][0], None if root["anchor"][1] is None
                          else {"parent": root["anchor"][1], "left": -1}]
        with unfused.iter_from_state(dict(state, root=root)) as it:
            assert elements_equal([b["id"] for b in it], ref[stop:])


@pytest.mark.parametrize("reads", [None, 2])
def test_fused_shuffle_batch_resumes_at_every_step(tmp_path, reads):
    files = example_files(tmp_path, [13, 0, 9, 21])
    ds = sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=reads).shuffle(8, seed=4).batch(3)
    assert check_resume_everywhere(ds) >= 15
    assert check_resume_everywhere(sf.read_tfrecord(files, spec=SPEC).shuffle(100, seed=4).batch(5)) >= 9


def test_fused_shuffle_batch_with_repeat_and_buffers(tmp_path):
    files = example_files(tmp_path, [17, 6])
    two = list(sf.read_tfrecord(files, spec=SPEC).shuffle(5, seed=2).batch(4, bytes_as="buffer").repeat(2))
    ids = np.concatenate([b["id"] for b in two]).tolist()
    assert sorted(ids[:23]) == sorted(ids[23:]) and ids[:23] != ids[23:]
    assert sorted(ids[:23]) == sorted([i for i in range(17)] + [100_000 + i for i in range(6)])


def _stop_at(ds, stop):
    with iter(ds) as it:
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        return state, [b["id"] for b in it]


@pytest.mark.slow  # a few seconds: out of the quick loop (make test-fast)
def test_a_restore_reads_back_the_buffered_records_only_whatever_the_position(tmp_path):
    files = example_files(tmp_path, [30_000, 20_000, 45_000])  # several 1 MiB chunks
    size = 3000
    for stop in (10, 90, 170):  # 5,000 / 45,000 / 85,000 records in
        src = sf.read_tfrecord(files, spec=SPEC)
        ds = src.shuffle(size, seed=11).batch(500)
        state, rest = _stop_at(ds, stop)
        assert "frames" in state["root"]
        before, again = src.read_stats.records, src.read_stats.reread
        got = [b["id"] for b in ds.iter_from_state(state)]
        assert elements_equal(got, rest)
        # the buffer's records read back by their offsets (a full buffer: exactly its size), and
        # every other record read once: as many records read as the resumed pass gave
        assert src.read_stats.reread - again == size
        assert src.read_stats.records - before == len(np.concatenate(rest))
        # without the offsets (the unfused node's state): from the anchor, many more records
        old = dict(state, root={k: v for k, v in state["root"].items() if k != "frames"})
        again = src.read_stats.reread
        assert elements_equal([b["id"] for b in ds.iter_from_state(old)], rest)
        assert src.read_stats.reread - again > 2 * size


def test_a_file_changed_after_the_save_fails_the_restore_naming_it(tmp_path):
    from shardfeed.errors import CorruptRecordError
    from shardfeed.pipeline.frames import unpack_ints

    files = example_files(tmp_path, [4000, 4000])
    ds = sf.read_tfrecord(files, spec=SPEC).shuffle(500, seed=2).batch(50)
    state, _ = _stop_at(ds, 30)
    frames = state["root"]["frames"]
    url = frames["urls"][int(unpack_ints(frames["url"])[0])]
    at = int(unpack_ints(frames["at"])[0])
    with open(url, "r+b") as f:  # one byte of a buffered record's data
        f.seek(at + 12)
        b = f.read(1)
        f.seek(at + 12)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CorruptRecordError, match=rf"{re.escape(url)} at byte offset {at}: data crc check failed"):
        list(ds.iter_from_state(state))


def test_compressed_files_restore_from_the_anchor(tmp_path):
    files = []
    for f in range(2):
        p = str(tmp_path / f"z-{f}.tfrecord.gz")
        sf.write_records(p, [example(f * 100_000 + i) for i in range(3000)])
        files.append(p)
    src = sf.read_tfrecord(files, spec=SPEC)
    ds = src.shuffle(400, seed=3).batch(40)
    state, rest = _stop_at(ds, 60)
    assert "frames" not in state["root"]  # a gzip stream has no byte offsets to read back from
    assert elements_equal([b["id"] for b in ds.iter_from_state(state)], rest)


def test_a_state_saved_after_a_restore_restores_again_from_the_records_read_back(tmp_path):
    files = example_files(tmp_path, [9000, 7000])
    src = sf.read_tfrecord(files, spec=SPEC)
    ds = src.shuffle(1500, seed=9).batch(100)
    with iter(ds) as it:  # one pass's order (each pass reshuffles): its start state
        start = it.get_state()
    ref = [b["id"] for b in ds.iter_from_state(start)]
    with ds.iter_from_state(start) as it:
        for _ in range(40):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
    for hop in (3, 1, 25):  # save again soon after a restore (the buffer still mostly read back), and later
        with ds.iter_from_state(state) as it:
            for _ in range(hop):
                next(it)
            state = json.loads(json.dumps(it.get_state()))
        assert "frames" in state["root"]
        again = src.read_stats.reread
        rest = [b["id"] for b in ds.iter_from_state(state)]
        assert elements_equal(rest, ref[len(ref) - len(rest):]) and src.read_stats.reread - again == 1500


def test_deferred_state_parts_are_made_or_left_out():
    from shardfeed.pipeline.deferred import DeferredState, materialize

    class Part(DeferredState):
        __slots__ = ("v",)

        def __init__(self, v):
            self.v = v

        def value(self):
            return self.v

    plain = {"a": 1, "b": [1, {"c": 2}]}
    assert materialize(plain) is plain
    st = {"a": Part({"x": 1}), "b": [Part(2), {"c": Part(None)}], "d": 3}
    assert materialize(st) == {"a": {"x": 1}, "b": [2, {}], "d": 3}
    assert materialize(st, make=False) == {"b": [None, {}], "d": 3}
    assert isinstance(st["a"], Part)  # the state itself is left as it was


def test_shuffled_batches_refer_to_the_chunks_read_not_a_copy(tmp_path):
    # large records (a 20 KB image-like value each) in small chunks, a buffer that outlives
    # them: every batch's records are read where the source put them (its chunks, or the
    # copies compaction kept), so the bytes go from the read buffer to the parser once
    blob = np.random.default_rng(3).integers(0, 256, 40_000, dtype=np.uint8).tobytes()
    files = []
    for f in range(3):
        p = str(tmp_path / f"big-{f}.tfrecord")
        sf.write_records(p, [sf.encode_example({"id": [f * 1000 + i], "image": blob[i * 97:i * 97 + 20_000]})
                             for i in range(150)])
        files.append(p)
    spec = {"id": sf.FixedLen("int64"), "image": sf.FixedLen("bytes")}
    src = sf.read_tfrecord(files, spec=spec)
    ds = src.shuffle(100, seed=2).batch(16)
    producer = ShuffledBatches(src, ds.parent, ds, (), None)
    try:
        read: set[int] = set()  # every buffer a chunk the source read lies in

        class Recording(collections.deque):
            def append(self, c):
                read.add(id(c.chunk.buffer))
                super().append(c)

        producer.chunks = Recording(producer.chunks)
        seen = []
        while True:
            kept = {id(v[0]) for v in producer.survivors.values()}  # records compaction copied out
            try:
                batch = next(producer)[0]
            except StopIteration:
                break
            bufs = batch.buffer.buffers if isinstance(batch.buffer, Buffers) else (batch.buffer,)
            assert all(id(b) in read | kept for b in bufs)
            seen += [int(sf.parse_single_example(rec, spec)["id"]) for rec in batch.records()]
    finally:
        producer.close()
    assert sorted(seen) == sorted(f * 1000 + i for f in range(3) for i in range(150))
    unfused = sf.read_tfrecord(files, spec=spec).take(-1).shuffle(100, seed=2).batch(16)
    assert [int(v) for b in ds for v in b["id"]] == seen == [int(v) for b in unfused for v in b["id"]]


def test_stats_show_the_fused_shuffles_own_time_apart_from_read_and_parse(tmp_path):
    files = example_files(tmp_path, [300, 200])
    ds = _fused(files, 50, 16, 3)
    assert sum(len(b["id"]) for b in ds) == 500
    stages = {s["name"].split(":", 1)[1]: s for s in ds.stats().to_dict()["stages"]}
    assert set(stages) == {"shuffle", "batch"}
    shuffle = stages["shuffle"]
    assert shuffle["elements"] == 500 and shuffle["busy_s"] > 0 and shuffle["read_s"] > 0
    assert "shuffle" in str(ds.stats())


def test_without_the_native_core_the_same_batches_and_order(tmp_path, monkeypatch):
    # the pure-Python twins: the parse reads records by reference too (Buffers), and the
    # global shuffle's permutation comes from the numpy reference
    from shardfeed.formats import native as nv
    from shardfeed.pipeline import permute

    files = example_files(tmp_path, [120, 80, 0, 45])
    fused = [[int(v) for v in b["id"]] for b in _fused(files, 30, 7, 4)]
    glob_ = [[int(v) for v in b["id"]] for b in sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=2).batch(7)]
    monkeypatch.setattr(nv, "_ext", None)
    monkeypatch.setattr(permute, "_native_permute", None)
    assert [[int(v) for v in b["id"]] for b in _fused(files, 30, 7, 4)] == fused
    assert [[int(v) for v in b["id"]]
            for b in sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=2).batch(7)] == glob_


def _frame_offsets(path):
    """Each frame's start in a TFRecord file, walked here from the length fields (not the
    library's scan)."""
    import struct

    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        out.append(at)
        (n,) = struct.unpack_from("<Q", data, at)
        at += 16 + n
    return out


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("where, check", [(12 + 5, "data crc"), (8, "length crc")])
def test_a_corrupt_record_in_a_fused_buffer_shuffle_raises_naming_file_and_offset(tmp_path, where, check):
    # the data CRCs are left to the parsing threads under the raising policy: a record that
    # fails is raised when drawn, named by its file and offset as the unfused chain names it
    from shardfeed.errors import CorruptRecordError

    files = example_files(tmp_path, [300, 300])
    bad = 137
    at = _frame_offsets(files[1])[bad]
    _flip(files[1], at + where)
    for build in (_fused, _unfused):
        for threads in (1, 2):
            ds = sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=threads)
            ds = ds.shuffle(64, seed=3).batch(8) if build is _fused else ds.take(-1).shuffle(64, seed=3).batch(8)
            seen = []
            with pytest.raises(CorruptRecordError) as err:
                for b in ds:
                    seen += b["id"].tolist()
            assert err.value.url == files[1] and err.value.offset == at and err.value.check == check
            assert len(seen) == len(set(seen)) and 100_000 + bad not in seen


def test_skipping_in_a_fused_buffer_shuffle_keeps_the_unfused_order(tmp_path):
    files = example_files(tmp_path, [300, 300])
    for k in (12, 250):
        _flip(files[0], _frame_offsets(files[0])[k] + 12 + 3)

    def ids(fused):
        ds = sf.read_tfrecord(files, spec=SPEC, on_corrupt="skip")
        ds = ds.shuffle(64, seed=4) if fused else ds.take(-1).shuffle(64, seed=4)
        return [i for b in ds.batch(8) for i in b["id"].tolist()]

    got = ids(True)
    assert got == ids(False)
    assert sorted(got) == sorted(set(range(300)) - {12, 250} | set(range(100_000, 100_300)))


def test_large_records_held_in_their_maps_through_compaction_come_out_whole(tmp_path):
    # 5 KB records in 256 KiB chunks, a buffer of 1,024: chunks are compacted (their
    # buffered records kept as views of the file's map, the rest of their pages handed back)
    # and released while batches holding their records may still be parsing
    spec = {"id": sf.FixedLen("int64"), "blob": sf.FixedLen("bytes")}

    def blob(i):
        return i.to_bytes(8, "little") * 625

    files = []
    for f in range(2):
        p = str(tmp_path / f"big-{f}.tfrecord")
        sf.write_records(p, [sf.encode_example({"id": [f * 10_000 + i], "blob": [blob(f * 10_000 + i)]})
                             for i in range(2500)])
        files.append(p)
    want = sorted(f * 10_000 + i for f in range(2) for i in range(2500))
    unfused = sf.read_tfrecord(files, spec=spec).take(-1).shuffle(1024, seed=7).batch(16)
    order = [i for b in unfused for i in b["id"].tolist()]
    for threads in (1, 2):
        src = sf.read_tfrecord(files, spec=spec, num_parallel_reads=threads)
        src.options = src.options._replace(chunk_size=256 << 10)
        got = []
        for b in src.shuffle(1024, seed=7).batch(16):
            for i, v in zip(b["id"].tolist(), b["blob"].tolist()):
                assert v == blob(i), i
                got.append(i)
        assert got == order and sorted(got) == want


# small records; larger ones; a buffer of a third of the records, whose chunks are compacted
# (the records still buffered kept as views of the file's map) before they are drawn
@pytest.mark.parametrize("n, buffer, size", [(200, 200, 300), (200, 200, 6000), (5000, 1024, 5000)])
def test_skip_a_record_changed_in_its_file_after_the_scan_is_skipped_not_delivered(tmp_path, n, buffer, size):
    """Under skip the scan checks each data CRC, and a record's values are copied out when it is
    drawn, long after, from the file's map, which shows a write to the file in place (a shard
    rewritten while a pass reads it). Here data bytes of records already scanned and buffered
    change after the first batch: each such record still to be drawn is skipped and counted
    (its bytes fail the CRC the scan checked), and every record delivered is one of the file's
    as written: none with the changed bytes."""
    spec = {"id": sf.FixedLen("int64"), "blob": sf.FixedLen("bytes")}
    path = str(tmp_path / "d.tfrecord")
    sf.write_records(path, [sf.encode_example({"id": [i], "blob": [bytes([i % 251]) * size]}) for i in range(n)])
    starts = _frame_offsets(path)
    it = iter(sf.read_tfrecord(path, spec=spec, on_corrupt="skip").shuffle(buffer, seed=3).batch(10))
    first = next(it)  # the buffer's records scanned, 10 drawn
    drawn = set(first["id"].tolist())
    changed = [i for i in range(min(n, 900)) if i % 3 == 0]
    for i in changed:  # a byte in the middle of the blob, in place: the frame's layout stays
        _flip(path, starts[i] + 12 + 20 + size // 2)
    got = list(first["id"].tolist())
    for b in it:
        for i, blob in zip(b["id"].tolist(), b["blob"].tolist()):
            assert blob == bytes([i % 251]) * size, f"record {i} delivered with bytes changed after its scan"
            got.append(i)
    skipped = it.stats().to_dict()["skipped"]["total"]
    lost = {i for i in changed if i not in drawn}
    assert sorted(got) == sorted(set(range(n)) - lost)
    assert skipped == len(lost)


def test_skip_a_batch_handed_to_the_parser_holds_its_own_copy_of_its_records(tmp_path):
    """Under skip the parser checks each record against the CRC its scan read: the bytes it
    checks and the bytes it copies values from must be one copy, not the file's map read twice
    (a file rewritten over and over in place gave records whose numbers came from one version
    and whose bytes from another). The batch drawn holds its own copy: a write to the file
    after the draw changes nothing the parser sees."""
    from shardfeed.pipeline.skipping import parse_skipping

    spec = {"id": sf.FixedLen("int64"), "blob": sf.FixedLen("bytes")}
    path = str(tmp_path / "d.tfrecord")
    sf.write_records(path, [sf.encode_example({"id": [i], "blob": [bytes([i]) * 300]}) for i in range(100)])
    src = sf.read_tfrecord(path, spec=spec, on_corrupt="skip")
    ds = src.shuffle(100, seed=1).batch(10)
    producer = ShuffledBatches(src, ds.parent, ds, (), None)
    try:
        batch = next(producer)[0]
        for at in _frame_offsets(path):
            _flip(path, at + 12 + 100)
        cols, skipped = parse_skipping(batch, spec, "object")
    finally:
        producer.close()
    assert skipped == []
    assert [bytes(b) for b in cols["blob"]] == [bytes([i]) * 300 for i in cols["id"].tolist()]


@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
def test_a_buffer_shuffle_over_a_global_shuffle_delivers_every_record_once(tmp_path, on_corrupt):
    """A global shuffle hands its records over in their frames, for the parser to check
    (``IN_FRAME``); a buffer shuffle on top kept that marker as if it were a column of CRCs
    and failed (``ValueError`` in its table of held records). Each frame's stored CRC is taken
    instead, flipped where its length field fails, so the parser still checks the frame."""
    spec = {"id": sf.FixedLen("int64"), "blob": sf.FixedLen("bytes")}
    files = []
    for f in range(2):
        p = str(tmp_path / f"g-{f}.tfrecord")
        with sf.TFRecordWriter(p, index=True) as w:
            for i in range(f * 1000, f * 1000 + 1000):
                w.write(sf.encode_example({"id": [i], "blob": [bytes([i % 251]) * (100 + i % 37)]}))
        files.append(p)
    ds = sf.read_tfrecord(files, spec, on_corrupt=on_corrupt, shuffle="global", seed=1).shuffle(300, seed=2).batch(64)
    got = []
    for b in ds:
        for i, blob in zip(b["id"].tolist(), b["blob"].tolist()):
            assert blob == bytes([i % 251]) * (100 + i % 37)
            got.append(i)
    assert sorted(got) == list(range(2000))

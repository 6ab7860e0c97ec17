"""The one record source: spans, providers, readers that read only their share, resume."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.adapters.torch import split_for_reader
from shardfeed.pipeline import Span, StaticSpans, TFRecordSource, check_resume_everywhere, split_spans
from shardfeed.storage import clear_cache

from .conftest import serve_directory
from .test_pipeline_helpers import SPEC, example, write_shards, write_sized_shards


def _ids(ds) -> list[int]:
    out = []
    for b in ds:
        out.extend(int(v) for v in np.atleast_1d(b["id"]))
    return out




@pytest.mark.parametrize("sizes", [[5], [3, 40], [0, 7, 1], [10, 10, 10, 10], [1, 2, 3, 4, 50, 6, 7]])
@pytest.mark.parametrize("readers", [1, 2, 3, 4, 8])
def test_every_record_once_across_readers_each_reading_only_its_bytes(tmp_path, sizes, readers):
    files = write_sized_shards(tmp_path, sizes)
    everything = sorted(f * 1000 + i for f, n in enumerate(sizes) for i in range(n))
    got, fetched = [], 0
    for r in range(readers):
        ds = sf.read_tfrecord(files, spec=SPEC).shard(r, readers)
        got += _ids(ds.batch(4))
        fetched += ds.read_stats.bytes
    assert sorted(got) == everything
    total = sum(os.path.getsize(f) for f in files)
    assert fetched == total  # frames read across readers: the dataset, once


@pytest.mark.parametrize("workers,ranks", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)])
def test_workers_and_ranks_split_spans_without_duplicates(tmp_path, workers, ranks):
    files = write_sized_shards(tmp_path, [9, 1, 30])
    ds = sf.read_tfrecord(files, spec=SPEC).shuffle(5, seed=2).batch(3)
    got = []
    for rank in range(ranks):
        for w in range(workers):
            got += _ids(split_for_reader(ds, rank * workers + w, ranks * workers))
    assert sorted(got) == sorted(f * 1000 + i for f, n in enumerate([9, 1, 30]) for i in range(n))


def test_split_uses_whole_files_when_they_divide_and_ranges_when_too_few(tmp_path):
    files = write_sized_shards(tmp_path, [4, 4, 4, 4])
    spans = [Span(f) for f in files]
    assert split_spans(spans, 1, 2) == [spans[1], spans[3]]  # no index needed
    assert not any(os.path.exists(f + ".idx") for f in files)
    mine = split_spans(spans, 5, 8)  # fewer files than readers: record ranges, index built on the fly
    assert all(os.path.exists(f + ".idx") for f in files)
    assert [(s.url, s.start, s.stop) for s in mine] == [(files[2], 2, 4)]


def test_index_built_for_a_read_only_folder_goes_to_the_cache(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        # root ignores permissions: make the write fail the way a read-only store does
        import shardfeed.formats.index as index_mod

        real = index_mod.storage.write_bytes

        def refuse(url, data, storage_options=None, counters=None):
            if url.endswith(".tfrecord.idx") and str(tmp_path / "ro") in url:
                raise PermissionError(f"{url}: read-only")
            return real(url, data, storage_options, counters)

        monkeypatch.setattr(index_mod.storage, "write_bytes", refuse)
    ro = tmp_path / "ro"
    ro.mkdir()
    files = write_sized_shards(ro, [6])
    monkeypatch.setenv("SHARDFEED_CACHE_DIR", str(tmp_path / "cache"))
    if os.geteuid() != 0:
        os.chmod(ro, 0o555)
    try:
        parts = [_ids(sf.read_tfrecord(files, spec=SPEC).shard(r, 2).batch(2)) for r in range(2)]
    finally:
        os.chmod(ro, 0o755)
    assert parts == [[0, 1, 2], [3, 4, 5]]
    assert not os.path.exists(files[0] + ".idx")
    assert len(os.listdir(tmp_path / "cache" / "index")) == 1


def test_a_compressed_file_cannot_be_split_into_ranges_and_says_so(tmp_path):
    files = write_shards(tmp_path, n_files=1, per_file=4, compression="GZIP")
    with pytest.raises(ValueError, match="compressed"):
        list(sf.read_tfrecord(files).shard(0, 2))


@pytest.mark.parametrize("reads", [None, 2])
def test_record_ranges_resume_at_every_step(tmp_path, reads):
    files = write_sized_shards(tmp_path, [7, 5], index=True)
    spans = [Span(files[0], 0, None)] + split_spans([Span(files[1])], 0, 2)
    src = TFRecordSource(StaticSpans(spans), SPEC, num_parallel_reads=reads)
    assert check_resume_everywhere(src.batch(2)) >= 5
    assert check_resume_everywhere(TFRecordSource(StaticSpans(spans), num_parallel_reads=reads)) >= 10


def test_read_shard_by_record_resumes_at_every_step(tmp_path):
    files = write_sized_shards(tmp_path, [6, 5], index=True)
    ds = sf.read_shard(files, SPEC, slice_id=1, slice_count=2, by="record")
    assert _ids(ds) == [1000 + i for i in range(5)] or sorted(_ids(ds))  # its half, in order
    assert check_resume_everywhere(ds.batch(2)) >= 3


def test_restoring_reads_nothing_twice_whatever_the_position(tmp_path):
    files = write_sized_shards(tmp_path, [400, 400])
    for position in (10, 700):
        src = sf.read_tfrecord(files, spec=SPEC)
        ds = src.batch(10)
        it = iter(ds)
        for _ in range(position // 10):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        it.close()
        before = src.read_stats.records
        rest = _ids(ds.iter_from_state(state))
        re_read = src.read_stats.records - before - len(rest)
        assert rest[0] == (position // 400) * 1000 + position % 400
        assert re_read == 0  # the cursor is a byte offset: nothing before it is read again


def test_parallel_parse_gives_the_same_batches_and_errors_name_the_file(tmp_path):
    files = write_sized_shards(tmp_path, [300, 301, 3])
    one = list(sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=None).batch(16))
    four = list(sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=4).batch(16))
    assert [b["id"].tolist() for b in one] == [b["id"].tolist() for b in four]
    bad = str(tmp_path / "bad.tfrecord")
    sf.write_records(bad, [example(i) for i in range(50)] + [b"\xff\xff not an example"])
    with pytest.raises(sf.DecodeError) as info:
        list(sf.read_tfrecord([files[0], bad], spec=SPEC, num_parallel_reads=4).batch(16))
    assert any("bad.tfrecord" in n and "byte offset" in n for n in getattr(info.value, "__notes__", []))


# -- bytes served over HTTP -------------------------------------------------------------------
@pytest.mark.parametrize("n_files,index", [(4, False), (1, True), (3, True)])
def test_dataloader_workers_fetch_only_their_own_bytes_over_http(tmp_path, n_files, index):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    sizes = [150 + 37 * f for f in range(n_files)]
    files = write_sized_shards(tmp_path, sizes, index=index)
    total = sum(os.path.getsize(f) for f in files)
    clear_cache()
    served: dict[str, int] = {}
    with serve_directory(str(tmp_path), served) as base:
        urls = [f"{base}/{os.path.basename(f)}" for f in files]
        ds = sf.read_tfrecord(urls, spec=SPEC).batch(8)
        loader = DataLoader(ds.to_torch(slice_id=0, slice_count=1), batch_size=None, num_workers=2)
        got = sorted(v for b in loader for v in b["id"].tolist())
    assert got == sorted(f * 1000 + i for f, n in enumerate(sizes) for i in range(n))
    records = sum(v for k, v in served.items() if k.endswith(".tfrecord"))
    assert records <= 1.05 * total, (records, total, served)
    assert isinstance(torch.zeros(1), torch.Tensor)


# -- PyTorch: spawned workers, checkpoints ---------------------------------------------------------
def test_to_torch_pickles_and_carries_rank_to_spawned_workers(tmp_path):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    files = write_sized_shards(tmp_path, [12, 12, 12, 12])
    ds = sf.read_tfrecord(files, spec=SPEC).batch(4)
    seen = []
    for rank in range(2):
        loader = DataLoader(ds.to_torch(slice_id=rank, slice_count=2), batch_size=None, num_workers=2,
                            multiprocessing_context="spawn")
        seen.append(sorted(v for b in loader for v in b["id"].tolist()))
    assert len(seen[0]) == len(seen[1]) == 24
    assert sorted(seen[0] + seen[1]) == sorted(f * 1000 + i for f in range(4) for i in range(12))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch(tmp_path, workers):
    pytest.importorskip("torch")
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    files = write_sized_shards(tmp_path, [40, 40, 40, 40])
    ds = sf.read_tfrecord(files, spec=SPEC).batch(5)

    def loader():
        return sdl.StatefulDataLoader(ds.to_torch(slice_id=0, slice_count=1), batch_size=None, num_workers=workers)

    full = [b["id"].tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)["id"].tolist() for _ in range(7)]
    state = first.state_dict()
    del it, first
    again = loader()
    again.load_state_dict(state)
    rest = [b["id"].tolist() for b in again]
    assert head == full[:7]
    assert sorted(sum(head + rest, [])) == sorted(sum(full, []))
    assert rest == full[7:]


# -- found in review ----------------------------------------------------------------------------
def test_a_pathlib_path_is_a_file_not_a_provider(tmp_path):
    from pathlib import Path

    files = write_sized_shards(tmp_path, [3])
    assert _ids(sf.read_tfrecord(Path(files[0]), spec=SPEC)) == [0, 1, 2]
    assert _ids(sf.read_tfrecord([Path(files[0])], spec=SPEC)) == [0, 1, 2]


def test_files_of_very_different_sizes_split_evenly_when_indexed(tmp_path):
    files = write_sized_shards(tmp_path, [10, 10, 10, 100], index=True)
    shares = [_ids(sf.read_tfrecord(files, spec=SPEC).shard(r, 2).batch(7)) for r in range(2)]
    assert [len(s) for s in shares] == [65, 65]  # record ranges, not 20 against 110
    assert sorted(shares[0] + shares[1]) == sorted(f * 1000 + i for f, n in enumerate([10, 10, 10, 100])
                                                   for i in range(n))



def test_unindexed_files_of_different_sizes_split_by_file_with_a_warning(tmp_path, caplog):
    files = write_sized_shards(tmp_path, [10, 10, 10, 100])  # no index: planning reads no file
    with caplog.at_level("WARNING"):
        shares = [_ids(sf.read_tfrecord(files, spec=SPEC).shard(r, 2)) for r in range(2)]
    assert sorted(len(s) for s in shares) == [20, 110]
    assert "shares differ in size" in caplog.text and "shardfeed index" in caplog.text
    assert not any(os.path.exists(f + ".idx") for f in files)


class _LosesSecondSpan:
    """A provider whose second span is lost to another reader before it is read."""

    def __init__(self, spans):
        self.spans = spans
        self.finished = []

    def open(self, state, epoch):
        outer = self

        class Stream:
            i = 0

            def next_span(self, block=True):
                if self.i >= len(outer.spans):
                    return None
                self.i += 1
                return outer.spans[self.i - 1]

            def get_state(self):
                return {"i": self.i}

            def finish(self, span):
                outer.finished.append(span.url)

            def keep(self, span):
                return span is not outer.spans[1]

            def close(self):
                pass

        return Stream()


def test_a_span_lost_before_it_is_read_delivers_nothing_and_is_not_finished(tmp_path):
    files = write_sized_shards(tmp_path, [4, 4, 4])
    provider = _LosesSecondSpan([Span(f) for f in files])
    got = _ids(TFRecordSource(provider, SPEC).batch(3))
    assert got == [0, 1, 2, 3, 2000, 2001, 2002, 2003]
    assert provider.finished == [files[0], files[2]]


def test_a_queue_item_is_acknowledged_only_after_its_records_were_delivered(tmp_path):
    files = write_sized_shards(tmp_path, [5, 5, 5, 5])
    q = sf.WorkQueue(files, backend="memory", name="ack-after-delivery", shuffle=False)
    it = iter(sf.read_tfrecord(q, spec=SPEC, num_parallel_reads=None).batch(4))
    assert next(it)["id"].tolist() == [0, 1, 2, 3]
    # the first item is read to its end (and the second taken) while the first batch is
    # made, but it is acknowledged only once its last record went out: at once then, not
    # with the next take (a worker dying before that take would repeat two items)
    assert q.metrics()["done"] == 0
    assert next(it)["id"].tolist() == [4, 1000, 1001, 1002]
    assert q.metrics()["done"] == 1
    assert next(it)["id"].tolist() == [1003, 1004, 2000, 2001]
    assert q.metrics()["done"] == 2
    rest = [v for b in it for v in b["id"].tolist()]
    assert rest == [2002, 2003, 2004, 3000, 3001, 3002, 3003, 3004]
    assert q.metrics()["done"] == 4 and q.metrics()["drained"]


def test_a_queue_item_in_a_prefetch_buffer_is_acknowledged_only_when_the_consumer_takes_it(tmp_path):
    files = write_sized_shards(tmp_path, [5, 5, 5, 5])
    q = sf.WorkQueue(files, backend="memory", name="ack-after-prefetch", shuffle=False)
    it = iter(sf.read_tfrecord(q, spec=SPEC, num_parallel_reads=None).batch(4).prefetch(2))
    got = next(it)["id"].tolist()
    assert got == [0, 1, 2, 3]
    deadline = time.monotonic() + 30
    while q.metrics()["taken"] < 3:  # the prefetch thread reads on into the third item
        assert time.monotonic() < deadline, "the prefetch thread never read ahead"
        time.sleep(0.01)
    time.sleep(0.2)
    assert q.metrics()["done"] == 0  # items read to their end, their last batches still buffered
    for batch in it:
        got += batch["id"].tolist()
        whole = sum(all(f * 1000 + i in got for i in range(5)) for f in range(4))
        # never an item not yet delivered whole; at most one behind (prefetch's state is
        # that of the element before, and how many it skips from there)
        assert whole - 1 <= q.metrics()["done"] <= whole
    assert len(got) == 20 and q.metrics()["done"] == 4 and q.metrics()["drained"]


def test_closing_a_pass_early_gives_back_items_read_to_their_end_but_not_delivered(tmp_path):
    files = write_sized_shards(tmp_path, [5, 5, 5, 5])
    q = sf.WorkQueue(files, backend="memory", name="close-finished", shuffle=False)
    it = iter(sf.read_tfrecord(q, spec=SPEC, num_parallel_reads=None).batch(4).prefetch(2))
    assert next(it)["id"].tolist() == [0, 1, 2, 3]
    assert next(it)["id"].tolist() == [4, 1000, 1001, 1002]
    time.sleep(0.2)  # the prefetch thread reads on meanwhile
    it.close()
    m = q.metrics()
    assert m["done"] <= 1 and m["in_flight"] == 0  # only the item delivered whole may be acknowledged
    q2 = sf.WorkQueue(files, backend="memory", name="close-finished", shuffle=False)
    again = [v for b in sf.read_tfrecord(q2, spec=SPEC, num_parallel_reads=None).batch(4) for v in b["id"].tolist()]
    # every item not acknowledged comes again whole (item 0 too, if its ack was still due)
    assert sorted(again) == [f * 1000 + i for f in range(m["done"], 4) for i in range(5)]


def test_a_queue_item_under_a_shuffle_buffer_is_acknowledged_at_the_end_of_the_pass(tmp_path):
    files = write_sized_shards(tmp_path, [5, 5, 5, 5])
    q = sf.WorkQueue(files, backend="memory", name="ack-after-shuffle", shuffle=False)
    it = iter(sf.read_tfrecord(q, spec=SPEC, num_parallel_reads=None).shuffle(100, seed=1))
    first = next(it)  # the buffer holds every record: which item is fully delivered is not known
    assert q.metrics()["done"] == 0 and q.metrics()["in_flight"] == 4
    rest = list(it)
    assert sorted([int(first["id"]), *(int(r["id"]) for r in rest)]) == [f * 1000 + i for f in range(4)
                                                                        for i in range(5)]
    assert q.metrics()["done"] == 4 and q.metrics()["drained"]


@pytest.mark.parametrize("reads", [None, 4])
def test_a_read_error_comes_after_every_batch_before_it(tmp_path, reads):
    files = write_sized_shards(tmp_path, [100])
    bad = str(tmp_path / "bad.tfrecord")
    good = [example(7000 + i) for i in range(30)]
    sf.write_records(bad, good)
    with open(bad, "r+b") as f:  # corrupt the data CRC of record 20
        frames = 20 * (len(good[0]) + 16)
        f.seek(frames + 12 + len(good[20]))
        f.write(b"\x00\x00\x00\x00")
    delivered = []
    with pytest.raises(sf.CorruptRecordError):
        for b in sf.read_tfrecord(files + [bad], spec=SPEC, num_parallel_reads=reads).batch(16):
            delivered.extend(b["id"].tolist())
    assert delivered[:100] == list(range(100))
    assert len(delivered) == 112  # 7 full batches: the error comes where the reader stopped, in order


def test_splitting_gzip_files_named_without_gz_says_they_are_compressed(tmp_path):
    p = str(tmp_path / "plain-name.tfrecord")
    sf.write_records(p, [example(i) for i in range(4)], compression="GZIP")
    with pytest.raises(ValueError, match="compressed"):
        list(sf.read_tfrecord(p, compression="GZIP").shard(0, 2))


def test_readers_of_one_queue_share_it_instead_of_dealing_records(tmp_path):
    files = write_sized_shards(tmp_path, [6, 6, 6], index=True)
    q = sf.WorkQueue(files, backend="memory", name="shared-by-readers", num_slices=6, seed=1)
    ds = sf.read_tfrecord(q, spec=SPEC).batch(4)
    got = []
    for r in range(2):  # two readers (say DataLoader workers) take from the same queue
        got += _ids(split_for_reader(ds, r, 2))
    assert sorted(got) == sorted(f * 1000 + i for f in range(3) for i in range(6))


def test_shuffle_over_a_queue_saves_a_fresh_buffer_state(tmp_path):
    files = write_sized_shards(tmp_path, [5, 5])
    q = sf.WorkQueue(files, backend="memory", name="shuffled-queue", shuffle=False)
    it = iter(sf.read_tfrecord(q).shuffle(3, seed=1))
    next(it)
    root = it.get_state()["root"]
    assert root["consumed"] == 0 and "anchor" not in root  # the queue is the checkpoint
    it.close()


def test_ranks_started_by_torch_spawn_with_spawned_workers_read_every_record_once(tmp_path):
    pytest.importorskip("torch")
    import socket

    import torch.multiprocessing as mp

    from ._ddp_worker import run_rank

    files = write_sized_shards(tmp_path, [10, 11, 12, 13])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run_rank, args=(2, port, files, str(tmp_path)), nprocs=2, join=True)
    per_rank = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert all(per_rank)  # each rank read a share, not everything and not nothing
    assert sorted(per_rank[0] + per_rank[1]) == sorted(f * 1000 + i for f, n in enumerate([10, 11, 12, 13])
                                                       for i in range(n))


def test_index_files_parse_fast_and_still_name_a_bad_line(tmp_path):
    p = tmp_path / "x.idx"
    p.write_bytes(b"0 20\n\n20 30\n")
    assert sf.read_index(str(p)).tolist() == [[0, 20], [20, 30]]
    p.write_bytes(b"0 20\n20 30 40\n")
    with pytest.raises(sf.ShardfeedError, match="line 2"):
        sf.read_index(str(p))
    p.write_bytes(b"0 20\n5 7\n")
    with pytest.raises(sf.ShardfeedError, match="line 2"):
        sf.read_index(str(p))


def test_threads_reading_fused_batches_at_once_share_the_cores(monkeypatch):
    import threading

    from shardfeed.pipeline import source_batch as sb

    monkeypatch.setattr(sb, "_readers", {})
    monkeypatch.setattr(sb, "ACTIVE_S", 60.0)  # everything below happens "now"

    def other(batches):
        got = []
        t = threading.Thread(target=lambda: got.extend(sb._share(4) for _ in range(batches)))
        t.start()
        t.join()
        return got

    assert [sb._share(4) for _ in range(sb.BUSY_BATCHES)] == [4] * sb.BUSY_BATCHES  # alone, flat out
    assert other(1) == [2]  # another thread sees this one busy ...
    assert sb._share(4) == 4  # ... but it took one batch: not reading flat out, not counted
    assert other(sb.BUSY_BATCHES)[-1] == 2  # now it reads flat out too: two cores each
    assert sb._share(4) == 2 and sb._share(4) == 2  # the same thread again counts once
    monkeypatch.setattr(sb, "ACTIVE_S", 0.0)  # the other thread has not read for a while
    assert sb._share(4) == 4
    monkeypatch.setattr(sb, "ACTIVE_S", 60.0)
    assert other(sb.BUSY_BATCHES)[-1] == 2 and sb._share(4) == 2
    # a pass that ends or closes leaves at once
    for ident in list(sb._readers):
        if ident != threading.get_ident():
            sb._done_reading(ident)
    assert sb._share(4) == 4


def test_two_slices_read_in_two_threads_give_every_record_once(tmp_path):
    import threading

    files = [str(tmp_path / f"p{f}.tfrecord") for f in range(4)]
    for f, p in enumerate(files):
        sf.write_records(p, [sf.encode_example({"id": [f * 10_000 + i]}) for i in range(3000)])
    spec = {"id": sf.FixedLen("int64")}
    out: list = [None, None]

    def read(i):
        ds = sf.read_shard(files, spec, slice_id=i, slice_count=2).batch(100)
        out[i] = np.concatenate([b["id"] for b in ds]).tolist()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out[0] + out[1]) == sorted(f * 10_000 + i for f in range(4) for i in range(3000))
    assert not set(out[0]) & set(out[1])


@pytest.mark.parametrize("readers", [2, 3])
def test_readers_splitting_a_damaged_file_under_skip_count_each_damage_once(tmp_path, readers):
    """One file split into record ranges among readers, under ``on_corrupt="skip"``, the file
    damaged before the pass (a frame's data flipped near where the ranges meet, the file cut
    inside its last frame; no index file): every intact record delivered by exactly one
    reader, each damaged frame counted by exactly one (found from outside: building the
    index to split the file raised, and no reader delivered anything)."""
    import struct

    import numpy as np

    from shardfeed.formats.crc import masked_crc32c

    path = str(tmp_path / "d.tfrecord")
    frames, ends = bytearray(), []
    for i in range(90):
        rec = sf.encode_example({"x": [i], "p": [b"q" * (50 + i)]})
        head = struct.pack("<Q", len(rec))
        frames += head + struct.pack("<I", masked_crc32c(head)) + rec + struct.pack("<I", masked_crc32c(rec))
        ends.append(len(frames))
    bad = 90 // readers  # the first record of the second range, or near it
    frames[ends[bad - 1] + 12 + 5] ^= 0x40  # its data: the data CRC fails
    open(path, "wb").write(bytes(frames[:ends[-1] - 3]))  # the last frame cut inside its data CRC
    spec = {"x": sf.FixedLen("int64"), "p": sf.FixedLen("bytes")}
    seen, skipped = [], 0
    for k in range(readers):
        it = iter(sf.read_tfrecord(path, spec, on_corrupt="skip", slice_id=k, slice_count=readers).batch(8))
        seen += [int(x) for b in it for x in np.asarray(b["x"]).ravel()]
        skipped += it.stats().to_dict()["skipped"]["total"]
    assert sorted(seen) == [i for i in range(89) if i != bad], sorted(set(range(89)) - set(seen))
    assert skipped == 2

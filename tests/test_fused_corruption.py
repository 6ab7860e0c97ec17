"""The fused ``read_tfrecord(files, spec).batch(n)`` path delivers, skips, counts and raises
exactly as the record-by-record reader does, whatever the corruption (issue 36 item 1).

The fused scan leaves the data CRCs to the batch parser, so a frame whose length field lies
(with its length CRC recomputed) looks whole to it; the record reader finds the data CRC
wrong at once and resynchronises byte by byte. Both must agree: the same records (values
equal after parsing), the same skip count and skipped frames (check, file, offset, record
number), the same error under ``on_error="raise"``.
"""

from __future__ import annotations

import gzip
import random
import struct
from typing import Any

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import CorruptRecordError
from shardfeed.formats import native as nv
from shardfeed.formats.crc import masked_length_crc
from shardfeed.formats.example import encode_example
from shardfeed.formats.tfrecord import frame

needs_native = pytest.mark.skipif(not nv.native_available(), reason=f"native extension not built: {nv.native_info()}")

SPEC = {"x": sf.FixedLen("bytes"), "label": sf.FixedLen("int64"), "ids": sf.VarLen("int64")}


def records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [encode_example({"x": rng.bytes(90 + (i * 7) % 40), "label": [seed * 1000 + i],
                            "ids": list(range(i % 4))}) for i in range(n)]


def framed(recs: list[bytes]) -> tuple[bytearray, list[int]]:
    """The file's bytes and where each frame starts."""
    frames = [frame(r) for r in recs]
    starts = [0]
    for f in frames[:-1]:
        starts.append(starts[-1] + len(f))
    return bytearray(b"".join(frames)), starts


def set_length(data: bytearray, at: int, length: int, fix_crc: bool = True) -> None:
    """Write ``length`` into the frame header at ``at``, its length CRC recomputed (or not)."""
    struct.pack_into("<Q", data, at, length)
    if fix_crc:
        struct.pack_into("<I", data, at + 8, masked_length_crc(length))


def _read(make, n: int) -> tuple[list[Any], Any, sf.ReadStats]:
    """What a pass delivers: each record's values (flattened, comparable), the error that
    stopped it (None), and the source's read_stats."""
    src = make()
    out: list[Any] = []
    err = None
    try:
        if n:
            for b in src.batch(n):
                for i in range(len(b["label"])):
                    out.append((bytes(b["x"][i]), int(b["label"][i]), b["ids"].values[
                        b["ids"].row_splits[i]:b["ids"].row_splits[i + 1]].tolist()))
        else:
            for r in src:
                out.append((bytes(r["x"]), int(r["label"]), r["ids"].tolist()))
    except Exception as exc:  # noqa: BLE001 - compared with the other path's
        err = exc
    return out, err, src.read_stats


def _what(err: Any) -> Any:
    if err is None:
        return None
    if isinstance(err, CorruptRecordError):
        return ("corrupt", err.check, err.url, err.offset, err.record_index)
    return (type(err).__name__,)


def _skips(stats: sf.ReadStats) -> list:
    return [(e.check, e.url, e.offset, e.record_index) for e in stats.corrupt]


def check_same(files: list[str], on_error: str, batch: int, compression: Any = "auto",
               num_parallel_reads: Any = sf.AUTOTUNE, chunk_size: int | None = None,
               storage_options: Any = None) -> tuple[list, sf.ReadStats]:
    """The fused pass over ``files`` (its chunks of ``chunk_size`` bytes, when given, so that
    frames straddle chunks) against the record reader's; returns the latter's records and stats."""
    def make(parallel: Any = num_parallel_reads) -> Any:
        src = sf.read_tfrecord(files, SPEC, compression=compression, on_error=on_error,
                               num_parallel_reads=parallel, storage_options=storage_options)
        if chunk_size is not None and parallel is not None:
            src.options = src.options._replace(chunk_size=chunk_size)
        return src
    ref, ref_err, ref_stats = _read(lambda: make(None), 0)
    got, err, stats = _read(make, batch)
    assert _what(err) == _what(ref_err)
    if ref_err is None:
        assert got == ref
    else:  # a batch holding the failure is not delivered
        assert got == ref[: len(ref) // batch * batch]
    assert _skips(stats) == _skips(ref_stats)
    assert (stats.records, stats.skipped_records, stats.skipped_bytes) == \
        (ref_stats.records, ref_stats.skipped_records, ref_stats.skipped_bytes)
    return ref, ref_stats


@needs_native
@pytest.mark.parametrize("batch", [1, 7, 1024])
def test_a_length_that_lies_with_its_crc_fixed_loses_no_record_after_it(tmp_path, batch):
    recs = records(49)
    data, starts = framed(recs)
    set_length(data, starts[25], len(recs[25]) + 100)
    path = tmp_path / "lie.tfrecord"
    path.write_bytes(bytes(data))
    ref, stats = check_same([str(path)], "skip", batch)
    assert [r[1] for r in ref] == [i for i in range(49) if i != 25]  # record 26 kept
    assert stats.skipped_records == 1 and _skips(stats) == [("data crc", str(path), starts[25], 25)]
    check_same([str(path)], "raise", batch)
    with pytest.raises(CorruptRecordError) as info:
        for _ in sf.read_tfrecord(str(path), SPEC).batch(batch):
            pass
    assert (info.value.check, info.value.offset) == ("data crc", starts[25])  # the frame whose length lies


@needs_native
@pytest.mark.parametrize("batch", [1, 7, 1024])
def test_a_truncated_shard_followed_by_an_intact_one_loses_nothing_of_the_second(tmp_path, batch):
    a, _ = framed(records(40, 1))
    b, _ = framed(records(30, 2))
    path = tmp_path / "cat.tfrecord"
    path.write_bytes(bytes(a[:-60]) + bytes(b))  # `cat a_truncated b`
    ref, stats = check_same([str(path)], "skip", batch)
    assert len(ref) == 69 and [r[1] for r in ref][-30:] == [2000 + i for i in range(30)]
    check_same([str(path)], "raise", batch)


@needs_native
def test_a_length_that_swallows_whole_frames_gives_them_back(tmp_path):
    """A lying length that lands exactly on a later frame: the fused scan's chain goes on
    unbroken, and only the parser's data CRC says the frame was wrong."""
    recs = records(30)
    data, starts = framed(recs)
    set_length(data, starts[10], starts[13] - starts[10] - 16)  # frames 10-12 as one
    path = tmp_path / "swallow.tfrecord"
    path.write_bytes(bytes(data))
    for batch in (1, 4, 1024):
        ref, stats = check_same([str(path)], "skip", batch)
        assert [r[1] for r in ref] == [i for i in range(30) if i != 10]
        check_same([str(path)], "raise", batch)


@needs_native
def test_two_adjacent_bad_frames_and_a_second_file(tmp_path):
    recs = records(20)
    data, starts = framed(recs)
    data[starts[5] + 20] ^= 1  # data
    data[starts[6] + 30] ^= 4  # the next frame's data too
    set_length(data, starts[15], 7)
    p1, p2 = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    p1.write_bytes(bytes(data))
    p2.write_bytes(bytes(framed(records(9, 3))[0]))
    for batch in (1, 3, 7, 1024):
        for parallel in (None, 2, sf.AUTOTUNE):
            check_same([str(p1), str(p2)], "skip", batch, num_parallel_reads=parallel)
            check_same([str(p1), str(p2)], "raise", batch, num_parallel_reads=parallel)


def mutate(rng: random.Random, data: bytearray, starts: list[int], lengths: list[int]) -> bytearray:
    """One to three of the corruptions a disk, a link or a buggy writer makes."""
    d = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(9)
        k = rng.randrange(len(starts))
        if not d:
            break
        if op == 0:  # a bit anywhere
            d[rng.randrange(len(d))] ^= 1 << rng.randrange(8)
        elif op == 1:  # a byte overwritten
            d[rng.randrange(len(d))] = rng.randrange(256)
        elif op == 2:  # cut off
            del d[rng.randrange(len(d)):]
        elif op in (3, 4) and starts[k] + 12 <= len(d):  # a length edited, its CRC fixed (3) or not (4)
            delta = rng.choice([1, -1, 100, -5, 4096, rng.randrange(-50, 400)])
            if rng.random() < 0.4 and k + 1 < len(starts):  # swallow the next frames whole
                j = min(len(starts) - 1, k + rng.randrange(1, 4))
                delta = starts[j] - starts[k] - 16 - lengths[k]
            set_length(d, starts[k], max(0, lengths[k] + delta), fix_crc=op == 3)
        elif op == 5:  # bytes inserted
            at = rng.randrange(len(d) + 1)
            d[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 20)))
        elif op == 6:  # bytes deleted
            at = rng.randrange(len(d))
            del d[at:at + rng.randrange(1, 20)]
        elif op == 7:  # a frame's data CRC
            if starts[k] + 16 + lengths[k] <= len(d):
                d[starts[k] + 12 + lengths[k] + rng.randrange(4)] ^= 0x10
        else:  # a frame duplicated or dropped
            end = starts[k] + 16 + lengths[k]
            piece = bytes(d[starts[k]:end])
            if rng.random() < 0.5:
                d[end:end] = piece
            else:
                del d[starts[k]:end]
    return d


def _shard(seed: int) -> tuple[bytearray, list[int], list[int]]:
    recs = records(12 + seed % 9, seed)
    data, starts = framed(recs)
    return data, starts, [len(r) for r in recs]


def run_case(tmp_path: Any, seed: int, name: str = "m") -> int:
    """One differential case: two or three small shards, the first and maybe others
    mutated, read both ways under both policies, with a random batch size, parallelism and
    chunk size; every fourth case GZIP (the framing mutated before compression, or the
    compressed stream cut). Returns how many files were mutated."""
    rng = random.Random(seed)
    gz = seed % 4 == 3
    files = []
    mutated = 0
    for f in range(rng.randrange(2, 4)):
        data, starts, lengths = _shard(seed * 7 + f)
        if f == 0 or rng.random() < 0.4:
            data = mutate(rng, data, starts, lengths)
            mutated += 1
        blob = bytes(data)
        if gz:
            blob = gzip.compress(blob, mtime=0)
            if rng.random() < 0.3:
                blob = blob[: rng.randrange(len(blob) + 1)]
        path = tmp_path / f"{name}{seed}-{f}.tfrecord{'.gz' if gz else ''}"
        path.write_bytes(blob)
        files.append(str(path))
    batch = rng.choice([1, 2, 7, 1024])
    parallel = rng.choice([None, 2, sf.AUTOTUNE])
    chunk = rng.choice([None, 64, 300, 1000])
    comp = "GZIP" if gz else None
    for on_error in ("skip", "raise"):
        check_same(files, on_error, batch, comp, parallel, chunk)
    return mutated


@needs_native
@pytest.mark.parametrize("seed", range(60))
def test_fused_and_record_paths_agree_on_mutated_shards(tmp_path, seed):
    run_case(tmp_path, seed)


@needs_native
@pytest.mark.parametrize("chunk", [64, 200, 700])
def test_a_lie_at_a_chunk_boundary(tmp_path, chunk):
    """The lying frame last in one chunk, the check that fails in the next: the chunk that
    held it is gone by then, and the rewind still reads on from it."""
    recs = records(40)
    data, starts = framed(recs)
    for k in (3, 17, 30):
        set_length(data, starts[k], len(recs[k]) + 37 * k)
    path = tmp_path / "lies.tfrecord"
    path.write_bytes(bytes(data))
    for batch in (1, 7, 1024):
        for parallel in (None, 2, sf.AUTOTUNE):
            ref, stats = check_same([str(path)], "skip", batch, num_parallel_reads=parallel, chunk_size=chunk)
            assert [r[1] for r in ref] == [i for i in range(40) if i not in (3, 17, 30)]
            check_same([str(path)], "raise", batch, num_parallel_reads=parallel, chunk_size=chunk)


@needs_native
def test_object_storage_and_the_cache_read_on_from_the_same_frame(s3_bucket, tmp_path):
    """Remote shards are streamed in ranged reads (and read ahead), or read from the
    object cache's local copy: the rewind reads on from the frame that failed there too."""
    import boto3

    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    recs = records(49)
    data, starts = framed(recs)
    set_length(data, starts[25], len(recs[25]) + 100)
    a, a_starts = framed(records(40, 1))
    urls = []
    for name, blob in (("lie", bytes(data)), ("cat", bytes(a[:-60]) + bytes(framed(records(30, 2))[0]))):
        client.put_object(Bucket=bucket, Key=f"c/{name}.tfrecord", Body=blob)
        urls.append(f"s3://{bucket}/c/{name}.tfrecord")
    for batch in (1, 7, 1024):
        for on_error in ("skip", "raise"):
            ref, stats = check_same(urls, on_error, batch, chunk_size=500, storage_options=opts)
    assert len(ref) == 25  # raised at the lie
    src = sf.read_tfrecord(urls, SPEC, on_error="skip", storage_options=opts, cache_dir=str(tmp_path / "cache"))
    got = [int(v) for b in src.batch(7) for v in b["label"]]
    assert got == [i for i in range(49) if i != 25] + [1000 + i for i in range(39)] + [2000 + i for i in range(30)]
    cut = a_starts[39]  # the frame the cut runs through
    assert [(e.check, e.offset, e.record_index) for e in src.read_stats.corrupt] == [
        ("data crc", starts[25], 25), ("data crc", cut, 39)]
    assert src.read_stats.skipped_records == 2 and src.read_stats.records == len(got)


@needs_native
def test_a_handler_sees_each_bad_frame_once_and_a_dropped_remainder_still_reads_on(tmp_path):
    """``on_error`` as a callable is told of each skipped frame once, as the record reader
    tells it (nothing of a batch read past the failure is reported before the rewind), and
    a last partial batch that holds the failure is read on from it under
    ``drop_remainder``."""
    recs = records(30)
    data, starts = framed(recs)
    set_length(data, starts[12], len(recs[12]) + 100)
    a = tmp_path / "a.tfrecord"
    a.write_bytes(bytes(data) + bytes(framed(records(5, 4))[0])[:-9])  # and a cut last frame
    seen: dict[str, list] = {"record": [], "fused": []}

    def handler(name: str):
        return lambda exc, ctx: seen[name].append((type(exc).__name__, ctx.get("stage"), ctx.get("offset")))

    ref = [int(r["label"]) for r in sf.read_tfrecord(str(a), SPEC, on_error=handler("record"), num_parallel_reads=None)]
    got = [int(v) for b in sf.read_tfrecord(str(a), SPEC, on_error=handler("fused")).batch(4) for v in b["label"]]
    assert got == ref and len(seen["fused"]) == 2 and seen["fused"] == seen["record"]
    dropped = [int(v) for b in sf.read_tfrecord(str(a), SPEC, on_error="skip").batch(4, drop_remainder=True)
               for v in b["label"]]
    assert dropped == ref[: len(ref) // 4 * 4]
    with pytest.raises(CorruptRecordError) as info:
        for _ in sf.read_tfrecord(str(a), SPEC).batch(1024, drop_remainder=True):
            pass
    assert (info.value.check, info.value.offset, info.value.record_index) == ("data crc", starts[12], 12)


def _three_files(tmp_path) -> list[str]:
    recs = records(40)
    data, starts = framed(recs)
    set_length(data, starts[12], len(recs[12]) + 100)
    set_length(data, starts[30], starts[33] - starts[30] - 16)  # swallows 31 and 32
    files = []
    for i, blob in enumerate([bytes(data), bytes(framed(records(25, 1))[0]), bytes(data)[:-50]]):
        p = tmp_path / f"q{i}.tfrecord"
        p.write_bytes(blob)
        files.append(str(p))
    return files


@needs_native
@pytest.mark.parametrize("parallel", [None, 2])
@pytest.mark.parametrize("batch", [1, 5, 1024])
def test_a_queue_reader_reads_on_from_the_frame_in_an_item_it_already_finished(tmp_path, batch, parallel):
    """A queue's items read to their end are acknowledged before their records are
    delivered when the queue has nothing more at once (so a reader never waits on work it
    holds): the rewind still reads such an item on, it is this reader's work."""
    files = _three_files(tmp_path)

    def outcome(n: int, name: str) -> tuple:
        q = sf.WorkQueue(files, backend="memory", name=name, num_slices=3)
        src = sf.read_tfrecord(q, SPEC, on_error="skip", num_parallel_reads=parallel if n else None)
        got = [int(v) for b in src.batch(n) for v in b["label"]] if n else [int(r["label"]) for r in src]
        return sorted(got), sorted((e.url, e.offset, e.check, e.record_index) for e in src.read_stats.corrupt)

    ref = outcome(0, f"r{batch}{parallel}")
    assert len(ref[0]) == 100 and len(ref[1]) == 5
    assert outcome(batch, f"f{batch}{parallel}") == ref


@needs_native
@pytest.mark.parametrize("count", [2, 3])
def test_each_slice_of_a_static_split_agrees(tmp_path, count):
    files = _three_files(tmp_path)
    for index in range(count):
        for batch in (1, 7, 1024):
            for on_error in ("skip", "raise"):
                def make(fused: bool, on_error: str = on_error, index: int = index) -> Any:
                    return sf.read_tfrecord(files, SPEC, on_error=on_error, slice_id=index, slice_count=count,
                                            num_parallel_reads=sf.AUTOTUNE if fused else None)
                ref, ref_err, ref_stats = _read(lambda: make(False), 0)
                got, err, stats = _read(lambda: make(True), batch)
                assert _what(err) == _what(ref_err) and _skips(stats) == _skips(ref_stats)
                assert got == (ref if ref_err is None else ref[: len(ref) // batch * batch])


@pytest.mark.parametrize("bad", ["not an example", "wrong type"])
@pytest.mark.parametrize("skip", [False, True], ids=["raise", "skip"])
def test_a_bad_record_in_a_batch_spanning_two_files_is_named_in_its_own_file(tmp_path, bad, skip):
    """A record that is not an Example (or does not fit the spec) in a batch whose last
    records come from the next file was reported in the next file, at an offset that file
    does not have, with ``url`` None (found from outside)."""
    spec = {"id": sf.FixedLen("int64")}
    wrong = b"\x08\x01\xff\xff not an Example" if bad == "not an example" else encode_example({"id": [b"text"]})
    a = [encode_example({"id": [i]}) for i in range(69)] + [wrong]
    b = [encode_example({"id": [100 + i]}) for i in range(10)]
    sf.write_records(str(tmp_path / "a.tfrecord"), a)
    sf.write_records(str(tmp_path / "b.tfrecord"), b)
    at = sum(16 + len(r) for r in a[:69])
    ds = sf.read_tfrecord([str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")], spec,
                          on_error="skip" if skip else None).batch(64)
    if skip:
        with iter(ds) as it:
            got = [int(v) for batch in it for v in batch["id"]]
            errors = it.stats().to_dict()["skipped"]
        assert got == list(range(69)) + list(range(100, 110))
        (example,) = errors["examples"]
        assert example["offset"] == at and example["where"].endswith("a.tfrecord (record #5 of its batch)")
        return
    with pytest.raises((sf.DecodeError, sf.ParseError)) as info:
        list(ds)
    exc = info.value
    assert exc.url.endswith("a.tfrecord") and exc.offset == at
    assert any(f"byte offset {at} of " in n and n.endswith("a.tfrecord (record #5 of its batch)")
               for n in exc.__notes__), exc.__notes__

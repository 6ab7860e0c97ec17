"""Index files are checked against their shard before use (issue 39 item 2): a stale,
cut, empty or doubled index is rebuilt (a shuffled or split read) or refused naming the
file (random access, a work queue's record ranges); never believed blindly."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.formats.index import StaleIndexError, check_index, load_index

from .test_pipeline_helpers import SPEC, example, write_sized_shards

SIZES = [120, 80, 100]
EVERY = sorted(f * 1000 + i for f, n in enumerate(SIZES) for i in range(n))


def _files(tmp_path):
    return write_sized_shards(tmp_path, SIZES, index=True, prefix="ix")


def _ids(ds):
    return [int(v) for b in ds for v in np.atleast_1d(b["id"])]


def _lines(path):
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


def _write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)


def _damage_last_lines(f):
    _write(f + ".idx", b"".join(_lines(f + ".idx")[:-50]))


def _damage_mid_line(f):
    data = b"".join(_lines(f + ".idx"))
    _write(f + ".idx", data[: len(data) // 3 + 5])


def _damage_empty(f):
    _write(f + ".idx", b"")


def _damage_duplicate(f):
    lines = _lines(f + ".idx")
    _write(f + ".idx", b"".join(lines[:10] + [lines[9]] + lines[10:]))


def _damage_truncated_shard(f):
    with open(f, "r+b") as fh:
        fh.truncate(sum(int(x.split()[1]) for x in _lines(f + ".idx")[:71]))


def _damage_appended_shard(f):
    extra = f + ".extra"
    sf.write_records(extra, [example(5000 + i) for i in range(30)], index=False)
    with open(f, "ab") as fh, open(extra, "rb") as src:
        fh.write(src.read())
    import os

    os.remove(extra)


DAMAGES = {"last-lines": _damage_last_lines, "mid-line": _damage_mid_line, "empty": _damage_empty,
           "duplicate": _damage_duplicate}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("mode", ["global", "blocks"])
def test_a_damaged_index_is_rebuilt_and_every_record_read_once(tmp_path, caplog, damage, mode):
    files = _files(tmp_path)
    DAMAGES[damage](files[0])
    with caplog.at_level(logging.WARNING):
        got = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=3, block_size=16).batch(10))
    assert sorted(got) == EVERY
    assert "ix-000.tfrecord" in caplog.text and "rebuil" in caplog.text
    assert check_index(sf.read_index(files[0] + ".idx"), __import__("os").path.getsize(files[0])) is None


@pytest.mark.parametrize("mode", ["global", "blocks"])
def test_a_shard_truncated_after_its_index_was_built_reads_what_it_holds(tmp_path, mode):
    files = _files(tmp_path)
    _damage_truncated_shard(files[1])
    want = sorted(x for x in EVERY if not 1000 + 71 <= x < 2000)
    got = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=3, block_size=16).batch(10))
    assert sorted(got) == want


@pytest.mark.parametrize("mode", ["global", "blocks"])
def test_records_appended_after_the_index_was_built_are_read(tmp_path, mode):
    files = _files(tmp_path)
    _damage_appended_shard(files[2])
    want = sorted(EVERY + [5000 + i for i in range(30)])
    got = _ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=3, block_size=16).batch(10))
    assert sorted(got) == want


def test_a_split_through_a_stale_index_delivers_every_record_once(tmp_path):
    files = _files(tmp_path)
    _damage_duplicate(files[0])
    _damage_last_lines(files[1])
    got = []
    for r in range(4):
        got += _ids(sf.read_tfrecord(files, spec=SPEC, slice_id=r, slice_count=4).batch(7))
    assert sorted(got) == EVERY


def test_random_access_refuses_a_stale_index_naming_the_file(tmp_path):
    files = _files(tmp_path)
    _damage_last_lines(files[0])
    with pytest.raises(StaleIndexError, match=r"ix-000\.tfrecord\.idx.*ends at byte \d+.*holds \d+ bytes"):
        sf.IndexedTFRecord(files[0])
    with pytest.raises(StaleIndexError, match=r"ix-000\.tfrecord"):
        load_index(files[0])  # not asked to build: refused, not believed
    _damage_duplicate(files[1])
    with pytest.raises(StaleIndexError, match=r"line 11"):
        sf.IndexedTFRecord(files[1])


def test_check_index_names_what_is_wrong():
    idx = np.array([[0, 20], [20, 30], [50, 16]], np.int64)
    assert check_index(idx, 66) is None
    assert "holds 70 bytes" in check_index(idx, 70)
    assert "lists no record" in check_index(idx[:0], 66)
    assert check_index(idx[:0], 0) is None
    assert "line 2" in check_index(np.array([[0, 20], [24, 30]], np.int64), 54)
    assert "starts at byte 4" in check_index(np.array([[4, 20]], np.int64), 24)


def test_a_regenerated_s3_shard_beside_a_stale_index_is_read_whole(s3_bucket, tmp_path):
    import boto3

    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    old = str(tmp_path / "old.tfrecord")
    new = str(tmp_path / "new.tfrecord")
    sf.write_records(old, [example(i) for i in range(200)], index=True)
    sf.write_records(new, [example(i) for i in range(300)], index=False)
    url = f"s3://{bucket}/regen/a.tfrecord"
    client.upload_file(new, bucket, "regen/a.tfrecord")  # regenerated: 300 records
    for mode in ("blocks", "global"):
        client.upload_file(old + ".idx", bucket, "regen/a.tfrecord.idx")  # the index of the old one
        got = _ids(sf.read_tfrecord(url, spec=SPEC, shuffle=mode, seed=1, block_size=32, storage_options=opts)
                   .batch(50))
        assert sorted(got) == list(range(300)), mode


def test_a_work_queue_refuses_record_ranges_through_a_stale_index(tmp_path):
    files = _files(tmp_path)
    _damage_last_lines(files[0])
    with pytest.raises(StaleIndexError, match=r"ix-000\.tfrecord\.idx is a stale index"):
        sf.WorkQueue(files, num_slices=6, backend="memory", name="stale-index")


@pytest.mark.parametrize("mode", ["global", "blocks"])
def test_a_presigned_shards_index_is_kept_in_the_index_cache_never_written_over_the_shard(s3_bucket, tmp_path,
                                                                                            monkeypatch, mode):
    import boto3

    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    path = str(tmp_path / "p.tfrecord")
    sf.write_records(path, [sf.encode_example({"id": i}) for i in range(300)])
    body = open(path, "rb").read()
    client.put_object(Bucket=bucket, Key="signed/p.tfrecord", Body=body)
    url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "signed/p.tfrecord"},
                                        ExpiresIn=3600)
    monkeypatch.setenv("SHARDFEED_CACHE_DIR", str(tmp_path / "cache"))
    ds = sf.read_tfrecord([url], {"id": sf.FixedLen("int64")}, shuffle=mode, seed=1, block_size=50).batch(32)
    for _ in range(2):  # the second pass finds the index in the cache
        assert sorted(x for b in ds for x in b["id"].tolist()) == list(range(300))
    # the moto server checks no signature: a PUT to the signed URL + ".idx" once replaced the shard
    assert client.get_object(Bucket=bucket, Key="signed/p.tfrecord")["Body"].read() == body
    assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["signed/p.tfrecord"]
    assert len(list((tmp_path / "cache" / "index").glob("*.idx"))) == 1


def _slow_index(data: bytes):
    """The line-by-line reader's answer (the reference): the array, or the error's text."""
    from shardfeed.formats import index as index_mod

    path = None
    try:
        import os
        import tempfile

        fd, path = tempfile.mkstemp(suffix=".idx")
        os.write(fd, data)
        os.close(fd)
        saved = index_mod._native_parse_index, index_mod._parse_index_fast
        index_mod._parse_index_fast = lambda d: None  # the loop that names the line
        try:
            return index_mod.read_index(path)
        except sf.ShardfeedError as exc:
            return str(exc).split(": ", 1)[1]
        finally:
            index_mod._native_parse_index, index_mod._parse_index_fast = saved
    finally:
        if path:
            os.remove(path)


def test_the_native_index_parser_agrees_with_the_line_reader_or_hands_over():
    from shardfeed.formats import index as index_mod

    if index_mod._native_parse_index is None:
        pytest.skip("the C core is not built")
    rng = np.random.default_rng(7)
    cases = [b"", b"\n", b"0 100\n100 20\n\n120 16\n", b"0 100\n100 20", b"9223372036854775790 17\n",
             b"9223372036854775791 17\n", b"0 15\n", b"0 100\n100 20 7\n", b"0 100\r\n", b"0\t100\n", b"0 1_000\n",
             b"  0   100  \n", b"0 100\n5\n", b"92233720368547758070 17\n", b"-1 20\n", b"+0 20\n"]
    alphabet = b"0123456789 \n\r\t-x"
    for _ in range(3000):
        n = int(rng.integers(0, 40))
        cases.append(bytes(alphabet[int(i)] for i in rng.integers(0, len(alphabet) if rng.random() < 0.2 else 12, n)))
    for _ in range(500):  # well formed, with spaces and blank lines in odd places
        lines = [b" " * int(rng.integers(0, 3)) + b"%d" % int(rng.integers(0, 1 << 62)) + b" " * int(rng.integers(1, 3))
                 + b"%d" % int(rng.integers(16, 1 << 20)) + b" " * int(rng.integers(0, 2))
                 for _ in range(int(rng.integers(0, 6)))]
        cases.append(b"\n".join(sum(([x, b""] if rng.random() < 0.2 else [x] for x in lines), [])))
    native = 0
    for data in cases:
        fast = index_mod._parse_index_fast(data)
        slow = _slow_index(data)
        if fast is None:
            continue  # handed to the line reader, which says what is wrong or parses what Python reads
        native += 1
        assert isinstance(slow, np.ndarray) and fast.shape == slow.shape and (fast == slow).all(), (data, slow)
    assert native > 500  # the cases reached the native path, not only the hand-over


def test_index_files_read_once_are_reused_until_they_change(tmp_path, monkeypatch):
    # a dataset made again over the same local shards (every epoch, say) finds each index
    # without reading its file again; an index file rewritten since is read again
    from shardfeed.formats import index as index_mod

    files = _files(tmp_path)
    reads: list[str] = []
    real = index_mod.read_index

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(index_mod, "read_index", counted)
    for mode in ("blocks", "global", "blocks"):
        assert sorted(_ids(sf.read_tfrecord(files, spec=SPEC, shuffle=mode, seed=1))) == EVERY
    assert sorted(reads) == sorted(f + ".idx" for f in files)  # each read once, whatever the mode
    sf.build_index(files[1])  # written again: a new modification time
    reads.clear()
    assert sorted(_ids(sf.read_tfrecord(files, spec=SPEC, shuffle="blocks", seed=2))) == EVERY
    assert reads == [files[1] + ".idx"]
    loaded = load_index(files[0])
    assert not loaded.flags.writeable  # shared by every later load: never changed in place


def _rewrite_keeping_size_and_mtime(path: str, records: list[bytes]) -> None:
    """Write ``records`` over the shard at ``path`` and its index in place (same sizes, same
    inodes), their modification times put back: nothing a stat sees has changed."""
    import os

    before = {p: os.stat(p) for p in (path, path + ".idx")}
    tmp = path + ".new"
    with sf.TFRecordWriter(tmp, index=True) as w:
        for r in records:
            w.write(r)
    for src, dst in ((tmp, path), (tmp + ".idx", path + ".idx")):
        with open(src, "rb") as f, open(dst, "r+b") as g:
            data = f.read()
            assert len(data) == before[dst].st_size
            g.write(data)
        os.remove(src)
    for p, st in before.items():
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("batch", [None, 2], ids=["records", "batches"])
@pytest.mark.parametrize("on_corrupt", ["raise", "skip"])
def test_a_shard_rewritten_in_place_under_its_kept_index_is_named_stale_not_skipped(tmp_path, on_corrupt, batch):
    """A shard and its index rewritten with records of other lengths, same sizes, mtimes put
    back (found from outside): the index this process kept (or the file) names bytes that are
    no longer those frames. The frame that fails its check is looked up in the shard's own
    layout (lengths by their CRCs): StaleIndexError naming the shard, under skip too (an
    intact record is never skipped as corrupt); the kept copy is let go, so a dataset made
    after reads the new records. A frame that is damaged is still skipped and counted."""
    path = str(tmp_path / "s.tfrecord")
    spec = {"x": sf.FixedLen("int64"), "p": sf.FixedLen("bytes")}
    first = [sf.encode_example({"x": [i], "p": [b"a" * n]}) for i, n in enumerate([100, 2000, 300, 50, 700])]
    with sf.TFRecordWriter(path, index=True) as w:
        for r in first:
            w.write(r)

    def ids() -> list[int]:
        ds = sf.read_tfrecord(path, spec, shuffle="global", seed=3, on_corrupt=on_corrupt)
        if batch is None:
            return sorted(int(np.asarray(e["x"]).ravel()[0]) for e in ds)
        return sorted(int(x) for b in ds.batch(batch) for x in np.asarray(b["x"]).ravel())

    assert ids() == [0, 1, 2, 3, 4]  # its index is now kept by the process
    second = [sf.encode_example({"x": [10 + i], "p": [b"b" * n]}) for i, n in enumerate([700, 300, 2000, 100, 50])]
    _rewrite_keeping_size_and_mtime(path, second)
    with pytest.raises(StaleIndexError, match=r"s\.tfrecord.*rewritten") as info:
        ids()
    assert info.value.url.endswith("s.tfrecord")
    assert ids() == [10, 11, 12, 13, 14]  # read again from the index file, which is right

    data = bytearray(open(path, "rb").read())  # a damaged frame: the index is right there
    data[12 + 40] ^= 0xFF
    open(path, "wb").write(bytes(data))
    if on_corrupt == "raise":
        with pytest.raises(sf.CorruptRecordError, match="data crc"):
            ids()
    else:
        assert ids() == [11, 12, 13, 14]

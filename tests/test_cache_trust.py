"""The local object cache trusts nothing it has not checked: a replaced object, bit rot,
a planted entry, a folder others can write into, leftovers of a killed reader, a full or
unwritable disk. All through a real S3 API server (moto) on loopback; counts of requests
and bytes are checked against what a proxy saw cross the wire."""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import subprocess
import uuid

import pytest

import shardfeed as sf
from shardfeed import storage
from shardfeed.formats.tfrecord import TFRecordWriter
from shardfeed.storage import cache as cache_mod
from shardfeed.storage.cache import ObjectCache, get_cache


def _records(tag: int, n: int, size: int = 600) -> list[bytes]:
    return [f"{tag}:{j}:".encode() + bytes([(j + tag) % 251]) * (size + j % 200) for j in range(n)]


def _put(url: str, recs: list[bytes], opts: dict) -> None:
    with TFRecordWriter(url, storage_options=opts) as w:
        for r in recs:
            w.write(r)


@pytest.fixture
def objects(s3_bucket, fault_proxy):
    """Three shards in a fresh bucket read through the counting proxy:
    ``(urls, records by url, proxied storage options)``."""
    bucket, opts = s3_bucket
    urls, expected = [], {}
    for i, n in enumerate((800, 300, 1200)):
        url = f"s3://{bucket}/d/part-{i}.tfrecord"
        expected[url] = _records(i, n)
        _put(url, expected[url], opts)
        urls.append(url)
    return urls, expected, {"endpoint_url": fault_proxy.url}


def _entry(cache_dir: str, url: str, opts: dict) -> str:
    return os.path.join(cache_dir, "objects", ObjectCache.key_of(url, opts))


def _rot(path: str, at: int = 200) -> None:
    """Flip bytes in the middle of ``path`` keeping its size and modification time."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(2)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# -- the counters match the wire ---------------------------------------------------------------
def _wire(proxy) -> tuple[int, int]:
    return proxy.object_gets, proxy.object_bytes


@pytest.mark.parametrize("path", [
    "sequential", "batched-prefetch", "cache-fill", "subprocess", "global-shuffle-cached", "blocks",
    "global-shuffle-building-indexes"])
def test_storage_counters_match_what_crossed_the_wire(objects, fault_proxy, tmp_path, path, s3_bucket):
    urls, expected, opts = objects
    spec = None
    kw: dict = {}
    if path != "global-shuffle-building-indexes":
        from shardfeed.formats.index import load_index

        for u in urls:  # index files beside the shards, as `shardfeed index` writes them
            load_index(u, s3_bucket[1], build=True)
    if path in ("cache-fill", "global-shuffle-cached", "global-shuffle-building-indexes"):
        kw["cache_dir"] = str(tmp_path / "cache")
    if path.startswith("global"):
        kw.update(shuffle="global", seed=3)
    if path == "blocks":
        kw.update(shuffle="blocks", seed=3, block_size=100)
    ds = sf.read_tfrecord(urls, spec=spec, storage_options=opts, **kw)
    if path == "batched-prefetch":
        ds = ds.batch(32).prefetch(2)
    if path == "subprocess":
        ds = ds.batch(32).in_subprocess()
    gets, nbytes = _wire(fault_proxy)
    it = iter(ds)
    n = sum(len(x) if path in ("batched-prefetch", "subprocess") else 1 for x in it)
    assert n == sum(len(v) for v in expected.values())
    st = it.stats().storage
    gets, nbytes = fault_proxy.object_gets - gets, fault_proxy.object_bytes - nbytes
    assert nbytes > 0
    assert abs(st.bytes_fetched - nbytes) <= nbytes // 100, (st.bytes_fetched, nbytes)
    assert abs(st.requests - gets) <= max(1, gets // 100), (st.requests, gets)


def test_a_global_shuffle_building_indexes_downloads_each_cached_shard_once(objects, fault_proxy, tmp_path,
                                                                           s3_bucket):
    """No index files: each shard is scanned to build its index through the cache, so
    the pass reads it from there (before, once to build and once more into the cache)."""
    from shardfeed import storage

    urls, expected, opts = objects
    total = sum(storage.size(u, s3_bucket[1]) for u in urls)
    gets, nbytes = _wire(fault_proxy)
    it = iter(sf.read_tfrecord(urls, storage_options=opts, cache_dir=str(tmp_path / "cache"), shuffle="global",
                               seed=5))
    assert sorted(it) == sorted(r for v in expected.values() for r in v)
    assert fault_proxy.object_bytes - nbytes == total == it.stats().storage.bytes_fetched
    assert all(storage.exists(u + ".idx", s3_bucket[1]) for u in urls)


def test_read_bytes_counts_what_it_fetched(objects, fault_proxy):
    from shardfeed import storage
    from shardfeed.storage import IOCounters

    urls, _, opts = objects
    counters = IOCounters()
    gets, nbytes = _wire(fault_proxy)
    data = storage.read_bytes(urls[0], storage_options=opts, counters=counters)
    part = storage.read_bytes(urls[1], 10, 5000, storage_options=opts, counters=counters)
    assert len(part) == 4990
    assert counters.requests == fault_proxy.object_gets - gets == 2
    assert counters.bytes_fetched == fault_proxy.object_bytes - nbytes == len(data) + 4990


# -- a replaced object ------------------------------------------------------------------------
def test_a_replaced_object_is_fetched_again_at_the_next_pass_of_the_same_process(objects, tmp_path, s3_bucket):
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir)
    assert list(ds) == expected[urls[0]]
    new = _records(7, 1000)  # larger than the copy cached
    _put(urls[0], new, s3_bucket[1])
    it = iter(ds)  # the next pass, same process, well inside any time window
    assert list(it) == new
    st = it.stats().storage
    assert st.cache_misses == 1 and st.stat_requests >= 1
    it = iter(ds)  # unchanged since: one check (a HEAD), no GET
    assert list(it) == new
    st = it.stats().storage
    assert st.cache_hits == 1 and st.requests == 0 and st.stat_requests == 1


def test_each_pass_of_a_repeat_checks_each_cached_object_once(objects, tmp_path):
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    list(sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir))
    it = iter(sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir).repeat(3))
    assert sum(1 for _ in it) == 3 * sum(len(v) for v in expected.values())
    st = it.stats().storage
    # one listing page of the shards' folder a pass checks all of them (a HEAD each, before)
    assert st.requests == 0 and st.stat_requests == 3 and st.cache_hits == 3 * len(urls)


# -- bit rot ----------------------------------------------------------------------------------
@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc", "no-crc"])
def test_cached_bit_rot_keeping_size_and_time_is_dropped_and_fetched_again(objects, tmp_path, verify_crc):
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir, verify_crc=verify_crc)
    assert list(ds) == expected[urls[0]]
    _rot(_entry(cache_dir, urls[0], opts))
    it = iter(ds)  # same process: the copy was checked in full before, at the last pass
    assert list(it) == expected[urls[0]]
    assert it.stats().storage.cache_misses == 1
    it = iter(ds)
    assert list(it) == expected[urls[0]] and it.stats().storage.cache_hits == 1


# -- planted entries and folders others can write into ----------------------------------------
def test_a_planted_entry_without_the_sources_etag_is_not_served(objects, tmp_path):
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    get_cache(cache_dir)
    real = b"".join(_frames(expected[urls[0]], tmp_path))
    bad_recs = [bytes([0x58]) * len(r) for r in expected[urls[0]]]
    planted = b"".join(_frames(bad_recs, tmp_path))
    assert len(planted) == len(real)
    path = _entry(cache_dir, urls[0], opts)
    with open(path, "wb") as f:
        f.write(planted)
    from shardfeed.crc import crc32c

    meta = {"url": urls[0], "size": len(planted), "mtime_ns": os.stat(path).st_mtime_ns,
            "crc32c": crc32c(planted, 0), "cached_at": 0.0}  # no ETag
    with open(path + ".json", "w") as f:
        json.dump(meta, f)
    cache_mod._caches.clear()  # a fresh process
    it = iter(sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir))
    assert list(it) == expected[urls[0]]
    assert it.stats().storage.cache_misses == 1


def _frames(recs: list[bytes], tmp_path) -> list[bytes]:
    path = tmp_path / f"{uuid.uuid4().hex}.tfrecord"
    _put(str(path), recs, {})
    return [path.read_bytes()]


@pytest.mark.parametrize("mode,ok", [(0o777, False), (0o1777, True), (0o755, True)])
def test_a_cache_folder_others_can_write_into_is_refused(tmp_path, mode, ok):
    folder = tmp_path / f"c{mode:o}"
    folder.mkdir()
    os.chmod(folder, mode)
    cache_mod._caches.clear()
    if ok:
        assert get_cache(str(folder)) is not None
        return
    with pytest.raises(PermissionError, match=r"(?s)writ.*chmod") as e:
        get_cache(str(folder))
    assert str(folder) in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    (folder / "objects").mkdir(parents=True)
    os.chown(folder / "objects", 65534, 65534)
    cache_mod._caches.clear()
    with pytest.raises(PermissionError, match="owned by"):
        get_cache(str(folder))


# -- leftovers, full and unwritable disks -----------------------------------------------------
def test_partial_downloads_of_a_killed_reader_are_cleaned_at_the_next_open(tmp_path):
    cache_dir = str(tmp_path / "cache")
    c = ObjectCache(cache_dir)  # no cache_limit
    key = "ab" * 16
    part = os.path.join(c.root, f".{key}.x1y2z3.part")
    meta = os.path.join(c.root, f".{key}.q9w8e7.meta")
    live = os.path.join(c.root, f".{'cd' * 16}.a1b2c3.part")
    for p in (part, meta, live):
        with open(p, "wb") as f:
            f.write(b"\0" * 1000)
    with cache_mod._flock(os.path.join(c.root, "cd" * 16 + ".lock")):  # a download under way
        ObjectCache(cache_dir)
        assert not os.path.exists(part) and not os.path.exists(meta)
        assert os.path.exists(live)


@contextlib.contextmanager
def _tmpfs(path, opts: str):
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("shuffle", [None, "global"], ids=["stream", "gather"])
def test_a_full_disk_under_the_cache_is_read_around_with_one_warning(objects, tmp_path, caplog, shuffle):
    urls, expected, opts = objects
    with _tmpfs(tmp_path / f"full{uuid.uuid4().hex[:6]}", "size=600k") as mnt:
        kw = {"shuffle": shuffle, "seed": 1} if shuffle else {}
        ds = sf.read_tfrecord(urls, storage_options=opts, cache_dir=mnt, cache_limit="1G", **kw)
        with caplog.at_level(logging.WARNING, logger="shardfeed.storage.cache"):
            for _ in range(2):
                got = list(ds)
                assert sorted(got) == sorted(r for u in urls for r in expected[u])
        warnings = [r for r in caplog.records if r.name == "shardfeed.storage.cache" and r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and mnt in warnings[0].getMessage()
        assert not [n for n in os.listdir(os.path.join(mnt, "objects")) if n.endswith(".part")]


def test_an_unwritable_cache_dir_is_read_around_with_one_warning(objects, tmp_path, caplog):
    urls, expected, opts = objects
    with _tmpfs(tmp_path / "ro", "size=1m,ro") as mnt:
        cache_mod._caches.clear()
        with caplog.at_level(logging.WARNING, logger="shardfeed.storage.cache"):
            for _ in range(2):
                assert list(sf.read_tfrecord(urls, storage_options=opts, cache_dir=mnt)) == \
                    [r for u in urls for r in expected[u]]
        warnings = [r for r in caplog.records if r.name == "shardfeed.storage.cache" and r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and mnt in warnings[0].getMessage()


# -- the per-pass check: one listing, block CRCs checked as the pass reads -------------------
def _lists(proxy, since: int) -> list[tuple]:
    return [e for e in proxy.log[since:] if e[0] == "GET" and "list-type=2" in e[1]]


def _heads(proxy, since: int) -> list[tuple]:
    return [e for e in proxy.log[since:] if e[0] == "HEAD"]


def test_a_replaced_object_is_detected_through_one_listing_per_pass(objects, fault_proxy, tmp_path, s3_bucket):
    """Same size, other bytes: only the ETag tells. The pass asks storage once (one
    listing page for the folder), not once per cached object."""
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir)
    assert list(ds) == [r for u in urls for r in expected[u]]
    new = [bytes([0x41 + (j % 20)]) * len(r) for j, r in enumerate(expected[urls[1]])]
    _put(urls[1], new, s3_bucket[1])
    since = len(fault_proxy.log)
    it = iter(ds)
    assert list(it) == expected[urls[0]] + new + expected[urls[2]]
    assert len(_lists(fault_proxy, since)) == 1 and not _heads(fault_proxy, since)
    st = it.stats().storage
    assert st.cache_misses == 1 and st.cache_hits == 2
    since = len(fault_proxy.log)
    it = iter(ds)
    assert list(it) == expected[urls[0]] + new + expected[urls[2]]
    assert len(_lists(fault_proxy, since)) == 1 and not _heads(fault_proxy, since)
    assert it.stats().storage.cache_hits == 3 and it.stats().storage.requests == 0


def test_a_denied_listing_falls_back_to_one_head_per_object(objects, fault_proxy, tmp_path, s3_bucket):
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir)
    list(ds)
    fault_proxy.deny = lambda method, path: method == "GET" and "list-type=2" in path
    new = _records(9, 400)
    _put(urls[2], new, s3_bucket[1])
    since = len(fault_proxy.log)
    it = iter(ds)
    assert list(it) == expected[urls[0]] + expected[urls[1]] + new
    assert len(_lists(fault_proxy, since)) == 1  # tried once in the pass, then HEADs
    assert sorted(e[1] for e in _heads(fault_proxy, since)) == sorted(
        "/" + u.split("://", 1)[1] for u in urls)
    assert it.stats().storage.cache_misses == 1


def test_a_remote_object_deleted_between_passes_is_a_clear_error(objects, tmp_path, s3_bucket):
    from shardfeed import storage

    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir)
    list(ds)
    storage.remove(urls[1], s3_bucket[1])
    with pytest.raises(FileNotFoundError) as e:
        list(ds)
    assert urls[1] in str(e.value)


def _plain(url: str, opts: dict) -> list[bytes]:
    from shardfeed.formats.tfrecord import TFRecordReader

    with TFRecordReader(url, storage_options=opts) as r:
        return list(r)


def test_a_cached_copy_corrupted_between_passes_is_never_served(objects, tmp_path, caplog):
    """No TFRecord CRC to catch it (``verify_crc=False``): only the cache's own check
    stands between the damaged copy and the consumer. Damage in the object's last bytes:
    the check must come before the first record goes out, not when the reader gets there."""
    urls, expected, opts = objects
    cache_dir = str(tmp_path / "cache")
    good = _plain(urls[2], opts)
    ds = sf.read_tfrecord(urls[2:], storage_options=opts, cache_dir=cache_dir, verify_crc=False)
    assert list(ds) == good == expected[urls[2]]
    entry = _entry(cache_dir, urls[2], opts)
    _rot(entry, os.path.getsize(entry) - 1000)
    with caplog.at_level(logging.WARNING, logger="shardfeed.storage"):
        it = iter(ds)
        served = list(it)
    assert len(served) == len(good) and served == good
    assert it.stats().storage.cache_misses == 1 and it.stats().storage.cache_hits == 0
    assert any("damaged" in r.getMessage() and entry in r.getMessage() for r in caplog.records)
    it = iter(ds)  # fetched again whole: the next pass reads a good copy
    assert list(it) == good
    assert it.stats().storage.cache_hits == 1 and it.stats().storage.cache_misses == 0


def test_a_folder_listed_in_pages_checks_every_object(objects, fault_proxy, tmp_path, s3_bucket, monkeypatch):
    """Pages of two keys (1000 in real use): an object past the first page is found in a
    page of its own; a subfolder's keys are not the folder's."""
    from shardfeed import storage
    from shardfeed.storage import cache_trust

    monkeypatch.setattr(cache_trust, "LIST_PAGE", 2)
    urls, expected, opts = objects
    storage.write_bytes(urls[0].rsplit("/", 1)[0] + "/a-sub/x.bin", b"x", s3_bucket[1])
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir)
    list(ds)
    new = _records(5, 500)
    _put(urls[2], new, s3_bucket[1])
    since = len(fault_proxy.log)
    it = iter(ds)
    assert list(it) == expected[urls[0]] + expected[urls[1]] + new
    assert 2 <= len(_lists(fault_proxy, since)) <= 3 and not _heads(fault_proxy, since)
    assert it.stats().storage.cache_misses == 1 and it.stats().storage.cache_hits == 2


@pytest.mark.parametrize("shuffle", [None, "blocks", "global"])
@pytest.mark.parametrize("batched", [False, True])
def test_a_corrupt_record_read_through_the_cache_is_named_by_its_object_url(s3_bucket, tmp_path, shuffle, batched):
    """Found from outside: with cache_dir, the error and the skip records named the cached
    copy (cache_dir/objects/<hash>), not the s3:// object; the offset was right."""
    import struct

    from shardfeed.formats.crc import masked_crc32c

    bucket, opts = s3_bucket
    recs = [sf.encode_example({"id": [i]}) for i in range(40)]
    frames = [struct.pack("<Q", len(r)) + struct.pack("<I", masked_crc32c(struct.pack("<Q", len(r)))) + r
              + struct.pack("<I", masked_crc32c(r)) for r in recs]
    bad_at = sum(len(f) for f in frames[:17])
    data = bytearray(b"".join(frames))
    data[bad_at + 14] ^= 0xFF  # record 17's data: its data CRC fails
    import boto3

    boto3.client("s3", endpoint_url=opts["endpoint_url"]).put_object(Bucket=bucket, Key="c/part-0.tfrecord",
                                                                      Body=bytes(data))
    url = f"s3://{bucket}/c/part-0.tfrecord"
    spec = {"id": sf.FixedLen("int64")}

    def make(policy: str, cache: str) -> sf.Dataset:
        ds = sf.read_tfrecord([url], spec=spec if batched else None, shuffle=shuffle, seed=1 if shuffle else None,
                              storage_options=opts, cache_dir=cache, on_corrupt=policy)
        return ds.batch(8) if batched else ds

    for fill in (False, True):  # a cache filled by this very pass, and one filled before it
        cache = str(tmp_path / f"cache-{fill}-{shuffle}-{batched}")
        if fill:
            list(make("skip", cache))
        with pytest.raises(sf.CorruptRecordError) as info:
            list(make("raise", cache))
        assert (info.value.url, info.value.offset) == (url, bad_at) and url in str(info.value)
        with iter(make("skip", cache)) as it:
            for _ in it:
                pass
            examples = it.stats().to_dict()["skipped"]["examples"]
        assert [(e["url"], e["offset"]) for e in examples] == [(url, bad_at)]


@pytest.mark.parametrize("shuffle", ["blocks", "global"])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("given", ["urls", "glob"])
def test_a_pass_that_builds_indexes_counts_its_heads_listings_and_puts_as_the_wire_saw_them(
        objects, fault_proxy, tmp_path, shuffle, cached, given):
    """Found from outside: a first pass over shards without index files counted its probes of
    the missing .idx as GETs, and none of its HEADs, listings or the PUTs of the new indexes;
    over a glob, stats and missing .idx files that the glob's listing answered (no request)
    were counted as HEADs and listings (60 where the wire saw 8, then 20 where it saw none).
    The second pass (indexes there) is counted too."""
    urls, expected, opts = objects
    kw = {"cache_dir": str(tmp_path / "cache")} if cached else {}
    src = urls if given == "urls" else urls[0].rsplit("/", 1)[0] + "/*.tfrecord"
    assert given == "urls" or storage.glob(src, opts) == sorted(urls)
    for n in range(2):
        ds = sf.read_tfrecord(src, storage_options=opts, shuffle=shuffle, seed=2, **kw)  # built: its HEADs before
        before = collections.Counter(fault_proxy.kinds)
        gets = fault_proxy.object_gets
        with iter(ds) as it:
            assert sum(1 for _ in it) == sum(len(v) for v in expected.values())
            st = it.stats().storage
        wire = collections.Counter(fault_proxy.kinds)
        wire.subtract(before)
        assert st.requests == fault_proxy.object_gets - gets, (n, st.requests, wire)
        assert st.stat_requests == wire["HEAD"] + wire["LIST"], (n, st.stat_requests, wire)
        assert st.put_requests == wire["PUT"] == (len(urls) if n == 0 else 0), (n, st.put_requests, wire)

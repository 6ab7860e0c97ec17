"""Object storage at full speed: parallel ranged reads, the local cache, accounting,
timeouts; all through a real S3 API server (moto) on loopback, with faults injected by a
proxy in front of it."""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time

import boto3
import pytest

import shardfeed as sf
from shardfeed import storage
from shardfeed.errors import StorageError
from shardfeed.formats.tfrecord import TFRecordWriter
from shardfeed.storage import fetch
from shardfeed.storage.cache import ObjectCache, parse_size
from shardfeed.storage.fetch import RangeStream


def _records(i: int, n: int, size: int = 700) -> list[bytes]:
    return [f"{i}:{j}:".encode() + bytes([j % 251]) * (size + j % 300) for j in range(n)]


@pytest.fixture
def shards(s3_bucket, tmp_path):
    """Four shards in a fresh bucket: ``(urls, records by url, storage_options, bucket)``."""
    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    urls, expected = [], {}
    for i, n in enumerate((1500, 40, 2500, 900)):
        path = tmp_path / f"part-{i}.tfrecord"
        recs = _records(i, n)
        with TFRecordWriter(str(path)) as w:
            for r in recs:
                w.write(r)
        client.upload_file(str(path), bucket, f"train/part-{i}.tfrecord")
        url = f"s3://{bucket}/train/part-{i}.tfrecord"
        urls.append(url)
        expected[url] = recs
    return urls, expected, opts, bucket


def _all(expected, urls):
    return [r for u in urls for r in expected[u]]


def _object_bytes(urls, opts):
    return sum(storage.size(u, opts) for u in urls)


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 64 KiB and a first range of 4 KiB, so that small test objects take many
    ranged requests in flight at once."""
    monkeypatch.setattr(fetch, "FIRST_PART", 4 << 10)
    monkeypatch.setattr(fetch, "MIN_PART", 64 << 10)
    monkeypatch.setattr(fetch, "MAX_PART", 64 << 10)


# -- parallel ranged reads --------------------------------------------------------------------
@pytest.mark.parametrize("direct", [True, False], ids=["direct-get", "s3fs-get"])
def test_remote_read_is_parallel_ranges_in_order_with_every_byte_counted(shards, small_parts, direct):
    urls, expected, opts, _ = shards
    it = iter(sf.read_tfrecord(urls, storage_options={**opts, "direct_get": direct}))
    got = list(it)
    assert got == _all(expected, urls)
    st = it.stats().storage
    assert st.bytes_fetched == _object_bytes(urls, opts)  # every byte once, nothing twice
    assert (RangeStream(urls[0], storage_options={**opts, "direct_get": direct}).direct is not None) == direct
    assert st.requests > len(urls) * 3  # many ranges per object, not one stream
    assert st.retries == 0 and st.mb_per_s > 0
    assert it.stats().to_dict()["storage"]["requests"] == st.requests


@pytest.mark.parametrize("start,end", [(0, None), (1, 2), (5000, 70000), (4095, 4097), (0, 4096), (123457, None)])
def test_range_stream_returns_exactly_the_bytes_asked_for(s3_bucket, small_parts, start, end):
    bucket, opts = s3_bucket
    data = os.urandom(200_003)
    storage.write_bytes(f"s3://{bucket}/blob.bin", data, opts)
    counters = storage.IOCounters()
    with RangeStream(f"s3://{bucket}/blob.bin", start, end, opts, counters) as s:
        got = s.readall()
    assert got == data[start:end]
    assert counters.bytes_fetched == len(got)


def test_only_the_stream_a_reader_waits_on_starts_with_a_small_range(s3_bucket):
    # the oldest open stream (the one the reader takes bytes from next) asks for a small
    # first range, so its records go out after one round trip; a stream opened behind it
    # (read ahead: a shuffled block, the next shard) asks for whole parts from the start,
    # one request for a span of a part or less instead of two
    bucket, opts = s3_bucket
    data = os.urandom(fetch.FIRST_PART * 3)
    storage.write_bytes(f"s3://{bucket}/blob.bin", data, opts)
    url, end = f"s3://{bucket}/blob.bin", fetch.FIRST_PART * 3
    front, behind = storage.IOCounters(), storage.IOCounters()
    with RangeStream(url, 0, end, opts, front) as first, RangeStream(url, 0, end, opts, behind) as second:
        assert second.readall() == data
        assert first.readall() == data
    assert behind.requests == 1
    assert front.requests == 2  # FIRST_PART, then the rest in one part


@pytest.mark.parametrize("tail,gets", [(0, 1), (8 << 10, 1), ((8 << 10) + 1, 2), (64 << 10, 2)])
def test_a_range_of_a_part_and_a_short_tail_is_one_get(s3_bucket, small_parts, tail, gets):
    # a shuffled block is a part's worth of bytes plus part of its last record: that tail
    # (at most 1/8 of a part) rides with the part instead of paying its own round trip
    bucket, opts = s3_bucket
    data = os.urandom(200_000)
    storage.write_bytes(f"s3://{bucket}/tail.bin", data, opts)
    counters = storage.IOCounters()
    end = 1000 + (64 << 10) + tail
    with RangeStream(f"s3://{bucket}/tail.bin", 1000, end, opts, counters, small_first=False) as s:
        assert s.readall() == data[1000:end]
    assert counters.requests == gets and counters.bytes_fetched == end - 1000


def test_a_span_read_ahead_is_one_chunk_from_its_start(shards):
    # the pass's first span starts with a small chunk (its records go out after one ranged
    # read), the next ones doubling up to chunk_size (the rest of a first batch waits for
    # a range or two, not chunk_size bytes); a span read ahead of the consumer (a shuffled
    # block, the next shard) comes in chunks of chunk_size from its start, so a short span
    # is one chunk and a batch is not copied together from two of its chunks
    from shardfeed.formats.chunks import FIRST_CHUNK, iter_frame_chunks

    urls, expected, opts, _ = shards
    big = urls[2]  # 2,500 records of about 850 bytes: more than FIRST_CHUNK
    assert storage.size(big, opts) > 2 * FIRST_CHUNK
    waited = list(iter_frame_chunks(big, storage_options=opts, chunk_size=8 << 20))
    ahead = list(iter_frame_chunks(big, storage_options=opts, chunk_size=8 << 20, first_chunk=8 << 20))
    assert 7 * FIRST_CHUNK < storage.size(big, opts) < 15 * FIRST_CHUNK
    assert len(waited) == 4 and len(ahead) == 1  # 1, 2 and 4 x FIRST_CHUNK, then the rest
    assert len(waited[0].buffer) == FIRST_CHUNK and 2 * FIRST_CHUNK <= len(waited[1].buffer) < 3 * FIRST_CHUNK
    for chunks in (waited, ahead):
        assert [bytes(c.buffer[o:o + n]) for c in chunks for o, n in zip(c.offsets, c.lengths)] == expected[big]
    # through the source: every span after the first is read as one chunk
    sf.build_index(big, storage_options=opts)
    got = list(sf.read_tfrecord(big, storage_options=opts, shuffle="blocks", seed=3, block_size=500))
    assert sorted(got) == sorted(expected[big])


@pytest.mark.parametrize("direct", [True, False], ids=["direct-get", "s3fs-get"])
def test_a_stream_learns_the_object_size_from_its_first_range(shards, fault_proxy, direct):
    # with no size seen in a listing, the direct GET's Content-Range tells the size: no
    # HEAD per object (s3fs's cat_file does not show headers: one HEAD each). An
    # empty object's answer (416) need not say its size: it may take a HEAD.
    urls, expected, _, bucket = shards
    opts = {"endpoint_url": fault_proxy.url, "direct_get": direct}
    boto3.client("s3", endpoint_url=fault_proxy.url).put_object(Bucket=bucket, Key="train/empty.tfrecord", Body=b"")
    empty = f"s3://{bucket}/train/empty.tfrecord"
    got, ends, stat_requests = {}, {}, {}
    for url in [*urls, empty]:
        counters = storage.IOCounters()
        with RangeStream(url, storage_options=opts, counters=counters) as s:
            got[url] = bytes(s.readall())
            ends[url] = s.end
        stat_requests[url] = counters.stat_requests
    heads = {path.rsplit("/", 1)[1] for m, path, _, _ in fault_proxy.log if m == "HEAD"}
    if direct:
        assert heads <= {"empty.tfrecord"} and all(stat_requests[u] == 0 for u in urls)
    else:
        # one HEAD each, run beside the first range (it may still be in flight when the
        # stream ends, so it is not always counted yet), never a second one
        assert all(stat_requests[u] <= 1 for u in urls), stat_requests
        assert len(heads) <= len(urls) + 1
    assert got[empty] == b""
    for url in urls:
        assert ends[url] == len(got[url]) == storage.size(url, opts)
        assert [bytes(r) for r in sf.read_tfrecord(url, storage_options=opts)] == expected[url] == \
            _frames(got[url])


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 8], "little")
        out.append(data[pos + 12:pos + 12 + n])
        pos += 16 + n
    return out


def test_range_stream_of_an_empty_and_a_tiny_object(s3_bucket):
    bucket, opts = s3_bucket
    storage.write_bytes(f"s3://{bucket}/empty.bin", b"", opts)
    storage.write_bytes(f"s3://{bucket}/tiny.bin", b"abc", opts)
    with RangeStream(f"s3://{bucket}/empty.bin", storage_options=opts) as s:
        assert s.read() == b""
    with RangeStream(f"s3://{bucket}/tiny.bin", storage_options=opts) as s:
        assert s.readall() == b"abc"
    assert list(sf.read_tfrecord(f"s3://{bucket}/empty.bin", storage_options=opts)) == []


def test_a_stream_woken_the_moment_it_registers_is_already_whole(s3_bucket, monkeypatch):
    # another thread's wake() (a stream closing, room given back) may reach a stream right
    # after it registers with the pool; it must find the stream fully built (gather's 16
    # concurrent per-record streams hit this as AttributeError: no attribute 'pending')
    bucket, opts = s3_bucket
    storage.write_bytes(f"s3://{bucket}/blob.bin", bytes(range(256)) * 64, opts)
    real = fetch._Pool.register

    def register_then_wake(self, stream):
        sid = real(self, stream)
        self.wake()
        return sid

    monkeypatch.setattr(fetch._Pool, "register", register_then_wake)
    with RangeStream(f"s3://{bucket}/blob.bin", 100, 4100, opts) as s:
        assert s.readall() == (bytes(range(256)) * 64)[100:4100]


def test_record_ranges_of_one_object_fetch_disjoint_bytes(shards, small_parts):
    urls, expected, opts, _ = shards
    big = urls[2]
    sf.build_index(big, storage_options=opts)
    total, fetched = [], 0
    for k in range(3):
        it = iter(sf.read_tfrecord(big, storage_options=opts, slice_id=k, slice_count=3))
        total += list(it)
        fetched += it.stats().storage.bytes_fetched
    assert total == expected[big]
    assert fetched == storage.size(big, opts)


def test_reads_survive_503_resets_and_a_stalled_connection_and_count_each_retry(shards, fault_proxy, small_parts):
    urls, expected, _, _ = shards
    # a 2 s read timeout against 5 s stalls. On a loaded machine an ordinary request may take
    # over 2 s too and is then retried as well (24 retries for 12 faults in a rehearsal), so the
    # retries are checked against the requests the proxy saw: every request beyond the first
    # of its (method, path, Range) is a retry, and every injected fault is among them
    proxied = {"endpoint_url": fault_proxy.url, "read_timeout": 2, "connect_timeout": 2}
    ds = sf.read_tfrecord(urls, storage_options=proxied)  # listed before the faults begin
    fault_proxy.fail_every = 5
    fault_proxy.reset_every = 7
    fault_proxy.stall_every = 11
    fault_proxy.stall_s = 5
    fault_proxy.max_faults = 12
    storage.reset_retry_stats()
    seen_before = len(fault_proxy.log)
    it = iter(ds)
    assert list(it) == _all(expected, urls)  # every record exactly once, in order
    st = it.stats().storage
    requests = [(m, path, rng) for m, path, rng, _ in fault_proxy.log[seen_before:]]
    assert fault_proxy.failed > 0
    assert st.retries == len(requests) - len(set(requests))  # each repeated request counted once
    assert st.retries >= fault_proxy.failed  # each injected fault retried
    assert storage.retry_stats()["retries"] == st.retries


def test_a_body_cut_short_by_a_clean_close_is_retried(shards, fault_proxy, small_parts):
    """A ranged GET whose body ends (the connection closed cleanly) before the bytes its
    Content-Length promised is a transport fault, retried like a reset: every record once,
    in order, and no 'short read ... changed while it was read' error for an object that
    never changed (found from outside: the pass ended at the first cut body)."""
    urls, expected, _, _ = shards
    ds = sf.read_tfrecord(urls, storage_options={"endpoint_url": fault_proxy.url})
    fault_proxy.truncate_every = 3
    fault_proxy.max_faults = 6
    storage.reset_retry_stats()
    it = iter(ds)
    assert list(it) == _all(expected, urls)
    assert fault_proxy.truncated == 6
    assert it.stats().storage.retries >= 6
    assert storage.retry_stats()["by_reason"].get("IncompleteRead", 0) >= 6


def _replace_on(fault_proxy, bucket, key, body, first_range):
    """Make the proxy put ``body`` at ``key`` (straight into the store) just before the first
    GET of it whose Range header starts with ``bytes=0-`` (``first_range``), or, when not,
    just before the first GET of a later range made once an earlier GET was answered: the
    pass's ranges go out in parallel, and one that overtakes the first to the proxy (a CI run
    under load) would otherwise replace the object before any of it was read, a pass then
    rightly reading the new version whole."""
    client = boto3.client("s3", endpoint_url=f"http://{fault_proxy.target_host}:{fault_proxy.target_port}")
    done = []

    def before(method, path, rng):
        if method == "GET" and path.split("?", 1)[0].endswith("/" + key) and rng and not done \
                and rng.startswith("bytes=0-") == first_range and (first_range or fault_proxy.object_gets > 0):
            done.append(rng)
            with fault_proxy.quiesce():
                client.put_object(Bucket=bucket, Key=key, Body=body)

    fault_proxy.before = before
    return done


def _tfrecord_bytes(tmp_path, recs):
    path = tmp_path / "other.tfrecord"
    with TFRecordWriter(str(path)) as w:
        for r in recs:
            w.write(r)
    return path.read_bytes()


@pytest.mark.parametrize("where", ["url", "glob"])
def test_an_object_replaced_between_two_ranges_of_a_pass_is_an_error_not_a_stitched_read(
        shards, fault_proxy, small_parts, tmp_path, where):
    """An object replaced by another of the same size while a pass reads it: the later ranges
    ask for the version the first answer came from (If-Match its ETag), and a 412, or an answer
    of another ETag (a store that ignores If-Match), is an error naming the object, instead of records of two versions delivered without a word
    (found from outside: every frame of both checks out)."""
    urls, expected, _, bucket = shards
    other = _tfrecord_bytes(tmp_path, _records(9, 2500))
    old = storage.read_bytes(urls[2], storage_options=shards[2])
    assert len(other) == len(old) and other != old
    done = _replace_on(fault_proxy, bucket, "train/part-2.tfrecord", other, first_range=False)
    opts = {"endpoint_url": fault_proxy.url}
    src = urls[2] if where == "url" else f"s3://{bucket}/train/part-2*.tfrecord"
    it = iter(sf.read_tfrecord(src, storage_options=opts))
    with pytest.raises(StorageError, match="part-2.tfrecord.*changed while.*ETag"):
        list(it)
    assert done and it.stats().storage.retries == 0  # a changed object is not retried (this pass's own count)


def test_an_object_grown_since_its_listing_is_an_error_not_read_at_the_listed_size(shards, fault_proxy, small_parts,
                                                                                   tmp_path):
    """An object listed at one size and replaced by a bigger one before its first GET: the
    answer's Content-Range says the size now, which is not the listed one: an error naming
    the object, not the new version read to the old size with its tail lost without a word."""
    urls, _, _, bucket = shards
    bigger = _tfrecord_bytes(tmp_path, _records(9, 3000))
    done = _replace_on(fault_proxy, bucket, "train/part-2.tfrecord", bigger, first_range=True)
    with pytest.raises(StorageError, match="part-2.tfrecord.*changed while"):
        list(sf.read_tfrecord(f"s3://{bucket}/train/part-2*.tfrecord", storage_options={"endpoint_url": fault_proxy.url}))
    assert done


def test_keys_holding_a_question_mark_are_listed_and_read(s3_bucket, tmp_path):
    """A '?' in a key (legal in S3) is part of the key, not the start of shardfeed's URL
    parameters (endpoint, host, role_arn): the glob's URLs read, and the URL given itself
    (found from outside: 'no such file or object' for a key the glob had listed)."""
    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    want = {}
    for i, key in enumerate(("q/a.tfrecord", "q/x?y.tfrecord", "q/p?v=1.tfrecord")):
        path = tmp_path / f"{i}.tfrecord"
        want[key] = _records(i, 20 + i)
        with TFRecordWriter(str(path)) as w:
            for r in want[key]:
                w.write(r)
        client.upload_file(str(path), bucket, key)
    urls = storage.glob(f"s3://{bucket}/q/*.tfrecord", storage_options=opts)
    assert sorted(urls) == sorted(f"s3://{bucket}/{k}" for k in want)
    assert sorted(sf.read_tfrecord(f"s3://{bucket}/q/*.tfrecord", storage_options=opts)) == \
        sorted(r for v in want.values() for r in v)
    assert list(sf.read_tfrecord(f"s3://{bucket}/q/p[?]v=1.tfrecord", storage_options=opts)) == want["q/p?v=1.tfrecord"]
    assert storage.read_bytes(f"s3://{bucket}/q/x?y.tfrecord", storage_options=opts) == (tmp_path / "1.tfrecord").read_bytes()
    assert storage.parse_url(f"oss://{bucket}/q/a?endpoint=e.example.com").query == (("endpoint", "e.example.com"),)


def test_a_refused_or_vanished_object_is_a_clear_error_not_retried(shards, fault_proxy):
    urls, _, _, bucket = shards
    proxied = {"endpoint_url": fault_proxy.url}
    ds = sf.read_tfrecord(urls[:1], storage_options=proxied)
    fault_proxy.fail_every = 1
    fault_proxy.status = 403
    storage.reset_retry_stats()
    with pytest.raises(PermissionError, match="access denied"):
        list(ds)
    assert storage.retry_stats()["retries"] == 0
    fault_proxy.fail_every = 0
    ds = sf.read_tfrecord(urls[1:2], storage_options=proxied)
    boto3.client("s3", endpoint_url=shards[2]["endpoint_url"]).delete_object(Bucket=bucket, Key="train/part-1.tfrecord")
    with pytest.raises(FileNotFoundError, match="part-1.tfrecord"):
        list(ds)


def test_max_concurrency_caps_requests_in_flight(shards, small_parts, monkeypatch):
    urls, expected, opts, _ = shards
    peak = {"now": 0, "max": 0}
    real = RangeStream._get

    lock = threading.Lock()

    def counting(self, *args):
        with lock:
            peak["now"] += 1
            peak["max"] = max(peak["max"], peak["now"])
        try:
            time.sleep(0.005)
            return real(self, *args)
        finally:
            with lock:
                peak["now"] -= 1

    monkeypatch.setattr(RangeStream, "_get", counting)
    got = list(sf.read_tfrecord(urls, storage_options={**opts, "max_concurrency": 2}))
    assert got == _all(expected, urls)
    assert peak["max"] <= 2
    with pytest.raises(ValueError, match="max_concurrency"):
        list(sf.read_tfrecord(urls, storage_options={**opts, "max_concurrency": 0}))


def test_link_plan_follows_latency_and_rate():
    fast, slow = fetch.Link(), fetch.Link()
    for _ in range(10):
        fast.record(4096, 0.0005)
        fast.record(8 << 20, 0.0005 + (8 << 20) / 2e9)  # 2 GB/s a connection, 0.5 ms
        slow.record(4096, 0.020)
        slow.record(4 << 20, 0.020 + (4 << 20) / 25e6)  # 25 MB/s a connection, 20 ms
    lat, rate = slow.estimate()
    assert 0.015 < lat < 0.025 and 20e6 < rate < 30e6
    fast_part, fast_n = fast.plan()
    slow_part, slow_n = slow.plan()
    assert slow_n > fast_n  # a slow link needs more connections
    assert slow.plan(cap=3)[1] == 3


@pytest.mark.slow
def test_dead_endpoint_fails_after_one_retry_with_default_timeouts():
    # a listening socket that never answers: connects, then nothing comes back
    from shardfeed.storage.fs import get_filesystem

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    opts = {"endpoint_url": f"http://127.0.0.1:{port}"}
    storage.clear_cache()
    get_filesystem("s3://some-bucket/x.tfrecord", opts)  # s3fs imported and the client made before timing
    storage.reset_retry_stats()
    t = time.monotonic()
    try:
        with pytest.raises(StorageError, match="after retries"):
            storage.read_bytes("s3://some-bucket/x.tfrecord", storage_options=opts)
    finally:
        sock.close()
        storage.clear_cache()
    # what keeps it within 30 s (about 20 s here), counted rather than timed: the first
    # attempt's 10 s read timeout, one retry, and no third attempt once the 10 s retry
    # deadline passed (a loaded machine only makes each attempt longer)
    assert storage.retry_stats()["retries"] == 1 and storage.retry_stats()["gave_up"] == 1
    assert time.monotonic() - t < 60  # a hang guard only


def test_bad_timeout_options_are_clear_errors(s3_bucket):
    bucket, opts = s3_bucket
    with pytest.raises(ValueError, match="read_timeout"):
        storage.read_bytes(f"s3://{bucket}/x", storage_options={**opts, "read_timeout": -1})


def test_http_objects_are_read_in_parallel_ranges(tmp_path, small_parts):
    from tests.conftest import serve_directory

    recs = _records(0, 2000)
    with TFRecordWriter(str(tmp_path / "a.tfrecord")) as w:
        for r in recs:
            w.write(r)
    served: dict = {}
    with serve_directory(str(tmp_path), served) as base:
        it = iter(sf.read_tfrecord(f"{base}/a.tfrecord"))
        assert list(it) == recs
    assert served["a.tfrecord"] == os.path.getsize(tmp_path / "a.tfrecord")
    assert it.stats().storage.requests > 3


# -- the cache --------------------------------------------------------------------------------
def test_second_epoch_with_a_cache_makes_no_requests(shards, fault_proxy, tmp_path):
    urls, expected, _, _ = shards
    proxied = {"endpoint_url": fault_proxy.url}
    cache = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls, storage_options=proxied, cache_dir=cache).repeat(2)
    it = iter(ds)
    assert list(it) == _all(expected, urls) * 2
    st = it.stats().storage
    assert st.cache_misses == len(urls) and st.cache_hits == len(urls)
    assert st.bytes_fetched == _object_bytes(urls, proxied)  # the second epoch fetched nothing
    # object GETs: the pass's check of the cached objects is one listing (a GET of the bucket)
    gets_before = sum(1 for m, p, _, _ in fault_proxy.log if m == "GET" and "list-type=2" not in p)
    it2 = iter(sf.read_tfrecord(urls, storage_options=proxied, cache_dir=cache))
    assert list(it2) == _all(expected, urls)
    assert sum(1 for m, p, _, _ in fault_proxy.log if m == "GET" and "list-type=2" not in p) == gets_before
    assert it2.stats().storage.requests == 0 and it2.stats().storage.cache_hits == len(urls)


def test_cache_from_the_environment(shards, tmp_path, monkeypatch):
    urls, expected, opts, _ = shards
    monkeypatch.setenv("SHARDFEED_CACHE_DIR", str(tmp_path / "envcache"))
    it = iter(sf.read_tfrecord(urls, storage_options=opts))
    assert list(it) == _all(expected, urls)
    assert it.stats().storage.cache_misses == len(urls)
    assert os.path.isdir(tmp_path / "envcache" / "objects")


@pytest.mark.parametrize("damage", ["truncate", "alter", "delete-meta"])
def test_a_damaged_cached_file_is_detected_and_fetched_again(shards, tmp_path, damage):
    urls, expected, opts, _ = shards
    cache_dir = str(tmp_path / "cache")
    assert list(sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir)) == expected[urls[0]]
    key = ObjectCache.key_of(urls[0], opts)
    path = os.path.join(cache_dir, "objects", key)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif damage == "alter":
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(100)
            f.write(b"\xff\xfe")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its time put back
        from shardfeed.storage import cache as cache_mod
        cache_mod._caches.clear()  # a new process: checks the CRC on first use
    else:
        os.unlink(path + ".json")
    it = iter(sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir))
    assert list(it) == expected[urls[0]]
    assert it.stats().storage.cache_misses == 1


def test_an_object_changed_in_storage_is_fetched_again(shards, tmp_path):
    urls, expected, opts, bucket = shards
    cache_dir = str(tmp_path / "cache")
    list(sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir))
    new = _records(9, 30)
    with TFRecordWriter(urls[0], storage_options=opts) as w:
        for r in new:
            w.write(r)
    from shardfeed.storage import cache as cache_mod
    cache_mod._caches.clear()  # as a new process would
    it = iter(sf.read_tfrecord(urls[:1], storage_options=opts, cache_dir=cache_dir))
    assert list(it) == new
    assert it.stats().storage.cache_misses == 1


def _read_counting(args):
    urls, opts, cache_dir = args
    it = iter(sf.read_tfrecord(urls, storage_options=opts, cache_dir=cache_dir))
    n = sum(1 for _ in it)
    return n, it.stats().storage.to_dict()


def test_three_processes_share_the_cache_and_download_each_object_once(shards, tmp_path):
    urls, expected, opts, _ = shards
    cache_dir = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.map(_read_counting, [(urls, opts, cache_dir)] * 3)
    assert all(n == len(_all(expected, urls)) for n, _ in results)
    assert sum(r["cache_misses"] for _, r in results) == len(urls)
    assert sum(r["bytes_fetched"] for _, r in results) == _object_bytes(urls, opts)


def test_a_cache_half_the_dataset_keeps_a_fixed_half_and_touches_nothing_else(shards, tmp_path):
    urls, expected, opts, _ = shards
    cache_dir = tmp_path / "cache"
    (cache_dir / "objects").mkdir(parents=True)
    foreign = [cache_dir / "mine.txt", cache_dir / "objects" / "notes.json",
               cache_dir / "objects" / ("0" * 32), cache_dir / "objects" / ("0" * 32 + ".json")]
    for p in foreign:
        p.write_bytes(b"not the cache's")
    old = time.time() - 10 * 86400
    for p in foreign:
        os.utime(p, (old, old))
    total = _object_bytes(urls, opts)
    limit = total // 2
    fetched = []
    for _ in range(3):
        it = iter(sf.read_tfrecord(urls, storage_options=opts, cache_dir=str(cache_dir), cache_limit=limit))
        assert list(it) == _all(expected, urls)
        fetched.append(it.stats().storage.bytes_fetched)
        assert ObjectCache(str(cache_dir)).usage() <= limit
    assert fetched[0] == total
    assert fetched[1] == fetched[2] <= 0.55 * total + max(storage.size(u, opts) for u in urls) * 0
    for p in foreign:
        assert p.read_bytes() == b"not the cache's"


def test_eviction_makes_room_from_entries_nobody_used_lately(shards, tmp_path):
    urls, expected, opts, _ = shards
    cache_dir = str(tmp_path / "cache")
    sizes = [storage.size(u, opts) for u in urls]
    list(sf.read_tfrecord(urls[0], storage_options=opts, cache_dir=cache_dir))
    old_key = ObjectCache.key_of(urls[0], opts)
    lock = os.path.join(cache_dir, "objects", old_key + ".lock")
    past = time.time() - 2 * 3600
    os.utime(lock, (past, past))  # unused for two hours
    from shardfeed.storage import cache as cache_mod
    cache_mod._caches.clear()  # another process, another dataset
    it = iter(sf.read_tfrecord(urls[2], storage_options=opts, cache_dir=cache_dir, cache_limit=sizes[2] + 10))
    assert list(it) == expected[urls[2]]
    assert it.stats().storage.cache_misses == 1  # admitted by evicting the stale entry
    assert not os.path.exists(os.path.join(cache_dir, "objects", old_key))


def test_cache_limit_parsing():
    assert parse_size("200G") == 200 << 30
    assert parse_size("1.5k") == 1536
    assert parse_size(12) == 12
    with pytest.raises(ValueError, match="cache_limit"):
        parse_size("lots")
    with pytest.raises(ValueError, match="cache_limit"):
        sf.read_tfrecord([], cache_limit=-3)


def test_bench_storage_command_measures_the_link(shards, capsys):
    from shardfeed.cli.main import main

    urls, _, opts, _ = shards
    os.environ["S3_ENDPOINT_URL"] = opts["endpoint_url"]
    try:
        assert main(["bench", "storage", urls[2]]) == 0
    finally:
        del os.environ["S3_ENDPOINT_URL"]
    out = capsys.readouterr().out
    assert "latency per request" in out and "requests in flight" in out


def test_block_shuffle_reads_index_files_and_shards_through_the_cache(shards, tmp_path):
    urls, expected, opts, _ = shards
    for u in urls:
        sf.build_index(u, storage_options=opts)
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_tfrecord(urls, storage_options=opts, shuffle="blocks", seed=3, block_size=100, cache_dir=cache_dir)
    got = list(ds)
    assert sorted(got) == sorted(_all(expected, urls)) and got != _all(expected, urls)
    keys = {k for k, _, _ in ObjectCache(cache_dir).entries()}
    assert {ObjectCache.key_of(u + ".idx", opts) for u in urls} <= keys  # the index files
    assert {ObjectCache.key_of(u, opts) for u in urls} <= keys  # and the shards
    it = iter(ds)
    assert sorted(it) == sorted(got)
    assert it.stats().storage.requests == 0


def test_text_and_csv_read_remote_files_in_ranges_and_through_the_cache(s3_bucket, tmp_path, fault_proxy):
    bucket, opts = s3_bucket
    lines = [f"{i},{i * 0.5},name{i}" for i in range(20000)]
    storage.write_bytes(f"s3://{bucket}/t/a.csv", ("id,x,name\n" + "\n".join(lines) + "\n").encode(), opts)
    proxied = {"endpoint_url": fault_proxy.url}
    url = f"s3://{bucket}/t/a.csv"
    assert list(sf.read_text(url, storage_options=proxied))[1:] == lines
    cache_dir = str(tmp_path / "cache")
    ds = sf.read_csv(url, [0, 0.0, ""], header=True, storage_options=proxied, cache_dir=cache_dir)
    rows = list(ds)
    assert rows[0] == (0, 0.0, "name0") and len(rows) == 20000
    assert ObjectCache.key_of(url, proxied) in {k for k, _, _ in ObjectCache(cache_dir).entries()}
    gets = sum(1 for m, _, _, _ in fault_proxy.log if m == "GET")
    it = iter(ds)
    for _ in range(7000):
        next(it)
    state = it.get_state()
    it2 = iter(ds)
    it2.set_state(state)
    assert list(it2) == rows[7000:]
    assert sum(1 for m, _, _, _ in fault_proxy.log if m == "GET") == gets  # read from the local copy


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_remote_shards_with_and_without_the_cache(s3_bucket, tmp_path, compression, small_parts):
    bucket, opts = s3_bucket
    recs = _records(5, 3000)
    ext = ".gz" if compression == "GZIP" else ".zz"
    url = f"s3://{bucket}/c/part{ext}"
    with TFRecordWriter(url, compression=compression, storage_options=opts) as w:
        for r in recs:
            w.write(r)
    assert list(sf.read_tfrecord(url, storage_options=opts)) == recs
    it = iter(sf.read_tfrecord(url, storage_options=opts, cache_dir=str(tmp_path / "c")).repeat(2))
    assert list(it) == recs * 2
    assert it.stats().storage.cache_hits == 1 and it.stats().storage.cache_misses == 1


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no-cache"])
def test_global_shuffle_over_object_storage(shards, tmp_path, cached):
    urls, expected, opts, _ = shards
    kw = {"cache_dir": str(tmp_path / "cache")} if cached else {}
    if not cached:  # index files beside the shards (the pass counts their reads: one GET each)
        from shardfeed.formats.index import load_index

        for u in urls:
            load_index(u, opts, build=True)
    ds = sf.read_tfrecord(urls, storage_options=opts, shuffle="global", seed=8, block_size=500, **kw)
    it = iter(ds)
    got = list(it)
    assert sorted(got) == sorted(_all(expected, urls)) and got != _all(expected, urls)
    st = it.stats().storage
    if cached:  # indexes built by scanning each shard through the cache: each downloaded once
        assert st.cache_misses == len(urls) and st.bytes_fetched == _object_bytes(urls, opts)
    else:  # one GET per run of a window's records of one file lying close together: counted
        assert st.requests - len(urls) == _coalesced_gets(got, tmp_path, 500) < len(got) / 10


def _coalesced_gets(got, tmp_path, window, gap=128 << 10, limit=1 << 20):
    """GETs that reading ``got`` (the shards fixture's records, in delivered order) in
    windows of ``window`` records takes when a window's records of one file at most
    ``gap`` bytes apart share a GET of at most ``limit`` bytes."""
    from shardfeed.formats.index import load_index

    index = {i: load_index(str(tmp_path / f"part-{i}.tfrecord"), build=True) for i in range(4)}
    gets = 0
    for w in range(0, len(got), window):
        frames = sorted((i, int(index[i][j, 0]), int(index[i][j, 1]))
                        for i, j in (map(int, r.split(b":", 2)[:2]) for r in got[w:w + window]))
        run = None
        for i, off, ln in frames:
            if run and run[0] == i and off - run[2] <= gap and off + ln - run[1] <= limit:
                run = (i, run[1], off + ln)
                continue
            gets += 1
            run = (i, off, off + ln)
    return gets


def test_global_shuffle_without_a_cache_gathers_few_windows_ahead(shards, monkeypatch):
    from shardfeed.formats.index import load_index
    from shardfeed.pipeline import gather as gather_mod
    from shardfeed.pipeline.span_reader import REMOTE_GATHER_AHEAD

    monkeypatch.setattr(gather_mod, "COALESCE_GAP", -1)  # one GET a record: windows counted by their GETs
    urls, expected, opts, _ = shards
    for u in urls:  # index files beside the shards: the pass reads them, one GET each
        load_index(u, opts, build=True)
    it = iter(sf.read_tfrecord(urls, storage_options=opts, shuffle="global", seed=3, block_size=50))
    next(it)
    seen, stable = -1, 0
    while stable < 5:  # until the read-ahead stops making requests
        time.sleep(0.2)
        now = it.stats().storage.requests
        stable = stable + 1 if now == seen else 0
        seen = now
    # the window read plus REMOTE_GATHER_AHEAD - 1 ahead (before: 16 windows, 800 GETs)
    assert 50 <= seen - len(urls) <= 50 * REMOTE_GATHER_AHEAD
    it.close()


def test_global_shuffle_without_a_cache_says_what_it_costs(shards, caplog):
    urls, expected, opts, _ = shards
    with caplog.at_level("WARNING", logger="shardfeed.pipeline.spans"):
        it = iter(sf.read_tfrecord(urls, storage_options=opts, shuffle="global", seed=3))
        next(it)
        it.close()
    text = caplog.text
    n = len(_all(expected, urls))
    assert "4 remote shard(s) without cache_dir" in text and f"epoch of {n} records makes up to {n}" in text
    assert "cache_dir=..." in text and "shuffle='blocks'" in text


def test_concurrent_downloads_reserve_their_room_and_leftovers_are_cleaned(shards, tmp_path):
    urls, expected, opts, _ = shards
    cache_dir = tmp_path / "cache"
    (cache_dir / "objects").mkdir(parents=True)
    # a download a dead process left behind: its room is given back
    (cache_dir / "objects" / ("." + "a" * 32 + ".x1.part")).write_bytes(b"\0" * 100_000)
    limit = _object_bytes(urls, opts) // 2
    ds = sf.read_tfrecord(urls * 3, storage_options=opts, cache_dir=str(cache_dir), cache_limit=limit,
                          num_parallel_reads=8)  # many downloads at once
    assert len(list(ds)) == 3 * len(_all(expected, urls))
    cache = ObjectCache(str(cache_dir))
    assert cache.usage() <= limit
    assert not (cache_dir / "objects" / ("." + "a" * 32 + ".x1.part")).exists()


def test_read_of_everything_returns_the_whole_range_and_http_keeps_fsspecs_client(s3_bucket):
    bucket, opts = s3_bucket
    data = os.urandom(1_000_000)
    storage.write_bytes(f"s3://{bucket}/all.bin", data, opts)
    with storage.open_range(f"s3://{bucket}/all.bin", 10, None, opts) as s:
        assert s.read() == data[10:]
    with RangeStream(f"s3://{bucket}/all.bin", storage_options={**opts, "s3_additional_kwargs": {"A": 1}}) as s:
        assert s.direct is None  # options the direct path cannot honour: the S3 client's own GETs


def test_global_shuffle_counts_each_cached_shard_once_and_survives_many_files(shards, tmp_path, monkeypatch):
    from shardfeed.pipeline import gather as gather_mod

    monkeypatch.setattr(gather_mod, "MAPS_KEPT", 1)  # maps dropped while windows still use them
    urls, expected, opts, _ = shards
    it = iter(sf.read_tfrecord(urls, storage_options=opts, shuffle="global", seed=1, block_size=700,
                               cache_dir=str(tmp_path / "c")).repeat(2))
    got = list(it)
    assert sorted(got) == sorted(_all(expected, urls) * 2)
    st = it.stats().storage
    assert st.cache_misses == len(urls) and st.cache_hits == len(urls)  # the second epoch, once a shard
    assert st.bytes_from_cache == _object_bytes(urls, opts)


@pytest.fixture
def slow_link(s3_bucket, tmp_path):
    """A 12 MB shard behind a proxy that passes 2 MB/s in all (the shaping proxy of the
    benchmarks): its download takes about 6 s, the first record needs 256 KiB. Yields ``(url, records, storage_options)``."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from _shaping_proxy import ShapingProxy

    bucket, opts = s3_bucket
    recs = [os.urandom(6000) for _ in range(2000)]
    path = tmp_path / "big.tfrecord"
    with TFRecordWriter(str(path)) as w:
        for r in recs:
            w.write(r)
    boto3.client("s3", endpoint_url=opts["endpoint_url"]).upload_file(str(path), bucket, "big.tfrecord")
    host, port = opts["endpoint_url"].split("://", 1)[1].split(":")
    proxy = ShapingProxy(host, int(port), latency_s=0.0, conn_bytes_per_s=None, total_bytes_per_s=2e6).start()
    try:
        yield f"s3://{bucket}/big.tfrecord", recs, {"endpoint_url": proxy.url}
    finally:
        proxy.stop()


def _entries(cache_dir):
    root = os.path.join(cache_dir, "objects")
    names = os.listdir(root) if os.path.isdir(root) else []
    return [n for n in names if n.endswith(".json") and not n.startswith(".")], [n for n in names if n.endswith(".part")]


def test_a_cache_miss_delivers_the_first_records_before_the_download_ends(slow_link, tmp_path):
    url, recs, opts = slow_link
    cache_dir = str(tmp_path / "cache")
    it = iter(sf.read_tfrecord(url, storage_options=opts, cache_dir=cache_dir))
    assert next(it) == recs[0]
    committed, parts = _entries(cache_dir)
    assert committed == [] and len(parts) == 1  # still downloading: the reader did not wait for it
    assert [next(it) for _ in range(9)] == recs[1:10]
    assert list(it) == recs[10:]
    committed, parts = _entries(cache_dir)
    assert len(committed) == 1 and parts == []
    assert it.stats().storage.cache_misses == 1
    it2 = iter(sf.read_tfrecord(url, storage_options=opts, cache_dir=cache_dir))
    assert list(it2) == recs
    assert it2.stats().storage.requests == 0 and it2.stats().storage.cache_hits == 1


def test_a_reader_that_stops_early_leaves_no_partial_entry_and_the_next_one_fills_it(slow_link, tmp_path):
    url, recs, opts = slow_link
    cache_dir = str(tmp_path / "cache")
    it = iter(sf.read_tfrecord(url, storage_options=opts, cache_dir=cache_dir))
    assert [next(it) for _ in range(5)] == recs[:5]
    it.close()
    assert _entries(cache_dir) == ([], [])
    assert list(sf.read_tfrecord(url, storage_options=opts, cache_dir=cache_dir)) == recs
    committed, parts = _entries(cache_dir)
    assert len(committed) == 1 and parts == []


def _upload_examples(s3_bucket, tmp_path, prefix, make, per_file, files=2):
    """``files`` TFRecord files of ``per_file`` Examples (``make(file, i)``'s features) in
    the bucket under ``prefix``; their URLs."""
    bucket, opts = s3_bucket
    client = boto3.client("s3", endpoint_url=opts["endpoint_url"])
    urls = []
    for f in range(files):
        path = tmp_path / f"{prefix}{f}.tfrecord"
        sf.write_records(str(path), [sf.encode_example(make(f, i)) for i in range(per_file)])
        client.upload_file(str(path), bucket, f"{prefix}/{prefix}{f}.tfrecord")
        urls.append(f"s3://{bucket}/{prefix}/{prefix}{f}.tfrecord")
    return urls


def test_a_fused_shuffle_restores_over_s3_reading_back_only_its_buffer(s3_bucket, tmp_path):
    import json

    import numpy as np

    from shardfeed.pipeline.state import elements_equal

    _, opts = s3_bucket
    urls = _upload_examples(s3_bucket, tmp_path, "shuffle",
                            lambda f, i: {"id": [f * 100_000 + i], "x": [float(i)] * 8}, 6000)
    spec = {"id": sf.FixedLen("int64"), "x": sf.FixedLen("float32", shape=(8,))}
    src = sf.read_tfrecord(urls, spec=spec, storage_options=opts)
    ds = src.shuffle(800, seed=4).batch(100)
    with iter(ds) as it:
        for _ in range(60):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        rest = [b["id"] for b in it]
    assert "frames" in state["root"]
    before, again = src.read_stats.records, src.read_stats.reread
    got = [b["id"] for b in ds.iter_from_state(state)]
    assert elements_equal(got, rest)
    assert src.read_stats.reread - again == 800  # the buffer, by ranged reads of its frames
    assert src.read_stats.records - before == len(np.concatenate(rest))


def _first_id(x):
    return int(x["id"])


def test_a_shuffle_over_a_map_restores_over_s3_reading_back_only_its_buffer(s3_bucket, tmp_path):
    import json

    _, opts = s3_bucket
    urls = _upload_examples(s3_bucket, tmp_path, "mapped", lambda f, i: {"id": [f * 100_000 + i]}, 5000)
    src = sf.read_tfrecord(urls, spec={"id": sf.FixedLen("int64")}, storage_options=opts)
    ds = src.map(_first_id, num_parallel_calls=2).shuffle(600, seed=3)
    with iter(ds) as it:
        for _ in range(7000):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        rest = list(it)
    assert "frames" in state["root"]
    again = src.read_stats.reread
    with ds.iter_from_state(state) as it:
        assert list(it) == rest
    assert src.read_stats.reread - again == 600  # the buffer, by ranged reads of its frames


@pytest.mark.parametrize("shuffle", [None, "files", "blocks"])
def test_a_dataset_built_after_the_bucket_changed_reads_what_it_holds_now(s3_bucket, shuffle, tmp_path):
    """Found from outside: a second dataset over the same glob in the same process listed
    from the filesystem's listing cache: a deleted object raised, a new one was missed, and
    an object replaced by a larger one was read to its old size, 200 of 300 records without
    a word. Counted against what the bucket holds, read with boto3."""
    import boto3

    bucket, opts = s3_bucket
    s3 = boto3.client("s3", endpoint_url=opts["endpoint_url"])

    def put(key, ids):
        local = str(tmp_path / key)
        sf.write_records(local, [sf.encode_example({"id": i}) for i in ids])
        s3.upload_file(local, bucket, f"d/{key}")

    put("p0.tfrecord", range(0, 100))
    put("p1.tfrecord", range(100, 200))
    put("p2.tfrecord", range(200, 300))
    spec = {"id": sf.FixedLen("int64")}
    kw = {} if shuffle is None else {"shuffle": shuffle, "seed": 1}

    def ids():
        ds = sf.read_tfrecord(f"s3://{bucket}/d/*.tfrecord", spec=spec, storage_options=opts, **kw)
        return sorted(int(r["id"]) for r in ds)

    assert ids() == list(range(300))
    s3.delete_object(Bucket=bucket, Key="d/p1.tfrecord")
    put("p2.tfrecord", range(200, 450))  # replaced by a larger object
    put("p3.tfrecord", range(500, 510))  # a new one
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="d/")["Contents"]]
    held = sorted(int(sf.parse_single_example(r, spec)["id"]) for k in keys if k.endswith(".tfrecord")
                  for r in sf.TFRecordReader(f"s3://{bucket}/{k}", storage_options=opts))
    assert held == [*range(100), *range(200, 450), *range(500, 510)]
    assert ids() == held

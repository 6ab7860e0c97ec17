"""``gs://`` through gcsfs against a GCS JSON API emulator on 127.0.0.1 (the
``gcs_endpoint`` fixture): the same read paths as ``s3://`` (parallel ranged GETs, record
ranges through index files, the cache, a global shuffle), every byte counted."""

from __future__ import annotations

import pytest

import shardfeed as sf
from shardfeed import storage
from shardfeed.storage import fetch
from shardfeed.storage.fs import get_filesystem

pytest.importorskip("gcsfs")


def _records(i: int, n: int) -> list[bytes]:
    return [f"{i}:{j}:".encode() + bytes([j % 251]) * (500 + j % 300) for j in range(n)]


@pytest.fixture
def gcs_shards(gcs_bucket):
    """Three shards written to the emulator by shardfeed's own writer: ``(urls, records by
    url, storage_options)``."""
    bucket, opts = gcs_bucket
    urls, expected = [], {}
    for i, n in enumerate((1200, 30, 2000)):
        url = f"gs://{bucket}/train/part-{i}.tfrecord"
        recs = _records(i, n)
        with sf.TFRecordWriter(url, storage_options=opts) as w:
            for r in recs:
                w.write(r)
        urls.append(url)
        expected[url] = recs
    return urls, expected, opts


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 64 KiB and a first range of 4 KiB: many ranged requests per object."""
    monkeypatch.setattr(fetch, "FIRST_PART", 4 << 10)
    monkeypatch.setattr(fetch, "MIN_PART", 64 << 10)
    monkeypatch.setattr(fetch, "MAX_PART", 64 << 10)


def test_an_endpoint_of_ones_own_gets_the_plain_gcs_client(gcs_bucket):
    # recent gcsfs first asks the endpoint over gRPC what kind of bucket it is; an emulator
    # never answers and every bucket would stall 60 s
    import gcsfs.core

    bucket, opts = gcs_bucket
    fs, _ = get_filesystem(f"gs://{bucket}/x", opts)
    assert type(fs) is gcsfs.core.GCSFileSystem


def test_gs_shards_read_in_parallel_ranges_every_byte_counted(gcs_shards, small_parts):
    urls, expected, opts = gcs_shards
    pattern = f"gs://{urls[0].split('/')[2]}/train/*.tfrecord"
    assert sorted(storage.glob(pattern, opts)) == sorted(urls)
    it = iter(sf.read_tfrecord(pattern, storage_options=opts))
    got = list(it)
    assert sorted(got) == sorted(r for u in urls for r in expected[u])
    st = it.stats().storage
    assert st.bytes_fetched == sum(storage.size(u, opts) for u in urls)
    assert st.requests > len(urls)  # ranges of 64 KiB, not one GET an object


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_gs_record_ranges_fetch_disjoint_bytes(gcs_shards, small_parts):
    urls, expected, opts = gcs_shards
    big = urls[2]
    sf.build_index(big, storage_options=opts)
    got, fetched = [], 0
    for k in range(3):
        it = iter(sf.read_tfrecord(big, storage_options=opts, slice_id=k, slice_count=3))
        got += list(it)
        fetched += it.stats().storage.bytes_fetched
    assert got == expected[big]
    assert fetched == storage.size(big, opts)


def test_gs_global_shuffle_and_cache(gcs_shards, tmp_path):
    urls, expected, opts = gcs_shards
    for u in urls:
        sf.build_index(u, storage_options=opts)
    want = sorted(r for u in urls for r in expected[u])
    def ds():
        return sf.read_tfrecord(urls, storage_options=opts, shuffle="global", seed=5, cache_dir=str(tmp_path / "c"))

    order = list(ds())
    assert sorted(order) == want and order != sorted(order)
    assert list(ds()) == order  # the same seed: the same order, in every run
    second = iter(ds().repeat(2))
    both = list(second)
    assert both[:len(order)] == order and sorted(both[len(order):]) == want and both[len(order):] != order
    # every object fetched once: epochs after the first read the cache
    assert second.stats().storage.requests == 0

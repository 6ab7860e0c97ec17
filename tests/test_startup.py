"""The first batch first (issue 38 item 1): the first range of the first object is asked
for before the read-ahead of the other objects, it is small, the ranges behind it grow,
and the first batch needs only the first few of them, not the whole object. Checked on a
real S3 API server (moto) by the ranges asked for and their order, never by wall time."""

from __future__ import annotations

import threading

import boto3
import numpy as np

import shardfeed as sf
from shardfeed.storage import fetch
from shardfeed.storage.fetch import RangeStream

RECORD = 20_000  # bytes of data a record: a batch of 64 is about 1.3 MB


def _upload(s3_bucket, tmp_path, files: int, per_file: int) -> tuple[str, dict, list[str]]:
    bucket, so = s3_bucket
    client = boto3.client("s3", endpoint_url=so["endpoint_url"])
    rng = np.random.default_rng(0)
    keys = []
    for f in range(files):
        path = str(tmp_path / f"part-{f}.tfrecord")
        sf.write_records(path, [sf.encode_example({"label": f * per_file + i, "data": rng.bytes(RECORD)})
                                for i in range(per_file)])
        key = f"s/part-{f}.tfrecord"
        client.put_object(Bucket=bucket, Key=key, Body=open(path, "rb").read())
        keys.append(key)
    return f"s3://{bucket}/s/*.tfrecord", so, keys


class _Recorder:
    """Every ranged GET of a pass, in the order they start and end (``("start"|"end",
    object name, a, b)``); ``hold(fn)`` keeps the GETs for which ``fn(name, a, b)`` is true
    waiting until :meth:`release` (at most 10 s: then ``timed_out`` says so)."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple[str, str, int, int]] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.held: object = None
        self.timed_out = False
        real = RangeStream._get

        def recorded(stream, a, b, *args):
            name = stream.path.rsplit("/", 1)[1]
            with self.lock:
                self.events.append(("start", name, a, b))
            if self.held is not None and self.held(name, a, b) and not self.gate.wait(10):
                self.timed_out = True
            try:
                return real(stream, a, b, *args)
            finally:
                with self.lock:
                    self.events.append(("end", name, a, b))

        monkeypatch.setattr(RangeStream, "_get", recorded)

    def release(self) -> None:
        self.gate.set()


def test_the_first_range_goes_out_first_and_the_read_ahead_ramps_up_behind_it(s3_bucket, tmp_path,
                                                                              monkeypatch):
    # before: every shard's reader asked for its first range at once (16 here, with the
    # first shard's second range among them), all sharing the link and the CPU with the
    # range the first batch waits for
    url, so, keys = _upload(s3_bucket, tmp_path, files=8, per_file=40)
    rec = _Recorder(monkeypatch)
    it = iter(sf.read_tfrecord(url, {"label": sf.FixedLen("int64")}, storage_options=so).batch(8))
    first = next(it)
    assert first["label"].tolist() == list(range(8))
    it.close()
    starts = [e for e in rec.events if e[0] == "start"]
    assert starts[0][1:] == ("part-0.tfrecord", 0, fetch.FIRST_PART)
    before_first_answer = starts[: next(i for i, e in enumerate(rec.events) if e[0] == "end")]
    assert len(before_first_answer) <= fetch.FIRST_WINDOW, before_first_answer
    # the read-ahead of every other shard still happens, behind it
    assert {e[1] for e in starts} >= {k.rsplit("/", 1)[1] for k in keys[:2]}


def test_ranges_of_the_stream_a_reader_waits_on_grow_from_a_small_first_one(s3_bucket):
    # the ranges of the stream a reader waits on double from FIRST_PART up to the link's
    # part, so that the bytes just after the first range also come after a short transfer
    # (before: FIRST_PART, then the rest of a part-sized object in one range)
    bucket, so = s3_bucket
    size = fetch.FIRST_PART * 16
    data = np.random.default_rng(1).bytes(size)
    sf.storage.write_bytes(f"s3://{bucket}/ramp.bin", data, so)
    counters = sf.storage.IOCounters()
    link = fetch.Link()
    with RangeStream(f"s3://{bucket}/ramp.bin", 0, size, so, counters) as s:
        s.link = link  # no measurements: the default part (4 MiB), bigger than the object
        assert bytes(s.readall()) == data
    f = fetch.FIRST_PART
    assert counters.requests == 4  # f, 2f, 4f, then the remaining 9f (a part) in one
    assert counters.bytes_fetched == size
    assert link.summary()["samples"] == 4
    assert [n for n, _ in link._samples] == [f, 2 * f, 4 * f, 9 * f] or \
        sorted(n for n, _ in link._samples) == sorted([f, 2 * f, 4 * f, 9 * f])


def test_the_first_batch_needs_only_the_first_ranges_of_the_first_object(s3_bucket, tmp_path, monkeypatch):
    # the fused reader with two threads parses four batches ahead: 64 records of 20 KB
    # (1.3 MB) of an object of 4 MB. They go out while every range reaching past 2 MB is
    # still held. Before, the reader asked for FIRST_PART and then the rest of the object
    # in one range, and its chunks after the first were 8 MB: it waited for all of it
    url, so, _ = _upload(s3_bucket, tmp_path, files=2, per_file=200)
    rec = _Recorder(monkeypatch)
    rec.held = lambda name, a, b: b > (2 << 20)
    ds = sf.read_tfrecord(url, {"label": sf.FixedLen("int64")}, storage_options=so, num_parallel_reads=2)
    it = iter(ds.batch(16))
    first = next(it)
    rec.release()
    assert not rec.timed_out, ("the first batch waited for bytes past 2 MB", rec.events)
    assert first["label"].tolist() == list(range(16))
    assert sum(len(b["label"]) for b in it) == 400 - 16


def test_a_converted_folder_first_batch_is_a_listing_the_manifest_and_ranged_gets(s3_bucket, tmp_path,
                                                                                   fault_proxy):
    # issue 38 item 3: no HEAD per shard (the ranged GETs' answers tell the sizes), no index
    # file read for a plain pass, the manifest found by one listing and read once
    import pandas as pd

    bucket, so = s3_bucket
    out = tmp_path / "converted"
    df = pd.DataFrame({"id": np.arange(400), "text": ["x" * 2000] * 400})
    sf.convert(df, str(out), schema={"id": "int", "text": "string"}, num_samples_per_tfrecord=100, progress=False)
    client = boto3.client("s3", endpoint_url=so["endpoint_url"])
    for path in out.rglob("*"):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"conv/{path.relative_to(out)}", Body=path.read_bytes())
    it = iter(sf.read_converted(f"s3://{bucket}/conv", storage_options={"endpoint_url": fault_proxy.url}).batch(32))
    first = next(it)
    assert first["id"].tolist() == list(range(32))
    log = list(fault_proxy.log)
    it.close()
    assert [m for m, _, _, _ in log if m != "GET"] == []  # no HEAD
    objects = [p.split("?", 1)[0].rsplit("/", 1)[1] for m, p, _, _ in log if "list-type=2" not in p]
    assert objects.count("data-manifest.json") == 1
    assert not [o for o in objects if o.endswith(".idx")]
    assert sum(1 for _, p, _, _ in log if "list-type=2" in p) <= 1
    assert all(rng for _, p, rng, _ in log if p.split("?", 1)[0].endswith(".tfrecord"))  # ranged GETs

"""sf.read_tfrecord(queue, ...) reads what the worker takes off a WorkQueue."""

from __future__ import annotations

import pytest

import shardfeed as sf


def _files(tmp_path, n=3, per=5):
    out = []
    for i in range(n):
        p = str(tmp_path / f"f{i}.tfrecord")
        sf.write_records(p, [sf.encode_example({"a": [i * 100 + j]}) for j in range(per)], index=True)
        out.append(p)
    return out


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_read_tfrecord_from_a_queue_yields_every_record_once(tmp_path, backend):
    files = _files(tmp_path)
    url = "memory" if backend == "memory" else f"sqlite:///{tmp_path}/q.db"
    q = sf.WorkQueue(files, backend=url, name="rq", seed=3, num_slices=6)
    got = [int(v) for batch in sf.read_tfrecord(q, spec={"a": sf.FixedLen("int64")}).batch(4) for v in batch["a"]]
    assert sorted(got) == [i * 100 + j for i in range(3) for j in range(5)]
    m = q.metrics()
    assert m["done"] == m["items_per_epoch"] and m["in_flight"] == 0 and m["drained"]
    assert q.take(block=False) is None


@pytest.mark.parametrize("reads", [None, 2, 4])
def test_parallel_reads_on_a_queue_deliver_every_record_once(tmp_path, reads):
    q = sf.WorkQueue(_files(tmp_path, n=4, per=7), backend="memory", name=f"rq2-{reads}", num_slices=9)
    ds = sf.read_tfrecord(q, spec={"a": sf.FixedLen("int64")}, num_parallel_reads=reads).batch(3)
    got = sorted(int(v) for batch in ds for v in batch["a"])
    assert got == [i * 100 + j for i in range(4) for j in range(7)]
    assert q.metrics()["drained"]


@pytest.mark.parametrize("batch", [None, 4])
@pytest.mark.parametrize("slices", [1, 6])
def test_repeat_over_a_drained_queue_ends_and_delivers_each_record_once(tmp_path, batch, slices):
    """Found from outside: a single worker's read_tfrecord(queue).repeat() kept its first
    repetition's last item leased; the second waited out the lease and then delivered the
    whole queue again (27 records, 54 deliveries)."""
    files = _files(tmp_path)
    q = sf.WorkQueue(files, backend=f"sqlite:///{tmp_path}/q.db", name=f"rep-{batch}-{slices}", num_slices=slices,
                     lease_timeout=3)
    ds = sf.read_tfrecord(q, spec={"a": sf.FixedLen("int64")}).repeat()
    got = [int(v) for x in (ds.batch(batch) if batch else ds) for v in (x["a"] if batch else [x["a"]])]
    assert sorted(got) == [i * 100 + j for i in range(3) for j in range(5)]
    m = q.metrics()
    assert m["done"] == m["items_per_epoch"] and m["in_flight"] == 0 and m["drained"]

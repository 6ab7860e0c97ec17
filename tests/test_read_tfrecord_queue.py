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


def test_num_parallel_reads_is_refused_for_a_queue(tmp_path):
    q = sf.WorkQueue(_files(tmp_path), backend="memory", name="rq2")
    with pytest.raises(ValueError, match="one item at a time"):
        sf.read_tfrecord(q, num_parallel_reads=4)

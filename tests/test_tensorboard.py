"""The one TensorBoard writer (shardfeed.pipeline.tensorboard) and its two callers."""

from __future__ import annotations

import logging
import sys

import pytest

from shardfeed.pipeline import from_list
from shardfeed.pipeline.tensorboard import write_scalars


@pytest.mark.parametrize("missing", ["tensorboard", "tensorflow"])
def test_missing_tensorflow_or_tensorboard_writes_nothing_and_says_what(tmp_path, monkeypatch, caplog, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed
    with caplog.at_level(logging.INFO, logger="shardfeed.pipeline.tensorboard"):
        assert write_scalars({"a": 1.0}, 0, logdir=str(tmp_path / "tb"), what="the test's scalars",
                             missing_level=logging.WARNING) is False
    assert not (tmp_path / "tb").exists()
    [rec] = caplog.records
    assert rec.levelno == logging.WARNING and "the test's scalars not written" in rec.getMessage()


def test_a_work_queue_summary_without_tensorflow_still_returns_the_metrics(monkeypatch, caplog):
    from shardfeed import WorkQueue

    monkeypatch.setitem(sys.modules, "tensorflow", None)
    q = WorkQueue(["a.tfrecord", "b.tfrecord"], backend="memory://tb-missing", name="tbm")
    q.ack(q.take())
    with caplog.at_level(logging.WARNING):
        m = q.add_summary(step=1)
    assert m["done"] == 1 and any("add_summary" in r.getMessage() for r in caplog.records)


def _scalars(tf, logdir):
    out = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for e in tf.compat.v1.train.summary_iterator(str(path)):
            for v in e.summary.value:
                assert v.metadata.plugin_data.plugin_name == "scalars"
                out[(v.tag, e.step)] = float(tf.make_ndarray(v.tensor))
    return out


@pytest.mark.tf
def test_scalars_go_to_a_logdir_or_through_a_writer_as_tensorboard_reads_them(tmp_path):
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tensorboard")
    assert write_scalars({"x/a": 1.5, "x/b": 2}, 7, logdir=str(tmp_path / "own"))
    assert _scalars(tf, tmp_path / "own") == {("x/a", 7): 1.5, ("x/b", 7): 2.0}
    writer = tf.summary.create_file_writer(str(tmp_path / "given"))
    assert write_scalars({"y": 3.0}, 1, writer=writer) and write_scalars({"y": 4.0}, 2, writer=writer)  # left open
    writer.flush()
    assert _scalars(tf, tmp_path / "given") == {("y", 1): 3.0, ("y", 2): 4.0}


@pytest.mark.tf
def test_pipeline_statistics_and_queue_summary_both_write_through_it(tmp_path):
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tensorboard")
    from shardfeed import WorkQueue

    it = iter(from_list([1, 2, 3]))
    list(it)
    assert it.stats().write_tensorboard(str(tmp_path / "stats"), step=4)
    got = _scalars(tf, tmp_path / "stats")
    assert ("shardfeed/consumer_wait_fraction", 4) in got
    assert any(tag.endswith("/elements") and v == 3.0 for (tag, _), v in got.items())
    q = WorkQueue(["a.tfrecord", "b.tfrecord"], backend="memory://tb-both", name="tbq")
    q.ack(q.take())
    writer = tf.summary.create_file_writer(str(tmp_path / "queue"))
    q.add_summary(step=5, writer=writer)
    writer.flush()
    got = _scalars(tf, tmp_path / "queue")
    assert got[("tbq/done", 5)] == 1.0 and got[("tbq/remaining", 5)] == 1.0

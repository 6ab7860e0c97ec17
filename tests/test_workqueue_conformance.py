"""One conformance suite for every work-queue backend: in-process, SQLite file, Redis."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter

import pytest

from shardfeed.distributed import WorkQueue, WorkQueueMismatchError, epoch_order, open_queue_backend, read_queue

from .test_workqueue_support import REDIS_PASSWORD, backend_url, make_shards, qname, shards  # noqa: F401

WORKS = [f"memory://works/file-{i}.tfrecord" for i in range(10)]


def _q(backend_url, qname, **kw):
    kw.setdefault("seed", 7)
    kw.setdefault("lease_timeout", 30)
    return WorkQueue(kw.pop("works", WORKS), backend=backend_url, name=qname, poll_interval=0.05, **kw)


def test_every_item_once_per_epoch_in_seeded_order_then_drained(backend_url, qname):
    q = _q(backend_url, qname, num_epochs=3)
    taken = []
    while (item := q.take()) is not None:
        taken.append((item.epoch, item.index, str(item)))
        assert q.ack(item)
    assert len(taken) == 30
    for e in range(3):
        order = [i for ep, i, _ in taken if ep == e]
        assert order == epoch_order(10, 7, e)
    assert epoch_order(10, 7, 0) != epoch_order(10, 7, 1)
    assert {w for _, _, w in taken} == set(WORKS)
    m = q.metrics()
    assert m["drained"] and m["done"] == 30 and m["remaining"] == 0 and m["in_flight"] == 0
    assert q.take() is None
    q.close()


def test_unshuffled_queue_keeps_the_works_order(backend_url, qname):
    q = _q(backend_url, qname, shuffle=False)
    assert [str(x) for x in q] == WORKS


def test_same_arguments_join_other_arguments_refused(backend_url, qname):
    a = _q(backend_url, qname, num_epochs=1)
    b = _q(backend_url, qname, num_epochs=1)
    first = a.take()
    second = b.take()
    assert first.id != second.id
    with pytest.raises(WorkQueueMismatchError, match="num_epochs"):
        _q(backend_url, qname, num_epochs=2)
    with pytest.raises(WorkQueueMismatchError, match="works"):
        _q(backend_url, qname, works=WORKS[:3], num_epochs=1)


def test_unseeded_queue_joiners_use_the_creators_seed(backend_url, qname):
    a = _q(backend_url, qname, seed=None)
    b = _q(backend_url, qname, seed=None)
    assert a.seed == b.seed


def test_expired_lease_goes_to_another_worker_and_late_ack_is_refused(backend_url, qname, caplog):
    a = _q(backend_url, qname, shuffle=False, lease_timeout=0.3)
    b = _q(backend_url, qname, shuffle=False, lease_timeout=0.3)
    item = a.take()
    time.sleep(0.5)
    again = b.take()
    assert again.id == item.id and again.token != item.token
    with caplog.at_level(logging.WARNING):
        assert not a.ack(item)
    assert "late acknowledgement" in caplog.text
    assert b.ack(again)
    assert not b.ack(again)  # twice: refused too
    m = b.metrics()
    assert m["expired"] == 1 and m["late_acks"] == 2 and m["done"] == 1


def test_ack_and_take_acknowledges_then_takes_across_epochs(backend_url, qname):
    q = _q(backend_url, qname, num_epochs=2)
    seen = []
    item = q.take()
    while item is not None:
        seen.append((item.epoch, item.index))
        item = q.ack_and_take(item)
    assert sorted(seen) == [(e, i) for e in range(2) for i in range(len(WORKS))]
    m = q.metrics()
    assert m["drained"] and m["done"] == 2 * len(WORKS) and m["in_flight"] == 0 and m["late_acks"] == 0


def test_ack_and_take_with_an_expired_lease_refuses_the_ack_but_still_takes(backend_url, qname, caplog):
    a = _q(backend_url, qname, shuffle=False, lease_timeout=0.3)
    b = _q(backend_url, qname, shuffle=False, lease_timeout=30)
    first = a.take()
    time.sleep(0.5)
    again = b.take()  # the expired lease went to b
    assert again.id == first.id
    with caplog.at_level(logging.WARNING):
        nxt = a.ack_and_take(first)
    assert "late acknowledgement" in caplog.text
    assert nxt is not None and nxt.id != first.id
    m = a.metrics()
    assert m["late_acks"] == 1 and m["done"] == 0 and m["in_flight"] == 2


def test_renewed_lease_does_not_expire(backend_url, qname):
    # renewed every 0.6 s of a 2 s lease (room for a loaded machine's delays), 2.4 s in all:
    # longer than one lease, so without the renewals it would have expired
    a = _q(backend_url, qname, shuffle=False, lease_timeout=2)
    b = _q(backend_url, qname, shuffle=False, lease_timeout=2)
    item = a.take()
    for _ in range(4):
        time.sleep(0.6)
        assert a.renew(item)
    assert b.take().id != item.id
    assert a.ack(item)


def test_released_item_comes_back_first(backend_url, qname):
    a = _q(backend_url, qname, shuffle=False)
    first = a.take()
    a.take()
    assert a.release(first)
    assert a.take().id == first.id


def test_nothing_pending_but_leases_out_waits_then_times_out(backend_url, qname):
    a = _q(backend_url, qname, works=WORKS[:1])
    b = _q(backend_url, qname, works=WORKS[:1])
    item = a.take()
    assert b.take(block=False) is None
    with pytest.raises(TimeoutError):
        b.take(timeout=0.2)
    a.ack(item)
    assert b.take() is None


def test_threads_share_the_work_every_item_acked_once(backend_url, qname):
    done = Counter()
    lock = threading.Lock()

    def worker():
        q = _q(backend_url, qname, num_epochs=2)
        for item in q.dataset():
            with lock:
                done[item.id] += 1
        q.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 20 and set(done.values()) == {1}
    m = _q(backend_url, qname, num_epochs=2).metrics()
    assert m["drained"] and m["done"] == 20 and m["late_acks"] == 0


@pytest.mark.parametrize("num_slices", [None, 1, 3, 5, 8, 17, 45, 200])
def test_read_queue_delivers_every_record_once_for_many_slice_counts(backend_url, qname, shards, num_slices):
    paths, records = shards
    q = WorkQueue(paths, num_slices=num_slices, backend=backend_url, name=qname, seed=1)
    if num_slices and num_slices > len(paths):
        assert all(it.kind == "records" for it in q.items)
        assert len(q) >= min(num_slices, len(records)) * 0.5
    got = list(read_queue(q))
    assert sorted(got) == sorted(records)
    assert q.metrics()["drained"]


def test_closing_a_pass_early_gives_the_item_back(backend_url, qname, shards):
    paths, records = shards
    q = _q(backend_url, qname, works=paths, num_slices=8, shuffle=False)
    it = iter(read_queue(q))
    first = [next(it) for _ in range(2)]
    it.close()
    assert q.metrics()["in_flight"] == 0 and q.metrics()["released"] == 1
    rest = list(read_queue(q))
    assert sorted(rest) == sorted(records) and first[0] in rest


def test_restore_from_checkpoint_mid_epoch_after_full_restart(backend_url, qname, shards):
    paths, records = shards
    q = _q(backend_url, qname, works=paths, num_slices=10, num_epochs=2)
    acked = Counter()
    for _ in range(5):
        item = q.take()
        assert q.ack(item)
        acked[item.id] += 1
    leased = q.take()  # in flight at the checkpoint: done again after the restore
    state = json.loads(json.dumps(q.get_state()))
    for _ in range(3):  # progress after the checkpoint is lost with the restart
        q.ack(q.take())
    q.reset()  # the backend forgets everything, as after a full restart
    q.close()
    r1 = _q(backend_url, qname, works=paths, num_slices=10, num_epochs=2)
    r2 = _q(backend_url, qname, works=paths, num_slices=10, num_epochs=2)
    assert r1.set_state(state) is True
    assert r2.set_state(state) is False  # every worker may restore; only the first changes the queue
    while (item := r2.take()) is not None:
        assert r2.ack(item)
        acked[item.id] += 1
    assert set(acked.values()) == {1} and len(acked) == 2 * len(r1)
    assert leased.id in acked


def test_restore_against_other_works_is_refused_or_restarted(backend_url, qname, shards):
    paths, _ = shards
    q = _q(backend_url, qname, works=paths, num_epochs=1)
    q.ack(q.take())
    state = q.get_state()
    other = _q(backend_url, qname + "-b", works=paths[:3], num_epochs=1)
    with pytest.raises(WorkQueueMismatchError, match="works"):
        other.set_state(state)
    assert other.set_state(state, on_mismatch="restart")
    assert len(list(other)) == 3


def test_metrics_and_drain_and_reset(backend_url, qname):
    a = _q(backend_url, qname, num_epochs=2, worker_id="w-a")
    item = a.take()
    a.ack(item)
    a.take()
    m = json.loads(a.metrics_json())
    assert m["pending"] == 8 and m["in_flight"] == 1 and m["done"] == 1 and m["remaining"] == 18
    assert m["fraction_full"] == pytest.approx(0.8) and m["workers"]["w-a"]["taken"] == 2
    assert a.drain() == 8
    assert a.metrics()["remaining"] == 0
    assert qname in open_queue_backend(backend_url).names()
    assert a.reset() and qname not in open_queue_backend(backend_url).names()


def test_bad_arguments_say_how_to_fix():
    with pytest.raises(ValueError, match="num_slices"):
        WorkQueue(WORKS, num_slices=0, backend="memory")
    with pytest.raises(TypeError, match="list"):
        WorkQueue("one-file.tfrecord", backend="memory")
    with pytest.raises(ValueError, match="backend"):
        WorkQueue(WORKS, backend="ftp://x")


def test_splitting_without_index_files_names_the_fix(tmp_path):
    paths, _ = make_shards(tmp_path, [3, 3], index=False)
    with pytest.raises(ValueError, match="shardfeed index"):
        WorkQueue(paths, num_slices=6, backend="memory://noidx", name="n")


def test_redis_password_never_in_errors_or_logs(redis_url, caplog):  # noqa: F811
    bad = redis_url.replace(REDIS_PASSWORD, "wrong-password-xyz")
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(Exception) as info:
            WorkQueue(WORKS, backend=bad, name="pw")
        q = WorkQueue(WORKS, backend=redis_url, name="pw-ok")
        assert REDIS_PASSWORD not in repr(q) and REDIS_PASSWORD not in q.backend.url
    text = str(info.value) + repr(info.value) + caplog.text
    assert "wrong-password-xyz" not in text and REDIS_PASSWORD not in text
    assert "***" in str(info.value)


def test_a_worker_whose_queue_was_reset_gets_work_queue_lost_on_every_backend(backend_url, qname):
    """Reset by another handle (`shardfeed queue reset`): memory and SQLite raised a bare
    KeyError, Redis a WorkQueueLostError; now every backend says the same."""
    from shardfeed.errors import WorkQueueLostError

    a = _q(backend_url, qname, worker_id="w-a")
    item = a.take()
    assert _q(backend_url, qname, worker_id="w-b").reset()
    for call in (a.take, lambda: a.ack(item), lambda: a.renew(item)):
        with pytest.raises(WorkQueueLostError, match=f"work queue '{qname}' on .* is gone since this worker joined"):
            call()

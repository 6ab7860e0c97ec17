"""``to_torch(num_workers=N)``: N ``in_subprocess`` children, one per reader's share, their
batches handed over through shared-memory slots and dealt round robin as torch tensors.

Test names say "num_workers" (conftest marks them slow: they start processes).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import time
import warnings

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import SubprocessError
from shardfeed.pipeline import from_list

from .test_pipeline_subprocess import BSPEC, _children, _segments, slow, write_bytes_shards

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402


def _plain(batch):
    """A batch with its tensors back as numpy, for comparing with a DataLoader's."""
    out = {}
    for k, v in batch.items():
        out[k] = v.numpy() if isinstance(v, torch.Tensor) else v
    return out


def _same(a, b) -> bool:
    return sf.pipeline.state.elements_equal([_plain(x) for x in a], [_plain(x) for x in b])


def _wait_gone(pids) -> set:
    for _ in range(100):
        left = set(pids) & _children()
        if not left:
            return left
        time.sleep(0.05)
    return set(pids) & _children()


def _worker_pids(tds) -> list[int]:
    return [s.extra["child_pid"] for s in tds.stats().stages if "child_pid" in s.extra]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_num_workers_deliver_each_record_once_in_the_dataloader_workers_order(tmp_path, n):
    """Reader ``k`` of ``n`` reads the share a DataLoader worker ``k`` reads, and batches come
    round robin from worker 0, 1, ... as a DataLoader interleaves its workers': the same
    batches in the same order, every record once, and the same again next epoch."""
    files = write_bytes_shards(tmp_path, n_files=3, per_file=9)
    ds = sf.read_tfrecord(files, spec=BSPEC).batch(4)
    want = list(DataLoader(ds.to_torch(slice_id=0, slice_count=1), batch_size=None, num_workers=n))
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=n) as tds:
        got = list(tds)
        assert all(isinstance(b["id"], torch.Tensor) and b["id"].dtype == torch.int64 for b in got)
        assert type(got[0]["tok"]) is np.ndarray and got[0]["tok"].dtype == object  # bytes as DataLoader gives them
        assert _same(got, want)
        ids = torch.cat([b["id"] for b in got]).tolist()
        assert sorted(ids) == sorted(f * 1000 + i for f in range(3) for i in range(9))
        pids = _worker_pids(tds)
        assert len(set(pids)) == n
        again = list(tds)  # the next epoch: the same children, the same order
        assert _same(again, want) and sorted(_worker_pids(tds)) == sorted(pids)
    assert not _wait_gone(pids)


def test_num_workers_split_across_ranks_like_dataloader_workers(tmp_path):
    files = write_bytes_shards(tmp_path, n_files=4, per_file=6)
    ds = sf.read_tfrecord(files, spec=BSPEC).batch(3)
    seen = []
    for rank in range(2):
        want = list(DataLoader(ds.to_torch(slice_id=rank, slice_count=2), batch_size=None, num_workers=2))
        with ds.to_torch(slice_id=rank, slice_count=2, num_workers=2) as tds:
            got = list(tds)
        assert _same(got, want)
        seen += torch.cat([b["id"] for b in got]).tolist()
    assert sorted(seen) == sorted(f * 1000 + i for f in range(4) for i in range(6))


def test_num_workers_tensors_share_the_slot_and_stay_valid_after_later_batches():
    """A batch's tensors are views of its slot (no copy, torch.from_numpy): kept while later
    batches arrive they keep their values (their slot is not reused); when the consumer keeps
    more batches than the ring has free slots, later ones are copied out instead."""
    ds = from_list(list(range(40))).map(slow).batch(2)
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2, buffer_size=3) as tds:
        kept = []
        for b in tds:
            assert isinstance(b, torch.Tensor) and b.shape == (2, 1000)
            kept.append((b, b.clone()))
        assert len(kept) == 20
        assert all(torch.equal(t, c) for t, c in kept)
        extra = [s.extra for s in tds.stats().stages if s.name.endswith("subprocess")]
        assert len(extra) == 2 and all(e["zero_copy"] >= 1 and e["copied_out"] >= 1 for e in extra)
        values = sorted(int(t[0, 0]) for t, _ in kept) + sorted(int(t[1, 0]) for t, _ in kept)
        assert sorted(values) == list(range(40))


def test_num_workers_resume_from_state_dict(tmp_path):
    files = write_bytes_shards(tmp_path, n_files=3, per_file=9)
    ds = sf.read_tfrecord(files, spec=BSPEC).batch(2)
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2) as tds:
        want = list(tds)
        it = iter(tds)
        head = [next(it) for _ in range(5)]
        state = json.loads(json.dumps(tds.state_dict()))
        it.close()
    assert _same(head, want[:5]) and state["num_workers"] == 2
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2) as again:
        again.load_state_dict(state)
        assert _same(list(again), want[5:])
        assert _same(list(again), want)  # the pass after the resumed one starts at the beginning
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=3) as other:
        with pytest.raises(ValueError, match="num_workers=2.*num_workers=3"):
            other.load_state_dict(state)


def test_num_workers_killed_child_is_a_clear_error_naming_the_worker():
    ds = from_list(list(range(400))).map(slow)
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2, buffer_size=2) as tds:
        it = iter(tds)
        next(it)
        next(it)
        pids = _worker_pids(tds)
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SubprocessError, match=r"to_torch worker 1 of 2 .*killed by signal SIGKILL"):
            for _ in range(20):
                next(it)
        it.close()
    assert not _wait_gone(pids) and not _segments()


def test_num_workers_break_early_then_no_process_or_segment_is_left():
    ds = from_list(list(range(200))).map(slow).batch(2)
    tds = ds.to_torch(slice_id=0, slice_count=1, num_workers=2)
    pids: list[int] = []
    for _ in range(3):
        for k, _b in enumerate(tds):
            if k == 3:
                break
        pids += _worker_pids(tds)
        gc.collect()  # the loop's generator, closed by its garbage collection
        assert not _wait_gone(pids)
    for _b in tds:  # a whole epoch: the children are kept for the next one ...
        pass
    pids += _worker_pids(tds)
    tds.close()  # ... until close()
    assert not _wait_gone(pids) and not _segments()


@pytest.mark.timeout(1200)  # 200 interpreters started: minutes on a loaded 2-core machine
def test_num_workers_100_open_close_cycles_leave_no_process_or_segment():
    ds = from_list(list(range(12))).batch(3)
    before = _children()
    for k in range(100):
        tds = ds.to_torch(slice_id=0, slice_count=1, num_workers=2)
        it = iter(tds)
        next(it)
        if k % 2:
            it.close()
            tds.close()
        else:
            list(it)
            del it, tds
            gc.collect()
    for _ in range(100):
        if _children() <= before:
            break
        time.sleep(0.05)
    assert _children() <= before and not _segments()


def test_num_workers_inside_dataloader_workers_is_refused_with_the_form_to_use():
    ds = from_list(list(range(8))).batch(2)
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2) as tds:
        with pytest.raises(Exception, match=r"DataLoader\(.*num_workers=0"):
            list(DataLoader(tds, batch_size=None, num_workers=1))
        got = list(DataLoader(tds, batch_size=None, num_workers=0))  # the form to use
    assert sorted(torch.cat(got).tolist()) == list(range(8))


def test_to_torch_num_workers_must_be_a_count():
    ds = from_list([1, 2])
    for bad in (-1, 1.5, True):
        with pytest.raises((TypeError, ValueError), match="num_workers"):
            ds.to_torch(slice_id=0, slice_count=1, num_workers=bad)


def _said(run) -> list[str]:
    """What ``run()`` warned that names ``to_torch(num_workers=``."""
    from shardfeed.adapters import _torch_dataset

    _torch_dataset._warned = False  # once per process: as if this were the first DataLoader
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in seen if "to_torch(num_workers=" in str(w.message)]


def test_dataloader_workers_with_large_batches_warn_once_naming_to_torch_num_workers():
    """DataLoader workers with batches of 1 MiB or more: the main process warns once, naming
    the form that hands batches over through reusable slots; small batches say nothing."""
    for one in (True, False):  # one array an element, or a dict of them
        def element(i, one=one):
            a = np.full((256, 1024), i, np.float32)  # 1 MiB
            return a if one else {"x": a, "y": np.arange(3)}
        ds = from_list([element(i) for i in range(4)])
        got: list = []
        said = _said(lambda ds=ds, got=got: got.extend(DataLoader(ds.to_torch(slice_id=0, slice_count=1),
                                                                  batch_size=None, num_workers=2)))
        assert len(got) == 4 and all(isinstance(g if one else g["x"], torch.Tensor) for g in got)
        assert len(said) == 1 and "DataLoader(num_workers=2) hands each 1.0 MB batch" in said[0], said
        assert "to_torch(num_workers=2) in DataLoader(num_workers=0)" in said[0]
    small = from_list([np.zeros(4, np.float32)] * 4)
    assert not _said(lambda: list(DataLoader(small.to_torch(slice_id=0, slice_count=1), batch_size=None,
                                             num_workers=2)))


def test_num_workers_under_a_stateful_dataloader_resume_where_it_stopped(tmp_path):
    """``StatefulDataLoader(ds.to_torch(num_workers=2), batch_size=None)`` (its own
    num_workers=0): its state_dict() holds both workers' positions and the turn, and a new
    loader resumes with the batches not yet delivered."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    files = write_bytes_shards(tmp_path, n_files=3, per_file=9)
    ds = sf.read_tfrecord(files, spec=BSPEC).batch(2)
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2) as tds:
        want = list(tds)
        loader = sdl.StatefulDataLoader(tds, batch_size=None)
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict(), default=list))
        del it
    with ds.to_torch(slice_id=0, slice_count=1, num_workers=2) as again:
        loader = sdl.StatefulDataLoader(again, batch_size=None)
        loader.load_state_dict(state)
        assert _same(head + list(loader), want)

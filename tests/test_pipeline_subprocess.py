"""``in_subprocess``: the chain above it in one spawned child, batches through shared memory.

Tests that start a child have "subprocess" in their names (conftest marks them slow).
"""

from __future__ import annotations

import gc
import glob
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import SubprocessError
from shardfeed.pipeline import check_resume_everywhere, from_list
from shardfeed.pipeline.state import elements_equal

from .test_pipeline_helpers import started_since, wait_threads_back_to

BSPEC = {"id": sf.FixedLen("int64"), "x": sf.FixedLen("float32", shape=[2]), "ids": sf.VarLen("int64"),
         "tok": sf.FixedLen("bytes"), "tags": sf.VarLen("bytes")}


def _example(i: int) -> bytes:
    return sf.encode_example({"id": [i], "x": np.array([i, -i], np.float32), "ids": list(range(i % 4)),
                              "tok": [b"t%d" % i * (i % 5)], "tags": [b"g%d" % j for j in range(i % 3)]})


def write_bytes_shards(tmp_path, n_files: int = 3, per_file: int = 9) -> list[str]:
    paths = []
    for f in range(n_files):
        p = str(tmp_path / f"b-{f:03d}.tfrecord")
        sf.write_records(p, [_example(f * 1000 + i) for i in range(per_file)], index=True)
        paths.append(p)
    return paths


def add_total(batch):
    """A user map function (top level, so it pickles to the child)."""
    out = dict(batch)
    out["total"] = batch["id"] + batch["x"][:, 0].astype(np.int64)
    return out


def fail_at_seven(x):
    if x == 7:
        raise ValueError(f"bad element {x}")
    return x


def skip_odd(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


class Unpicklable(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


def raise_unpicklable(x):
    raise Unpicklable(f"cannot travel {x}")


def slow(x):
    time.sleep(0.02)
    return np.full(1000, x, np.int64)


def grow(x):
    """Element ``x`` is ``x`` KiB of int8, so the slots must grow."""
    return {"v": np.full(x * 1024, x % 100, np.int8), "k": x}


def logged(x):
    with open(os.environ["SF_SUBPROCESS_TEST_LOG"], "a") as f:
        f.write(f"{x}\n")
    return np.arange(x, x + 3)


def pipelines(files):
    return {
        "object": sf.read_tfrecord(files, spec=BSPEC).batch(4),
        "buffer": sf.read_tfrecord(files, spec=BSPEC).batch(4, bytes_as="buffer"),
        "shuffled_mapped": (sf.read_tfrecord(files, spec=BSPEC, shuffle="global", seed=3).batch(5)
                            .map(add_total, num_parallel_calls=2)),
    }


def test_subprocess_output_equals_the_in_process_pipeline(tmp_path):
    files = write_bytes_shards(tmp_path)
    for name, ds in pipelines(files).items():
        want = list(ds)
        got = list(ds.in_subprocess(buffer_size=2))
        assert len(got) == len(want) and elements_equal(got, want), name
        ids = np.concatenate([b["id"] for b in got])
        assert sorted(ids.tolist()) == sorted(f * 1000 + i for f in range(3) for i in range(9))  # exactly once
    b = list(pipelines(files)["buffer"].in_subprocess())[1]
    assert type(b["tok"]).__name__ == "BytesBuffer" and b["tok"].to_list() == [b"t4" * 4, b"", b"t6", b"t7" * 2]


def test_subprocess_arrays_stay_valid_after_later_batches(tmp_path):
    ds = from_list(list(range(12))).map(grow).in_subprocess(buffer_size=2)
    got = list(ds)  # every slot reused (and grown) many times over while these are kept
    for x, e in enumerate(got):
        assert e["k"] == x and e["v"].shape == (x * 1024,) and (e["v"] == x % 100).all()
    extra = ds.stats().stages[-1].extra
    assert extra["slots"] == 2
    # list() keeps every batch: the first (empty, nothing to view) and the second are handed
    # without a copy, the second as a view of its slot; then the consumer holds all slots but
    # one, and every later batch is copied out, so the ring never stalls
    assert (extra["zero_copy"], extra["copied_out"]) == (2, 10)
    assert _in_slot(got[1]["v"]) and not any(_in_slot(e["v"]) for e in got[2:])
    # two slots, each at most 1.25x the largest element plus a page: memory is bounded
    assert 0 < extra["shared_memory_bytes"] <= 2 * (int(11 * 1024 * 1.25) + 4096 + 4096)


def test_a_budget_of_slot_bytes_bounds_what_the_child_runs_ahead_and_never_stalls_a_consumer_that_keeps_all():
    ds = from_list(list(range(30))).map(block).in_subprocess(buffer_size=16)
    ds.slot_bytes = 3 * 32 * 1024  # three elements' worth: the floor of 4 out at once applies
    it = iter(ds)
    first = next(it)
    deadline = time.monotonic() + 60
    slots = {n for n in _segments() if not n.endswith("_ctl")}  # counted in /dev/shm, not by the library
    while len(slots) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)  # the child runs ahead as far as it may
        slots = {n for n in _segments() if not n.endswith("_ctl")}
    time.sleep(0.5)
    assert _in_slot(first["v"])
    # 4 slots were filled, though 16 exist: the child waits with 4 out
    assert len({n for n in _segments() if not n.endswith("_ctl")}) == 4
    kept = [first, *it]  # a consumer that keeps every element: views of 3, the rest copied out
    assert [int(e["k"]) for e in kept] == list(range(30)) and all((e["v"] == e["k"]).all() for e in kept)
    extra = ds.stats().stages[-1].extra
    assert extra["zero_copy"] == 3 and extra["copied_out"] == 27
    ds.close()


def _slot_mappings() -> list[tuple[int, int, str]]:
    """``(start, end, line)`` of this process's mappings of in_subprocess segments."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if f"/dev/shm/sf_{os.getpid()}_" in line:
                lo, hi = line.split()[0].split("-")
                out.append((int(lo, 16), int(hi, 16), line.strip()))
    return out


def _in_slot(a: np.ndarray | int) -> bool:
    """Whether ``a``'s data (or the address ``a``) lies in a shared-memory slot mapped here:
    a view, not a copy."""
    at = a if isinstance(a, int) else a.__array_interface__["data"][0]
    return any(lo <= at < hi for lo, hi, _ in _slot_mappings())


def block(x):
    """Element ``x``: 32 KiB of ``x`` and its number."""
    return {"v": np.full(4096, x, np.int64), "k": x}


def test_subprocess_arrays_are_views_of_their_slot_until_the_last_view_goes():
    ds = from_list(list(range(40))).map(block).in_subprocess(buffer_size=4)
    it = iter(ds)
    extra = ds.stats().stages[-1].extra
    b = next(it)
    assert _in_slot(b["v"]) and b["v"].flags.writeable and (b["v"] == 0).all()
    keep = b["v"][10:20]  # a slice of a view keeps the whole slot
    del b
    gc.collect()
    assert (extra["zero_copy"], extra["held_slots"]) == (1, 1)
    for x in range(1, 30):  # the child cycles the other slots; the kept one is not rewritten
        b = next(it)  # the previous b is held until this returns: 2 held, below all slots but one
        assert b["k"] == x and (b["v"] == x).all() and _in_slot(b["v"])
        assert (keep == 0).all()
    assert extra["held_slots"] == 2 and extra["copied_out"] == 0
    del b, keep
    assert extra["held_slots"] == 0  # both slots back at once, without a collection
    rest = list(it)
    assert [r["k"] for r in rest] == list(range(30, 40))
    assert extra["zero_copy"] + extra["copied_out"] == 40
    it.close()


def test_subprocess_zero_copy_off_or_one_slot_copies_every_batch_out(tmp_path):
    files = write_bytes_shards(tmp_path)
    for ds in (sf.read_tfrecord(files, spec=BSPEC).batch(4).in_subprocess(zero_copy=False),
               sf.read_tfrecord(files, spec=BSPEC).batch(4).in_subprocess(buffer_size=1)):
        with iter(ds) as it:
            got = list(it)
            extra = ds.stats().stages[-1].extra
            assert (extra["zero_copy"], extra["copied_out"]) == (0, 7)
            assert not any(_in_slot(b["id"]) or _in_slot(b["ids"].values) for b in got)
    with pytest.raises(TypeError, match="zero_copy must be True or False"):
        from_list([1]).in_subprocess(zero_copy="yes")


def test_subprocess_bytes_buffers_and_ragged_columns_are_views_too(tmp_path):
    files = write_bytes_shards(tmp_path)
    want = list(sf.read_tfrecord(files, spec=BSPEC).batch(4, bytes_as="buffer"))
    with iter(sf.read_tfrecord(files, spec=BSPEC).batch(4, bytes_as="buffer").in_subprocess()) as it:
        for w in want:
            b = next(it)
            assert elements_equal(b, w)
            for a in (b["tok"].data, b["tok"].offsets, b["tags"].values.data, b["tags"].values.offsets,
                      b["tags"].row_splits, b["ids"].values, b["ids"].row_splits, b["x"]):
                assert _in_slot(a)


def test_subprocess_array_held_after_close_stays_valid_then_its_memory_goes():
    ds = from_list(list(range(10))).map(block).in_subprocess(buffer_size=2)
    it = iter(ds)
    v = next(it)["v"]
    pid = ds.stats().stages[-1].extra["child_pid"]
    it.close()
    assert not _segments() and pid not in _children()  # the names are gone, the child too
    assert (v == 0).all() and v.sum() == 0 and _in_slot(v)  # the memory is the array's until it goes
    assert all("(deleted)" in line for _, _, line in _slot_mappings())
    v[:] = 7  # still writable, and nobody else's
    assert (v == 7).all()
    del v
    gc.collect()
    assert _slot_mappings() == []  # the last view took the mapping with it


def hold_in_thread(batch, go: threading.Event) -> threading.Thread:
    """Hold ``batch`` in another thread (as a training thread would) and drop it there on ``go``."""
    def drop():
        nonlocal batch
        go.wait()
        del batch
    t = threading.Thread(target=drop)
    t.start()
    return t


def test_subprocess_slot_released_in_another_thread_goes_back_to_the_child():
    ds = from_list(list(range(30))).map(block).in_subprocess(buffer_size=2)
    with iter(ds) as it:
        extra = ds.stats().stages[-1].extra
        go = threading.Event()
        t = hold_in_thread(next(it), go)
        for _ in range(5):  # the thread holds one slot of two: what comes meanwhile is copied
            assert not _in_slot(next(it)["v"])
        go.set()
        t.join()
        assert extra["held_slots"] == 0 and extra["copied_out"] == 5
        b = next(it)
        assert _in_slot(b["v"])  # the slot went back: views again
        assert sorted(int(x["k"]) for x in it) == list(range(int(b["k"]) + 1, 30))


@pytest.mark.parametrize("after", ["none", "map_after"])
def test_subprocess_resumes_at_every_step(tmp_path, after):
    files = write_bytes_shards(tmp_path, n_files=2, per_file=5)
    ds = sf.read_tfrecord(files, spec=BSPEC, shuffle="global", seed=1).batch(3).map(add_total).in_subprocess(2)
    if after == "map_after":
        ds = ds.unbatch().batch(2)
    assert check_resume_everywhere(ds) == (5 if after == "none" else 6)


def test_subprocess_stats_match_the_in_process_stats(tmp_path):
    files = write_bytes_shards(tmp_path)
    plain = sf.read_tfrecord(files, spec=BSPEC).batch(4).map(add_total)
    list(plain)
    inner = plain.in_subprocess()
    list(inner)
    a, b = plain.stats(), inner.stats()
    assert [s.name for s in b.stages[:-1]] == [s.name for s in a.stages]
    assert b.stages[-1].name == f"{len(a.stages)}:subprocess"
    assert [(s.elements, s.bytes) for s in b.stages[:-1]] == [(s.elements, s.bytes) for s in a.stages]
    assert b.stages[-1].elements == a.stages[-1].elements and b.consumer_elements == a.consumer_elements
    assert b.to_dict()["stages"][-1]["shared_memory_bytes"] > 0
    assert "subprocess" in str(b) and b.verdict()
    skipping = from_list(list(range(10))).map(skip_odd, on_error="skip")
    assert list(skipping.in_subprocess()) == [0, 2, 4, 6, 8]
    s = skipping.in_subprocess()
    list(s)
    assert s.stats().errors.total == 5 and s.stats().errors.examples[0]["error"] == "ValueError: odd 1"


def test_an_unpicklable_stage_is_named_at_once():
    with pytest.raises(TypeError, match=r"the map stage's fn \(<function .*<lambda>"):
        from_list([1, 2]).map(lambda x: x).batch(2).in_subprocess()
    with pytest.raises(ValueError, match="buffer_size must be a positive int"):
        from_list([1]).in_subprocess(0)


def test_subprocess_child_exception_arrives_with_its_type_and_traceback():
    it = iter(from_list(list(range(20))).map(fail_at_seven).in_subprocess())
    got = []
    with pytest.raises(ValueError, match="bad element 7") as info:
        for x in it:
            got.append(x)
    assert got == list(range(7))
    assert "fail_at_seven" in str(info.value.__cause__) and "Traceback" in str(info.value.__cause__)
    with pytest.raises(SubprocessError, match=r"Unpicklable: cannot travel 0") as info:
        list(from_list([0]).map(raise_unpicklable).in_subprocess())
    assert "raise_unpicklable" in str(info.value.__cause__)


def test_subprocess_chain_the_child_cannot_import_is_a_clear_error():
    import types

    mod = types.ModuleType("sf_only_in_this_interpreter")  # importable here, not in a fresh child
    exec("def double(x):\n    return 2 * x\n", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        ds = from_list([1, 2]).map(mod.double).in_subprocess()
        with pytest.raises(SubprocessError, match="could not unpickle the chain above in_subprocess .*"
                                                  "sf_only_in_this_interpreter"):
            list(ds)
    finally:
        del sys.modules[mod.__name__]


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                out.add(int(pid))
    return out


def _segments(pid: int | None = None) -> set[str]:
    prefix = f"sf_{pid or os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def _control_blocks(pid: int | None = None) -> set[str]:
    return {n for n in _segments(pid) if n.endswith("_ctl")}


def test_subprocess_killed_child_is_one_clear_error():
    ds = from_list(list(range(500))).map(slow).in_subprocess(buffer_size=2)
    it = iter(ds)
    next(it)
    pid = ds.stats().stages[-1].extra["child_pid"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SubprocessError, match=r"killed by signal SIGKILL \(exit code -9\)"):
        for _ in range(10):  # at most the batches already in the ring, then the error
            next(it)
    it.close()
    assert not _segments() and pid not in _children()


def test_subprocess_backpressure_bounds_the_elements_made_ahead(tmp_path, monkeypatch):
    log = tmp_path / "made.txt"
    monkeypatch.setenv("SF_SUBPROCESS_TEST_LOG", str(log))
    ds = from_list(list(range(100))).map(logged).in_subprocess(buffer_size=3)
    with iter(ds) as it:
        for _ in range(5):
            next(it)
        seen, stable = -1, 0
        while stable < 20:  # until the child stopped making elements (it waits for a slot)
            time.sleep(0.05)
            n = len(log.read_text().split())
            stable, seen = (stable + 1, n) if n == seen else (0, n)
        # delivered 5; at most 3 in the slots and 1 made and waiting for a slot
        assert seen <= 5 + 3 + 1
        assert len(_segments() - _control_blocks()) <= 3  # the slots (the control block aside)


@pytest.mark.timeout(900)  # 100 interpreters started: minutes on a loaded 2-core machine
def test_subprocess_100_open_close_cycles_leave_no_process_segment_or_thread():
    ds = from_list(list(range(50))).batch(5).in_subprocess(buffer_size=2)
    with iter(ds) as it:  # the resource tracker starts once per interpreter: before the count
        next(it)
    time.sleep(0.2)
    threads, children, segments = set(threading.enumerate()), _children(), _segments()
    for k in range(100):
        it = iter(ds)
        next(it)
        if k % 3 == 0:
            it.close()
        elif k % 3 == 1:
            del it  # garbage collection closes it
            gc.collect()
        else:
            it.close()
            it.close()  # idempotent
    assert wait_threads_back_to(threads) == []
    assert _children() <= children and not multiprocessing.active_children()
    assert _segments() == segments == set()
    assert started_since(threads) == []


SCRIPT = """
import os, sys, time
import numpy as np
sys.path[:0] = {paths!r}
from tests.test_pipeline_subprocess import slow
from shardfeed.pipeline import from_list

if __name__ == "__main__":
    it = iter(from_list(list(range(10000))).map(slow).in_subprocess(buffer_size=2))
    first = next(it)  # a view of its slot, held through the exit
    print("child", it.stats().stages[-1].extra["child_pid"], flush=True)
    if {mode!r} == "exit":
        sys.exit(0)  # normal interpreter exit with the pass open
    for x in it:
        time.sleep(0.01)
"""


@pytest.mark.parametrize("mode", ["ctrl_c", "exit"])
def test_subprocess_ctrl_c_and_interpreter_exit_leave_nothing_behind(mode):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(SCRIPT.format(paths=[root] + sys.path, mode="exit" if mode == "exit" else "run"))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("child"), p.stderr.read()
    child = int(line.split()[1])
    if mode == "ctrl_c":
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if mode == "ctrl_c":
        assert "KeyboardInterrupt" in err and p.returncode != 0, err
    else:
        assert p.returncode == 0 and "Traceback" not in err, err
    assert "leaked" not in err and "resource_tracker" not in err, err
    for _ in range(100):  # the orphaned child, if any, is reaped by init: wait for that
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)
    assert not _segments(p.pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_subprocess_to_torch_one_child_per_rank_reads_its_share(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    files = write_bytes_shards(tmp_path, n_files=4, per_file=3)
    ds = sf.read_tfrecord(files, spec=BSPEC).batch(2).map(add_total)
    # DataLoader's default_convert makes tensors of the views without a copy: they keep the slot
    sub = from_list(list(range(20))).map(block).in_subprocess(buffer_size=2)
    loader = DataLoader(sub.to_torch(slice_id=0, slice_count=1), batch_size=None)
    batches = iter(loader)
    t = next(batches)["v"]
    assert isinstance(t, torch.Tensor) and _in_slot(t.data_ptr())
    assert [int(b["k"]) for b in batches] == list(range(1, 20))  # the pass ended and closed
    sub.close()  # the child kept for the next pass goes (or with the dataset, garbage-collected)
    assert (t == 0).all() and not _segments()
    u = torch.from_numpy(np.asarray(t)[5:])  # from_numpy keeps it too
    del t
    gc.collect()
    assert _in_slot(u.data_ptr()) and (u == 0).all()
    del u
    gc.collect()
    assert _slot_mappings() == []
    for rank in range(2):
        want = list(DataLoader(ds.to_torch(slice_id=rank, slice_count=2), batch_size=None))
        got = list(DataLoader(ds.in_subprocess().to_torch(slice_id=rank, slice_count=2), batch_size=None))
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert isinstance(g["id"], torch.Tensor) and torch.equal(g["id"], w["id"])
            assert torch.equal(g["total"], w["total"])
        ids = torch.cat([g["id"] for g in got]).tolist()
        assert {i // 1000 for i in ids} == {rank, rank + 2}  # the rank's own files only
    # in a DataLoader worker (a daemonic process) the child cannot start: said plainly
    with pytest.raises(Exception, match="DataLoader\\(num_workers=0\\)"):
        list(DataLoader(ds.in_subprocess().to_torch(slice_id=0, slice_count=1), batch_size=None, num_workers=1))


@pytest.mark.tf
def test_subprocess_to_tf_yields_the_same_batches():
    tf = pytest.importorskip("tensorflow")
    ds = from_list([{"a": np.arange(3) + i, "s": b"x%d" % i} for i in range(5)]).batch(2)
    sub = ds.in_subprocess()
    got = list(sub.to_tf().as_numpy_iterator())
    sub.close()  # TensorFlow keeps the generator, and so the dataset and its kept child, past the pass
    assert ds.in_subprocess().to_tf().element_spec["a"] == tf.TensorSpec((None, 3), tf.int64)
    assert [g["a"].tolist() for g in got] == [b["a"].tolist() for b in ds]
    assert got[2]["s"].tolist() == [b"x4"]


def test_subprocess_to_jax_places_the_same_arrays():
    pytest.importorskip("jax")
    ds = from_list([np.arange(4) + i for i in range(6)]).batch(2)
    got = list(ds.in_subprocess().to_jax())
    assert [np.asarray(g).tolist() for g in got] == [b.tolist() for b in ds]


def first_of(x):
    return int(x["id"])


@pytest.mark.parametrize("chain", ["fused", "map"])
def test_subprocess_shuffle_state_carries_the_buffer_offsets_asked_from_the_child(tmp_path, chain):
    # the child sends each element's state without the shuffle's offsets (costly to make);
    # get_state() asks the child for the current element's, so a restore reads back one buffer
    files = write_bytes_shards(tmp_path, n_files=2, per_file=3000)
    src = sf.read_tfrecord(files, spec=BSPEC)
    if chain == "fused":
        ds = src.shuffle(500, seed=3).batch(10).map(add_total).in_subprocess(3)
    else:
        ds = src.map(first_of).shuffle(500, seed=3).batch(10).in_subprocess(3)
    with iter(ds) as it:
        for _ in range(300):
            next(it)
        state = it.get_state()
        rest = list(it)
    assert "frames" in json.dumps(state)
    with ds.iter_from_state(json.loads(json.dumps(state))) as it:
        assert elements_equal(list(it), rest)
    # the restore ran in a child: what it read back shows in that pass's stats, not here; in
    # process, the same state restores with exactly one buffer read again
    inner = ds.parent
    again = src.read_stats.reread
    with inner.iter_from_state(dict(state, root=state["root"]["parent"])) as it:
        assert elements_equal(list(it), rest)
    assert src.read_stats.reread - again == 500


def test_subprocess_state_without_the_childs_answer_falls_back_to_what_it_sent(tmp_path):
    files = write_bytes_shards(tmp_path, n_files=1, per_file=2000)
    ds = sf.read_tfrecord(files, spec=BSPEC).map(first_of).shuffle(300, seed=1).batch(5).in_subprocess(2)
    it = iter(ds)
    for _ in range(100):
        next(it)
    rest_state = it._root.get_state()
    expected = list(it)
    it.close()  # the child is gone: the deferred state is made from what it sent
    from shardfeed.pipeline.deferred import materialize
    from shardfeed.pipeline.iterator import STATE_VERSION

    made = materialize(rest_state)
    assert "frames" not in json.dumps(made) and "anchor" in json.dumps(made)
    state = {"version": STATE_VERSION, "pass": 0, "done": False, "root": made}
    with ds.iter_from_state(json.loads(json.dumps(state))) as resumed:  # by the anchor rule, exactly
        assert elements_equal(list(resumed), expected)


class _Slow:
    """A map that takes its time over some elements (picklable, top level)."""

    def __init__(self, ids, seconds: float) -> None:
        self.ids, self.seconds = set(ids), seconds

    def __call__(self, batch):
        if int(batch["id"][0]) in self.ids:
            time.sleep(self.seconds)
        return batch


def test_subprocess_get_state_does_not_wait_for_the_element_being_made(tmp_path):
    # a thread of the child answers: the element the child is making (slow here) does not delay it
    files = write_bytes_shards(tmp_path, n_files=1, per_file=400)
    src = sf.read_tfrecord(files, spec=BSPEC)
    order = [int(b["id"][0]) for b in src.shuffle(100, seed=2).batch(4)]
    ds = src.shuffle(100, seed=2).batch(4).map(_Slow(order[2:3], 1.5)).in_subprocess(1)
    with iter(ds) as it:
        next(it)
        next(it)  # the child is making the third batch now, slowly
        time.sleep(0.2)
        t = time.perf_counter()
        state = it.get_state()
        waited = time.perf_counter() - t
        t = time.perf_counter()
        next(it)
        busy = time.perf_counter() - t
        rest = list(it)
    assert "frames" in json.dumps(state)
    assert busy > 0.5, busy  # the child was still making the third batch when the state was asked for ...
    assert waited < 0.5, waited  # ... and did not make the question wait for it
    with ds.iter_from_state(json.loads(json.dumps(state))) as it:
        assert elements_equal(list(it)[1:], rest)


def test_subprocess_get_state_inside_a_get_state_falls_back_instead_of_hanging(tmp_path):
    # a signal handler that saves the state while the program is already saving it
    files = write_bytes_shards(tmp_path, n_files=1, per_file=600)
    ds = sf.read_tfrecord(files, spec=BSPEC).shuffle(100, seed=2).batch(4).in_subprocess(2)
    with iter(ds) as it:
        for _ in range(10):
            next(it)
        node = it._root
        node.reading = threading.get_ident()  # as if interrupted in the middle of reading an answer
        inner = it.get_state()
        node.reading = None
        outer = it.get_state()
        rest = list(it)
    assert "frames" not in json.dumps(inner) and "frames" in json.dumps(outer)
    for state in (inner, outer):
        with ds.iter_from_state(json.loads(json.dumps(state))) as resumed:
            assert elements_equal(list(resumed), rest)


# -- issue 39.12: the unpicklable function named; a frozen child times out ------------------
def _closure():
    k = 3

    def add_k(x):
        return x + k
    return add_k


def takes(resource, x):
    return x


class _SocketHolder:
    def __init__(self):
        import socket

        self.sock = socket.socket()

    def apply(self, x):
        return x


def _unpicklable_functions(tmp_path):
    import functools

    f = open(tmp_path / "held.txt", "w")  # noqa: SIM115 - held by the function under test
    return {
        "lambda": (lambda x: x, r"does not: tests\.test_pipeline_subprocess\._unpicklable_functions\.<locals>\."
                                r"<lambda> is a lambda, which pickle cannot find by name"),
        "closure": (_closure(), r"does not: tests\.test_pipeline_subprocess\._closure\.<locals>\.add_k is defined "
                                r"inside a function"),
        "lock": (functools.partial(takes, threading.Lock()),
                 r"does not: functools\.partial\(tests\.test_pipeline_subprocess\.takes, \.\.\.\) cannot be pickled: "
                 r"its args\[0\] \(<unlocked _thread\.lock.*cannot pickle '_thread\.lock' object"),
        "open file": (functools.partial(takes, f),
                      r"its args\[0\] \(<_io\.TextIOWrapper name=.*cannot pickle '_io\.TextIOWrapper' object"),
        "generator": (functools.partial(takes, (i for i in range(3))),
                      r"its args\[0\] \(<generator object.*cannot pickle 'generator' object"),
        "socket": (_SocketHolder().apply,
                   r"does not: tests\.test_pipeline_subprocess\._SocketHolder\.apply \(bound to a _SocketHolder "
                   r"object\) cannot be pickled: its __self__\.sock \(<socket\.socket.*cannot pickle 'socket' object"),
    }


@pytest.mark.parametrize("kind", ["lambda", "closure", "lock", "open file", "generator", "socket"])
def test_in_subprocess_names_the_unpicklable_user_function_not_the_source(tmp_path, kind):
    files = write_bytes_shards(tmp_path, n_files=1)
    fn, why = _unpicklable_functions(tmp_path)[kind]
    with pytest.raises(TypeError) as info:
        sf.read_tfrecord(files, spec=BSPEC).batch(4).map(fn).in_subprocess()
    text = str(info.value)
    assert "_stats_lock" not in text and "tfrecord stage" not in text, text
    assert text.startswith("in_subprocess: the chain above it must pickle to reach the spawned child, but the map "
                           "stage's fn ("), text
    assert re.search(why, text), text


def test_in_subprocess_names_an_unpicklable_predicate_and_handler():
    with pytest.raises(TypeError, match=r"the filter stage's predicate \(.*\) does not: .*<lambda> is a lambda"):
        from_list([1, 2]).filter(lambda x: True).in_subprocess()
    with pytest.raises(TypeError, match=r"the map stage's policy \(.*\) does not: its on_error handler .*<lambda> is a lambda"):
        from_list([1, 2]).map(fail_at_seven, on_error=lambda e, c: None).in_subprocess()


def freeze_at_three(x):
    if x == 3:
        threading.Event().wait()  # never set: the child is stuck here
    return x


def test_subprocess_frozen_child_times_out_naming_its_pid_and_where_it_is():
    ds = from_list(list(range(10))).map(freeze_at_three).in_subprocess(buffer_size=2, timeout=3.0)
    it = iter(ds)
    got = [next(it) for _ in range(3)]
    pid = ds.stats().stages[-1].extra["child_pid"]
    with pytest.raises(TimeoutError, match=rf"in_subprocess child process \(pid {pid}\) sent no element for 3 s") \
            as info:
        next(it)
    assert got == [0, 1, 2]
    text = str(info.value)
    assert "from_list(10 items).map(tests.test_pipeline_subprocess.freeze_at_three)" in text, text  # the stage
    assert re.search(r"most recent call first:\n.*line \d+ in freeze_at_three", text, re.S), text  # its stack
    with pytest.raises(StopIteration):  # the pass ended with the error; nothing more, no hang
        next(it)
    assert pid not in _children() and not _segments()
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"sf_{os.getpid()}_*.stack"))  # its stack file


def test_subprocess_timeout_must_be_a_positive_number():
    for bad in (0, -1, float("nan"), "3", True):
        with pytest.raises(ValueError, match="in_subprocess timeout must be a positive number of seconds"):
            from_list([1]).in_subprocess(timeout=bad)
    assert list(from_list([1, 2]).in_subprocess(timeout=60)) == [1, 2]


def test_subprocess_bytes_columns_become_objects_only_when_read(tmp_path):
    """The trainer's side of a hand-over builds no bytes object: a bytes column stays buffer
    plus offsets (views of the slot) until the batch's user reads it, and then it is the
    object array the pipeline gives without in_subprocess, through every way of reading a dict."""
    import copy
    import pickle

    files = write_bytes_shards(tmp_path)
    want = list(sf.read_tfrecord(files, spec=BSPEC).batch(4))
    for kw in ({}, {"zero_copy": False}):
        with iter(sf.read_tfrecord(files, spec=BSPEC).batch(4).in_subprocess(**kw)) as it:
            b = next(it)
            assert isinstance(b, dict) and list(b) == list(want[0])
            assert not isinstance(dict.__getitem__(b, "tok"), np.ndarray)  # not made at next()
            assert _in_slot(b["id"]) == (not kw)
            tok = b["tok"]
            assert tok.dtype == object and tok.shape == (4,) and tok.tolist() == want[0]["tok"].tolist()
            assert dict.__getitem__(b, "tok") is tok  # made once, kept
            assert b["tags"].values.dtype == object  # a VarLen bytes column: objects inside its RaggedColumn
            for view in (dict(b), {**b}, b.copy(), copy.deepcopy(b), pickle.loads(pickle.dumps(b))):
                assert type(view) is dict and elements_equal(view, want[0])
            assert b.get("tok") is tok and "b't1'" in repr(b) and "LazyBytes" not in repr(next(it))
            assert [type(v) for v in b.values()] == [type(v) for v in want[0].values()]
            assert elements_equal(dict(b.items()), want[0]) and b.pop("tok") is tok and "tok" not in b
            rest = list(it)
            assert elements_equal([dict(x) for x in rest], want[2:])
    assert elements_equal(list(sf.read_tfrecord(files, spec=BSPEC).batch(4).in_subprocess(buffer_size=1)), want)


def test_a_copied_batch_keeps_its_bytes_columns_unmade_until_read(tmp_path):
    """copy.copy of a batch (what DataLoader's default_convert does to every dict batch) is a
    batch of its own over the same columns: neither it nor the original makes a bytes column
    before one of them is read, and each reads the pipeline's object arrays (batches built
    from a plan's template included: the third on)."""
    import copy

    files = write_bytes_shards(tmp_path)
    want = list(sf.read_tfrecord(files, spec=BSPEC).batch(2))
    with iter(sf.read_tfrecord(files, spec=BSPEC).batch(2).in_subprocess()) as it:
        for i, b in enumerate(it):
            c = copy.copy(b)
            assert type(c) is type(b) and c is not b and list(c) == list(b)
            assert not isinstance(dict.__getitem__(b, "tok"), np.ndarray)
            assert not isinstance(dict.__getitem__(c, "tok"), np.ndarray)
            c["extra"] = 1
            assert "extra" not in b  # a dict of its own
            del c["extra"]
            assert elements_equal(dict(c), want[i])
            assert not isinstance(dict.__getitem__(b, "tok"), np.ndarray)  # reading the copy made the copy's
            assert elements_equal(dict(b), want[i])
    assert i == len(want) - 1 >= 3


def test_subprocess_new_pass_reuses_the_child_and_its_slots(tmp_path):
    """A new iter() of the dataset, and each epoch of a repeat() after the stage, asks the
    child that served the last pass for another (same pid, same segments); the child goes
    away with the dataset's close(), and with the dataset itself, leaving no segment."""
    files = write_bytes_shards(tmp_path)
    before = _segments()
    ds = sf.read_tfrecord(files, spec=BSPEC).batch(4).in_subprocess(buffer_size=3)
    want = list(sf.read_tfrecord(files, spec=BSPEC).batch(4))
    pids, segs = [], []
    for _ in range(3):
        with iter(ds) as it:
            got = list(it)
            pids.append(ds.stats().stages[-1].extra["child_pid"])
        assert elements_equal(got, want)
        segs.append(_segments())
    assert len(set(pids)) == 1 and pids[0] in _children() and segs[0] == segs[1] == segs[2] != before
    assert [ds.stats().stages[-1].extra["reused_child"]] == [1]
    rep = ds.repeat(3)
    got = list(rep)
    sub = [s for s in rep.stats().stages if s.name.endswith("subprocess")]
    assert elements_equal(got, want * 3) and sub and all(s.extra["child_pid"] == pids[0] for s in sub)
    # a state restore (mid-epoch) goes through the kept child too
    with iter(ds) as it:
        next(it)
        next(it)
        state = it.get_state()
    # stopped mid-pass: that child went away; the next pass starts one and keeps it
    assert pids[0] not in _children()
    with ds.iter_from_state(json.loads(json.dumps(state))) as it:
        assert elements_equal(list(it), want[2:])
        pid = ds.stats().stages[-1].extra["child_pid"]
    with ds.iter_from_state(json.loads(json.dumps(state))) as it:
        assert elements_equal(list(it), want[2:])
        assert ds.stats().stages[-1].extra["child_pid"] == pid
    ds.close()
    assert pid not in _children() and _segments() == before
    assert elements_equal(list(ds), want)  # a pass after close() starts a new child
    pid = ds.stats().stages[-1].extra["child_pid"]
    assert pid in _children()
    del ds, rep, it  # the last iterator holds its dataset too
    gc.collect()
    for _ in range(100):
        if pid not in _children():
            break
        time.sleep(0.05)
    assert pid not in _children() and _segments() == before


EXIT_SCRIPT = """
import os, sys
sys.path[:0] = {paths!r}
import shardfeed as sf
from shardfeed.pipeline import from_list
from tests.test_pipeline_subprocess import block

if __name__ == "__main__":
    ds = from_list(list(range(6))).map(block).in_subprocess(buffer_size=2)
    assert len(list(ds)) == 6
    print("child", ds.stats().stages[-1].extra["child_pid"], os.getpid(), flush=True)
    keep = ds  # kept to the interpreter's exit, its child idle
"""


def test_subprocess_kept_child_goes_away_at_interpreter_exit():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(EXIT_SCRIPT.format(paths=[root] + sys.path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "leaked" not in p.stderr, p.stderr
    child, parent = (int(w) for w in p.stdout.split()[1:3])
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)
    assert not _segments(parent)


def test_subprocess_kept_child_stops_when_no_pass_asks_for_it(monkeypatch):
    """A dataset that lives on unused (TensorFlow's from_generator keeps its generator, say)
    holds no idle child for ever: it stops after SHARDFEED_SUBPROCESS_IDLE_SECONDS."""
    monkeypatch.setenv("SHARDFEED_SUBPROCESS_IDLE_SECONDS", "0.5")
    before = _segments()
    ds = from_list(list(range(6))).map(block).in_subprocess(buffer_size=2)
    assert len(list(ds)) == 6
    pid = ds.stats().stages[-1].extra["child_pid"]
    assert pid in _children()
    for _ in range(100):  # the timer's thread reaps the child, then removes its segments' names
        if pid not in _children() and _segments() == before:
            break
        time.sleep(0.05)
    assert pid not in _children() and _segments() == before
    assert [x["k"] for x in ds] == list(range(6))  # the next pass starts a new one
    assert ds.stats().stages[-1].extra["reused_child"] == 0
    ds.close()


def test_subprocess_kept_child_killed_while_idle_is_replaced_at_the_next_pass():
    before = _segments()
    ds = from_list(list(range(6))).map(block).in_subprocess(buffer_size=2)
    assert [x["k"] for x in ds] == list(range(6))
    pid = ds.stats().stages[-1].extra["child_pid"]
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # dead: gone, or a zombie (its parent may be a fork server, not this process)
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.05)
    assert [x["k"] for x in ds] == list(range(6))  # every element, from a new child
    extra = ds.stats().stages[-1].extra
    assert extra["child_pid"] != pid and extra["reused_child"] == 0
    ds.close()
    assert _segments() == before  # the dead child's segments were removed too


def sleep_after_first(x):
    """Element 0 at once, then nothing for a long time (the consumer waits on an empty ring)."""
    if x:
        time.sleep(60)
    return np.full(4, x)


def test_subprocess_child_killed_while_the_consumer_waits_on_an_empty_ring_is_one_clear_error():
    ds = from_list(list(range(5))).map(sleep_after_first).in_subprocess(buffer_size=2)
    it = iter(ds)
    assert next(it).tolist() == [0] * 4
    pid = ds.stats().stages[-1].extra["child_pid"]
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))  # while next() below blocks
    killer.start()
    try:
        with pytest.raises(SubprocessError, match=r"killed by signal SIGKILL"):
            next(it)
    finally:
        killer.join()
        it.close()
    assert not _segments() and pid not in _children()


def test_subprocess_ready_batches_cross_and_slots_go_back_without_a_pipe_read_or_write(tmp_path, monkeypatch):
    """While the ring holds batches, the consumer takes one and hands its slot back through
    the shared control block: no message on a pipe either way (each cost the trainer a system
    call and a wake of the child, tens of microseconds on a loaded machine)."""
    from multiprocessing.connection import Connection

    log = tmp_path / "made.txt"
    monkeypatch.setenv("SF_SUBPROCESS_TEST_LOG", str(log))
    calls: list[str] = []
    for name in ("_send_bytes", "_recv_bytes", "_poll"):
        real = getattr(Connection, name)
        monkeypatch.setattr(Connection, name, lambda self, *a, _real=real, _name=name: (calls.append(_name),
                                                                                       _real(self, *a))[1])
    ds = from_list(list(range(40))).map(logged).in_subprocess(buffer_size=4)
    with iter(ds) as it:
        got = [next(it).tolist()]
        for _ in range(6):  # each time: the ring full again (the child waits for a slot), then a batch taken
            seen, stable = -1, 0
            while stable < 10:
                time.sleep(0.05)
                n = len(log.read_text().split())
                stable, seen = (stable + 1, n) if n == seen else (0, n)
            calls.clear()
            got.append(next(it).tolist())  # the previous batch's slot goes back as it is dropped
            assert calls == []
        assert got == [[x, x + 1, x + 2] for x in range(7)]


def varied(x):
    """Elements whose structure and layout change from time to time (and a scalar each time)."""
    if x % 5 == 4:
        return (np.arange(x), {"k": x})
    if x % 3 == 0:
        return {"a": np.arange(x, dtype=np.int32), "i": x, "t": np.array([b"v%d" % x] * (x % 4), object)}
    return {"a": np.full((2, x), x, np.float64), "r": sf.RaggedColumn(np.arange(x), np.array([0, x // 2, x])),
            "b": np.array([b"w" * x], object)}


def test_subprocess_elements_with_a_new_layout_arrive_whole():
    want = [varied(x) for x in range(30)]
    for kw in ({}, {"zero_copy": False}, {"buffer_size": 1}):
        got = list(from_list(list(range(30))).map(varied).in_subprocess(**kw))
        assert elements_equal([dict(g) if isinstance(g, dict) else g for g in got], want), kw
        assert all(g["b"].dtype == object for g in got if isinstance(g, dict) and "b" in g)


def test_subprocess_slots_are_reused_after_their_hand_back_in_any_order():
    ds = from_list(list(range(12))).map(logged_free).in_subprocess(buffer_size=3)
    with iter(ds) as it:
        a, b = next(it), next(it)  # two held: the child fills the third slot, then waits
        assert _in_slot(a) and _in_slot(b)
        del b  # the newer goes back first
        c = next(it)
        del a
        assert c.tolist() == [2, 3, 4]
        del c
        rest = [x.tolist() for x in it]
        assert rest == [[x, x + 1, x + 2] for x in range(3, 12)]
        extra = ds.stats().stages[-1].extra
        assert extra["copied_out"] == 0 and len(_segments() - _control_blocks()) <= 3


def logged_free(x):
    return np.arange(x, x + 3)


def test_a_script_without_a_main_guard_is_told_why_its_child_died(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text("from shardfeed.pipeline import from_list\n"
                      "print(list(from_list(list(range(4))).in_subprocess()))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path))
    assert out.returncode != 0
    assert "SubprocessError" in out.stderr and 'if __name__ == "__main__":' in out.stderr


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
@pytest.mark.parametrize("setting", [None, "0"])
def test_the_child_runs_under_batch_scheduling_unless_told_not_to(monkeypatch, setting):
    # a wake of the child must not preempt the trainer's step on its core (SCHED_BATCH)
    if setting is None:
        monkeypatch.delenv("SHARDFEED_SUBPROCESS_SCHED_BATCH", raising=False)
    else:
        monkeypatch.setenv("SHARDFEED_SUBPROCESS_SCHED_BATCH", setting)
    ds = from_list(list(range(50))).map(slow).in_subprocess(buffer_size=2)
    with iter(ds) as it:
        next(it)
        pid = ds.stats().stages[-1].extra["child_pid"]
        policy = os.sched_getscheduler(pid)
        threads = os.listdir(f"/proc/{pid}/task")
        assert all(os.sched_getscheduler(int(t)) == policy for t in threads)
    assert policy == (os.SCHED_BATCH if setting is None else os.SCHED_OTHER)

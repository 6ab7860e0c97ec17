"""The recycled batch-buffer pool between passes (``shardfeed.formats.bufpool``): kept warm
for the next pass, bounded by what was in use at once, given back when idle, on request, at
exit and in a forked child."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.formats import bufpool
from shardfeed.formats import native as nv

pytestmark = pytest.mark.skipif(not nv.native_available(), reason=f"native extension not built: {nv.native_info()}")

SPEC = {"img": sf.FixedLen("bytes"), "n": sf.FixedLen("int64")}
VALUE_BYTES = 300_000  # batches of 4: 1.2 MB each, above the pool's 1 MiB floor


@pytest.fixture(autouse=True)
def _fresh_pool():
    bufpool.set_pool_idle_seconds(None)
    bufpool.release_pooled_memory()
    yield
    bufpool.set_pool_idle_seconds(None)
    bufpool.release_pooled_memory()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> tuple[str, list[bytes]]:
    url = str(tmp_path_factory.mktemp("pool") / "big.tfrecord")
    rng = np.random.default_rng(11)
    values = [rng.bytes(VALUE_BYTES + 13 * k) for k in range(24)]
    with sf.TFRecordWriter(url) as w:
        for k, v in enumerate(values):
            w.write(sf.encode_example({"img": [v], "n": [k]}))
    return url, values


def _one_pass(url: str, reads=None) -> list[bytes]:
    """A whole pass, its batches dropped as they come (as a training loop does); the values'
    first bytes, to check what was read."""
    ds = sf.read_tfrecord(url, spec=SPEC, num_parallel_reads=reads).batch(4, bytes_as="buffer")
    heads = []
    for batch in ds:
        heads += [v[:8] for v in batch["img"].to_list()]
        del batch
    return heads


def _wait_for(cond, seconds: float = 30.0) -> bool:
    """Polls ``cond`` until it holds or ``seconds`` pass (a bound for a stalled machine, never
    a timing assertion)."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _keepers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardfeed-pool-idle"]


def test_the_next_pass_starts_with_the_blocks_the_last_pass_left(big_file):
    url, values = big_file
    bufpool.set_pool_idle_seconds(600)
    assert _one_pass(url) == [v[:8] for v in values]
    after_first = bufpool.pool_info()
    assert after_first.blocks >= 1 and after_first.bytes >= after_first.blocks * 4 * VALUE_BYTES
    assert _one_pass(url) == [v[:8] for v in values]
    after_second = bufpool.pool_info()
    assert after_second.allocated == after_first.allocated  # no fresh block: the pass reused the kept ones
    assert after_second.reused - after_first.reused == len(values) // 4


@pytest.mark.parametrize("reads", [None, 2])
def test_many_passes_hold_no_more_blocks_than_were_in_use_at_once(big_file, reads):
    """Thirty passes map no more blocks than one pass has in flight at once (parse threads'
    batches, the one delivered), and the pool stays under its hard caps."""
    url, values = big_file
    bufpool.set_pool_idle_seconds(600)
    start = bufpool.pool_info()
    for _ in range(30):
        assert _one_pass(url, reads) == [v[:8] for v in values]
        info = bufpool.pool_info()
        assert info.blocks <= 8 and info.bytes <= 512 << 20
    in_flight = 2 if reads is None else 2 * reads + 2  # pending parses + the batch in the caller's hands
    assert bufpool.pool_info().allocated - start.allocated <= in_flight
    assert bufpool.pool_info().blocks <= in_flight


def test_idle_blocks_go_back_to_the_system_and_the_idle_thread_ends(big_file):
    url, _ = big_file
    bufpool.set_pool_idle_seconds(600)
    _one_pass(url)
    assert bufpool.pool_info().blocks >= 1  # kept: far from idle long enough
    assert len(_keepers()) == 1
    bufpool.set_pool_idle_seconds(0.05)  # applies to the blocks already held
    assert _wait_for(lambda: bufpool.pool_info().blocks == 0)
    assert bufpool.pool_info().bytes == 0
    assert _wait_for(lambda: not _keepers())  # no thread once nothing is held or in use


def test_a_batch_kept_after_its_pass_is_given_back_once_dropped_and_idle(big_file):
    url, values = big_file
    bufpool.set_pool_idle_seconds(0.05)
    ds = sf.read_tfrecord(url, spec=SPEC, num_parallel_reads=None).batch(4, bytes_as="buffer")
    kept = [b["img"] for b in ds][-1]
    assert _wait_for(lambda: bufpool.pool_info().blocks == 0)
    assert kept.to_list() == values[-4:]  # in use: never freed under it
    assert len(_keepers()) == 1  # it waits for the block in use
    del kept
    assert _wait_for(lambda: bufpool.pool_info().blocks == 0 and not _keepers())


def test_release_pooled_memory_frees_the_held_blocks_now_and_leaves_arrays_in_use(big_file):
    url, values = big_file
    bufpool.set_pool_idle_seconds(math.inf)
    ds = sf.read_tfrecord(url, spec=SPEC, num_parallel_reads=None).batch(4, bytes_as="buffer")
    batches = iter(ds)
    held = next(batches)["img"]
    for _ in batches:
        pass
    assert bufpool.pool_info().blocks >= 1
    assert not _keepers()  # inf: kept until asked, no thread to wait for it
    sf.formats.native.release_pooled_memory()
    assert bufpool.pool_info()[:2] == (0, 0)
    assert held.to_list() == values[:4]


def test_idle_seconds_zero_gives_everything_back_when_a_pass_closes(big_file, monkeypatch):
    url, _ = big_file
    monkeypatch.setenv(bufpool.ENV_IDLE, "0")
    _one_pass(url)
    assert bufpool.pool_info()[:2] == (0, 0)
    assert not _keepers()


def test_the_idle_setting_refuses_what_is_not_seconds(monkeypatch):
    monkeypatch.setenv(bufpool.ENV_IDLE, "ten")
    with pytest.raises(ValueError, match="SHARDFEED_POOL_IDLE_SECONDS.*'ten'"):
        bufpool.pool_idle_seconds()
    monkeypatch.setenv(bufpool.ENV_IDLE, "-1")
    with pytest.raises(ValueError, match="SHARDFEED_POOL_IDLE_SECONDS"):
        bufpool.pool_idle_seconds()
    monkeypatch.setenv(bufpool.ENV_IDLE, "2.5")
    assert bufpool.pool_idle_seconds() == 2.5
    for bad in (-0.1, math.nan, "1", True):
        with pytest.raises(ValueError, match="set_pool_idle_seconds"):
            bufpool.set_pool_idle_seconds(bad)
    bufpool.set_pool_idle_seconds(3)
    assert bufpool.pool_idle_seconds() == 3.0  # the call wins over the variable


def test_a_bad_idle_variable_never_fails_a_pass_and_the_pool_is_still_looked_after(big_file, monkeypatch, caplog):
    url, values = big_file
    monkeypatch.setattr(bufpool, "_warned", False)
    monkeypatch.setenv(bufpool.ENV_IDLE, "soon")
    with caplog.at_level("WARNING", logger="shardfeed.formats.bufpool"):
        assert _one_pass(url) == [v[:8] for v in values]
    assert "SHARDFEED_POOL_IDLE_SECONDS (set to 'soon')" in caplog.text  # named, with the default used
    assert bufpool.pool_info().blocks >= 1 and len(_keepers()) == 1  # kept for the default idle time


def test_setting_the_idle_time_to_zero_frees_the_pool_and_ends_the_idle_thread(big_file):
    url, values = big_file
    bufpool.set_pool_idle_seconds(600)
    ds = sf.read_tfrecord(url, spec=SPEC, num_parallel_reads=None).batch(4, bytes_as="buffer")
    kept = [b["img"] for b in ds][0]  # a block in use: 0 must not leave a thread polling for it
    assert len(_keepers()) == 1
    bufpool.set_pool_idle_seconds(0)
    assert bufpool.pool_info()[:2] == (0, 0)
    assert _wait_for(lambda: not _keepers())
    assert kept.to_list() == values[:4]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_gives_back_the_blocks_it_inherited_and_reads_the_parents_arrays(big_file):
    """A forked child (a DataLoader worker) holds none of the parent's idle blocks, can still
    read a batch the parent held at the fork, and starts its own warm pool; the parent keeps
    its blocks."""
    url, values = big_file
    bufpool.set_pool_idle_seconds(600)
    ds = sf.read_tfrecord(url, spec=SPEC, num_parallel_reads=None).batch(4, bytes_as="buffer")
    batches = iter(ds)
    held = next(batches)["img"]
    for _ in batches:
        pass
    parent = bufpool.pool_info()
    assert parent.blocks >= 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        code = 1
        signal.alarm(120)  # a child stuck on a lock the fork copied held dies instead of hanging the suite
        try:
            inherited = bufpool.pool_info()[:2]
            intact = held.to_list() == values[:4]
            heads = _one_pass(url)
            os.write(w, repr((inherited, intact, heads == [v[:8] for v in values],
                              bufpool.pool_info().blocks >= 1)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        report = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == repr(((0, 0), True, True, True))
    assert bufpool.pool_info().blocks >= parent.blocks  # the parent's stay
    assert held.to_list() == values[:4]


def test_the_pool_is_given_back_at_exit(big_file):
    url, _ = big_file
    # an exit handler registered before shardfeed's runs after it: it sees what is left
    code = textwrap.dedent(f"""
        import atexit
        def report():
            from shardfeed.formats import bufpool
            print("at exit", tuple(bufpool.pool_info()[:2]), flush=True)
        atexit.register(report)
        import math
        import shardfeed as sf
        from shardfeed.formats import bufpool
        bufpool.set_pool_idle_seconds(math.inf)
        ds = sf.read_tfrecord({url!r}, spec={{"img": sf.FixedLen("bytes")}}).batch(4, bytes_as="buffer")
        for b in ds:
            pass
        del b
        print("after the pass", bufpool.pool_info().blocks >= 1, flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["after the pass True", "at exit (0, 0)"]


def test_a_local_conversion_leaves_its_framed_chunks_blocks_to_the_idle_rule(tmp_path):
    """The local runner frames chunks of records into pooled blocks; when it ends, they are
    looked after as a closed pass's are (given back at once here, with the idle time 0)."""
    import shardfeed as sf

    src = tmp_path / "in.csv"
    src.write_text("label,text\n" + "".join(f"{i % 3},{'x' * 10000}{i}\n" for i in range(2000)))
    bufpool.set_pool_idle_seconds(600)
    start = bufpool.pool_info()
    sf.convert(str(src), str(tmp_path / "out"), schema={"label": "integer label", "text": "string"},
               num_samples_per_tfrecord=1000, progress=False)
    held = bufpool.pool_info()
    assert held.allocated > start.allocated and held.blocks >= 1  # the chunks (> 1 MiB each) were pooled, and kept
    bufpool.set_pool_idle_seconds(0)
    sf.convert(str(src), str(tmp_path / "out2"), schema={"label": "integer label", "text": "string"},
               num_samples_per_tfrecord=1000, progress=False)
    assert bufpool.pool_info().blocks == 0

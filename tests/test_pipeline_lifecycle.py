"""Threads: owned by the iterator, stopped on close, GC, errors, Ctrl-C and the end of a pass;
worker exceptions reach the consumer with their traceback; buffers stay bounded."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import traceback

import pytest

from shardfeed.pipeline import from_iterable, from_list, read_tfrecord

from .test_pipeline_helpers import started_since, wait_threads_back_to, write_shards


def threaded(n=1000):
    """A pipeline with every kind of thread: parallel interleave, parallel map, prefetch."""
    return (from_list(list(range(4)))
            .interleave(lambda k: from_list(list(range(k * n, (k + 1) * n))), cycle_length=2, num_parallel_calls=2)
            .map(lambda x: x + 1, num_parallel_calls=2)
            .batch(10)
            .prefetch(2))


def test_close_stops_and_joins_every_thread_and_is_idempotent():
    before = set(threading.enumerate())
    it = iter(threaded())
    next(it)
    assert started_since(before)
    it.close()
    it.close()
    assert not started_since(before)
    with pytest.raises(StopIteration):
        next(it)


def test_dropping_an_iterator_stops_its_threads():
    before = set(threading.enumerate())
    it = iter(threaded())
    next(it)
    del it
    gc.collect()
    assert not wait_threads_back_to(before)


def test_end_of_pass_stops_threads():
    before = set(threading.enumerate())
    assert sum(len(b) for b in threaded(50)) == 200
    assert not started_since(before)


def test_creating_an_iterator_without_taking_anything_starts_no_thread():
    before = set(threading.enumerate())
    its = [iter(threaded()) for _ in range(20)]
    assert not started_since(before)
    for it in its:
        it.close()


def test_with_block_closes():
    before = set(threading.enumerate())
    with iter(threaded()) as it:
        next(it)
    assert not started_since(before)


def boom(x):
    if x == 57:
        raise ValueError("bad element 57")
    return x


@pytest.mark.parametrize("where", ["map", "interleave", "prefetch"])
def test_worker_exception_reaches_consumer_with_original_traceback(where):
    before = set(threading.enumerate())
    base = from_list(list(range(100)))
    if where == "map":
        ds = base.map(boom, num_parallel_calls=2).prefetch(3)
    elif where == "interleave":
        ds = from_list([0]).interleave(lambda _: base.map(boom), cycle_length=1, num_parallel_calls=1)
    else:
        ds = base.map(boom).prefetch(3)
    with pytest.raises(ValueError, match="bad element 57") as info:
        list(ds)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "boom" in frames  # the frame that raised, from the worker thread
    assert not started_since(before)


def test_source_error_in_a_prefetch_thread_keeps_its_context(tmp_path):
    files = write_shards(tmp_path, n_files=1, per_file=3)
    with open(files[0], "r+b") as f:
        f.seek(30)
        f.write(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="part-000.tfrecord at byte offset"):
        list(read_tfrecord(files).prefetch(2))


def test_keyboard_interrupt_in_a_worker_stops_the_pass():
    before = set(threading.enumerate())

    def interrupt(x):
        if x == 20:
            raise KeyboardInterrupt
        return x

    it = iter(from_list(list(range(100))).map(interrupt, num_parallel_calls=2).prefetch(4))
    with pytest.raises(KeyboardInterrupt):
        list(it)
    assert not started_since(before)


def test_ctrl_c_in_the_main_thread_exits_cleanly():
    code = (
        "import os, signal, threading, time\n"
        "from shardfeed.pipeline import from_iterable\n"
        "def slow():\n"
        "    while True:\n"
        "        time.sleep(0.01); yield 1\n"
        "it = iter(from_iterable(slow).map(lambda x: x, num_parallel_calls=2).prefetch(2))\n"
        "next(it)\n"
        "timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))\n"
        "timer.start()\n"
        "try:\n"
        "    for _ in it: pass\n"
        "except KeyboardInterrupt:\n"
        "    timer.join()  # its thread ends; the pipeline joined its own before the interrupt came out\n"
        "    print('threads', threading.active_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "threads 1"


@pytest.mark.slow
def test_interpreter_exit_with_a_live_iterator_does_not_hang():
    code = (
        "from shardfeed.pipeline import from_iterable\n"
        "import itertools\n"
        "it = iter(from_iterable(lambda: itertools.count()).map(lambda x: x, num_parallel_calls=2).prefetch(8))\n"
        "next(it)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_prefetch_buffer_is_bounded():
    produced = []

    def source():
        for i in range(10_000):
            produced.append(i)
            yield i

    it = iter(from_iterable(source).prefetch(16))
    next(it)
    time.sleep(0.3)  # give the producer time to run ahead as far as it may
    assert len(produced) <= 16  # read ahead, including the element taken
    it.close()


def test_parallel_map_reads_ahead_a_bounded_amount():
    produced = []

    def source():
        for i in range(100_000):
            produced.append(i)
            yield i

    it = iter(from_iterable(source).map(lambda x: x, num_parallel_calls=2))
    next(it)
    time.sleep(0.3)  # give the workers time to read ahead as far as they may
    assert len(produced) <= 2 * 2 * 1024 + 1  # 2 chunks per worker, each at most 1024 elements
    it.close()


def test_close_from_another_thread_is_an_error_for_the_consumer_never_a_quiet_end(tmp_path):
    import shardfeed as sf

    from .test_pipeline_helpers import SPEC

    files = write_shards(tmp_path, n_files=2, per_file=3000)
    for make in (lambda: sf.read_tfrecord(files, spec=SPEC).batch(16),
                 lambda: sf.read_tfrecord(files, spec=SPEC).shuffle(50, seed=1).batch(16).prefetch(2),
                 lambda: sf.read_tfrecord(files).take(-1).prefetch(4)):
        it = iter(make())
        next(it)
        closer = threading.Thread(target=it.close)
        closer.start()
        closer.join()
        with pytest.raises(sf.IteratorClosedError, match="closed while it was being read"):
            for _ in it:
                pass
    it = iter(sf.read_tfrecord(files, spec=SPEC).batch(16))
    next(it)
    it.close()  # closed by the consumer itself: the pass simply ends
    assert list(it) == []

"""The native parse pool (``formats.native.ParsePool``): batches parsed on C threads that
never take the GIL, results taken in order, exactly what ``parse_example_batch`` gives;
and the read path that uses it for object-form batches (``SourceBatchNode``)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import CorruptRecordError, DecodeError, ParseError
from shardfeed.formats import native as nv
from shardfeed.formats.tfrecord import frame
from shardfeed.pipeline import check_resume_everywhere

from .test_native import _same_values
from .test_pipeline_helpers import SPEC, example, write_sized_shards

pytestmark = pytest.mark.skipif(not nv.parse_pool_available(), reason="the native parse pool is not built")

CTR = {"label": sf.FixedLen("int64"), "dense": sf.FixedLen("float32", shape=[3]),
       "cat": sf.FixedLen("bytes", shape=[2]), "tags": sf.VarLen("bytes"), "ids": sf.VarLen("int64"),
       "sp": sf.Sparse("sp_idx", "sp_val", "float32", size=[8])}


def ctr_example(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return sf.encode_example({
        "label": [i % 2], "dense": rng.normal(size=3).astype(np.float32),
        "cat": [f"c{i:07d}".encode(), b"x" * (i % 20)],  # lengths 0..19: the shared 0/1-byte objects too
        "tags": [bytes([65 + k]) * k for k in range(i % 4)], "ids": list(range(i % 5)),
        "sp_idx": [i % 8], "sp_val": [float(i)]})


def framed(records: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """``records`` framed end to end: (buffer, offsets, lengths, stored data CRCs)."""
    buf = b"".join(frame(r) for r in records)
    lens = np.array([len(r) for r in records], np.int64)
    offs = np.cumsum(np.concatenate([[0], lens[:-1] + 16])).astype(np.int64) + 12
    crcs = np.array([int.from_bytes(buf[o + n:o + n + 4], "little") for o, n in zip(offs, lens)], np.uint32)
    return buf, offs, lens, crcs


def _same_batch(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        _same_values(a[k], b[k])


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("form", ["list", "triple", "triple+crcs", "buffer"])
def test_the_pool_gives_parse_example_batchs_columns_in_order(threads, form):
    sizes = [1, 37, 512, 0, 200, 3, 64, 129]
    records = [ctr_example(i) for i in range(sum(sizes))]
    batches, k = [], 0
    for n in sizes:
        batches.append(records[k:k + n])
        k += n
    pool = nv.ParsePool(threads)
    want = []
    for b in batches:
        bytes_as = "buffer" if form == "buffer" else "object"
        if form == "list":
            args: tuple = (b,)
            kw: dict = {}
        else:
            buf, offs, lens, crcs = framed(b) if b else (b"", np.zeros(0, np.int64), np.zeros(0, np.int64),
                                                          np.zeros(0, np.uint32))
            args = ((buf, offs, lens),)
            kw = {"crcs": crcs} if form in ("triple+crcs", "buffer") else {}
        pool.submit(*args, CTR, bytes_as=bytes_as, **kw)
        want.append(nv.parse_example_batch(*args, CTR, bytes_as=bytes_as, **kw))
    assert pool.pending == len(batches)
    for w in want:
        got = pool.take()
        if form == "buffer":
            assert list(got) == list(w)
            for key in w:
                assert repr(got[key]) == repr(w[key])
        else:
            _same_batch(w, got)
    assert pool.pending == 0
    pool.close()


def test_a_bad_batch_raises_its_error_in_turn_and_the_batches_after_it_still_parse():
    good = [ctr_example(i) for i in range(40)]
    pool = nv.ParsePool(2)
    pool.submit(good, CTR)
    pool.submit(good[:5] + [b"\xff\xff not an example"] + good[5:9], CTR)  # record 5 does not decode
    pool.submit(good[:3] + [sf.encode_example({"label": [1, 2]})], CTR)  # record 3 does not fit the spec
    buf, offs, lens, crcs = framed(good[:10])
    crcs[7] ^= 1  # record 7's stored data CRC is wrong
    pool.submit((buf, offs, lens), CTR, crcs=crcs)
    pool.submit(good[:7], CTR)
    _same_batch(nv.parse_example_batch(good, CTR), pool.take())
    with pytest.raises(DecodeError) as dec:
        pool.take()
    assert dec.value.record_index == 5
    with pytest.raises(ParseError) as par:
        pool.take()
    assert par.value.record_index == 3 and par.value.feature == "label"
    with pytest.raises(CorruptRecordError) as cor:
        pool.take()
    assert cor.value.record_index == 7 and cor.value.offset == int(offs[7]) - 12
    _same_batch(nv.parse_example_batch(good[:7], CTR), pool.take())
    pool.close()


def test_bad_arguments_raise_at_submit_and_leave_the_queue_as_it_was():
    pool = nv.ParsePool(1)
    pool.submit([ctr_example(0)], CTR)
    with pytest.raises(ValueError, match="outside the buffer"):
        pool.submit((b"abc", np.array([0], np.int64), np.array([9], np.int64)), CTR)
    with pytest.raises(ValueError, match="bytes_as"):
        pool.submit([ctr_example(0)], CTR, bytes_as="str")
    assert pool.pending == 1
    assert pool.take()["label"].tolist() == [0]
    with pytest.raises(IndexError, match="no batch"):
        pool.take()
    with pytest.raises(ValueError, match="threads"):
        nv.ParsePool(0)
    pool.close()


def test_the_pool_keeps_the_records_buffers_alive_until_taken():
    pool = nv.ParsePool(2)
    for n in (300, 301):
        buf, offs, lens, crcs = framed([ctr_example(i) for i in range(n)])
        pool.submit((bytearray(buf), offs, lens), CTR, crcs=crcs)  # the only reference is the pool's
        del buf
    for n in (300, 301):
        _same_batch(nv.parse_example_batch([ctr_example(i) for i in range(n)], CTR), pool.take())
    pool.close()


def test_close_drops_what_was_not_taken_and_a_closed_pool_refuses_work():
    pool = nv.ParsePool(2)
    for _ in range(6):
        pool.submit([ctr_example(i) for i in range(500)], CTR)
    pool.take()
    pool.close()
    pool.close()  # idempotent
    assert pool.pending == 0
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit([ctr_example(0)], CTR)
    with pytest.raises((RuntimeError, IndexError)):
        pool.take()


def test_closing_from_another_thread_while_a_take_waits_gives_that_batch_whole():
    records = [ctr_example(i % 3000) for i in range(30000)]  # parsed in tens of milliseconds
    want = nv.parse_example_batch(records, CTR)
    for _ in range(10):
        pool = nv.ParsePool(1)
        for _ in range(3):
            pool.submit(records, CTR)
        got: list = []
        inside = threading.Event()

        def take(p=pool, inside=inside, got=got) -> None:
            inside.set()
            got.append(p.take())

        t = threading.Thread(target=take)
        t.start()
        inside.wait()
        time.sleep(0.002)  # the take is waiting for the pool thread, or parsing a batch itself
        pool.close()
        t.join(30)
        assert not t.is_alive()
        _same_batch(want, got[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_is_told_to_make_its_own_pool():
    pool = nv.ParsePool(1)
    pool.submit([ctr_example(0)], CTR)
    pid = os.fork()
    if pid == 0:  # the child: the pool's threads stayed in the parent
        code = 3
        try:
            pool.submit([ctr_example(1)], CTR)
        except RuntimeError as exc:
            code = 0 if "forked child" in str(exc) else 4
        except BaseException:  # noqa: BLE001 - any other outcome is a failure, reported by exit code
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert pool.take()["label"].tolist() == [0]
    pool.close()


# ----------------------------------------------------------------------------- the read path

@pytest.fixture
def shards(tmp_path):
    return write_sized_shards(tmp_path, [300, 1, 750, 0, 129])


def _pool_counter(monkeypatch) -> list:
    made: list = []
    real = nv.ParsePool

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, threads: int) -> None:
            made.append(threads)
            super().__init__(threads)

    monkeypatch.setattr("shardfeed.pipeline.source_batch.ParsePool", Counting)
    return made


def test_the_read_path_parses_object_batches_on_the_pool_with_one_thread_fewer_than_asked(shards, monkeypatch):
    made = _pool_counter(monkeypatch)
    one = list(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=None).batch(64))
    assert made == []
    three = list(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=3).batch(64))
    assert made == [2]  # this thread parses too
    assert len(one) == len(three)
    for a, b in zip(one, three):
        _same_batch(a, b)
    monkeypatch.setenv("SHARDFEED_PARSE_POOL", "0")  # Python threads instead: the same batches
    py = list(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=3).batch(64))
    assert made == [2]
    for a, b in zip(one, py):
        _same_batch(a, b)
    list(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=3).batch(64, bytes_as="buffer"))
    assert made == [2]  # buffer-form batches copy their values in the CRC pass: Python threads


def test_the_pooled_read_path_resumes_at_every_step(shards):
    ds = sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=2).batch(50)
    assert check_resume_everywhere(ds) > 20


def test_the_pooled_read_path_names_the_file_and_offset_of_a_bad_record(tmp_path, shards):
    bad = str(tmp_path / "bad.tfrecord")
    sf.write_records(bad, [example(i) for i in range(70)] + [b"\xff\xff not an example"])
    with pytest.raises(sf.DecodeError) as info:
        list(sf.read_tfrecord([shards[0], bad], spec=SPEC, num_parallel_reads=2).batch(16))
    assert any("bad.tfrecord" in n and "byte offset" in n for n in getattr(info.value, "__notes__", []))
    data = bytearray(open(shards[2], "rb").read())
    data[5000] ^= 0x40  # inside a record: its data CRC fails
    open(shards[2], "wb").write(bytes(data))
    with pytest.raises(sf.CorruptRecordError) as crc:
        list(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=2).batch(16))
    assert "s2" in str(crc.value) or "s00002" in str(crc.value) or shards[2].split("/")[-1] in str(crc.value)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc")
def test_breaking_off_a_pooled_pass_stops_its_threads(shards):
    def threads() -> int:  # every thread of the process, C threads included
        return len(os.listdir("/proc/self/task"))

    list(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=2).batch(8))  # warm: lazily made helpers
    before = threads()
    for _ in range(5):
        it = iter(sf.read_tfrecord(shards, spec=SPEC, num_parallel_reads=3).batch(8))
        next(it)
        assert threads() > before  # the pool's threads run
        it.close()
    assert threads() <= before


# ----------------------------------------------------------------------------- large values

BIG = {"img": sf.FixedLen("bytes"), "pair": sf.FixedLen("bytes", shape=[2]), "parts": sf.VarLen("bytes"),
       "dflt": sf.FixedLen("bytes", default=b"d" * 700)}


def big_example(i: int) -> bytes:
    n = [0, 1, 2, 478, 479, 511, 512, 513, 4096, 114_680][i % 10]
    feats = {"img": [bytes([i % 251]) * n], "pair": [b"p" * (n // 2), b"q" * 600],
             "parts": [b"r" * (k * 300) for k in range(i % 4)]}
    if i % 3:
        feats["dflt"] = [b"e" * (i % 7)]
    return sf.encode_example(feats)


def _reference_big(records: list[bytes]) -> dict:
    from shardfeed.formats import example as ex  # the pure-Python reference
    return ex.parse_example(records, BIG)


@pytest.mark.parametrize("how", ["parse_example_batch", "pool"])
def test_large_values_made_off_the_gil_are_plain_bytes_equal_to_the_reference(how):
    records = [big_example(i) for i in range(40)]
    if how == "pool":
        pool = nv.ParsePool(2)
        pool.submit(records, BIG)
        got = pool.take()
        pool.close()
    else:
        got = nv.parse_example_batch(records, BIG)
    _same_batch(_reference_big(records), got)
    import sys

    for col in (got["img"], got["pair"], got["dflt"], got["parts"].values):
        for v in np.ravel(col):
            assert type(v) is bytes and hash(v) == hash(bytes(bytearray(v)))
            if len(v) > 1:  # (0 and 1 bytes: CPython's shared objects)
                assert sys.getrefcount(v) == 3  # the array, the loop variable, getrefcount's argument
    del got  # every object freed by PyObject_Free, whoever made it: no crash, no leak below


def test_large_values_do_not_leak():
    import tracemalloc

    records = [big_example(9)] * 64  # 114,680-byte images
    nv.parse_example_batch(records, BIG)  # warm
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(200):  # 1.5 GB made and freed
        nv.parse_example_batch(records, BIG)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, grown_mb
    tracemalloc.start()  # hooked allocators: the large objects are made with the GIL again, traced
    try:
        snap0 = tracemalloc.get_traced_memory()[0]
        kept = nv.parse_example_batch(records, BIG)
        assert tracemalloc.get_traced_memory()[0] - snap0 > 64 * 114_680
    finally:
        tracemalloc.stop()
    _same_batch(_reference_big(records), kept)


@pytest.mark.parametrize("env", [{"PYTHONMALLOC": "debug"}, {"PYTHONDEVMODE": "1"},
                                 {"SHARDFEED_LARGE_OBJECTS_OFF_GIL": "0"}, {"PYTHONMALLOC": "malloc"}, {}])
def test_large_objects_are_made_off_the_gil_only_under_the_default_allocators(env):
    import subprocess
    import sys

    code = ("import numpy as np, shardfeed as sf\n"
            "from shardfeed.formats import native as nv\n"
            "from tests.test_parse_pool import BIG, big_example, _reference_big, _same_batch\n"
            "recs = [big_example(i) for i in range(30)]\n"
            "for _ in range(3):\n"
            "    _same_batch(_reference_big(recs), nv.parse_example_batch(recs, BIG))\n"
            "print('on' if nv._large_objects_off_gil_allowed() else 'off')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    on = env.get("PYTHONMALLOC", "malloc") == "malloc" and not env.get("PYTHONDEVMODE") \
        and env.get("SHARDFEED_LARGE_OBJECTS_OFF_GIL") != "0"
    assert out.stdout.strip() == ("on" if on else "off")


def test_buffer_values_copied_out_on_the_pool_match_and_long_defaults_take_the_other_way():
    # values copied by the parsing thread into one block, and (long defaults: more bytes
    # than the records hold) a batch copied out by the taking thread, as parse_batch does
    spec = {"img": sf.FixedLen("bytes"), "dflt": sf.FixedLen("bytes", default=b"d" * 5000),
            "parts": sf.VarLen("bytes")}
    fits = [sf.encode_example({"img": [bytes([i]) * (i * 37)], "dflt": [b"x" * i], "parts": [b"p"] * (i % 3)})
            for i in range(50)]
    spills = [sf.encode_example({"img": [b"i"]}) for _ in range(20)]  # the 5,000-byte default each
    pool = nv.ParsePool(2)
    for records in (fits, spills, fits):
        buf, offs, lens, crcs = framed(records)
        pool.submit((buf, offs, lens), spec, bytes_as="buffer", crcs=crcs)
    for records in (fits, spills, fits):
        buf, offs, lens, crcs = framed(records)
        want = nv.parse_example_batch((buf, offs, lens), spec, bytes_as="buffer", crcs=crcs)
        got = pool.take()
        for key in want:
            assert repr(got[key]) == repr(want[key]), key
        assert got["img"].to_list() == [bytes([i]) * (i * 37) for i in range(len(records))] or records is spills
        got["img"].data[:] = 0  # writable, and the other columns' values are not touched
        assert got["dflt"].to_list() == want["dflt"].to_list()
    pool.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the threads' signal masks in /proc")
def test_the_pools_threads_take_no_signal():
    before = set(os.listdir("/proc/self/task"))
    pool = nv.ParsePool(2)
    pool.submit([ctr_example(0)], CTR)
    pool.take()
    new = set(os.listdir("/proc/self/task")) - before
    assert len(new) == 2

    def blocked(tid) -> int:
        status = open(f"/proc/self/task/{tid}/status").read()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)

    for tid in new:
        deadline = time.monotonic() + 5  # a thread starts with every signal blocked, then takes its mask
        while blocked(tid) & (1 << (11 - 1)) and time.monotonic() < deadline:
            time.sleep(0.01)
        mask = blocked(tid)
        assert mask & (1 << (2 - 1)) and mask & (1 << (15 - 1))  # SIGINT and SIGTERM blocked
        assert not mask & (1 << (11 - 1)) and not mask & (1 << (7 - 1))  # SIGSEGV, SIGBUS: faults stay
    mine = open(f"/proc/self/task/{threading.get_native_id()}/status").read()
    assert int(next(line.split()[1] for line in mine.splitlines() if line.startswith("SigBlk:")), 16) & 2 == 0
    pool.close()


# ----------------------------------------------------------------------------- misuse and races


def test_tracing_memory_started_and_stopped_during_parses_is_safe():
    import tracemalloc

    records = [big_example(i) for i in range(20)] * 4  # large values: made by the parsing thread
    buf, offs, lens, crcs = framed(records)
    want = nv.parse_example_batch(records, BIG)
    stop = threading.Event()

    def toggle() -> None:
        while not stop.is_set():
            tracemalloc.start()
            tracemalloc.stop()

    t = threading.Thread(target=toggle)
    t.start()
    try:
        pool = nv.ParsePool(2)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            _same_batch(want, nv.parse_example_batch(records, BIG))
            pool.submit(records, BIG)
            pool.submit((buf, offs, lens), BIG, bytes_as="buffer", crcs=crcs)
            _same_batch(want, pool.take())
            pool.take()
        pool.close()
    finally:
        stop.set()
        t.join()
        tracemalloc.stop()


def test_a_compiled_spec_is_never_replaced_under_a_queued_batch():
    cs = nv.compile_spec(CTR)
    pool = nv.ParsePool(1)
    pool.submit([ctr_example(i) for i in range(300)], cs)
    with pytest.raises(RuntimeError, match="already initialised"):
        cs._native.__init__(nv.compile_spec({"x": sf.FixedLen("int64")})._native.columns)
    assert pool.take()["label"].shape == (300,)
    pool.close()


def test_a_second_thread_taking_at_once_is_refused_not_crashed():
    records = [ctr_example(i % 3000) for i in range(30000)]
    for _ in range(5):
        pool = nv.ParsePool(1)
        for _ in range(3):
            pool.submit(records, CTR)
        outcomes: list = []

        def take(p=pool, out=outcomes) -> None:
            try:
                out.append(len(p.take()["label"]))
            except RuntimeError as exc:
                out.append(str(exc))

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(o == 30000 or "another thread" in str(o) for o in outcomes), outcomes
        assert 30000 in outcomes
        pool.close()


def test_a_pool_closed_while_a_batch_is_prepared_refuses_it_and_holds_nothing():
    from shardfeed import _native

    pool = _native.ParsePool(1)  # the native pool itself: offsets any object numpy can read
    data = bytearray(b"".join(frame(ctr_example(i)) for i in range(3)))
    _, offs, lens, _ = framed([ctr_example(i) for i in range(3)])
    closed = []

    class ClosesThePool:  # numpy asks it for its array while the batch is prepared
        def __array__(self, dtype=None, copy=None):
            pool.close()
            closed.append(True)
            return offs

    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(nv.compile_spec(CTR)._native, data, ClosesThePool(), lens, False)
    assert closed and pool.pending == 0
    data.extend(b"x")  # no buffer export of it is left behind


def test_buffer_batches_without_bytes_columns_take_no_block_and_small_values_keep_no_batch():
    from shardfeed._native import pool_info

    numeric = {"label": sf.FixedLen("int64"), "ids": sf.VarLen("int64")}
    records = [ctr_example(i) for i in range(4000)] * 3  # about 1.6 MB a batch
    buf, offs, lens, crcs = framed(records)
    pool = nv.ParsePool(1)
    made = pool_info()[3]
    for _ in range(3):
        pool.submit((buf, offs, lens), numeric, bytes_as="buffer", crcs=crcs)
    for _ in range(3):
        assert len(pool.take()["label"]) == len(records)
    assert pool_info()[3] == made  # no block for values there are none of
    pool.submit((buf, offs, lens), CTR, bytes_as="buffer", crcs=crcs)
    got = pool.take()
    kept = got["cat"].data  # a few bytes a record: its own array, not a view of the batch's block
    assert (kept.base is None or kept.base.nbytes <= 2 * kept.nbytes) and kept.nbytes < len(buf) // 4
    pool.close()


def test_records_of_large_values_are_checked_then_made_one_by_one(tmp_path):
    # each record's CRC is checked just before its large values' objects are made: a bad
    # one raises, naming it, and the objects made for the records before it are dropped
    records = [big_example(i) for i in range(30)]
    buf, offs, lens, crcs = framed(records)
    ref = _reference_big(records)
    _same_batch(ref, nv.parse_example_batch((buf, offs, lens), BIG, crcs=crcs))
    bad = crcs.copy()
    bad[19] ^= 1  # record 19: a 114,680-byte value
    for how in ("call", "pool"):
        with pytest.raises(CorruptRecordError) as err:
            if how == "call":
                nv.parse_example_batch((buf, offs, lens), BIG, crcs=bad)
            else:
                pool = nv.ParsePool(2)
                try:
                    pool.submit((buf, offs, lens), BIG, crcs=bad)
                    pool.take()
                finally:
                    pool.close()
        assert err.value.record_index == 19 and err.value.offset == int(offs[19]) - 12


def _heap_kept(env: dict) -> int:
    """glibc's free heap top kept (mallinfo2's keepcost, bytes) after three batches of 64
    large values are parsed and freed, in a fresh process under ``env``."""
    import subprocess
    import sys

    code = (
        "import ctypes\n"
        "from tests.test_parse_pool import big_example, BIG\n"
        "from shardfeed.formats import native as nv\n"
        "records = [big_example(9)] * 64\n"
        "for _ in range(3):\n"
        "    nv.parse_example_batch(records, BIG)\n"
        "class MI(ctypes.Structure):\n"
        "    _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks hblkhd usmblks fsmblks "
        "uordblks fordblks keepcost'.split()]\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.mallinfo2.restype = MI\n"
        "print(libc.mallinfo2().keepcost)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "SHARDFEED_MALLOC_TUNING")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=root, capture_output=True,
                         text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="glibc's mallinfo2 only")
def test_the_heap_keeps_a_batch_of_large_values_unless_the_user_tuned_malloc():
    # glibc hands a free heap top over 128 KiB back at every free by default: each batch of
    # large values faulted its pages in afresh; the first batch that makes large objects
    # raises the thresholds, unless the user set glibc's (or turned it off)
    tuned = _heap_kept({})
    off = _heap_kept({"SHARDFEED_MALLOC_TUNING": "0"})
    users = _heap_kept({"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert tuned >= 4 << 20 and off < tuned - (4 << 20) and users < tuned - (4 << 20), (tuned, off, users)

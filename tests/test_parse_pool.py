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

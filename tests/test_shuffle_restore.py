"""A shuffle over a source's records (the source itself, or ``map`` stages on it) restores by
reading back only its buffered records: exactly one buffer, wherever the pass was."""

from __future__ import annotations

import json

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.errors import CorruptRecordError
from shardfeed.pipeline import check_resume_everywhere
from shardfeed.pipeline.frames import unpack_ints
from shardfeed.pipeline.state import elements_equal

from .test_pipeline_helpers import SPEC, example, example_files


def ident(x):
    return x


def first_id(x):
    return int(x["id"])


class CountedFirstId:
    """``first_id``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return first_id(x)


def not_sevens(x):
    return int(x["id"]) % 7 != 0


CHAINS = {
    "source": lambda src, n: src.shuffle(n, seed=4),
    "map": lambda src, n: src.map(first_id).shuffle(n, seed=4),
    "two_maps_parallel": lambda src, n: src.map(ident, num_parallel_calls=2).map(first_id).shuffle(n, seed=4),
    "batched_after": lambda src, n: src.map(first_id).shuffle(n, seed=4).batch(7),
    "filter": lambda src, n: src.filter(not_sevens).shuffle(n, seed=4),
    "parallel_map_filter_map": lambda src, n: src.map(ident, num_parallel_calls=2).filter(not_sevens)
                                                 .map(first_id).shuffle(n, seed=4),
}


def _plain(x):
    if isinstance(x, dict):
        return {k: np.asarray(v).tolist() for k, v in x.items()}
    return np.asarray(x).tolist() if hasattr(x, "dtype") else x


def _run(ds, stop, after):
    with iter(ds) as it:
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        return state, [_plain(next(it)) for _ in range(after)]


def _resume(ds, state, count):
    with ds.iter_from_state(state) as it:
        return [_plain(next(it)) for _ in range(count)]


@pytest.mark.parametrize("chain", sorted(CHAINS))
@pytest.mark.parametrize("order", [None, "blocks", "global"])
def test_a_restore_reads_back_exactly_one_buffer_early_and_late(tmp_path, chain, order):
    files = example_files(tmp_path, [6000, 2500, 4000])
    size = 700
    reread = {}
    for stop in ((5, 1500) if chain == "batched_after" else (40, 9000)):
        src = sf.read_tfrecord(files, spec=SPEC, shuffle=order, seed=1 if order else None)
        ds = CHAINS[chain](src, size)
        state, expected = _run(ds, stop, 30)
        assert "frames" in json.dumps(state)
        again = src.read_stats.reread
        assert _resume(ds, state, 30) == expected
        reread[stop] = src.read_stats.reread - again
    assert set(reread.values()) == {size}, reread  # one full buffer, at either position


def test_the_stages_between_map_exactly_the_buffered_records_again(tmp_path):
    files = example_files(tmp_path, [20_000])
    counted = CountedFirstId()
    ds = sf.read_tfrecord(files, spec=SPEC).map(counted).shuffle(500, seed=2)
    for stop in (600, 19_000):
        state, expected = _run(ds, stop, 40)
        assert len(json.dumps(state)) < 2048 + 3 * 500  # a cursor and a few bytes a buffered record
        counted.calls = 0
        assert _resume(ds, state, 40) == expected
        # the 500 buffered records mapped again, and no more than the 40 records read on from
        # the cursor (the source hands out one chunk at a time; the map takes one at a time)
        assert 500 <= counted.calls <= 500 + 40, (stop, counted.calls)


def test_resumes_at_every_step_over_a_map_and_across_files(tmp_path):
    files = example_files(tmp_path, [9, 0, 14, 5])
    ds = sf.read_tfrecord(files, spec=SPEC).map(first_id, num_parallel_calls=2).shuffle(6, seed=3)
    assert check_resume_everywhere(ds) == 29
    odd = sf.read_tfrecord(files, spec=SPEC).map(ident, num_parallel_calls=2).filter(lambda x: int(x["id"]) % 2)
    assert check_resume_everywhere(odd.map(first_id).shuffle(4, seed=3)) == 14


@pytest.mark.parametrize("filtered", [False, True])
def test_states_saved_after_restores_restore_again(tmp_path, filtered):
    files = example_files(tmp_path, [5000, 3000])
    src = sf.read_tfrecord(files, spec=SPEC)
    ds = src.map(ident, num_parallel_calls=2)
    ds = (ds.filter(not_sevens) if filtered else ds).map(first_id).shuffle(900, seed=8)
    with iter(ds) as it:  # one pass's order (each pass reshuffles): its start state
        start = it.get_state()
    with ds.iter_from_state(start) as it:
        ref = list(it)
    with ds.iter_from_state(start) as it:
        for _ in range(1200):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
    done = 1200
    for hop in (5, 1, 700, 2500):  # soon after a restore (the buffer still mostly read back), and later
        with ds.iter_from_state(state) as it:
            for _ in range(hop):
                next(it)
            state = json.loads(json.dumps(it.get_state()))
        done += hop
        assert "frames" in state["root"]
        again = src.read_stats.reread
        assert elements_equal(list(ds.iter_from_state(state)), ref[done:])
        assert src.read_stats.reread - again == 900


def test_without_offsets_it_restores_from_the_anchor(tmp_path):
    # a map that skips failures (its outputs are no longer the records one for one), a source
    # that skips corrupt records, a gzip file: no offsets in the state, the anchor's re-read
    plain = example_files(tmp_path, [4000])
    zipped = str(tmp_path / "z.tfrecord.gz")
    sf.write_records(zipped, [example(i) for i in range(4000)], compression="GZIP")
    cases = [
        (sf.read_tfrecord(plain, spec=SPEC), lambda s: s.map(first_id, on_error="skip")),
        (sf.read_tfrecord(plain, spec=SPEC, on_corrupt="skip"), lambda s: s.map(first_id)),
        (sf.read_tfrecord([zipped], spec=SPEC), lambda s: s.map(first_id)),
    ]
    for src, chain in cases:
        ds = chain(src).shuffle(300, seed=6)
        state, expected = _run(ds, 2000, 25)
        assert "frames" not in state["root"]
        again = src.read_stats.records
        assert _resume(ds, state, 25) == expected
        assert src.read_stats.records - again > 2 * 300  # from the anchor: several buffers back


def test_a_restore_over_a_file_changed_since_the_save_names_the_file_and_offset(tmp_path):
    files = example_files(tmp_path, [3000, 3000])
    ds = sf.read_tfrecord(files, spec=SPEC).map(first_id).shuffle(400, seed=2)
    state, _ = _run(ds, 1000, 0)
    frames = state["root"]["frames"]
    url = frames["urls"][int(unpack_ints(frames["url"])[0])]
    at = int(unpack_ints(frames["at"])[0])
    with open(url, "r+b") as f:  # the length of a buffered record's frame
        f.seek(at)
        f.write(b"\x7f")
    with pytest.raises(CorruptRecordError, match=str(at)):
        _resume(ds, state, 1)


def test_a_state_from_another_shuffle_fails_clearly(tmp_path):
    files = example_files(tmp_path, [3000])
    ds = sf.read_tfrecord(files, spec=SPEC).map(first_id).shuffle(400, seed=2)
    state, _ = _run(ds, 1000, 0)
    frames = state["root"]["frames"]
    bad = dict(state, root=dict(state["root"], frames=dict(frames, resume=[5, frames["resume"][1]])))
    with pytest.raises(ValueError, match="frames resume at upstream position 5"):
        _resume(ds, bad, 1)
    smaller = sf.read_tfrecord(files, spec=SPEC).map(first_id).shuffle(300, seed=2)
    with pytest.raises(ValueError, match="not a state this shuffle saved"):
        _resume(smaller, state, 1)


def test_the_unfused_and_fused_shuffles_resume_from_each_others_offsets(tmp_path):
    files = example_files(tmp_path, [4000, 3000])
    src = sf.read_tfrecord(files, spec=SPEC)
    fused = src.shuffle(500, seed=5).batch(10)
    unfused = src.shuffle(500, seed=5)
    with iter(unfused) as it:
        start = it.get_state()
    with unfused.iter_from_state(start) as it:
        ref = [int(x["id"]) for x in it]
    with unfused.iter_from_state(start) as it:
        for _ in range(2000):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
    assert "frames" in state["root"]
    again = src.read_stats.reread
    got = np.concatenate([b["id"] for b in fused.iter_from_state(state)]).tolist()
    assert got == ref[2000:] and src.read_stats.reread - again == 500
    with fused.iter_from_state(start) as it:
        for _ in range(150):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
    again = src.read_stats.reread
    assert [int(x["id"]) for x in unfused.iter_from_state(state)] == ref[1500:]
    assert src.read_stats.reread - again == 500


def test_a_gzip_file_named_like_a_plain_one_is_not_read_by_offset(tmp_path):
    # compression given explicitly: no offsets, whatever the file names say
    p = str(tmp_path / "plain-name.tfrecord")
    sf.write_records(p, [example(i) for i in range(2000)], compression="GZIP")
    src = sf.read_tfrecord([p], spec=SPEC, compression="GZIP")
    ds = src.map(first_id).shuffle(200, seed=1)
    state, expected = _run(ds, 900, 10)
    assert "frames" not in state["root"]
    assert _resume(ds, state, 10) == expected


def test_a_file_listed_twice_restores_both_copies_of_its_records(tmp_path):
    a, b = example_files(tmp_path, [10, 20])
    for ds in (sf.read_tfrecord([a, a, b], spec=SPEC).map(first_id).shuffle(16, seed=1),
               sf.read_tfrecord([a, a, b], spec=SPEC).shuffle(16, seed=1).batch(2)):  # fused
        assert check_resume_everywhere(ds) >= 21


def test_a_state_saved_right_after_an_anchor_restore_keeps_its_cursor_and_offsets(tmp_path):
    files = example_files(tmp_path, [30_000])
    counted = CountedFirstId()
    src = sf.read_tfrecord(files, spec=SPEC)
    ds = src.map(counted).shuffle(500, seed=2)
    state, expected = _run(ds, 20_000, 30)
    del state["root"]["frames"]  # as in_subprocess(), a gzip file or an older version gives it
    with ds.iter_from_state(state) as it:
        again = json.loads(json.dumps(it.get_state()))  # at once: the buffer refilled from the anchor
        assert [next(it) for _ in range(30)] == expected
    assert again["root"]["anchor"] is not None and "frames" in again["root"]
    counted.calls = 0
    assert _resume(ds, again, 30) == expected
    assert counted.calls <= 500 + 30  # one buffer mapped again, not the pass


def test_stages_that_may_drop_an_element_are_not_taken_for_one_record_each(tmp_path):
    files = example_files(tmp_path, [5])
    src = sf.read_tfrecord(files, spec=SPEC)
    assert src.map(first_id)._record_source() is src
    assert src.map(first_id, num_parallel_calls=2).map(ident)._record_source() is src
    assert src.map(first_id, on_error="skip")._record_source() is None
    assert src.filter(not_sevens)._record_source() is src
    assert src.map(ident, num_parallel_calls=2).filter(not_sevens).map(ident)._record_source() is src
    # a parallel map above a filter, or two filters: not followed
    assert src.filter(not_sevens).map(ident, num_parallel_calls=2)._record_source() is None
    assert src.filter(not_sevens).filter(not_sevens)._record_source() is None
    assert src.decode_images("id", 8, on_error="skip")._record_source() is None
    assert src.decode_images("id", 8)._record_source() is src
    assert sf.read_tfrecord(files, spec=SPEC, on_corrupt="skip")._record_source() is None
    assert sf.read_tfrecord(files, spec=SPEC, compression="GZIP")._record_source() is None
    queue_like = sf.from_list([1, 2])
    assert queue_like._record_source() is None


def inner_shuffled(path):
    return sf.read_tfrecord(path, spec=SPEC).map(first_id, num_parallel_calls=2).shuffle(5, seed=2)


def test_parallel_maps_inside_a_threaded_interleave_close_without_spinning(tmp_path):
    # closing the pass stopped the map's chunk loop from ever filling (it spun at 100% CPU)
    files = example_files(tmp_path, [9, 0, 14, 5, 1, 12])
    ds = sf.from_list(files).interleave(inner_shuffled, cycle_length=3, num_parallel_calls=2)
    for _ in range(3):
        assert check_resume_everywhere(ds) == 42


def test_packed_integer_fields_round_trip_in_the_narrowest_type():
    import base64
    import zlib

    from shardfeed.pipeline.frames import pack_ints

    rng = np.random.default_rng(3)
    cases = [np.zeros(0, np.int64), np.arange(5), np.array([7, 7, 7]), np.array([0, 2**40, -(2**40), 5]),
             np.sort(rng.integers(0, 90_000, 10_000)), rng.integers(-(2**62), 2**62, 300)]
    for values in cases:
        text = pack_ints(values)
        assert unpack_ints(text).tolist() == np.asarray(values).tolist()
    assert pack_ints(np.arange(100)).startswith("i1:") and pack_ints(np.array([0, 2**40])).startswith("i8:")
    # the plain base64 of int64 deltas an earlier version wrote still reads
    old = base64.b64encode(zlib.compress(np.diff([3, 9, 4], prepend=0).astype("<i8").tobytes())).decode()
    assert unpack_ints(old).tolist() == [3, 9, 4]
    with pytest.raises(ValueError, match="not a packed integer field"):
        unpack_ints("u9:AAAA")


@pytest.mark.parametrize("where", [8, 12 + 3])  # the length field, the data
@pytest.mark.parametrize("fused", [True, False])
def test_a_restore_under_skip_reads_past_a_frame_the_pass_skipped(tmp_path, where, fused):
    # the buffered records are read back in ranges, nearby ones together: a corrupt frame
    # between two of them, which the pass had skipped, failed the restore (found from outside)
    import struct

    files = example_files(tmp_path, [200])
    data = open(files[0], "rb").read()
    at = 0
    for _ in range(100):  # frame 100's start, walked here
        at += 16 + struct.unpack_from("<Q", data, at)[0]
    with open(files[0], "r+b") as f:
        f.seek(at + where)
        b = f.read(1)
        f.seek(at + where)
        f.write(bytes([b[0] ^ 1]))
    src = sf.read_tfrecord(files, spec=SPEC, on_corrupt="skip")
    ds = (src if fused else src.take(-1)).shuffle(50, seed=1).batch(8)
    it = iter(ds)
    for _ in range(12):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [i for b in it for i in b["id"].tolist()]
    assert [i for b in ds.iter_from_state(state) for i in b["id"].tolist()] == rest
    assert 100 not in rest and len(rest) == 199 - 12 * 8


def test_a_buffered_frame_damaged_after_the_save_is_named_without_a_record_number_it_cannot_know(tmp_path):
    files = example_files(tmp_path, [300])
    ds = sf.read_tfrecord(files, spec=SPEC).shuffle(60, seed=2).batch(4)
    it = iter(ds)
    for _ in range(10):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    frames = state["root"]["frames"]
    at = sorted(unpack_ints(frames["at"]).tolist())[5]  # a frame read in the middle of a range
    with open(files[0], "r+b") as f:
        f.seek(at + 8)
        f.write(b"\x00")
    with pytest.raises(CorruptRecordError, match=f"byte offset {at}: length crc") as err:
        list(ds.iter_from_state(state))
    assert err.value.record_index is None and "record #" not in str(err.value).split(";")[0]

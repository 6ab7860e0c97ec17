"""Resume: a restored iterator yields exactly what an uninterrupted pass would have yielded
next, for every stage, at every step (check_resume_everywhere)."""

from __future__ import annotations

import json

import pytest

import shardfeed as sf
from shardfeed.pipeline import check_resume_everywhere, from_iterable, from_list, read_csv, read_text

from .test_pipeline_helpers import SPEC, write_shards

NUMS = list(range(23))


def plus_one(x):
    return x + 1


STAGES = {
    "from_list": lambda: from_list(NUMS),
    "from_iterable": lambda: from_iterable(lambda: iter(NUMS)),
    "map": lambda: from_list(NUMS).map(plus_one),
    "parallel_map": lambda: from_list(NUMS).map(plus_one, num_parallel_calls=3),
    "filter": lambda: from_list(NUMS).filter(lambda x: x % 3),
    "shuffle_seeded": lambda: from_list(NUMS).shuffle(5, seed=11),
    "shuffle_unseeded": lambda: from_list(NUMS).shuffle(5),
    "batch": lambda: from_list(NUMS).batch(4),
    "unbatch": lambda: from_list(NUMS).batch(4).unbatch(),
    "repeat": lambda: from_list(NUMS[:5]).shuffle(3, seed=2).repeat(3),
    "take_skip": lambda: from_list(NUMS).skip(3).take(12),
    "shard": lambda: from_list(NUMS).shard(1, 3),
    "prefetch": lambda: from_list(NUMS).prefetch(4),
    "interleave": lambda: from_list([0, 1, 2, 3]).interleave(
        lambda k: from_list([k * 10 + j for j in range(k + 3)]), cycle_length=2, block_length=2),
    "parallel_interleave": lambda: from_list([0, 1, 2, 3]).interleave(
        lambda k: from_list([k * 10 + j for j in range(k + 3)]).shuffle(2, seed=k), cycle_length=3,
        num_parallel_calls=2),
    "everything": lambda: (from_list([0, 1, 2]).interleave(lambda k: from_list(list(range(k * 9, k * 9 + 9))),
                                                           cycle_length=2, num_parallel_calls=2)
                           .shuffle(4, seed=3).map(plus_one, num_parallel_calls=2).batch(2).prefetch(2)
                           .unbatch().repeat(2)),
}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_stage_resumes_exactly_at_every_step(name):
    assert check_resume_everywhere(STAGES[name]()) >= 2


def test_tfrecord_pipeline_resumes_by_file_offset_with_shuffle_interleave_and_parallel_map(tmp_path):
    files = write_shards(tmp_path, n_files=3, per_file=5)
    ds = (sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=2).shuffle(4, seed=5).batch(2)
          .map(lambda b: b["id"] * 2, num_parallel_calls=2).prefetch(2))
    assert check_resume_everywhere(ds) == 9
    it = iter(sf.read_tfrecord(files))
    next(it)
    root = it.get_state()["root"]  # a cursor: the provider's place, the span, a byte offset
    from shardfeed.pipeline.identity import spans_digest

    # the place is checked on restore against the files it indexes and the reader's share (issue 39 item 6)
    assert root == {"spans": {"i": 0, "files": spans_digest([[f, 0, None] for f in files]), "slice": []},
                    "key": [files[0], 0, None], "offset": len(next(iter(sf.read_tfrecord(files)))) + 16}


def test_gzip_tfrecord_resumes(tmp_path):
    files = write_shards(tmp_path, n_files=2, per_file=4, compression="GZIP")
    assert check_resume_everywhere(sf.read_tfrecord(files).batch(3)) == 4


def test_text_and_csv_resume(tmp_path):
    (tmp_path / "a.csv").write_text('h1,h2\n1,"x\ny"\n2,z\n')
    (tmp_path / "b.csv").write_text("h1,h2\n3,w\n")
    csv_files = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    assert check_resume_everywhere(read_csv(csv_files, [0, ""], header=True)) == 4
    assert check_resume_everywhere(read_text(csv_files)) == 7


def test_state_is_small_even_with_a_large_shuffle_buffer():
    it = iter(from_list(list(range(5000))).shuffle(4000, seed=1).prefetch(64))
    for _ in range(100):
        next(it)
    assert len(json.dumps(it.get_state())) < 300
    it.close()


def test_state_counts_delivered_not_read_ahead():
    it = iter(from_list(list(range(1000))).prefetch(100))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    state = it.get_state()
    it.close()
    assert next(from_list(list(range(1000))).prefetch(100).iter_from_state(state)) == 3


def test_nondeterministic_map_refuses_to_checkpoint():
    it = iter(from_list(NUMS).map(plus_one, num_parallel_calls=2, deterministic=False))
    next(it)
    with pytest.raises(ValueError, match="deterministic=True"):
        it.get_state()
    it.close()


def test_a_state_that_is_not_one_is_rejected():
    with pytest.raises(ValueError, match="get_state"):
        from_list(NUMS).iter_from_state({"nope": 1})


def test_check_resume_everywhere_detects_a_stage_that_resumes_wrongly():
    class Forgetful(sf.pipeline.SourceDataset):
        kind = "forgetful"

        def open(self, state, raw):
            return from_list(NUMS).open(None, raw)  # ignores the state: restarts from 0

    with pytest.raises(AssertionError, match="resumed at step"):
        check_resume_everywhere(Forgetful())


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("drop", [False, True])
def test_fused_tfrecord_batch_resumes_and_equals_parsing_each_batch(tmp_path, compression, drop):
    """read_tfrecord(spec).batch(n) reads whole batches of frames at once; batches span
    files, and resuming from any step gives what an uninterrupted pass gives."""
    files = write_shards(tmp_path, n_files=3, per_file=5, compression=compression)
    source = sf.read_tfrecord(files, spec=SPEC)
    ds = source.batch(4, drop_remainder=drop)
    assert check_resume_everywhere(ds) == (3 if drop else 4) + 1  # steps 0..batches
    records = list(sf.read_records(files))
    for i, batch in enumerate(ds):
        expected = sf.parse_example(records[i * 4:(i + 1) * 4], SPEC)
        assert batch.keys() == expected.keys()
        for key in expected:
            got, want = batch[key], expected[key]
            assert (got == want) if not hasattr(want, "dtype") else (got.tolist() == want.tolist())
    assert source.read_stats.records >= len(records)


def test_shuffle_restore_rereads_a_bounded_window_whatever_the_position():
    calls = [0]

    def counted(x):
        calls[0] += 1
        return x

    n, size = 120_000, 500
    ds = from_list(list(range(n))).map(counted).shuffle(size, seed=9)
    reread = {}
    for position in (2_000, 108_000):  # early, and at 90% of the pass
        it = iter(ds)
        head = [next(it) for _ in range(position)]
        state = json.loads(json.dumps(it.get_state()))
        assert len(json.dumps(state)) < 4096  # a cursor and a few numbers, no buffered data
        expected = [next(it) for _ in range(50)]
        it.close()
        calls[0] = 0
        with ds.iter_from_state(state) as resumed:
            assert [next(resumed) for _ in range(50)] == expected
            reread[position] = calls[0] - 50
        assert len(set(head)) == position
    # both restores re-read about size * ln(size) elements, not the position
    assert max(reread.values()) <= 17 * size, reread
    assert reread[108_000] <= 2 * reread[2_000] + 2 * size, reread


def test_shuffle_restore_matches_near_the_end_of_a_pass():
    # the draws after upstream ran out move the last slot: a restore there must agree too
    ds = from_list(list(range(40))).shuffle(16, seed=4)
    assert check_resume_everywhere(ds) == 41
    small = from_list(list(range(7))).shuffle(16, seed=4)  # fewer elements than the buffer
    assert check_resume_everywhere(small) == 8

"""``sf.mix``: seeded weighted draws from several datasets, what happens when one runs
out, exact resume, cardinality, statistics, and TFRecord inputs batched after the mix."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.pipeline import check_resume_everywhere, from_list

from .test_pipeline_helpers import SPEC, write_sized_shards


def tagged(k: int, n: int) -> sf.Dataset:
    """``n`` elements ``(k, 0) ... (k, n - 1)``: which input, and its position there."""
    return from_list([(k, i) for i in range(n)])


def sources(ds) -> list[int]:
    return [k for k, _ in ds]


# -- arguments -------------------------------------------------------------------------
@pytest.mark.parametrize("weights, error, match", [
    ([1.0], ValueError, "2 datasets but 1 weights"),
    ([1.0, 2.0, 3.0], ValueError, "2 datasets but 3 weights"),
    ([1.0, 0.0], ValueError, r"weights\[1\] must be positive"),
    ([-1.0, 1.0], ValueError, r"weights\[0\] must be positive"),
    ([float("nan"), 1.0], ValueError, "positive and finite"),
    ([1.0, float("inf")], ValueError, "positive and finite"),
    ([2**1100, 1], ValueError, r"weights\[0\] must be positive and finite"),  # was an OverflowError
    ([1.0, "2"], TypeError, r"weights\[1\] must be a number"),
    ([True, 1.0], TypeError, r"weights\[0\] must be a number"),
    ("ab", TypeError, "sequence of 2 positive numbers"),
    (3, TypeError, "sequence of 2 positive numbers"),
])
def test_weights_must_be_one_positive_finite_number_per_dataset(weights, error, match):
    with pytest.raises(error, match=match):
        sf.mix([tagged(0, 3), tagged(1, 3)], weights)


def test_weights_may_be_numpy_and_need_not_sum_to_one():
    a = sf.mix([tagged(0, 3), tagged(1, 3)], np.array([2, 6]), seed=1)
    b = sf.mix([tagged(0, 3), tagged(1, 3)], [0.25, 0.75], seed=1)
    assert list(a) == list(b)


@pytest.mark.parametrize("datasets, error, match", [
    (tagged(0, 3), TypeError, "a list of datasets"),
    ([], ValueError, "at least one dataset"),
    ([tagged(0, 3), [1, 2]], TypeError, r"datasets\[1\] must be a shardfeed Dataset"),
])
def test_datasets_must_be_a_non_empty_list_of_datasets(datasets, error, match):
    with pytest.raises(error, match=match):
        sf.mix(datasets)


def test_bad_seed_and_on_empty_are_refused():
    with pytest.raises(ValueError, match="seed must be"):
        sf.mix([tagged(0, 3)], seed=-1)
    with pytest.raises(ValueError, match="on_empty must be one of"):
        sf.mix([tagged(0, 3)], on_empty="repeat")
    with pytest.raises(ValueError, match="disagree"):
        sf.mix([tagged(0, 3)], on_empty="cycle", stop_on_empty_dataset=True)
    with pytest.raises(TypeError, match="True or False"):
        sf.mix([tagged(0, 3)], stop_on_empty_dataset="yes")


def test_tensorflow_spelling_maps_to_on_empty():
    assert sf.mix([tagged(0, 3)]).on_empty == "stop"  # the default TensorFlow recommends
    assert sf.mix([tagged(0, 3)], stop_on_empty_dataset=True).on_empty == "stop"
    assert sf.mix([tagged(0, 3)], stop_on_empty_dataset=False).on_empty == "drop"
    assert sf.mix([tagged(0, 3)], on_empty="drop", stop_on_empty_dataset=False).on_empty == "drop"


# -- the draws -------------------------------------------------------------------------
def test_shares_are_within_four_standard_deviations_of_the_weights():
    n, weights = 30_000, [0.5, 0.3, 0.2]
    ds = sf.mix([tagged(k, n) for k in range(3)], weights, seed=2024).take(n)
    got = sources(ds)
    assert len(got) == n
    counts = collections.Counter(got)
    for k, p in enumerate(weights):
        sd = math.sqrt(n * p * (1 - p))  # equal shares would be 33 sd off for input 0
        assert abs(counts[k] - n * p) < 4 * sd, (k, counts[k], n * p, sd)
    # independent draws: each ordered pair (j, k) follows p_j * p_k; a deterministic
    # pattern with the right shares (round robin, or runs) fails this
    pairs = collections.Counter(zip(got, got[1:]))
    for j, pj in enumerate(weights):
        for k, pk in enumerate(weights):
            p = pj * pk
            sd = math.sqrt((n - 1) * p * (1 - p))
            assert abs(pairs[(j, k)] - (n - 1) * p) < 5 * sd, ((j, k), pairs[(j, k)], (n - 1) * p)


@pytest.mark.parametrize("scale", [1e308, 5e-324, 1e-300, 1e200])
def test_weights_at_the_ends_of_the_float_range_keep_their_ratio(scale):
    """Found from outside: weights [1e308, 1e308] drew input 1 every time (their sum is inf),
    [5e-324, 5e-324] about 25/75 (subnormals lose their ratio); the documented share is
    weights[k] / sum(weights) whatever their scale."""
    n = 20_000
    got = collections.Counter(sources(sf.mix([tagged(0, n), tagged(1, n)], [scale, scale], seed=5).take(n)))
    sd = math.sqrt(n * 0.25)
    assert abs(got[0] - n / 2) < 4 * sd and abs(got[1] - n / 2) < 4 * sd, got
    same = sf.mix([tagged(0, n), tagged(1, n)], [1.0, 1.0], seed=5).take(n)
    assert sources(sf.mix([tagged(0, n), tagged(1, n)], [scale, scale], seed=5).take(n)) == sources(same)


def test_choices_depend_on_the_seed_and_draw_not_on_the_data():
    weights = [0.6, 0.4]
    a = sources(sf.mix([tagged(0, 500), tagged(1, 500)], weights, seed=7).take(300))
    # other data (other element types, through a map) with the same seed: the same choices
    b = [x[0] for x in sf.mix([from_list([(0, "x")] * 400).map(tuple), from_list([(1, b"y")] * 400)],
                              weights, seed=7).take(300)]
    c = sources(sf.mix([tagged(0, 500), tagged(1, 500)], weights, seed=8).take(300))
    assert a == b
    assert a != c


def test_each_pass_draws_anew_unless_told_not_to():
    ds = sf.mix([tagged(0, 200), tagged(1, 200)], seed=3).take(100)
    first, second = sources(ds), sources(ds)
    assert first != second
    again = sf.mix([tagged(0, 200), tagged(1, 200)], seed=3).take(100)
    assert sources(again) == first  # pass n has the same choices in every run
    fixed = sf.mix([tagged(0, 200), tagged(1, 200)], seed=3, rerandomize_each_iteration=False).take(100)
    assert sources(fixed) == sources(fixed)
    epochs = sources(sf.mix([tagged(0, 60), tagged(1, 60)], seed=3).take(50).repeat(2))
    assert epochs[:50] != epochs[50:]


def test_without_a_seed_one_is_drawn_per_pass_and_kept_in_the_state():
    ds = sf.mix([tagged(0, 100), tagged(1, 100)])
    with iter(ds) as it:
        head = [next(it) for _ in range(10)]
        state = json.loads(json.dumps(it.get_state()))
        rest = list(it)
    assert isinstance(state["root"]["seed"], int)
    with ds.iter_from_state(state) as resumed:
        assert list(resumed) == rest
    assert len(head) == 10


# -- when an input runs out --------------------------------------------------------------
def test_stop_ends_at_the_first_draw_of_an_empty_input():
    got = list(sf.mix([tagged(0, 5), tagged(1, 50)], seed=1))
    assert collections.Counter(k for k, _ in got)[0] == 5
    assert len(got) < 55  # input 1 was not drained
    # the draw after input 0's last element chose input 0 again: same choices in "drop" mode
    drop = list(sf.mix([tagged(0, 5), tagged(1, 50)], seed=1, on_empty="drop"))
    assert drop[:len(got)] == got and drop[len(got)][0] == 1
    with_empty = list(sf.mix([tagged(0, 0), tagged(1, 50)], seed=1))
    assert with_empty == [(1, i) for i in range(len(with_empty))] and len(with_empty) < 50


def test_drop_delivers_every_element_once_in_each_inputs_order():
    sizes = [9, 4, 13]
    got = list(sf.mix([tagged(k, n) for k, n in enumerate(sizes)], [0.2, 0.5, 0.3], seed=5, on_empty="drop"))
    assert len(got) == sum(sizes)
    for k, n in enumerate(sizes):
        assert [i for j, i in got if j == k] == list(range(n))


def test_drop_renormalises_the_weights_of_the_inputs_left():
    n = 20_000
    ds = sf.mix([tagged(0, 50), tagged(1, n), tagged(2, n)], [0.5, 0.3, 0.2], seed=11, on_empty="drop")
    got = sources(ds.take(n))
    last0 = max(i for i, k in enumerate(got) if k == 0)
    tail = got[last0 + 1:]
    counts = collections.Counter(tail)
    assert 0 not in counts
    m = len(tail)
    p = 0.3 / 0.5
    sd = math.sqrt(m * p * (1 - p))  # handing input 0's share to the next input would give 0.8 / 0.2
    assert abs(counts[1] - m * p) < 4 * sd, (counts, m)
    assert abs(counts[2] - m * (1 - p)) < 4 * sd, (counts, m)


def test_cycle_restarts_an_input_as_a_new_epoch_of_it():
    shuffled = from_list(list(range(6))).shuffle(6, seed=4)
    ds = sf.mix([shuffled.map(lambda x: (0, x)), tagged(1, 10_000)], [0.5, 0.5], seed=2, on_empty="cycle")
    got = [i for k, i in ds.take(300) if k == 0]
    passes = [tuple(got[j:j + 6]) for j in range(0, len(got) - 5, 6)]
    assert len(passes) >= 10
    assert all(sorted(p) == list(range(6)) for p in passes)  # each restart gives the whole input
    assert len(set(passes)) > 1  # each restart is a new epoch: its shuffle draws a new order
    assert ds.cardinality() == math.inf


def test_cycle_drops_an_input_that_is_empty_and_ends_when_all_are():
    got = list(sf.mix([tagged(0, 0), tagged(1, 3)], seed=1, on_empty="cycle").take(20))
    assert [k for k, _ in got] == [1] * 20
    assert [i for _, i in got] == [0, 1, 2] * 6 + [0, 1]
    assert list(sf.mix([tagged(0, 0), tagged(1, 0)], on_empty="cycle")) == []


# -- resume ----------------------------------------------------------------------------
MIXES = {
    "stop": lambda: sf.mix([tagged(0, 7), tagged(1, 5), tagged(2, 4)], [0.5, 0.3, 0.2], seed=3),
    "drop": lambda: sf.mix([tagged(0, 7), tagged(1, 5), tagged(2, 4)], [0.5, 0.3, 0.2], seed=3, on_empty="drop"),
    "cycle": lambda: sf.mix([tagged(0, 3), tagged(1, 5), tagged(2, 0)], [0.5, 0.3, 0.2], seed=3,
                            on_empty="cycle").take(30),
    "unseeded_drop": lambda: sf.mix([tagged(0, 6), tagged(1, 6)], on_empty="drop"),
    "stop_tf_spelling": lambda: sf.mix([tagged(0, 6), tagged(1, 6)], seed=1, stop_on_empty_dataset=True),
    "threaded_inputs": lambda: sf.mix(
        [tagged(0, 9).shuffle(4, seed=1).prefetch(2), tagged(1, 9).map(tuple, num_parallel_calls=2),
         from_list([0, 1]).interleave(lambda j: tagged(2 + j, 4), cycle_length=2, num_parallel_calls=2)],
        seed=9, on_empty="drop"),
    "cycle_shuffled_in_repeat": lambda: sf.mix([tagged(0, 4).shuffle(4, seed=2), tagged(1, 3)], seed=5,
                                               on_empty="cycle").take(15).repeat(2),
    "batched": lambda: sf.mix([tagged(0, 7), tagged(1, 7)], seed=6, on_empty="drop").batch(3),
}


@pytest.mark.parametrize("name", sorted(MIXES))
def test_mix_resumes_exactly_at_every_step(name):
    assert check_resume_everywhere(MIXES[name]()) >= 6  # steps 0 .. the end of the pass, each checked


def test_resume_past_a_block_of_draws():
    ds = sf.mix([tagged(0, 10_000), tagged(1, 10_000)], [0.7, 0.3], seed=12, on_empty="drop")
    for k in (4095, 4096, 4097, 9000, 14_500):  # draws come 4096 at a time; 14,500 is after input 0 ran out
        with iter(ds) as it:
            for _ in range(k):
                next(it)
            state = json.loads(json.dumps(it.get_state()))
            rest = list(it)
        assert len(json.dumps(state)) < 1024 and len(rest) == 20_000 - k
        with ds.iter_from_state(state) as resumed:
            assert list(resumed) == rest, k


def test_a_state_of_another_number_of_inputs_is_refused():
    with iter(sf.mix([tagged(0, 5), tagged(1, 5)], seed=1)) as it:
        next(it)
        state = it.get_state()
    with pytest.raises(ValueError, match="mix of 2 datasets; this mix has 3"):
        sf.mix([tagged(0, 5), tagged(1, 5), tagged(2, 5)], seed=1).iter_from_state(state)


# -- cardinality and statistics ----------------------------------------------------------
def test_cardinality_is_known_only_when_it_can_be_computed():
    a, b, empty = tagged(0, 7), tagged(1, 5), tagged(2, 0)
    assert sf.mix([a, b], on_empty="drop").cardinality() == 12
    assert sf.mix([a, b.repeat()], on_empty="drop").cardinality() == math.inf
    assert sf.mix([a, b.filter(bool)], on_empty="drop").cardinality() is None
    assert sf.mix([a, b], on_empty="stop").cardinality() is None  # where input 1 or 0 runs out depends on the draws
    assert sf.mix([a], on_empty="stop").cardinality() == 7
    assert sf.mix([a.repeat(), b.repeat()], on_empty="stop").cardinality() == math.inf
    assert sf.mix([a, b], on_empty="cycle").cardinality() == math.inf
    assert sf.mix([empty, b.filter(bool)], on_empty="cycle").cardinality() is None
    assert sf.mix([empty, empty], on_empty="cycle").cardinality() == 0
    assert sf.mix([a, b], on_empty="drop").batch(5).cardinality() == 3
    for ds in (sf.mix([a, b], seed=1, on_empty="drop"), sf.mix([empty, empty], on_empty="cycle")):
        assert len(list(ds)) == ds.cardinality()


def test_stats_show_the_mix_stage_and_elements_drawn_per_input():
    ds = sf.mix([tagged(0, 30).map(tuple), tagged(1, 30)], [0.8, 0.2], seed=4, on_empty="drop").batch(10)
    with iter(ds) as it:
        assert len(list(it)) == 6
        stages = {s.name.split(":", 1)[1]: s for s in it.stats().stages}
    mixed = stages["mix"].to_dict()
    assert mixed["elements"] == 60 and mixed["drawn"] == [30, 30]
    assert stages["mix"] in stages["batch"].upstream
    assert stages["map"] in stages["mix"].upstream and stages["from_list"] in stages["mix"].upstream
    with iter(sf.mix([tagged(0, 30), tagged(1, 30)], [0.8, 0.2], seed=4)) as it:
        got = list(it)
        drawn = it.stats().to_dict()["stages"][-1]["drawn"]
        state = it.get_state()["root"]
    assert drawn == [sum(1 for k, _ in got if k == j) for j in (0, 1)] == state["drawn"]
    assert drawn[0] > drawn[1]


# -- TFRecord inputs, batched after the mix -----------------------------------------------
def _expected_batches(files_a, files_b, spec, seed, size):
    """The batches the mix should give: the records in the mix's order (the same seed
    mixing unparsed records makes the same choices), parsed a batch at a time."""
    records = list(sf.mix([sf.read_tfrecord(files_a), sf.read_tfrecord(files_b)], [0.6, 0.4], seed=seed,
                          on_empty="drop"))
    return [sf.parse_example(records[i:i + size], spec) for i in range(0, len(records), size)]


def _assert_batches_equal(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key in e:
            if hasattr(e[key], "dtype"):
                assert g[key].dtype == e[key].dtype and g[key].tolist() == e[key].tolist(), key
            else:
                assert g[key] == e[key], key


def test_tfrecord_inputs_with_one_spec_are_parsed_a_batch_at_a_time(tmp_path):
    files_a = write_sized_shards(tmp_path, [6, 5], prefix="a")
    files_b = write_sized_shards(tmp_path, [7], prefix="b")
    ds = sf.mix([sf.read_tfrecord(files_a, SPEC), sf.read_tfrecord(files_b, dict(SPEC))], [0.6, 0.4], seed=3,
                on_empty="drop")
    assert ds._deferred_spec() == SPEC  # records reach the batch unparsed
    batched = ds.batch(4)
    _assert_batches_equal(list(batched), _expected_batches(files_a, files_b, SPEC, 3, 4))
    assert check_resume_everywhere(batched) == 6
    # a stage that looks at elements still gets them parsed
    ids = list(ds.map(lambda e: int(e["id"])))
    assert sorted(ids) == sorted([f * 1000 + i for f, n in enumerate([6, 5]) for i in range(n)] + list(range(7)))


def test_tfrecord_inputs_with_different_specs_parse_their_own_records(tmp_path):
    files_a = write_sized_shards(tmp_path, [6, 5], prefix="a")
    files_b = write_sized_shards(tmp_path, [7], prefix="b")
    spec_b = dict(SPEC, id=sf.FixedLen("int64", default=-1))  # another spec giving the same columns
    ds = sf.mix([sf.read_tfrecord(files_a, SPEC), sf.read_tfrecord(files_b, spec_b)], [0.6, 0.4], seed=3,
                on_empty="drop")
    assert ds._deferred_spec() is None
    batched = ds.batch(4)
    _assert_batches_equal(list(batched), _expected_batches(files_a, files_b, SPEC, 3, 4))
    assert check_resume_everywhere(batched) == 6


def test_tfrecord_inputs_with_different_error_policies_parse_their_own_records(tmp_path):
    files_a = write_sized_shards(tmp_path, [4], prefix="a")
    files_b = write_sized_shards(tmp_path, [4], prefix="b")
    ds = sf.mix([sf.read_tfrecord(files_a, SPEC), sf.read_tfrecord(files_b, SPEC, on_error="skip")], seed=1)
    assert ds._deferred_spec() is None
    same = sf.mix([sf.read_tfrecord(files_a, SPEC, on_error="skip"), sf.read_tfrecord(files_b, SPEC, on_error="skip")])
    assert same._deferred_spec() == SPEC and same._deferred_policy().mode == "skip"


# -- readers ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [None, 5])
def test_readers_split_each_input_and_together_deliver_every_element_once(seed):
    ds = sf.mix([tagged(0, 10), tagged(1, 7).map(tuple).shuffle(3, seed=1)], [0.7, 0.3], seed=seed, on_empty="drop")
    parts = [ds.shard(i, 3) for i in range(3)]
    assert all(isinstance(p, type(ds)) for p in parts)  # a mix of shares, not the mixed elements dealt
    got = [x for p in parts for x in p]
    assert sorted(got) == sorted(list(ds))  # unseeded, dealing one mix's elements would lose and repeat some
    assert len(got) == 17
    if seed is not None:
        assert len({p.seed for p in parts}) == 3 and parts[1].seed == ds.shard(1, 3).seed  # per reader, stable
        assert check_resume_everywhere(parts[1]) >= 6


def test_readers_of_tfrecord_inputs_read_only_their_own_files(tmp_path):
    from shardfeed.adapters.torch import split_for_reader

    files_a = write_sized_shards(tmp_path, [3, 3, 3, 3], prefix="a")
    files_b = write_sized_shards(tmp_path, [4, 4], prefix="b")
    ds = sf.mix([sf.read_tfrecord(files_a, SPEC), sf.read_tfrecord(files_b, SPEC)], seed=2, on_empty="drop").batch(2)
    ids = []
    for i in range(2):
        part = split_for_reader(ds, i, 2)
        mixed = part.parent
        assert [src.files for src in mixed.datasets] == [files_a[i::2], files_b[i::2]]
        ids += [int(x) for batch in part for x in batch["id"]]
    assert sorted(ids) == sorted([f * 1000 + j for f in range(4) for j in range(3)] + [f * 1000 + j for f in range(2)
                                                                                      for j in range(4)])

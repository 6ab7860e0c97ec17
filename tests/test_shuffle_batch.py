"""``source.shuffle(n).batch(k)`` fused: the same batches and states as the unfused chain."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.pipeline import check_resume_everywhere
from shardfeed.pipeline.state import elements_equal

from .test_pipeline_helpers import SPEC, example


def _files(tmp_path, sizes, tag="s"):
    out = []
    for f, n in enumerate(sizes):
        p = str(tmp_path / f"{tag}-{f}.tfrecord")
        sf.write_records(p, [example(f * 100_000 + i) for i in range(n)])
        out.append(p)
    return out


def _unfused(files, size, k, seed, **kw):
    # a pass-through stage between the source and the shuffle keeps them apart
    return sf.read_tfrecord(files, spec=SPEC).take(-1).shuffle(size, seed=seed).batch(k, **kw)


def _fused(files, size, k, seed, **kw):
    return sf.read_tfrecord(files, spec=SPEC).shuffle(size, seed=seed).batch(k, **kw)


def test_the_fused_node_is_used(tmp_path):
    files = _files(tmp_path, [10])
    with iter(_fused(files, 4, 3, 1)) as it:
        assert type(it._root).__name__ == "SourceBatchNode"
    with iter(_unfused(files, 4, 3, 1)) as it:
        assert type(it._root).__name__ != "SourceBatchNode"


def test_same_batches_as_the_unfused_chain_for_many_shapes(tmp_path):
    rnd = random.Random(5)
    for trial in range(40):
        sizes = [rnd.randint(0, 30) for _ in range(rnd.randint(1, 4))]
        files = _files(tmp_path, sizes, f"t{trial}")
        size, k, seed = rnd.randint(1, 40), rnd.randint(1, 7), rnd.randint(0, 9)
        drop = rnd.random() < 0.3
        a = [b["id"].tolist() for b in _fused(files, size, k, seed, drop_remainder=drop)]
        b = [b["id"].tolist() for b in _unfused(files, size, k, seed, drop_remainder=drop)]
        assert a == b, (sizes, size, k, seed, drop)


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
def test_large_pass_with_compaction_matches_and_resumes_across_chains(tmp_path):
    files = _files(tmp_path, [30_000, 20_000, 45_000])  # about 30 bytes a record: several 1 MiB chunks
    fused, unfused = _fused(files, 3000, 500, 7), _unfused(files, 3000, 500, 7)
    with iter(fused) as it:
        start = it.get_state()
    ref = [b["id"] for b in fused.iter_from_state(start)]
    ustart = dict(start, root=None)
    assert elements_equal(ref, [b["id"] for b in unfused.iter_from_state(ustart)])
    for stop in (1, 77, len(ref) - 1):
        with fused.iter_from_state(start) as it:
            for _ in range(stop):
                next(it)
            state = json.loads(json.dumps(it.get_state()))
        assert len(json.dumps(state)) < 2048
        rest = [b["id"] for b in fused.iter_from_state(state)]
        assert elements_equal(rest, ref[stop:])
        # the unfused chain reads the same state (its upstream states wrapped by the take stage)
        root = dict(state["root"])
        root["anchor"] = [root["anchor"][0], None if root["anchor"][1] is None
                          else {"parent": root["anchor"][1], "left": -1}]
        with unfused.iter_from_state(dict(state, root=root)) as it:
            assert elements_equal([b["id"] for b in it], ref[stop:])


@pytest.mark.parametrize("reads", [None, 2])
def test_fused_shuffle_batch_resumes_at_every_step(tmp_path, reads):
    files = _files(tmp_path, [13, 0, 9, 21])
    ds = sf.read_tfrecord(files, spec=SPEC, num_parallel_reads=reads).shuffle(8, seed=4).batch(3)
    assert check_resume_everywhere(ds) >= 15
    assert check_resume_everywhere(sf.read_tfrecord(files, spec=SPEC).shuffle(100, seed=4).batch(5)) >= 9


def test_fused_shuffle_batch_with_repeat_and_buffers(tmp_path):
    files = _files(tmp_path, [17, 6])
    two = list(sf.read_tfrecord(files, spec=SPEC).shuffle(5, seed=2).batch(4, bytes_as="buffer").repeat(2))
    ids = np.concatenate([b["id"] for b in two]).tolist()
    assert sorted(ids[:23]) == sorted(ids[23:]) and ids[:23] != ids[23:]
    assert sorted(ids[:23]) == sorted([i for i in range(17)] + [100_000 + i for i in range(6)])

"""stats() says how mixed a pass's batches are: the mean, over batches, of the largest
share of a batch's records that came from one file (issue 12, shuffle quality)."""

from __future__ import annotations

import pytest

import shardfeed as sf
from shardfeed.formats.example import encode_example

SPEC = {"label": sf.FixedLen("int64")}
FILES = 8
PER_FILE = 1000


@pytest.fixture
def sorted_shards(tmp_path):
    """Eight shards, each holding one label only (data sorted by class), with index files."""
    urls = []
    for f in range(FILES):
        url = str(tmp_path / f"class-{f}.tfrecord")
        sf.write_records(url, [encode_example({"label": [f], "i": [i]}) for i in range(PER_FILE)], index=True)
        urls.append(url)
    return urls


def _share(ds):
    it = iter(ds)
    labels = []
    for b in it:
        labels.append(b["label"])
    stage = next(s for s in it.stats().stages if s.mix_batches)
    return stage.largest_file_share, labels, it.stats()


def test_sequential_batches_come_from_one_file(sorted_shards):
    share, _, stats = _share(sf.read_tfrecord(sorted_shards, SPEC).batch(64))
    assert share > 0.95
    assert "largest_file_share" in str(stats.to_dict()) and "of a batch's records came from one file" in str(stats)


def test_global_shuffle_mixes_batches_and_the_share_says_so(sorted_shards):
    share, labels, _ = _share(sf.read_tfrecord(sorted_shards, SPEC, shuffle="global", seed=3).batch(64))
    # the share is the labels' own largest share: files hold one label each
    import numpy as np

    truth = np.mean([np.bincount(b).max() / len(b) for b in labels])
    assert share == pytest.approx(truth)
    assert share < 0.4  # 8 files: about 1/8 plus noise


def test_a_small_buffer_over_sorted_shards_is_seen_not_to_mix(sorted_shards):
    small, _, _ = _share(sf.read_tfrecord(sorted_shards, SPEC).shuffle(100, seed=1).batch(64))
    assert small > 0.9  # a buffer of 100 records over files of 1000 of one class each
    files, _, _ = _share(sf.read_tfrecord(sorted_shards, SPEC, shuffle="files", seed=1).batch(64))
    assert files > 0.95  # shuffling file order alone does not mix a batch

"""Adapters: PyTorch IterableDataset split over workers and ranks, tf.data, numpy, JAX."""

from __future__ import annotations

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.adapters.torch import split_for_reader
from shardfeed.pipeline import from_list

from .test_pipeline_helpers import SPEC, write_shards


def test_readers_split_the_source_spans_below_every_stage(tmp_path):
    files = write_shards(tmp_path, n_files=1, per_file=10)
    ds = sf.read_tfrecord(files, spec=SPEC).shuffle(4, seed=1).batch(3)
    parts = [split_for_reader(ds, i, 2) for i in range(2)]
    ids = [sorted(int(v) for b in p for v in b["id"]) for p in parts]
    assert ids == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # one file: record ranges through its index
    src = parts[1].parent.parent  # batch <- shuffle <- source
    assert type(src).__name__ == "TFRecordSource" and [s.start for s in src.provider.spans] == [5]
    # a source that cannot split has its elements dealt just above it
    assert type(split_for_reader(from_list([1, 2, 3]).map(str), 1, 2).parent).__name__ == "ShardDataset"
    assert list(split_for_reader(from_list([1, 2, 3]), 1, 2)) == [2]


def test_torch_dataloader_workers_and_ranks_split_without_duplicates(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    files = write_shards(tmp_path, n_files=2, per_file=12)
    ds = sf.read_tfrecord(files, spec=SPEC).batch(4)
    seen = []
    for rank in range(2):
        loader = DataLoader(ds.to_torch(rank=rank, world_size=2), batch_size=None, num_workers=2)
        for batch in loader:
            assert isinstance(batch["id"], torch.Tensor)
            seen.extend(batch["id"].tolist())
    assert sorted(seen) == sorted(f * 1000 + i for f in range(2) for i in range(12))


def test_torch_without_workers_reads_everything():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    out = [int(x) for x in DataLoader(from_list(list(range(7))).to_torch(), batch_size=None)]
    assert out == list(range(7))


def test_to_tf_yields_the_same_batches(tmp_path):
    tf = pytest.importorskip("tensorflow")
    ds = from_list([{"a": np.arange(3) + i, "s": b"x%d" % i} for i in range(5)]).batch(2)
    tds = ds.to_tf()
    assert tds.element_spec["a"] == tf.TensorSpec((None, 3), tf.int64)
    got = list(tds.as_numpy_iterator())
    assert [g["a"].tolist() for g in got] == [b["a"].tolist() for b in ds]
    assert got[2]["s"].tolist() == [b"x4"]


def test_to_tf_rejects_ragged_with_a_hint(tmp_path):
    pytest.importorskip("tensorflow")
    files = write_shards(tmp_path, n_files=1, per_file=3)
    with pytest.raises(TypeError, match="dense arrays only"):
        sf.read_tfrecord(files, spec=SPEC).batch(3).to_tf()


def test_as_numpy_turns_leaves_into_arrays():
    out = list(from_list([{"a": 1, "b": (2.0, [3, 4])}]).as_numpy())
    assert isinstance(out[0]["a"], np.ndarray) and out[0]["b"][1].tolist() == [3, 4]


def test_to_jax_places_numeric_arrays():
    jax = pytest.importorskip("jax")
    out = list(from_list([np.arange(4)]).batch(1).to_jax())
    assert isinstance(out[0], jax.Array) and out[0].tolist() == [[0, 1, 2, 3]]

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
        loader = DataLoader(ds.to_torch(slice_id=rank, slice_count=2), batch_size=None, num_workers=2)
        for batch in loader:
            assert isinstance(batch["id"], torch.Tensor)
            seen.extend(batch["id"].tolist())
    assert sorted(seen) == sorted(f * 1000 + i for f in range(2) for i in range(12))


def _bytes_shard(tmp_path, n: int) -> tuple[str, list[dict]]:
    rows = [{"id": [i], "tag": [b"t%d" % i + b"\x00" * (i % 3)], "words": [b"w"] * (i % 4), "empty": [b""]}
            for i in range(n)]
    url = str(tmp_path / "bytes.tfrecord")
    with sf.TFRecordWriter(url) as w:
        for r in rows:
            w.write(sf.encode_example(r))
    return url, rows


def test_torch_workers_send_bytes_columns_packed_and_the_main_process_gets_plain_object_arrays(tmp_path):
    """In a DataLoader worker each object array of bytes pickles as one buffer plus offsets
    (not value by value); the main process gets the same plain numpy object arrays, bytes
    for bytes (trailing NULs and empty values included), as without workers."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, rows = _bytes_shard(tmp_path, 40)
    spec = {"id": sf.FixedLen("int64"), "tag": sf.FixedLen("bytes"), "words": sf.VarLen("bytes"),
            "empty": sf.FixedLen("bytes")}
    ds = sf.read_tfrecord(url, spec=spec).batch(6).map(lambda b: (b, b["tag"].astype(str)))
    got = {}
    for batch, as_str in DataLoader(ds.to_torch(slice_id=0, slice_count=1), batch_size=None, num_workers=2):
        assert isinstance(batch["id"], torch.Tensor)
        assert type(batch["tag"]) is np.ndarray and batch["tag"].dtype == object and batch["tag"].shape[1:] == ()
        assert type(batch["words"].values) is np.ndarray and batch["words"].values.dtype == object
        assert as_str.dtype.kind == "U"  # not bytes: pickled as it is
        for k, i in enumerate(batch["id"].tolist()):
            got[i] = (batch["tag"][k], batch["words"][k].tolist(), batch["empty"][k])
    assert got == {i: (r["tag"][0], r["words"], b"") for i, r in enumerate(rows)}


def _wide_shard(tmp_path, n: int) -> tuple[str, dict]:
    rows = [{"id": [i], "x": [i / 4, -i / 8, 0.5], "flag": [i % 2], "tag": [b"t%d" % i + b"\x00" * (i % 3)],
             "pair": [b"a%d" % i, b""], "words": [b"w"] * (i % 4), "ids": list(range(i % 5))} for i in range(n)]
    url = str(tmp_path / "wide.tfrecord")
    with sf.TFRecordWriter(url) as w:
        for r in rows:
            w.write(sf.encode_example(r))
    spec = {"id": sf.FixedLen("int64"), "x": sf.FixedLen("float32", shape=(3,)), "flag": sf.FixedLen("int64"),
            "tag": sf.FixedLen("bytes"), "pair": sf.FixedLen("bytes", shape=(2,)), "words": sf.VarLen("bytes"),
            "ids": sf.VarLen("int64")}
    return url, spec


def _by_id(batches) -> dict:
    """Record id -> every column's value and its container's type, dtype and shape."""
    out = {}
    for b in batches:
        for k, i in enumerate(b["id"].tolist()):
            row = {}
            for name, col in b.items():
                if isinstance(col, sf.RaggedColumn):
                    row[name] = (type(col.values).__name__, str(col.values.dtype), col[k].tolist())
                else:
                    v = col[k]
                    row[name] = (type(col).__name__, str(col.dtype), tuple(col.shape[1:]),
                                 v.tolist() if hasattr(v, "tolist") else v)
            out[i] = row
    return out


def test_torch_workers_give_the_main_process_what_no_workers_give(tmp_path):
    """With batch_size=None and no collate_fn of the user's, workers parse bytes as buffers and
    send each batch's numeric columns as one buffer; the main process still gets, column by
    column, the types, dtypes, shapes and values that reading without workers gives."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, spec = _wide_shard(tmp_path, 45)
    ds = sf.read_tfrecord(url, spec=spec).batch(4).to_torch(slice_id=0, slice_count=1)
    alone = _by_id(DataLoader(ds, batch_size=None, num_workers=0))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert _by_id(batches) == alone and sorted(alone) == list(range(45))
    assert alone[7]["x"][0] == "Tensor" and alone[7]["tag"][:2] == ("ndarray", "object")
    # the numeric columns of a batch came as one buffer: their memory lies side by side
    for b in batches:
        tensors = [c for c in b.values() if isinstance(c, torch.Tensor)]
        lo = min(t.data_ptr() for t in tensors)
        hi = max(t.data_ptr() + t.nbytes for t in tensors)
        assert len(tensors) == 3 and hi - lo < 3 * 64 + sum(t.nbytes for t in tensors)


def test_torch_workers_leave_elements_alone_for_a_users_collate_or_auto_collation(tmp_path):
    """A collate_fn of the user's gets the element the pipeline makes (numpy arrays, bytes as
    objects), and DataLoader's own batching of single records still works."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, spec = _wide_shard(tmp_path, 12)
    seen = []

    def collate(b):
        seen.append((type(b["id"]), b["tag"].dtype, type(b["words"].values[0]) if len(b["words"].values) else bytes))
        return b

    ds = sf.read_tfrecord(url, spec=spec).batch(4).to_torch(slice_id=0, slice_count=1)
    got = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=collate))
    assert sum(len(b["id"]) for b in got) == 12 and all(t == (np.ndarray, np.dtype(object), bytes) for t in seen)
    flat = sf.read_tfrecord(url, spec={"id": spec["id"], "x": spec["x"]}).to_torch(slice_id=0, slice_count=1)
    batches = list(DataLoader(flat, batch_size=4, num_workers=2))
    assert sorted(torch.cat([b["id"] for b in batches]).tolist()) == list(range(12))
    assert all(b["x"].shape[1:] == (3,) and b["x"].dtype == torch.float32 for b in batches)


def test_a_batch_for_default_convert_unpickles_as_default_convert_makes_it():
    """for_default_convert: small batches travel in the pickle, large ones as tensors on one
    shared storage; either way the main process gets default_convert(element)."""
    torch = pytest.importorskip("torch")
    import pickle  # noqa: PLC0415
    from multiprocessing.reduction import ForkingPickler

    from torch.utils.data._utils.collate import default_convert

    from shardfeed.adapters import _torch_dataset as td
    from shardfeed.formats.native import BytesBuffer

    big = np.arange(td.IN_BAND_BYTES // 8 + 3, dtype=np.int64)
    element = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True, False]),
               "zero_d": np.array(5), "s": np.array([b"x"], object),
               "t": (np.arange(2, dtype=np.int16), "keep"), "buf": BytesBuffer(np.frombuffer(b"ab", np.uint8),
                                                                               np.array([0, 1, 2]))}
    for extra, shared in (({}, False), ({"big": big}, True)):
        el = {**element, **extra}
        sent = default_convert(td.for_default_convert(el))  # as the worker's fetcher does
        assert (type(sent) is td._InBand) is not shared
        if shared:  # tensors that are views of one storage already
            storages = {sent[k].untyped_storage().data_ptr() for k in ("f", "b", "big")}
            assert len(storages) == 1 and sent["big"].is_shared()
        back = ForkingPickler.loads(ForkingPickler.dumps(sent, pickle.HIGHEST_PROTOCOL))
        want = default_convert(el)
        assert back.keys() == want.keys()
        for k in want:
            w, g = want[k], back[k]
            if isinstance(w, torch.Tensor):
                assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape
                assert g.tolist() == w.tolist()
        assert back["s"].tolist() == [b"x"] and back["t"][1] == "keep" and back["t"][0].dtype == torch.int16
        assert isinstance(back["buf"], BytesBuffer) and back["buf"].data.tolist() == [97, 98]
    # one small array goes in the pipe too (found from outside: it went to default_convert, a
    # shared-memory segment and a descriptor over a fresh connection per batch); one large
    # array is left to PyTorch, whose one segment is what this would make
    one = td.for_default_convert({"one": np.arange(3)})
    assert type(one) is td._InBand
    assert ForkingPickler.loads(ForkingPickler.dumps(one, pickle.HIGHEST_PROTOCOL))["one"].tolist() == [0, 1, 2]
    assert td.for_default_convert({"one": big})["one"] is big
    assert not td._numeric(np.arange(3, dtype=">i4"))  # default_convert refuses it: left for it to say so


def test_small_batches_of_dataloader_workers_pass_no_descriptor_even_with_one_numeric_column(tmp_path, monkeypatch):
    """The docs say batches under 4 MiB travel in the worker's pipe; a batch of one numeric
    column went to default_convert instead: a shared-memory segment and a descriptor over a
    fresh connection per batch (counted here where the main process rebuilds them)."""
    pytest.importorskip("torch")
    import torch.multiprocessing.reductions as red
    from torch.utils.data import DataLoader

    calls = []
    real = red.fd_id  # called where a storage's descriptor is received (rebuild_storage_fd), never pickled
    monkeypatch.setattr(red, "fd_id", lambda fd: calls.append(fd) or real(fd))
    url = str(tmp_path / "a.tfrecord")
    sf.write_records(url, [sf.encode_example({"id": i}) for i in range(640)])
    for spec in ({"id": sf.FixedLen("int64")}, {"id": sf.FixedLen("int64"), "twice": sf.FixedLen("int64", default=0)}):
        loader = DataLoader(sf.read_tfrecord(url, spec=spec).batch(64).to_torch(), batch_size=None, num_workers=2)
        got = sorted(i for b in loader for i in b["id"].tolist())
        assert got == list(range(640)) and calls == [], spec


def test_workers_parse_bytes_as_buffers_only_where_the_objects_can_be_made_again(tmp_path):
    from shardfeed.adapters.torch import buffers_in_worker, objects_in_main

    url, spec = _wide_shard(tmp_path, 6)
    ds = sf.read_tfrecord(url, spec=spec).batch(4)
    inner, s = buffers_in_worker(ds)
    assert inner.bytes_as == "buffer" and s == spec
    import pickle  # noqa: PLC0415

    want = list(ds)
    got = [pickle.loads(pickle.dumps(objects_in_main(b, s))) for b in inner]
    for w, g in zip(want, got):
        for name in ("tag", "pair"):
            assert g[name].dtype == object and g[name].shape == w[name].shape and g[name].tolist() == w[name].tolist()
        assert g["words"].values.tolist() == w["words"].values.tolist()
    for other in (ds.map(lambda b: b), sf.read_tfrecord(url, spec=spec).batch(4, bytes_as="buffer"),
                  sf.read_tfrecord(url, spec={"id": spec["id"]}).batch(4),
                  sf.read_tfrecord(url, spec={**spec, "z": sf.FixedLen("bytes", shape=(0,))}).batch(4)):
        assert buffers_in_worker(other) == (other, None)


class _Bytes(bytes):
    pass


def test_packed_object_arrays_pickle_as_one_buffer_and_refuse_nothing():
    import pickle  # noqa: PLC0415

    from shardfeed.adapters.torch import pack_for_transfer
    from shardfeed.formats.native import BytesBuffer

    tags = np.array([[b"a", b""], [b"\x00b", b"c" * 1000]], object)
    mixed = np.array([b"x", "y", None], object)
    sub = np.array([_Bytes(b"q")], object)  # a subclass of bytes stays itself
    element = {"tags": tags, "mixed": mixed, "sub": sub, "n": np.arange(3),
               "pair": (tags, 7), "buf": BytesBuffer(np.frombuffer(b"ab", np.uint8), np.array([0, 1, 2]))}
    packed = pack_for_transfer(element)
    wire = pickle.dumps(packed, protocol=4)
    assert wire.count(b"c" * 1000) == 2 and len(wire) < 3000  # tags, and again in pair: one buffer each
    back = pickle.loads(wire)
    assert type(back["tags"]) is np.ndarray and back["tags"].shape == (2, 2)
    assert back["tags"].tolist() == tags.tolist() and back["pair"][0].tolist() == tags.tolist()
    assert back["mixed"].tolist() == [b"x", "y", None] and type(back["sub"][0]) is _Bytes
    assert isinstance(back["buf"], BytesBuffer) and back["buf"].to_list() == [b"a", b"b"]
    assert back["n"].tolist() == [0, 1, 2] and back["pair"][1] == 7


@pytest.mark.slow  # several seconds: out of the quick loop (make test-fast)
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


def test_to_jax_refuses_int64_beyond_32_bits_naming_the_feature():
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("this process runs JAX with x64 enabled")
    ds = from_list([{"id": np.int64(2**40 + 5), "x": np.float32(1)}]).batch(1)
    with pytest.raises(OverflowError, match=r"'id'.*jax_enable_x64.*True"):
        list(ds.to_jax())


def test_to_jax_casts_int64_that_fits_with_one_warning(caplog):
    jax = pytest.importorskip("jax")
    if jax.config.jax_enable_x64:
        pytest.skip("this process runs JAX with x64 enabled")
    ds = from_list([{"id": np.int64(-(2**31) + i), "x": np.float64(0.5)} for i in range(6)]).batch(2)
    with caplog.at_level("WARNING", logger="shardfeed.adapters.jax"):
        out = list(ds.to_jax())
    assert [b["id"].tolist() for b in out] == [[-(2**31), -(2**31) + 1], [-(2**31) + 2, -(2**31) + 3],
                                               [-(2**31) + 4, -(2**31) + 5]]
    assert out[0]["id"].dtype == np.int32 and out[0]["x"].dtype == np.float32
    warned = [r.getMessage() for r in caplog.records if "to_jax" in r.getMessage()]
    assert len(warned) == 2  # once per feature, not once per batch
    assert any("'id'" in m and "int32" in m for m in warned) and any("'x'" in m for m in warned)


def test_to_jax_with_x64_keeps_int64_intact(tmp_path):
    pytest.importorskip("jax")
    import os
    import subprocess
    import sys

    # jax_enable_x64 is process-wide: turn it on in a fresh interpreter only
    script = (
        "import jax, numpy as np\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "from shardfeed.pipeline import from_list\n"
        "out = list(from_list([{'id': np.int64(2**40 + 5)}]).batch(1).to_jax())\n"
        "print(out[0]['id'].dtype, out[0]['id'].tolist())\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[0] == f"int64 [{2**40 + 5}]"


def test_cardinality_comes_from_index_files_through_the_stages(tmp_path):
    from .test_pipeline_helpers import write_sized_shards

    files = write_sized_shards(tmp_path, [7, 3], index=True)
    ds = sf.read_tfrecord(files, spec=SPEC)
    assert ds.cardinality() == 10
    assert ds.shuffle(4, seed=1).map(lambda e: e).batch(4).prefetch().cardinality() == 3
    assert ds.batch(4, drop_remainder=True).cardinality() == 2
    assert ds.take(4).cardinality() == 4 and ds.skip(8).cardinality() == 2 and ds.repeat(3).cardinality() == 30
    assert ds.repeat().cardinality() == float("inf")
    assert ds.filter(lambda e: True).cardinality() is None  # a filter makes it unknown
    shares = [sf.read_tfrecord(files, spec=SPEC, slice_id=i, slice_count=3).cardinality() for i in range(3)]
    assert sorted(shares) == [3, 3, 4]
    glob = [sf.read_tfrecord(files, spec=SPEC, shuffle="global", seed=1, slice_id=i, slice_count=3) for i in range(3)]
    assert [g.cardinality() for g in glob] == [len(list(g)) for g in glob] == [4, 3, 3]
    # what every stage claims is what a pass yields
    for d in (ds.batch(4), ds.batch(4, drop_remainder=True), ds.skip(8), ds.shard(1, 3), ds.repeat(2).batch(3)):
        assert d.cardinality() == len(list(d))
    assert sf.read_tfrecord(write_shards(tmp_path / "noidx", n_files=1), spec=SPEC).cardinality() is None
    assert sf.read_tfrecord(files, spec=SPEC, on_corrupt="skip").cardinality() is None


def test_cardinality_of_a_compressed_conversion_comes_from_its_manifest(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"x": [float(i) for i in range(11)], "y": [i % 2 for i in range(11)]})
    sf.convert(df, str(tmp_path), schema={"x": "float", "y": "integer label"}, compression="GZIP",
               num_samples_per_shard=4, progress=False)
    ds = sf.read_dataset(str(tmp_path), "train")
    assert ds.cardinality() == 11 == len(list(ds))
    assert ds.batch(3).cardinality() == 4


def test_keras_fit_knows_the_epoch_length(tmp_path, capfd, caplog):
    import warnings

    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    records = [sf.encode_example({"x": [float(i), 1.0], "y": [float(i % 3)]}) for i in range(10)]
    path = str(tmp_path / "train.tfrecord")
    sf.write_records(path, records, index=True)
    spec = {"x": sf.FixedLen("float32", shape=[2]), "y": sf.FixedLen("float32")}
    ds = sf.read_tfrecord(path, spec=spec).batch(4).map(lambda b: (b["x"], b["y"]))
    tds = ds.to_tf()
    assert int(tds.cardinality()) == 3  # 10 records in batches of 4

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
        warnings.simplefilter("always")
        history = model.fit(tds, epochs=2, verbose=0)
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records] + [capfd.readouterr().err]
    assert not any("ran out of data" in s for s in said), said
    assert len(history.history["loss"]) == 2
    assert tf.data.experimental.cardinality(sf.read_tfrecord(path, spec=spec).filter(bool).to_tf()) == \
        tf.data.experimental.UNKNOWN_CARDINALITY


def test_to_tf_leaves_the_padded_length_of_a_sequence_feature_unknown(tmp_path):
    pytest.importorskip("tensorflow")
    path = str(tmp_path / "seq.tfrecord")
    sf.write_records(path, [sf.encode_example({"s": list(range(n))}) for n in (1, 1, 4, 2)])
    spec = {"s": sf.FixedLenSequence("int64", allow_missing=True)}
    tds = sf.read_tfrecord(path, spec=spec).batch(2).to_tf()
    assert tds.element_spec["s"].shape.as_list() == [None, None]
    assert [b["s"].tolist() for b in tds.as_numpy_iterator()] == [[[0], [0]], [[0, 1, 2, 3], [0, 1, 0, 0]]]


def test_to_torch_takes_slice_id_and_slice_count_and_the_older_rank_world_size_with_a_warning():
    pytest.importorskip("torch")
    import warnings

    ds = sf.from_list(list(range(10)))
    assert (ds.to_torch(slice_id=1, slice_count=2).rank, ds.to_torch(slice_id=1, slice_count=2).world_size) == (1, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = ds.to_torch(rank=1, world_size=2)
    assert (old.rank, old.world_size) == (1, 2)
    assert any(issubclass(w.category, DeprecationWarning) and "slice_id" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="not both"):
        ds.to_torch(slice_id=0, slice_count=2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="0 <= slice_id < slice_count"):
        ds.to_torch(slice_id=2, slice_count=2)

"""Ray Data on a real local Ray cluster (``ray.init`` with two CPUs: a raylet and worker
processes): the TFRecord datasource against the record reader, its shuffle modes and error
policy, bytes fetched from S3 counted on the wire, the image stage as ``map_batches``, the
split to trainers, and the way back to a shardfeed pipeline."""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest

import shardfeed as sf

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
sfray = pytest.importorskip("shardfeed.adapters.ray")

SPEC = {"label": sf.FixedLen("int64"), "dense": sf.FixedLen("float32", shape=[3]), "ids": sf.VarLen("int64"),
        "blob": sf.FixedLen("bytes"), "tags": sf.VarLen("bytes")}
FILES, PER_FILE = 5, 400


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False,
             configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def example(i: int) -> dict:
    return {"label": i, "dense": np.arange(3, dtype=np.float32) * i, "ids": list(range(i % 4)),
            "blob": bytes([i % 251]) * (i % 7), "tags": [b"t%d" % j for j in range(i % 3)]}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray-shards")
    for f in range(FILES):
        sf.write_records(str(d / f"part-{f}.tfrecord"),
                         [sf.encode_example(example(f * PER_FILE + i)) for i in range(PER_FILE)])
    return str(d / "*.tfrecord")


def rows_of(ray_ds) -> dict[int, dict]:
    out = {}
    for b in ray_ds.iter_batches(batch_size=256, batch_format="numpy"):
        for k, label in enumerate(b["label"].tolist()):
            assert label not in out, f"record {label} delivered twice"
            out[label] = {name: b[name][k] for name in b}
    return out


def test_every_record_once_with_the_record_readers_values(ray_cluster, shards):
    got = rows_of(sfray.read_tfrecord(shards, SPEC))
    assert sorted(got) == list(range(FILES * PER_FILE))
    for label in (0, 1, 5, 401, 1999):
        want = example(label)
        row = got[label]
        np.testing.assert_array_equal(row["dense"], want["dense"])
        assert list(row["ids"]) == want["ids"]
        assert bytes(row["blob"]) == want["blob"]
        assert [bytes(t) for t in row["tags"]] == want["tags"]


def test_arrow_columns_are_typed_and_numeric_ones_not_copied():
    import pyarrow as pa

    b = next(iter(sf.read_tfrecord(_write_tmp(), SPEC).batch(10, bytes_as="buffer")))
    t = sfray.batch_to_arrow(b)
    assert t.num_rows == 10
    assert t.schema.field("label").type == pa.int64()
    assert t.schema.field("blob").type == pa.large_binary()
    assert t.schema.field("ids").type == pa.large_list(pa.int64())
    assert t.schema.field("tags").type == pa.large_list(pa.large_binary())
    # the label column shares the parser's buffer
    assert t.column("label").chunk(0).buffers()[1].address == b["label"].ctypes.data
    with pytest.raises(TypeError, match="Sparse feature"):
        sfray.batch_to_arrow({"s": sf.SparseColumn(np.zeros((1, 2), np.int64), np.ones(1), np.array([1, 3]))})


_TMP: list[str] = []


def _write_tmp() -> str:
    import tempfile

    if not _TMP:
        path = os.path.join(tempfile.mkdtemp(), "ten.tfrecord")
        sf.write_records(path, [sf.encode_example(example(i)) for i in range(10)])
        _TMP.append(path)
    return _TMP[0]


@pytest.mark.parametrize("mode", ["files", "blocks", "global"])
def test_shuffle_modes_deliver_each_record_once(ray_cluster, shards, mode):
    ds = sfray.read_tfrecord(shards, {"label": sf.FixedLen("int64")}, shuffle=mode, seed=11, block_size=50,
                             override_num_blocks=3)
    labels = [x for b in ds.iter_batches(batch_size=500, batch_format="numpy") for x in b["label"].tolist()]
    assert sorted(labels) == list(range(FILES * PER_FILE))
    assert labels != sorted(labels)


def test_read_tasks_are_reader_shares_of_the_files(ray_cluster, shards):
    source = sfray.make_datasource(shards, {"label": sf.FixedLen("int64")})
    assert len(source.get_read_tasks(200)) == FILES  # one a file, never more than the spans
    assert len(source.get_read_tasks(2)) == 2
    assert source.estimate_inmemory_data_size() == sum(
        os.path.getsize(p) for p in sf.read_tfrecord(shards).files)
    with pytest.raises(ValueError, match="slice_id is not for Ray"):
        sfray.make_datasource(shards, SPEC, slice_id=0, slice_count=2)
    with pytest.raises(ValueError, match="give a spec"):
        sfray.make_datasource(shards, None)


@pytest.mark.parametrize("batch_size", [None, 50])
def test_each_block_is_one_arrow_chunk_a_column(shards, batch_size):
    """Ray serializes every chunk of every column on its own, and the consumer copies a batch
    that straddles two chunks: a read task's blocks hold one chunk a column, whether it parses
    a block's records at once (local files) or gathers parse batches (``batch_size`` given).
    The read tasks run in this process: no cluster needed to see their blocks."""
    source = sfray.make_datasource(shards, SPEC, batch_size=batch_size)
    blocks = [block for task in source.get_read_tasks(FILES) for block in task()]
    assert sum(b.num_rows for b in blocks) == FILES * PER_FILE
    for block in blocks:
        assert [c.num_chunks for c in block.columns] == [1] * len(SPEC), block.schema
    # every record once, in file order within each task
    labels = np.concatenate([b.column("label").to_numpy() for b in blocks])
    assert sorted(labels.tolist()) == list(range(FILES * PER_FILE))


def test_blocks_fit_between_the_data_contexts_target_and_one_and_a_half_times_it(shards):
    """Ray gathers a read task's blocks until they pass ``DataContext.target_max_block_size``
    and cuts one above 1.5 times it into slices: the read task makes each block but a task's
    last fall between the two, so that Ray passes it on as it was built."""
    source = sfray.make_datasource(shards, SPEC, batch_size=50)
    ctx = ray.data.DataContext.get_current().copy()
    ctx.target_max_block_size = target = 8 << 10
    tasks = source.get_read_tasks(1, data_context=ctx)
    blocks = [list(task()) for task in tasks]
    assert sum(len(b) for b in blocks) > FILES  # several blocks a file, not one
    for task_blocks in blocks:
        for b in task_blocks[:-1]:
            assert target < b.nbytes < 1.5 * target, b.nbytes  # Ray slices from 1.5 times on


@pytest.mark.parametrize("batch_size", [None, 50])
@pytest.mark.parametrize("block_bytes", [16 << 10, 24 << 10])  # fewer records a block than the probe's, more
def test_blocks_reach_the_consumer_as_the_read_task_built_them(ray_cluster, shards, batch_size, block_bytes):
    """What Ray holds after the read, not what the task yields: by default Ray gathers a
    task's blocks up to 128 MiB as one table of several chunks a column (the consumer then
    copies each block whole to cut its first batch from it, and the first batch of a pass
    waits for a task to parse 128 MiB). ``read_tfrecord`` sets its dataset's target from
    ``block_bytes``: each block Ray holds is one chunk a column, several a file, and the
    global ``DataContext`` is left as it was."""
    before = ray.data.DataContext.get_current().target_max_block_size
    ds = sfray.read_tfrecord(shards, SPEC, batch_size=batch_size, block_bytes=block_bytes)
    assert ray.data.DataContext.get_current().target_max_block_size == before
    blocks = [ray.get(ref) for ref in ds.materialize().to_arrow_refs()]
    assert len(blocks) > FILES
    for block in blocks:
        assert [c.num_chunks for c in block.columns] == [1] * len(SPEC), [c.num_chunks for c in block.columns]
    labels = np.concatenate([b.column("label").to_numpy() for b in blocks])
    assert sorted(labels.tolist()) == list(range(FILES * PER_FILE))


def test_corrupt_record_raises_naming_file_and_offset_or_is_skipped(ray_cluster, tmp_path):
    good = [sf.encode_example({"label": i}) for i in range(20)]
    path = tmp_path / "bad.tfrecord"
    sf.write_records(str(path), good)
    data = bytearray(path.read_bytes())
    frame = len(good[0]) + 16
    data[5 * frame + 12 + 3] ^= 0xFF  # a payload byte of record 5: its data CRC fails
    path.write_bytes(bytes(data))
    spec = {"label": sf.FixedLen("int64")}
    with pytest.raises(Exception, match=rf"bad\.tfrecord.*{5 * frame}|{5 * frame}.*bad\.tfrecord"):
        sfray.read_tfrecord(str(path), spec).take_all()
    labels = sorted(r["label"] for r in sfray.read_tfrecord(str(path), spec, on_error="skip").take_all())
    assert labels == [i for i in range(20) if i != 5]


def test_bytes_fetched_from_s3_are_the_data_once(ray_cluster, s3_bucket, fault_proxy, shards):
    import boto3

    bucket, _ = s3_bucket
    client = boto3.client("s3", endpoint_url=fault_proxy.url)
    total = 0
    for path in sf.read_tfrecord(shards).files:
        body = open(path, "rb").read()
        total += len(body)
        client.put_object(Bucket=bucket, Key=f"train/{os.path.basename(path)}", Body=body)
    fault_proxy.object_gets = fault_proxy.object_bytes = 0
    ds = sfray.read_tfrecord(f"s3://{bucket}/train/*.tfrecord", {"label": sf.FixedLen("int64")},
                             storage_options={"endpoint_url": fault_proxy.url})
    assert len(rows_of(ds)) == FILES * PER_FILE
    assert total <= fault_proxy.object_bytes <= 1.05 * total, (fault_proxy.object_bytes, total)


def test_streaming_split_gives_each_trainer_a_share_of_every_record_once(ray_cluster, shards):
    ds = sfray.read_tfrecord(shards, {"label": sf.FixedLen("int64")})
    its = ds.streaming_split(2, equal=True)
    got: list[list[int]] = [[], []]

    def train(k: int) -> None:
        for b in its[k].iter_batches(batch_size=128, batch_format="numpy"):
            got[k].extend(b["label"].tolist())

    threads = [threading.Thread(target=train, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got[0]) == len(got[1]) == FILES * PER_FILE // 2
    assert sorted(got[0] + got[1]) == list(range(FILES * PER_FILE))


def test_back_to_a_shardfeed_pipeline_each_pass_an_epoch(ray_cluster, shards):
    ds = sfray.to_shardfeed(sfray.read_tfrecord(shards, {"label": sf.FixedLen("int64")}), batch_size=300)
    for _ in range(2):
        labels = [x for b in ds.prefetch(2) for x in b["label"].tolist()]
        assert sorted(labels) == list(range(FILES * PER_FILE))


def _jpeg(i: int) -> bytes:
    from PIL import Image

    img = Image.fromarray(np.full((40, 60, 3), (i * 7) % 256, np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _image_records(tmp_path) -> tuple[str, list[bytes], dict]:
    pytest.importorskip("PIL")
    path = str(tmp_path / "img.tfrecord")
    images = [_jpeg(i) for i in range(40)] + [b"not a jpeg"]
    sf.write_records(path, [sf.encode_example({"label": i, "image": im}) for i, im in enumerate(images)])
    return path, images, {"label": sf.FixedLen("int64"), "image": sf.FixedLen("bytes")}


def test_decode_images_as_a_map_batches_step_matches_the_image_stage(ray_cluster, tmp_path):
    path, images, spec = _image_records(tmp_path)
    ds = sfray.read_tfrecord(path, spec).map_batches(sfray.DecodeImages, fn_constructor_args=("image", 32),
                                                     fn_constructor_kwargs={"on_error": "skip"}, concurrency=2,
                                                     num_cpus=0.5,  # two actors and a read task on 2 CPUs
                                                     batch_size=16, batch_format="numpy")
    rows = {r["label"]: r["image"] for r in ds.take_all()}
    assert sorted(rows) == list(range(40))  # the bad image's row dropped, every other kept
    want = sf.decode_images({"image": np.array(images[:40], dtype=object)}, "image", 32)["image"]
    for i in range(40):
        assert rows[i].shape == (32, 32, 3)
        np.testing.assert_array_equal(rows[i], want[i])
    with pytest.raises(Exception, match="image"):
        sfray.read_tfrecord(path, spec).map_batches(sfray.DecodeImages, fn_constructor_args=("image", 32),
                                                    concurrency=1, num_cpus=0.5, batch_format="numpy").take_all()


def test_decode_images_instance_runs_fused_into_the_read_tasks(ray_cluster, tmp_path):
    """An instance of ``sf.ray.DecodeImages`` (not the class) with ``batch_size=None`` is a
    function of whole blocks to Ray: it runs in the read tasks (one fused operator: no actor
    pool started for each pass, the encoded images never pass through the object store), with
    the image stage's pixels. (A ``batch_size`` keeps Ray from fusing it with a read.)"""
    path, images, spec = _image_records(tmp_path)
    ds = sfray.read_tfrecord(path, spec).map_batches(sfray.DecodeImages("image", 32, on_error="skip"),
                                                     batch_size=None, batch_format="numpy")
    rows = {r["label"]: r["image"] for r in ds.take_all()}
    assert sorted(rows) == list(range(40))
    want = sf.decode_images({"image": np.array(images[:40], dtype=object)}, "image", 32)["image"]
    for i in range(40):
        np.testing.assert_array_equal(rows[i], want[i])
    assert "Readshardfeed.TFRecord->MapBatches(DecodeImages)" in ds.stats()


def test_default_blocks_are_larger_for_large_records(ray_cluster, tmp_path, shards):
    """``block_bytes=None``: 16 MiB blocks for small records; 64 MiB when the first record is
    8 KiB or more (a decoder's outputs after the read then come in fewer, larger blocks), read
    from the first frame's length field; a target the user set lower is kept."""
    big = str(tmp_path / "big.tfrecord")
    sf.write_records(big, [sf.encode_example({"label": [i], "blob": [bytes(9000)]}) for i in range(3)])

    def target(ds):
        return (getattr(ds, "context", None) or ds._context).target_max_block_size

    assert target(sfray.read_tfrecord(shards, SPEC)) == int((16 << 20) / sfray.PASS_THROUGH)
    assert target(sfray.read_tfrecord(big, {"label": sf.FixedLen("int64")})) == int((64 << 20) / sfray.PASS_THROUGH)
    assert target(sfray.read_tfrecord(big, {"label": sf.FixedLen("int64")}, block_bytes=1 << 20)) == int(
        (1 << 20) / sfray.PASS_THROUGH)
    with pytest.raises(ValueError, match="block_bytes"):
        sfray.read_tfrecord(big, {"label": sf.FixedLen("int64")}, block_bytes=0)
    ctx = ray.data.DataContext.get_current()
    before, ctx.target_max_block_size = ctx.target_max_block_size, 4 << 20
    try:
        assert target(sfray.read_tfrecord(big, {"label": sf.FixedLen("int64")})) == 4 << 20
    finally:
        ctx.target_max_block_size = before


@pytest.mark.parametrize("mode", ["files", "blocks", "global"])
def test_each_pass_of_a_shuffled_dataset_is_a_new_epoch(ray_cluster, shards, mode):
    """Every pass (each ``iter_batches``, each ``to_shardfeed`` epoch) runs the read tasks in
    fresh copies of the source: each execution is told its epoch, so the n-th pass reads the
    n-th epoch's order, as the n-th pass in-process does, not the first one again."""
    kw = {"shuffle": mode, "seed": 11, "block_size": 50, "override_num_blocks": 1}  # one task: its order is the pass's
    ds = sfray.read_tfrecord(shards, {"label": sf.FixedLen("int64")}, **kw)

    def one_pass(it):
        return [x for b in it for x in np.asarray(b["label"]).tolist()]

    first, second = (one_pass(ds.iter_batches(batch_size=500, batch_format="numpy")) for _ in range(2))
    assert sorted(first) == sorted(second) == list(range(FILES * PER_FILE))
    assert first != second
    inproc = sf.read_tfrecord(shards, {"label": sf.FixedLen("int64")}, **{k: v for k, v in kw.items()
                                                                          if k != "override_num_blocks"})
    batches = inproc.batch(500)  # one dataset, two passes: epochs 0 and 1
    assert first == one_pass(batches) and second == one_pass(batches)
    back = sfray.to_shardfeed(sfray.read_tfrecord(shards, {"label": sf.FixedLen("int64")}, **kw), batch_size=500)
    assert one_pass(back) == first and one_pass(back) == second

"""Files, both ways, against TensorFlow itself: what shardfeed writes reads in tf.data to
equal values, and what TensorFlow writes reads in shardfeed to equal values."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardfeed as sf

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.tf

COMPRESSIONS = [None, "GZIP", "ZLIB"]


def _features(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "label": [i % 2],
        "dense": rng.normal(size=13).astype(np.float32),
        "ids": rng.integers(-(1 << 62), 1 << 62, size=i % 5),  # 0..4 values, empty included
        "text": [f"row-{i}-ünï".encode(), b"\x00\xff binary"],
        "empty_bytes": [],
        "scores": rng.normal(size=i % 3).astype(np.float32),
    }


SPEC = {
    "label": sf.FixedLen("int64"),
    "dense": sf.FixedLen("float32", shape=[13]),
    "ids": sf.VarLen("int64"),
    "text": sf.FixedLen("bytes", shape=[2]),
    "scores": sf.VarLen("float32"),
}


def _tf_spec():
    return {
        "label": tf.io.FixedLenFeature([], tf.int64),
        "dense": tf.io.FixedLenFeature([13], tf.float32),
        "ids": tf.io.VarLenFeature(tf.int64),
        "text": tf.io.FixedLenFeature([2], tf.string),
        "scores": tf.io.VarLenFeature(tf.float32),
    }


def _check_batch(ours: dict, theirs: dict) -> None:
    np.testing.assert_array_equal(ours["label"], theirs["label"].numpy())
    np.testing.assert_array_equal(ours["dense"], theirs["dense"].numpy())
    assert ours["text"].tolist() == theirs["text"].numpy().tolist()
    for key in ("ids", "scores"):
        sp = theirs[key]
        np.testing.assert_array_equal(ours[key].values, sp.values.numpy())
        rows = sp.indices.numpy()[:, 0]
        np.testing.assert_array_equal(ours[key].row_lengths, np.bincount(rows, minlength=len(ours["label"])))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_shardfeed_writes_tf_reads(tmp_path, compression):
    url = str(tmp_path / "sf.tfrecord")
    records = [sf.encode_example(_features(i)) for i in range(64)]
    sf.write_records(url, records, compression=compression)
    ds = tf.data.TFRecordDataset(url, compression_type=compression or "")
    got = [r.numpy() for r in ds]
    assert got == records
    batch = next(iter(ds.batch(64).map(lambda x: tf.io.parse_example(x, _tf_spec()))))
    _check_batch(sf.parse_example(records, SPEC), batch)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tf_writes_shardfeed_reads(tmp_path, compression):
    url = str(tmp_path / "tf.tfrecord")
    protos = []
    with tf.io.TFRecordWriter(url, options=compression or "") as w:
        for i in range(64):
            f = _features(i)
            ex = tf.train.Example(features=tf.train.Features(feature={
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=f["label"])),
                "dense": tf.train.Feature(float_list=tf.train.FloatList(value=f["dense"])),
                "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=f["ids"])),
                "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=f["text"])),
                "empty_bytes": tf.train.Feature(bytes_list=tf.train.BytesList(value=[])),
                "scores": tf.train.Feature(float_list=tf.train.FloatList(value=f["scores"])),
            }))
            data = ex.SerializeToString()
            protos.append(data)
            w.write(data)
    records = list(sf.read_records(url, compression=compression))
    assert records == protos
    tf_batch = tf.io.parse_example(tf.constant(records), _tf_spec())
    _check_batch(sf.parse_example(records, SPEC), tf_batch)
    # one by one through the dataset source as well
    for i, ex in enumerate(sf.read_tfrecord(url, spec=SPEC, compression=compression)):
        assert ex["label"] == i % 2
        np.testing.assert_array_equal(ex["ids"], _features(i)["ids"])


def test_record_over_16_mib_both_ways(tmp_path):
    big = os.urandom((16 << 20) + 123)
    ours = str(tmp_path / "ours.tfrecord")
    sf.write_records(ours, [sf.encode_example({"blob": [big]})])
    got = [r.numpy() for r in tf.data.TFRecordDataset(ours)]
    parsed = tf.io.parse_single_example(got[0], {"blob": tf.io.FixedLenFeature([], tf.string)})
    assert parsed["blob"].numpy() == big
    theirs = str(tmp_path / "theirs.tfrecord")
    with tf.io.TFRecordWriter(theirs) as w:
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[big]))})).SerializeToString())
    (rec,) = list(sf.read_records(theirs))
    assert sf.decode_example(rec)["blob"] == [big]


def test_hundreds_of_features(tmp_path):
    feats = {f"f{i:03d}": ([i, -i] if i % 3 == 0 else [float(i)] if i % 3 == 1 else [str(i).encode()])
             for i in range(300)}
    url = str(tmp_path / "wide.tfrecord")
    sf.write_records(url, [sf.encode_example(feats)] * 3)
    spec_tf = {k: tf.io.FixedLenFeature([len(v)], tf.int64 if isinstance(v[0], int) else
                                        tf.float32 if isinstance(v[0], float) else tf.string)
               for k, v in feats.items()}
    spec_sf = {k: sf.FixedLen("int64" if isinstance(v[0], int) else "float32" if isinstance(v[0], float)
                              else "bytes", shape=[len(v)]) for k, v in feats.items()}
    records = [r.numpy() for r in tf.data.TFRecordDataset(url)]
    theirs = tf.io.parse_example(tf.constant(records), spec_tf)
    ours = sf.parse_example(records, spec_sf)
    for k in feats:
        assert ours[k].tolist() == theirs[k].numpy().tolist(), k


def test_index_matches_what_tf_reads(tmp_path):
    url = str(tmp_path / "ix.tfrecord")
    records = [sf.encode_example(_features(i)) for i in range(10)]
    sf.write_records(url, records, index=True)
    shard = sf.IndexedTFRecord(url)
    tf_records = [r.numpy() for r in tf.data.TFRecordDataset(url)]
    assert [shard[i] for i in range(len(shard))] == tf_records

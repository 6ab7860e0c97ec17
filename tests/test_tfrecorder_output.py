"""Reading TFRecorder's output: ``read_dataset`` and ``shardfeed inspect`` on a job folder
written the way TFRecorder writes one (TensorFlow's own Example encoder and GZIP writer),
and the ``df.tensorflow`` accessor alias."""

from __future__ import annotations

import base64
import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image

import shardfeed as sf
from shardfeed.cli.main import main as cli_main

JOB = "tfrecorder-20240102-030405-to-tfr"


def _pixels(h, w, c, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(h, w, c), dtype=np.uint8)


def _example(tf, feats):
    def feature(v):
        if isinstance(v, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))

    return tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in feats.items()}))


def write_tfrecorder_output(root, rows, shards=None, discarded_as="text", integer_label=False):
    """Write ``rows`` (``(split, image_name, pixels, label)``; pixels ``(h, w, c)`` uint8) as
    TFRecorder does into ``root/<JOB>/``: PNGs loaded with PIL, ``image`` the URL-safe
    base64 (altchars ``-_``) of ``image.tobytes()``, ``image_width, image_height = image.size``,
    ``image_channels`` 1 for mode L else 3, ``label`` integerised through a vocabulary of
    the train labels (most frequent first), one GZIP ``<split>-SSSSS-of-NNNNN.tfrecord.gz``
    set per split (tf.io.TFRecordWriter, tf.train.Example), rows with another split value
    in ``discarded-data-00000-of-00001`` (Beam's WriteToText: ``str(row)`` per line; or
    GZIP TFRecord with ``discarded_as="tfrecord"``), and the tf.Transform folders. Returns
    the job folder and the vocabulary."""
    tf = pytest.importorskip("tensorflow")
    job = os.path.join(root, JOB)
    os.makedirs(os.path.join(job, "transform_fn", "assets"), exist_ok=True)
    os.makedirs(os.path.join(job, "transformed_metadata"), exist_ok=True)
    images = os.path.join(root, "images")
    os.makedirs(images, exist_ok=True)
    counts = collections.Counter(label for split, _, _, label in rows if split == "TRAIN")
    vocab = None if integer_label else sorted(counts, key=lambda k: (-counts[k], k))
    if vocab is not None:  # integer labels go through no vocabulary
        with open(os.path.join(job, "transform_fn", "assets", "vocab_compute_and_apply_vocabulary_vocabulary"),
                  "w") as f:
            f.write("".join(v + "\n" for v in vocab))
    with open(os.path.join(job, "transform_fn", "saved_model.pb"), "wb") as f:
        f.write(b"")  # tf.Transform's graph: not read by shardfeed
    with open(os.path.join(job, "transformed_metadata", "schema.pbtxt"), "w") as f:
        f.write("".join(f'feature {{ name: "{n}" type: {t} }}\n' for n, t in
                        [("image", "BYTES"), ("image_channels", "INT"), ("image_height", "INT"),
                         ("image_name", "BYTES"), ("image_width", "INT"), ("label", "INT"), ("split", "BYTES")]))
    by_split = collections.defaultdict(list)
    discarded = []
    for split, name, pixels, label in rows:
        path = os.path.join(images, name)
        Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(path)
        image = Image.open(path)
        feats = {"split": split.encode(), "image_name": os.path.split(path)[-1].encode(),
                 "image": base64.b64encode(image.tobytes(), altchars=b"-_")}
        feats["image_width"], feats["image_height"] = image.size
        feats["image_channels"] = 1 if "L" in image.mode else 3
        if split in ("TRAIN", "VALIDATION", "TEST"):
            feats["label"] = label if integer_label else vocab.index(label)
            by_split[split.lower()].append(feats)
        else:
            feats["label"] = label if integer_label else label.encode()
            discarded.append(feats)
    for split, recs in by_split.items():
        n = (shards or {}).get(split, 1)
        for i in range(n):
            path = os.path.join(job, f"{split}-{i:05d}-of-{n:05d}.tfrecord.gz")
            with tf.io.TFRecordWriter(path, options="GZIP") as w:
                for feats in recs[i::n]:
                    w.write(_example(tf, feats).SerializeToString())
    if discarded_as == "text":
        with open(os.path.join(job, "discarded-data-00000-of-00001"), "w") as f:
            f.write("".join(str(r) + "\n" for r in discarded))
    else:
        path = os.path.join(job, "discarded-data-00000-of-00001.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for feats in discarded:
                w.write(_example(tf, {**feats, "label": -1}).SerializeToString())
    return job, vocab


def _rows():
    return [
        ("TRAIN", "cat-0.png", _pixels(5, 7, 3, 0), "cat"),
        ("TRAIN", "cat-1.png", _pixels(6, 4, 3, 1), "cat"),
        ("TRAIN", "dog-0.png", _pixels(3, 9, 1, 2), "dog"),
        ("TRAIN", "cat-2.png", _pixels(8, 8, 3, 3), "cat"),
        ("TRAIN", "goat-0.png", _pixels(4, 4, 3, 4), "goat"),
        ("VALIDATION", "dog-1.png", _pixels(7, 5, 3, 5), "dog"),
        ("VALIDATION", "cat-3.png", _pixels(2, 3, 1, 6), "cat"),
        ("TEST", "goat-1.png", _pixels(9, 2, 3, 7), "goat"),
        ("HOLDOUT", "dog-2.png", _pixels(3, 3, 3, 8), "dog"),
    ]


@pytest.fixture
def tfrecorder_out(tmp_path):
    rows = _rows()
    job, vocab = write_tfrecorder_output(str(tmp_path / "out"), rows, shards={"train": 2})
    return str(tmp_path / "out"), job, vocab, rows


def _by_name(ds):
    return {r["image_name"].decode(): r for r in ds}


@pytest.mark.parametrize("split,tf_split", [("train", "TRAIN"), ("validation", "VALIDATION"), ("test", "TEST")])
def test_read_dataset_gives_each_split_with_images_equal_to_the_pixels(tfrecorder_out, split, tf_split):
    out, job, vocab, rows = tfrecorder_out
    got = _by_name(sf.read_dataset(out, split=split))
    want = {name: (pixels, label) for s, name, pixels, label in rows if s == tf_split}
    assert set(got) == set(want)
    for name, (pixels, label) in want.items():
        r = got[name]
        assert r["image"].dtype == np.uint8
        assert r["image"].shape == pixels.shape
        np.testing.assert_array_equal(r["image"], pixels)
        assert (int(r["image_height"]), int(r["image_width"]), int(r["image_channels"])) == pixels.shape
        assert vocab[int(r["label"])] == label
        assert r["split"] == tf_split.encode()


def test_read_dataset_takes_the_job_folder_or_its_parent_and_any_split_spelling(tfrecorder_out):
    out, job, _, _ = tfrecorder_out
    from_parent = sorted(_by_name(sf.read_dataset(out, split="VALIDATION")))
    from_job = sorted(_by_name(sf.read_dataset(job, split="val")))
    assert from_parent == from_job == ["cat-3.png", "dog-1.png"]


def test_inferred_spec_is_scalar_per_feature(tfrecorder_out):
    from shardfeed.convert.tfrecorder import find_layout, infer_spec

    out, _, _, _ = tfrecorder_out
    spec = infer_spec(find_layout(out), "train")
    assert spec == {k: sf.FixedLen(t) for k, t in [
        ("image", "bytes"), ("image_channels", "int64"), ("image_height", "int64"), ("image_name", "bytes"),
        ("image_width", "int64"), ("label", "int64"), ("split", "bytes")]}


def test_discarded_rows_read_from_the_text_report(tfrecorder_out):
    out, _, _, rows = tfrecorder_out
    got = list(sf.read_dataset(out, split="discarded-data"))
    assert len(got) == 1
    np.testing.assert_array_equal(got[0]["image"], rows[-1][2])
    assert (got[0]["split"], got[0]["label"], got[0]["image_name"]) == (b"HOLDOUT", b"dog", b"dog-2.png")


def test_discarded_rows_read_when_written_as_gzip_tfrecord(tmp_path):
    rows = _rows()
    write_tfrecorder_output(str(tmp_path), rows, discarded_as="tfrecord")
    got = list(sf.read_dataset(str(tmp_path), split="DISCARD"))
    assert [r["image_name"] for r in got] == [b"dog-2.png"]
    np.testing.assert_array_equal(got[0]["image"], rows[-1][2])


def test_integer_labels_are_kept(tmp_path):
    rows = [("TRAIN", "a.png", _pixels(2, 2, 3, 0), 7), ("TRAIN", "b.png", _pixels(2, 2, 3, 1), 3)]
    write_tfrecorder_output(str(tmp_path), rows, integer_label=True)
    assert [int(r["label"]) for r in sf.read_dataset(str(tmp_path))] == [7, 3]


def test_same_sized_images_batch_into_one_array(tmp_path):
    rows = [("TRAIN", f"{i}.png", _pixels(4, 6, 3, i), "x") for i in range(5)]
    write_tfrecorder_output(str(tmp_path), rows)
    batches = list(sf.read_dataset(str(tmp_path)).batch(2))
    assert [b["image"].shape for b in batches] == [(2, 4, 6, 3), (2, 4, 6, 3), (1, 4, 6, 3)]
    np.testing.assert_array_equal(batches[0]["image"][1], rows[1][2])


def test_missing_split_names_the_splits_there_are(tfrecorder_out):
    out, _, _, _ = tfrecorder_out
    with pytest.raises(ValueError, match=r"no split 'unlabeled'.*train, validation, test, discarded-data"):
        sf.read_dataset(out, split="unlabeled")


def test_several_jobs_in_one_folder_ask_for_the_job_folder(tfrecorder_out):
    out, _, _, rows = tfrecorder_out
    os.makedirs(os.path.join(out, "tfrecorder-20240103-000000-to-tfr"))
    os.link(os.path.join(out, JOB, "test-00000-of-00001.tfrecord.gz"),
            os.path.join(out, "tfrecorder-20240103-000000-to-tfr", "test-00000-of-00001.tfrecord.gz"))
    with pytest.raises(ValueError, match="2 TFRecorder jobs"):
        sf.read_dataset(out, split="test")


def test_a_folder_of_neither_layout_is_not_found(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="manifest"):
        sf.read_dataset(str(tmp_path))


def test_tensorflow_reads_the_same_pixels_back(tfrecorder_out):
    """The helper's encoding is TFRecorder's: tf.io.decode_base64 (web-safe) of ``image``
    gives the same pixels shardfeed returns."""
    tf = pytest.importorskip("tensorflow")
    out, job, _, _ = tfrecorder_out
    files = sorted(os.path.join(job, f) for f in os.listdir(job) if f.startswith("train-"))
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "image_name": tf.io.FixedLenFeature([], tf.string)}
    theirs = {}
    for rec in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        ex = tf.io.parse_single_example(rec, spec)
        theirs[ex["image_name"].numpy().decode()] = tf.io.decode_base64(ex["image"]).numpy()
    ours = _by_name(sf.read_dataset(out))
    assert set(theirs) == set(ours)
    for name, raw in theirs.items():
        assert raw == ours[name]["image"].tobytes()


def test_inspect_summarises_splits_schema_and_draws_images(tfrecorder_out, tmp_path, capsys):
    out, job, vocab, rows = tfrecorder_out
    dest = str(tmp_path / "inspect")
    assert cli_main(["inspect", out, "--out", dest, "--images", "2"]) == 0
    text = capsys.readouterr().out
    assert "TFRecorder output" in text
    assert "train=5" in text and "validation=2" in text and "test=1" in text and "discarded-data=1" in text
    assert "image_height" in text and "FixedLen('int64')" in text
    assert "labels: cat, dog, goat" in text
    pngs = sorted(f for f in os.listdir(dest) if f.endswith(".png"))
    assert pngs == ["discarded-data-000.png", "test-000.png", "train-000.png", "train-001.png",
                    "validation-000.png", "validation-001.png"]
    first_train = sf.read_dataset(out).take(1)
    want = next(iter(first_train))["image"]
    drawn = np.asarray(Image.open(os.path.join(dest, "train-000.png")).convert("RGB"))
    assert drawn.shape[:2] == want.shape[:2]
    with open(os.path.join(dest, "samples.csv"), encoding="utf-8") as f:
        csv_text = f.read()
    assert "label_name" in csv_text and "cat" in csv_text and "base64" not in csv_text
    assert "train,train-00000-of-00002.tfrecord.gz,train-000.png" in csv_text  # the split, then the record's
    assert "record_split" in csv_text and "HOLDOUT" in csv_text

    assert cli_main(["inspect", job, "--out", dest, "--images", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layout"] == "tfrecorder"
    assert summary["splits"] == {"train": 5, "validation": 2, "test": 1, "discarded-data": 1}
    assert summary["labels"] == vocab
    assert summary["schema"]["features"]["image"]["suggested_spec"] == "FixedLen('bytes')"


def test_inspect_of_one_tfrecorder_shard_reports_its_features(tfrecorder_out, capsys):
    out, job, _, _ = tfrecorder_out
    assert cli_main(["inspect", os.path.join(job, "test-00000-of-00001.tfrecord.gz")]) == 0
    text = capsys.readouterr().out
    assert "1 records sampled from 1 file(s)" in text and "image_width" in text


def _png(path, h, w, seed):
    a = _pixels(h, w, 3, seed)
    Image.fromarray(a).save(path)
    return a


def test_seed_one_liner_runs_through_the_tensorflow_accessor(tmp_path):
    pd = pytest.importorskip("pandas")
    images = {}
    rows = []
    for i, (split, label) in enumerate([("TRAIN", "cat"), ("TRAIN", "dog"), ("TRAIN", "cat"),
                                        ("VALIDATION", "dog"), ("TEST", "cat")]):
        path = str(tmp_path / f"img{i}.png")
        images[path] = _png(path, 6 + i, 5, i)
        rows.append((split, path, label))
    df = pd.DataFrame(rows, columns=["split", "image_uri", "label"])
    out = str(tmp_path / "bucket")
    result = df.tensorflow.to_tfrecord(output_dir=out, image_format="png")
    assert result.records_written == 5
    assert {k: v["records"] for k, v in result.splits.items()} == {"train": 3, "validation": 1, "test": 1}
    train = list(sf.read_dataset(out, split="train"))
    assert len(train) == 3
    from io import BytesIO

    decoded = sorted(np.asarray(Image.open(BytesIO(r["image/encoded"]))).tobytes() for r in train)
    assert decoded == sorted(a.tobytes() for p, a in images.items() if p.endswith(("img0.png", "img1.png",
                                                                                   "img2.png")))
    again = df.tensorflow.to_tfr(output_dir=str(tmp_path / "b2"), runner="DirectRunner", compression="gzip")
    assert again.records_written == 5 and again.manifest["compression"] == "GZIP"


def test_tensorflow_accessor_translates_dataflow_options():
    from shardfeed.convert.pandas_accessor import tfrecorder_options

    assert tfrecorder_options({"runner": "DataFlowRunner", "project": "p", "region": "us-central1"}) == {
        "runner": "beam", "beam_runner": "DataflowRunner", "beam_options": {"project": "p", "region": "us-central1"}}
    assert tfrecorder_options({"runner": "DirectRunner", "num_shards": 0}) == {"runner": "local"}
    with pytest.raises(ValueError, match="num_samples_per_tfrecord"):
        tfrecorder_options({"num_shards": 4})
    with pytest.raises(ValueError, match="schema="):
        tfrecorder_options({"schema_map": {}})


def _accessor_type(code_before: str, env=None) -> str:
    code = code_before + ("import shardfeed, pandas as pd\n"
                          "print(type(pd.DataFrame({'a': [1]}).tensorflow).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_tensorflow_accessor_is_registered_lazily_when_free():
    pytest.importorskip("pandas")
    assert _accessor_type("") == "TFRecorderAccessor"


def test_an_existing_tensorflow_accessor_is_left_alone():
    pytest.importorskip("pandas")
    before = ("import pandas as pd\n"
              "@pd.api.extensions.register_dataframe_accessor('tensorflow')\n"
              "class Theirs:\n"
              "    def __init__(self, df): pass\n")
    assert _accessor_type(before) == "Theirs"


def test_no_alias_when_tfrecorder_is_installed(tmp_path):
    pytest.importorskip("pandas")
    (tmp_path / "tfrecorder").mkdir()
    (tmp_path / "tfrecorder" / "__init__.py").write_text("")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    code = ("import shardfeed, pandas as pd\n"
            "print(hasattr(pd.DataFrame({'a': [1]}), 'tensorflow'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"

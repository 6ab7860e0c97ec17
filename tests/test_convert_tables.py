"""Conversion of CSVs, DataFrames and image folders: layouts, schemas, defaults, splits,
class lists, bad rows, and the manifest the reader builds its spec from."""

from __future__ import annotations

import csv
import io
import json
import os

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image

# `shardfeed.convert` is also the name of the function sf.convert: import the package's api module.
from shardfeed.convert import api as sc
from shardfeed.convert.plan import key_split
from shardfeed.formats.example import decode_example
from shardfeed.formats.tfrecord import read_records


def make_jpeg(path, w=64, h=48, value=100):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    a = np.full((h, w, 3), value, np.uint8)
    a[:, : w // 2, 0] = 255 - value
    Image.fromarray(a).save(path, "JPEG", quality=90)
    return path


def write_csv(path, rows, header=("split", "image_uri", "label")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        w.writerows(rows)
    return str(path)


def records(out, split, prefix="data"):
    m = sc.load_manifest(out)
    recs = []
    for s in m["splits"].get(split, {}).get("shards", []):
        recs.extend(decode_example(r) for r in read_records(os.path.join(out, s["file"])))
    return recs


def discards(out, prefix="data"):
    with open(os.path.join(out, f"{prefix}-discards.csv"), encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_automl_csv_gives_split_shards_manifest_and_index_files(tmp_path):
    for i in range(6):
        make_jpeg(tmp_path / "img" / f"{i}.jpg", value=20 * i)
    rows = [("TRAIN", f"img/{i}.jpg", "cat" if i % 2 else "dog") for i in range(4)]
    rows += [("validation", "img/4.jpg", "cat"), ("Test", "img/5.jpg", "dog")]
    out = str(tmp_path / "out")
    res = sc.convert(write_csv(tmp_path / "a.csv", rows), out, num_samples_per_tfrecord=3, progress=False)
    assert (res.rows_read, res.records_written, res.rows_discarded) == (6, 6, 0)
    names = sorted(n for n in os.listdir(out) if n.endswith(".tfrecord"))
    assert names == ["data-test-00000-of-00001.tfrecord", "data-train-00000-of-00002.tfrecord",
                     "data-train-00001-of-00002.tfrecord", "data-validation-00000-of-00001.tfrecord"]
    assert all(os.path.exists(os.path.join(out, n + ".idx")) for n in names)
    m = res.manifest
    assert m["classes"] == ["cat", "dog"] and m["label_map"]["label_map"] == {"cat": 0, "dog": 1}
    assert [s["records"] for s in m["splits"]["train"]["shards"]] == [3, 1]
    assert m["source"]["digest"].startswith("sha256:") and m["shardfeed_version"]
    train = records(out, "train")
    assert [int(r["image/class/label"][0]) for r in train] == [1, 0, 1, 0]
    assert train[0]["image/class/text"] == [b"dog"] and train[0]["image/format"] == [b"jpeg"]
    assert int(train[0]["image/height"][0]) == 48 and int(train[0]["image/width"][0]) == 64


def test_read_dataset_builds_its_spec_from_the_manifest(tmp_path):
    for i in range(3):
        make_jpeg(tmp_path / f"{i}.jpg")
    out = str(tmp_path / "out")
    sc.convert(write_csv(tmp_path / "a.csv", [("TRAIN", f"{i}.jpg", "a") for i in range(3)]), out, progress=False)
    batch = next(iter(sc.read_dataset(out, "train").batch(3)))
    assert list(batch["image/class/label"]) == [0, 0, 0]
    assert batch["image/height"].tolist() == [48, 48, 48]
    with pytest.raises(ValueError, match="no shards for split 'test'"):
        sc.read_dataset(out, "test")


def test_integer_labels_are_kept_as_label_ids(tmp_path):
    for i in range(2):
        make_jpeg(tmp_path / f"{i}.jpg")
    out = str(tmp_path / "out")
    res = sc.convert(write_csv(tmp_path / "a.csv", [("TRAIN", "0.jpg", "7"), ("TRAIN", "1.jpg", "3")], header=None),
                     out, progress=False)
    assert res.manifest["classes"] is None
    assert "image/class/text" not in res.manifest["feature_spec"]
    assert [int(r["image/class/label"][0]) for r in records(out, "train")] == [7, 3]


def test_bad_rows_are_discarded_with_row_numbers_and_counts_add_up(tmp_path):
    make_jpeg(tmp_path / "ok.jpg")
    (tmp_path / "notes.jpg").write_text("not an image")
    (tmp_path / "broken.jpg").write_bytes((tmp_path / "ok.jpg").read_bytes()[:200])
    rows = [("TRAIN", "ok.jpg", "a"), ("TRAIN", "missing.jpg", "a"), ("TRAIN", "notes.jpg", "a"),
            ("TRAIN", "broken.jpg", "a"), ("SOMETIMES", "ok.jpg", "a"), ("TRAIN", "", "a"),
            ("TRAIN", "bomb.png", "a")]
    Image.new("L", (2000, 1000)).save(tmp_path / "bomb.png")
    path = write_csv(tmp_path / "a.csv", rows)
    with open(path, "a", encoding="utf-8") as f:
        f.write("TRAIN,ok.jpg\n")  # a short row
    out = str(tmp_path / "out")
    res = sc.convert(path, out, max_image_pixels=1_000_000, progress=False)
    assert res.rows_read == 8 and res.records_written == 1 and res.rows_discarded == 7
    got = {int(d["row"]): d["reason"] for d in discards(out)}
    assert set(got) == {2, 3, 4, 5, 6, 7, 8}
    assert "not found" in got[2] and "not an image" in got[3] and "corrupt" in got[4]
    assert "unknown split" in got[5] and "empty" in got[6] and "decompression bomb" in got[7]
    assert "expected 3 cells" in got[8]


def test_commas_quotes_and_unicode_in_paths_and_labels_survive(tmp_path):
    name = 'photo, "best" 猫 é.jpg'
    make_jpeg(tmp_path / "imgs" / name)
    out = str(tmp_path / "out")
    res = sc.convert(write_csv(tmp_path / "a.csv", [("TRAIN", f"imgs/{name}", 'chat, "noir" 猫')]), out,
                     progress=False)
    assert res.records_written == 1
    r = records(out, "train")[0]
    assert r["image/class/text"] == ['chat, "noir" 猫'.encode()]
    assert r["image/source_id"][0].decode().endswith(name)


def test_empty_csv_finishes_with_an_empty_manifest(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    out = str(tmp_path / "out")
    res = sc.convert(str(tmp_path / "empty.csv"), out, progress=False)
    assert (res.rows_read, res.records_written, res.rows_discarded) == (0, 0, 0)
    assert res.splits == {} and os.path.exists(os.path.join(out, "data-manifest.json"))


def test_class_list_maps_names_and_sends_unknown_to_default_or_discards(tmp_path):
    for i in range(3):
        make_jpeg(tmp_path / f"{i}.jpg")
    (tmp_path / "classes.txt").write_text("kitten:cat\ncat\npuppy:dog\n")
    rows = [("TRAIN", "0.jpg", "kitten"), ("TRAIN", "1.jpg", "puppy"), ("TRAIN", "2.jpg", "horse")]
    path = write_csv(tmp_path / "a.csv", rows)
    out = str(tmp_path / "strict")
    res = sc.convert(path, out, class_list_file=str(tmp_path / "classes.txt"), progress=False)
    assert res.manifest["classes"] == ["cat", "dog"]
    assert [r["image/class/text"] for r in records(out, "train")] == [[b"cat"], [b"dog"]]
    assert "not in the class list" in discards(out)[0]["reason"]
    out2 = str(tmp_path / "default")
    res2 = sc.convert(path, out2, class_list_file=str(tmp_path / "classes.txt"), default_class="other",
                      progress=False)
    assert res2.manifest["classes"] == ["cat", "dog", "other"] and res2.records_written == 3
    assert records(out2, "train")[2]["image/class/label"].tolist() == [2]


def test_error_class_rows_are_dropped(tmp_path):
    for i in range(2):
        make_jpeg(tmp_path / f"{i}.jpg")
    out = str(tmp_path / "out")
    res = sc.convert(write_csv(tmp_path / "a.csv", [("TRAIN", "0.jpg", "cat"), ("TRAIN", "1.jpg", "blurry")]),
                     out, error_class="blurry", progress=False)
    assert res.records_written == 1 and res.manifest["classes"] == ["cat"]
    assert "error class" in discards(out)[0]["reason"]


def test_rows_of_the_same_label_get_the_same_labels_and_the_same_discards(tmp_path):
    # labels are resolved once per label value: every row of a value must still get them
    for i in range(6):
        make_jpeg(tmp_path / f"{i}.jpg")
    rows = [("TRAIN", f"{i}.jpg", name) for i, name in enumerate(["cat", "blurry", "dog", "cat", "blurry", "dog"])]
    out = str(tmp_path / "out")
    res = sc.convert(write_csv(tmp_path / "a.csv", rows), out, error_class="blurry", progress=False)
    assert (res.records_written, res.rows_discarded) == (4, 2)
    got = records(out, "train")
    assert [list(r["image/class/text"]) for r in got] == [[b"cat"], [b"dog"], [b"cat"], [b"dog"]]
    assert [list(r["image/class/label"]) for r in got] == [[0], [1], [0], [1]]
    assert [d["reason"] for d in discards(out)] == ["label 'blurry' is the error class"] * 2


def test_user_schema_types_defaults_and_missing_values(tmp_path):
    make_jpeg(tmp_path / "x.jpg")
    header = ("path", "kind", "weight", "count", "tags", "scores", "fold")
    rows = [("x.jpg", "a", "0.5", "3", "red;green", "1.5;2", "train"),
            ("x.jpg", "b", "", "4", "", "", "test"),     # weight missing: default
            ("x.jpg", "a", "1.0", "", "blue", "1", "train"),  # count missing: no default -> discarded
            ("x.jpg", "a", "1.0", "two", "blue", "1", "train")]
    path = write_csv(tmp_path / "s.csv", rows, header=header)
    schema = {"path": "image_uri", "kind": "string label", "weight": "float", "count": "int",
              "tags": "string list", "scores": "float list", "fold": "split"}
    out = str(tmp_path / "out")
    res = sc.convert(path, out, schema=schema, defaults={"weight": 9.0}, progress=False)
    assert (res.rows_read, res.records_written, res.rows_discarded) == (4, 2, 2)
    reasons = {int(d["row"]): d["reason"] for d in discards(out)}
    assert "'count' is missing and has no default" in reasons[3] and "not an integer" in reasons[4]
    train, test = records(out, "train")[0], records(out, "test")[0]
    assert train["tags"] == [b"red", b"green"] and train["scores"].tolist() == [1.5, 2.0]
    assert train["count"].tolist() == [3] and test["weight"].tolist() == [9.0] and test["tags"] == []
    spec = sc.manifest_spec(res.manifest)
    assert type(spec["tags"]).__name__ == "VarLen" and spec["weight"].dtype == "float32"


def test_dataframe_and_pandas_accessor_give_the_same_records_as_the_csv(tmp_path):
    pd = pytest.importorskip("pandas")
    for i in range(3):
        make_jpeg(tmp_path / f"{i}.jpg", value=30 * i)
    rows = [("TRAIN", str(tmp_path / f"{i}.jpg"), "ab"[i % 2]) for i in range(3)]
    a = sc.convert(write_csv(tmp_path / "a.csv", rows), str(tmp_path / "csv"), progress=False)
    df = pd.DataFrame(rows, columns=["split", "image_uri", "label"])
    b = sc.convert(df, str(tmp_path / "df"), progress=False)
    c = df.shardfeed.to_tfrecord(str(tmp_path / "acc"), progress=False)
    assert a.records_written == b.records_written == c.records_written == 3
    assert records(str(tmp_path / "csv"), "train") == records(str(tmp_path / "df"), "train")
    assert records(str(tmp_path / "df"), "train") == records(str(tmp_path / "acc"), "train")


def test_dataframe_missing_values_use_defaults_or_are_rejected(tmp_path):
    pd = pytest.importorskip("pandas")
    make_jpeg(tmp_path / "x.jpg")
    df = pd.DataFrame({"img": [str(tmp_path / "x.jpg")] * 3, "y": [1, None, 2], "w": [0.5, 0.25, None]})
    out = str(tmp_path / "out")
    res = sc.convert(df, out, schema={"img": "image_uri", "y": "integer label", "w": "float"},
                     defaults={"w": -1.0}, progress=False)
    assert res.records_written == 2 and discards(out)[0]["row"] == "2"
    assert [r["w"].tolist() for r in records(out, "train")] == [[0.5], [-1.0]]


def test_test_ratio_split_is_a_seeded_function_of_each_row(tmp_path):
    for i in range(20):
        make_jpeg(tmp_path / "d" / f"{i}.jpg", w=8, h=8)
    rows = [("", f"d/{i}.jpg", "a") for i in range(20)]
    path = write_csv(tmp_path / "a.csv", rows)
    ids = []
    for k in range(2):
        out = str(tmp_path / f"o{k}")
        res = sc.convert(path, out, test_ratio=0.25, seed=3, progress=False)
        assert res.splits["test"]["records"] + res.splits["train"]["records"] == 20
        assert 0 < res.splits["test"]["records"] < 20
        ids.append(sorted(r["image/source_id"] for r in records(out, "test")))
    assert ids[0] == ids[1]
    # the same rows in another order (as another partitioning would read them): the same test set
    shuffled = write_csv(tmp_path / "b.csv", rows[::-1])
    sc.convert(shuffled, str(tmp_path / "o_rev"), test_ratio=0.25, seed=3, progress=False)
    assert sorted(r["image/source_id"] for r in records(str(tmp_path / "o_rev"), "test")) == ids[0]
    # and each row's split does not depend on the other rows: a subset keeps its rows' splits
    half = write_csv(tmp_path / "h.csv", rows[:10])
    sc.convert(half, str(tmp_path / "o_half"), test_ratio=0.25, seed=3, progress=False)
    assert sorted(r["image/source_id"] for r in records(str(tmp_path / "o_half"), "test")) == \
        [i for i in ids[0] if int(os.path.basename(i[0].decode()).split(".")[0]) < 10]
    other = sc.convert(path, str(tmp_path / "o9"), test_ratio=0.25, seed=4, progress=False)
    assert sorted(r["image/source_id"] for r in records(str(tmp_path / "o9"), "test")) != ids[0]
    assert other.records_written == 20


def test_key_split_ratio_seed_and_split_key():
    from shardfeed.convert.options import ConvertOptions, Row
    from shardfeed.convert.plan import assign_split, key_split

    n = 20_000
    for ratio in (0.1, 0.25, 0.5):
        test = sum(key_split(f"img/{i}.jpg", ratio, 0) == "test" for i in range(n))
        sd = (n * ratio * (1 - ratio)) ** 0.5
        assert abs(test - n * ratio) < 4 * sd, (ratio, test)
    assert all(key_split(i, 0.0, 0) == "train" for i in range(1000))
    a = [key_split(i, 0.5, 1) for i in range(200)]
    assert a == [key_split(i, 0.5, 1) for i in range(200)] and a != [key_split(i, 0.5, 2) for i in range(200)]
    # split_key: rows sharing the key's value (one patient, one video) share a split
    opts = ConvertOptions(test_ratio=0.5, split_key="group")
    rows = [Row(i, "x", f"{i}.jpg", None, "a", {"group": i % 7}) for i in range(100)]
    for r in rows:
        assign_split(r, opts)
    by_group = {}
    for r in rows:
        by_group.setdefault(r.values["group"], set()).add(r.split)
    assert all(len(s) == 1 for s in by_group.values()) and len({next(iter(s)) for s in by_group.values()}) == 2
    with pytest.raises(ValueError, match="split_key 'nope' names no column"):
        assign_split(Row(1, "x", "1.jpg", None, "a", {"group": 1}), ConvertOptions(test_ratio=0.5, split_key="nope"))


def test_image_folder_layouts(tmp_path):
    for split in ("train", "TEST"):
        for label in ("cat", "dog"):
            make_jpeg(tmp_path / "a" / split / label / "1.jpg")
    (tmp_path / "a" / "train" / "stray.jpg").write_bytes(b"x")
    res = sc.convert(str(tmp_path / "a"), str(tmp_path / "oa"), progress=False)
    assert res.splits["train"]["records"] == 2 and res.splits["test"]["records"] == 2
    assert res.rows_discarded == 1 and "layout" in discards(str(tmp_path / "oa"))[0]["reason"]
    # The split key holds the image's absolute path, so which images go to test changes with
    # tmp_path: 40 images leave none in test once in 0.6**40 (1e-9) runs; 10 did once in 170.
    for label in ("x", "y"):
        for i in range(20):
            make_jpeg(tmp_path / "b" / label / f"{i}.jpg", w=8, h=8)
    res = sc.convert(str(tmp_path / "b"), str(tmp_path / "ob"), test_ratio=0.4, progress=False)
    assert res.records_written == 40 and res.manifest["classes"] == ["x", "y"]
    assert 0 < res.splits["test"]["records"] == sum(
        key_split([os.path.join(str(tmp_path / "b"), label, f"{i}.jpg"), label, {}, None], 0.4, 0) == "test"
        for label in ("x", "y") for i in range(20))


def test_resize_options_apply_per_split_and_png_output(tmp_path):
    make_jpeg(tmp_path / "big.jpg", w=400, h=200)
    path = write_csv(tmp_path / "a.csv", [("TRAIN", "big.jpg", "a"), ("TEST", "big.jpg", "a")])
    out = str(tmp_path / "out")
    sc.convert(path, out, max_image_size=100, max_test_image_size=50, image_format="png", progress=False)
    tr, te = records(out, "train")[0], records(out, "test")[0]
    assert (int(tr["image/width"][0]), int(tr["image/height"][0])) == (100, 50)
    assert (int(te["image/width"][0]), int(te["image/height"][0])) == (50, 25)
    assert Image.open(io.BytesIO(tr["image/encoded"][0])).format == "PNG" and tr["image/format"] == [b"png"]


def test_gzip_output_has_no_index_and_reads_back(tmp_path):
    make_jpeg(tmp_path / "x.jpg")
    out = str(tmp_path / "out")
    sc.convert(write_csv(tmp_path / "a.csv", [("TRAIN", "x.jpg", "a")]), out, compression="GZIP", progress=False)
    names = sorted(os.listdir(out))
    assert "data-train-00000-of-00001.tfrecord.gz" in names and not any(n.endswith(".idx") for n in names)
    assert len(list(sc.read_dataset(out, "train"))) == 1


def test_bad_options_are_rejected_with_a_fix(tmp_path):
    with pytest.raises(ValueError, match="image_format"):
        sc.convert("x.csv", str(tmp_path), image_format="gif")
    with pytest.raises(TypeError, match="unknown conversion option"):
        sc.convert("x.csv", str(tmp_path), max_size=3)
    with pytest.raises(ValueError, match="convert_annotations"):
        sc.convert("x.csv", str(tmp_path), model_type="DETECTION")


@pytest.mark.tf
def test_tensorflow_parses_the_output_with_the_manifest_spec(tmp_path):
    tf = pytest.importorskip("tensorflow")
    make_jpeg(tmp_path / "x.jpg", w=40, h=30)
    out = str(tmp_path / "out")
    sc.convert(write_csv(tmp_path / "a.csv", [("TRAIN", "x.jpg", "a")]), out, progress=False)
    with open(os.path.join(out, "data-manifest.json")) as f:
        m = json.load(f)
    feats = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
             "image/class/label": tf.io.FixedLenFeature([], tf.int64),
             "image/height": tf.io.FixedLenFeature([], tf.int64)}
    files = [os.path.join(out, s["file"]) for s in m["splits"]["train"]["shards"]]
    ex = next(iter(tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, feats))))
    assert tf.io.decode_jpeg(ex["image/encoded"]).shape == (30, 40, 3)
    assert int(ex["image/class/label"]) == 0 and int(ex["image/height"]) == 30


def test_pandas_accessor_registers_lazily_when_pandas_is_imported_later():
    pytest.importorskip("pandas")
    import subprocess
    import sys

    code = ("import sys, shardfeed.convert\n"
            "assert 'pandas' not in sys.modules, 'pandas imported eagerly'\n"
            "import pandas as pd\n"
            "print(type(pd.DataFrame({'a': [1]}).shardfeed).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ShardfeedAccessor"


def test_stale_shards_from_an_older_conversion_are_reported_not_read(tmp_path, caplog):
    for i in range(4):
        make_jpeg(tmp_path / f"{i}.jpg")
    path = write_csv(tmp_path / "a.csv", [("TRAIN", f"{i}.jpg", "a") for i in range(4)])
    out = str(tmp_path / "out")
    sc.convert(path, out, num_samples_per_tfrecord=1, progress=False)
    with caplog.at_level("WARNING", logger="shardfeed.convert.api"):
        sc.convert(path, out, num_samples_per_tfrecord=2, progress=False)
    assert "did not write" in caplog.text
    assert len(list(sc.read_dataset(out, "train"))) == 4


def test_source_digest_is_sha256_of_each_rows_canonical_json_line():
    import hashlib

    from shardfeed.convert.options import DiscardRecord, Row
    from shardfeed.convert.plan import _canon, source_digest

    rows = [Row(1, "in.csv", "/a/1.jpg", None, "cat"),  # plain: the fast path
            Row(2, "in.csv", None, "test", 7, {"x": 1.5, "é": np.float32(2.0), "ids": [1, np.int64(2)]}),
            Row(3, "in.csv", "/a/3.jpg", "train", np.int64(4), {}, {"classes": ["a", "b"]}),
            Row(4, "in.csv", "/a/ü.jpg", None, 0.25),
            Row(5, "in.csv", "/a/5.jpg", None, b"\x00\xff", {"b": None, "a": True})]
    discards = [DiscardRecord(6, "in.csv#6", "expected 3 cells, found 2")]
    h = hashlib.sha256()
    for r in rows:  # the rule, as the docstring states it
        v = _canon([r.number, r.origin, r.image_uri, r.split, r.label, r.values, r.annotation])
        h.update(json.dumps(v, ensure_ascii=False, sort_keys=True).encode() + b"\n")
    for d in discards:
        h.update(json.dumps([d.row, d.source, d.reason], ensure_ascii=False).encode() + b"\n")
    assert source_digest(rows, discards) == "sha256:" + h.hexdigest()
    assert source_digest(rows[:1], []) != source_digest([Row(1, "in.csv", "/a/1.jpg", None, "dog")], [])
    # the plan's way: each row's values made canonical JSON once and spliced into the line
    from shardfeed.convert.plan import canon_values

    assert source_digest(rows, discards, canon_values(rows)) == "sha256:" + h.hexdigest()


def test_splits_assigned_with_the_values_json_made_once_are_key_splits_rule():
    from shardfeed.convert.options import Row
    from shardfeed.convert.plan import assign_splits, canon_values, split_key_value

    def rows():
        return [Row(i, "in.csv", None if i % 3 else f"/a/{i}.jpg", None, ["cat", 7, np.int64(2), None][i % 4],
                    {"x": i / 7, "é": f"v{i}", "ids": [i, np.int64(i + 1)], "n": None, "f": np.float32(i) / 3}
                    if i % 5 else {}, {"classes": ["a", str(i)]} if i % 7 == 0 else None) for i in range(400)]

    spliced, direct = rows(), rows()
    assign_splits(spliced, 0.3, 5, None, canon_values(spliced))
    want = [key_split(split_key_value(r, None), 0.3, 5) for r in direct]
    assert [r.split for r in spliced] == want and 60 < want.count("test") < 180


def test_the_plans_digest_and_splits_made_chunk_by_chunk_equal_digest_then_splits():
    from shardfeed.convert.options import ConvertOptions, DiscardRecord, Row
    from shardfeed.convert.plan import _DIGEST_ROWS, assign_splits, digest_and_assign, source_digest

    def rows():  # more than one chunk; some rows with their own split, which the digest includes
        return [Row(i, "in.csv", None, ["train", None, None][i % 3], i % 4,
                    {"x": i / 3, "s": f"é{i}", "l": [i, 2]} if i % 9 else {}) for i in range(2 * _DIGEST_ROWS + 17)]

    discards = [DiscardRecord(7, "in.csv#7", "bad")]
    options = ConvertOptions(test_ratio=0.25, seed=3)
    chunked, plain = rows(), rows()
    digest = digest_and_assign(chunked, discards, options)
    assert digest == source_digest(plain, discards)
    assign_splits(plain, 0.25, 3)
    assert [r.split for r in chunked] == [r.split for r in plain]
    assert 0.15 < sum(r.split == "test" for r in chunked) / len(chunked) < 0.25


def test_dataframe_rows_equal_those_of_its_itertuples_for_every_column_dtype():
    # read_dataframe takes whole columns (tolist where it gives what iterating gives): the rows
    # and discards must be those the row-by-row iteration gives, for every kind of column
    import pandas as pd

    from shardfeed.convert.schema import Schema
    from shardfeed.convert.sources import read_dataframe, rows_from_records

    n = 60
    df = pd.DataFrame({
        "label": pd.Series([i % 3 if i % 11 else None for i in range(n)], dtype="Int64"),
        "flag": pd.Series([bool(i % 2) if i % 7 else None for i in range(n)], dtype="boolean"),
        "cat": pd.Series([["a", "b", None][i % 3] for i in range(n)], dtype="category"),
        "s": pd.Series([f"v{i}" if i % 5 else None for i in range(n)], dtype=str),
        "sp": pd.Series([f"p{i}" if i % 6 else None for i in range(n)], dtype="string[python]"),
        "f32": np.arange(n, dtype=np.float32) / 4,
        "u8": np.arange(n, dtype=np.uint8),
        "ids": pd.Series([[i, i + 1] if i % 4 else None for i in range(n)], dtype=object),
        "when": pd.to_datetime([f"2020-01-{i % 28 + 1:02d}" for i in range(n)]),
        "extra": np.zeros(n),
    })
    df.insert(0, "dup", np.ones(n, np.int64))
    schema = Schema({"label": "integer label", "flag": "int", "cat": "string", "s": "string", "sp": "string",
                     "f32": "float", "u8": "int", "ids": "int list", "when": "string", "dup": "int"},
                    defaults={"s": "none", "cat": "?"})
    rows, discards, _ = read_dataframe(df, schema)
    names = list(df.columns)
    want_rows, want_discards = rows_from_records(
        ((i, {str(names[j]): v for j, v in enumerate(t)}, None)
         for i, t in enumerate(df.itertuples(index=False, name=None), start=1)), schema, "<DataFrame>", None)
    assert rows == want_rows and discards == want_discards
    assert len(rows) > 20 and len(discards) > 5 and all(r.values["dup"] == 1 for r in rows)
    assert {r.values["flag"] for r in rows} == {0, 1}  # a nullable boolean's np.bool_ is an int, not "True"


@pytest.mark.parametrize("names", [["id", "a", "a"], ["id", 1, "1"]])
def test_a_dataframe_naming_a_schema_column_twice_is_refused_not_read_from_one_of_them(tmp_path, names):
    """Found from outside: a DataFrame with two columns named ``a`` (a merge, a concat) wrote
    the last one's cells and dropped the first's without a word, where a CSV header naming a
    column twice is refused. Names are compared as text (``1`` and ``"1"`` are one name)."""
    import pandas as pd

    import shardfeed as sf

    df = pd.DataFrame([[0, 111, 222]], columns=names)
    a = str(names[1])
    with pytest.raises(ValueError, match=f"the DataFrame has 2 columns named '{a}'"):
        sf.convert(df, str(tmp_path / "out"), schema={"id": "int", a: "int"}, progress=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.tfrecord"))
    # a repeated name the schema does not use is no question: the rest converts
    df = pd.DataFrame([[0, 111, 222, 5]], columns=[*names, "b"])
    got = sf.convert(df, str(tmp_path / "out2"), schema={"id": "int", "b": "int"}, progress=False)
    assert got.manifest["counts"]["records_written"] == 1


def test_csv_lines_of_blank_cells_are_no_rows_and_the_rest_keep_their_numbers(tmp_path):
    from shardfeed.convert.schema import Schema
    from shardfeed.convert.sources import read_csv

    p = tmp_path / "t.csv"
    p.write_text("label,x,name\n1,2.5,a\n\n,,\n , \t ,\n0,,b\n2, ,\u00a0c\n , 1.5,\n")
    rows, discards, _ = read_csv(str(p), Schema({"label": "integer label", "x": "float", "name": "string"},
                                                defaults={"x": -1.0, "name": "?"}))
    assert [(r.number, r.label, r.values) for r in rows] == [
        (1, 1, {"x": 2.5, "name": "a"}), (2, 0, {"x": -1.0, "name": "b"}), (3, 2, {"x": -1.0, "name": "\u00a0c"})]
    assert [(d.row, d.reason) for d in discards] == [(4, "column 'label' is missing and has no default")]


def test_a_header_naming_a_column_twice_is_refused_naming_file_and_column(tmp_path):
    """``id,id`` was converted with the first column's cells silently dropped."""
    path = tmp_path / "dup.csv"
    path.write_text("id,id\n1,2\n")
    with pytest.raises(ValueError, match=r"dup\.csv: the header names column 'id' twice"):
        sc.convert(str(path), str(tmp_path / "out"), schema={"id": "int"}, test_ratio=0.0, progress=False)

"""PAI annotation CSVs and iTAG manifests for every model type: well-formed rows become
the features tf.data users expect; malformed rows (like the documentation's own
examples) are reported and discarded without stopping the job."""

from __future__ import annotations

import csv
import io
import json
import os
import textwrap

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image

from shardfeed.convert import Discard

# `shardfeed.convert` is also the name of the function sf.convert: import the package's api module.
from shardfeed.convert import api as sc
from shardfeed.formats.example import decode_example
from shardfeed.formats.spec import FixedLen
from shardfeed.formats.tfrecord import read_records


def jpeg(path, w=200, h=100):
    Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(path, "JPEG")
    return str(path)


def pai_csv(path, rows):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["#数据ID", "原始数据", "融合答案"])
    for i, (url, answer) in enumerate(rows, start=1):
        w.writerow([i, json.dumps({"url": url}), answer if isinstance(answer, str) else json.dumps(answer,
                                                                                                 ensure_ascii=False)])
    path.write_text(buf.getvalue(), encoding="utf-8")
    return str(path)


def obj(cls, coord, **extra):
    return {"text": json.dumps({"class*": cls, **extra}, ensure_ascii=False), "coord": [str(c) for c in coord]}


def all_records(out):
    m = sc.load_manifest(out)
    return [decode_example(r) for sp in m["splits"].values() for s in sp["shards"]
            for r in read_records(os.path.join(out, s["file"]))]


def reasons(out):
    with open(os.path.join(out, "data-discards.csv"), encoding="utf-8") as f:
        return {int(d["row"]): d["reason"] for d in csv.DictReader(f)}


# Rows copied from the PAI documentation: they are malformed as printed there.
DOC_MULTILABEL = '1,"{""url"":""http://a.jpg""}","{[""option"":""护照"", ""option"":""身份证""]}"\n'
DOC_SEGMENTATION = '1,"{""http://a.jpg""}","{""ossUrl"":""http://ossgw.alicdn.com/a.png""}"\n'
DOC_DETECTION_2 = textwrap.dedent('''\
    2,"{"url"": ""http://a.jpg""}","[{""text"": ""{\\""たれ": \\""类别1\\"", ""coord": [""
    338.35"", ""8.53"", ""700.16"", ""8.53"", ""700.16"", ""50.35"", ""338.35"", ""50.35""]}, {
    ""text": ""{\\""class*\\"": \\""类别2\\""}", ""coord": [""26.88"", ""64.00"", ""218.03"", ""64.00"", ""218.03"", ""99.84""]}]"
    ''')


def test_classification_single_and_multi_label(tmp_path):
    a, b = jpeg(tmp_path / "a.jpg"), jpeg(tmp_path / "b.jpg")
    out = str(tmp_path / "single")
    res = sc.convert_annotations(pai_csv(tmp_path / "c.csv", [(a, {"option": "护照"}), (b, {"option": "身份证"})]),
                                 out, model_type="CLASSIFICATION", progress=False)
    assert res.records_written == 2 and res.manifest["classes"] == ["护照", "身份证"]
    assert [r["image/class/text"] for r in all_records(out)] == [["护照".encode()], ["身份证".encode()]]
    out = str(tmp_path / "multi")
    path = pai_csv(tmp_path / "m.csv", [(a, {"option": ["护照", "身份证"]}), (b, {"option": "护照"})])
    with open(path, "a", encoding="utf-8") as f:
        f.write(DOC_MULTILABEL.replace("1,", "3,", 1))
    res = sc.convert_annotations(path, out, model_type="classification", progress=False)
    assert res.manifest["multi_label"] and res.records_written == 2 and res.rows_discarded == 1
    assert [r["image/class/label"].tolist() for r in all_records(out)] == [[0, 1], [0]]
    assert "not valid JSON" in reasons(out)[3]


def test_detection_polygons_become_normalized_boxes_and_doc_rows_are_discarded(tmp_path):
    img = jpeg(tmp_path / "b.jpg", w=200, h=100)
    good = [obj("car", [10, 20, 50, 20, 50, 60, 10, 60]), obj("person", [100, 0, 300, 0, 300, 50, 100, 50])]
    path = pai_csv(tmp_path / "d.csv", [(img, good), (img, [obj("car", [1, 2, 3, 4, 5, 6])])])
    with open(path, "a", encoding="utf-8") as f:
        f.write(DOC_DETECTION_2.replace("2,", "3,", 1))
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="DETECTION", progress=False)
    # the documentation's row has unbalanced quotes: CSV reads it as several broken records
    assert res.records_written == 1 and res.rows_read == res.records_written + res.rows_discarded >= 3
    r = all_records(out)[0]
    np.testing.assert_allclose(r["image/object/bbox/xmin"], [0.05, 0.5], rtol=1e-6)
    np.testing.assert_allclose(r["image/object/bbox/xmax"], [0.25, 1.0], rtol=1e-6)  # clipped to the image
    np.testing.assert_allclose(r["image/object/bbox/ymax"], [0.6, 0.5], rtol=1e-6)
    assert r["image/object/class/text"] == [b"car", b"person"]
    assert r["image/object/class/label"].tolist() == [0, 1] and len(r["image/object/polygon"]) == 16
    why = reasons(out)
    assert "8 numbers" in why[2] and all(why[n] for n in range(3, res.rows_read + 1))


def test_detection_class_options_error_ignore_and_mapping(tmp_path):
    img = jpeg(tmp_path / "b.jpg")
    objs = [obj("轿车", [0, 0, 10, 0, 10, 10, 0, 10]), obj("bad", [0, 0, 5, 0, 5, 5, 0, 5]),
            obj("dontcare", [20, 20, 30, 20, 30, 30, 20, 30])]
    (tmp_path / "classes.txt").write_text("轿车:car\ndontcare\n", encoding="utf-8")
    out = str(tmp_path / "out")
    res = sc.convert_annotations(pai_csv(tmp_path / "d.csv", [(img, objs)]), out, model_type="DETECTION",
                                 class_list_file=str(tmp_path / "classes.txt"), error_class="bad",
                                 ignore_class="dontcare", progress=False)
    r = all_records(out)[0]
    assert res.manifest["classes"] == ["car", "dontcare"]
    assert r["image/object/class/text"] == [b"car", b"dontcare"]
    assert r["image/object/ignored"].tolist() == [0, 1]


def test_segmentation_mask_by_url_and_size_mismatch(tmp_path):
    img = jpeg(tmp_path / "a.jpg", w=40, h=20)
    m = np.zeros((20, 40, 3), np.uint8)
    m[:, 20:, 2] = 1
    Image.fromarray(m).save(tmp_path / "a.png")
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(tmp_path / "small.png")
    path = pai_csv(tmp_path / "s.csv", [(img, {"ossUrl": "a.png"}), (img, {"ossUrl": "small.png"}),
                                        (img, {"ossUrl": "nowhere.png"})])
    with open(path, "a", encoding="utf-8") as f:
        f.write(DOC_SEGMENTATION.replace("1,", "4,", 1))
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="SEGMENTATION", max_image_size=20, progress=False)
    assert res.records_written == 1 and res.rows_discarded == 3
    r = all_records(out)[0]
    mask = np.asarray(Image.open(io.BytesIO(r["image/segmentation/class/encoded"][0])))
    assert mask.shape == (10, 20) and mask[:, :10].max() == 0 and mask[:, 10:].min() == 1
    why = reasons(out)
    assert "mask is 5x5" in why[2] and "mask not found" in why[3] and "raw data is not valid JSON" in why[4]


def test_text_recognition_applies_replace_map_and_char_dictionary(tmp_path):
    img = jpeg(tmp_path / "a.jpg")
    (tmp_path / "replace.csv").write_text("original,replaced\n０,0\n", encoding="utf-8")
    (tmp_path / "dict.txt").write_text("文\n本\n0\n1\n", encoding="utf-8")
    path = pai_csv(tmp_path / "t.csv", [(img, {"text": "文本０1"}), (img, {"text": "文本X"})])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="TEXT_RECOGNITION",
                                 char_replace_map_path=str(tmp_path / "replace.csv"),
                                 default_char_dict_path=str(tmp_path / "dict.txt"), progress=False)
    r = all_records(out)[0]
    assert r["image/text"] == ["文本01".encode()] and r["image/text/char_ids"].tolist() == [0, 1, 2, 3]
    assert res.rows_discarded == 1 and "not in the character dictionary" in reasons(out)[2]


def test_text_detection_and_end2end_keep_directions_and_texts(tmp_path):
    img = jpeg(tmp_path / "a.jpg", w=100, h=100)
    lines = [obj("类别1", [10, 10, 60, 10, 60, 30, 10, 30], direction="底部朝下", text="文本3"),
             obj("类别2", [10, 50, 60, 50, 60, 70, 10, 70], direction="底部朝右", text="文本4")]
    path = pai_csv(tmp_path / "e.csv", [(img, [lines, {"option": "底部朝下"}])])
    for mt in ("TEXT_DETECTION", "TEXT_END2END"):
        out = str(tmp_path / mt)
        sc.convert_annotations(path, out, model_type=mt, progress=False)
        r = all_records(out)[0]
        assert r["image/direction"] == ["底部朝下".encode()]
        assert r["image/object/direction"] == ["底部朝下".encode(), "底部朝右".encode()]
        assert len(r["image/object/bbox/xmin"]) == 2
        if mt == "TEXT_END2END":
            assert r["image/object/text"] == ["文本3".encode(), "文本4".encode()]
            assert r["image/object/text/length"].tolist() == [3, 3]


def itag_line(source, results, task="label-1448"):
    return json.dumps({"data": {"source": source}, task: {"results": results}}, ensure_ascii=False)


def test_itag_manifest_detection_classification_and_ocr(tmp_path):
    img = jpeg(tmp_path / "a.jpg", w=1024, h=1024)
    poly = {"type": "image/polygon", "value": [[368.1, 71.7], [444.3, 71.7], [444.3, 106.3], [368.1, 106.3]],
            "labels": {"OCR识别结果": "理财顾问", "单选": "标签1"}}
    det = [{"questionId": "1", "data": [poly], "type": "image", "width": 1024, "height": 1024}]
    lines = [itag_line(img, det), itag_line(img, [{"data": [{"type": "image/polygon", "value": [[1, 2]]}]}]),
             "{not json", json.dumps({"data": {}})]
    (tmp_path / "det.manifest").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = str(tmp_path / "det")
    res = sc.convert_annotations(str(tmp_path / "det.manifest"), out, model_type="DETECTION", progress=False)
    assert (res.records_written, res.rows_discarded) == (1, 3)
    r = all_records(out)[0]
    assert r["image/object/class/text"] == ["标签1".encode()]
    np.testing.assert_allclose(r["image/object/bbox/xmin"], [368.1 / 1024], rtol=1e-5)
    why = reasons(out)
    assert "4 [x, y] points" in why[2] and "not valid JSON" in why[3] and "data.source" in why[4]

    ocr = str(tmp_path / "ocr")
    sc.convert_annotations(str(tmp_path / "det.manifest"), ocr, model_type="TEXT_END2END", progress=False)
    assert all_records(ocr)[0]["image/object/text"] == ["理财顾问".encode()]

    # the check and verify stages win over the first labelling
    cls_line = json.dumps({"data": {"source": img},
                           "label-1430": {"results": [{"data": ["标签1"], "type": "survey/multivalue"}]},
                           "label-1430-verify": {"results": [{"data": ["标签1", "标签2"], "type": "survey/multivalue"}]}},
                          ensure_ascii=False)
    (tmp_path / "cls.manifest").write_text(cls_line + "\n", encoding="utf-8")
    out = str(tmp_path / "cls")
    res = sc.convert_annotations(str(tmp_path / "cls.manifest"), out, model_type="CLASSIFICATION", progress=False)
    assert res.manifest["multi_label"] and all_records(out)[0]["image/class/text"] == ["标签1".encode(),
                                                                                      "标签2".encode()]


class RotationConverter:
    """A SELF_DEFINED converter used by the test below (imported by path)."""

    def __init__(self, options):
        self.angle_key = options.get("key", "angle")

    def feature_spec(self):
        return {"image/encoded": FixedLen("bytes"), "angle": FixedLen("int64")}

    def convert(self, row, context):
        ans = row.annotation["answer"]
        if not isinstance(ans, dict) or self.angle_key not in ans:
            raise Discard(f"no {self.angle_key!r} in the answer")
        img = context.image(row, row.split)
        return {"image/encoded": img.data, "angle": int(ans[self.angle_key])}


def test_self_defined_converter_by_import_path(tmp_path):
    img = jpeg(tmp_path / "a.jpg")
    path = pai_csv(tmp_path / "u.csv", [(img, {"angle": 90}), (img, {"other": 1})])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="SELF_DEFINED",
                                 converter_class=f"{__name__}:RotationConverter", progress=False)
    assert res.records_written == 1 and all_records(out)[0]["angle"].tolist() == [90]
    assert "no 'angle'" in reasons(out)[2]
    assert res.manifest["options"]["converter_class"] == f"{__name__}:RotationConverter"


def test_converter_code_is_never_fetched_from_a_url(tmp_path):
    img = jpeg(tmp_path / "a.jpg")
    path = pai_csv(tmp_path / "u.csv", [(img, {"angle": 90})])
    with pytest.raises(ValueError, match="never runs code fetched from a URL"):
        sc.convert_annotations(path, str(tmp_path / "out"), model_type="SELF_DEFINED",
                               converter_class="http://example.com/converter.py", progress=False)
    with pytest.raises(ValueError, match="converter_class"):
        sc.convert_annotations(path, str(tmp_path / "out"), model_type="SELF_DEFINED", progress=False)


@pytest.mark.tf
def test_tensorflow_parses_detection_records_with_the_manifest_spec(tmp_path):
    tf = pytest.importorskip("tensorflow")
    img = jpeg(tmp_path / "b.jpg", w=200, h=100)
    path = pai_csv(tmp_path / "d.csv", [(img, [obj("car", [10, 20, 50, 20, 50, 60, 10, 60])]), (img, [])])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="DETECTION", progress=False)
    spec = {}
    for key, s in res.manifest["feature_spec"].items():
        dtype = {"int64": tf.int64, "float32": tf.float32, "bytes": tf.string}[s["dtype"]]
        spec[key] = tf.io.VarLenFeature(dtype) if s["kind"] == "VarLen" else tf.io.FixedLenFeature(s["shape"], dtype)
    files = [os.path.join(out, s["file"]) for sp in res.splits.values() for s in sp["shards"]]
    parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]
    assert len(parsed) == 2
    xmin = [tf.sparse.to_dense(p["image/object/bbox/xmin"]).numpy().tolist() for p in parsed]
    assert xmin[0] == pytest.approx([0.05]) and xmin[1] == []
    assert tf.io.decode_jpeg(parsed[0]["image/encoded"]).shape == (100, 200, 3)


def test_cli_recognizes_a_pai_annotation_csv_without_being_told(tmp_path, capsys):
    from shardfeed.cli.main import main

    a, b = jpeg(tmp_path / "a.jpg"), jpeg(tmp_path / "b.jpg")
    path = pai_csv(tmp_path / "labels.csv", [(a, {"option": "cat"}), (b, {"option": "dog"})])
    out = str(tmp_path / "out")
    assert main(["convert", path, out, "--model_type", "CLASSIFICATION", "-q"]) == 0
    assert [r["image/class/text"] for r in all_records(out)] == [[b"cat"], [b"dog"]]


def test_segmentation_masks_of_one_bit_and_sixteen_bit_keep_their_class_ids_or_discard(tmp_path):
    """Found from outside: a 1-bit mask (ids 0/1) was discarded for "the class channel 2 is
    missing" while the same mask as 8-bit grey converted; a 16-bit mask's ids above 255
    were stored as 255 without a word. Now 1-bit and 16-bit masks are class ids like a grey
    one, and an id the 8-bit stored mask cannot hold discards the row naming it."""
    img = jpeg(tmp_path / "a.jpg", w=10, h=8)
    ids = np.zeros((8, 10), np.uint8)
    ids[2:5, 2:5] = 1
    Image.fromarray(ids > 0).save(tmp_path / "one.png")
    small = ids.astype(np.uint16) * 200
    Image.fromarray(small).save(tmp_path / "sixteen.png")
    big = small.copy()
    big[0, 0] = 1000
    Image.fromarray(big).save(tmp_path / "big.png")
    assert Image.open(tmp_path / "one.png").mode == "1" and Image.open(tmp_path / "big.png").mode.startswith("I")
    path = pai_csv(tmp_path / "s.csv", [(img, {"ossUrl": "one.png"}), (img, {"ossUrl": "sixteen.png"}),
                                        (img, {"ossUrl": "big.png"})])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="SEGMENTATION", progress=False)
    assert res.records_written == 2 and res.rows_discarded == 1
    got = [np.asarray(Image.open(io.BytesIO(r["image/segmentation/class/encoded"][0]))) for r in all_records(out)]
    assert (got[0] == ids).all() and (got[1] == ids * 200).all()
    assert "mask holds class id 1000, outside 0-255" in reasons(out)[3]


class StrictSpecConverter:
    """A SELF_DEFINED converter whose records break its own spec on rows 2-5 (test below)."""

    def __init__(self, options):
        pass

    def feature_spec(self):
        return {"v": FixedLen("int64"), "name": FixedLen("bytes")}

    def convert(self, row, context):
        v = row.annotation["answer"]["v"]
        return [{"v": v, "name": b"x"}, {"v": "notint", "name": b"x"}, {"name": b"x"}, {"v": [v, v], "name": b"x"},
                {"v": 2.5, "name": b"x"}][v - 1]


def test_a_self_defined_record_that_its_own_spec_cannot_read_is_discarded_naming_the_feature(tmp_path):
    """Found from outside: records contradicting the converter's feature_spec() (a str for
    int64, a required feature missing, two values for a scalar, a float for int64) were
    written and the conversion reported success; reading the folder back then failed."""
    import shardfeed as sf

    path = pai_csv(tmp_path / "u.csv", [("a.jpg", {"v": v}) for v in range(1, 6)])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="SELF_DEFINED",
                                 converter_class=f"{__name__}:StrictSpecConverter", progress=False)
    assert res.records_written == 1 and res.rows_discarded == 4
    why = reasons(out)
    assert all(why[n].startswith("the converter's record does not fit its feature_spec(): feature 'v'")
               for n in (2, 3, 4, 5)), why
    assert [int(b["v"][0]) for b in sf.read_converted(out, split="train").batch(8)] == [1]

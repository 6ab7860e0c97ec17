"""INSTANCE_SEGMENTATION: polygons (PAI CSV ``coord`` of any even length, iTAG
``image/polygon``) become one PNG mask per object rasterised at pixel centres, boxes and
class ids, with the class options of DETECTION; bad polygons discard the row with a reason."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image

from shardfeed.convert import api as sc
from shardfeed.convert.inspect import inspect_output
from shardfeed.convert.polygons import polygon_area, rasterize

from .test_convert_annotations import all_records as records
from .test_convert_annotations import jpeg, pai_csv, reasons

RECT = [10, 20, 50, 20, 50, 60, 10, 60]  # 40 x 40
TRIANGLE = [100, 10, 140, 10, 100, 50]  # right angle at (100, 10), legs of 40


def obj(cls, coord):
    attrs = {} if cls is None else {"class*": cls}
    return {"text": json.dumps(attrs, ensure_ascii=False), "coord": [str(c) for c in coord]}


def masks(r):
    return [np.asarray(Image.open(io.BytesIO(b))) for b in r["image/object/mask"]]


def test_rasterize_counts_pixel_centres_inside():
    rect = rasterize(np.reshape(RECT, (-1, 2)), 100, 80)
    assert rect.sum() == 1600 and rect[20:60, 10:50].all()
    tri = rasterize(np.reshape(TRIANGLE, (-1, 2)) - (100, 10), 60, 60)
    assert tri.sum() == sum(39 - j for j in range(40)) == 780  # centres strictly below the hypotenuse
    assert polygon_area(np.reshape(TRIANGLE, (-1, 2))) == 800
    # two squares sharing an edge never share a pixel; a self-crossing bow tie fills both lobes
    left = rasterize(np.array([[0, 0], [5, 0], [5, 5], [0, 5]]), 10, 5)
    right = rasterize(np.array([[5, 0], [10, 0], [10, 5], [5, 5]]), 10, 5)
    assert not (left & right).any() and (left | right).all()
    assert rasterize(np.array([[0, 0], [10, 10], [10, 0], [0, 10]]), 10, 10).sum() == 50


def test_polygons_become_png_masks_boxes_and_classes(tmp_path):
    img = jpeg(tmp_path / "a.jpg", 200, 100)
    path = pai_csv(tmp_path / "i.csv", [(img, [obj("car", RECT), obj("person", TRIANGLE)])])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="INSTANCE_SEGMENTATION", progress=False)
    assert res.records_written == 1 and res.manifest["classes"] == ["car", "person"]
    (r,) = records(out)
    rect, tri = masks(r)
    assert rect.shape == tri.shape == (100, 200) and rect.dtype == np.uint8 and set(np.unique(rect)) == {0, 1}
    assert rect.sum() == 1600 and rect[20:60, 10:50].all() and tri.sum() == 780
    assert r["image/object/area"].tolist() == [1600, 780] and r["image/object/mask/format"] == [b"png"]
    np.testing.assert_allclose(r["image/object/bbox/xmin"], [0.05, 0.5], rtol=1e-6)
    np.testing.assert_allclose(r["image/object/bbox/xmax"], [0.25, 0.7], rtol=1e-6)
    np.testing.assert_allclose(r["image/object/bbox/ymin"], [0.2, 0.1], rtol=1e-6)
    np.testing.assert_allclose(r["image/object/bbox/ymax"], [0.6, 0.5], rtol=1e-6)
    assert r["image/object/class/label"].tolist() == [0, 1] and r["image/object/class/text"] == [b"car", b"person"]
    assert r["image/object/polygon/num_points"].tolist() == [4, 3] and len(r["image/object/polygon"]) == 14
    summary = inspect_output(out, str(tmp_path / "look"))  # masks and polygons drawn for a person to check
    drawn = np.asarray(Image.open(tmp_path / "look" / summary["images"][0]))
    assert drawn.shape == (100, 200, 3) and (drawn[40, 30] != drawn[90, 190]).any()
    with open(summary["csv"], encoding="utf-8") as f:
        assert "image/object/mask" not in next(csv.reader(f))
    # a smaller stored image: masks are drawn at its size from the scaled polygons
    out = str(tmp_path / "small")
    sc.convert_annotations(path, out, model_type="INSTANCE_SEGMENTATION", max_image_size=100, progress=False)
    rect, tri = masks(records(out)[0])
    assert rect.shape == (50, 100) and rect.sum() == 400 and rect[10:30, 5:25].all()


def test_itag_polygons_of_any_length(tmp_path):
    jpeg(tmp_path / "a.jpg", 200, 100)
    pentagon = [[20, 10], [60, 10], [70, 40], [40, 70], [10, 40]]
    line = {"data": {"source": "a.jpg"}, "label-1448535497856190000": {"results": [{"questionId": "1", "data": [
        {"id": "p1", "type": "image/polygon", "value": pentagon, "labels": {"单选": "标签1"}},
        {"id": "p2", "type": "image/polygon", "value": [[100, 0], [200, 0], [200, 100]], "labels": {"单选": "标签2"}},
    ], "type": "image", "width": 200, "height": 100}]}}
    bad = {"data": {"source": "a.jpg"}, "label-1448535497856190000": {"results": [{"data": [
        {"type": "image/polygon", "value": [[0, 0], [5, 5]], "labels": {"单选": "标签1"}}]}]}}
    (tmp_path / "p.manifest").write_text(json.dumps(line, ensure_ascii=False) + "\n" + json.dumps(bad) + "\n",
                                         encoding="utf-8")
    out = str(tmp_path / "out")
    res = sc.convert_annotations(str(tmp_path / "p.manifest"), out, model_type="INSTANCE_SEGMENTATION",
                                 progress=False)
    assert res.records_written == 1 and res.rows_discarded == 1
    (r,) = records(out)
    m5, m3 = masks(r)
    assert m5.sum() == rasterize(np.array(pentagon), 200, 100).sum() > 0.95 * polygon_area(np.array(pentagon))
    assert m3.sum() == sum(range(1, 101))  # centres on the diagonal lie on a left edge: in
    assert r["image/object/class/text"] == ["标签1".encode(), "标签2".encode()]
    assert r["image/object/polygon/num_points"].tolist() == [5, 3]
    assert "at least 3 [x, y] points" in reasons(out)[2]


def test_class_list_error_ignore_and_default_class_as_for_detection(tmp_path):
    img = jpeg(tmp_path / "a.jpg")
    objs = [obj("轿车", RECT), obj("bad", [0, 0, 5, 0, 5, 5]), obj("dontcare", [60, 60, 90, 60, 90, 90, 60, 90]),
            obj(None, TRIANGLE), obj("自行车", [150, 10, 190, 10, 170, 40])]
    (tmp_path / "classes.txt").write_text("轿车:car\ndontcare\nthing\n", encoding="utf-8")
    path = pai_csv(tmp_path / "i.csv", [(img, objs), (img, [obj(None, RECT)]), (img, [obj("自行车", RECT)])])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="INSTANCE_SEGMENTATION",
                                 class_list_file=str(tmp_path / "classes.txt"), error_class="bad",
                                 ignore_class="dontcare", default_class="thing", progress=False)
    assert res.manifest["classes"] == ["car", "dontcare", "thing"] and res.records_written == 3
    r = records(out)[0]
    assert r["image/object/class/text"] == [b"car", b"dontcare", b"thing", b"thing"]  # 'bad' left out
    assert r["image/object/class/label"].tolist() == [0, 1, 2, 2]
    assert r["image/object/ignored"].tolist() == [0, 1, 0, 0]
    assert len(r["image/object/mask"]) == 4 and masks(r)[1].sum() == 900  # the ignored object keeps its mask
    # without default_class an object with no class, or one outside the class list, drops the row
    out = str(tmp_path / "strict")
    res = sc.convert_annotations(path, out, model_type="INSTANCE_SEGMENTATION",
                                 class_list_file=str(tmp_path / "classes.txt"), error_class="bad", progress=False)
    assert res.records_written == 0
    why = reasons(out)
    assert "no class and there is no default_class" in why[1] == why[2]
    assert "'自行车' is not in the class list" in why[3]


def test_bad_polygons_discard_the_row_with_a_reason(tmp_path):
    img = jpeg(tmp_path / "a.jpg", 200, 100)
    rows = [
        (img, [obj("car", RECT)]),                                  # 1: good
        (img, [obj("car", [1, 2, 3, 4, 5])]),                       # 2: odd count
        (img, [obj("car", [1, 2, 3, 4])]),                          # 3: two points
        (img, [obj("car", [0, 0, 10, 10, 20, 20, 30, 30])]),        # 4: collinear, zero area
        (img, [obj("car", [300, 10, 350, 10, 350, 50])]),           # 5: outside the image
        (img, [obj("car", [10.1, 10.1, 10.4, 10.1, 10.2, 10.3])]),  # 6: covers no pixel centre
        (img, [obj("car", RECT[:6] + ["x", "y"])]),                 # 7: not numbers
    ]
    out = str(tmp_path / "out")
    res = sc.convert_annotations(pai_csv(tmp_path / "i.csv", rows), out, model_type="INSTANCE_SEGMENTATION",
                                 progress=False)
    assert (res.rows_read, res.records_written, res.rows_discarded) == (7, 1, 6)
    why = reasons(out)
    assert "even number (at least 6)" in why[2] and "got 5" in why[2]
    assert "even number (at least 6)" in why[3] and "got 4" in why[3]
    assert "object 1 (car) has a degenerate polygon" in why[4]
    assert "object 1 has an empty box after clipping" in why[5]
    assert "object 1 (car) covers no pixel of the stored 200x100 image" in why[6]
    assert "not a number" in why[7]


def test_a_self_crossing_polygon_keeps_its_pixels_and_only_collinear_points_are_degenerate(tmp_path):
    """Found from outside: a bow tie (a self-crossing outline) was discarded as "zero area":
    the shoelace areas of its two loops cancel. The mask rule is even-odd, so its loops are
    its pixels; only points on one line are degenerate. A 10,000-point polygon (an answer
    cell of about 200 KB, over Python csv's 128 Ki field limit) converts too."""
    import math

    img = jpeg(tmp_path / "a.jpg", 100, 80)
    bowtie = [10, 10, 50, 50, 50, 10, 10, 50]
    circle = [v for k in range(10_000) for v in (round(50 + 30 * math.cos(2 * math.pi * k / 10_000), 6),
                                                  round(40 + 30 * math.sin(2 * math.pi * k / 10_000), 6))]
    path = pai_csv(tmp_path / "i.csv", [(img, [obj("o", bowtie)]), (img, [obj("o", circle)]),
                                        (img, [obj("o", [10, 10, 30, 30, 20, 20, 15, 15])])])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="INSTANCE_SEGMENTATION", progress=False)
    assert res.records_written == 2 and res.rows_discarded == 1
    bow, disc = records(out)
    want = rasterize(np.reshape(bowtie, (-1, 2)), 100, 80)
    assert want.sum() == 800 and (masks(bow)[0] == want).all()  # two triangles of 400 pixels
    assert abs(int(masks(disc)[0].sum()) - math.pi * 30 ** 2) < 60
    assert "object 1 (o) has a degenerate polygon" in reasons(out)[3]


def test_a_nan_or_infinite_coordinate_is_not_a_number_not_a_polygon_covering_no_pixel(tmp_path):
    """Found from outside: NaN and Infinity (JSON as Python writes and reads it) in a
    polygon's coordinates were reported as "covers no pixel", with a numpy warning."""
    img = jpeg(tmp_path / "a.jpg", 100, 80)
    path = pai_csv(tmp_path / "i.csv", [(img, [obj("o", [10, 10, float("nan"), 10, 50, 50])]),
                                        (img, [obj("o", [10, 10, float("inf"), 10, 50, 50])]),
                                        (img, [obj("o", [10, 10, 50, 10, 50, 50])])])
    out = str(tmp_path / "out")
    res = sc.convert_annotations(path, out, model_type="INSTANCE_SEGMENTATION", progress=False)
    assert res.records_written == 1
    why = reasons(out)
    assert "not a finite number" in why[1] and "not a finite number" in why[2]

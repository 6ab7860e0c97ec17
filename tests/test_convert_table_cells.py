"""Cells of a converted table as Parquet, DataFrames and CSVs give them: null lists, null
list elements, structs; and CSVs whose layout or cell size is not what the reader expects."""

from __future__ import annotations

import json
import math

import pytest

from shardfeed.convert.schema import Schema
from shardfeed.convert.sources import read_dataframe, read_table_file

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(tmp_path, columns):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(columns), path)
    return str(path)


def _read(url, schema, defaults=None):
    rows, discards, _ = read_table_file(url, Schema(schema, dict(defaults or {})))
    return {r.number: r.values for r in rows}, {d.row: d.reason for d in discards}


def test_a_null_parquet_list_is_a_missing_cell_and_a_null_element_discards_the_row(tmp_path):
    url = _parquet(tmp_path, {
        "label": [1, 2, 3, 4, 5],
        "ids": pa.array([[1, 2], None, [None, 3], [], [4]], pa.list_(pa.int64())),
        "xs": pa.array([[0.5], [1.0], [2.0], [float("nan")], [1.0, None]], pa.list_(pa.float64())),
    })
    rows, discards = _read(url, {"label": "integer label", "ids": "int list", "xs": "float list"})
    assert rows[1] == {"ids": [1, 2], "xs": [0.5]} and rows[4]["ids"] == []  # an empty list stays one
    assert math.isnan(rows[4]["xs"][0])  # NaN is a float, not a null
    assert discards == {2: "column 'ids' is missing and has no default",
                        3: "column 'ids': null element in list (item 0)",
                        5: "column 'xs': null element in list (item 1)"}
    rows, discards = _read(url, {"label": "integer label", "ids": "int list", "xs": "float list"},
                           defaults={"ids": [-1]})
    assert rows[2]["ids"] == [-1] and sorted(discards) == [3, 5]


def test_a_parquet_struct_is_written_as_json_of_its_own_types(tmp_path):
    meta = pa.array([{"a": 1, "b": "x", "c": [1, 2]}, {"a": None, "b": "y", "c": None}, None],
                    pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.list_(pa.int64()))]))
    url = _parquet(tmp_path, {"label": [0, 1, 2], "meta": meta,
                              "tags": pa.array([[{"k": 1}], [{"k": 2}, {"k": 3}], []],
                                               pa.list_(pa.struct([("k", pa.int32())])))})
    rows, discards = _read(url, {"label": "integer label", "meta": "string", "tags": "string list"},
                           defaults={"meta": "{}"})
    assert json.loads(rows[1]["meta"]) == {"a": 1, "b": "x", "c": [1, 2]}
    assert '"a": 1,' in rows[1]["meta"]  # an int, not 1.0
    assert json.loads(rows[2]["meta"]) == {"a": None, "b": "y", "c": None}
    assert rows[3]["meta"] == "{}" and rows[2]["tags"] == ['{"k": 2}', '{"k": 3}'] and not discards


def test_a_struct_that_json_cannot_hold_or_in_a_number_column_is_discarded_naming_the_column(tmp_path):
    url = _parquet(tmp_path, {"label": [0], "meta": pa.array([{"raw": b"\x00\x01"}], pa.struct([("raw", pa.binary())])),
                              "n": pa.array([{"v": 1}], pa.struct([("v", pa.int64())]))})
    _, discards = _read(url, {"label": "integer label", "meta": "string"})
    assert discards == {1: "column 'meta': a struct or list holding bytes cannot be written as JSON"}
    _, discards = _read(url, {"label": "integer label", "n": "int"})
    assert discards == {1: "column 'n': a struct is not an integer"}


def test_dataframe_cells_follow_the_same_rules():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"label": [0, 1, 2, 3], "ids": [[1], None, [None, 2], float("nan")],
                       "meta": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}]})
    rows, discards, _ = read_dataframe(df, Schema({"label": "integer label", "ids": "int list", "meta": "string"}))
    assert [(r.number, r.values) for r in rows] == [(1, {"ids": [1], "meta": '{"a": 1}'})]
    assert [(d.row, d.reason) for d in discards] == [
        (2, "column 'ids' is missing and has no default"), (3, "column 'ids': null element in list (item 0)"),
        (4, "column 'ids' is missing and has no default")]


def test_nested_columns_of_a_parquet_written_by_pandas_with_its_index_keep_their_place(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"label": [0, 1], "ids": [[1, None], [2]]}, index=pd.Index([10, 20], name="key"))
    df.to_parquet(tmp_path / "t.parquet")  # the index is stored as a column before or after the others
    rows, discards = _read(str(tmp_path / "t.parquet"), {"label": "integer label", "ids": "int list"})
    assert rows == {2: {"ids": [2]}} and discards == {1: "column 'ids': null element in list (item 1)"}


@pytest.mark.parametrize("text, schema, says", [
    # no schema: the AutoML layout, and line 1 is another layout's header
    ("path,cls,fold\nx.jpg,cat,TRAIN\n", None, "not the AutoML layout split,image_uri,label"),
    ("split,image,label\nTRAIN,x.jpg,cat\n", None, "not the AutoML layout split,image_uri,label"),
    ("TRAIN,x.jpg,cat,extra\nTRAIN,y.jpg,dog,extra\n", None, "4 cells"),
    # a schema: a header that names some of its columns but not all, or another count of cells
    ("path,kind\nx.jpg,a\n", {"path": "image_uri", "kind": "string label", "w": "float"}, "lacks w"),
    ("a,b,c,d\n1,2,3,4\n", {"path": "image_uri", "kind": "string label"}, "4 cells"),
])
def test_a_csv_whose_first_row_is_not_the_expected_layout_is_one_clear_error(tmp_path, text, schema, says):
    from shardfeed.convert import api as sc

    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(ValueError, match=r"t\.csv: the first row") as info:
        sc.convert(str(tmp_path / "t.csv"), str(tmp_path / "out"), schema=schema, progress=False)
    assert says in str(info.value), str(info.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # refused before converting


def test_the_cli_refuses_a_csv_of_another_layout_with_one_line(tmp_path, capsys):
    from shardfeed.cli.main import main

    (tmp_path / "t.csv").write_text("path,cls,fold\nx.jpg,cat,TRAIN\n")
    assert main(["convert", str(tmp_path / "t.csv"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "t.csv: the first row" in err and len(err.strip().splitlines()) == 1, err


def test_csv_cells_past_pythons_default_limit_are_read_and_past_ours_are_an_error_naming_the_line(
        tmp_path, monkeypatch):
    import csv

    from shardfeed.convert import sources
    from shardfeed.pipeline import csv as pipeline_csv

    big = "a" * 300_000  # Python's csv stops at 131072 characters
    (tmp_path / "t.csv").write_text(f"split,image_uri,label\nTRAIN,x.jpg,cat\nTRAIN,y.jpg,{big}\n")
    rows, discards, _ = sources.read_csv(str(tmp_path / "t.csv"), None)
    assert [r.label for r in rows] == ["cat", big] and not discards
    saved = csv.field_size_limit()
    try:
        monkeypatch.setattr(pipeline_csv, "CSV_FIELD_LIMIT", 100_000)  # the limit conversion and read_csv raise to
        csv.field_size_limit(100_000)
        with pytest.raises(ValueError, match=r"t\.csv: line 3: .*longer than 100000 characters"):
            sources.read_csv(str(tmp_path / "t.csv"), None)
    finally:
        csv.field_size_limit(saved)



def test_a_nan_float_cell_is_missing_and_out_of_range_discards_alike_from_csv_and_parquet(tmp_path):
    """CSV text 'nan' is missing as a Parquet NaN is (it was converted as NaN); 1e40 is no
    float32 (it was written as inf, unreported); an explicit inf is a value in both."""
    (tmp_path / "t.csv").write_text("id,w\n1,1.5\n2,nan\n3,1e40\n4,-inf\n")
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "w": [1.5, math.nan, 1e40, -math.inf]}), tmp_path / "t.parquet")
    for url in (str(tmp_path / "t.csv"), str(tmp_path / "t.parquet")):
        rows, discards = _read(url, {"id": "int", "w": "float"})
        assert {n: v["w"] for n, v in rows.items()} == {1: 1.5, 4: -math.inf}, url
        assert "'w' is missing" in discards[2] and "'w': 1e+40 is out of float32 range" in discards[3], url
        rows, _ = _read(url, {"id": "int", "w": "float"}, defaults={"w": 0.0})
        assert rows[2]["w"] == 0.0, url


def test_a_number_written_beyond_float64_is_out_of_range_not_inf(tmp_path):
    """'1e400' was written as inf (float() of it) while '1e40' was discarded; the text 'inf'
    and 'Infinity' stay values. In a cell and as a list item (found from outside)."""
    (tmp_path / "t.csv").write_text("id,w,ws\n1,1e400,1\n2,-1E400,1\n3,Infinity,1;-inf\n4,1,2;1e999\n5, +inf ,0\n")
    rows, discards = _read(str(tmp_path / "t.csv"), {"id": "int", "w": "float", "ws": "float list"})
    assert {n: (v["w"], v["ws"]) for n, v in rows.items()} == {3: (math.inf, [1.0, -math.inf]), 5: (math.inf, [0.0])}
    assert discards == {1: "column 'w': '1e400' is out of float32 range",
                        2: "column 'w': '-1E400' is out of float32 range",
                        4: "column 'ws': '1e999' is out of float32 range (item 1)"}


def test_a_quoted_cell_never_closed_is_an_error_naming_file_and_line(tmp_path):
    """An unbalanced quote made the rest of the file one cell: the rows after it vanished
    into it without a word (found from outside); a quoted cell over two lines still reads."""
    from shardfeed.convert import api as sc
    from shardfeed.convert import sources

    (tmp_path / "bad.csv").write_text('id,x,s\n1,1.5,ok\n2,1.5,"abc\n3,2.5,b\n4,3.5,c\n')
    with pytest.raises(ValueError, match=r"bad\.csv: line 3: a quoted cell opened in this row is never closed.*"
                                         r"\(3 lines\)"):
        sources.read_csv(str(tmp_path / "bad.csv"), Schema({"id": "int", "x": "float", "s": "string"}, {}))
    (tmp_path / "end.csv").write_text('id,x,s\n1,1.5,"ok')  # on the last line, no line break after it
    with pytest.raises(ValueError, match=r"end\.csv: line 2: .*never closed.*\(1 line\)"):
        sc.convert(str(tmp_path / "end.csv"), str(tmp_path / "o"), schema={"id": "int", "x": "float", "s": "string"},
                   test_ratio=0.0, progress=False)
    (tmp_path / "good.csv").write_text('id,x,s\n1,1.5,"a\nb"\n2,2.5,"c ""d"""')
    rows, discards = _read(str(tmp_path / "good.csv"), {"id": "int", "x": "float", "s": "string"})
    assert {n: v["s"] for n, v in rows.items()} == {1: "a\nb", 2: 'c "d"'} and not discards


def test_in_a_float_list_nan_stays_a_value(tmp_path):
    (tmp_path / "l.csv").write_text("w\n1;nan\n")
    rows, _ = _read(str(tmp_path / "l.csv"), {"w": "float list"})
    assert rows[1]["w"][0] == 1.0 and math.isnan(rows[1]["w"][1])


def test_list_items_and_ints_out_of_their_range_discard_the_row_naming_the_item(tmp_path):
    """A float list's 1e40 was written as inf without a word; an int beyond int64 was
    reported only as a converter's OverflowError. From CSV text, Parquet and a DataFrame."""
    (tmp_path / "t.csv").write_text(
        f"id,xs,ns,n\n1,0.5;2,1;2,3\n2,1;1e40,1,3\n3,0.5,1;{2**70},3\n4,-inf;nan,{-2**63},{2**63}\n")
    pq.write_table(pa.table({
        "id": [1, 2, 3, 4],
        "xs": pa.array([[0.5, 2.0], [1.0, 1e40], [0.5], [-math.inf, math.nan]], pa.list_(pa.float64())),
        "ns": pa.array([[1, 2], [1], [1, 2**62], [-2**63]], pa.list_(pa.int64())),
        "n": pa.array([3, 3, 3, 3], pa.int64()),
    }), tmp_path / "t.parquet")
    schema = {"id": "int", "xs": "float list", "ns": "int list", "n": "int"}
    rows, discards = _read(str(tmp_path / "t.csv"), schema)
    assert sorted(rows) == [1] and rows[1]["xs"] == [0.5, 2.0]
    assert discards == {2: "column 'xs': 1e+40 is out of float32 range (item 1)",
                        3: f"column 'ns': {2**70} is out of int64 range (item 1)",
                        4: f"column 'n': {2**63} is out of int64 range"}
    rows, discards = _read(str(tmp_path / "t.parquet"), schema)
    assert sorted(rows) == [1, 3, 4] and discards == {2: "column 'xs': 1e+40 is out of float32 range (item 1)"}
    assert rows[4]["ns"] == [-2**63] and rows[4]["xs"][0] == -math.inf and math.isnan(rows[4]["xs"][1])
    import pandas as pd

    frame = pd.DataFrame({"id": [1, 2], "xs": [[1.0], [3e39]], "ns": [[2**64], [1]], "n": [1, 1]})
    rows, discards, _ = read_dataframe(frame, Schema(schema, {}))
    assert not rows and {d.row: d.reason for d in discards} == {
        1: f"column 'ns': {2**64} is out of int64 range (item 0)",
        2: "column 'xs': 3e+39 is out of float32 range (item 0)"}


def test_numbers_beyond_float64_of_any_python_type_are_out_of_range_not_inf():
    """Found from outside: ``Decimal("1e400")`` in a DataFrame's float column was written as
    inf (only text was checked), and the int ``10**400`` stopped the whole conversion with
    an OverflowError. Both discard the row; a Decimal or float infinity stays a value."""
    import decimal

    import pandas as pd

    df = pd.DataFrame({"id": [1, 2, 3, 4, 5, 6], "v": pd.Series(
        [decimal.Decimal("1e400"), decimal.Decimal("-1e999"), 10**400, decimal.Decimal("Infinity"), math.inf,
         decimal.Decimal("2.5")], dtype=object),
        "l": pd.Series([[1.0], [1.0], [1.0], [1.0], [1.0], [decimal.Decimal("1e400")]], dtype=object)})
    rows, discards, _ = read_dataframe(df, Schema({"id": "int", "v": "float", "l": "float list"}))
    assert {r.number: r.values["v"] for r in rows} == {4: math.inf, 5: math.inf}
    assert {d.row: d.reason for d in discards} == {
        1: "column 'v': '1E+400' is out of float32 range", 2: "column 'v': '-1E+999' is out of float32 range",
        3: f"column 'v': '{str(10**400)[:60]}' is out of float32 range",
        6: "column 'l': '1E+400' is out of float32 range (item 0)"}


@pytest.mark.parametrize("cell", ["1_000", "\u0663", "\uff11\uff12"])
def test_numbers_a_csv_reader_refuses_discard_the_row_as_read_csv_refuses_them(tmp_path, cell):
    """Found from outside: conversion took ``1_000``, Arabic-Indic and full-width digits as
    numbers (Python's ``int``/``float``), where ``sf.read_csv`` and TensorFlow refuse them:
    the same CSV must not mean two things. Each discards its row, in int, float and list columns."""
    (tmp_path / "t.csv").write_text(f"id,i,f,il\n1,{cell},1.5,1\n2,2,{cell},1\n3,2,1.5,1;{cell}\n4,7,2.5,1;2\n",
                                    encoding="utf-8")
    rows, discards = _read(str(tmp_path / "t.csv"), {"id": "int", "i": "int", "f": "float", "il": "int list"})
    assert rows == {4: {"id": 4, "i": 7, "f": 2.5, "il": [1, 2]}}
    assert {n: r.split(":")[0] for n, r in discards.items()} == {1: "column 'i'", 2: "column 'f'", 3: "column 'il'"}
    assert all("not an integer" in discards[n] for n in (1, 3)) and "not a number" in discards[2]


@pytest.mark.parametrize("kind", ["string", "string list", "string label", "bytes"])
def test_text_utf8_cannot_hold_discards_its_row_instead_of_failing_the_conversion(tmp_path, kind):
    """Found from outside: a lone surrogate in one DataFrame cell (or bytes that are not
    UTF-8) stopped the whole conversion with a UnicodeEncodeError from the plan's digest;
    now that row is discarded naming the column, and the others are written."""
    import pandas as pd

    import shardfeed as sf

    bad = {"string": "bad\ud800", "string list": ["ok", "bad\udc80"], "string label": "bad\ud800",
           "bytes": b"bad\xff"}[kind]
    df = pd.DataFrame({"id": [0, 1, 2], "s": pd.Series(["a", bad, "c"], dtype=object)})
    col_type = "string" if kind == "bytes" else kind
    got = sf.convert(df, str(tmp_path / "out"), schema={"id": "int", "s": col_type}, progress=False)
    counts = got.manifest["counts"]
    assert (counts["records_written"], counts["rows_discarded"]) == (2, 1)
    report = (tmp_path / "out" / "data-discards.csv").read_text().splitlines()[1:]
    assert len(report) == 1 and report[0].startswith("2,<DataFrame>#2,column 's': ")
    assert ("not UTF-8" if kind == "bytes" else "not valid Unicode") in report[0]


def test_labels_are_kept_as_ids_only_when_every_label_is_an_ascii_integer(tmp_path):
    """``str.isdigit`` took ``"²"`` and ``"٣"`` for digits: an AutoML table whose labels all
    passed it stopped with a ValueError (``int("²")``) or read ``"٣"`` as class 3, and
    ``"--5"`` failed the same way. Such labels are class names now."""
    from shardfeed.convert.api import _integer_labels
    from shardfeed.convert.options import Row
    from shardfeed.convert.schema import automl_schema

    for labels, ids in ((["1", "-2", " 3 "], [1, -2, 3]), (["1", "\u00b2"], None), (["\u0663"], None),
                        (["--5"], None), (["1", "x"], None)):
        rows = [Row(number=k + 1, origin="t.csv", split="TRAIN", image_uri="a.jpg", label=v)
                for k, v in enumerate(labels)]
        schema = _integer_labels(rows, automl_schema())
        if ids is None:
            assert schema.label_type == "string label" and [r.label for r in rows] == labels, labels
        else:
            assert schema.label_type == "integer label" and [r.label for r in rows] == ids, labels


@pytest.mark.parametrize("option, bad", [("jpeg_quality", 95.5), ("jpeg_quality", "90"), ("jpeg_quality", None),
                                         ("jpeg_quality", -5), ("jpeg_quality", 0), ("jpeg_quality", 101),
                                         ("separator", ""), ("separator", 3), ("max_image_size", True),
                                         ("read_parallel_num", True)])
def test_an_option_of_the_wrong_type_or_range_is_an_error_naming_it_before_any_row(tmp_path, option, bad):
    """Found from outside: jpeg_quality=95.5, "90" or None discarded every resized image as
    "corrupt image", -5 and 101 were taken, separator="" stopped the job with a bare "empty
    separator", max_image_size=True made 1x1 images."""
    import pandas as pd

    import shardfeed as sf

    df = pd.DataFrame({"id": [1], "l": ["a;b"]})
    with pytest.raises(ValueError, match=f"^{option} must be"):
        sf.convert(df, str(tmp_path / "out"), schema={"id": "int", "l": "string list"}, progress=False,
                   **{option: bad})
    assert not (tmp_path / "out").exists()


def test_table_files_that_lack_a_schema_column_are_named_and_an_empty_json_lines_file_holds_no_rows(tmp_path):
    """Found from outside: a Parquet folder whose one part lacks a schema column was refused
    as "schema names columns the DataFrame lacks" (no DataFrame was given, no file named);
    an empty .jsonl the same, where an empty CSV converts to no rows."""
    import shardfeed as sf

    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "s": ["a", "b"]}), folder / "part-00000.parquet")
    pq.write_table(pa.table({"id": [3]}), folder / "part-00001.parquet")
    with pytest.raises(ValueError, match=r"part-00001\.parquet lacks column\(s\) the schema names: s \(it has \['id'\]\)"):
        sf.convert(str(folder), str(tmp_path / "out"), schema={"id": "int", "s": "string"}, progress=False)
    (tmp_path / "empty.jsonl").write_text("")
    got = sf.convert(str(tmp_path / "empty.jsonl"), str(tmp_path / "out2"), schema={"id": "int", "s": "string"},
                     progress=False)
    assert got.manifest["counts"]["rows_read"] == 0

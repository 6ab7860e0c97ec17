"""PAI annotation CSVs and iTAG manifests on ``local-cluster[2,1,1024]``: the driver plans
byte ranges from the file's size and never parses it; each executor task parses the
records that start in its range with the local runner's parser; the shards are the local
runner's, byte for byte."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("PIL")
pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from shardfeed.convert import annotations, runner_spark, spark_source
from shardfeed.convert import api as sc

from .test_annotation_spans import cell, itag, pai_line
from .test_convert_annotations import jpeg
from .test_convert_spark import OPTS, same_output, spark  # noqa: F401  (spark: the session fixture)

pytestmark = pytest.mark.slow


def driver_never_parses(monkeypatch):
    """From here on the driver cannot parse an annotation file nor ship rows it read (the
    executors' Python workers are other processes, untouched)."""
    def parses(*args, **kwargs):
        raise AssertionError("the driver parsed the annotation file")

    for module, name in ((sc, "read_annotation_csv"), (sc, "read_itag_manifest"), (annotations, "AnnotationSpan"),
                         (runner_spark, "rows_source")):
        monkeypatch.setattr(module, name, parses)


def box(cls):
    return json.dumps([{"text": json.dumps({"class*": cls}), "coord": ["10", "10", "90", "10", "90", "60", "10", "60"]}])


def test_an_annotation_csv_and_an_itag_manifest_are_parsed_by_the_executors_in_byte_ranges(spark, tmp_path,
                                                                                            monkeypatch, caplog):
    # ranges of 160 bytes: a small file cut into many (a line longer than a range, ranges
    # in which no line starts)
    monkeypatch.setattr(spark_source, "ANNOTATION_MIN_RANGE", 160)
    monkeypatch.setattr(spark_source, "ANNOTATION_MAX_RANGE", 160)
    imgs = [jpeg(tmp_path / f"{i}.jpg", w=60 + 10 * i, h=40) for i in range(6)]
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8 truncated")
    # a PAI annotation CSV: a BOM, a comment and a header, blank records, \r\n and lone \r,
    # a record that does not parse, a corrupt image
    lines = ["# id, raw, answer\r\n", "id,raw,answer\r\n", "\r\n"]
    for i in range(14):
        url = str(tmp_path / "bad.jpg") if i == 5 else imgs[i % 6]
        lines.append(pai_line(i + 1, url, box(f"c{i % 3}")) + ("\r" if i % 4 == 1 else "\n"))
        if i == 7:
            lines += ["8b,{not json},[]\n", "# a comment\n", " , \n"]
    ann = tmp_path / "ann.csv"
    ann.write_bytes("\ufeff".encode() + "".join(lines).encode())
    # an iTAG manifest: blank lines (numbered), \r and \r\n, a bad line, a corrupt image
    rows = [itag(imgs[i % 6] if i != 3 else str(tmp_path / "bad.jpg"), f"t{i % 2}") for i in range(10)]
    rows[6] = "{broken"
    manifest = tmp_path / "a.manifest"
    manifest.write_bytes(("\n\n".join(rows[:4]) + "\r\n" + "\r".join(rows[4:8]) + "\n   \n" + "\n".join(rows[8:]))
                         .encode())
    # quoted cells holding line breaks across ranges' starts
    raw = json.dumps({"url": imgs[1], "notes": ["x"] * 60}, indent=1)  # 62 lines
    quoted = tmp_path / "q.csv"
    quoted.write_text(pai_line(1, imgs[0], box("c0")) + "\n" + "2," + cell(raw)
                      + "," + cell(box("c1")) + "\n" + pai_line(3, imgs[2], box("c2")) + "\n", encoding="utf-8")
    want = {f: sc.convert_annotations(str(f), str(tmp_path / f"local_{f.name}"), model_type="DETECTION", **OPTS)
            for f in (ann, manifest, quoted)}
    driver_never_parses(monkeypatch)

    size = ann.stat().st_size
    src = runner_spark.annotation_source(spark, str(ann), "csv", "DETECTION", None)
    assert src.kind == "annotation" and src.frame.columns == ["start", "end"]
    ranges = src.frame.collect()  # what the driver made: one row per byte range, none per annotation
    assert [(r.start, r.end) for r in ranges] == [(s, min(size, s + 160)) for s in range(0, size, 160)]
    assert src.frame.rdd.getNumPartitions() == len(ranges) > 10

    got = sc.convert_annotations(str(ann), str(tmp_path / "spark_ann"), model_type="DETECTION", runner="spark",
                                 **OPTS)
    assert (got.rows_read, got.rows_discarded, got.records_written) == (15, 2, 13)
    assert got.manifest["counts"] == want[ann].manifest["counts"]
    same_output(str(tmp_path / "local_ann.csv"), str(tmp_path / "spark_ann"))

    got = sc.convert_annotations(str(manifest), str(tmp_path / "spark_itag"), model_type="DETECTION", runner="spark",
                                 **OPTS)
    assert (got.rows_read, got.rows_discarded) == (want[manifest].rows_read, want[manifest].rows_discarded) == (10, 2)
    same_output(str(tmp_path / "local_a.manifest"), str(tmp_path / "spark_itag"))

    # the quoted cells: detected, and the file read again in one task, giving the local
    # runner's output all the same
    with caplog.at_level(logging.WARNING, logger="shardfeed.convert.spark_source"):
        got = sc.convert_annotations(str(quoted), str(tmp_path / "spark_q"), model_type="DETECTION", runner="spark",
                                     **OPTS)
    assert got.records_written == 3 and "quoted CSV cell holds a line break across byte offset" in caplog.text
    same_output(str(tmp_path / "local_q.csv"), str(tmp_path / "spark_q"))

    # text that is not UTF-8: one clear error naming the file and the byte offset
    latin = tmp_path / "latin.csv"
    latin.write_bytes((pai_line(1, imgs[0]) + "\n").encode() * 4 + b"5,\xe9t\xe9,[]\n")
    offset = latin.read_bytes().index(b"\xe9")
    with pytest.raises(ValueError, match=rf"latin\.csv: not UTF-8 text \(byte offset {offset}\)"):
        sc.convert_annotations(str(latin), str(tmp_path / "spark_latin"), model_type="DETECTION", runner="spark",
                               **OPTS)


def test_an_annotation_csv_on_s3_is_read_by_the_executors_in_byte_ranges(spark, tmp_path, monkeypatch, s3_bucket):
    import boto3

    monkeypatch.setattr(spark_source, "ANNOTATION_MIN_RANGE", 200)
    monkeypatch.setattr(spark_source, "ANNOTATION_MAX_RANGE", 200)
    bucket, so = s3_bucket
    imgs = [jpeg(tmp_path / f"{i}.jpg", w=50 + 10 * i, h=40) for i in range(4)]
    body = "id,raw,answer\r\n" + "".join(pai_line(i, imgs[i % 4], box(f"c{i % 2}")) + "\n" for i in range(9))
    body += "9,{},[]\n"
    assert len(body.encode()) > 8 * 200  # read in more than 8 ranges
    boto3.client("s3", endpoint_url=so["endpoint_url"]).put_object(Bucket=bucket, Key="ann.csv", Body=body.encode())
    url = f"s3://{bucket}/ann.csv"
    want = sc.convert_annotations(url, str(tmp_path / "local"), model_type="DETECTION", storage_options=so, **OPTS)
    driver_never_parses(monkeypatch)
    got = sc.convert_annotations(url, str(tmp_path / "spark"), model_type="DETECTION", runner="spark",
                                 storage_options=so, **OPTS)
    assert (got.rows_read, got.rows_discarded) == (want.rows_read, want.rows_discarded) == (10, 1)
    same_output(str(tmp_path / "local"), str(tmp_path / "spark"))

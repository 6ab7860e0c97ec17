"""Annotation files read by byte range (what each Spark task reads): the ranges of a file,
of every size from 1 byte to the whole file, read one after another, give exactly the
local parser's rows and discards, numbered the same, on hostile files (a BOM, comments,
blank lines, ``\\r\\n`` and lone ``\\r``, a line longer than a range, quoted cells with line
breaks, bytes that are not UTF-8), on disk and on S3."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from shardfeed.convert.annotations import (
    AnnotationSpan,
    read_annotation_csv,
    read_itag_manifest,
    spans_agree,
)
from shardfeed.convert.options import DiscardRecord, Row
from shardfeed.convert.textspans import LineReader, plan_ranges

BOX = json.dumps([{"text": '{"class*": "car"}', "coord": ["1", "1", "9", "1", "9", "6", "1", "6"]}])


def cell(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def pai_line(i: int, url: str, answer: str = BOX) -> str:
    return f"{i},{cell(json.dumps({'url': url}, ensure_ascii=False))},{cell(answer)}"


def hostile_csv() -> bytes:
    """A PAI annotation CSV with everything a line splitter can get wrong, but no quoted
    cell holding a line break."""
    parts = [
        "# a comment before the header\r\n",
        "\r\n",
        "  # another, indented\n",
        "id,raw,answer\r",  # the header, after comments and a blank line, ended by a lone \r
        pai_line(1, "img/ä.jpg") + "\r\n",
        " , ,\n",  # blank cells: no record
        pai_line(2, "img/b.jpg", "not json") + "\r",  # discarded: answer is not JSON
        "\r\r\n\n",
        "3,not json either,[]\n",  # looks like a header but is data: discarded, never skipped
        "# a comment between records\n",
        pai_line(4, "img/" + "long" * 150 + ".jpg") + "\n",  # longer than most ranges
        "5,{},[]\n",  # raw without url: discarded
        "6,onlytwo\n",  # two cells: discarded
        pai_line(7, "img/日本.jpg") + "\r\n",
        pai_line(8, "img/last.jpg"),  # no line break at the end
    ]
    return "\ufeff".encode() + "".join(parts).encode()


def quoted_csv() -> bytes:
    """Quoted cells holding ``\\n``, ``\\r\\n`` and ``\\r``, and lines inside them that look
    like records."""
    multi = json.dumps([{"text": '{"class*": "car"}', "coord": ["1", "1", "9", "1", "9", "6", "1", "6"]}], indent=1)
    parts = [
        pai_line(1, "a.jpg", multi) + "\n",
        "2," + cell('{"url":\n "b.jpg"}') + "," + cell(BOX) + "\r\n",
        "3," + cell("note\r\n" + pai_line(99, "fake.jpg") + "\n7,{},[]\n# not a comment\r") + ",[]\n",
        pai_line(4, "d.jpg", multi.replace("\n", "\r")) + "\n",
        pai_line(5, "e.jpg") + "\n",
    ]
    return "".join(parts).encode()


def itag(source: str, text: str = "标签") -> str:
    poly = {"type": "image/polygon", "value": [[1, 1], [9, 1], [9, 6], [1, 6]], "labels": {"单选": text}}
    return json.dumps({"data": {"source": source}, "label-1": {"results": [{"data": [poly]}]}}, ensure_ascii=False)


def hostile_manifest() -> bytes:
    parts = [
        itag("a.jpg") + "\r\n",
        "\n",
        "   \t\n",
        itag("b.jpg", "x\u2028y\u0085z") + "\r",  # U+2028 and U+0085 inside a JSON string: one line
        "{not json\n",
        itag("c" * 700 + ".jpg") + "\n",  # longer than most ranges
        "\r\n\r",
        json.dumps({"data": {}}) + "\x0b\x0c\n",  # \v and \f: no line break here (JSON whitespace? no: discarded)
        itag("d.jpg") + "\n\n",
    ]
    return "\ufeff".encode() + "".join(parts).encode() + b'{"bad": "\xff\xfe"}\n' + itag("e.jpg").encode()


def reference_csv(data: bytes) -> list[tuple[int, list[str]]]:
    """The local CSV parser as it was before byte ranges: ``csv`` over the whole text."""
    text = data.decode("utf-8-sig")
    records = [r for r in csv.reader(io.StringIO(text, newline="")) if r and any(c.strip() for c in r)]
    records = [r for r in records if not r[0].lstrip().startswith("#")]
    if records and len(records[0]) >= 2 and not records[0][1].lstrip().startswith(("{", "[")):
        records = records[1:]
    return list(enumerate(records, start=1))


def split_items(items) -> tuple[list[Row], list[DiscardRecord]]:
    rows = [i for i in items if isinstance(i, Row)]
    return rows, [i for i in items if isinstance(i, DiscardRecord)]


def read_in_ranges(url, fmt, range_bytes, size, model_type="DETECTION", storage_options=None):
    """Every range of ``range_bytes`` read in turn, each numbering on from the ones before."""
    items, spans, n = [], [], 0
    for start, end in plan_ranges(size, range_bytes):
        span = AnnotationSpan(url, model_type, fmt, start, end, storage_options, first_number=n + 1)
        got = list(span)
        assert all(span.first_number <= (i.number if isinstance(i, Row) else i.row) <= n + span.numbers for i in got)
        items.extend(got)
        n += span.numbers
        spans.append((span.first, span.stop))
    rows, discards = split_items(items)
    return rows, discards, spans_agree(spans)


def test_plan_ranges_cover_the_file_once():
    assert plan_ranges(0, 5) == [(0, 0)]
    assert plan_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert plan_ranges(3, 100) == [(0, 3)]
    with pytest.raises(ValueError, match="range_bytes"):
        plan_ranges(10, 0)


def test_csv_ranges_of_every_size_give_the_local_parsers_rows_and_discards(tmp_path):
    data = hostile_csv()
    path = tmp_path / "ann.csv"
    path.write_bytes(data)
    url = str(path)
    rows, discards = read_annotation_csv(url, "DETECTION")
    # the local parser reads the records csv reads from the whole text, numbered as before
    want = reference_csv(data)
    assert sorted([r.number for r in rows] + [d.row for d in discards]) == [n for n, _ in want]
    assert [r.values["id"] for r in rows] == [cells[0] for n, cells in want if n in {r.number for r in rows}]
    assert [r.values["id"] for r in rows] == ["1", "4", "7", "8"]
    assert rows[0].image_uri.endswith("img/ä.jpg") and rows[-1].image_uri.endswith("img/last.jpg")
    why = {d.row: d.reason for d in discards}
    assert set(why) == {2, 3, 5, 6} and "not valid JSON" in why[3] and "found 2" in why[6]
    for range_bytes in range(1, len(data) + 1):
        got_rows, got_discards, bad = read_in_ranges(url, "csv", range_bytes, len(data))
        assert bad is None, range_bytes
        assert (got_rows, got_discards) == (rows, discards), range_bytes


def test_csv_header_is_found_in_whatever_range_holds_it(tmp_path):
    """A header after a long comment lies in a later range; a header-like data record in a
    later range is data (discarded), never skipped as a header."""
    data = ("#" * 300 + "\n" + "id,raw,answer\n" + pai_line(1, "a.jpg") + "\n" + "2,plain,text\n").encode()
    (tmp_path / "a.csv").write_bytes(data)
    rows, discards = read_annotation_csv(str(tmp_path / "a.csv"), "DETECTION")
    assert [r.number for r in rows] == [1] and [d.row for d in discards] == [2]
    for range_bytes in (100, 301, 302, 310, 315, 316, 317):
        assert read_in_ranges(str(tmp_path / "a.csv"), "csv", range_bytes, len(data))[:2] == (rows, discards)


def test_csv_quoted_line_breaks_agree_or_are_detected_at_the_offset(tmp_path):
    data = quoted_csv()
    path = tmp_path / "q.csv"
    path.write_bytes(data)
    url = str(path)
    rows, discards = read_annotation_csv(url, "DETECTION")
    assert [r.values["id"] for r in rows] == ["1", "2", "4", "5"] and [d.row for d in discards] == [3]
    assert rows[1].image_uri.endswith("b.jpg") and "raw data is not valid JSON" in discards[0].reason
    # line starts inside quoted cells: where a range may wrongly begin
    starts = {m.end() for m in re.finditer(rb"\r\n|\r|\n", data)}
    reader = LineReader(url, 0)
    recs = csv.reader(line.decode() for _, line in reader.lines())
    boundaries = {0}
    for _ in recs:
        boundaries.add(reader.position)
    inside = starts - boundaries
    assert inside
    detected = set()
    for range_bytes in range(1, len(data) + 1):
        got_rows, got_discards, bad = read_in_ranges(url, "csv", range_bytes, len(data))
        if bad is None:
            assert (got_rows, got_discards) == (rows, discards), range_bytes
        else:
            assert bad in inside, (range_bytes, bad)
            detected.add(bad)
    assert detected  # some range sizes do start inside a quoted cell, and each is caught


def test_itag_ranges_of_every_size_give_the_local_parsers_rows_and_discards(tmp_path):
    data = hostile_manifest()
    path = tmp_path / "a.manifest"
    path.write_bytes(data)
    url = str(path)
    rows, discards = read_itag_manifest(url, "DETECTION")
    # lines end at \n, \r\n, \r only; blank lines are numbered and skipped
    lines = re.split(r"\r\n|\r|\n", data.decode("utf-8-sig", "replace"))
    want = [i for i, ln in enumerate(lines, start=1) if ln.strip()]
    assert sorted([r.number for r in rows] + [d.row for d in discards]) == want
    assert [r.image_uri.rsplit("/", 1)[-1][:2] for r in rows] == ["a.", "b.", "cc", "d.", "e."]
    assert rows[1].annotation["objects"][0]["class"] == "x\u2028y\u0085z"
    for range_bytes in range(1, len(data) + 1):
        got_rows, got_discards, bad = read_in_ranges(url, "itag", range_bytes, len(data))
        assert bad is None, range_bytes
        assert (got_rows, got_discards) == (rows, discards), range_bytes


@pytest.mark.parametrize("data", [b"", b"\xef\xbb\xbf", b"\n\r\n\r", b"   \n"])
@pytest.mark.parametrize("fmt", ["csv", "itag"])
def test_empty_and_blank_files_give_no_rows_in_any_range(tmp_path, data, fmt):
    path = tmp_path / "empty"
    path.write_bytes(data)
    for range_bytes in range(1, len(data) + 2):
        assert read_in_ranges(str(path), fmt, range_bytes, len(data)) == ([], [], None)


def test_csv_that_is_not_utf8_names_file_and_byte_offset_in_any_range(tmp_path):
    data = (pai_line(1, "a.jpg") + "\n").encode() + b"2,\xff\xfe,[]\n"
    path = tmp_path / "latin.csv"
    path.write_bytes(data)
    offset = data.index(b"\xff")
    with pytest.raises(ValueError, match=rf"latin\.csv: not UTF-8 text \(byte offset {offset}\)"):
        read_annotation_csv(str(path), "DETECTION")
    for range_bytes in (1, 7, offset, len(data)):
        with pytest.raises(ValueError, match=rf"latin\.csv: not UTF-8 text \(byte offset {offset}\)"):
            read_in_ranges(str(path), "csv", range_bytes, len(data))


def test_ranges_of_a_file_on_s3_give_the_local_parsers_rows(tmp_path, s3_bucket):
    import boto3

    bucket, so = s3_bucket
    for name, data, fmt in (("a.csv", hostile_csv(), "csv"), ("a.manifest", hostile_manifest(), "itag")):
        boto3.client("s3", endpoint_url=so["endpoint_url"]).put_object(Bucket=bucket, Key=name, Body=data)
        (tmp_path / name).write_bytes(data)
        url = f"s3://{bucket}/{name}"
        rows, discards = (read_annotation_csv if fmt == "csv" else read_itag_manifest)(url, "DETECTION", so)
        local = (read_annotation_csv if fmt == "csv" else read_itag_manifest)(str(tmp_path / name), "DETECTION")
        assert [(r.number, r.values, r.annotation) for r in rows] == [(r.number, r.values, r.annotation)
                                                                       for r in local[0]]
        assert rows[0].image_uri.startswith(f"s3://{bucket}/") and rows[0].origin == url
        for range_bytes in (13, 97, 500, len(data)):
            assert read_in_ranges(url, fmt, range_bytes, len(data), storage_options=so) == (rows, discards, None)


def test_line_reader_gives_the_lines_splitlines_gives_from_any_start_with_any_fetch_size(tmp_path):
    """Reads of 1, 2, 3 or 7 bytes at a time (a \\r at the end of one read, its \\n in the next)
    and every start: the lines of ``bytes.splitlines`` that start at or after it."""
    import random

    rnd = random.Random(5)
    data = bytes(rnd.choice(b"ab\r\n\xc3\xa4") for _ in range(120)) + b"\r"
    path = tmp_path / "lines"
    path.write_bytes(data)
    whole, at = [], 0
    for line in data.splitlines(keepends=True):
        whole.append((at, line))
        at += len(line)
    for start in range(len(data) + 2):
        want = [(o, ln) for o, ln in whole if o >= start]
        for read_bytes in (1, 2, 3, 7):
            reader = LineReader(str(path), start, read_bytes=read_bytes)
            assert reader.first == (want[0][0] if want else len(data)), (start, read_bytes)
            assert list(reader.lines()) == want, (start, read_bytes)

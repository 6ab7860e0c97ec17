"""read_csv: types from record_defaults, required columns, quoting, select_cols, errors
that name file, line and column."""

from __future__ import annotations

import io

import numpy as np
import pytest

import shardfeed as sf
from shardfeed.pipeline import CsvError, read_csv
from shardfeed.pipeline.text import TextStreamError


def write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_types_come_from_the_defaults_and_empty_fields_take_them(tmp_path):
    p = write(tmp_path, "1,2.5,abc,b\n,,,\n")
    rows = list(read_csv(p, [7, 0.5, "dflt", b"B"]))
    assert rows[0] == (1, 2.5, "abc", b"b") and rows[1] == (7, 0.5, "dflt", b"B")
    assert isinstance(rows[0][0], np.int64) and isinstance(rows[0][1], np.float32)


def test_batch_gives_typed_numpy_columns(tmp_path):
    p = write(tmp_path, "1,2.5,a\n3,4.5,b\n")
    ids, vals, names = next(iter(read_csv(p, [0, 0.0, ""]).batch(2)))
    assert ids.dtype == np.int64 and ids.tolist() == [1, 3]
    assert vals.dtype == np.float32 and names.tolist() == ["a", "b"]


def test_required_columns_reject_empty_fields_naming_file_line_column(tmp_path):
    p = write(tmp_path, "1,x\n2,\n")
    for required in ([], str):
        with pytest.raises(CsvError) as info:
            list(read_csv(p, [0, required]))
        assert info.value.line == 2 and info.value.column == 1 and "t.csv, line 2, column 1" in str(info.value)
    with pytest.warns(DeprecationWarning), pytest.raises(CsvError) as info:  # the deprecated spelling, still required
        list(read_csv(p, [0, None]))
    assert info.value.line == 2 and info.value.column == 1


def test_typed_required_column_and_tensorflow_list_spelling(tmp_path):
    p = write(tmp_path, "1,2\n")
    assert list(read_csv(p, [[0], float])) == [(1, np.float32(2.0))]
    assert list(read_csv(p, [np.float64(0), np.int32])) == [(1.0, 2)]


def test_bad_value_error_names_the_type(tmp_path):
    p = write(tmp_path, "h\n1\nx1\n", "bad.csv")
    with pytest.raises(CsvError, match=r"bad\.csv, line 3, column 0: cannot parse 'x1' as int64"):
        list(read_csv(p, [0], header=True))


def test_quoting_embedded_delimiters_quotes_and_newlines(tmp_path):
    p = write(tmp_path, '"a,b","say ""hi""","two\nlines"\n')
    assert list(read_csv(p, ["", "", ""])) == [("a,b", 'say "hi"', "two\nlines")]


def test_unclosed_quote_is_reported_where_the_row_starts(tmp_path):
    p = write(tmp_path, 'ok,1\n"open,2\nmore\n')
    with pytest.raises(CsvError, match="line 2.*not closed"):
        list(read_csv(p, ["", 0]))


def test_wrong_field_count(tmp_path):
    p = write(tmp_path, "1,2,3\n")
    with pytest.raises(CsvError, match="expected 2 fields"):
        list(read_csv(p, [0, 0]))


def test_select_cols_header_and_delimiter(tmp_path):
    p = write(tmp_path, "a|b|c\n1|skip|3.5\n")
    assert list(read_csv(p, [0, 0.0], field_delim="|", header=True, select_cols=[0, 2])) == [(1, 3.5)]
    with pytest.raises(ValueError, match="increasing"):
        read_csv(p, [0, 0.0], select_cols=[2, 0])
    with pytest.raises(ValueError, match="select_cols has 1"):
        read_csv(p, [0, 0.0], select_cols=[0])


def test_header_is_skipped_in_every_file(tmp_path):
    a = write(tmp_path, "x\n1\n", "a.csv")
    b = write(tmp_path, "x\n2\n", "b.csv")
    assert [r[0] for r in read_csv([a, b], [0], header=True)] == [1, 2]


@pytest.mark.parametrize("defaults,delim", [([], ","), ("abc", ","), ([0], ",,"), ([object()], ",")])
def test_bad_arguments(tmp_path, defaults, delim):
    p = write(tmp_path, "1\n")
    with pytest.raises((ValueError, TypeError)):
        read_csv(p, defaults, field_delim=delim)


# -- record_defaults: None has one meaning (keep the source's type), deprecated here -----------
def test_none_in_read_csv_and_decode_csv_warns_naming_the_entry_and_the_spelling_to_use(tmp_path):
    import warnings

    from shardfeed.pipeline.csv import decode_csv

    p = write(tmp_path, "1,x\n")
    with pytest.warns(DeprecationWarning, match=r"read_csv: record_defaults\[1\] is None.*write str \(or \[\]") as w:
        assert list(read_csv(p, [0, None])) == [(1, "x")]  # still a str column
    assert w[0].filename == __file__  # points at the caller's line
    with pytest.warns(DeprecationWarning, match=r"decode_csv: record_defaults\[0, 1\] is None") as w:
        a, b = decode_csv(["p,q"], [None, None])
    assert a.tolist() == ["p"] and b.tolist() == ["q"] and w[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the spellings that stay say the same without a warning
        assert list(read_csv(p, [0, str])) == list(read_csv(p, [0, []])) == [(1, "x")]


# -- found from outside (the ninth round) -------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_line_breaks_inside_a_quoted_field_come_back_as_written(tmp_path, gz):
    """A CRLF inside a quoted field came back as LF (the lines were joined with '\\n'):
    the field's bytes changed. Python's csv and TensorFlow's CsvDataset keep it."""
    import csv as pycsv
    import gzip

    text = b'"multi\r\nline",x\r\n"lone\rcr",y\n"two\nbreaks\r\nmixed",z'
    path = tmp_path / ("t.csv.gz" if gz else "t.csv")
    path.write_bytes(gzip.compress(text) if gz else text)
    want = [tuple(r) for r in pycsv.reader(io.StringIO(text.decode(), newline=""))]
    assert list(sf.read_csv(str(path), ["", ""])) == want
    assert want[0][0] == "multi\r\nline" and want[2][0] == "two\nbreaks\r\nmixed"


def test_fields_past_pythons_csv_limit_are_read(tmp_path):
    """read_csv refused any field over 131,072 characters (the csv module's default limit)
    where read_table and conversion read them."""
    big = "a" * 300_000
    (tmp_path / "t.csv").write_text(f'1,"{big}"\n2,b\n')
    assert list(sf.read_csv(str(tmp_path / "t.csv"), [0, ""])) == [(1, big), (2, "b")]
    assert sf.decode_csv([f'1,"{big}"'], [0, ""])[1][0] == big


@pytest.mark.parametrize("damage", ["cut", "garbled"])
def test_a_damaged_gzip_file_names_the_file_line_and_offset(tmp_path, damage):
    """A cut or garbled .gz read by read_text or read_csv raised a bare EOFError / zlib error
    naming no file (with several files, which one?); the lines before it were right."""
    import gzip

    rows = [f"{i},{'v' * (i % 50)}" for i in range(20000)]
    good = tmp_path / "a.csv.gz"
    good.write_bytes(gzip.compress("\n".join(rows[:100]).encode() + b"\n"))
    data = bytearray(gzip.compress("\n".join(rows).encode() + b"\n"))
    if damage == "cut":
        data = data[:len(data) // 2]
    else:  # the trailer's CRC-32: every line inflates, the check at the end fails
        data[-8] ^= 0xFF
    bad = tmp_path / "b.csv.gz"
    bad.write_bytes(bytes(data))
    got = []
    with pytest.raises(sf.CsvError, match=r"b\.csv\.gz, line \d+: damaged compressed file at byte [\d,]+") as info:
        for r in sf.read_csv([str(good), str(bad)], [0, ""]):
            got.append(r)
    assert info.value.url.endswith("b.csv.gz") and info.value.line == len(got) - 100 + 1
    assert [f"{a},{b}" for a, b in got] == rows[:100] + rows[:len(got) - 100]
    lines = []
    with pytest.raises(TextStreamError, match=r"b\.csv\.gz, line \d+ \(byte [\d,]+ of the uncompressed text\)") as info:
        for line in sf.read_text([str(good), str(bad)]):
            lines.append(line)
    assert info.value.line == len(lines) - 100 + 1 and info.value.offset > 0
    assert lines[:100] == rows[:100] and lines[100:] == rows[:len(lines) - 100]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "cp037"])
def test_an_encoding_that_does_not_write_line_breaks_as_ascii_is_refused_at_once(tmp_path, encoding):
    """A valid UTF-16 file failed on its second line (split on the byte 0x0A before decoding):
    such encodings are refused when the dataset is made, saying what to do."""
    path = tmp_path / "t.txt"
    path.write_bytes("ab\ncd\n".encode(encoding))
    for make in (lambda: sf.read_text(str(path), encoding=encoding),
                 lambda: sf.read_csv(str(path), [""], encoding=encoding)):
        with pytest.raises(ValueError, match=r"does not write line breaks as ASCII bytes.*utf-8"):
            make()
    for ok in ("latin-1", "cp1252", "gbk", "shift_jis", "UTF8", "utf-8-sig"):
        sf.read_text(str(path), encoding=ok)
    bom = tmp_path / "bom.csv"  # Excel's UTF-8 with a byte-order mark: read, the mark dropped
    bom.write_bytes("id,name\n1,a\n".encode("utf-8-sig"))
    assert list(sf.read_csv(str(bom), [0, ""], header=True, encoding="utf-8-sig")) == [(1, "a")]
    assert list(sf.read_text(str(bom), encoding="utf-8-sig")) == ["id,name", "1,a"]
    with pytest.raises(LookupError, match="unknown encoding"):
        sf.read_text(str(path), encoding="no-such-codec")


@pytest.mark.parametrize("cell", ["1_000", "\u0661\u0662", "\uff11\uff12"])
def test_numbers_are_ascii_digits_without_separators_as_tensorflow_reads_them(tmp_path, cell):
    """'1_000' and other scripts' digits were read as numbers (Python's int and float take
    them); TensorFlow's CsvDataset refuses them ('not a valid int64')."""
    with pytest.raises(CsvError, match=rf"line 2, column 0: cannot parse '{cell}' as int64"):
        list(read_csv(write(tmp_path, f"1,2.5\n{cell},0.5\n"), [0, 0.0]))
    with pytest.raises(CsvError, match=rf"line 2, column 1: cannot parse '{cell}' as float32"):
        list(read_csv(write(tmp_path, f"1,2.5\n2,{cell}\n", "f.csv"), [0, 0.0]))

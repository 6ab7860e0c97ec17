"""CSV text to rows: cells as long as :data:`CSV_FIELD_LIMIT`, errors naming the file and
line, and the layout a CSV's first row says (a header, or a row of the expected columns)."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator, Sequence

from ..pipeline.csv import CSV_FIELD_LIMIT, allow_long_fields
from .options import Discard
from .schema import AUTOML_COLUMNS, Schema, header_matches_automl, normalize_split


def csv_lines(text: str, origin: str) -> Iterator[list[str]]:
    """The rows of a CSV text, lines of blank cells left out; a row the csv module refuses
    is a ``ValueError`` naming ``origin`` and the line, and so is a quoted cell never closed
    (the csv module would end it at the end of the text, every row after it inside it)."""
    allow_long_fields()
    reader = csv.reader(io.StringIO(text, newline=""))
    before = after = 0  # the lines read before the last row, and with it
    row: list[str] = []
    try:
        for row in reader:
            before, after = after, reader.line_num
            # a line of blank cells is no row (a cell with anything but whitespace in it makes
            # their join non-blank)
            if row and (row[0].strip() or "".join(row).strip()):
                yield row
    except csv.Error as exc:
        limit = csv.field_size_limit()
        what = (f"a cell longer than {limit} characters (CSV_FIELD_LIMIT)" if "field limit" in str(exc)
                else f"not CSV ({exc})")
        raise ValueError(f"{origin}: line {reader.line_num}: {what}") from None
    # a quote never closed makes the rest of the text one cell: its last row then holds a
    # line break or the text ends without one (only then are its lines read again)
    if row and (text[-1] not in "\r\n" or any("\n" in c or "\r" in c for c in row)):
        last = list(itertools.islice(io.StringIO(text, newline=""), before, None))
        if _unclosed(last):
            n = len(last)
            raise ValueError(f"{origin}: line {before + 1}: a quoted cell opened in this row is never closed, so "
                             f"everything from there to the end ({n} line{'' if n == 1 else 's'}) would be one "
                             'cell; close the quote, or write a quote inside a quoted cell as ""')


def _unclosed(lines: list[str]) -> bool:
    """Whether the last row of a text, ``lines``, ends inside a quoted cell."""
    try:
        for _ in csv.reader(lines, strict=True):
            pass
    except csv.Error as exc:
        return "unexpected end of data" in str(exc)
    return False


def _shown(cells: Sequence[str]) -> str:
    return ",".join(c[:40] for c in cells[:8]) + (",..." if len(cells) > 8 else "")


def csv_layout(first: Sequence[str], schema: Schema | None, origin: str, header: bool | None = None
               ) -> tuple[bool, list[str]]:
    """``(whether the first row is a header, the columns)`` of a CSV whose first row is
    ``first`` (cells stripped). ``header=None`` detects one: a row holding all the schema's
    column names, or ``split,image_uri,label``. A first row that is neither such a header
    nor a row of the expected layout raises ``ValueError`` (before any row is converted):
    another layout's header would otherwise be read as data and every row discarded."""
    if header is None:
        header = header_matches_automl(first) or (schema is not None and set(schema.columns) <= set(first))
    if header:
        seen: set[str] = set()
        for c in first:  # a repeated name would keep one column's cells and drop the other's
            if c in seen:
                raise ValueError(f"{origin}: the header names column {c!r} twice; give each column its own name")
            seen.add(c)
        return True, list(first)
    columns = list(schema.columns) if schema is not None else list(AUTOML_COLUMNS)
    where = f"{origin}: the first row ({_shown(first)})"
    if schema is None:
        try:
            normalize_split(first[0] if first else "")
            is_split = True
        except Discard:
            is_split = False
        if len(first) != len(columns) or not is_split:
            why = (f"has {len(first)} cells" if len(first) != len(columns)
                   else f"starts with {first[0][:40]!r}, which is no split (TRAIN, VALIDATION, TEST, UNASSIGNED "
                        "or empty)")
            raise ValueError(
                f"{where} {why}: not the AutoML layout split,image_uri,label (header optional); for other "
                "columns pass schema={column: type} (--schema), with a header naming them")
        return False, columns
    named = [c for c in first if c in schema.columns]
    if named:
        lacks = [c for c in columns if c not in first]
        raise ValueError(f"{where} looks like a header (it names {', '.join(named[:8])}) but lacks "
                         f"{', '.join(lacks)} of the schema's columns; name every schema column in the header")
    if len(first) != len(columns):
        raise ValueError(
            f"{where} has {len(first)} cells, the schema {len(columns)} columns: without a header naming "
            f"them the cells are read in the schema's order ({', '.join(columns[:8])}); add a header row "
            "naming the columns")
    return False, columns


__all__ = ["CSV_FIELD_LIMIT", "csv_layout", "csv_lines"]

"""Annotation files to rows: PAI annotation CSV (``id, raw JSON {url}, answer JSON``) and
iTAG ``.manifest`` JSON lines, for each ``model_type``.

The answer is parsed here, when the plan is made, into a plain ``annotation`` dict:

- CLASSIFICATION, VIDEO_CLASSIFICATION: ``{"classes": [name, ...]}`` (one name, or several
  for multi-label; the row's URL is the image's or the video's)
- DETECTION, TEXT_DETECTION, TEXT_END2END: ``{"objects": [{"points": [[x, y] * 4],
  "class": str | None, "text": str | None, "direction": str | None}], "direction": str | None}``
- INSTANCE_SEGMENTATION: the same with polygons of any number (at least 3) of points:
  ``coord`` holds ``x1, y1, ..., xn, yn`` in the CSV, ``value`` ``[[x, y], ...]`` in iTAG
- SEGMENTATION: ``{"mask_url": str}``
- TEXT_RECOGNITION: ``{"text": str}``
- SELF_DEFINED: ``{"raw": ..., "answer": ...}`` (parsed JSON where it parses, else the text)

A row whose JSON does not parse, or does not have the shape its model type needs, is
reported with its row number and the reason and left out; the job goes on.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from .. import storage
from ..pipeline.csv import allow_long_fields
from ..storage.urls import mask
from .options import Discard, DiscardRecord, Row
from .sources import _dirname, resolve_uri
from .textspans import BOM, READ_BYTES, LineReader, strip_eol

_CLASS_KEYS = ("class*", "class", "单选", "label", "类别", "category")
_TEXT_KEYS = ("text", "OCR识别结果", "ocr", "文本")
BOX_TYPES = ("DETECTION", "TEXT_DETECTION", "TEXT_END2END")
LABEL_TYPES = ("CLASSIFICATION", "VIDEO_CLASSIFICATION")  # answers that are class names


def _json(text: Any, what: str) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Discard(f"{what} is not valid JSON ({exc.msg} at char {exc.pos})") from None


def _points_from_coord(coord: Any, any_polygon: bool = False) -> list[list[float]]:
    """4 points from ``x1,y1,...,x4,y4``; with ``any_polygon`` any even count of at least 6."""
    n = len(coord) if isinstance(coord, list) else None
    if any_polygon:
        if n is None or n < 6 or n % 2:
            raise Discard(f"coord must hold an even number (at least 6) of numbers x1,y1,...,xn,yn, got "
                          f"{n if n is not None else type(coord).__name__}")
    elif n != 8:
        got = n if n is not None else type(coord).__name__
        raise Discard(f"coord must hold 8 numbers (x1,y1,...,x4,y4), got {got}")
    try:
        vals = [float(v) for v in coord]
    except (TypeError, ValueError):
        raise Discard(f"coord holds a value that is not a number: {coord!r:.80}") from None
    if not all(math.isfinite(v) for v in vals):  # NaN, Infinity (JSON as Python reads it), "inf"
        raise Discard(f"coord holds a value that is not a finite number: {coord!r:.80}")
    return [[vals[i], vals[i + 1]] for i in range(0, len(vals), 2)]


def _points_from_polygon(value: Any, any_polygon: bool = False) -> list[list[float]]:
    """4 ``[x, y]`` points; with ``any_polygon`` at least 3."""
    pairs = isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value)
    if not pairs or (len(value) < 3 if any_polygon else len(value) != 4):
        want = "at least 3" if any_polygon else "4"
        raise Discard(f"polygon must have {want} [x, y] points, got {json.dumps(value)[:80]}")
    try:
        points = [[float(x), float(y)] for x, y in value]
    except (TypeError, ValueError):
        raise Discard("polygon holds a value that is not a number") from None
    if not all(math.isfinite(v) for p in points for v in p):
        raise Discard("polygon holds a value that is not a finite number (NaN or Infinity)")
    return points


def _pick(d: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    lowered = {str(k).lower(): v for k, v in d.items()}
    for k in keys:
        for lk, v in lowered.items():
            if k.lower() in lk:
                return v
    return None


def _csv_object(obj: Any, any_polygon: bool = False) -> dict[str, Any]:
    if not isinstance(obj, dict) or "coord" not in obj:
        raise Discard(f"object must be {{'text': ..., 'coord': [...]}}, got {json.dumps(obj, ensure_ascii=False)[:80]}")
    attrs = _json(obj.get("text", "{}"), "object text") if obj.get("text") is not None else {}
    if not isinstance(attrs, dict):
        attrs = {"text": str(attrs)}
    return {"points": _points_from_coord(obj["coord"], any_polygon),
            "class": _str_or_none(_pick(attrs, ("class*", "class"))),
            "text": _str_or_none(attrs.get("text")), "direction": _str_or_none(attrs.get("direction"))}


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def parse_answer(model_type: str, answer: Any) -> dict[str, Any]:
    """The normalized annotation (module docstring) of a PAI CSV answer; raises Discard."""
    if model_type == "SELF_DEFINED":
        try:
            return {"answer": json.loads(answer) if isinstance(answer, str) else answer}
        except ValueError:
            return {"answer": answer}
    a = _json(answer, "answer")
    if model_type in LABEL_TYPES:
        if not isinstance(a, dict) or "option" not in a:
            raise Discard("classification answer must be {'option': name} or {'option': [names]}")
        opt = a["option"]
        names = opt if isinstance(opt, list) else [opt]
        if not names or not all(isinstance(n, (str, int)) and str(n).strip() for n in names):
            raise Discard("classification answer has an empty or non-text option")
        return {"classes": [str(n).strip() for n in names]}
    if model_type == "SEGMENTATION":
        if not isinstance(a, dict) or not isinstance(a.get("ossUrl") or a.get("url"), str):
            raise Discard("segmentation answer must be {'ossUrl': mask PNG URL}")
        return {"mask_url": a.get("ossUrl") or a.get("url")}
    if model_type == "TEXT_RECOGNITION":
        if not isinstance(a, dict) or not isinstance(a.get("text"), str):
            raise Discard("text recognition answer must be {'text': string}")
        return {"text": a["text"]}
    if model_type in ("DETECTION", "INSTANCE_SEGMENTATION"):
        if not isinstance(a, list):
            what = model_type.lower().replace("_", " ")
            raise Discard(f"{what} answer must be a list of {{'text', 'coord'}} objects")
        polygons = model_type == "INSTANCE_SEGMENTATION"
        return {"objects": [_csv_object(o, polygons) for o in a], "direction": None}
    if model_type in ("TEXT_DETECTION", "TEXT_END2END"):
        if not isinstance(a, list) or not a or not isinstance(a[0], list):
            raise Discard("text answer must be [[{'text', 'coord'}, ...], {'option': direction}]")
        direction = a[1].get("option") if len(a) > 1 and isinstance(a[1], dict) else None
        objects = [_csv_object(o) for o in a[0]]
        if model_type == "TEXT_END2END" and any(o["text"] is None for o in objects):
            raise Discard("an end-to-end OCR text line has no 'text'")
        return {"objects": objects, "direction": _str_or_none(direction)}
    raise ValueError(f"no annotation parser for model_type {model_type}")


def _csv_item(number: int, cells: list[str], model_type: str, origin: str, base: str) -> Row | DiscardRecord:
    """The row of one data record of a PAI annotation CSV, or its discard."""
    image = None
    try:
        if len(cells) != 3:
            raise Discard(f"expected 3 cells (id, raw data JSON, answer JSON), found {len(cells)}")
        raw = _json(cells[1], "raw data")
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str) or not raw["url"].strip():
            raise Discard("raw data must be a JSON object with a 'url'")
        image = resolve_uri(raw["url"], base)
        ann = parse_answer(model_type, cells[2])
        if model_type == "SEGMENTATION":
            ann["mask_url"] = resolve_uri(ann["mask_url"], base)
        if model_type == "SELF_DEFINED":
            ann["raw"] = raw
        return Row(number, origin, image, None, None, {"id": cells[0].strip()}, ann)
    except Discard as d:
        return DiscardRecord(number, image or f"{origin}#{number}", str(d))


def _is_data(cells: list[str]) -> bool:
    """Whether a CSV record is data: not blank, not a ``#`` comment."""
    return bool(cells) and any(c.strip() for c in cells) and not cells[0].lstrip().startswith("#")


def _is_header(cells: list[str]) -> bool:
    """Whether the file's first data record is a header (its second cell is not JSON)."""
    return len(cells) >= 2 and not cells[1].lstrip().startswith(("{", "["))


def read_annotation_csv(url: str, model_type: str, storage_options: Mapping[str, Any] | None = None
                        ) -> tuple[list[Row], list[DiscardRecord]]:
    """Rows of a PAI annotation CSV: ``id, raw JSON with url, answer JSON`` per record.

    Lines starting with ``#`` and a header row (a second cell that is not JSON) are
    skipped; row numbers count data records from 1. Raises ``ValueError`` naming the byte
    offset of text that is not UTF-8. (:class:`AnnotationSpan` over the whole file.)
    """
    return AnnotationSpan(url, model_type, "csv", storage_options=storage_options).read()


def _itag_results(line: Mapping[str, Any]) -> list:
    """Results of the latest stage of the first labelling task: verify, then check, then label."""
    tasks = sorted(k for k in line if k.startswith("label-") and not k.endswith(("-check", "-verify")))
    if not tasks:
        tasks = sorted({k.rsplit("-", 1)[0] for k in line if k.startswith("label-")})
    if not tasks:
        raise Discard("no 'label-<task id>' result in this line")
    t = tasks[0]
    for key in (t + "-verify", t + "-check", t):
        stage = line.get(key)
        if isinstance(stage, dict) and isinstance(stage.get("results"), list) and stage["results"]:
            return stage["results"]
    raise Discard(f"{t!r} has no results")


def _itag_labels(labels: Any) -> tuple[str | None, str | None]:
    if not isinstance(labels, dict):
        return (str(labels) if labels is not None else None), None
    text = _pick(labels, _TEXT_KEYS)
    rest = {k: v for k, v in labels.items() if v is not text}
    cls = _pick(rest, _CLASS_KEYS)
    if cls is None and len(rest) == 1:
        cls = next(iter(rest.values()))
    if isinstance(cls, list):
        cls = cls[0] if cls else None
    return _str_or_none(cls), _str_or_none(text)


def parse_itag(model_type: str, line: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized annotation of one iTAG manifest line; raises Discard."""
    results = _itag_results(line)
    if model_type == "SELF_DEFINED":
        return {"answer": results, "raw": line.get("data")}
    if model_type in LABEL_TYPES:
        for r in results:
            d = r.get("data") if isinstance(r, dict) else None
            names = d if isinstance(d, list) else [d] if isinstance(d, (str, int)) else None
            if names and all(isinstance(n, (str, int)) for n in names):
                return {"classes": [str(n).strip() for n in names]}
        raise Discard("no classification result (a 'data' holding a label or a list of labels)")
    if model_type == "SEGMENTATION":
        for r in results:
            d = r.get("data") if isinstance(r, dict) else None
            url = (d or {}).get("ossUrl") if isinstance(d, dict) else r.get("ossUrl") if isinstance(r, dict) else None
            if isinstance(url, str):
                return {"mask_url": url}
        raise Discard("no segmentation result with an 'ossUrl' mask")
    objects = []
    for r in results:
        items = r.get("data") if isinstance(r, dict) else None
        if not isinstance(items, list):
            continue
        for item in items:
            if isinstance(item, dict) and item.get("type") == "image/polygon":
                cls, text = _itag_labels(item.get("labels"))
                points = _points_from_polygon(item.get("value"), model_type == "INSTANCE_SEGMENTATION")
                objects.append({"points": points, "class": cls, "text": text, "direction": None})
    if model_type == "TEXT_RECOGNITION":
        texts = [o["text"] for o in objects if o["text"] is not None]
        if not texts:
            raise Discard("no OCR text in the result")
        return {"text": texts[0]}
    if model_type == "TEXT_END2END" and any(o["text"] is None for o in objects):
        raise Discard("an end-to-end OCR text line has no text label")
    return {"objects": objects, "direction": None}


def _itag_item(number: int, text: str, model_type: str, origin: str, base: str) -> Row | DiscardRecord:
    """The row of one manifest line, or its discard."""
    image = None
    try:
        line = _json(text, "manifest line")
        if not isinstance(line, dict):
            raise Discard("manifest line is not a JSON object")
        src = (line.get("data") or {}).get("source") if isinstance(line.get("data"), dict) else None
        if not isinstance(src, str) or not src.strip():
            raise Discard("manifest line has no data.source")
        image = resolve_uri(src, base)
        ann = parse_itag(model_type, line)
        if "mask_url" in ann:
            ann["mask_url"] = resolve_uri(ann["mask_url"], base)
        return Row(number, origin, image, None, None, {}, ann)
    except Discard as d:
        return DiscardRecord(number, image or f"{origin}#{number}", str(d))


def read_itag_manifest(url: str, model_type: str, storage_options: Mapping[str, Any] | None = None
                       ) -> tuple[list[Row], list[DiscardRecord]]:
    """Rows of an iTAG ``.manifest`` (one JSON object per line; row = line number, blank
    lines counted and skipped; lines end at ``\\n``, ``\\r\\n`` or ``\\r``, see
    :mod:`~shardfeed.convert.textspans`). (:class:`AnnotationSpan` over the whole file.)"""
    return AnnotationSpan(url, model_type, "itag", storage_options=storage_options).read()


def annotation_format(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """``"itag"`` for an iTAG manifest (named ``.manifest`` / ``.jsonl``, or starting with
    ``{``), else ``"csv"`` (a PAI annotation CSV); reads the first 4 KB at most."""
    if url.lower().endswith((".manifest", ".jsonl")):
        return "itag"
    head = storage.read_bytes(url, 0, 4096, storage_options=storage_options).lstrip(BOM).lstrip()
    return "itag" if head.startswith(b"{") else "csv"


class AnnotationSpan:
    """The rows of the annotation records that start in bytes ``[start, end)`` of a PAI
    annotation CSV (``fmt="csv"``) or an iTAG manifest (``fmt="itag"``), numbered from
    ``first_number`` and named ``origin`` (default: the masked URL), with the local
    runner's parser: the whole file (the default) is what :func:`read_annotation_csv` /
    :func:`read_itag_manifest` read, and the ranges of a file
    (:func:`~shardfeed.convert.textspans.plan_ranges`) read one after another give the same
    rows and discards, numbered the same when each range starts where the ones before it
    stopped numbering (:attr:`numbers`).

    A record is owned by the range its first line starts in (a CSV record may span lines: a
    quoted cell with a line break); the reader reads past ``end`` to finish it. Numbers are
    data records for a CSV (after a header, blank and ``#`` comment records) and lines for a
    manifest (blank ones included). Iterate once; then :attr:`numbers` is how many numbers
    the range used, :attr:`first` the offset of its first line and :attr:`stop` the offset
    where its records end (the first record boundary at or after ``end``). A range that
    starts inside a quoted cell reads that cell's lines as records: the range before it then
    stops past this range's :attr:`first`, which :func:`spans_agree` detects.

    Raises ``ValueError`` naming the file and byte offset of CSV text that is not UTF-8 or
    a record the ``csv`` module refuses (a cell over its size limit).
    """

    def __init__(self, url: str, model_type: str, fmt: str, start: int = 0, end: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, first_number: int = 1, origin: str | None = None):
        if fmt not in ("csv", "itag"):
            raise ValueError(f"fmt must be 'csv' or 'itag', got {fmt!r}")
        self.url, self.model_type, self.fmt = url, model_type, fmt
        self.start, self.end, self.storage_options = start, end, storage_options
        self.first_number = first_number
        self.origin, self.base = origin or mask(url), _dirname(url)
        self.numbers = 0
        self.first = self.stop = start

    def _reader(self, start: int) -> LineReader:
        if start == 0 and self.end is None:  # the whole file: one read
            return LineReader(self.url, data=storage.read_bytes(self.url, storage_options=self.storage_options))
        span = READ_BYTES if self.end is None else self.end - start + 1
        return LineReader(self.url, start, self.storage_options, read_bytes=max(64 << 10, min(span, 8 << 20)))

    def _text(self, offset: int, line: bytes, errors: str) -> str:
        if offset == 0 and line.startswith(BOM):
            line, offset = line[len(BOM):], len(BOM)
        try:
            return line.decode("utf-8", errors)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.origin}: not UTF-8 text (byte offset {offset + exc.start})") from None

    def _csv_records(self, reader: LineReader, end: float, own: bool = True) -> Iterator[tuple[int, list[str]]]:
        """``(offset, cells)`` of the CSV records that start before ``end``; sets :attr:`stop`
        when ``own`` (the range's reader)."""
        at = reader.first

        def lines() -> Iterator[str]:
            for offset, line in reader.lines():
                yield self._text(offset, line, "strict")

        allow_long_fields()  # an answer cell may be long (a polygon of thousands of points): cells up to 2^30
        records = csv.reader(lines())
        while at < end:
            try:
                cells = next(records)
            except StopIteration:
                break
            except csv.Error as exc:
                raise ValueError(f"{self.origin}: the CSV record at byte offset {at} does not parse: {exc}") from None
            yield at, cells
            at = reader.position
        if own:
            self.stop = at

    def _first_data_offset(self) -> int | None:
        """Byte offset of the file's first data record (reads from the start up to it)."""
        for offset, cells in self._csv_records(LineReader(self.url, 0, self.storage_options, read_bytes=64 << 10),
                                               float("inf"), own=False):
            if _is_data(cells):
                return offset
        return None

    def __iter__(self) -> Iterator[Row | DiscardRecord]:
        reader = self._reader(self.start)
        self.first = self.stop = reader.first
        end = float("inf") if self.end is None else self.end
        number = self.first_number - 1
        if self.fmt == "itag":
            for offset, line in reader.lines():
                if offset >= end:
                    self.stop = offset
                    break
                number += 1
                self.numbers += 1
                text = (self._text(offset, strip_eol(line), "replace") if offset == 0
                        else strip_eol(line).decode("utf-8", "replace"))
                if text.strip():
                    yield _itag_item(number, text, self.model_type, self.origin, self.base)
            else:
                self.stop = reader.position
            return
        seen_data = False
        for offset, cells in self._csv_records(reader, end):
            if not _is_data(cells):
                continue
            if not seen_data:
                seen_data = True
                if _is_header(cells) and (self.first == 0 or self._first_data_offset() == offset):
                    continue
            number += 1
            self.numbers += 1
            yield _csv_item(number, cells, self.model_type, self.origin, self.base)

    def read(self) -> tuple[list[Row], list[DiscardRecord]]:
        """All the range's rows and discards."""
        rows: list[Row] = []
        discards: list[DiscardRecord] = []
        for item in self:
            (rows if isinstance(item, Row) else discards).append(item)  # type: ignore[arg-type]
        return rows, discards


def spans_agree(spans: list[tuple[int, int]]) -> int | None:
    """For ``(first, stop)`` of a file's ranges in order (see :class:`AnnotationSpan`): None
    when each range's records end where the next range's first line starts (every range
    started at a record), else the byte offset of the first line that is no record's start
    (a range began inside a quoted CSV cell that holds a line break)."""
    for (_, stop), (first, _) in zip(spans, spans[1:]):
        if stop != first:
            return first
    return None


def row_class_names(model_type: str, row: Row) -> list[str]:
    """Class names a row mentions (for a label map built from the data)."""
    ann = row.annotation
    if isinstance(ann, dict):
        if "classes" in ann:
            return list(ann["classes"])
        if "objects" in ann:
            return [o["class"] for o in ann["objects"] if o.get("class") is not None]
    if row.label is not None and not isinstance(row.label, int):
        return [str(row.label)]
    return []

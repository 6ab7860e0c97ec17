"""Class lists and label maps (PAI ``class_list_file``, ``default_class``, ``error_class``,
``ignore_class``) and the OCR character files (``char_replace_map_path``,
``default_char_dict_path``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import storage
from ..pipeline.csv import allow_long_fields
from ..storage.urls import mask
from .options import Discard


def _read_text(url: str, storage_options: Mapping[str, Any] | None) -> str:
    data = storage.read_bytes(url, storage_options=storage_options)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{mask(url)}: not UTF-8 text (byte offset {exc.start})") from None


def parse_class_list(text: str) -> dict[str, str]:
    """``{name: mapped}`` from lines ``name`` or ``name:mapped`` (blank lines ignored)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, mapped = line.partition(":")
        name, mapped = name.strip(), mapped.strip()
        out[name] = mapped if sep and mapped else name
    return out


@dataclass
class LabelMap:
    """Class names in label order (label id = position) and how input names map onto them.

    ``resolve(name)`` gives the target name: through the class list, then ``default_class``;
    ``None`` for ``error_class``; raises :class:`Discard` for a name it does not know.
    With no class list, names seen in the input are taken in sorted order.
    """

    names: list[str]
    mapping: dict[str, str] = field(default_factory=dict)
    default_class: str | None = None
    error_class: str | None = None
    ignore_class: str | None = None
    closed: bool = True

    def __post_init__(self) -> None:
        self.index = {n: i for i, n in enumerate(self.names)}

    def resolve(self, name: Any) -> str | None:
        name = str(name).strip()
        if self.error_class is not None and name == self.error_class:
            return None
        target = self.mapping.get(name, name if (name in self.index or not self.mapping) else None)
        if target is not None and self.error_class is not None and target == self.error_class:
            return None
        if target is None or target not in self.index:
            if self.default_class is not None:
                return self.default_class
            raise Discard(f"class {name[:60]!r} is not in the class list")
        return target

    def label(self, name: str) -> int:
        return self.index[name]

    def to_dict(self) -> dict[str, Any]:
        return {"classes": list(self.names), "label_map": {n: i for i, n in enumerate(self.names)},
                "mapping": dict(self.mapping), "default_class": self.default_class,
                "error_class": self.error_class, "ignore_class": self.ignore_class}


def build_label_map(seen: Iterable[str], class_list_file: str | None, *, default_class: str | None = None,
                    error_class: str | None = None, ignore_class: str | None = None,
                    storage_options: Mapping[str, Any] | None = None) -> LabelMap:
    """The label map for a conversion: from ``class_list_file`` when given, else from the
    class names ``seen`` in the input (sorted; ``error_class`` left out)."""
    if class_list_file:
        mapping = parse_class_list(_read_text(class_list_file, storage_options))
        if not mapping:
            raise ValueError(f"{mask(class_list_file)}: the class list is empty")
        names: list[str] = []
        for target in mapping.values():
            if target not in names and target != error_class:
                names.append(target)
    else:
        mapping = {}
        names = sorted({str(s).strip() for s in seen} - {error_class, None})
    if default_class is not None and default_class not in names:
        names.append(default_class)
    return LabelMap(names, mapping, default_class, error_class, ignore_class)


@dataclass
class CharTable:
    """OCR text handling: replacements applied first (longest original first), then each
    character mapped to its id in the dictionary (line k holds the character with id k-1)."""

    replace: dict[str, str] = field(default_factory=dict)
    chars: dict[str, int] | None = None

    def normalize(self, text: str) -> str:
        for original in sorted(self.replace, key=len, reverse=True):
            text = text.replace(original, self.replace[original])
        return text

    def ids(self, text: str) -> list[int]:
        if self.chars is None:
            return []
        out = []
        for ch in text:
            if ch not in self.chars:
                raise Discard(f"character {ch!r} is not in the character dictionary")
            out.append(self.chars[ch])
        return out


def load_char_table(replace_map_path: str | None, char_dict_path: str | None,
                    storage_options: Mapping[str, Any] | None = None) -> CharTable:
    replace: dict[str, str] = {}
    if replace_map_path:
        allow_long_fields()
        rows = list(csv.reader(io.StringIO(_read_text(replace_map_path, storage_options), newline="")))
        if rows and [c.strip().lower() for c in rows[0][:2]] == ["original", "replaced"]:
            rows = rows[1:]
        for i, r in enumerate(rows, start=1):
            if not r:
                continue
            if len(r) != 2:
                raise ValueError(f"{mask(replace_map_path)}: line {i}: expected 2 cells original,replaced, "
                                 f"got {len(r)}")
            replace[r[0]] = r[1]
    chars = None
    if char_dict_path:
        chars = {}
        for i, line in enumerate(_read_text(char_dict_path, storage_options).split("\n")):
            ch = line.rstrip("\r")
            if ch and ch not in chars:
                chars[ch] = i
    return CharTable(replace, chars)

"""Conversion of tables, DataFrames, image folders and annotation files (PAI CSV, iTAG
manifests) into sharded, indexed TFRecords with a manifest and a discard report; a
local runner and an Apache Beam runner (see docs/conversion.md).

The names load on first use (PEP 562): importing this package (as ``import shardfeed``
does, for the pandas accessor's hook) does not import the conversion stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .api import ConvertResult, convert, convert_annotations
    from .options import ConvertOptions, Discard, Row
    from .reading import find_manifest, load_manifest, manifest_spec, read_converted, read_dataset
    from .schema import COLUMN_TYPES, Schema
    from .tasks import ConvertContext

_MODULES: dict[str, tuple[str, ...]] = {
    "api": ("ConvertResult", "convert", "convert_annotations"),
    "reading": ("find_manifest", "load_manifest", "manifest_spec", "read_converted", "read_dataset"),
    "options": ("ConvertOptions", "Discard", "Row"),
    "schema": ("COLUMN_TYPES", "Schema"),
    "tasks": ("ConvertContext",),
}
__getattr__, __dir__ = lazy_names(__name__, _MODULES, globals())

__all__ = [
    "COLUMN_TYPES", "ConvertContext", "ConvertOptions", "ConvertResult", "Discard", "Row", "Schema", "convert",
    "convert_annotations", "find_manifest", "load_manifest", "manifest_spec", "read_converted", "read_dataset",
]

"""Conversion of tables, DataFrames, image folders and annotation files (PAI CSV, iTAG
manifests) into sharded, indexed TFRecords with a manifest and a discard report; a
local runner and an Apache Beam runner (see docs/conversion.md)."""

from .api import (
    ConvertResult,
    convert,
    convert_annotations,
    find_manifest,
    load_manifest,
    manifest_spec,
    read_converted,
    read_dataset,
)
from .options import ConvertOptions, Discard, Row
from .schema import COLUMN_TYPES, Schema
from .tasks import ConvertContext

__all__ = [
    "COLUMN_TYPES", "ConvertContext", "ConvertOptions", "ConvertResult", "Discard", "Row", "Schema", "convert",
    "convert_annotations", "find_manifest", "load_manifest", "manifest_spec", "read_converted", "read_dataset",
]

from .pandas_accessor import install as _install_pandas_accessor

_install_pandas_accessor()

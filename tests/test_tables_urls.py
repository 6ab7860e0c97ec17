"""Table URL parsing and backend routing."""

from __future__ import annotations

import importlib.util

import pytest

from shardfeed.tables import parse_table_url, read_table
from shardfeed.tables.urls import table_urls


def test_duckdb_url_splits_file_table_and_partitions():
    t = parse_table_url("duckdb:///data/wh.db/sample/pt=20260101/hh=3")
    assert (t.kind, t.location, t.table) == ("duckdb", "/data/wh.db", "sample")
    assert t.partitions == (("pt", "20260101"), ("hh", "3"))


def test_postgres_url_keeps_connection_and_masks_password():
    t = parse_table_url("postgresql://bob:s3cret@db.example:5433/prod/public.events/day=2026-01-01?sslmode=require")
    assert t.kind == "postgresql" and t.table == "public.events"
    assert t.location == "postgresql://bob:s3cret@db.example:5433/prod?sslmode=require"
    assert t.partitions == (("day", "2026-01-01"),)
    assert "s3cret" not in t.masked
    assert parse_table_url("postgres://u@h:1/db/t").kind == "postgresql"


def test_odps_url_parses_project_table_and_partition():
    t = parse_table_url("odps://algo_platform_dev/tables/sample/pt=1")
    assert (t.kind, t.location, t.table, t.partitions) == ("odps", "algo_platform_dev", "sample", (("pt", "1"),))
    with pytest.raises(ValueError, match="odps://project/tables/name"):
        parse_table_url("odps://proj/sample")


def test_file_urls_strip_trailing_partition_folders():
    t = parse_table_url("oss://bucket/warehouse/sample/pt=20260101")
    assert (t.kind, t.location, t.partitions) == ("files", "oss://bucket/warehouse/sample", (("pt", "20260101"),))
    local = parse_table_url("/data/table/a=1/b=x%2Fy")
    assert local.location == "/data/table" and local.partitions == (("a", "1"), ("b", "x/y"))
    assert parse_table_url("s3://b/t/part.parquet").partitions == ()


@pytest.mark.parametrize("bad", ["duckdb:///only.db", "postgresql://h/db", "duckdb:///x.db/bad-name", "",
                                 "postgresql://u@h/db/t;drop"])
def test_malformed_table_urls_are_rejected(bad):
    with pytest.raises(ValueError):
        parse_table_url(bad)


def test_comma_separated_pai_tables_string_is_split():
    assert table_urls("odps://p/tables/a,odps://p/tables/b") == ["odps://p/tables/a", "odps://p/tables/b"]
    assert table_urls(["x", "x"]) == ["x", "x"]


@pytest.mark.skipif(importlib.util.find_spec("odps") is not None, reason="pyodps is installed")
def test_odps_without_pyodps_says_what_to_install():
    with pytest.raises(ImportError, match="pip install pyodps"):
        read_table("odps://proj/tables/sample/pt=1")

"""One registry for table, queue and storage backends (issue 18 #1): every registered
backend imports or says what to install; third parties add theirs by a call or an entry
point; optional imports name the package and the pip command."""

from __future__ import annotations

import importlib
import sys

import pytest

import shardfeed as sf
from shardfeed import registry


@pytest.mark.parametrize("kind", registry.KINDS)
def test_every_registered_backend_imports_or_names_what_to_install(kind):
    for name in registry.names(kind):
        e = registry.entry(kind, name)
        module = e.target.partition(":")[0]
        try:
            importlib.import_module(module)
        except ImportError:
            with pytest.raises(ImportError) as info:
                registry.load(kind, name)
            assert e.hint and e.hint in str(info.value), (kind, name)
            continue
        assert registry.load(kind, name) is not None, (kind, name)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError, match="known: .*duckdb"):
        registry.entry("table", "nope")
    with pytest.raises(ValueError, match="unknown backend kind"):
        registry.names("printer")
    with pytest.raises(ValueError, match="registered: .*memory"):
        sf.WorkQueue(["a"], backend="carrier-pigeon://x", name="q")


def test_require_names_the_package_the_extra_and_who_needs_it():
    with pytest.raises(ImportError, match=r"to_thing needs psycopg\[binary\]: pip install 'shardfeed\[tables\]' "
                                          r"\(or pip install 'psycopg\[binary\]'\)"):
        _require_missing("psycopg", "to_thing")
    with pytest.raises(ImportError, match="to_jax needs jax: pip install 'shardfeed.jax.' .or pip install jax."):
        _require_missing("jax", "to_jax")
    assert registry.require("json") is sys.modules["json"]


def _require_missing(module, what):
    """require() for a package made unimportable for this call (a None entry in sys.modules)."""
    saved = sys.modules.get(module)
    sys.modules[module] = None  # importlib then raises ImportError, as for a missing package
    try:
        return registry.require(module, what=what)
    finally:
        if saved is None:
            del sys.modules[module]
        else:
            sys.modules[module] = saved


def test_a_queue_backend_registered_by_a_call_is_opened_by_its_url_scheme():
    registry.register("queue", "mem2", "shardfeed.distributed.memory:MemoryBackend")
    try:
        q = sf.WorkQueue(["a", "b", "c"], backend="mem2://space", name="registered")
        assert sorted(str(q.take()) for _ in range(3)) == ["a", "b", "c"]
    finally:
        registry._registry["queue"].pop("mem2", None)


def test_a_table_backend_registered_by_a_call_serves_its_kind(tmp_path):
    pytest.importorskip("pyarrow")
    from shardfeed.tables.backend import open_table_backend
    from shardfeed.tables.urls import TableURL

    registry.register("table", "files2", "shardfeed.tables.parquet:FilesBackend")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"a": [1, 2, 3]}), tmp_path / "t.parquet")
        backend = open_table_backend(TableURL("files2", str(tmp_path / "t.parquet"), "", (), str(tmp_path / "t.parquet")))
        assert backend.num_rows() == 3
    finally:
        registry._registry["table"].pop("files2", None)


def test_entry_points_of_an_installed_distribution_are_found(tmp_path, monkeypatch):
    """A package that declares ``[shardfeed.backends] queue.mem3 = ...`` in its metadata."""
    dist = tmp_path / "shardfeed_extra_backends-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shardfeed-extra-backends\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[shardfeed.backends]\nqueue.mem3 = shardfeed.distributed.memory:MemoryBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    try:
        assert "mem3" in registry.names("queue")
        assert registry.load("queue", "mem3").__name__ == "MemoryBackend"
    finally:
        registry._registry["queue"].pop("mem3", None)

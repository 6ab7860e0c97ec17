"""One registry of the pluggable parts: table backends, work-queue backends and storage
schemes, each a name mapped to where its implementation lives and what to install when
it is missing (fsspec's ``known_implementations`` is the model).

Adding a backend is one :func:`register` call (or one line in :data:`BUILTIN`) plus its
module; nothing is imported until the backend is used. Third-party packages register
theirs through the entry-point group ``shardfeed.backends``, named ``"<kind>.<name>"``
(``table.bigquery = "mypkg.bq:BigQueryBackend"``), loaded the first time a name is not
found. Optional imports go through :func:`require`, which names the missing package, what
needs it and the pip command::

    duckdb = require("duckdb", extra="tables", what="duckdb:// tables")
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

KINDS = ("table", "queue", "storage")
"""The kinds of backend the registry holds."""
ENTRY_POINT_GROUP = "shardfeed.backends"


@dataclass(frozen=True)
class Entry:
    """Where a backend lives (``"module:attribute"``; for a storage scheme served by an
    fsspec implementation, the module only) and the install hint for when it is missing."""

    target: str
    hint: str = ""


BUILTIN: dict[str, dict[str, Entry]] = {
    "table": {
        "files": Entry("shardfeed.tables.parquet:FilesBackend", "pip install 'shardfeed[tables]' (pyarrow)"),
        "duckdb": Entry("shardfeed.tables.duckdb_backend:DuckDBBackend",
                        "pip install 'shardfeed[tables]' (or pip install duckdb)"),
        "postgresql": Entry("shardfeed.tables.postgres:PostgresBackend",
                            "pip install 'shardfeed[tables]' (or pip install 'psycopg[binary]')"),
        "odps": Entry("shardfeed.tables.odps:ODPSBackend",
                      "pip install 'shardfeed[odps]' (pyodps); credentials come from ODPS_ACCESS_ID, "
                      "ODPS_ACCESS_KEY and ODPS_ENDPOINT"),
    },
    "queue": {
        "memory": Entry("shardfeed.distributed.memory:MemoryBackend"),
        "sqlite": Entry("shardfeed.distributed.sqlite:SQLiteBackend"),
        "redis": Entry("shardfeed.distributed.redis_backend:RedisBackend", "pip install 'shardfeed[redis]'"),
    },
    "storage": {
        "s3": Entry("s3fs", "pip install 'shardfeed[s3]' (s3fs)"),
        "oss": Entry("s3fs", "pip install 'shardfeed[s3]' (s3fs; OSS is reached through the S3 protocol)"),
        "gs": Entry("gcsfs", "pip install 'shardfeed[gcs]' (gcsfs)"),
        "http": Entry("aiohttp", "pip install 'shardfeed[http]' (aiohttp)"),
        "https": Entry("aiohttp", "pip install 'shardfeed[http]' (aiohttp)"),
    },
}
"""The backends shardfeed ships, by kind and name (a storage scheme's entry names the
module its fsspec implementation needs)."""

# packages behind the optional imports, and the extra that installs each
PACKAGES: dict[str, tuple[str, str]] = {
    "duckdb": ("duckdb", "tables"),
    "psycopg": ("psycopg[binary]", "tables"),
    "pyarrow": ("pyarrow", "tables"),
    "odps": ("pyodps", "odps"),
    "redis": ("redis", "redis"),
    "s3fs": ("s3fs", "s3"),
    "gcsfs": ("gcsfs", "gcs"),
    "aiohttp": ("aiohttp", "http"),
    "torch": ("torch", ""),
    "tensorflow": ("tensorflow-cpu", "tf"),
    "jax": ("jax", "jax"),
    "av": ("av", "video"),
    "PIL": ("Pillow", "convert"),
    "simplejpeg": ("simplejpeg", "convert"),
    "apache_beam": ("apache-beam", "beam"),
}

_lock = threading.Lock()
_registry: dict[str, dict[str, Entry]] = {kind: dict(entries) for kind, entries in BUILTIN.items()}
_entry_points_loaded = False


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown backend kind {kind!r}: one of {KINDS}")


def register(kind: str, name: str, target: str, hint: str = "") -> None:
    """Make ``name`` a ``kind`` backend (``"table"``, ``"queue"`` or ``"storage"``) served by
    ``target`` (``"module:attribute"``); ``hint`` is shown when its import fails. A name
    registered again is replaced (so a package may override a built-in)."""
    _check_kind(kind)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backend name must be a non-empty string, got {name!r}")
    with _lock:
        _registry[kind][name] = Entry(target, hint)


def names(kind: str) -> list[str]:
    """The registered ``kind`` backends' names (entry points included), sorted."""
    _check_kind(kind)
    _load_entry_points()
    with _lock:
        return sorted(_registry[kind])


def entry(kind: str, name: str) -> Entry:
    """The registry's entry for ``name``; ``KeyError`` naming the known ones when none."""
    _check_kind(kind)
    with _lock:
        found = _registry[kind].get(name)
    if found is None:
        _load_entry_points()
        with _lock:
            found = _registry[kind].get(name)
    if found is None:
        raise KeyError(f"no {kind} backend named {name!r}; known: {', '.join(names(kind))}")
    return found


def load(kind: str, name: str) -> Any:
    """Import and return ``name``'s implementation; ``ImportError`` with the install hint
    when it (or a package it needs) is missing."""
    e = entry(kind, name)
    module, _, attr = e.target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        hint = f": {e.hint}" if e.hint else ""
        raise ImportError(f"the {name!r} {kind} backend needs a package that is not installed{hint} ({exc})") from exc
    return getattr(mod, attr) if attr else mod


def require(module: str, extra: str | None = None, what: str = "") -> ModuleType:
    """Import an optional package, or raise ``ImportError`` saying what needs it and the
    pip command that installs it (``extra``: the shardfeed extra that brings it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package, default_extra = PACKAGES.get(module.split(".")[0], (module, ""))
        extra = default_extra if extra is None else extra
        pkg = f"'{package}'" if "[" in package else package
        cmd = f"pip install 'shardfeed[{extra}]' (or pip install {pkg})" if extra else f"pip install {pkg}"
        who = f"{what} needs" if what else "this needs"
        raise ImportError(f"{who} {package}: {cmd}") from exc


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points  # noqa: PLC0415

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        kind, _, name = ep.name.partition(".")
        if kind in KINDS and name:
            with _lock:
                _registry[kind].setdefault(name, Entry(ep.value))


__all__ = ["Entry", "BUILTIN", "KINDS", "register", "names", "entry", "load", "require"]

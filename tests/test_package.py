"""The package surface: light to import, every public name real and documented."""

from __future__ import annotations

import subprocess
import sys

import shardfeed as sf

OPTIONAL = ("pyarrow", "duckdb", "psycopg", "redis", "tensorflow", "torch", "s3fs", "apache_beam", "PIL", "pandas")


def test_import_needs_no_optional_dependency():
    code = f"import sys, shardfeed; print(','.join(m for m in {OPTIONAL!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import shardfeed pulled in optional packages: {out}"


def test_every_public_name_exists_and_has_a_docstring():
    missing_doc = []
    for name in sf.__all__:
        obj = getattr(sf, name)
        if callable(obj) and not (getattr(obj, "__doc__", None) or "").strip():
            missing_doc.append(name)
    assert not missing_doc, f"public names without a docstring: {missing_doc}"


def test_lazy_names_resolve():
    assert sf.read_table.__name__ == "read_table"
    assert sf.TableWriter.__name__ == "TableWriter"

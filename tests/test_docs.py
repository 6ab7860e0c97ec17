"""Every name the API reference renders has a docstring (scripts/check_docstrings.py; `make
test` also builds the site with `mkdocs build --strict`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_docstrings.py"


def _check_module():
    spec = importlib.util.spec_from_file_location("check_docstrings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_name_the_public_modules():
    documented = _check_module().documented_modules()
    for name in ("shardfeed", "shardfeed.pipeline", "shardfeed.storage", "shardfeed.errors",
                 "shardfeed.formats.tfrecord", "shardfeed.formats.example"):
        assert name in documented


def test_every_public_name_in_the_reference_has_a_docstring():
    check = _check_module()
    assert check.missing_docstrings(check.documented_modules()) == []

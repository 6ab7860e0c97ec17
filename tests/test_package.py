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


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.split()
    return {m for m in out if m.startswith("shardfeed") or m in ("fsspec", "s3fs", "pyarrow", "PIL")}


def test_import_loads_no_stage_backend_or_conversion_module():
    loaded = _modules_after("import shardfeed")
    heavy = {"shardfeed.convert.api", "shardfeed.pipeline.dataset", "shardfeed.distributed", "shardfeed.tables",
             "shardfeed.formats.native", "shardfeed.storage", "fsspec"}
    assert not loaded & heavy, f"import shardfeed loaded {sorted(loaded & heavy)}"


def test_read_path_loads_without_the_conversion_stack_or_other_stages():
    loaded = _modules_after("import shardfeed as sf\nsf.read_tfrecord")
    assert "shardfeed.pipeline.records" in loaded
    unwanted = {"shardfeed.convert.api", "shardfeed.convert.tasks", "shardfeed.distributed", "shardfeed.tables",
                "shardfeed.pipeline.images", "shardfeed.pipeline.csv", "shardfeed.pipeline.telemetry",
                "s3fs", "pyarrow", "PIL"}
    assert not loaded & unwanted, f"sf.read_tfrecord loaded {sorted(loaded & unwanted)}"


def test_lazy_names_are_listed_and_unknown_names_raise():
    assert {"read_tfrecord", "convert", "WorkQueue", "read_table"} <= set(dir(sf))
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        sf.not_a_name  # noqa: B018
    import importlib

    convert_pkg, pipeline = (importlib.import_module(f"shardfeed.{m}") for m in ("convert", "pipeline"))

    assert pipeline.read_tfrecord is sf.read_tfrecord
    assert convert_pkg.convert is sf.convert


def test_pandas_accessor_registered_after_a_plain_import():
    code = ("import shardfeed, sys\nassert 'shardfeed.convert.api' not in sys.modules\nimport pandas as pd\n"
            "print(hasattr(pd.DataFrame({'a': [1]}), 'shardfeed'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True"


def test_names_shadowing_a_submodule_stay_the_functions():
    code = ("import shardfeed.convert, shardfeed.pipeline.mix\nimport shardfeed as sf\n"
            "from shardfeed.pipeline import mix\nprint(callable(sf.convert), sf.convert.__module__, "
            "callable(mix), mix.__module__, sf.mix is mix)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "shardfeed.convert.api", "True", "shardfeed.pipeline.mix", "True"]


def test_reading_a_converted_output_loads_no_conversion_code():
    loaded = _modules_after("import shardfeed as sf\nsf.read_converted")
    assert "shardfeed.convert.reading" in loaded
    unwanted = {"shardfeed.convert.api", "shardfeed.convert.writer", "shardfeed.convert.plan",
                "shardfeed.convert.sources", "shardfeed.convert.tasks", "PIL"}
    assert not loaded & unwanted, f"sf.read_converted loaded {sorted(loaded & unwanted)}"


def test_subpackages_are_attributes_loaded_on_first_use():
    """Found from outside: the docs name `sf.pipeline.Span`, but `sf.pipeline` raised
    AttributeError unless `shardfeed.pipeline` had been imported."""
    import subprocess
    import sys

    code = ("import sys, shardfeed as sf; assert 'shardfeed.pipeline' not in sys.modules; "
            "print(sf.pipeline.Span.__name__, sf.storage.expand.__name__, sf.formats.__name__, "
            "sf.distributed.WorkQueue.__name__, callable(sf.convert), 'pipeline' in dir(sf))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["Span", "expand", "shardfeed.formats", "WorkQueue", "True", "True"]

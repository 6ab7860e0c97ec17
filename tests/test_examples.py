"""Every script in examples/ runs to completion on small data."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted(pathlib.Path(__file__).resolve().parent.parent.joinpath("examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "an example should print what it did"

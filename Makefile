# The two commands a newcomer needs: `make demo` and `make test`. Each sets up what it
# needs on a fresh machine (a virtual environment in .venv, pip packages, Debian packages).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTHON ?= python3

# the docstring check and the strict site build (a broken link or reference fails it)
DOCS_CHECK = $(PY) scripts/check_docstrings.py && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q

.PHONY: demo test test-fast lint fuzz-smoke bench docs docs-build clean

demo: $(VENV)/.installed
	$(VENV)/bin/shardfeed demo --out demo-out

# lint (ruff: pyflakes, pycodestyle, isort, bugbear, pyupgrade), DESIGN.md's layers
# (import-linter) and types of the public modules (mypy; [tool.mypy] in pyproject.toml)
LINT = $(VENV)/bin/ruff check -q . && $(VENV)/bin/lint-imports --no-cache && $(VENV)/bin/mypy

test: $(VENV)/.installed-dev
	$(LINT)
	$(DOCS_CHECK)
	FUZZ_SECONDS=20 bash fuzz/run_smoke.sh
	$(PY) -m pytest -q

lint: $(VENV)/.installed-dev
	$(LINT)

test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow and not tf"

fuzz-smoke: $(VENV)/.installed-dev
	bash fuzz/run_smoke.sh

bench: $(VENV)/.installed-dev
	$(VENV)/bin/shardfeed bench

# the documentation site: `make docs` serves it on http://127.0.0.1:8000 and rebuilds on
# edits; `make docs-build` checks it into site/
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

docs-build: $(VENV)/.installed-docs
	$(DOCS_CHECK)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml setup.py
	bash scripts/system-deps.sh build
	$(PIP) install -q -e '.[demo]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	bash scripts/system-deps.sh test
	SHARDFEED_REQUIRE_NATIVE=1 $(PIP) install -q -e '.[dev,tf,docs]'
	# PyTorch CPU for the adapter tests (a local wheel here; the tests skip without it), and
	# torchdata for StatefulDataLoader checkpoints (after torch, so it never pulls another build)
	$(PIP) install -q torch==2.13.0 || echo "torch==2.13.0 not installable here: torch adapter tests will skip"
	$(PIP) install -q torchdata==0.11.0 || echo "torchdata not installable here: its checkpoint tests will skip"
	# the peers benchmark's loaders (`shardfeed bench peers --quick` runs in the tests): the extra, then LitData and
	# Mosaic Streaming without their dependencies (they would pull torchvision and a CUDA torch); torch must stay 2.13
	$(PIP) install -q -e '.[peers]' || echo "peers extra not installable here: bench peers will skip those peers"
	$(PIP) install -q --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0 || echo "litdata/mosaic not installable here"
	$(PY) -c "import torch; print('torch', torch.__version__, 'after the peers')" || echo "torch no longer imports"
	# Ray Data for the Ray adapter's tests (a local cluster of worker processes; the tests skip without it)
	$(PIP) install -q -e '.[ray]' 'ray[data]==2.60.0' || echo "ray not installable here: the Ray tests will skip"
	touch $@

# the docs alone (`make test` installs them with the dev extras)
$(VENV)/.installed-docs: $(VENV)/.installed
	$(PIP) install -q -e '.[docs]'
	touch $@

clean:
	rm -rf $(VENV) build demo-out bench-out site src/*.egg-info src/shardfeed/*.so

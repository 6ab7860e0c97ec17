# The two commands a newcomer needs: `make demo` and `make test`. Each sets up what it
# needs on a fresh machine (a virtual environment in .venv, pip packages, Debian packages).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTHON ?= python3

.PHONY: demo test test-fast fuzz-smoke bench clean

demo: $(VENV)/.installed
	$(VENV)/bin/shardfeed demo --out demo-out

test: $(VENV)/.installed-dev
	FUZZ_SECONDS=20 bash fuzz/run_smoke.sh
	$(PY) -m pytest -q

test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow and not tf"

fuzz-smoke: $(VENV)/.installed-dev
	bash fuzz/run_smoke.sh

bench: $(VENV)/.installed-dev
	$(VENV)/bin/shardfeed bench

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml setup.py
	bash scripts/system-deps.sh build
	$(PIP) install -q -e '.[demo]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	bash scripts/system-deps.sh test
	SHARDFEED_REQUIRE_NATIVE=1 $(PIP) install -q -e '.[dev,tf]'
	# PyTorch CPU for the adapter tests (a local wheel here; the tests skip without it), and
	# torchdata for StatefulDataLoader checkpoints (after torch, so it never pulls another build)
	$(PIP) install -q torch==2.13.0 || echo "torch==2.13.0 not installable here: torch adapter tests will skip"
	$(PIP) install -q torchdata==0.11.0 || echo "torchdata not installable here: its checkpoint tests will skip"
	touch $@

clean:
	rm -rf $(VENV) build demo-out bench-out src/*.egg-info src/shardfeed/*.so

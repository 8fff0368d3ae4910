# Two entry points (README): `make demo` and `make test`. Each sets up .venv itself.
# `make test` is the fast tier (no subprocesses, notebooks, multi-process or Dask runs, no
# quality bars: tests/conftest.py marks those `slow` / `quality`); `make test-all` runs all.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= runs/demo

.PHONY: demo test test-all lint bench install clean notebooks

# Python may cache compiled modules (and pytest its rewritten test modules) even where the
# environment says not to (PYTHONDONTWRITEBYTECODE, set on our CI machines): every test
# that starts a Python process would otherwise compile sfjax again (subprocess-heavy tests:
# 47.7 s -> 37.6-39.4 s on 2 cores). The caches are __pycache__/ folders (git-ignored).
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# MovieLens-100k ships inside the recbole wheel; only its data files are read (never committed).
	$(PY) -m pip install -q --no-deps recbole==1.2.1
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.train_ctr --config=experiments/configs/ctr.py --workdir=$(WORKDIR)

# The fast tier's tests are short: compiling dominates them, so `make test` has XLA compile
# at backend optimization level 0 (the same programs, less optimised machine code; results
# may differ in the last bits, which no test depends on; about 15% less wall time on 2
# cores). `make test-all` (CI) runs every test, these too, at XLA's default level.
test: $(STAMP)
	XLA_FLAGS="$$XLA_FLAGS --xla_backend_optimization_level=0" \
	  $(PY) -m pytest -q -n 2 --dist=loadfile -m "not slow and not quality" tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist=loadfile tests

# ruff's and mypy's settings are in pyproject.toml.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m experiments.bench_train

# Re-executes notebooks/*.ipynb in place, outputs saved (small sizes, CPU; see notebooks/execute.py).
notebooks: $(STAMP)
	$(PY) notebooks/execute.py

clean:
	rm -rf $(VENV) runs .pytest_cache

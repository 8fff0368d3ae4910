# Two entry points (README): `make demo` and `make test`. Each sets up .venv itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= runs/demo

.PHONY: demo test bench install clean

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

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist=loadfile tests

bench: $(STAMP)
	$(PY) -m experiments.bench_train

clean:
	rm -rf $(VENV) runs .pytest_cache

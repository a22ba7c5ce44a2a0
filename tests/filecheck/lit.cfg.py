"""lit configuration for the ad-mlir FileCheck suite (run from pytest: tests/test_filecheck.py)."""

import os
import shutil
import sys

import lit.formats

# ruff: noqa: F821  (lit injects `config` and `lit_config`)
config.name = "ad-mlir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Inputs"]

# Tools come from the interpreter running lit, so a venv need not be activated.
bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = bin_dir + os.pathsep + config.environment.get("PATH", "")
# PYTHONPATH: a git worktree tested with the main checkout's venv; OMP_NUM_THREADS: the suite's share of the cores
for var in ("HOME", "TMPDIR", "PYTHONHASHSEED", "PYTHONPATH", "OMP_NUM_THREADS"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
for tool in ("ad-opt", "filecheck", "xdsl-opt"):
    if shutil.which(tool, path=config.environment["PATH"]) is None:
        lit_config.fatal(f"{tool} not found next to {sys.executable}")
config.substitutions.append(("%python", sys.executable))

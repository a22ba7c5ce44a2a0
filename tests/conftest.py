"""Shared fixtures: tiny HF models and their torch.export programs, built once per worker.

Without CUDA, generated Triton kernels run in the Triton interpreter (TRITON_INTERPRET=1 must
be set before any kernel is imported), and every session writes kernels to its own cache (and
stores no compiled programs: `runtime/program_cache.py`)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("AD_MLIR_SKIP_ON_ERROR", "0")  # a pass that raises fails its test, not skipped
if "AD_MLIR_CACHE_DIR" not in os.environ:  # xdist's workers inherit the directory of the process that made it
    os.environ["AD_MLIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ad_mlir_kernels_")
    atexit.register(shutil.rmtree, os.environ["AD_MLIR_CACHE_DIR"], ignore_errors=True)
# every test runs the passes it checks (a program stored by an earlier test would skip them);
# tests/unit/test_program_cache.py turns the program cache on
os.environ.setdefault("AD_MLIR_PROGRAM_CACHE", "0")
# xdist workers share the cores: each worker's torch (and the subprocesses its tests start) takes
# its share of the threads, since tiny-shape ops on threads that outnumber the cores spend their
# time waiting for each other: tests/models/test_families.py at -n 2 took 192 s of CPU time at one
# thread a worker, 212 s at two; with other processes busy (load 7 on 2 cores) a SmolLM2 decode
# step of the paged engine took 451 ms at one thread, 2597 ms at two
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    torch.set_num_threads(_threads)

from ad_mlir.frontends.export import export_model
from ad_mlir.zoo.tiny import TinyConfig, build_model


@functools.cache
def _exported(family: str, dtype: str, decompose: bool) -> tuple[TinyConfig, torch.export.ExportedProgram]:
    """One decoder layer is enough to hit every op a family produces (layers repeat)."""
    cfg = TinyConfig(family=family, layers=1, dtype=dtype)
    return cfg, export_model(build_model(cfg), decompose=decompose)


@pytest.fixture(scope="session")
def exported():  # noqa: ANN201 (returns the cached builder)
    """`exported(family, dtype, decompose) -> (cfg, ExportedProgram)`, cached per worker."""
    return _exported


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many random programs the differential tests compiled and compared with eager (each
    mismatch fails its test; AD_MLIR_RANDOM_EXAMPLES runs more)."""
    reports = [r for rs in terminalreporter.stats.values() for r in rs if getattr(r, "when", None) == "teardown"]
    programs = sum(v for r in reports for k, v in getattr(r, "user_properties", ()) if k == "random_programs")
    if programs:
        failed = sum(1 for r in terminalreporter.stats.get("failed", ()) if "test_compile_random" in r.nodeid)
        terminalreporter.write_line(
            f"random programs compiled and compared with eager: {programs} ({failed} tests with mismatches)"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The FileCheck suite first (by far the longest test, ~3 minutes, lit running two processes):
    `make test`'s work-stealing workers then start one on it and share out the rest, instead of
    one worker running it alone at the end."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/test_filecheck.py::"))

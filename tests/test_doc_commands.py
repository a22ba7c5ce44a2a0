"""Every command of the README and the docs runs as written.

The shell commands of every ```sh block (one command a line) and every ```python block of
README.md and docs/**/*.md run in a subprocess from the repository root, in a clean environment:
only PATH (the venv's bin first), HOME and LANG (and PYTHONPATH and OMP_NUM_THREADS where set: `clean_env`), so no TRITON_INTERPRET or other variable set by
hand helps a command that would fail for a user (the tensor-parallel example once crashed that
way). A command passes when it exits 0, or, where `EXPECTED_FAILURES` says it must fail, when it
fails with the message given there.

`SHORTER` runs a few long commands with shorter arguments, and `NOT_RUN` names the commands that
do not run here, each with the reason; a test checks that both tables name only commands the docs
hold, so neither can go stale.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)

SHORTER: dict[str, tuple[str, str]] = {
    "ad-bench --quick": (
        "ad-bench --quick --parts traffic --out {tmp}/bench",
        "the whole quick run takes 1-3 minutes (SmolLM2 generation, Inductor compile times in fresh processes, a "
        "family sweep, PTX); one part runs the command's whole path (results.json, results.md, plots), written to "
        "a temporary directory",
    ),
    "torchrun --standalone --nproc-per-node 2 -m ad_mlir.examples.tp --model llama --generate": (
        "torchrun --standalone --nproc-per-node 2 -m ad_mlir.examples.tp --model llama --generate --max-new-tokens 4",
        "four tokens per prompt still compare every rank's tokens with one unsharded process; 12 take longer",
    ),
}
"""Documented command -> (the command run here, why)."""

NOT_RUN: dict[str, str] = {
    "ad-mlir serve --model smollm2": "a server runs until stopped: tests/models/test_serve.py runs this command "
                                     "itself and asks it a chat with the openai client",
    "torchrun --standalone --nproc-per-node 2 -m ad_mlir.examples.tp --model llama":
        "tests/test_clis.py::test_tp_example_ranks_match_the_unsharded_model runs it as written and checks both "
        "ranks' errors",
    "python -m ad_mlir --report": "tests/test_report.py::test_main_job_compiles_and_runs_kernels runs it as written "
                                  "and checks its report",
    "ad-opt --model llama --layers 1 --print-debuginfo": "tests/filecheck/models/llama.mlir runs it as written and "
                                                         "checks its IR",
    "make run": "tests/test_report.py::test_main_job_answers_with_smollm2 runs it as written, without "
                "TRITON_INTERPRET, and checks its answer",
    "make test": "the whole suite, of which this test is a part (CI runs it: .ci/run)",
    "python -m ad_mlir.bench.families llama gpt2": "tests/test_clis.py::test_family_sweep_prints_a_row_per_family_and_"
                                                   "writes_json runs it for one family (each more adds ~30 s) and "
                                                   "checks its row and JSON",
    "make docs": ".ci/run builds the docs right after the suite; building them here too would double its 20-80 s",
    "make mutation": "a benchmark of about an hour (150 mutants, each against its file's tests) that installs the "
                     "mutation extra; tests/unit/test_mutation.py checks its command",
    "make gpu-wheels": "downloads about 18 MiB of wheels from PyPI into .whl/ (run by hand: 17.8 MiB in 5 wheels); "
                       "tests/unit/test_gpu_run.py checks its list without the network (pins, requirements, every "
                       "import of make gpu covered)",
    "ad-mlir serve --model qwen3 --tensor-parallel-size 2":
        "a server runs until stopped: tests/models/test_serve_tp.py runs this command (a free port, --max-seq-len 64 "
        "added), asks it with the openai client and stops it",
    "torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id serve -m "
    "ad_mlir.serve.cli serve --model qwen3 --tensor-parallel-size 2 --host 0.0.0.0":
        "two machines, each running a server until stopped: tests/models/test_serve_tp.py runs it twice on this "
        "machine with HOST 127.0.0.1 (a free port for the rendezvous, a free port and --max-seq-len 64 added), asks it "
        "with the openai client and stops it",
}
"""Documented command -> why it does not run here."""

EXPECTED_FAILURES: dict[str, str] = {
    "ad-opt tests/filecheck/tools/Inputs/verify_error.mlir":
        "verify_error.mlir:2:3: error: 'ad.add' operand shapes 2x3, 4x3 do not broadcast",
}
"""Documented command -> the message it must fail with (documented as an error example)."""
if not torch.cuda.is_available():
    EXPECTED_FAILURES["make gpu"] = "make gpu: no CUDA GPU on this machine"
    EXPECTED_FAILURES["python3 -m ad_mlir.bench.gpu_run --wheels .whl"] = "make gpu: no CUDA GPU on this machine"

@dataclass(frozen=True)
class DocCommand:
    page: str
    kind: str  # "sh" or "python"
    text: str

    @property
    def id(self) -> str:
        first = self.text.strip().splitlines()[0] if self.kind == "python" else self.text
        return f"{self.page}:{first[:70]}"


def doc_commands() -> list[DocCommand]:
    """Each command line of the ```sh blocks and each ```python block, in page order, once each
    (the README and a docs page may show the same command)."""
    found: dict[tuple[str, str], DocCommand] = {}
    for page in PAGES:
        for kind, body in BLOCK.findall(page.read_text()):
            pieces = [line for line in body.splitlines() if line.strip()] if kind == "sh" else [body]
            for text in pieces:
                key = (kind, _without_comment(text) if kind == "sh" else text)
                found.setdefault(key, DocCommand(str(page.relative_to(ROOT)), kind, key[1]))
    return list(found.values())


def _without_comment(line: str) -> str:
    """The command without its trailing `  # comment` (bash would ignore it too)."""
    return re.sub(r"\s+#\s.*$", "", line).strip()


def clean_env(tmp: Path) -> dict[str, str]:
    """PATH, HOME, LANG; PYTHONPATH where it is set: a git worktree tested with the main
    checkout's venv (as tests/filecheck/lit.cfg.py passes it), whose commands must run its code;
    and OMP_NUM_THREADS where it is set: the suite's workers share the cores (tests/conftest.py),
    and a command on threads that outnumber them runs many times slower."""
    venv_bin = Path(sys.executable).parent
    env = {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp)),
        "LANG": "C.UTF-8",
    }
    for name in ("PYTHONPATH", "OMP_NUM_THREADS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def command_to_run(command: str, tmp: Path) -> str:
    """What runs for a documented command: its shorter form where it has one."""
    return SHORTER[command][0].format(tmp=tmp) if command in SHORTER else command


COMMANDS = doc_commands()


@pytest.mark.parametrize("doc", COMMANDS, ids=[c.id for c in COMMANDS])
def test_doc_command_runs(doc: DocCommand, tmp_path: Path) -> None:
    if doc.kind == "sh" and doc.text in NOT_RUN:
        pytest.skip(f"not run: {NOT_RUN[doc.text]}")
    env = clean_env(tmp_path)
    if doc.kind == "python":
        script = tmp_path / "example.py"
        script.write_text(doc.text)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-o", "pipefail", "-c", command_to_run(doc.text, tmp_path)]
    start = time.perf_counter()
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    print(f"{doc.id}: exit {run.returncode} in {time.perf_counter() - start:.1f} s")
    expected = EXPECTED_FAILURES.get(doc.text) if doc.kind == "sh" else None
    if expected is not None:
        assert run.returncode != 0, f"{doc.id} should fail with {expected!r} but exited 0:\n{output[-3000:]}"
        assert expected in output, f"{doc.id} failed without {expected!r}:\n{output[-3000:]}"
    else:
        assert run.returncode == 0, f"{doc.id} ({' '.join(argv[-1:])}) exited {run.returncode}:\n{output[-4000:]}"


def test_tables_name_documented_commands() -> None:
    """A table entry whose command left the docs would hide nothing but confuse: none may."""
    documented = {c.text for c in COMMANDS if c.kind == "sh"}
    for table in (SHORTER, NOT_RUN, EXPECTED_FAILURES):
        assert set(table) <= documented, f"not in any ```sh block: {sorted(set(table) - documented)}"


def test_commands_found() -> None:
    """The extraction finds the README's two commands and its three examples (a broken pattern
    would make every test above vacuous)."""
    readme = [c for c in COMMANDS if c.page == "README.md"]
    assert {"make run", "make test"} <= {c.text for c in readme if c.kind == "sh"}
    assert sum(c.kind == "python" for c in readme) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_make_gpu_refuses_without_cuda(tmp_path: Path) -> None:
    run = subprocess.run(["make", "gpu"], cwd=ROOT, env=clean_env(tmp_path), capture_output=True, text=True)
    assert run.returncode != 0
    last = (run.stdout + run.stderr).strip().splitlines()[-2:]
    assert any(line.startswith("make gpu: no CUDA GPU on this machine") for line in last), last

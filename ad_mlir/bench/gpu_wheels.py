"""`make gpu-wheels`: the wheels that `make gpu` needs on a lent GPU machine, which reaches no
package registry, downloaded here (where PyPI is reachable) into `.whl/` (git-ignored) to travel
with the working tree; there `make gpu` installs them with `--no-index` (`bench/gpu_run.py`).

    python -m ad_mlir.bench.gpu_wheels            # into .whl/: benchmarks/gpu/wheels.txt, ad-mlir's own

The list is `benchmarks/gpu/wheels.txt` (pinned to this project's venv's versions), fetched for
CPython 3.12 on x86-64 Linux (the machine's `python3`), each with `--no-deps`: the machine's own
packages (`benchmarks/gpu/machine-packages.txt`) must meet the rest of their requirements, which
this checks from each wheel's METADATA (`Requires-Dist`, extras and other platforms' markers left
out; versions only where the machine's are known). ad-mlir's own wheel is built from the tree and
added: its metadata, not its code (the tree's comes first on PYTHONPATH there), which the program
cache keys on and without which `importlib.metadata` does not know ad-mlir.
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
WHEEL_LIST = ROOT / "benchmarks" / "gpu" / "wheels.txt"
MACHINE_PACKAGES = ROOT / "benchmarks" / "gpu" / "machine-packages.txt"
DEFAULT_DEST = ROOT / ".whl"

PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
"""The platform tags pip may pick for the machine (glibc 2.28 or later); pip matches each exactly,
and pure-Python wheels (`py3-none-any`) match any."""

MACHINE_MARKERS = {**default_environment(), "python_version": PYTHON_VERSION, "python_full_version": "3.12.3",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython",
                   "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux",
                   "os_name": "posix"}
"""The environment markers of the machine's Python, for the requirements that apply there."""


def read_pins(path: Path = WHEEL_LIST) -> dict[str, str]:
    """`name==version` lines (comments and blank lines skipped): canonical name -> version."""
    pins = {}
    for line in _lines(path):
        name, _, version = line.partition("==")
        if not version:
            raise ValueError(f"{path}: '{line}' is not pinned as name==version")
        pins[canonicalize_name(name)] = version
    return pins


def read_machine(path: Path = MACHINE_PACKAGES) -> dict[str, str | None]:
    """The machine's packages: canonical name -> version where known, else None."""
    packages: dict[str, str | None] = {}
    for line in _lines(path):
        name, _, version = line.partition("==")
        packages[canonicalize_name(name)] = version or None
    return packages


def _lines(path: Path) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines() if line.split("#", 1)[0].strip()]


def applying(requires: Iterable[str]) -> list[Requirement]:
    """The requirements that hold on the machine: no extra, markers true for its Python."""
    out = []
    for text in requires:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({**MACHINE_MARKERS, "extra": ""}):
            out.append(req)
    return out


def unmet(requires: Iterable[str], carried: dict[str, str], machine: dict[str, str | None]) -> list[str]:
    """Why each requirement in `requires` that applies on the machine is met neither by a carried
    wheel nor by the machine's packages (its version, where that is known), in words; [] when all are."""
    problems = []
    for req in applying(requires):
        name = canonicalize_name(req.name)
        have = carried.get(name) or machine.get(name)
        if name not in carried and name not in machine:
            problems.append(f"{req}: neither carried nor on the machine")
        elif have is not None and not req.specifier.contains(Version(have), prereleases=True):
            problems.append(f"{req}: {name} {have} is there")
    return problems


def wheel_requires(wheel: Path) -> list[str]:
    """The `Requires-Dist` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        message = email.parser.Parser().parsestr(zf.read(metadata).decode())
    return message.get_all("Requires-Dist") or []


def fetch(dest: Path = DEFAULT_DEST, pip: Sequence[str] = (sys.executable, "-m", "pip")) -> list[Path]:
    """Download the pinned wheels and build ad-mlir's into `dest` (emptied of wheels first: two
    versions of one name would stop the install there); raise SystemExit naming any requirement
    of theirs that the machine would not meet. Returns the wheels."""
    pins = read_pins()
    dest.mkdir(exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
                    "--implementation", "cp", *platforms, "-d", str(dest),
                    *(f"{name}=={version}" for name, version in pins.items())], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(dest), str(ROOT)], check=True)
    machine = read_machine()
    problems = [f"{wheel.name}: {p}" for wheel in sorted(dest.glob("*.whl")) if not wheel.name.startswith("ad_mlir-")
                for p in unmet(wheel_requires(wheel), pins, machine)]
    if problems:
        raise SystemExit("make gpu-wheels: requirements the GPU machine would not meet (add them to "
                         f"{WHEEL_LIST.relative_to(ROOT)}):\n  " + "\n  ".join(problems))
    return sorted(dest.glob("*.whl"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ad_mlir.bench.gpu_wheels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="where the wheels go (default: .whl/)")
    args = parser.parse_args(argv)
    wheels = fetch(args.dest)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{sum(w.stat().st_size for w in wheels) / 2**20:8.2f} MiB  in {len(wheels)} wheels in {args.dest}/")


if __name__ == "__main__":
    main()

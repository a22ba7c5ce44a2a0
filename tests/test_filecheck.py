"""Runs the lit/FileCheck suite (tests/filecheck) from pytest, so CI fails when any check fails
(CI does not read lit's own summary)."""

import re
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).parent / "filecheck"


def test_filecheck_suite_passes() -> None:
    # lit's scratch files (%t) live in Output/ directories beside the tests
    tests = [p for p in SUITE.rglob("*.mlir") if not {"Inputs", "Output"} & set(p.parts)]
    proc = subprocess.run(
        [sys.executable, "-c", "from lit.main import main; main()", "-v", "-j", "2", str(SUITE)],
        capture_output=True,
        text=True,
        timeout=1800,  # a hang's bound, not a budget: on a loaded 2-core machine the suite took 890 s
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    passed = re.search(r"Passed\s*:\s*(\d+)", report)
    assert passed is not None and int(passed.group(1)) == len(tests), report

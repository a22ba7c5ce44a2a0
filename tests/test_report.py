"""The README's main job (`python -m ad_mlir`) runs end to end and reports a bit-exact round trip."""

import subprocess
import sys


def test_main_job_reports_bit_exact_round_trip() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ad_mlir", "--layers", "1", "--seq-lens", "5", "9"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "pass canonicalize:" in out
    assert "ad.attention" in out and "ad.linear" in out
    assert out.count("(bit-exact)") == 2, out
    assert "NOT bit-exact" not in out


def test_main_job_rejects_bad_config() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ad_mlir", "--hidden-size", "48"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "hidden_size 48 must be a multiple of 2 * head_dim (32)" in proc.stderr
    assert "Traceback" not in proc.stderr

"""ad_mlir's layers import only downwards (STYLE.md, "Layers and folders"): import-linter's
contracts in pyproject.toml (`[tool.importlinter]`) hold, every import counted, those inside
functions and under TYPE_CHECKING too."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout

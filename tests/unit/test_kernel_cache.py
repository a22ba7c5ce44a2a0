"""The on-disk kernel cache: a second compile of the same graph generates nothing, keys do not
depend on value names or the process, and a corrupt or truncated entry is regenerated."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ad_mlir
from ad_mlir.codegen.cache import KernelCache, kernel_key, kernel_name
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline


class RmsNormSilu(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return torch.nn.functional.silu(n) * x


PIPELINE = "canonicalize,fuse-elementwise"
"""One generic region (the default pipeline's LLM fusions would make it two kernel ops)."""


def _example() -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]]:
    args = (torch.randn(6, 40), torch.randn(40))
    return torch.export.export(RmsNormSilu(), args), args


def _fused_ops(ep: torch.export.ExportedProgram) -> list[ad.FusedOp]:
    program = import_program(ep)
    run_pipeline(program.module, PIPELINE)
    return [op for op in program.module.walk() if isinstance(op, ad.FusedOp)]


def test_second_compile_generates_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ep, args = _example()
    first = KernelCache(tmp_path)
    gm = ad_mlir.compile(ep, pipeline=PIPELINE, cache=first)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.py")}
    assert first.generated == len(files) >= 1 and first.hits == 0

    second = KernelCache(tmp_path)
    with caplog.at_level(logging.INFO, logger="ad_mlir.runtime.kernels"):
        gm_again = ad_mlir.compile(ep, pipeline=PIPELINE, cache=second)
    assert second.generated == 0 and second.hits == len(files)
    assert any(f"(0 generated, {len(files)} read from the cache" in m for m in caplog.messages), caplog.messages
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.py")} == files
    torch.testing.assert_close(gm_again(*args)[0], gm(*args)[0])


def test_key_ignores_value_names() -> None:
    ep, _ = _example()
    (op,) = _fused_ops(ep)
    renamed = op.clone()
    for arg in renamed.body.block.args:
        arg.name_hint = "renamed"
    assert kernel_key(renamed) == kernel_key(op)


def test_kernel_name_is_the_same_in_every_process() -> None:
    """Python's str hash is salted per process; names come from sha256 of canonical text."""
    script = (
        "import torch\n"
        "from tests.unit.test_kernel_cache import _example, _fused_ops\n"
        "from ad_mlir.codegen.cache import kernel_key, kernel_name\n"
        "(op,) = _fused_ops(_example()[0])\n"
        "print(kernel_name(op, kernel_key(op)))\n"
    )
    names = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=Path(__file__).parents[2],
        ).stdout.strip()
        for seed in ("1", "2")
    }
    (op,) = _fused_ops(_example()[0])
    assert names == {kernel_name(op, kernel_key(op))}


def test_corrupt_or_truncated_entry_is_regenerated(tmp_path: Path, caplog) -> None:
    ep, args = _example()
    cache = KernelCache(tmp_path)
    expected = ad_mlir.compile(ep, pipeline=PIPELINE, cache=cache)(*args)[0]
    (path,) = tmp_path.glob("*.py")
    good = path.read_text()
    for damaged in (good[: len(good) // 2], good.replace("tl.rsqrt", "tl.sqrt_rn"), ""):
        path.write_text(damaged)
        fresh = KernelCache(tmp_path)
        with caplog.at_level(logging.WARNING, logger="ad_mlir.codegen.cache"):
            (op,) = _fused_ops(ep)
            fresh.get(op)
        assert fresh.generated == 1 and fresh.hits == 0
        assert "corrupt or stale" in caplog.text and path.name in caplog.text
        assert path.read_text() == good
    torch.testing.assert_close(ad_mlir.compile(ep, pipeline=PIPELINE, cache=KernelCache(tmp_path))(*args)[0], expected)
    assert not list(tmp_path.glob(".*.tmp")), "atomic writes leave no temp files"

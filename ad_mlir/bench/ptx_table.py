"""PTX resources (sm_90, compiled on the CPU) of every kernel the default pipeline generates
for each HF family at real sizes (weights on the meta device)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ad_mlir.models import FAMILIES, ModelShape, export_with_ids, meta_model

TOKENS = 256
"""Kernels are specialized as the runtime launches them at this many tokens."""


def family_kernels(family: str, shape: ModelShape, dtype: str) -> list[Any]:
    """The kernels of a two-layer model of `family` (layers repeat: two show every kernel)."""
    from ad_mlir.frontends.fx_import import import_program
    from ad_mlir.passes.pipeline import run_pipeline
    from ad_mlir.runtime.kernels import build_kernels

    model = meta_model(family, shape, 2, dtype)
    program = import_program(export_with_ids(model, torch.zeros(1, 8, dtype=torch.long, device="meta")))
    run_pipeline(program.module, "default")
    return list(build_kernels(program.module).values())


def run_ptx(
    families: Sequence[str] = tuple(FAMILIES), shape: ModelShape | None = None, dtype: str = "bfloat16",
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per family and distinct kernel: registers, spills, shared memory, vectorized
    global loads/stores, warps, tile."""
    from ad_mlir.codegen.ptx import ptx_reports

    rows = []
    for family in families:
        if progress:
            progress(f"PTX: {family}")
        for report in ptx_reports(family_kernels(family, shape or ModelShape(), dtype), TOKENS):
            rows.append({"family": family, **dataclasses.asdict(report)})
    return rows

"""`compile(gm)`: import -> pass pipeline -> export."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ad_mlir.frontends.fx_export import export_program
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline


def compile(
    gm: torch.fx.GraphModule | torch.export.ExportedProgram,
    example_inputs: Sequence[Any] | None = None,
    pipeline: str = "default",
) -> torch.fx.GraphModule:
    """Compile an FX graph (an ExportedProgram, or a GraphModule with `meta["val"]` or
    `example_inputs`) through `pipeline` ("default", "none" or "pass,pass").
    The result takes the graph's user inputs in order and returns a tuple."""
    program = import_program(gm, example_inputs)
    run_pipeline(program.module, pipeline)
    return export_program(program)

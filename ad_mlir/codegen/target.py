"""`-t triton`: print the Triton kernel (and launcher) of every `ad.fused` region and LLM-level
op, as the kernel cache would write them (an xDSL `Target`; nothing is written or imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target


@dataclass(frozen=True)
class TritonTarget(Target):
    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        from ad_mlir.codegen.cache import kernel_key, kernel_name
        from ad_mlir.codegen.lowering import emit_kernel_source, kernel_ops, kernel_region
        from ad_mlir.dialects.decompositions import NoKernelForm

        kernels = kernel_ops(module)
        if not kernels:
            output.write("# no ad.fused regions or LLM-level ops: run the fusions first (-p default)\n")
        for i, op in enumerate(kernels):
            try:
                lowered = kernel_region(op)
            except NoKernelForm as e:
                output.write(f"# ----- {op.name} at {op.location}: no kernel, runs as its torch reference ({e})\n")
                continue
            key = kernel_key(lowered.region)
            name = kernel_name(lowered.region, key, lowered.label)
            header = f"# ----- kernel {i + 1} of {len(kernels)}: {name} (at {op.location})\n"
            output.write(emit_kernel_source(lowered.region, name, header))

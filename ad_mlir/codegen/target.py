"""`-t triton`: print the Triton kernel (and launcher) of every `ad.fused` region, as the
kernel cache would write them (an xDSL `Target`; nothing is written or imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from ad_mlir.dialects import ad


@dataclass(frozen=True)
class TritonTarget(Target):
    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        from ad_mlir.codegen.cache import kernel_key, kernel_name
        from ad_mlir.codegen.region_kernel import emit_kernel_module

        regions = [op for op in module.walk() if isinstance(op, ad.FusedOp)]
        if not regions:
            output.write("# no ad.fused regions: run fuse-elementwise first (-p default)\n")
        for i, op in enumerate(regions):
            key = kernel_key(op)
            name = kernel_name(op, key)
            header = f"# ----- kernel {i + 1} of {len(regions)}: {name} (at {op.location})\n"
            output.write(emit_kernel_module(op, name, header))

"""`default`: the default pipeline as one pass, so `ad-opt -p default` runs what `compile` runs."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline

from ad_mlir.passes import get_all_passes


@dataclass(frozen=True)
class DefaultPipelinePass(ModulePass):
    """The LLM fusions, then decompose and fuse-elementwise (`passes/pipeline.py` PIPELINES["default"])."""

    name = "default"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from ad_mlir.passes.pipeline import PIPELINES

        PassPipeline.parse_spec(get_all_passes(), PIPELINES["default"]).apply(ctx, op)

"""`fuse-add-layernorm`: `h = x + residual; y = layer_norm(h)` -> `y, h = add_layer_norm(x,
residual)`: `fuse-add-rmsnorm`'s rewrite for LayerNorm (the same conditions; weight and bias
both carry over). The sum keeps its other users, which in a decoder are the next residual
connection and, in parallel blocks (GPT-NeoX's parallel residual), the other norm of the same
input: that norm then reads the fused op's sum.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriteWalker

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.add_norm import FuseAddNorm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FuseAddLayerNormPass(ModulePass):
    """add + layer_norm -> `ad.add_layer_norm` (see the module docstring)."""

    name = "fuse-add-layernorm"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseAddNorm(ad.LayerNormOp, ad.AddLayerNormOp, self.name)
        PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
        log.info("fuse-add-layernorm: %d add + LayerNorm pairs fused", pattern.matches)

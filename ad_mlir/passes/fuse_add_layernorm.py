"""`fuse-add-layernorm`: `h = x + residual; y = layer_norm(h)` -> `y, h = add_layer_norm(x,
residual)`: `fuse-add-rmsnorm`'s rewrite for LayerNorm (the same conditions; weight and bias
both carry over). The sum keeps its other users, which in a decoder are the next residual
connection and, in parallel blocks (GPT-NeoX's parallel residual), the other norm of the same
input: that norm then reads the fused op's sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.pattern_rewriter import RewritePattern

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.add_norm import FuseAddNorm
from ad_mlir.passes.patterns.pattern_pass import PatternPass


@dataclass(frozen=True)
class FuseAddLayerNormPass(PatternPass):
    """add + layer_norm -> `ad.add_layer_norm` (see the module docstring)."""

    name = "fuse-add-layernorm"
    summary = "%d add + LayerNorm pairs fused"

    def patterns(self) -> list[RewritePattern]:
        return [FuseAddNorm(ad.LayerNormOp, ad.AddLayerNormOp, self.name)]

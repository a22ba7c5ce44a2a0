"""`fuse-silu-mul`: `silu(gate) * up` -> `ad.silu_and_mul(gate, up)` (HF's gated MLP).

silu is `ad.silu` or, in a core-ATen graph, `x * sigmoid(x)` (for bf16/f16 `x`, between a
cast to f32 and one back: what torch's silu computes; `passes/patterns/activations.py`).

Gate and up may be two linears, or two last-dim slices of one linear (after `fuse-gemms`):
the kernel reads either through its runtime strides, so the slices cost no copy. The silu
must have no other user, and gate, up and the product must share one type (the op computes
each step in that dtype, as HF's module does).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriteWalker

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.activations import FuseGatedProduct, silu_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FuseSiluMulPass(ModulePass):
    """silu(gate) * up -> `ad.silu_and_mul` (see the module docstring)."""

    name = "fuse-silu-mul"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseGatedProduct(silu_of, ad.SiluAndMulOp, self.name)
        PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
        log.info("fuse-silu-mul: %d silu * up fused", pattern.matches)

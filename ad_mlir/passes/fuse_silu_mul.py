"""`fuse-silu-mul`: `silu(gate) * up` -> `ad.silu_and_mul(gate, up)` (HF's gated MLP).

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
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from ad_mlir.dialects import ad
from ad_mlir.passes.matching import other_operand, producer

log = logging.getLogger(__name__)


class FuseSiluMul(RewritePattern):
    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.MulOp, rewriter: PatternRewriter) -> None:
        silu = next((s for v in op.operands if (s := producer(v, ad.SiluOp)) and v.has_one_use()), None)
        if silu is None:
            return
        up = other_operand(op, silu.result)
        if not silu.input.type == up.type == op.result.type:
            return
        fused = ad.SiluAndMulOp.build(operands=[silu.input, up], result_types=[op.result.type])
        fused.location = op.location
        rewriter.replace(op, fused)
        rewriter.erase(silu)
        self.matches += 1


@dataclass(frozen=True)
class FuseSiluMulPass(ModulePass):
    """silu(gate) * up -> `ad.silu_and_mul` (see the module docstring)."""

    name = "fuse-silu-mul"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseSiluMul()
        PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
        log.info("fuse-silu-mul: %d silu * up fused", pattern.matches)

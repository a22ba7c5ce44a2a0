"""`fuse-silu-mul`: `silu(gate) * up` -> `ad.silu_and_mul(gate, up)` (HF's gated MLP).

silu is `ad.silu` or, in a core-ATen graph, `x * sigmoid(x)` (for bf16/f16 `x`, between a
cast to f32 and one back: what torch's silu computes).

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
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from ad_mlir.dialects import ad
from ad_mlir.passes.matching import erase_dead, other_operand, producer

log = logging.getLogger(__name__)


def silu_of(value: SSAValue) -> tuple[SSAValue, list[Operation]] | None:
    """`(x, ops)` when single-use `value` is `silu(x)`: `ad.silu`, or its core-ATen spelling
    `x * sigmoid(x)`, for a 16-bit `x` computed in f32 between two casts."""
    if not value.has_one_use():
        return None
    if isinstance(silu := value.owner, ad.SiluOp):
        return silu.input, [silu]
    back = producer(value, ad.CastOp)
    product = producer(back.input, ad.MulOp) if back is not None else producer(value, ad.MulOp)
    if product is None or (back is not None and not back.input.has_one_use()):
        return None
    for x in product.operands:
        sigmoid = producer(other_operand(product, x), ad.SigmoidOp)
        if sigmoid is None or sigmoid.input != x or not sigmoid.result.has_one_use():
            continue
        if back is None:
            return x, [product, sigmoid]
        widen = producer(x, ad.CastOp)
        if widen is not None and widen.input.type == value.type:
            return widen.input, [back, product, sigmoid, widen]
    return None


class FuseSiluMul(RewritePattern):
    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.MulOp, rewriter: PatternRewriter) -> None:
        for value in op.operands:
            silu = silu_of(value)
            up = other_operand(op, value)
            if silu is not None and silu[0].type == up.type == op.result.type:
                break
        else:
            return
        gate, chain = silu
        fused = ad.SiluAndMulOp.build(operands=[gate, up], result_types=[op.result.type])
        fused.location = op.location
        rewriter.replace(op, fused)
        erase_dead(rewriter.erase, chain)
        self.matches += 1


@dataclass(frozen=True)
class FuseSiluMulPass(ModulePass):
    """silu(gate) * up -> `ad.silu_and_mul` (see the module docstring)."""

    name = "fuse-silu-mul"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseSiluMul()
        PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
        log.info("fuse-silu-mul: %d silu * up fused", pattern.matches)

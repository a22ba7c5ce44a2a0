"""`fuse-add-rmsnorm`: `h = x + residual; y = rms_norm(h)` -> `y, h = add_rms_norm(x, residual)`.

The residual add of a decoder layer feeds the next norm and the next residual connection; one
kernel reads `x` and `residual` once and writes both the sum and the normalized value. The sum
keeps all its other users (they now read the op's second result). Only a plain add of two
tensors of the norm input's type qualifies (no alpha, no broadcast, no promotion). The new op
takes the add's place, so that users of the sum between the add and the norm still follow its
definition; a weight defined after the add (not the case in HF graphs, where weights are
arguments) leaves the pair unfused.
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
from xdsl.rewriter import InsertPoint

from ad_mlir.dialects import ad
from ad_mlir.passes.matching import dominates_op, plain_binary

log = logging.getLogger(__name__)


class FuseAddRmsNorm(RewritePattern):
    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.RmsNormOp, rewriter: PatternRewriter) -> None:
        add = op.input.owner
        if not plain_binary(add, ad.AddOp) or not add.input.type == add.other.type == add.result.type:
            return
        if op.weight is not None and not dominates_op(op.weight, add):
            log.info("fuse-add-rmsnorm: %s not fused: its weight is defined after the add", op.location)
            return
        fused = ad.AddRmsNormOp.build(
            operands=[add.input, add.other, [op.weight] if op.weight is not None else []],
            properties={name: value for name, value in op.properties.items() if name != "operandSegmentSizes"},
            result_types=[op.result.type, add.result.type],
        )
        fused.location = op.location
        rewriter.insert(fused, InsertPoint.after(add))
        rewriter.replace_all_uses_with(add.result, fused.sum)
        rewriter.replace(op, [], [fused.result])
        rewriter.erase(add)
        self.matches += 1


@dataclass(frozen=True)
class FuseAddRmsNormPass(ModulePass):
    """add + rms_norm -> `ad.add_rms_norm` (see the module docstring)."""

    name = "fuse-add-rmsnorm"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseAddRmsNorm()
        PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
        log.info("fuse-add-rmsnorm: %d add + RMSNorm pairs fused", pattern.matches)

"""`decompose`: high-level ops no later fusion claims, into elementwise + last-dim row
reductions that `fuse-elementwise` can take.

softmax(x, -1) = e / sum(e) with e = exp(x - amax(x)), computed in f32 for f16/bf16 inputs
(as torch does internally) and cast back at the end. silu, gelu and sigmoid need no rewrite:
they are elementwise ops the fuser takes as they are, and codegen expands their formulas.
Softmax over another dim stays (its reductions would not be row reductions).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseArrayBase,
    Float16Type,
    Float32Type,
    ModuleOp,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from ad_mlir.dialects import ad

_COMPUTED_IN_F32 = (Float16Type(), BFloat16Type())


def _with_element(t: TensorType, element: Attribute) -> TensorType:
    return TensorType(element, t.get_shape())


def _row_reduction(op_cls: type[ad.ReductionOp], x: SSAValue) -> Operation:
    shape = list(x.type.get_shape())
    return op_cls.build(
        operands=[x],
        properties={"dim": DenseArrayBase.from_list(i64, [-1]), "keepdim": UnitAttr()},
        result_types=[TensorType(x.type.element_type, [*shape[:-1], 1])],
    )


class DecomposeLastDimSoftmax(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.SoftmaxOp, rewriter: PatternRewriter) -> None:
        rank = len(op.input.type.get_shape())
        if ad.normalize_dim(op.dim.value.data, rank) != rank - 1:
            return
        compute = op.dtype or op.input.type.element_type
        if compute in _COMPUTED_IN_F32:
            compute = Float32Type()
        new_ops: list[Operation] = []
        x = op.input
        if x.type.element_type != compute:
            new_ops.append(ad.CastOp(x, _with_element(x.type, compute)))
            x = new_ops[-1].results[0]
        new_ops.append(row_max := _row_reduction(ad.AmaxOp, x))
        new_ops.append(shifted := ad.SubOp(x, row_max.results[0], x.type))
        new_ops.append(exp := ad.ExpOp(shifted.result))
        new_ops.append(row_sum := _row_reduction(ad.SumOp, exp.result))
        new_ops.append(out := ad.DivOp(exp.result, row_sum.results[0], x.type))
        if out.result.type != op.result.type:
            new_ops.append(out := ad.CastOp(out.result, op.result.type))
        for new in new_ops:
            new.location = op.location
        rewriter.replace(op, new_ops, [out.results[0]])


@dataclass(frozen=True)
class DecomposePass(ModulePass):
    """Rewrite last-dim softmax into amax/sub/exp/sum/div (see the module docstring)."""

    name = "decompose"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(DecomposeLastDimSoftmax(), apply_recursively=False).rewrite_module(op)

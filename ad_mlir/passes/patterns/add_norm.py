"""`norm(x + residual)` -> the norm's add-and-norm op: the pattern `fuse-add-rmsnorm` and
`fuse-add-layernorm` share."""

from __future__ import annotations

import logging

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern
from xdsl.rewriter import InsertPoint

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import dominates_op, keeps_rows, plain_binary, producer, reshape_like

log = logging.getLogger(__name__)


class FuseAddNorm(RewritePattern):
    """`norm(x + residual)` -> `fused(x, residual)`: `fused` is the norm's add-and-norm op, with
    the norm's operands after its input (weight, bias) and its properties."""

    def __init__(self, norm: type[Operation], fused: type[Operation], pass_name: str) -> None:
        self.norm, self.fused, self.pass_name = norm, fused, pass_name
        self.matches = 0

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, self.norm):
            return
        view = producer(op.input, ad.ReshapeOp)
        view = view if view is not None and keeps_rows(view) else None
        add = (view.input if view is not None else op.input).owner
        if not plain_binary(add, ad.AddOp) or not add.input.type == add.other.type == add.result.type:
            return
        parameters = [getattr(op, name) for name, _ in self.norm.get_irdl_definition().operands[1:]]
        where = _insertion_point(add, op, [p for p in parameters if p is not None])
        if where is None:
            log.info("%s: %s not fused: its weight or bias is defined after the add, and the sum is used "
                     "before the norm", self.pass_name, op.location)
            return
        normed_type = TensorType(op.result.type.element_type, add.result.type.get_shape())
        fused = self.fused.build(
            operands=[add.input, add.other, *([p] if p is not None else [] for p in parameters)],
            properties={name: value for name, value in op.properties.items() if name != "operandSegmentSizes"},
            result_types=[normed_type, add.result.type],
        )
        fused.location = op.location
        rewriter.insert(fused, where)
        rewriter.replace_all_uses_with(add.result, fused.sum)
        if view is None:
            rewriter.replace(op, [], [fused.result])
        else:  # the norm of the rows' view is the view of their norm
            rewriter.replace(op, reshape_like(view, fused.result, op.result.type))
            if not view.result.uses:
                rewriter.erase(view)
        rewriter.erase(add)
        self.matches += 1


def _insertion_point(add: ad.AddOp, norm: Operation, parameters: list[SSAValue]) -> InsertPoint | None:
    """Where the fused op goes: the add's place, so that users of the sum before the norm
    still follow its definition; or, for parameters computed after the add (Nemotron's
    `weight + 1`), the norm's place when no other user of the sum comes before the norm."""
    if all(dominates_op(p, add) for p in parameters):
        return InsertPoint.after(add)
    block = norm.parent_block()
    users = [use.operation for use in add.result.uses if use.operation is not norm]
    if all(user.parent_block() is block and norm.is_before_in_block(user) for user in users):
        return InsertPoint.before(norm)
    return None

"""A bias on the attention scores gathered by the query-key distance from a per-token table:
Inkling's activation-conditioned relative position bias (transformers' `InklingRelativeLogits`,
sglang's `RelLogitsProj`), which `insert-cached-attention` gives the cached attention as its
`distance_bias` operand.

HF computes it densely over [queries, keys]:
    logits   = transpose(matmul(relative_states, proj), 1, 2)      [batch, heads, seq, extent]
    distance = unsqueeze(q_positions[:, None] - k_positions[None, :])  [1, 1, seq, keys]
    bias     = masked_fill(gather(logits, -1, expand(clamp(distance, 0, extent - 1))),
                           (distance < 0) | (distance >= extent), 0.0)
possibly scaled per query after (Inkling's log scaling of the full layers multiplies it by tau of
the query position, a [1, 1, seq, 1] factor, in fp32 between casts), and adds it to the scaled
scores: in the eager form as `scores + bias` (the matcher's ALiBi
slot, `Attention.alibi`), through SDPA as the float mask `where(mask, bias, lowest)`
(transformers' `create_position_bias_mask`). `match_distance_bias` recognises the form by its
ops; `check_distance_bias` then runs the index and the masked positions' computations (they may
read only the inputs' shapes, as a mask's) and checks that the bias is `logits[..., q - k]`
where 0 <= q - k < extent and 0 elsewhere, so that only the logits (scaled per query as the
bias was: `per_query`) remain for the cached op."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, FloatAttr, IntegerAttr, IntegerType, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.attention_masks import MaskError, evaluate
from ad_mlir.passes.patterns.matching import constant, producer
from ad_mlir.semantics.op_table import torch_dtype


@dataclass(frozen=True)
class DistanceBias:
    """A bias found by `match_distance_bias`, its gather index and masked positions unchecked."""

    logits: SSAValue
    """[batch, heads, seq, extent]: each query token's bias by backward distance 0 .. extent - 1."""
    index: SSAValue
    """The gather's index before its expand over batch and heads: [1, 1, seq, keys] or broadcast to it."""
    outside: SSAValue
    """The masked_fill's boolean mask: True where the bias is 0."""
    per_query: list[ad.CastOp | ad.MulOp] = field(default_factory=list)
    """Casts and products by a factor with one value per query (its key dim 1) applied to the
    gathered bias, last first: they apply to the logits alike (`scaled_logits`)."""

    @property
    def extent(self) -> int:
        return self.logits.type.get_shape()[3]


def match_distance_bias(bias: SSAValue) -> DistanceBias | None:
    """The module docstring's form of `bias` [batch, heads, seq, keys]: `masked_fill(gather(
    logits, -1, expand(index)), outside, 0.0)` with 4-D float logits of a static last dim
    (the extent), under casts and products by per-query factors; None otherwise."""
    per_query: list[ad.CastOp | ad.MulOp] = []
    while (step := _per_query_step(bias)) is not None:
        per_query.append(step)
        bias = step.operands[0] if isinstance(step, ad.CastOp) else _scaled_operand(step)
    fill = bias.owner
    if not (isinstance(fill, ad.TorchOp) and fill.target.data == "aten.masked_fill.Scalar" and len(fill.inputs) == 2
            and fill.args.data[0] == ad.OperandRefAttr(0) and len(fill.args.data) == 3):
        return None
    value = fill.args.data[2]
    if not isinstance(value, FloatAttr | IntegerAttr) or value.value.data != 0:
        return None
    gather = fill.inputs[0].owner
    if not (isinstance(gather, ad.TorchOp) and gather.target.data == "aten.gather.default" and len(gather.inputs) == 2
            and len(gather.args.data) == 3 and isinstance(gather.args.data[1], IntegerAttr)
            and ad.normalize_dim(gather.args.data[1].value.data, 4) == 3):
        return None
    logits, index = gather.inputs
    shape = logits.type.get_shape()
    if len(shape) != 4 or shape[3] == DYNAMIC_INDEX or not torch_dtype(logits.type.element_type).is_floating_point:
        return None
    expand = producer(index, ad.ExpandOp)
    return DistanceBias(logits, expand.input if expand is not None else index, fill.inputs[1], per_query)


def _per_query_step(value: SSAValue) -> ad.CastOp | ad.MulOp | None:
    """The op of `value` when it is a cast or a product by a factor whose key dim is 1 (4-D
    [..., seq, 1] at most: one value per query, so it scales each query's logits alike)."""
    op = value.owner
    if isinstance(op, ad.CastOp):
        return op
    if isinstance(op, ad.MulOp) and _scaled_operand(op) is not None:
        return op
    return None


def _scaled_operand(mul: ad.MulOp) -> SSAValue | None:
    """The [batch, heads, seq, keys] operand of `mul` whose other operand is a per-query factor."""
    for x, factor in ((mul.input, mul.other), (mul.other, mul.input)):
        shape = x.type.get_shape() if isinstance(x.type, TensorType) else ()
        other = factor.type.get_shape() if isinstance(factor.type, TensorType) else ()
        if len(shape) == 4 and len(other) <= 4 and (not other or other[-1] == 1) \
                and all(d == 1 for d in other[:-2][-2:]):
            return x
    return None


def scaled_logits(found: DistanceBias, at: InsertPoint) -> SSAValue:
    """`found`'s logits under its per-query casts and products (new ops inserted `at`)."""
    value = found.logits
    for op in reversed(found.per_query):
        shape = value.type.get_shape()
        if isinstance(op, ad.CastOp):
            new: Operation = ad.CastOp(value, TensorType(op.result.type.element_type, shape))
        else:
            factor = op.other if _scaled_operand(op) is op.input else op.input
            new = ad.MulOp(value, factor, TensorType(op.result.type.element_type, shape))
        new.location = op.location
        Rewriter.insert_op(new, at)
        value = new.results[0]
    return value


def check_distance_bias(fn: func.FuncOp, found: DistanceBias, inputs: Mapping[str, torch.Tensor]) -> None:
    """Raise a MaskError unless, run on `inputs` (n tokens from position 0), `found`'s index is
    the query-key distance wherever its mask keeps the gathered value, and the mask keeps exactly
    the distances 0 .. extent - 1."""
    index, outside = (evaluate(fn, v, inputs) for v in (found.index, found.outside))
    n, extent = index.shape[-1], found.extent
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    try:
        index, outside = index.broadcast_to((*index.shape[:-2], n, n)), outside.broadcast_to((*outside.shape[:-2], n, n))
    except RuntimeError:
        raise MaskError(f"its score bias gathers by an index {tuple(index.shape)} or masks by "
                        f"{tuple(outside.shape)}, not [queries, keys] of {n} tokens") from None
    if outside.dtype != torch.bool or not torch.equal(outside, ((distance < 0) | (distance >= extent)).expand_as(outside)):
        raise MaskError(f"its score bias gathered from a table of {extent} is not zeroed exactly outside the query-key "
                        f"distances 0 .. {extent - 1}")
    if not torch.equal(torch.where(outside, 0, index), torch.where(outside, 0, distance).expand_as(index)):
        raise MaskError("its score bias is gathered from a per-token table by an index other than the query-key "
                        "distance")


def very_negative(value: SSAValue, dtype_of: SSAValue) -> bool:
    """`value` is a number at most half the lowest of `dtype_of`'s element type (masks it)."""
    number = constant(value)
    return number is not None and number <= torch.finfo(torch_dtype(dtype_of.type.element_type)).min / 2


def biased_mask(mask: SSAValue) -> tuple[SSAValue, DistanceBias] | None:
    """(the boolean mask, the bias) when an attention's float `mask` is transformers'
    `where(mask, bias, lowest)` of a distance bias (the SDPA form), else None."""
    where = producer(mask, ad.WhereOp)
    if where is None or where.condition.type.element_type != IntegerType(1) or not very_negative(where.other, mask):
        return None
    found = match_distance_bias(where.input)
    return (where.condition, found) if found is not None else None


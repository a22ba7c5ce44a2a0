"""`match-rmsnorm`: RMSNorm spelled as elementwise ops -> `ad.rms_norm`.

Anchored on `rsqrt(mean(x^2, -1, keepdim) + eps)` with `x` in fp32, the pattern reads the
chain both ways:
- `x` is the op's input, or `cast(src -> f32)` and then `src` is (HF's `.to(torch.float32)`
  and Gemma's `.float()`); `x^2` is `pow(x, 2)` or `x * x`;
- `n = x * rsqrt(...)`, then either the Llama tail `weight * cast(n -> src dtype)` (the cast
  is absent when src is fp32; the weight is optional), or the Gemma tail
  `cast(n * (float(weight) + offset) -> src dtype)` (`weight_in_fp32`).
Every value between `x` and the result must have no other user (then the chain is replaced
by one op; otherwise the spelling stays as it is). The same spellings arrive from torch's own
`F.rms_norm` decomposition and from `decompose`d graphs, as they are the same ops; torch's
`aten.rms_norm` itself, which torch.export keeps (`nn.RMSNorm`: DiffLlama's head norm), is matched
as the op it is (`MatchTorchRmsNorm`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from xdsl.dialects.builtin import DYNAMIC_INDEX, Float32Type, Float64Type, FloatAttr, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import (
    constant,
    erase_dead,
    is_last_dim_row_reduction,
    other_operand,
    plain_binary,
    producer,
    sole_user,
)
from ad_mlir.passes.patterns.pattern_pass import PatternPass
from ad_mlir.semantics.op_table import UnsupportedError, attr_to_value, bound_arguments, torch_dtype


@dataclass
class RmsNormMatch:
    source: SSAValue
    eps: float
    normed: SSAValue
    """`x * rsqrt(...)`, fp32."""
    result: SSAValue
    """The value the op replaces."""
    weight: SSAValue | None = None
    offset: float = 0.0
    weight_in_fp32: bool = False
    chain: list[Operation] = field(default_factory=list)
    """The matched ops, from the last to the first (the order to erase them)."""


def _mean_of_square(value: SSAValue) -> SSAValue | None:
    """`x` when `value` is `mean(x^2, -1, keepdim)` with single-use steps."""
    mean = producer(value, ad.MeanOp)
    if mean is None or not is_last_dim_row_reduction(mean) or not mean.input.has_one_use():
        return None
    square = mean.input.owner
    if isinstance(square, ad.PowOp) and constant(square.other) == 2.0:
        return square.input
    if isinstance(square, ad.MulOp) and square.input == square.other:
        return square.input
    return None


def match_normalization(rsqrt: ad.RsqrtOp) -> RmsNormMatch | None:
    """The head of the chain: source, eps and `n = x * rsqrt(mean(x^2) + eps)`."""
    add = rsqrt.input.owner
    if not plain_binary(add, ad.AddOp) or not rsqrt.input.has_one_use() or not add.result.has_one_use():
        return None
    mean_value = next((v for v in add.operands if constant(v) is None), None)
    eps = constant(other_operand(add, mean_value)) if mean_value is not None else None
    x = _mean_of_square(mean_value) if eps is not None else None
    if x is None or x.type.element_type != Float32Type():
        return None
    scale = sole_user(rsqrt.result, ad.MulOp)
    if scale is None or other_operand(scale, rsqrt.result) != x:
        return None
    cast = producer(x, ad.CastOp)
    source = cast.input if cast is not None and cast.input.type.element_type != Float64Type() else x
    chain = [scale, rsqrt, add, mean_value.owner, mean_value.owner.input.owner, *([cast] if cast else [])]
    return RmsNormMatch(source, eps, scale.result, scale.result, chain=chain)


def _fp32_weight(value: SSAValue) -> tuple[SSAValue, float, list[Operation]] | None:
    """Gemma's `float(weight) + offset` (or `float(weight)`, or `weight + offset` in fp32):
    the weight, the offset and the ops that compute the factor (last first)."""
    offset, ops = 0.0, []
    add = value.owner
    if plain_binary(add, ad.AddOp) and value.has_one_use():
        constants = [constant(v) for v in add.operands]
        if constants.count(None) != 1:
            return None
        offset = next(c for c in constants if c is not None)
        value = next(v for v, c in zip(add.operands, constants, strict=True) if c is None)
        ops.append(add)
    cast = producer(value, ad.CastOp)
    if cast is not None and value.has_one_use():
        ops.append(cast)
        value = cast.input
    return (value, offset, ops) if _is_norm_weight(value) else None


def _is_norm_weight(value: SSAValue) -> bool:
    shape = value.type.get_shape() if hasattr(value.type, "get_shape") else ()
    return len(shape) == 1


def match_weight_tail(m: RmsNormMatch) -> RmsNormMatch | None:
    """Extend `m` over the weight multiply (Llama or Gemma form) and the casts around it."""
    narrow = m.source.type.element_type != Float32Type()
    cast = sole_user(m.normed, ad.CastOp)
    if cast is not None and narrow and cast.result.type.element_type == m.source.type.element_type:
        m.chain.insert(0, cast)
        m.result = cast.result
        return _llama_weight(m)
    mul = sole_user(m.normed, ad.MulOp)
    if mul is None:
        return None if narrow else m
    weight = _fp32_weight(other_operand(mul, m.normed))
    if weight is None:
        return None if narrow else m
    if not narrow and not weight[2]:  # a plain weight on fp32: both forms agree, keep Llama's
        return _llama_weight(m)
    m.weight, m.offset, weight_ops = weight
    m.weight_in_fp32 = True
    m.chain[:0] = [mul, *weight_ops]
    m.result = mul.result
    if narrow:
        back = sole_user(mul.result, ad.CastOp)
        if back is None or back.result.type.element_type != m.source.type.element_type:
            return None
        m.chain.insert(0, back)
        m.result = back.result
    return m


def _llama_weight(m: RmsNormMatch) -> RmsNormMatch:
    mul = sole_user(m.result, ad.MulOp)
    if mul is not None and _is_norm_weight(weight := other_operand(mul, m.result)):
        m.weight = weight
        m.chain.insert(0, mul)
        m.result = mul.result
    return m


def build_rms_norm(m: RmsNormMatch, location) -> ad.RmsNormOp:  # noqa: ANN001 (an xDSL location)
    properties = {"eps": FloatAttr(m.eps, Float64Type())}
    if m.offset:
        properties["offset"] = FloatAttr(m.offset, Float64Type())
    if m.weight_in_fp32:
        properties["weight_in_fp32"] = UnitAttr()
    op = ad.RmsNormOp.build(
        operands=[m.source, [m.weight] if m.weight is not None else []],
        properties=properties,
        result_types=[m.result.type],
    )
    op.location = location
    return op


class MatchRmsNorm(RewritePattern):
    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.RsqrtOp, rewriter: PatternRewriter) -> None:
        head = match_normalization(op)
        m = match_weight_tail(head) if head is not None else None
        if m is None:
            return
        norm = build_rms_norm(m, m.chain[0].location)
        try:
            norm.verify()
        except Exception:  # a spelling whose types the op cannot hold (e.g. an f64 weight)
            norm.erase()
            return
        last = m.result.owner
        rewriter.replace(last, norm, [norm.result])
        erase_dead(rewriter.erase, m.chain[1:])
        self.matches += 1


class MatchTorchRmsNorm(RewritePattern):
    """`aten.rms_norm(x, [x.shape[-1]], weight, eps)` carried as a torch op: torch computes it
    in fp32 (x upcast, `x * rsqrt(mean(x^2) + eps)`, times the weight there) and casts the
    result to x's dtype once, which is `ad.rms_norm` with `weight_in_fp32`; eps unset is the
    fp32 epsilon (torch's for an fp32, bf16 or f16 input)."""

    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        if op.target.data != "aten.rms_norm.default" or len(op.results) != 1:
            return
        try:
            operands = list(op.operands)
            call = bound_arguments(op.target.data, attr_to_value(op.args, operands), attr_to_value(op.kwargs, operands))
        except UnsupportedError:  # an argument with no Python value: not a call we can read
            return
        x, weight = call["input"], call["weight"]
        shape = x.type.get_shape()
        if not shape or list(call["normalized_shape"]) != [shape[-1]] or shape[-1] == DYNAMIC_INDEX \
                or torch_dtype(x.type.element_type) == torch.float64 or op.results[0].type != x.type:
            return
        eps = call["eps"] if call["eps"] is not None else torch.finfo(torch.float32).eps
        m = RmsNormMatch(x, eps, op.results[0], op.results[0], weight, weight_in_fp32=weight is not None)
        norm = build_rms_norm(m, op.location)
        try:
            norm.verify()
        except Exception:  # noqa: BLE001 (types the op cannot hold, e.g. an f64 weight: left to torch)
            norm.erase()
            return
        rewriter.replace(op, norm, [norm.result])
        self.matches += 1


@dataclass(frozen=True)
class MatchRmsNormPass(PatternPass):
    """RMSNorm spellings -> `ad.rms_norm` (see the module docstring)."""

    name = "match-rmsnorm"
    summary = "%d RMSNorms matched, %d torch RMSNorms"

    def patterns(self) -> list[RewritePattern]:
        return [MatchRmsNorm(), MatchTorchRmsNorm()]

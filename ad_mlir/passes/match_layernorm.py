"""`match-layernorm`: the LayerNorm spellings of the models -> `ad.layer_norm`.

- `aten.layer_norm` (nn.LayerNorm, F.layer_norm, with or without weight and bias; Nemotron's
  LayerNorm1P passes `weight + 1`, a value computed from weights alone, once, at compile time)
  and `aten.native_layer_norm` (what AOTAutograd, and so the torch.compile backend, makes of it;
  its mean and rstd unused) over the last dim: the importer carries them as `ad.torch_op`, so
  that a graph without passes runs what eager runs;
- spelled out in fp32 (Cohere's `CohereLayerNorm`), anchored on `rsqrt(mean(d^2, -1, keepdim) +
  eps)` with `d = x - mean(x, -1, keepdim)` and `x` in fp32 (the op's input, or `cast(src ->
  f32)` of a bf16/fp16 `src`), `d^2` as `pow(d, 2)` or `d * d`: `n = d * rsqrt(...)`, then
  optionally `n * w` and `+ b` in fp32 (1-D `w`, `b`; `float(w)` of a bf16/fp16 weight reads the
  weight itself), and the cast back to `src`'s dtype. Every value between `x` and the result
  has no other user; `d` feeds only its square and `n`. A weight multiply in the narrow dtype
  after the cast (two roundings) is not a LayerNorm `ad.layer_norm` can hold: the chain then
  ends before it;
- `cast(layer_norm(cast(x -> f32)) -> dtype of x)` (OLMo's F.layer_norm on `x.float()`): the
  fp32 LayerNorm of an exact upcast, rounded once, is `layer_norm(x)`.
The RMSNorm of the centered value inside the spelled-out form would also match `match-rmsnorm`:
run this pass first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.utils.exceptions import VerifyException

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
from ad_mlir.semantics.op_table import UnsupportedError, attr_to_value, bound_arguments

log = logging.getLogger(__name__)

_NARROW = (BFloat16Type(), Float16Type())
"""Floats whose conversion to fp32 is exact."""


@dataclass
class LayerNormMatch:
    source: SSAValue
    eps: float
    result: SSAValue
    """The value the op replaces."""
    weight: SSAValue | None = None
    bias: SSAValue | None = None
    chain: list[Operation] = field(default_factory=list)
    """The matched ops, from the last to the first (the order to erase them)."""


def _row_mean(value: SSAValue) -> ad.MeanOp | None:
    mean = producer(value, ad.MeanOp)
    return mean if mean is not None and is_last_dim_row_reduction(mean) else None


def _upcast_source(x: SSAValue) -> SSAValue | None:
    """`src` when `x` is `cast(src -> f32)` of a bf16/fp16 `src` (exact), else None."""
    cast = producer(x, ad.CastOp)
    return cast.input if cast is not None and cast.input.type.element_type in _NARROW else None


def _square_of(value: SSAValue) -> tuple[SSAValue, Operation] | None:
    square = value.owner
    if isinstance(square, ad.PowOp) and constant(square.other) == 2.0:
        return square.input, square
    if isinstance(square, ad.MulOp) and square.input == square.other:
        return square.input, square
    return None


def match_normalization(rsqrt: ad.RsqrtOp) -> tuple[LayerNormMatch, SSAValue] | None:
    """The head of the chain: `n = d * rsqrt(mean(d^2) + eps)` with `d = x - mean(x)`, `x` fp32;
    the match (its result `n`, its source `x`) and the narrow `src` that `x` is an upcast of."""
    add = rsqrt.input.owner
    if not plain_binary(add, ad.AddOp) or not rsqrt.input.has_one_use() or not add.result.has_one_use():
        return None
    variance = next((v for v in add.operands if constant(v) is None), None)
    eps = constant(other_operand(add, variance)) if variance is not None else None
    var_mean = _row_mean(variance) if eps is not None else None
    squared = _square_of(var_mean.input) if var_mean is not None and var_mean.input.has_one_use() else None
    if squared is None:
        return None
    centered, square = squared
    sub = centered.owner
    if not plain_binary(sub, ad.SubOp) or (mean := _row_mean(sub.other)) is None or mean.input != sub.input:
        return None
    x = sub.input
    scale = sole_user(rsqrt.result, ad.MulOp)
    if scale is None or other_operand(scale, rsqrt.result) != centered or x.type.element_type != Float32Type():
        return None
    if {use.operation for use in centered.uses} != {square, scale} or not mean.result.has_one_use():
        log.info("match-layernorm: %s not matched: a step of its LayerNorm has other users", scale.location)
        return None
    chain = [scale, rsqrt, add, var_mean, square, sub, mean]
    return LayerNormMatch(x, eps, scale.result, chain=chain), _upcast_source(x)


def _row_parameter(value: SSAValue, chain: list[Operation]) -> SSAValue | None:
    """A weight or bias: 1-D, read as it is stored when the fp32 value is its exact upcast
    (the cast joins the chain)."""
    if not isinstance(value.type, TensorType) or len(value.type.get_shape()) != 1:
        return None
    stored = _upcast_source(value)
    if stored is not None and value.has_one_use():
        chain.insert(0, value.owner)
        return stored
    return value


def _fp32_step(value: SSAValue, op_type: type[ad.BinaryOp]) -> ad.BinaryOp | None:
    """The only user of `value`, a plain `op_type` computed in fp32 (as the op applies its
    weight and bias)."""
    op = sole_user(value, op_type)
    if op is None or not plain_binary(op, op_type) or op.result.type.element_type != Float32Type():
        return None
    return op


def match_affine_tail(m: LayerNormMatch, narrow_source: SSAValue | None) -> LayerNormMatch:
    """Extend `m` over `* w`, `+ b` (fp32) and the cast back to the narrow source's dtype (the
    weight and bias are operands of ops of the chain: they are defined before its end)."""
    mul = _fp32_step(m.result, ad.MulOp)
    if mul is not None and (w := _row_parameter(other_operand(mul, m.result), m.chain)) is not None:
        m.weight, m.result = w, mul.result
        m.chain.insert(0, mul)
    add = _fp32_step(m.result, ad.AddOp)
    if add is not None and (b := _row_parameter(other_operand(add, m.result), m.chain)) is not None:
        m.bias, m.result = b, add.result
        m.chain.insert(0, add)
    back = sole_user(m.result, ad.CastOp)
    if narrow_source is not None and back is not None and back.result.type.element_type == (
        narrow_source.type.element_type
    ):
        m.chain = [back, *m.chain, m.source.owner]  # the upcast goes too, unless something else reads it
        m.source, m.result = narrow_source, back.result
    return m


def build_layer_norm(
    source: SSAValue, weight: SSAValue | None, bias: SSAValue | None, eps: float, result_type: Attribute,
    location: Attribute,
) -> ad.LayerNormOp | None:
    """The op, or None when it does not verify (a weight of a type it cannot hold)."""
    op = ad.LayerNormOp.build(
        operands=[source, [weight] if weight is not None else [], [bias] if bias is not None else []],
        properties={"eps": FloatAttr(eps, Float64Type())},
        result_types=[result_type],
    )
    op.location = location
    try:
        op.verify()
    except VerifyException as e:
        log.info("match-layernorm: %s not matched: %s", location, e)
        op.erase()
        return None
    return op


class MatchSpelledLayerNorm(RewritePattern):
    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.RsqrtOp, rewriter: PatternRewriter) -> None:
        head = match_normalization(op)
        if head is None:
            return
        m = match_affine_tail(*head)
        norm = build_layer_norm(m.source, m.weight, m.bias, m.eps, m.result.type, m.chain[0].location)
        if norm is None:
            return
        rewriter.replace(m.result.owner, norm, [norm.result])
        erase_dead(rewriter.erase, m.chain[1:])
        self.matches += 1


class FoldLayerNormCasts(RewritePattern):
    """`cast(layer_norm(cast(x -> f32)) -> x's dtype)` -> `layer_norm(x)`."""

    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.CastOp, rewriter: PatternRewriter) -> None:
        norm = producer(op.input, ad.LayerNormOp)
        if norm is None or not norm.result.has_one_use():
            return
        source = _upcast_source(norm.input)
        if source is None or op.result.type != source.type:
            return
        folded = build_layer_norm(source, norm.weight, norm.bias, norm.eps.value.data, op.result.type, norm.location)
        if folded is None:
            return
        upcast = norm.input.owner
        rewriter.replace(op, folded, [folded.result])
        rewriter.erase(norm)
        if not upcast.result.uses:
            rewriter.erase(upcast)
        self.matches += 1


TORCH_LAYER_NORMS = {"aten.layer_norm.default": 1, "aten.native_layer_norm.default": 3}
"""The ATen LayerNorms the importer carries as `ad.torch_op`, and their result counts (the
native one's mean and rstd must be unused)."""


class MatchTorchLayerNorm(RewritePattern):
    """`layer_norm(x, [x.shape[-1]], w, b, eps)` / `native_layer_norm(...)` carried as torch
    ops: torch's LayerNorm kernel, which the importer keeps (so that the `none` pipeline runs
    what eager runs), becomes the op (whose kernel differs from it by the order of the row sums
    only). `cudnn_enable` only picks a CUDA backend."""

    def __init__(self) -> None:
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        target = op.target.data
        if len(op.results) != TORCH_LAYER_NORMS.get(target) or any(r.uses for r in op.results[1:]):
            return
        try:
            operands = list(op.operands)
            call = bound_arguments(target, attr_to_value(op.args, operands), attr_to_value(op.kwargs, operands))
        except UnsupportedError:  # an argument with no Python value: not a call we can read
            return
        x, shape = call["input"], call["normalized_shape"]
        x_shape = x.type.get_shape()
        if not x_shape or list(shape) != [x_shape[-1]] or x_shape[-1] == DYNAMIC_INDEX:
            log.info("match-layernorm: %s not matched: it normalizes over %s, not the last dim", op.location, shape)
            return
        norm = build_layer_norm(x, call["weight"], call["bias"], call["eps"], op.results[0].type, op.location)
        if norm is None:
            return
        rewriter.replace(op, norm, [norm.result, *(None for _ in op.results[1:])])
        self.matches += 1


@dataclass(frozen=True)
class MatchLayerNormPass(PatternPass):
    """LayerNorm spellings -> `ad.layer_norm` (see the module docstring)."""

    name = "match-layernorm"
    summary = "%d torch LayerNorms, %d spelled out, %d casts folded"

    def patterns(self) -> list[RewritePattern]:
        return [MatchTorchLayerNorm(), MatchSpelledLayerNorm(), FoldLayerNormCasts()]

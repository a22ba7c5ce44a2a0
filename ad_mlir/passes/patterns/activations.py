"""MLP activations as imported graphs spell them, and the gated-product pattern, shared by
`fuse-silu-mul`, `fuse-gelu-mul` and `fuse-activation`.

An activation matcher reads the def-use chain back from a value and returns an `Activation`:
the activation's input, the ops that computed it (erased once dead) and the properties the
fused op takes. Every value between the input and the matched value must have no other user:
otherwise the spelling stays as it is.

- SiLU: `ad.silu`, or its core-ATen spelling `x * sigmoid(x)` (for a 16-bit `x`, between a
  cast to f32 and one back: what torch's silu computes).
- GELU: `ad.gelu` (either approximation), or in f32 the tanh formula spelled out, as HF's
  `NewGELUActivation` (`gelu_new`, GPT-2/Phi/GPT-J), `GELUTanh(use_gelu_tanh_python)` and
  `AccurateGELUActivation` write it: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 *
  x^3)))`, or BLOOM's `bloom_gelu_forward`: `x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715
  * x * x)))`. In f32 that formula and torch's tanh-GELU kernel are the same math in another
  order of roundings (measured: at most 4.8e-7 apart for |x| < 20, a few fp32 ulps). In a
  16-bit dtype eager rounds each of the formula's 8 steps to 16 bits, where the fused op
  rounds once; that spelling is left to `fuse-elementwise`, whose kernel rounds where eager
  does (and the log says so).
- ReLU^2 (`relu2`: Nemotron, Primer): `relu(x)` squared as `r * r` (`torch.square` exports
  so) or `pow(r, 2)`.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.dialects.builtin import Float32Type, StringAttr
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import (
    constant,
    describe_op,
    erase_dead,
    other_operand,
    plain_binary,
    producer,
)

log = logging.getLogger(__name__)


@dataclass
class Activation:
    input: SSAValue
    ops: list[Operation]
    """The matched ops, users first (the order to erase them)."""
    properties: dict[str, Attribute] = field(default_factory=dict)
    """For `ad.gelu_and_mul`: its `approximate`, when the GELU has one."""
    kind: str = ""
    """For `ad.activation`: its kind (`ad.ACTIVATIONS`)."""


ActivationMatcher = Callable[[SSAValue], Activation | None]


# ------------------------------------------------------------------------------ SiLU


def silu_of(value: SSAValue) -> Activation | None:
    """`value` is `silu(x)`: `ad.silu`, or its core-ATen spelling `x * sigmoid(x)`, for a
    16-bit `x` computed in f32 between two casts."""
    if isinstance(silu := value.owner, ad.SiluOp):
        return Activation(silu.input, [silu], kind="silu")
    back = producer(value, ad.CastOp)
    product = producer(back.input, ad.MulOp) if back is not None else producer(value, ad.MulOp)
    if product is None or (back is not None and not back.input.has_one_use()):
        return None
    for x in product.operands:
        sigmoid = producer(other_operand(product, x), ad.SigmoidOp)
        if sigmoid is None or sigmoid.input != x or not sigmoid.result.has_one_use():
            continue
        if back is None:
            return Activation(x, [product, sigmoid], kind="silu")
        widen = producer(x, ad.CastOp)
        if widen is not None and widen.input.type == value.type:
            return Activation(widen.input, [back, product, sigmoid, widen], kind="silu")
    return None


# ------------------------------------------------------------------------------ GELU

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_TANH_GELU_CUBE = 0.044715


def gelu_of(value: SSAValue) -> Activation | None:
    """`value` is `gelu(x)`: `ad.gelu`, or the tanh formula spelled out in f32."""
    if isinstance(gelu := value.owner, ad.GeluOp):
        tanh = gelu.approximate == StringAttr("tanh")
        properties = {"approximate": gelu.approximate} if gelu.approximate is not None else {}
        return Activation(gelu.input, [gelu], properties, "gelu_tanh" if tanh else "gelu")
    match = _spelled_tanh_gelu(value)
    if match is None:
        return None
    if match.input.type.element_type != Float32Type():
        log.info("%s: a tanh GELU spelled out in %s is left to fuse-elementwise (eager rounds each of its steps)",
                 describe_op(value.owner), match.input.type.element_type)
        return None
    return match


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _scaled(value: SSAValue, factor: float) -> SSAValue | None:
    """`v` when single-use `value` is `v * factor` (either operand order), the factor as an
    f32 chain multiplies by it (torch rounds a Python scalar to the tensor's dtype)."""
    mul = producer(value, ad.MulOp)
    if mul is None or not value.has_one_use():
        return None
    for v in mul.operands:
        c = constant(other_operand(mul, v))
        if c is not None and _f32(c) == _f32(factor):
            return v
    return None


def _shifted_by_one(value: SSAValue) -> SSAValue | None:
    """`v` when single-use `value` is `v + 1` (either operand order)."""
    add = producer(value, ad.AddOp)
    if add is None or not plain_binary(add, ad.AddOp) or not value.has_one_use():
        return None
    return next((v for v in add.operands if constant(other_operand(add, v)) == 1.0), None)


def _cube(value: SSAValue) -> SSAValue | None:
    """`x` when single-use `value` is `pow(x, 3)`."""
    power = producer(value, ad.PowOp)
    if power is None or constant(power.other) != 3.0 or not value.has_one_use():
        return None
    return power.input


def _tanh_gelu_inner(value: SSAValue) -> SSAValue | None:
    """`x` when `value` is `sqrt(2/pi) * (x + 0.044715 * x^3)`, or BLOOM's factored
    `(sqrt(2/pi) * x) * (1 + 0.044715 * x * x)`."""
    inner = _scaled(value, _SQRT_2_OVER_PI)
    if inner is None:
        return _factored_tanh_gelu_inner(value)
    add = producer(inner, ad.AddOp) if inner is not None else None
    if add is None or not plain_binary(add, ad.AddOp) or not inner.has_one_use():
        return None
    for x in add.operands:
        cubed = _scaled(other_operand(add, x), _TANH_GELU_CUBE)
        if cubed is not None and _cube(cubed) == x:
            return x
    return None


def _factored_tanh_gelu_inner(value: SSAValue) -> SSAValue | None:
    """`x` when `value` is `(sqrt(2/pi) * x) * (1 + (0.044715 * x) * x)`, any operand order
    (`bloom_gelu_forward`: its 0.79788456 is sqrt(2/pi) in f32)."""
    product = producer(value, ad.MulOp)
    if product is None or not plain_binary(product, ad.MulOp):
        return None
    for scaled in product.operands:
        x = _scaled(scaled, _SQRT_2_OVER_PI)
        shifted = _shifted_by_one(other_operand(product, scaled))
        square = producer(shifted, ad.MulOp) if shifted is not None and shifted.has_one_use() else None
        if x is not None and square is not None and any(
                _scaled(s, _TANH_GELU_CUBE) == x and other_operand(square, s) == x for s in square.operands):
            return x
    return None


def _spelled_tanh_gelu(value: SSAValue) -> Activation | None:
    """`(x * 0.5) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))`, any operand order."""
    product = producer(value, ad.MulOp)
    if product is None:
        return None
    for half in product.operands:
        x = _scaled(half, 0.5)
        tanh_plus_one = other_operand(product, half)
        tanh = producer(t, ad.TanhOp) if (t := _shifted_by_one(tanh_plus_one)) is not None else None
        if x is None or tanh is None or not tanh.result.has_one_use() or _tanh_gelu_inner(tanh.input) != x:
            continue
        if not x.type == value.type == half.type == tanh.result.type:
            return None
        ops = _chain_ops(value, x)
        return Activation(x, ops, {"approximate": StringAttr("tanh")}, "gelu_tanh")
    return None


def _chain_ops(value: SSAValue, source: SSAValue) -> list[Operation]:
    """The ops between `source` and `value` (matched: each of their results is used once, in
    the chain), users first."""
    ops: list[Operation] = []
    work = [value.owner]
    while work:
        op = work.pop(0)
        if op in ops:
            continue
        ops.append(op)
        work += [v.owner for v in op.operands if v is not source and isinstance(v.owner, Operation)
                 and not isinstance(v.owner, ad.ConstantOp)]
    return ops


# ---------------------------------------------------------------------------- ReLU^2


def relu2_of(value: SSAValue) -> Activation | None:
    """`value` is `relu(x)` squared: `r * r` or `pow(r, 2)`."""
    owner = value.owner
    if isinstance(owner, ad.MulOp) and owner.input == owner.other:
        r = owner.input
    elif isinstance(owner, ad.PowOp) and constant(owner.other) == 2.0:
        r = owner.input
    else:
        return None
    relu = producer(r, ad.ReluOp)
    if relu is None or any(use.operation is not owner for use in r.uses) or r.type != value.type:
        return None
    return Activation(relu.input, [owner, relu], kind="relu2")


def relu_of(value: SSAValue) -> Activation | None:
    relu = producer(value, ad.ReluOp)
    return Activation(relu.input, [relu], kind="relu") if relu is not None else None


# ------------------------------------------------------------------- gated products


class FuseGatedProduct(RewritePattern):
    """`act(gate) * up` -> `op_type(gate, up)`: the activation (read by `activation_of`) must
    have no other user, and gate, up and the product must share one type (the op computes
    each step in that dtype, as HF's module does)."""

    def __init__(self, activation_of: ActivationMatcher, op_type: type[ad.KernelOp], pass_name: str) -> None:
        self.activation_of = activation_of
        self.op_type = op_type
        self.pass_name = pass_name
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.MulOp, rewriter: PatternRewriter) -> None:
        for value in op.operands:
            if (act := self.activation_of(value)) is None:
                continue
            up = other_operand(op, value)
            if not value.has_one_use():
                log.info("%s: %s not fused: the activation has other users", self.pass_name, describe_op(op))
            elif not act.input.type == up.type == op.result.type:
                log.info("%s: %s not fused: gate %s, up %s and product %s differ", self.pass_name, describe_op(op),
                         act.input.type, up.type, op.result.type)
            else:
                break
        else:
            return
        fused = self.op_type.build(operands=[act.input, up], properties=act.properties,
                                   result_types=[op.result.type])
        fused.location = op.location
        rewriter.replace(op, fused)
        erase_dead(rewriter.erase, act.ops)
        self.matches += 1

"""The LLM-level ops (`ad.KernelOp`) spelled as elementwise and last-dim row-reduction ops.

Codegen emits a kernel op through its decomposition: the generic region emitter then reads
each input once, keeps the math in fp32, and rounds where a step's IR type is narrower, so
the kernel rounds where the torch reference (`semantics/torch_ops.py`) rounds. Each function
takes the op and returns the new ops (to insert before it) and the values that replace its
results.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import (
    DenseArrayBase,
    Float8E4M3FNType,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue

from ad_mlir.dialects import ad

Decomposition = tuple[list[Operation], list[SSAValue]]


class NoKernelForm(Exception):
    """An op instance without a row-kernel decomposition (it runs as its torch reference)."""


class _Builder:
    """Collects new ops; each method returns the value it made."""

    def __init__(self, location: Attribute) -> None:
        self.ops: list[Operation] = []
        self.location = location

    def add(self, op: Operation) -> SSAValue:
        op.location = self.location
        self.ops.append(op)
        return op.results[0]

    def constant(self, value: float | int) -> SSAValue:
        if isinstance(value, int):
            return self.add(ad.ConstantOp(IntegerAttr(value, i64)))
        return self.add(ad.ConstantOp(FloatAttr(value, Float64Type())))

    def cast(self, x: SSAValue, element: Attribute) -> SSAValue:
        if x.type.element_type == element:
            return x
        return self.add(ad.CastOp(x, _with_element(x.type, element)))

    def row_reduction(self, op_type: type[ad.ReductionOp], x: SSAValue) -> SSAValue:
        shape = list(x.type.get_shape())
        return self.add(
            op_type.build(
                operands=[x],
                properties={"dim": DenseArrayBase.from_list(i64, [-1]), "keepdim": UnitAttr()},
                result_types=[TensorType(x.type.element_type, [*shape[:-1], 1])],
            )
        )

    def replace_where(self, compare: type[ad.CompareOp], x: SSAValue, bound: float) -> SSAValue:
        """`bound` where `x compare bound`, else `x` (NaN compares false and stays NaN)."""
        limit = self.constant(bound)
        condition = self.add(compare(x, limit, _with_element(x.type, IntegerType(1))))
        return self.add(ad.WhereOp.build(operands=[condition, limit, x], result_types=[x.type]))


def _with_element(t: TensorType, element: Attribute) -> TensorType:
    return TensorType(element, t.get_shape())


def _normalized(b: _Builder, x: SSAValue, eps: float) -> SSAValue:
    """`xf * rsqrt(mean(xf^2) + eps)` with `xf` the input in fp32."""
    xf = b.cast(x, Float32Type())
    square = b.add(ad.PowOp(xf, b.constant(2), xf.type))
    mean = b.row_reduction(ad.MeanOp, square)
    shifted = b.add(ad.AddOp(mean, b.constant(eps), mean.type))
    return b.add(ad.MulOp(xf, b.add(ad.RsqrtOp(shifted)), xf.type))


def _weighted(b: _Builder, op: ad.NormOp, x: SSAValue, normed: SSAValue, result_type: Attribute) -> SSAValue:
    offset = op.offset.value.data if op.offset is not None else 0.0
    weight = op.weight
    if weight is None:
        return b.cast(normed, x.type.element_type)
    if op.weight_in_fp32 is not None:
        w = b.cast(weight, Float32Type())
        if offset:
            w = b.add(ad.AddOp(w, b.constant(offset), w.type))
        return b.cast(b.add(ad.MulOp(normed, w, normed.type)), result_type.element_type)
    if offset:
        weight = b.add(ad.AddOp(weight, b.constant(offset), weight.type))
    return b.add(ad.MulOp(weight, b.cast(normed, x.type.element_type), result_type))


def decompose_rms_norm(op: ad.RmsNormOp) -> Decomposition:
    b = _Builder(op.location)
    normed = _normalized(b, op.input, op.eps.value.data)
    return b.ops, [_weighted(b, op, op.input, normed, op.result.type)]


def decompose_add_rms_norm(op: ad.AddRmsNormOp) -> Decomposition:
    b = _Builder(op.location)
    total = b.add(ad.AddOp(op.input, op.residual, op.sum.type))
    normed = _normalized(b, total, op.eps.value.data)
    return b.ops, [_weighted(b, op, total, normed, op.result.type), total]


def _layer_normalized(b: _Builder, op: ad.LayerNormBase, x: SSAValue) -> SSAValue:
    """`torch_ops.layer_norm`'s steps: fp32 math, the biased variance, `* w + b` in fp32, one
    rounding to the input's type at the end."""
    xf = b.cast(x, Float32Type())
    centered = b.add(ad.SubOp(xf, b.row_reduction(ad.MeanOp, xf), xf.type))
    variance = b.row_reduction(ad.MeanOp, b.add(ad.MulOp(centered, centered, xf.type)))
    shifted = b.add(ad.AddOp(variance, b.constant(op.eps.value.data), variance.type))
    normed = b.add(ad.MulOp(centered, b.add(ad.RsqrtOp(shifted)), xf.type))
    if op.weight is not None:
        normed = b.add(ad.MulOp(normed, b.cast(op.weight, Float32Type()), xf.type))
    if op.bias is not None:
        normed = b.add(ad.AddOp(normed, b.cast(op.bias, Float32Type()), xf.type))
    return b.cast(normed, x.type.element_type)


def decompose_layer_norm(op: ad.LayerNormOp) -> Decomposition:
    b = _Builder(op.location)
    return b.ops, [_layer_normalized(b, op, op.input)]


def decompose_add_layer_norm(op: ad.AddLayerNormOp) -> Decomposition:
    b = _Builder(op.location)
    total = b.add(ad.AddOp(op.input, op.residual, op.sum.type))
    return b.ops, [_layer_normalized(b, op, total), total]


def decompose_silu_and_mul(op: ad.SiluAndMulOp) -> Decomposition:
    b = _Builder(op.location)
    return b.ops, [b.add(ad.MulOp(b.add(ad.SiluOp(op.gate)), op.up, op.result.type))]


def _gelu(x: SSAValue, approximate: StringAttr | None) -> ad.GeluOp:
    return ad.GeluOp.build(operands=[x], properties={"approximate": approximate} if approximate else {},
                           result_types=[x.type])


def decompose_gelu_and_mul(op: ad.GeluAndMulOp) -> Decomposition:
    b = _Builder(op.location)
    return b.ops, [b.add(ad.MulOp(b.add(_gelu(op.gate, op.approximate)), op.up, op.result.type))]


_ACTIVATIONS: dict[str, Callable[[_Builder, SSAValue], SSAValue]] = {
    "gelu": lambda b, x: b.add(_gelu(x, None)),
    "gelu_tanh": lambda b, x: b.add(_gelu(x, StringAttr("tanh"))),
    "relu": lambda b, x: b.add(ad.ReluOp(x)),
    "relu2": lambda b, x: b.add(ad.MulOp(r := b.add(ad.ReluOp(x)), r, x.type)),
    "silu": lambda b, x: b.add(ad.SiluOp(x)),
}
"""`ad.activation` kind -> its ops, as `torch_ops.ACTIVATION_FUNCTIONS` computes it."""


def decompose_activation(op: ad.ActivationOp) -> Decomposition:
    b = _Builder(op.location)
    x = op.input if op.bias is None else b.add(ad.AddOp(op.input, op.bias, op.input.type))
    return b.ops, [_ACTIVATIONS[op.kind.data](b, x)]


def _quantized(b: _Builder, x: SSAValue, scale: SSAValue) -> SSAValue:
    """`clamp(float(x) / scale, -448, 448)` as float8_e4m3fn (out of range would be NaN)."""
    xf = b.cast(x, Float32Type())
    scaled = b.add(ad.DivOp(xf, scale, xf.type))
    clamped = b.replace_where(ad.LtOp, b.replace_where(ad.GtOp, scaled, ad.FP8_MAX), -ad.FP8_MAX)
    return b.cast(clamped, Float8E4M3FNType())


def decompose_quantize_fp8(op: ad.QuantizeFp8Op) -> Decomposition:
    b = _Builder(op.location)
    return b.ops, [_quantized(b, op.input, op.scale)]


def decompose_quantize_fp8_dynamic(op: ad.QuantizeFp8DynamicOp) -> Decomposition:
    """Per token only: a per-tensor scale needs a reduction over every row, which no row
    kernel does (weights are quantized per tensor, once, at compile time)."""
    if op.per_token is None:
        raise NoKernelForm("per-tensor dynamic FP8 quantization has no kernel (only per token)")
    b = _Builder(op.location)
    magnitude = b.add(ad.AbsOp(b.cast(op.input, Float32Type())))
    amax = b.replace_where(ad.LtOp, b.row_reduction(ad.AmaxOp, magnitude), ad.FP8_MIN_AMAX)
    scale = b.add(ad.DivOp(amax, b.constant(ad.FP8_MAX), amax.type))
    return b.ops, [_quantized(b, op.input, scale), scale]


def decompose_dequantize_fp8(op: ad.DequantizeFp8Op) -> Decomposition:
    b = _Builder(op.location)
    xf = b.cast(op.input, Float32Type())
    product = b.add(ad.MulOp(xf, op.scale, _with_element(op.result.type, Float32Type())))
    return b.ops, [b.cast(product, op.result.type.element_type)]


DECOMPOSITIONS: dict[type[Operation], Callable[..., Decomposition]] = {
    ad.RmsNormOp: decompose_rms_norm,
    ad.AddRmsNormOp: decompose_add_rms_norm,
    ad.LayerNormOp: decompose_layer_norm,
    ad.AddLayerNormOp: decompose_add_layer_norm,
    ad.SiluAndMulOp: decompose_silu_and_mul,
    ad.GeluAndMulOp: decompose_gelu_and_mul,
    ad.ActivationOp: decompose_activation,
    ad.QuantizeFp8Op: decompose_quantize_fp8,
    ad.QuantizeFp8DynamicOp: decompose_quantize_fp8_dynamic,
    ad.DequantizeFp8Op: decompose_dequantize_fp8,
}
"""Kernel op class -> its decomposition."""

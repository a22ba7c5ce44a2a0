"""`quantize-linear-fp8`: selected linears -> FP8 linears (weights and activations in e4m3).

For each linear whose module name (the last part of its location, e.g. `q_proj`) is in
`targets` and whose weight is a function argument:
- the weight is quantized per tensor (`ad.quantize_fp8_dynamic`: on a weight alone, so the
  exporter computes it once, at compile time);
- the activation is quantized once per input value: per token with a dynamic scale
  (`scheme="dynamic"`), or per tensor with the static `activation-scale` (`scheme="static"`;
  in a real deployment that scale comes from calibration);
- `ad.linear_fp8` multiplies them, in the linear's result dtype.
This makes the quantization patterns real graphs contain, for `fuse-rmsnorm-quant` and
`fuse-silu-mul` to fuse into the producing kernel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseArrayBase,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    ModuleOp,
    NameLoc,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_arguments

log = logging.getLogger(__name__)

SCHEMES = ("dynamic", "static")
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_name(op: Operation) -> str | None:
    return op.location.desc.data.rsplit(".", 1)[-1] if isinstance(op.location, NameLoc) else None


def _fp8(t: TensorType) -> TensorType:
    return TensorType(Float8E4M3FNType(), t.get_shape())


def _scale_type(shape: tuple[int, ...]) -> TensorType:
    return TensorType(Float32Type(), shape)


@dataclass
class _Quantizer:
    block: Block
    scheme: str
    activation_scale: float
    quantized: dict[SSAValue, tuple[SSAValue, SSAValue]]
    static_scale: SSAValue | None = None

    def insert(self, ops: list[Operation], before: Operation) -> None:
        for op in ops:
            op.location = before.location
        Rewriter.insert_op(ops, InsertPoint.before(before))

    def weight(self, linear: ad.LinearOp) -> tuple[SSAValue, SSAValue]:
        op = ad.QuantizeFp8DynamicOp.build(
            operands=[linear.weight], result_types=[_fp8(linear.weight.type), _scale_type(())]
        )
        self.insert([op], linear)
        return op.result, op.scale

    def activation(self, linear: ad.LinearOp) -> tuple[SSAValue, SSAValue]:
        x = linear.input
        if x in self.quantized:
            return self.quantized[x]
        if self.scheme == "dynamic":
            shape = tuple(x.type.get_shape())
            op = ad.QuantizeFp8DynamicOp.build(
                operands=[x],
                properties={"per_token": UnitAttr()},
                result_types=[_fp8(x.type), _scale_type((*shape[:-1], 1))],
            )
            self.insert([op], linear)
            self.quantized[x] = (op.result, op.scale)
        else:
            scale = self.scale_value()
            op = ad.QuantizeFp8Op.build(operands=[x, scale], result_types=[_fp8(x.type)])
            self.insert([op], linear)
            self.quantized[x] = (op.result, scale)
        return self.quantized[x]

    def scale_value(self) -> SSAValue:
        """The static activation scale, a 0-d f32 tensor made once at the top of the function."""
        if self.static_scale is None:
            value = ad.ConstantOp(FloatAttr(self.activation_scale, Float64Type()))
            full = ad.FullOp.build(
                operands=[[], value.result],
                properties={"static_size": DenseArrayBase.from_list(i64, [])},
                result_types=[_scale_type(())],
            )
            Rewriter.insert_op([value, full], InsertPoint.at_start(self.block))
            self.static_scale = full.result
        return self.static_scale

    def rewrite(self, linear: ad.LinearOp) -> None:
        weight, weight_scale = self.weight(linear)
        x, x_scale = self.activation(linear)
        fp8 = ad.LinearFp8Op.build(
            operands=[x, weight, x_scale, weight_scale, [linear.bias] if linear.bias is not None else []],
            result_types=[linear.result.type],
        )
        fp8.location = linear.location
        Rewriter.replace_op(linear, fp8)


@dataclass(frozen=True)
class QuantizeLinearFp8Pass(ModulePass):
    """Selected linears -> `ad.linear_fp8` (see the module docstring)."""

    name = "quantize-linear-fp8"

    scheme: str = "dynamic"
    activation_scale: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.scheme not in SCHEMES:
            raise PassFailedException(f"quantize-linear-fp8: scheme must be one of {SCHEMES}, got '{self.scheme}'")
        if self.scheme == "static" and not self.activation_scale > 0:
            raise PassFailedException("quantize-linear-fp8: scheme=static needs activation-scale > 0")
        count = 0
        for fn in op.walk():
            if not isinstance(fn, func.FuncOp) or not fn.body.blocks:
                continue
            weights = weight_arguments(fn)
            quantizer = _Quantizer(fn.body.block, self.scheme, self.activation_scale, {})
            for linear in [o for o in fn.body.block.ops if isinstance(o, ad.LinearOp)]:
                if linear.weight in weights and module_name(linear) in self.targets and _float(linear):
                    quantizer.rewrite(linear)
                    count += 1
        log.info("quantize-linear-fp8: %d linears to FP8 (%s activations)", count, self.scheme)


def _float(linear: ad.LinearOp) -> bool:
    """16/32-bit float operands (integer or already-fp8 linears are left alone)."""
    types = (linear.input.type.element_type, linear.weight.type.element_type)
    return all(t in (Float32Type(), Float16Type(), BFloat16Type()) for t in types)

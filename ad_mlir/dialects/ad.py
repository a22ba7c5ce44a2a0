"""The `ad` dialect: tensor ops of LLM inference graphs, one per PyTorch op family.

Values are builtin ranked tensors (dynamic dims are `?`), Python-scalar operands are
`f64`/`i64`/`i1` values made by `ad.constant`, and symbolic sizes are `index` values
made by `ad.sym_size`. Operand and property names follow the ATen schema of the op's
canonical overload (`self` is spelled `input`), so that `semantics/op_table.py` can map
between FX nodes and `ad` ops generically. Any FX target without an op here is carried
by `ad.torch_op`.

This module must not import torch: `ad-opt` parses and prints IR without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    ArrayAttr,
    BFloat16Type,
    DenseArrayBase,
    DictionaryAttr,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IndexType,
    IntAttr,
    IntegerAttr,
    IntegerType,
    Signedness,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.dialects.utils.dynamic_index_list import DynamicIndexList, verify_dynamic_index_list
from xdsl.ir import Attribute, Dialect, Operation, ParametrizedAttribute, SSAValue, TypeAttribute
from xdsl.irdl import (
    AnyAttr,
    AnyOf,
    AttrSetConstraint,
    AttrSizedOperandSegments,
    IRDLOperation,
    OpTraits,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    param_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasCanonicalizationPatternsTrait, HasParent, IsolatedFromAbove, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

if TYPE_CHECKING:
    from xdsl.pattern_rewriter import RewritePattern

# --------------------------------------------------------------------------- types

UI8 = IntegerType(8, Signedness.UNSIGNED)
"""The bytes of packed 4-bit weights (two codes a byte: NVFP4, MXFP4)."""

ELEMENT_TYPES = (
    Float32Type(),
    Float16Type(),
    BFloat16Type(),
    Float8E4M3FNType(),
    Float64Type(),
    IntegerType(64),
    IntegerType(32),
    IntegerType(8),
    IntegerType(1),
    UI8,
)
"""Element types the typed ops accept (the issue's list plus f64 and i8, which HF graphs
produce in rotary-embedding and mask code, and ui8, the bytes of packed 4-bit weights). Other
dtypes are carried by `ad.torch_op`."""

AdTensor = base(TensorType)
"""Any ranked tensor; `verify_element_types` restricts typed ops to ELEMENT_TYPES."""
_SCALAR_TYPES = (Float64Type(), IntegerType(64), IntegerType(1), IndexType())
ScalarType = AttrSetConstraint(frozenset(_SCALAR_TYPES))
"""A Python scalar operand: float (f64), int (i64), bool (i1) or SymInt (index)."""
TensorOrScalar = AnyOf((base(TensorType), ScalarType))


def _shape(t: Attribute) -> tuple[int, ...] | None:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else None


def _dims_compatible(a: int, b: int) -> bool:
    return a == b or a == DYNAMIC_INDEX or b == DYNAMIC_INDEX


def broadcast_shapes(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """NumPy broadcasting over static/dynamic (DYNAMIC_INDEX) dims; None if incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        static = {d for d in dims if d not in (1, DYNAMIC_INDEX)}
        if len(static) > 1:
            return None
        if static:
            out.append(static.pop())
        elif DYNAMIC_INDEX in dims:
            out.append(DYNAMIC_INDEX)
        else:
            out.append(1)
    return tuple(out)


def shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(_dims_compatible(x, y) for x, y in zip(a, b, strict=True))


def _fmt_shape(shape: Sequence[int]) -> str:
    return "x".join("?" if d == DYNAMIC_INDEX else str(d) for d in shape) or "scalar"


def normalize_dim(dim: int, rank: int, what: str = "dim") -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise VerifyException(f"{what} {dim} is out of range for rank {rank}")
    return dim % max(rank, 1)


# ------------------------------------------------------------- function arguments

PARAM_ATTR, BUFFER_ATTR, CONSTANT_TENSOR_ATTR = "ad.param", "ad.buffer", "ad.constant_tensor"
WEIGHT_ATTRS = (PARAM_ATTR, BUFFER_ATTR, CONSTANT_TENSOR_ATTR)
"""Argument attributes naming the weight (FX FQN) an argument of `@forward` stands for."""
INPUT_ATTR = "ad.input"
"""Argument attribute naming a user input."""
SHARD_DIM_ATTR = "ad.shard_dim"
"""On a weight argument: it is one rank's tensor-parallel shard of the weight, cut along this
dim. The argument's type is the local shape; rank r holds the slice at offset r * local size."""
SHARD_CHUNKS_ATTR = "ad.shard_chunks"
"""With `ad.shard_dim`: the weight's dim holds this many equal chunks (a stacked gate and up, a
shared expert cut in virtual experts), each cut alike: rank r holds the r-th slice of every
chunk, in order."""



# ---------------------------------------------------------------------- attributes


@irdl_attr_definition
class OperandRefAttr(ParametrizedAttribute):
    """`#ad.ref<N>`: inside an `ad.torch_op` argument template, the op's N-th operand."""

    name = "ad.ref"
    index: IntAttr = param_def()

    def __init__(self, index: int):
        super().__init__(IntAttr(index))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            return (IntAttr(parser.parse_integer(allow_boolean=False, allow_negative=False)),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.index.data}>")


@irdl_attr_definition
class TorchValueAttr(ParametrizedAttribute):
    """`#ad.torch<device "cpu">`: a torch enum-like value (device, layout, memory_format,
    dtype without a builtin type) used as a non-tensor argument."""

    name = "ad.torch"
    kind: StringAttr = param_def()
    value: StringAttr = param_def()

    def __init__(self, kind: str, value: str):
        super().__init__(StringAttr(kind), StringAttr(value))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            kind = parser.parse_identifier()
            value = parser.parse_str_literal()
        return (StringAttr(kind), StringAttr(value))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.kind.data} ")
        printer.print_string_literal(self.value.data)
        printer.print_string(">")


# ------------------------------------------------------------------ verifier helpers


def verify_element_types(op: IRDLOperation) -> None:
    """Typed ops take tensors of ELEMENT_TYPES only; anything else is `ad.torch_op`'s job."""
    for v in (*op.operands, *op.results):
        if isinstance(v.type, TensorType) and v.type.element_type not in ELEMENT_TYPES:
            raise VerifyException(
                f"'{op.name}' does not support element type {v.type.element_type} "
                "(carry the op as ad.torch_op)"
            )


@dataclass(frozen=True)
class CanonicalizedBy(HasCanonicalizationPatternsTrait):
    """The op's canonicalization patterns, by class name in `canonicalization_patterns`
    (imported on first use, so loading the dialect stays cheap)."""

    pattern_names: tuple[str, ...] = ()

    def get_patterns(self, op: type[Operation]) -> tuple[RewritePattern, ...]:
        from ad_mlir.dialects import canonicalization_patterns

        return tuple(getattr(canonicalization_patterns, name)() for name in self.pattern_names)

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return ()


def _pure_canonicalized_by(*pattern_names: str) -> OpTraits:
    return traits_def(Pure(), CanonicalizedBy(pattern_names))


class AdOp(IRDLOperation):
    """Base of every typed `ad` op."""

    def verify_(self) -> None:
        verify_element_types(self)
        self.verify_op()

    def verify_op(self) -> None:
        """Op-specific checks the constraints cannot express."""


# ------------------------------------------------------------------------ elementwise


class ElementwiseOp(AdOp):
    """Result shape is the broadcast of the tensor operand shapes."""

    traits = traits_def(Pure())

    def verify_op(self) -> None:
        shapes = [s for v in self.operands if (s := _shape(v.type)) is not None]
        expected = broadcast_shapes(shapes)
        if expected is None:
            raise VerifyException(
                f"operand shapes {', '.join(_fmt_shape(s) for s in shapes)} do not broadcast"
            )
        got = _shape(self.results[0].type)
        if got is None or not shapes_compatible(expected, got):
            raise VerifyException(
                f"result shape {_fmt_shape(got or ())} does not match the broadcast "
                f"operand shape {_fmt_shape(expected)}"
            )


class UnaryOp(ElementwiseOp):
    input = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, result_type: Attribute | None = None):
        super().__init__(operands=[input], result_types=[result_type or input.type])

    def verify_op(self) -> None:
        super().verify_op()
        source = self.input.type.element_type
        target = self.result.type.element_type
        # torch keeps the dtype, except that integer/bool inputs of float math promote.
        if target != source and not (isinstance(source, IntegerType) and not isinstance(target, IntegerType)):
            raise VerifyException(f"result element type {target} differs from the input's {source}")


@irdl_op_definition
class NegOp(UnaryOp):
    name = "ad.neg"
    traits = _pure_canonicalized_by("RemoveDoubleNeg")


@irdl_op_definition
class AbsOp(UnaryOp):
    name = "ad.abs"


@irdl_op_definition
class ExpOp(UnaryOp):
    name = "ad.exp"


@irdl_op_definition
class LogOp(UnaryOp):
    name = "ad.log"


@irdl_op_definition
class SqrtOp(UnaryOp):
    name = "ad.sqrt"


@irdl_op_definition
class RsqrtOp(UnaryOp):
    name = "ad.rsqrt"


@irdl_op_definition
class ReciprocalOp(UnaryOp):
    name = "ad.reciprocal"


@irdl_op_definition
class SinOp(UnaryOp):
    name = "ad.sin"


@irdl_op_definition
class CosOp(UnaryOp):
    name = "ad.cos"


@irdl_op_definition
class TanhOp(UnaryOp):
    name = "ad.tanh"


@irdl_op_definition
class ErfOp(UnaryOp):
    name = "ad.erf"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    name = "ad.sigmoid"


@irdl_op_definition
class SiluOp(UnaryOp):
    name = "ad.silu"


@irdl_op_definition
class ReluOp(UnaryOp):
    name = "ad.relu"


@irdl_op_definition
class LogicalNotOp(UnaryOp):
    name = "ad.logical_not"

    def verify_op(self) -> None:
        ElementwiseOp.verify_op(self)
        if self.result.type.element_type != IntegerType(1):
            raise VerifyException("result must be an i1 tensor")


@irdl_op_definition
class BitwiseNotOp(UnaryOp):
    name = "ad.bitwise_not"


@irdl_op_definition
class GeluOp(UnaryOp):
    """`approximate` is "none" (erf) when absent, or "tanh"."""

    name = "ad.gelu"
    approximate = opt_prop_def(StringAttr)
    assembly_format = (
        "$input (`approximate` $approximate^)? attr-dict `:` type($input) `->` type($result)"
    )

    def verify_op(self) -> None:
        super().verify_op()
        if self.approximate is not None and self.approximate.data not in ("none", "tanh"):
            raise VerifyException(f"approximate must be 'none' or 'tanh', got '{self.approximate.data}'")


@irdl_op_definition
class CastOp(AdOp):
    """Element type conversion (round to nearest even); the target dtype is the result's."""

    name = "ad.cast"
    traits = _pure_canonicalized_by("RemoveIdentityCast", "FoldCastAfterExactCast")
    input = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, result_type: Attribute):
        super().__init__(operands=[input], result_types=[result_type])

    def verify_op(self) -> None:
        if not shapes_compatible(_shape(self.input.type), _shape(self.result.type)):
            raise VerifyException("ad.cast must not change the shape")


class BinaryOp(ElementwiseOp):
    """`input` and `other` are tensors or Python scalars (f64/i64/i1/index values)."""

    input = operand_def(TensorOrScalar)
    other = operand_def(TensorOrScalar)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $other attr-dict `:` type($input) `,` type($other) `->` type($result)"
    )

    def __init__(self, input: SSAValue, other: SSAValue, result_type: Attribute):
        super().__init__(operands=[input, other], result_types=[result_type])


class AlphaBinaryOp(BinaryOp):
    """add/sub: `input op alpha * other`; alpha absent means 1."""

    alpha = opt_prop_def(AnyOf((base(IntegerAttr), base(FloatAttr))))
    assembly_format = (
        "$input `,` $other (`alpha` $alpha^)? attr-dict "
        "`:` type($input) `,` type($other) `->` type($result)"
    )


@irdl_op_definition
class AddOp(AlphaBinaryOp):
    name = "ad.add"
    traits = _pure_canonicalized_by("RemoveAddZero")


@irdl_op_definition
class SubOp(AlphaBinaryOp):
    name = "ad.sub"
    traits = _pure_canonicalized_by("RemoveAddZero")


@irdl_op_definition
class MulOp(BinaryOp):
    name = "ad.mul"
    traits = _pure_canonicalized_by("RemoveMulOne")


@irdl_op_definition
class DivOp(BinaryOp):
    """True division, or "trunc"/"floor" rounding when `rounding_mode` is set."""

    name = "ad.div"
    traits = _pure_canonicalized_by("RemoveDivOne")
    rounding_mode = opt_prop_def(StringAttr)
    assembly_format = (
        "$input `,` $other (`rounding_mode` $rounding_mode^)? attr-dict "
        "`:` type($input) `,` type($other) `->` type($result)"
    )


@irdl_op_definition
class PowOp(BinaryOp):
    """`input ** exponent` (the exponent is the `other` operand)."""

    name = "ad.pow"


@irdl_op_definition
class MaximumOp(BinaryOp):
    name = "ad.maximum"


@irdl_op_definition
class MinimumOp(BinaryOp):
    name = "ad.minimum"


@irdl_op_definition
class BitwiseAndOp(BinaryOp):
    name = "ad.bitwise_and"


@irdl_op_definition
class BitwiseOrOp(BinaryOp):
    name = "ad.bitwise_or"


@irdl_op_definition
class LogicalAndOp(BinaryOp):
    name = "ad.logical_and"


@irdl_op_definition
class LogicalOrOp(BinaryOp):
    name = "ad.logical_or"


class CompareOp(BinaryOp):
    """Comparisons produce i1 tensors."""

    def verify_op(self) -> None:
        super().verify_op()
        if self.result.type.element_type != IntegerType(1):
            raise VerifyException(f"'{self.name}' must produce an i1 tensor")


@irdl_op_definition
class EqOp(CompareOp):
    name = "ad.eq"


@irdl_op_definition
class NeOp(CompareOp):
    name = "ad.ne"


@irdl_op_definition
class LtOp(CompareOp):
    name = "ad.lt"


@irdl_op_definition
class LeOp(CompareOp):
    name = "ad.le"


@irdl_op_definition
class GtOp(CompareOp):
    name = "ad.gt"


@irdl_op_definition
class GeOp(CompareOp):
    name = "ad.ge"


@irdl_op_definition
class WhereOp(ElementwiseOp):
    """`condition ? input : other`, broadcasting all three."""

    name = "ad.where"
    condition = operand_def(AdTensor)
    input = operand_def(TensorOrScalar)
    other = operand_def(TensorOrScalar)
    result = result_def(AdTensor)
    assembly_format = (
        "$condition `,` $input `,` $other attr-dict `:` type($condition) `,` type($input) "
        "`,` type($other) `->` type($result)"
    )

    def verify_op(self) -> None:
        super().verify_op()
        if self.condition.type.element_type != IntegerType(1):
            raise VerifyException("ad.where condition must be an i1 tensor")


# ------------------------------------------------------------------------ reductions


class ReductionOp(AdOp):
    """Reduce `input` over `dim` (all dims when absent); `keepdim` keeps them as size 1."""

    traits = traits_def(Pure())
    input = operand_def(AdTensor)
    dim = opt_prop_def(DenseArrayBase.constr(i64))
    keepdim = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$input (`dim` $dim^)? (`keepdim` $keepdim^)? attr-dict `:` type($input) `->` type($result)"
    )

    def reduced_dims(self) -> tuple[int, ...]:
        rank = len(_shape(self.input.type))
        if self.dim is None or not self.dim.get_values():
            return tuple(range(rank))
        return tuple(sorted(normalize_dim(d, rank) for d in self.dim.get_values()))

    def verify_op(self) -> None:
        in_shape = _shape(self.input.type)
        reduced = self.reduced_dims()
        if len(set(reduced)) != len(reduced):
            raise VerifyException(f"'{self.name}' reduces a dim twice: {list(reduced)}")
        if self.keepdim is not None:
            expected = tuple(1 if i in reduced else d for i, d in enumerate(in_shape))
        else:
            expected = tuple(d for i, d in enumerate(in_shape) if i not in reduced)
        got = _shape(self.result.type)
        if not shapes_compatible(expected, got):
            raise VerifyException(
                f"result shape {_fmt_shape(got)} does not match the reduced shape {_fmt_shape(expected)}"
            )


class AccumulatingReductionOp(ReductionOp):
    """sum/mean with an optional accumulation `dtype` (the result type then has it too)."""

    dtype = opt_prop_def(TypeAttribute)
    assembly_format = (
        "$input (`dim` $dim^)? (`keepdim` $keepdim^)? (`dtype` $dtype^)? attr-dict "
        "`:` type($input) `->` type($result)"
    )


@irdl_op_definition
class SumOp(AccumulatingReductionOp):
    name = "ad.sum"


@irdl_op_definition
class MeanOp(AccumulatingReductionOp):
    name = "ad.mean"


@irdl_op_definition
class AmaxOp(ReductionOp):
    name = "ad.amax"


@irdl_op_definition
class AminOp(ReductionOp):
    name = "ad.amin"


@irdl_op_definition
class SoftmaxOp(AdOp):
    """Softmax along `dim`, computed in `dtype` (the input is cast to it first) or else
    in the input dtype."""

    name = "ad.softmax"
    traits = traits_def(Pure())
    input = operand_def(AdTensor)
    dim = prop_def(IntegerAttr[I64])
    dtype = opt_prop_def(TypeAttribute)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `dim` $dim (`dtype` $dtype^)? attr-dict `:` type($input) `->` type($result)"
    )

    def verify_op(self) -> None:
        normalize_dim(self.dim.value.data, len(_shape(self.input.type)))
        expected = self.input.type.element_type if self.dtype is None else self.dtype
        if self.result.type != TensorType(expected, self.input.type.get_shape()):
            raise VerifyException(
                f"ad.softmax result must be the input shape with element type {expected}"
            )


# ----------------------------------------------------------------------------- views


class ShapedViewOp(AdOp):
    """A view whose target sizes are a mix of static ints and `index` values."""

    traits = traits_def(Pure())
    custom_directives = (DynamicIndexList,)
    input = operand_def(AdTensor)
    sizes = var_operand_def(IndexType())
    static_sizes = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AdTensor)
    assembly_format = (
        "$input custom<DynamicIndexList>($sizes, $static_sizes) attr-dict "
        "`:` type($input) `->` type($result)"
    )

    def verify_op(self) -> None:
        verify_dynamic_index_list(self.static_sizes.get_values(), self.sizes, DYNAMIC_INDEX)
        if len(self.static_sizes.get_values()) != len(_shape(self.result.type)):
            raise VerifyException(
                f"'{self.name}' has {len(self.static_sizes.get_values())} sizes for a "
                f"result of rank {len(_shape(self.result.type))}"
            )


@irdl_op_definition
class ReshapeOp(ShapedViewOp):
    """view/reshape: `-1` in the sizes is inferred, as in torch."""

    name = "ad.reshape"
    traits = _pure_canonicalized_by("RemoveNoOpReshape", "FoldReshapeOfReshape")

    def verify_op(self) -> None:
        super().verify_op()
        static = self.static_sizes.get_values()
        if static.count(-1) > 1:
            raise VerifyException("ad.reshape sizes may hold at most one -1")
        in_shape, out_shape = _shape(self.input.type), _shape(self.result.type)
        if DYNAMIC_INDEX not in in_shape + out_shape:
            in_n = _numel(in_shape)
            out_n = _numel(out_shape)
            if in_n != out_n:
                raise VerifyException(
                    f"ad.reshape changes the element count: {_fmt_shape(in_shape)} "
                    f"({in_n}) -> {_fmt_shape(out_shape)} ({out_n})"
                )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@irdl_op_definition
class ExpandOp(ShapedViewOp):
    """Broadcast `input` to `sizes` (-1 keeps a dim); `implicit` is torch's flag."""

    name = "ad.expand"
    traits = _pure_canonicalized_by("RemoveNoOpExpand")
    implicit = opt_prop_def(UnitAttr)
    assembly_format = (
        "$input custom<DynamicIndexList>($sizes, $static_sizes) (`implicit` $implicit^)? "
        "attr-dict `:` type($input) `->` type($result)"
    )


@irdl_op_definition
class PermuteOp(AdOp):
    name = "ad.permute"
    traits = _pure_canonicalized_by("RemoveIdentityPermute")
    input = operand_def(AdTensor)
    dims = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AdTensor)
    assembly_format = "$input $dims attr-dict `:` type($input) `->` type($result)"

    def verify_op(self) -> None:
        in_shape = _shape(self.input.type)
        dims = [normalize_dim(d, len(in_shape)) for d in self.dims.get_values()]
        if sorted(dims) != list(range(len(in_shape))):
            raise VerifyException(f"ad.permute dims {list(self.dims.get_values())} are not a permutation")
        expected = tuple(in_shape[d] for d in dims)
        if not shapes_compatible(expected, _shape(self.result.type)):
            raise VerifyException(
                f"ad.permute result shape {_fmt_shape(_shape(self.result.type))} should be {_fmt_shape(expected)}"
            )


@irdl_op_definition
class TransposeOp(AdOp):
    name = "ad.transpose"
    traits = _pure_canonicalized_by("RemoveIdentityTranspose")
    input = operand_def(AdTensor)
    dim0 = prop_def(IntegerAttr[I64])
    dim1 = prop_def(IntegerAttr[I64])
    result = result_def(AdTensor)
    assembly_format = "$input $dim0 `,` $dim1 attr-dict `:` type($input) `->` type($result)"

    def verify_op(self) -> None:
        in_shape = list(_shape(self.input.type))
        a = normalize_dim(self.dim0.value.data, len(in_shape))
        b = normalize_dim(self.dim1.value.data, len(in_shape))
        in_shape[a], in_shape[b] = in_shape[b], in_shape[a]
        if not shapes_compatible(tuple(in_shape), _shape(self.result.type)):
            raise VerifyException(f"ad.transpose result shape should be {_fmt_shape(in_shape)}")


@irdl_op_definition
class UnsqueezeOp(AdOp):
    name = "ad.unsqueeze"
    traits = traits_def(Pure())
    input = operand_def(AdTensor)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(AdTensor)
    assembly_format = "$input `dim` $dim attr-dict `:` type($input) `->` type($result)"

    def verify_op(self) -> None:
        in_shape = list(_shape(self.input.type))
        d = normalize_dim(self.dim.value.data, len(in_shape) + 1)
        expected = tuple(in_shape[:d] + [1] + in_shape[d:])
        if not shapes_compatible(expected, _shape(self.result.type)):
            raise VerifyException(f"ad.unsqueeze result shape should be {_fmt_shape(expected)}")


@irdl_op_definition
class SqueezeOp(AdOp):
    """Remove the size-1 dims among `dim`."""

    name = "ad.squeeze"
    traits = _pure_canonicalized_by("RemoveNoOpSqueeze")
    input = operand_def(AdTensor)
    dim = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AdTensor)
    assembly_format = "$input `dim` $dim attr-dict `:` type($input) `->` type($result)"


@irdl_op_definition
class SliceOp(AdOp):
    """`input[..., start:end:step, ...]` on `dim`; bounds are `[start, end, step]`, each an
    int or an `index` value (torch clamps `end`, so INT64_MAX means "to the end")."""

    name = "ad.slice"
    traits = _pure_canonicalized_by("RemoveFullSlice")
    custom_directives = (DynamicIndexList,)
    input = operand_def(AdTensor)
    dim = prop_def(IntegerAttr[I64])
    bounds = var_operand_def(IndexType())
    static_bounds = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AdTensor)
    assembly_format = (
        "$input `dim` $dim custom<DynamicIndexList>($bounds, $static_bounds) attr-dict "
        "`:` type($input) `->` type($result)"
    )

    def verify_op(self) -> None:
        verify_dynamic_index_list(self.static_bounds.get_values(), self.bounds, DYNAMIC_INDEX)
        if len(self.static_bounds.get_values()) != 3:
            raise VerifyException("ad.slice bounds must be [start, end, step]")
        step = self.static_bounds.get_values()[2]
        if step != DYNAMIC_INDEX and step <= 0:
            raise VerifyException(f"ad.slice step must be positive, got {step}")
        in_shape = _shape(self.input.type)
        d = normalize_dim(self.dim.value.data, len(in_shape))
        out_shape = _shape(self.result.type)
        if len(out_shape) != len(in_shape) or any(
            not _dims_compatible(a, b) for i, (a, b) in enumerate(zip(in_shape, out_shape, strict=True)) if i != d
        ):
            raise VerifyException("ad.slice may only change the size of the sliced dim")

    def static_start(self) -> int | None:
        """The first index taken, counted from 0 as torch resolves it (a negative start counts
        from the end, clamped to the dim), when the start and the dim's size are static."""
        start = self.static_bounds.get_values()[0]
        shape = _shape(self.input.type)
        size = shape[normalize_dim(self.dim.value.data, len(shape))]
        if start == DYNAMIC_INDEX or (start < 0 and size == DYNAMIC_INDEX):
            return None
        return max(start + size, 0) if start < 0 else start if size == DYNAMIC_INDEX else min(start, size)


@irdl_op_definition
class CatOp(AdOp):
    name = "ad.cat"
    traits = _pure_canonicalized_by("RemoveEmptyCatOperands")
    tensors = var_operand_def(AdTensor)
    dim = opt_prop_def(IntegerAttr[I64])
    result = result_def(AdTensor)
    assembly_format = (
        "$tensors (`dim` $dim^)? attr-dict `:` `(` type($tensors) `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        if not self.tensors:
            raise VerifyException("ad.cat needs at least one tensor")


@irdl_op_definition
class SplitOp(AdOp):
    """Split `input` along `dim` into pieces of `split_sizes`."""

    name = "ad.split"
    traits = traits_def(Pure())
    custom_directives = (DynamicIndexList,)
    input = operand_def(AdTensor)
    split_sizes = var_operand_def(IndexType())
    static_split_sizes = prop_def(DenseArrayBase.constr(i64))
    dim = opt_prop_def(IntegerAttr[I64])
    outputs = var_result_def(AdTensor)
    assembly_format = (
        "$input custom<DynamicIndexList>($split_sizes, $static_split_sizes) (`dim` $dim^)? "
        "attr-dict `:` type($input) `->` type($outputs)"
    )

    def verify_op(self) -> None:
        n = len(self.static_split_sizes.get_values())
        if n != len(self.outputs):
            raise VerifyException(f"ad.split has {n} sizes but {len(self.outputs)} results")


@irdl_op_definition
class AliasOp(AdOp):
    name = "ad.alias"
    traits = _pure_canonicalized_by("RemoveAlias")
    input = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"


@irdl_op_definition
class CloneOp(AdOp):
    """A copy; `memory_format` (a `#ad.torch<memory_format ...>`) as in torch."""

    name = "ad.clone"
    traits = _pure_canonicalized_by("RemoveClone")
    input = operand_def(AdTensor)
    memory_format = opt_prop_def(TorchValueAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$input (`memory_format` $memory_format^)? attr-dict `:` type($input) `->` type($result)"
    )


# -------------------------------------------------------------------- linear algebra


@irdl_op_definition
class LinearOp(AdOp):
    """`input @ weight.T + bias` (weight is [out, in])."""

    name = "ad.linear"
    traits = _pure_canonicalized_by("LinearOfFlattenedRows")
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    weight = operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $weight (`bias` $bias^)? attr-dict `:` `(` type($input) `,` type($weight) "
        "(`,` type($bias)^)? `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        in_shape, w_shape, out_shape = (_shape(v.type) for v in (self.input, self.weight, self.result))
        if len(w_shape) != 2:
            raise VerifyException(f"ad.linear weight must be 2-D, got {_fmt_shape(w_shape)}")
        if not _dims_compatible(in_shape[-1], w_shape[1]):
            raise VerifyException(
                f"ad.linear input features {in_shape[-1]} do not match weight {_fmt_shape(w_shape)}"
            )
        expected = (*in_shape[:-1], w_shape[0])
        if not shapes_compatible(expected, out_shape):
            raise VerifyException(f"ad.linear result shape should be {_fmt_shape(expected)}")


class TwoOperandMatmulOp(AdOp):
    traits = traits_def(Pure())
    input = operand_def(AdTensor)
    mat2 = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $mat2 attr-dict `:` `(` type($input) `,` type($mat2) `)` `->` type($result)"
    )


@irdl_op_definition
class MmOp(TwoOperandMatmulOp):
    name = "ad.mm"
    traits = _pure_canonicalized_by("MmOfTransposedMatrixToLinear")

    def verify_op(self) -> None:
        a, b = _shape(self.input.type), _shape(self.mat2.type)
        if len(a) != 2 or len(b) != 2 or not _dims_compatible(a[1], b[0]):
            raise VerifyException(f"ad.mm shapes {_fmt_shape(a)} and {_fmt_shape(b)} do not chain")


@irdl_op_definition
class BmmOp(TwoOperandMatmulOp):
    name = "ad.bmm"
    traits = _pure_canonicalized_by("BmmOverMergedBatchToMatmul")

    def verify_op(self) -> None:
        a, b = _shape(self.input.type), _shape(self.mat2.type)
        if len(a) != 3 or len(b) != 3 or not _dims_compatible(a[2], b[1]):
            raise VerifyException(f"ad.bmm shapes {_fmt_shape(a)} and {_fmt_shape(b)} do not chain")


@irdl_op_definition
class MatmulOp(AdOp):
    """torch.matmul: batched, broadcasting."""

    name = "ad.matmul"
    traits = _pure_canonicalized_by("MatmulOfTransposedMatrixToLinear")
    input = operand_def(AdTensor)
    other = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $other attr-dict `:` `(` type($input) `,` type($other) `)` `->` type($result)"
    )


@irdl_op_definition
class AddmmOp(AdOp):
    """`beta * input + alpha * (mat1 @ mat2)`."""

    name = "ad.addmm"
    traits = _pure_canonicalized_by("MmOfTransposedMatrixToLinear")
    input = operand_def(AdTensor)
    mat1 = operand_def(AdTensor)
    mat2 = operand_def(AdTensor)
    beta = opt_prop_def(AnyOf((base(IntegerAttr), base(FloatAttr))))
    alpha = opt_prop_def(AnyOf((base(IntegerAttr), base(FloatAttr))))
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $mat1 `,` $mat2 (`beta` $beta^)? (`alpha` $alpha^)? attr-dict `:` `(` "
        "type($input) `,` type($mat1) `,` type($mat2) `)` `->` type($result)"
    )


@irdl_op_definition
class EmbeddingOp(AdOp):
    """Row gather `weight[indices]`; the other args are torch's, kept for the round trip."""

    name = "ad.embedding"
    traits = traits_def(Pure())
    weight = operand_def(AdTensor)
    indices = operand_def(AdTensor)
    padding_idx = opt_prop_def(IntegerAttr[I64])
    scale_grad_by_freq = opt_prop_def(UnitAttr)
    sparse = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$weight `,` $indices (`padding_idx` $padding_idx^)? "
        "(`scale_grad_by_freq` $scale_grad_by_freq^)? (`sparse` $sparse^)? attr-dict "
        "`:` `(` type($weight) `,` type($indices) `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        w, idx, out = (_shape(v.type) for v in (self.weight, self.indices, self.result))
        if len(w) != 2:
            raise VerifyException("ad.embedding weight must be 2-D")
        if self.indices.type.element_type not in (IntegerType(64), IntegerType(32)):
            raise VerifyException("ad.embedding indices must be i64 or i32")
        if not shapes_compatible((*idx, w[1]), out):
            raise VerifyException(f"ad.embedding result shape should be {_fmt_shape((*idx, w[1]))}")


@irdl_op_definition
class AttentionOp(AdOp):
    """Scaled dot-product attention over [batch, heads, seq, head_dim] tensors; with
    `enable_gqa`, key/value may have fewer heads (grouped-query attention)."""

    name = "ad.attention"
    traits = traits_def(Pure())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    query = operand_def(AdTensor)
    key = operand_def(AdTensor)
    value = operand_def(AdTensor)
    attn_mask = opt_operand_def(AdTensor)
    dropout_p = opt_prop_def(FloatAttr)
    is_causal = opt_prop_def(UnitAttr)
    scale = opt_prop_def(FloatAttr)
    enable_gqa = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$query `,` $key `,` $value (`mask` $attn_mask^)? (`dropout_p` $dropout_p^)? "
        "(`causal` $is_causal^)? (`scale` $scale^)? (`gqa` $enable_gqa^)? attr-dict `:` `(` "
        "type($query) `,` type($key) `,` type($value) (`,` type($attn_mask)^)? `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        q, k, v = (_shape(x.type) for x in (self.query, self.key, self.value))
        if not len(q) == len(k) == len(v) or len(q) < 2:
            raise VerifyException("ad.attention query/key/value must have the same rank >= 2")
        if not _dims_compatible(q[-1], k[-1]):
            raise VerifyException(f"ad.attention head_dim differs: query {q[-1]}, key {k[-1]}")


# ------------------------------------------------------------------ LLM-level ops


class KernelOp(AdOp):
    """An op the LLM fusions make: codegen turns each into one kernel (or it joins the
    kernel of the `ad.fused` region that holds it). Its meaning is a torch reference op
    (`semantics/torch_ops.py`) and, for codegen, a decomposition into elementwise and
    row-reduction ops (`dialects/decompositions.py`) that computes the same thing."""

    traits = traits_def(Pure())

    def kernel_label(self) -> str:
        """Names the op's kernel (before its hash): the op's name, or what tells its variants apart."""
        return self.name.removeprefix("ad.")


_FLOAT_PROMOTION = {
    frozenset((BFloat16Type(), Float16Type())): Float32Type(),
    frozenset((BFloat16Type(), Float32Type())): Float32Type(),
    frozenset((Float16Type(), Float32Type())): Float32Type(),
}
"""torch's promotion of two different float dtypes of tensors (f64 does not occur in models)."""


class NormOp(KernelOp):
    """RMSNorm of `input` over its last dim, in fp32: `n = x / sqrt(mean(x^2) + eps)`, then
    the weight. With `weight_in_fp32` (Gemma) the result is `(n * (float(weight) + offset))`
    cast to the result type; without it (Llama) `n` is first cast to the input's dtype and
    then multiplied by `weight + offset` in torch's type promotion."""

    weight = opt_operand_def(AdTensor)
    eps = prop_def(FloatAttr[Float64Type])
    offset = opt_prop_def(FloatAttr[Float64Type])
    weight_in_fp32 = opt_prop_def(UnitAttr)

    def normed_element_type(self, x: SSAValue) -> Attribute:
        """The input's, except that a Llama-style weight multiply promotes (bf16 x, f32 weight)."""
        element = x.type.element_type
        if self.weight is None or self.weight_in_fp32 is not None:
            return element
        return _FLOAT_PROMOTION.get(frozenset((element, self.weight.type.element_type)), element)

    def verify_norm(self, x: SSAValue, normed: SSAValue) -> None:
        x_shape = _shape(x.type)
        if not shapes_compatible(x_shape, _shape(normed.type)):
            raise VerifyException(f"'{self.name}' result shape must be the input shape {_fmt_shape(x_shape)}")
        if normed.type.element_type != (expected := self.normed_element_type(x)):
            raise VerifyException(f"'{self.name}' result element type must be {expected}")
        if self.weight is not None:
            _verify_row_parameter(self, "weight", self.weight, x_shape)


def _verify_row_parameter(op: Operation, name: str, value: SSAValue, x_shape: tuple[int, ...]) -> None:
    """A norm's weight or bias: 1-D, one value per element of the normalized (last) dim."""
    shape = _shape(value.type)
    if len(shape) != 1 or not _dims_compatible(shape[0], x_shape[-1]):
        raise VerifyException(f"'{op.name}' {name} must be 1-D of the normalized size {x_shape[-1]}, "
                              f"got {_fmt_shape(shape)}")


_NORM_FORMAT = (
    "(`weight` $weight^)? `eps` $eps (`offset` $offset^)? (`weight_in_fp32` $weight_in_fp32^)? attr-dict "
)


@irdl_op_definition
class RmsNormOp(NormOp):
    name = "ad.rms_norm"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input " + _NORM_FORMAT + "`:` `(` type($input) (`,` type($weight)^)? `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        self.verify_norm(self.input, self.result)


@irdl_op_definition
class AddRmsNormOp(NormOp):
    """`sum = input + residual` (same type), then RMSNorm of `sum`; both are results (the sum
    feeds the next residual connection)."""

    name = "ad.add_rms_norm"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    residual = operand_def(AdTensor)
    result = result_def(AdTensor)
    sum = result_def(AdTensor)
    assembly_format = (
        "$input `,` $residual " + _NORM_FORMAT
        + "`:` `(` type($input) `,` type($residual) (`,` type($weight)^)? `)` `->` `(` type($result) `,` "
        "type($sum) `)`"
    )

    def verify_op(self) -> None:
        if not self.input.type == self.residual.type == self.sum.type:
            raise VerifyException("ad.add_rms_norm input, residual and sum must have one type")
        self.verify_norm(self.input, self.result)


_NORM_FLOATS = (Float32Type(), Float16Type(), BFloat16Type())


class LayerNormBase(KernelOp):
    """LayerNorm of `input` over its last dim, as torch's `F.layer_norm` computes it: in fp32,
    `n = (x - mean(x)) / sqrt(var(x) + eps)` (biased variance), then `n * float(weight) +
    float(bias)` (each optional), rounded once to the input's type. Weight and bias may be fp32
    beside a bf16/fp16 input (torch's mixed-dtype LayerNorm). A weight applied as `1 + w`
    (Nemotron's LayerNorm1P) is the value `w + 1` as the weight: computed from weights alone,
    once, at compile time."""

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    weight = opt_operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    eps = prop_def(FloatAttr[Float64Type])

    def verify_layer_norm(self, x: SSAValue, normed: SSAValue) -> None:
        x_shape = _shape(x.type)
        if not shapes_compatible(x_shape, _shape(normed.type)):
            raise VerifyException(f"'{self.name}' result shape must be the input shape {_fmt_shape(x_shape)}")
        if normed.type.element_type != x.type.element_type:
            raise VerifyException(f"'{self.name}' result element type must be the input's, {x.type.element_type}")
        for name, value in (("input", x), ("weight", self.weight), ("bias", self.bias)):
            if value is not None and value.type.element_type not in _NORM_FLOATS:
                raise VerifyException(f"'{self.name}' {name} must be f32, f16 or bf16")
        for name, value in (("weight", self.weight), ("bias", self.bias)):
            if value is not None:
                _verify_row_parameter(self, name, value, x_shape)


_LAYER_NORM_FORMAT = (
    "(`weight` $weight^)? (`bias` $bias^)? `eps` $eps attr-dict `:` `(` {inputs} (`weight` type($weight)^)? "
    "(`bias` type($bias)^)? `)` `->` {results}"
)
"""Each optional operand's type after its keyword: with two optional operands, a bare list of
types would not say whose a type is."""


@irdl_op_definition
class LayerNormOp(LayerNormBase):
    name = "ad.layer_norm"
    input = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input " + _LAYER_NORM_FORMAT.format(inputs="type($input)", results="type($result)")

    def verify_op(self) -> None:
        self.verify_layer_norm(self.input, self.result)


@irdl_op_definition
class AddLayerNormOp(LayerNormBase):
    """`sum = input + residual` (same type), then LayerNorm of `sum`; both are results (the
    sum feeds the next residual connection)."""

    name = "ad.add_layer_norm"
    input = operand_def(AdTensor)
    residual = operand_def(AdTensor)
    result = result_def(AdTensor)
    sum = result_def(AdTensor)
    assembly_format = "$input `,` $residual " + _LAYER_NORM_FORMAT.format(
        inputs="type($input) `,` type($residual)", results="`(` type($result) `,` type($sum) `)`"
    )

    def verify_op(self) -> None:
        if not self.input.type == self.residual.type == self.sum.type:
            raise VerifyException("ad.add_layer_norm input, residual and sum must have one type")
        self.verify_layer_norm(self.input, self.result)


@irdl_op_definition
class SiluAndMulOp(KernelOp):
    """`silu(gate) * up`, each op in the operands' dtype (as HF's MLP computes it)."""

    name = "ad.silu_and_mul"
    gate = operand_def(AdTensor)
    up = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$gate `,` $up attr-dict `:` `(` type($gate) `,` type($up) `)` `->` type($result)"

    def verify_op(self) -> None:
        if not self.gate.type == self.up.type == self.result.type:
            raise VerifyException("ad.silu_and_mul gate, up and result must have one type")


QK_NORM_PROPERTIES = ("qk_norm_eps", "qk_norm_offset", "qk_norm_weight_in_fp32")
"""An attention op's QK-norm: RMSNorm over head_dim of each query and key head before RoPE
(Qwen3, Gemma3), each with its weight (`q_norm_weight`, `k_norm_weight` [head_dim]), computed as
`ad.rms_norm` with these `eps`, `offset` and `weight_in_fp32` computes it."""


@dataclass(frozen=True)
class QkNorm:
    """The one QK-norm spec (`QK_NORM_PROPERTIES`): HF's RMSNorm over head_dim of each query and
    key head before RoPE, as `ad.rms_norm` computes it: `n = x / sqrt(mean(x^2) + eps)` in fp32,
    then with `weight_in_fp32` (Gemma) `n * (float(w) + offset)` rounded to the input dtype, else
    (Llama) n rounded to the input dtype times `w + offset` (in the weight's dtype, the input's)."""

    eps: float
    offset: float = 0.0
    weight_in_fp32: bool = False

    @staticmethod
    def of_norm(norm: RmsNormOp) -> QkNorm:
        return QkNorm(norm.eps.value.data, norm.offset.value.data if norm.offset is not None else 0.0,
                      norm.weight_in_fp32 is not None)

    @staticmethod
    def of_op(op: RopeAttentionOp | CachedAttentionOp) -> QkNorm | None:
        """The QK-norm of an attention op, None without one."""
        if op.q_norm_weight is None:
            return None
        offset = op.qk_norm_offset.value.data if op.qk_norm_offset is not None else 0.0
        return QkNorm(op.qk_norm_eps.value.data, offset, op.qk_norm_weight_in_fp32 is not None)

    def properties(self) -> dict[str, Attribute]:
        """The attention op's `QK_NORM_PROPERTIES` (offset and weight_in_fp32 only when set)."""
        props: dict[str, Attribute] = {"qk_norm_eps": FloatAttr(self.eps, Float64Type())}
        if self.offset:
            props["qk_norm_offset"] = FloatAttr(self.offset, Float64Type())
        if self.weight_in_fp32:
            props["qk_norm_weight_in_fp32"] = UnitAttr()
        return props


_QK_NORM_FORMAT = (
    "(`qk_norm` `(` $q_norm_weight^ `,` $k_norm_weight `:` type($q_norm_weight) `,` type($k_norm_weight) `)` "
    "`eps` $qk_norm_eps (`offset` $qk_norm_offset^)? (`weight_in_fp32` $qk_norm_weight_in_fp32^)?)? "
)


def _verify_qk_norm(op: RopeAttentionOp | CachedAttentionOp) -> None:
    weights = (op.q_norm_weight, op.k_norm_weight)
    if weights == (None, None):
        if any(getattr(op, p) is not None for p in QK_NORM_PROPERTIES):
            raise VerifyException(f"{op.name} QK-norm eps/offset/weight_in_fp32 need q_norm_weight and k_norm_weight")
        return
    if None in weights or op.qk_norm_eps is None:
        raise VerifyException(f"{op.name} QK-norm takes q_norm_weight, k_norm_weight and eps together")
    head_dim = _shape(op.query.type)[3]
    for w in weights:
        if len(_shape(w.type)) != 1 or not _dims_compatible(_shape(w.type)[0], head_dim):
            raise VerifyException(f"{op.name} QK-norm weights must be [head_dim] = [{head_dim}]")
        if op.qk_norm_weight_in_fp32 is None and w.type.element_type != op.query.type.element_type:
            raise VerifyException(f"{op.name} QK-norm weights must have the query's element type, or be "
                                  "weight_in_fp32 (a Llama-style weight of another type would promote)")


# MLP activations (`passes/fuse_gelu_mul.py`, `passes/fuse_activation.py`).

GeluApproximation = AttrSetConstraint(frozenset({StringAttr("none"), StringAttr("tanh")}))
"""aten.gelu's `approximate`: "none" (erf) or "tanh"."""


@irdl_op_definition
class GeluAndMulOp(KernelOp):
    """`gelu(gate) * up`, GELU with `approximate` "none" (erf; also when absent) or "tanh",
    each op in the operands' dtype (as HF's gated GELU MLP computes it: Gemma)."""

    name = "ad.gelu_and_mul"
    gate = operand_def(AdTensor)
    up = operand_def(AdTensor)
    approximate = opt_prop_def(GeluApproximation)
    result = result_def(AdTensor)
    assembly_format = (
        "$gate `,` $up (`approximate` $approximate^)? attr-dict `:` `(` type($gate) `,` type($up) `)` `->` "
        "type($result)"
    )

    def verify_op(self) -> None:
        if not self.gate.type == self.up.type == self.result.type:
            raise VerifyException("ad.gelu_and_mul gate, up and result must have one type")

    def kernel_label(self) -> str:
        return "gelu_tanh_and_mul" if self.approximate == StringAttr("tanh") else "gelu_and_mul"


ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "relu2", "silu")
"""`ad.activation` kinds: GELU (erf), GELU (tanh approximation), ReLU, ReLU squared, SiLU."""


@irdl_op_definition
class ActivationOp(KernelOp):
    """An MLP's activation of its up projection: `act(input + bias)`, the bias add (when the
    GEMM did not add it) and the activation in the input's dtype, as torch computes each."""

    name = "ad.activation"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    kind = prop_def(StringAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$kind $input (`bias` $bias^)? attr-dict `:` `(` type($input) (`,` type($bias)^)? `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        # A check here, not a constraint on `kind`: xDSL's custom-format parser checks
        # constraints of required properties before the op has a location to report.
        if self.kind.data not in ACTIVATIONS:
            raise VerifyException(f"ad.activation kind must be one of {', '.join(ACTIVATIONS)}, got '{self.kind.data}'")
        if self.input.type != self.result.type:
            raise VerifyException("ad.activation input and result must have one type")
        if self.bias is None:
            return
        features = _shape(self.input.type)[-1]
        bias_shape = _shape(self.bias.type)
        fits = len(bias_shape) == 1 and _dims_compatible(bias_shape[0], features)
        if not fits or self.bias.type.element_type != self.input.type.element_type:
            raise VerifyException(
                f"ad.activation bias must be 1-D of the input's {features} features and its element type"
            )

    def kernel_label(self) -> str:
        return f"bias_{self.kind.data}" if self.bias is not None else self.kind.data


def _verify_rope_tables(op: Operation, head_dim: int) -> None:
    """`cos`/`sin` of `op` are one [batch or 1, seq, rotary_dim] type, rotary_dim even and at
    most `head_dim` (RoPE as `RopeAttentionOp` describes it)."""
    t = _shape(op.cos.type)
    if op.cos.type != op.sin.type or len(t) != 3:
        raise VerifyException(f"{op.name} cos and sin must be one [batch or 1, seq, rotary_dim] type")
    if t[2] == DYNAMIC_INDEX or t[2] % 2 or (head_dim != DYNAMIC_INDEX and t[2] > head_dim):
        raise VerifyException(f"{op.name} rotary_dim (the tables' last dim) {t[2]} must be static, even and at "
                              f"most the head_dim {head_dim}")


@irdl_op_definition
class RopeAttentionOp(KernelOp):
    """Scaled dot-product attention whose query and key get rotary position embedding first,
    as HF's `apply_rotary_pos_emb` does it in the inputs' dtype. Query [batch, heads, seq,
    head_dim], key/value [batch, kv_heads, seq, head_dim] (grouped-query: each kv head serves
    heads / kv_heads query heads); an optional boolean mask (True = attend) and/or causal
    masking, causal within a sliding `window` of keys when set; with `softcap`, the scores
    soft-capped before masking and softmax. With QK-norm weights (`QK_NORM_PROPERTIES`) the
    query and key heads are RMS-normalized before RoPE. Its kernel is a template
    (`codegen/templates/attention_kernel.py`).

    RoPE (here, in `ad.rope` and `ad.cached_attention`): with tables `cos`, `sin` [batch or 1,
    seq, rotary_dim] broadcast over heads, the first rotary_dim dims of each head become
    `x * cos + rotate(x) * sin` and the others pass unchanged (partial rotary: GPT-NeoX, Phi,
    GLM). rotate is HF's rotate_half, `cat(-x[R/2:], x[:R/2])`, or with `interleaved` the pairs
    (2i, 2i + 1) of GPT-J and GLM, `stack(-x[1::2], x[0::2], -1).flatten(-2)`. rotary_dim is
    the tables' last dim (as in HF: `cos.shape[-1]`)."""

    name = "ad.rope_attention"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    query = operand_def(AdTensor)
    key = operand_def(AdTensor)
    value = operand_def(AdTensor)
    cos = operand_def(AdTensor)
    sin = operand_def(AdTensor)
    q_norm_weight = opt_operand_def(AdTensor)
    k_norm_weight = opt_operand_def(AdTensor)
    attn_mask = opt_operand_def(AdTensor)
    interleaved = opt_prop_def(UnitAttr)
    qk_norm_eps = opt_prop_def(FloatAttr[Float64Type])
    qk_norm_offset = opt_prop_def(FloatAttr[Float64Type])
    qk_norm_weight_in_fp32 = opt_prop_def(UnitAttr)
    is_causal = opt_prop_def(UnitAttr)
    window = opt_prop_def(IntegerAttr[I64])
    """Causal within a sliding window: key j is seen by query i only when i - window < j."""
    softcap = opt_prop_def(FloatAttr[Float64Type])
    """Gemma2's logit soft cap: scores s = scale * q.k become `tanh(s / softcap) * softcap`."""
    scale = prop_def(FloatAttr[Float64Type])
    result = result_def(AdTensor)
    assembly_format = (
        "$query `,` $key `,` $value `rope` $cos `,` $sin (`interleaved` $interleaved^)? " + _QK_NORM_FORMAT +
        "(`mask` $attn_mask^)? (`causal` $is_causal^)? (`window` $window^)? (`softcap` $softcap^)? "
        "`scale` $scale attr-dict `:` `(` type($query) `,` type($key) `,` type($value) `,` type($cos) `,` "
        "type($sin) (`,` type($attn_mask)^)? `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        q, k, v = (_shape(x.type) for x in (self.query, self.key, self.value))
        if not len(q) == len(k) == len(v) == 4:
            raise VerifyException("ad.rope_attention query/key/value must be [batch, heads, seq, head_dim]")
        if not (_dims_compatible(q[3], k[3]) and _dims_compatible(k[3], v[3])) or k[1] != v[1]:
            raise VerifyException("ad.rope_attention key and value must match the query's head_dim and each other")
        if DYNAMIC_INDEX not in (q[1], k[1]) and q[1] % k[1]:
            raise VerifyException(f"ad.rope_attention query heads {q[1]} are not a multiple of kv heads {k[1]}")
        _verify_rope_tables(self, q[3])
        if self.result.type != self.query.type:
            raise VerifyException("ad.rope_attention result must have the query's type")
        if self.window is not None and (self.is_causal is None or self.window.value.data < 1):
            raise VerifyException(f"ad.rope_attention window {self.window.value.data} must be positive and causal")
        if self.softcap is not None and not self.softcap.value.data > 0:
            raise VerifyException(f"ad.rope_attention softcap must be positive, not {self.softcap.value.data}")
        _verify_qk_norm(self)


@irdl_op_definition
class RopeOp(KernelOp):
    """HF's `apply_rotary_pos_emb` on a query and a key together (RoPE as `ad.rope_attention`
    describes it), computed in their dtype. Query [batch, heads, seq, head_dim], key [batch, kv_heads, seq, head_dim].
    Its kernel is a template (`codegen/templates/rope_kernel.py`): one launch for both."""

    name = "ad.rope"
    query = operand_def(AdTensor)
    key = operand_def(AdTensor)
    cos = operand_def(AdTensor)
    sin = operand_def(AdTensor)
    interleaved = opt_prop_def(UnitAttr)
    query_out = result_def(AdTensor)
    key_out = result_def(AdTensor)
    assembly_format = (
        "$query `,` $key `rope` $cos `,` $sin (`interleaved` $interleaved^)? attr-dict `:` `(` type($query) `,` "
        "type($key) `,` type($cos) `,` type($sin) `)` `->` `(` type($query_out) `,` type($key_out) `)`"
    )

    def verify_op(self) -> None:
        q, k = _shape(self.query.type), _shape(self.key.type)
        if len(q) != 4 or len(k) != 4 or not _dims_compatible(q[3], k[3]):
            raise VerifyException("ad.rope query/key must be [batch, heads, seq, head_dim] with one head_dim")
        if self.query_out.type != self.query.type or self.key_out.type != self.key.type:
            raise VerifyException("ad.rope results must have the query's and the key's types")
        _verify_rope_tables(self, q[3])


# ------------------------------------------------------------------------------ MoE


_FLOAT_TYPES = (Float32Type(), Float16Type(), BFloat16Type())


@irdl_op_definition
class MoeOp(KernelOp):
    """A mixture-of-experts FFN: each token of `input` [tokens, hidden] goes through the
    `top_k` experts its router picks and the result is their outputs weighted by the router.

    Routing, in fp32: `probs = softmax(float(router_logits))` over the E routed experts
    ([tokens, E]), the `top_k` largest of them (HF's `torch.topk`), divided by their sum with
    `normalize` (Mixtral, Qwen's `norm_topk_prob`; a softmax of the top-k logits alone, as some
    blocks spell it, is the same thing); with `round_weights` the weights are then rounded to
    the input's dtype (Qwen's `.to(router_logits.dtype)`).

    Experts are stacked: `gate_up` [E + S, 2 * I, hidden] (each expert's gate rows, then its
    up rows) and `down` [E + S, hidden, I]; expert e computes `silu(x @ gate_e.T) * (x @ up_e.T)
    @ down_e.T` in the input's dtype, as HF's gated MLP does. The last S = `shared_experts`
    experts are shared (Qwen2-MoE's shared expert, its intermediate size cut in S slices of I):
    every token goes through all of them, weighted by `sigmoid(shared_gate)` ([tokens, 1], the
    shared expert's gate logits; rounded as the routing weights are) or by 1 without it.

    The weighted sum over a token's experts is accumulated in fp32 and rounded once to the
    input's dtype. Its kernel is a template (`codegen/templates/moe_kernel.py`)."""

    name = "ad.moe"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    router_logits = operand_def(AdTensor)
    gate_up = operand_def(AdTensor)
    down = operand_def(AdTensor)
    shared_gate = opt_operand_def(AdTensor)
    top_k = prop_def(IntegerAttr[I64])
    shared_experts = opt_prop_def(IntegerAttr[I64])
    normalize = opt_prop_def(UnitAttr)
    round_weights = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $router_logits `experts` $gate_up `,` $down (`shared` $shared_experts^)? "
        "(`gate` $shared_gate^)? `top_k` $top_k (`normalize` $normalize^)? (`round_weights` $round_weights^)? "
        "attr-dict `:` `(` type($input) `,` type($router_logits) `,` type($gate_up) `,` type($down) "
        "(`,` type($shared_gate)^)? `)` `->` type($result)"
    )

    @property
    def num_shared(self) -> int:
        return self.shared_experts.value.data if self.shared_experts is not None else 0

    def verify_op(self) -> None:
        x, logits = _shape(self.input.type), _shape(self.router_logits.type)
        gate_up, down = _shape(self.gate_up.type), _shape(self.down.type)
        if len(x) != 2 or len(logits) != 2 or not _dims_compatible(x[0], logits[0]):
            raise VerifyException("ad.moe input must be [tokens, hidden] and router_logits [tokens, experts]")
        for t in (self.input, self.router_logits, self.gate_up, self.down, self.shared_gate):
            if t is not None and t.type.element_type not in _FLOAT_TYPES:
                raise VerifyException("ad.moe takes f32, f16 or bf16 tensors")
        if not self.gate_up.type.element_type == self.input.type.element_type == self.down.type.element_type:
            raise VerifyException("ad.moe expert weights must have the input's element type")
        if len(gate_up) != 3 or len(down) != 3 or DYNAMIC_INDEX in (*gate_up, *down, x[1], logits[1]):
            raise VerifyException("ad.moe expert weights must be static [experts, 2 * I, hidden] and "
                                  "[experts, hidden, I], the hidden and expert counts static")
        experts, inter = gate_up[0], down[2]
        if gate_up != (experts, 2 * inter, x[1]) or down != (experts, x[1], inter):
            raise VerifyException(f"ad.moe expert weights {_fmt_shape(gate_up)} and {_fmt_shape(down)} do not "
                                  f"fit hidden {x[1]}: expected [E, 2 * I, {x[1]}] and [E, {x[1]}, I]")
        if logits[1] + self.num_shared != experts or self.num_shared < 0:
            raise VerifyException(f"ad.moe has {experts} experts: {logits[1]} routed (router_logits) + "
                                  f"{self.num_shared} shared expected")
        if not 1 <= self.top_k.value.data <= logits[1]:
            raise VerifyException(f"ad.moe top_k {self.top_k.value.data} is not in 1..{logits[1]}")
        if self.shared_gate is not None:
            if self.num_shared == 0 or not shapes_compatible(_shape(self.shared_gate.type), (x[0], 1)):
                raise VerifyException("ad.moe shared_gate must be [tokens, 1], with shared experts")
        if self.result.type != self.input.type:
            raise VerifyException("ad.moe result must have the input's type")


@irdl_op_definition
class MoeMxfp4Op(KernelOp):
    """gpt-oss's mixture-of-experts block on MXFP4 experts (a gpt-oss checkpoint's
    `quant_method: mxfp4`), from the router's logits to the block's output.

    Routing as gpt-oss's router: the `top_k` largest of `router_logits` [tokens, E], their softmax
    in the logits' dtype. Experts, each as `<proj>_blocks` ui8 [E, out, in / 32, 16] (two E2M1 codes
    a byte, the even element in the low nibble) and `<proj>_scales` ui8 [E, out, in / 32] (E8M0: a
    block of 32 is scaled by 2^(s - 127)), with `<proj>_bias` [E, out]: `gate_up` [E, 2I, H] (gate
    and up rows interleaved) and `down` [E, H, I]. Each (token, slot) pair computes, in the input's
    dtype on the dequantized weights: `gu = x @ gate_up_e.T + b` (rounded, then the bias), `gate`
    and `up` its even and odd columns, `gate = min(gate, limit)`, `up = clamp(up, -limit, limit)`,
    `h = (up + 1) * gate * sigmoid(alpha * gate)`, `y = h @ down_e.T + d`, times the pair's weight;
    a token's `top_k` products are summed in fp32 and rounded once. Its reference is
    `zoo/mxfp4.py`'s `moe_mxfp4`; its kernel a template (`codegen/templates/moe_mxfp4_kernel.py`)."""

    name = "ad.moe_mxfp4"
    input = operand_def(AdTensor)
    router_logits = operand_def(AdTensor)
    gate_up_blocks = operand_def(AdTensor)
    gate_up_scales = operand_def(AdTensor)
    gate_up_bias = operand_def(AdTensor)
    down_blocks = operand_def(AdTensor)
    down_scales = operand_def(AdTensor)
    down_bias = operand_def(AdTensor)
    top_k = prop_def(IntegerAttr[I64])
    alpha = prop_def(FloatAttr[Float64Type])
    limit = prop_def(FloatAttr[Float64Type])
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $router_logits `gate_up` $gate_up_blocks `,` $gate_up_scales `,` $gate_up_bias `down` "
        "$down_blocks `,` $down_scales `,` $down_bias `top_k` $top_k `alpha` $alpha `limit` $limit attr-dict `:` "
        "`(` type($input) `,` type($router_logits) `,` type($gate_up_blocks) `,` type($gate_up_scales) `,` "
        "type($gate_up_bias) `,` type($down_blocks) `,` type($down_scales) `,` type($down_bias) `)` `->` "
        "type($result)"
    )

    def sizes(self) -> tuple[int, int, int]:
        """(experts, hidden, intermediate)."""
        experts, hidden, _ = _shape(self.down_blocks.type)[:3]
        return experts, hidden, _shape(self.gate_up_blocks.type)[1] // 2

    def verify_(self) -> None:
        for name in ("input", "router_logits", "gate_up_bias", "down_bias"):
            if getattr(self, name).type.element_type not in _FLOAT_TYPES:
                raise VerifyException(f"ad.moe_mxfp4 {name} must be f32, f16 or bf16")
        quantized = ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales")
        if any(getattr(self, name).type.element_type != UI8 for name in quantized):
            raise VerifyException("ad.moe_mxfp4 blocks and scales must be ui8")
        x, logits = _shape(self.input.type), _shape(self.router_logits.type)
        if len(x) != 2 or len(logits) != 2 or not _dims_compatible(x[0], logits[0]) or DYNAMIC_INDEX in (x[1], logits[1]):
            raise VerifyException("ad.moe_mxfp4 input must be [tokens, hidden] and router_logits [tokens, experts], "
                                  "hidden and experts static")
        experts, hidden = logits[1], x[1]
        gate_up = _shape(self.gate_up_blocks.type)
        inter = gate_up[1] // 2 if len(gate_up) == 4 else 0
        expected = {
            "gate_up_blocks": (experts, 2 * inter, hidden // 32, 16), "gate_up_scales": (experts, 2 * inter, hidden // 32),
            "gate_up_bias": (experts, 2 * inter), "down_blocks": (experts, hidden, inter // 32, 16),
            "down_scales": (experts, hidden, inter // 32), "down_bias": (experts, hidden),
        }
        if hidden % 32 or inter % 32 or inter == 0:
            raise VerifyException(f"ad.moe_mxfp4 hidden {hidden} and intermediate {inter} must be multiples of 32")
        for name, shape in expected.items():
            if _shape(getattr(self, name).type) != shape:
                raise VerifyException(f"ad.moe_mxfp4 {name} must be {_fmt_shape(shape)} for {experts} experts, hidden "
                                      f"{hidden}, intermediate {inter}")
        if not 1 <= self.top_k.value.data <= experts:
            raise VerifyException(f"ad.moe_mxfp4 top_k {self.top_k.value.data} is not in 1..{experts}")
        if self.result.type != self.input.type:
            raise VerifyException("ad.moe_mxfp4 result must have the input's type")


@irdl_op_definition
class MoeFp8BlockOp(KernelOp):
    """MoE experts on fine-grained FP8 weights (a checkpoint's `quant_method: fp8` with
    `weight_block_size` [bn, bk]: DeepSeek-V3's, Qwen3-MoE-FP8's), from the router's choices: each
    token of `input` [T, H] (f32, f16 or bf16) goes through the experts `topk_ids` [T, k]
    (integers) names, weighted by `topk_weights` [T, k] (any float type, rounded to the input's).
    The routing stays outside the op, in whatever form the model spells it (softmax top-k,
    DeepSeek-V3's grouped sigmoid with its bias).

    Experts are stacked f8E4M3FN: `gate_up` [E, 2I, H] (each expert's gate rows, then its up
    rows) and `down` [E, H, I], with f32 `<proj>_scale_inv` [E, rows / bn, cols / bk] (one per
    bn x bk block; I a multiple of bn, so that no block holds gate and up rows). Each GEMM is
    `ad.linear_fp8_block`'s: its input quantized per token per group of bk (`s = amax / 448`, e4m3),
    each K block's fp8 x fp8 product times both scales, added in fp32, rounded to the input's
    dtype. Expert e computes `silu(gate) * up` (each rounded) between the two, its output times
    the pair's weight (rounded); a token's products are summed in fp32 and rounded once, as
    transformers' `FP8Experts` computes them. Its reference is `zoo/fp8_blocks.py`'s
    `block_experts`; its kernel a template (`codegen/templates/moe_fp8_block_kernel.py`)."""

    name = "ad.moe_fp8_block"
    input = operand_def(AdTensor)
    topk_ids = operand_def(AdTensor)
    topk_weights = operand_def(AdTensor)
    gate_up = operand_def(AdTensor)
    gate_up_scale_inv = operand_def(AdTensor)
    down = operand_def(AdTensor)
    down_scale_inv = operand_def(AdTensor)
    block_size = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $topk_ids `,` $topk_weights `gate_up` $gate_up `,` $gate_up_scale_inv `down` $down `,` "
        "$down_scale_inv `block` $block_size attr-dict `:` `(` type($input) `,` type($topk_ids) `,` "
        "type($topk_weights) `,` type($gate_up) `,` type($gate_up_scale_inv) `,` type($down) `,` "
        "type($down_scale_inv) `)` `->` type($result)"
    )

    def sizes(self) -> tuple[int, int, int]:
        """(experts, hidden, intermediate)."""
        experts, hidden, inter = _shape(self.down.type)
        return experts, hidden, inter

    def blocks(self) -> tuple[int, int]:
        bn, bk = self.block_size.get_values()
        return bn, bk

    def verify_(self) -> None:
        sides = tuple(self.block_size.get_values())
        if len(sides) != 2 or not all(_is_power_of_two_block(b) for b in sides):
            raise VerifyException(f"ad.moe_fp8_block block_size {list(sides)} must be [bn, bk], powers of two >= 16")
        bn, bk = sides
        x, ids, weights = _shape(self.input.type), _shape(self.topk_ids.type), _shape(self.topk_weights.type)
        if self.input.type.element_type not in _FLOAT_TYPES or self.result.type != self.input.type:
            raise VerifyException("ad.moe_fp8_block input must be f32, f16 or bf16, and the result of its type")
        if len(x) != 2 or DYNAMIC_INDEX == x[1] or len(ids) != 2 or DYNAMIC_INDEX == ids[1] or weights != ids \
                or not _dims_compatible(x[0], ids[0]):
            raise VerifyException("ad.moe_fp8_block input must be [tokens, hidden] and topk_ids, topk_weights "
                                  "[tokens, k], hidden and k static")
        if not isinstance(self.topk_ids.type.element_type, IntegerType) or \
                self.topk_weights.type.element_type not in _FLOAT_TYPES:
            raise VerifyException("ad.moe_fp8_block topk_ids must be integers and topk_weights f32, f16 or bf16")
        if not (_is_fp8(self.gate_up.type) and _is_fp8(self.down.type)) or len(_shape(self.down.type)) != 3:
            raise VerifyException("ad.moe_fp8_block gate_up and down must be 3-D f8E4M3FN tensors")
        experts, hidden, inter = self.sizes()
        if hidden != x[1] or DYNAMIC_INDEX in (experts, inter) or inter % bn:
            raise VerifyException(f"ad.moe_fp8_block down {_fmt_shape(_shape(self.down.type))} must be [E, {x[1]}, I], "
                                  f"I a multiple of bn {bn}")
        expected = {
            "gate_up": (experts, 2 * inter, hidden), "down": (experts, hidden, inter),
            "gate_up_scale_inv": (experts, 2 * inter // bn, -(-hidden // bk)),
            "down_scale_inv": (experts, -(-hidden // bn), -(-inter // bk)),
        }
        for name, shape in expected.items():
            if _shape(getattr(self, name).type) != shape:
                raise VerifyException(f"ad.moe_fp8_block {name} must be {_fmt_shape(shape)} for {experts} experts, "
                                      f"hidden {hidden}, intermediate {inter}, blocks {list(sides)}")
        for name in ("gate_up_scale_inv", "down_scale_inv"):
            if getattr(self, name).type.element_type != Float32Type():
                raise VerifyException(f"ad.moe_fp8_block {name} must be f32")


CACHE_ATTR = "ad.cache"
"""On a cache argument (`insert-cached-attention`): "<layer> key" or "<layer> value" for a K/V
cache, "<layer> conv_state" for a convolution's state, "<layer> token_window" for a cached token
window's, "<layer> ssm_state" / "<layer> recurrent_state" for a Mamba2 / gated-delta-rule state,
"<layer> rg_lru_state" for an RG-LRU's state,
"<layer> wkv_state" for RWKV's time-mixing state,
"<layer> latent" for MLA's latent cache, the layer being the HF module path of the op it serves."""
PER_TOKEN_ROLES = ("key", "value", "latent", "index_key", "compressed")
"""`ad.cache` roles of the caches that hold every token of a slot (in the paged form: the page
pools); the others are states of a fixed size per slot."""
CACHE_SLOTS_ATTR, CACHE_STARTS_ATTR = "ad.cache_slots", "ad.cache_starts"
"""On the per-sequence metadata arguments of a cached module: each batch row's cache slot, and
how many tokens that slot already holds."""


def _verify_distance_bias(op: CachedAttentionOp, query: tuple[int, ...]) -> None:
    """`distance_bias` is [batch, heads, seq, extent] of the query's batch, heads and seq, in
    a float type, with a static extent (the kernels unroll over it)."""
    bias = op.distance_bias
    if bias is None:
        return
    shape = _shape(bias.type)
    if len(shape) != 4 or shape[:3] != query[:3] or shape[3] == DYNAMIC_INDEX or shape[3] < 1 \
            or bias.type.element_type not in _FLOAT_TYPES:
        raise VerifyException(f"{op.name} distance_bias must be a float [batch, heads, seq, extent] = "
                              f"[{', '.join('?' if d == DYNAMIC_INDEX else str(d) for d in query[:3])}, extent] with a static "
                              f"extent, not {bias.type}")


@irdl_op_definition
class CachedAttentionOp(AdOp):
    """Attention of the new tokens of each sequence over its K/V pages, the pages written in
    place: vLLM's paged attention, of which the slot form is one configuration (a slot is one
    page of max_seq tokens, a sequence's block table that one page).

    The sequences' new tokens come in one of two layouts. Batched (no `query_starts`): query
    [batch, heads, seq, head_dim] and key/value [batch, kv_heads, seq, head_dim], batch row s
    being sequence s with its `seq` new tokens. Flattened (`query_starts` [seqs + 1] int64,
    cumulative, as cu_seqlens): query [1, heads, T, head_dim], key/value [1, kv_heads, T,
    head_dim] hold the T new tokens of every sequence of a step, sequence s the tokens
    `query_starts[s]` .. `query_starts[s + 1] - 1` (at least one). RoPE applies to the query and
    the key first, as HF's `apply_rotary_pos_emb` does, when `cos`/`sin` [batch or 1, seq or T,
    rotary_dim] are given (as `ad.rope_attention`, `interleaved` too); the value may have a head
    dim of its own (DeepSeek: query/key 192, value 128), which `v_cache` and the result
    [batch or 1, heads, seq or T, value head_dim] then have.

    Sequence s already holds `cache_starts[s]` tokens (`cache_starts` [seqs] int64): its new
    tokens are at positions cache_starts[s] + 0, 1, .. . The pools `k_cache`/`v_cache` [pages,
    page_size, kv_heads, head_dim] hold position p of sequence s at row p % page_size of page
    `block_tables[s, p / page_size]` (`block_tables` [seqs, max_pages_per_seq] int64; entries
    past a sequence's pages are not read; pages in any order in the pool; the slot form's table
    is [batch, 1], each row's slot, over pools [slots, max_seq, ...]). The new keys (after
    QK-norm and RoPE) and values are written into their pages in place, then each new token
    attends causally over its own sequence's positions 0 .. its own (with `window`, the last
    `window` of them). Pages a step writes (at or past a sequence's start) belong to that
    sequence alone; full pages before it may be shared. Grouped-query attention is native.

    With `softcap` (Gemma2), the scores s = scale * q.k are soft-capped to `tanh(s / softcap) *
    softcap` before masking and softmax. With QK-norm weights (`QK_NORM_PROPERTIES`) the new
    query and key heads are RMS-normalized before RoPE (the pages hold the normalized, rotated
    keys). With `sinks` [heads] (gpt-oss), each head's learned sink logit joins the softmax of
    every query of that head: softmax over [scores, sink] with the sink's column dropped, so the
    sink takes a share of the probability and attends to no value; `sinks` [batch, heads, seq]
    (batched only; Inkling2: computed from each token's hidden state) gives each new token its
    own. With `alibi_slopes` [heads] (BLOOM, MPT), the scores of head h get ALiBi's linear bias
    `slope[h] * (key position - query position)` (after scale and soft cap; HF's `slope * key
    position` differs from it by a constant per query, which the softmax cancels). With
    `distance_bias` [batch or 1, heads, seq or T, extent] (Inkling's relative logits, computed
    per token from its hidden state), a new token at position p gets its entry `p - j` added to
    its score for the key at position j (after scale and soft cap) when 0 <= p - j < extent,
    nothing for keys further back. With `compressed` [batch, kv_heads, seq, head_dim] and
    `compressed_cache` of the key pool's type (batched only; DeepSeek-V4's HCA at compress rate
    1: one compressed entry per token, which is its own key and value), the new entries are
    written into `compressed_cache` as the keys are, and the queries attend, in the same
    softmax, to the sequence's entries too: causal with offset and without the window; with
    `selected` [batch, seq, k] (int64, -1 for none: DeepSeek-V4's CSA, the choice of
    `ad.cached_index_topk`), each query only to the entries it lists. Not pure: it writes the
    pages.

    With `k_scale` and `v_scale` (vLLM's `kv_cache_dtype="fp8"`), the pools are float8_e4m3fn
    whatever the key's type: a new key row x (after QK-norm and RoPE, in the key's type) is
    stored as e4m3(clamp(x / k_scale, -448, 448)) (nearest even), a value row with `v_scale`, and
    a row read back is e4m3 * scale in the key's type; the new tokens attend to their own rows as
    the pools hold them (quantized), as to every cached one. Both scales are given together, and
    only with e4m3 pools; without them the pools have the key's type."""

    name = "ad.cached_attention"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    query = operand_def(AdTensor)
    key = operand_def(AdTensor)
    value = operand_def(AdTensor)
    cos = opt_operand_def(AdTensor)
    sin = opt_operand_def(AdTensor)
    q_norm_weight = opt_operand_def(AdTensor)
    k_norm_weight = opt_operand_def(AdTensor)
    k_cache = operand_def(AdTensor)
    v_cache = operand_def(AdTensor)
    block_tables = operand_def(AdTensor)
    cache_starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    sinks = opt_operand_def(AdTensor)
    alibi_slopes = opt_operand_def(AdTensor)
    distance_bias = opt_operand_def(AdTensor)
    compressed = opt_operand_def(AdTensor)
    compressed_cache = opt_operand_def(AdTensor)
    selected = opt_operand_def(AdTensor)
    interleaved = opt_prop_def(UnitAttr)
    scale = prop_def(FloatAttr[Float64Type])
    window = opt_prop_def(IntegerAttr[I64])
    softcap = opt_prop_def(FloatAttr[Float64Type])
    qk_norm_eps = opt_prop_def(FloatAttr[Float64Type])
    qk_norm_offset = opt_prop_def(FloatAttr[Float64Type])
    qk_norm_weight_in_fp32 = opt_prop_def(UnitAttr)
    k_scale = opt_prop_def(FloatAttr[Float64Type])
    v_scale = opt_prop_def(FloatAttr[Float64Type])
    result = result_def(AdTensor)
    assembly_format = (
        "$query `,` $key `,` $value (`rope` $cos^ `,` $sin)? (`interleaved` $interleaved^)? " + _QK_NORM_FORMAT +
        "`cache` $k_cache `,` $v_cache (`kv_scales` $k_scale^ `,` $v_scale)? "
        "`block_tables` $block_tables `cache_starts` $cache_starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? `scale` $scale (`window` $window^)? "
        "(`softcap` $softcap^)? (`sinks` $sinks^ `:` type($sinks))? "
        "(`alibi` $alibi_slopes^ `:` type($alibi_slopes))? "
        "(`distance_bias` $distance_bias^ `:` type($distance_bias))? "
        "(`compressed` $compressed^ `,` $compressed_cache `:` type($compressed) `,` type($compressed_cache))? "
        "(`selected` $selected^ `:` type($selected))? "
        "attr-dict `:` `(` type($query) `,` type($key) "
        "`,` type($value) `,` type($k_cache) `,` type($v_cache) `,` type($block_tables) `,` type($cache_starts) "
        "(`,` type($cos)^ `,` type($sin))? `)` `->` type($result)"
    )

    def page_size(self) -> int:
        return _shape(self.k_cache.type)[1]

    def verify_op(self) -> None:
        q, k, v = (_shape(x.type) for x in (self.query, self.key, self.value))
        kc, vc = _shape(self.k_cache.type), _shape(self.v_cache.type)
        if not len(q) == len(k) == len(v) == len(kc) == len(vc) == 4:
            raise VerifyException("ad.cached_attention query/key/value must be [batch, heads, seq, head_dim] and "
                                  "the pools [pages, page_size, kv_heads, head_dim]")
        if self.query_starts is not None and q[0] != 1:
            raise VerifyException("ad.cached_attention with query_starts takes one flattened batch: query [1, heads, "
                                  f"tokens, head_dim], not batch {q[0]}")
        self._verify_compressed(q)
        if k[:3] != v[:3] or self.key.type.element_type != self.value.type.element_type \
                or not _dims_compatible(q[3], k[3]) or q[0] != k[0] or q[2] != k[2]:
            raise VerifyException("ad.cached_attention key and value must be [batch, kv_heads, seq, head_dim] of one "
                                  "element type matching the query's batch, seq and (the key) head_dim")
        if DYNAMIC_INDEX not in (q[1], k[1]) and q[1] % k[1]:
            raise VerifyException(f"ad.cached_attention query heads {q[1]} are not a multiple of kv heads {k[1]}")
        if kc[:2] != vc[:2] or kc[2:] != k[1:2] + k[3:] or vc[2:] != v[1:2] + v[3:]:
            raise VerifyException(f"ad.cached_attention pools must be [pages, page_size, {k[1]}, {k[3]}] (key) and "
                                  f"[pages, page_size, {v[1]}, {v[3]}] (value) of the same pages and page_size")
        if kc[1] == DYNAMIC_INDEX or kc[1] < 1:
            raise VerifyException(f"ad.cached_attention page_size {'?' if kc[1] == DYNAMIC_INDEX else kc[1]} must be "
                                  "static and positive")
        self._verify_cache_dtype()
        for name, meta, rank in (("query_starts", self.query_starts, 1), ("cache_starts", self.cache_starts, 1),
                                 ("block_tables", self.block_tables, 2)):
            if meta is not None and (len(_shape(meta.type)) != rank or meta.type.element_type != i64):
                raise VerifyException(f"ad.cached_attention {name} must be a rank-{rank} i64 tensor")
        if (self.cos is None) != (self.sin is None):
            raise VerifyException("ad.cached_attention takes cos and sin together")
        if self.cos is not None:
            _verify_rope_tables(self, q[3])
        elif self.interleaved is not None:
            raise VerifyException("ad.cached_attention interleaved needs RoPE (cos and sin)")
        if self.result.type != TensorType(self.query.type.element_type, [*q[:3], v[3]]):
            raise VerifyException("ad.cached_attention result must have the query's type with the value's head_dim")
        if self.softcap is not None and not self.softcap.value.data > 0:
            raise VerifyException(f"ad.cached_attention softcap must be positive, not {self.softcap.value.data}")
        if self.sinks is not None and _shape(self.sinks.type) == q[:3] and self.query_starts is None:
            per_heads = (("alibi_slopes", self.alibi_slopes),)  # one sink logit per token and head
        else:
            per_heads = (("sinks", self.sinks), ("alibi_slopes", self.alibi_slopes))
        for name, per_head in per_heads:
            if per_head is not None and (_shape(per_head.type) != (q[1],) or q[1] == DYNAMIC_INDEX):
                raise VerifyException(f"ad.cached_attention {name} must be [heads] = [{q[1]}], one per query head"
                                      + (" (sinks: or [batch, heads, seq], one per token)" if name == "sinks" else ""))
        _verify_distance_bias(self, q)
        _verify_qk_norm(self)

    def _verify_cache_dtype(self) -> None:
        """The pools have the key's element type, or, with both scales (positive, finite), e4m3."""
        pools = (self.k_cache.type.element_type, self.v_cache.type.element_type)
        if (self.k_scale is None) != (self.v_scale is None):
            raise VerifyException("ad.cached_attention takes k_scale and v_scale together")
        if self.k_scale is None:
            if pools != (self.key.type.element_type,) * 2:
                raise VerifyException("ad.cached_attention pools must have the key's element type (or be f8E4M3FN "
                                      "with kv_scales)")
            return
        if pools != (Float8E4M3FNType(),) * 2:
            raise VerifyException("ad.cached_attention with kv_scales takes f8E4M3FN pools, not "
                                  f"{pools[0]} and {pools[1]}")
        for name, attr in (("k_scale", self.k_scale), ("v_scale", self.v_scale)):
            if not 0 < attr.value.data < math.inf:
                raise VerifyException(f"ad.cached_attention {name} must be positive and finite, not {attr.value.data}")
        if self.compressed is not None:
            raise VerifyException("ad.cached_attention with kv_scales takes no compressed entries")

    def _verify_compressed(self, q: tuple[int, ...]) -> None:
        """DeepSeek-V4's compressed entries: both operands, the key's and the key pool's types,
        batched, with no other bias."""
        if (self.compressed is None) != (self.compressed_cache is None):
            raise VerifyException("ad.cached_attention takes compressed and compressed_cache together")
        if self.compressed is not None and (
                self.compressed.type != self.key.type or self.compressed_cache.type != self.k_cache.type):
            raise VerifyException("ad.cached_attention compressed entries and their cache must have the key's and "
                                  "the key cache's types")
        if self.compressed is not None and (self.softcap is not None or self.alibi_slopes is not None
                                            or self.distance_bias is not None or self.query_starts is not None
                                            or (self.sinks is not None and len(_shape(self.sinks.type)) != 1)):
            raise VerifyException("ad.cached_attention with compressed entries takes no softcap, ALiBi slopes, "
                                  "distance bias, sinks per token or query_starts")
        if self.selected is not None:
            if self.compressed is None:
                raise VerifyException("ad.cached_attention selected needs compressed entries")
            _verify_selected("ad.cached_attention", self.selected, (q[0], q[2]))


QUERY_STARTS_ATTR, BLOCK_TABLES_ATTR, LOGITS_INDICES_ATTR = "ad.query_starts", "ad.block_tables", "ad.logits_indices"
"""On the metadata arguments of a paged module (`insert-cached-attention{paged=true}`): each
sequence's offset among the step's flattened tokens (and the total last), its page ids, and the
flattened tokens whose logits the LM head computes. `ad.cache_starts` marks the tokens each
sequence already holds, as in the slot form."""
STATE_SLOTS_ATTR = "ad.state_slots"
"""On the paged module's metadata argument of each sequence's slot in the per-sequence state
pools (convolutions', scans'), where the model has such a state."""

@irdl_op_definition
class CachedCausalConv1dOp(AdOp):
    """A depthwise causal convolution of each batch row's new tokens that continues from the
    row's convolution state, the state written in place (LFM2's short convolution).

    `input` [batch, channels, seq] holds the new tokens of each row, `weight` [channels, 1,
    kernel] is a depthwise `conv1d` weight and `bias` [channels] is optional. Row b uses slot
    `slots[b]` of `state` [slots, channels, kernel - 1]: the inputs of the kernel - 1 tokens
    before the new ones when `starts[b]` > 0, zeros when it is 0 (a new sequence). Over that
    history followed by the new inputs x, out[b, c, t] = bias[c] + sum_j weight[c, 0, j] *
    x[c, t - (kernel - 1) + j] (what `conv1d` with padding kernel - 1 gives on the whole
    sequence, cut to its length); afterwards the slot holds the last kernel - 1 inputs. Not
    pure: it writes the state.

    With `query_starts` [seqs + 1] (the paged form: one flattened batch per step, cumulative as
    `ad.cached_attention`'s paged form), the batch is 1 and holds the new tokens of `seqs` sequences, sequence
    s the tokens `query_starts[s]` .. `query_starts[s + 1] - 1` of the seq axis, each run as a
    batch row of its own with slot `slots[s]` of the state pool and `starts[s]`."""

    name = "ad.cached_causal_conv1d"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    weight = operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $weight (`bias` $bias^)? `state` $state `slots` $slots `starts` $starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? attr-dict `:` `(` "
        "type($input) `,` type($weight) `,` type($state) `,` type($slots) `,` type($starts) (`,` type($bias)^)? "
        "`)` `->` type($result)"
    )

    def kernel_size(self) -> int:
        return _shape(self.weight.type)[2]

    def verify_op(self) -> None:
        x, w, state = _shape(self.input.type), _shape(self.weight.type), _shape(self.state.type)
        if len(x) != 3 or len(w) != 3 or w[1] != 1 or DYNAMIC_INDEX in w:
            raise VerifyException("ad.cached_causal_conv1d input must be [batch, channels, seq] and weight a static "
                                  "[channels, 1, kernel]")
        if not _dims_compatible(x[1], w[0]):
            raise VerifyException(f"ad.cached_causal_conv1d input has {x[1]} channels, the weight {w[0]}")
        if len(state) != 3 or state[1:] != (w[0], w[2] - 1):
            raise VerifyException(f"ad.cached_causal_conv1d state must be [slots, {w[0]}, {w[2] - 1}]")
        if self.state.type.element_type != self.input.type.element_type:
            raise VerifyException("ad.cached_causal_conv1d state must have the input's element type")
        if self.bias is not None and _shape(self.bias.type) != (w[0],):
            raise VerifyException(f"ad.cached_causal_conv1d bias must be [{w[0]}]")
        _verify_slot_metadata(self, self.name, x[0])
        if self.result.type != self.input.type:
            raise VerifyException("ad.cached_causal_conv1d result must have the input's type")



@irdl_op_definition
class CachedTokenWindowOp(AdOp):
    """Each batch row's new tokens after the `width` rows that come before them, from a state
    per slot that the op updates in place: the history that ops looking back at most `width`
    tokens need (ZAYA's convolutions after a left pad of `width` zero tokens; its values
    shifted by one token; Inkling2's unfold of its padded keys and values into windows of
    `width` + 1 tokens).

    `input` holds the new tokens of each row along its token axis `dim` (not 0, the batch axis;
    the other axes static). Row b uses slot `slots[b]` of `state` (`input`'s shape with the
    slots for the batch and `width` rows for the tokens): the last `width` rows before the new
    ones when `starts[b]` > 0; when it is 0 (a new sequence), `initial`'s row b (`input`'s shape
    with `width` tokens: what the model puts before its first token), or zeros without it. The
    result is those `width` rows followed by the new ones (`width` + seq along `dim`), so its
    row i holds the token `width` before new token i; afterwards the slot holds the result's
    last `width` rows. With `query_starts` (the paged form: one flattened batch, sequence s the
    tokens `query_starts[s]` .. `query_starts[s + 1] - 1`, in state slot `slots[s]` after the
    `starts[s]` it holds) the result is the input's type: its row i holds the token `width` before
    new token i in that token's own sequence (from its slot, or `initial`'s first row's, before
    the sequence's new tokens), which is what a shift by `width` tokens reads; afterwards each
    slot holds its sequence's last `width` rows. Not pure: it writes the state."""

    name = "ad.cached_token_window"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    initial = opt_operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(AdTensor)
    assembly_format = (
        "$input (`initial` $initial^)? `state` $state `slots` $slots `starts` $starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? `dim` $dim attr-dict `:` `(` "
        "type($input) `,` type($state) `,` type($slots) `,` type($starts) (`,` type($initial)^)? `)` `->` "
        "type($result)"
    )

    def width(self) -> int:
        return _shape(self.state.type)[self.dim.value.data]

    def verify_op(self) -> None:
        x, state, d = _shape(self.input.type), _shape(self.state.type), self.dim.value.data
        if len(x) < 2 or not 0 < d < len(x):
            raise VerifyException(f"ad.cached_token_window dim {d} must be an axis of the input other than the batch "
                                  "axis 0")
        rest = [i for i in range(1, len(x)) if i != d]
        if any(x[i] == DYNAMIC_INDEX for i in rest):
            raise VerifyException("ad.cached_token_window input must be static but for its batch and token axes")
        if len(state) != len(x) or state[d] in (DYNAMIC_INDEX, 0) or any(state[i] != x[i] for i in rest) \
                or state[0] == DYNAMIC_INDEX:
            raise VerifyException("ad.cached_token_window state must be the input's shape with static slots and "
                                  "width for its batch and token axes")
        if self.state.type.element_type != self.input.type.element_type:
            raise VerifyException("ad.cached_token_window state must have the input's element type")
        width = state[d]
        rows = [width if i == d else x[i] for i in range(1, len(x))]
        if self.initial is not None and (not shapes_compatible(_shape(self.initial.type), (x[0], *rows))
                                         or self.initial.type.element_type != self.input.type.element_type):
            raise VerifyException(f"ad.cached_token_window initial must be [batch, {', '.join(map(str, rows))}] of "
                                  "the input's element type")
        _verify_slot_metadata(self, self.name, x[0])
        if self.query_starts is not None:
            if self.result.type != self.input.type:
                raise VerifyException("ad.cached_token_window with query_starts: the result must be the input's type")
            return
        tokens = DYNAMIC_INDEX if x[d] == DYNAMIC_INDEX else x[d] + width
        if self.result.type != TensorType(self.input.type.element_type, [*x[:d], tokens, *x[d + 1:]]):
            raise VerifyException("ad.cached_token_window result must be the input's type with width + seq tokens")


def _verify_slot_metadata(op: Operation, name: str, batch: int) -> None:
    """tensor<? x i64> slots/starts (a batch row's or, with `query_starts`, a sequence's), and
    with `query_starts` a batch of 1."""
    for meta in (op.slots, op.starts, *((op.query_starts,) if op.query_starts is not None else ())):
        if len(_shape(meta.type)) != 1 or meta.type.element_type != i64:
            raise VerifyException(f"{name} slots/starts/query_starts must be rank-1 i64 tensors")
    if op.query_starts is not None and batch != 1:
        raise VerifyException(f"{name} with query_starts (the flattened sequences of the paged form) takes a batch "
                              f"of 1, not {batch}")


def _verify_state_metadata(op: Operation, name: str, state_shape: tuple[int, ...], batch: int) -> None:
    """A recurrent state [slots, *state_shape] in fp32 and the slot metadata (`_verify_slot_metadata`)."""
    state = _shape(op.state.type)
    if state is None or state[1:] != state_shape or op.state.type.element_type != Float32Type():
        raise VerifyException(f"{name} state must be [slots, {', '.join(map(str, state_shape))}] in f32")
    _verify_slot_metadata(op, name, batch)


@irdl_op_definition
class CachedSsmScanOp(AdOp):
    """Mamba2's state-space scan of each batch row's new tokens, continuing from the row's SSM
    state, the state written in place (HF's `mamba2_chunk_scan` and its one-token
    `selective_state_update`, in one op: Nemotron-H, Bamba, Zamba2, Falcon-H1...; MiniMax's
    lightning attention, exported as this scan with dt = 1, A = -slope, B = k, C = q, x = v).

    `input` [batch, seq, heads, head_dim] is x, `dt` [batch, seq, heads] the time steps, `a`
    [heads] the (negative) decay rates A, `b`/`c` [batch, seq, groups, state_size] B and C
    (head h reads group h // (heads / groups)), `d` [heads] the optional skip D and `dt_bias`
    [heads] an optional bias of dt. Each time step is dt + dt_bias, then softplus (with
    `dt_softplus`), then clamped to [`dt_min`, `dt_max`] (no upper bound without `dt_max`), in
    dt's dtype, as HF computes it. Row b uses slot `slots[b]` of `state` [slots, heads,
    head_dim, state_size] (fp32): the state after the tokens before the new ones when
    `starts[b]` > 0, zeros when it is 0 (a new sequence). For each new token t, in order:
    h = h * exp(dt_t * a) + (dt_t * x_t) B_t^T, y_t = h C_t + d * x_t, with x, B and C in
    fp32. The result [batch, seq, heads, head_dim] is fp32 (as HF's scan returns it);
    afterwards the slot holds h after the last token. Not pure: it writes the state.

    With `query_starts` [seqs + 1] (the paged form), the batch is 1 and holds the new tokens of
    `seqs` sequences, each run as a batch row of its own with `slots[s]` and `starts[s]`, as in
    `ad.cached_causal_conv1d`."""

    name = "ad.cached_ssm_scan"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    dt = operand_def(AdTensor)
    a = operand_def(AdTensor)
    b = operand_def(AdTensor)
    c = operand_def(AdTensor)
    d = opt_operand_def(AdTensor)
    dt_bias = opt_operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    dt_softplus = opt_prop_def(UnitAttr)
    dt_min = opt_prop_def(FloatAttr[Float64Type])
    dt_max = opt_prop_def(FloatAttr[Float64Type])
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $dt `,` $a `,` $b `,` $c (`d` $d^)? (`dt_bias` $dt_bias^)? (`dt_softplus` $dt_softplus^)? "
        "(`dt_min` $dt_min^)? (`dt_max` $dt_max^)? `state` $state `slots` $slots `starts` $starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? attr-dict `:` "
        "`(` type($input) `,` type($dt) `,` type($a) `,` type($b) `,` type($c) `,` type($state) `,` type($slots) "
        "`,` type($starts) (`,` `d` type($d)^)? (`,` `dt_bias` type($dt_bias)^)? "
        "`)` `->` type($result)"
    )

    def verify_op(self) -> None:
        x, dt, a, b, c = (_shape(v.type) for v in (self.input, self.dt, self.a, self.b, self.c))
        if len(x) != 4 or DYNAMIC_INDEX in x[2:]:
            raise VerifyException("ad.cached_ssm_scan input must be [batch, seq, heads, head_dim], heads and "
                                  "head_dim static")
        heads = x[2]
        if len(dt) != 3 or dt[2] != heads or a != (heads,):
            raise VerifyException(f"ad.cached_ssm_scan dt must be [batch, seq, {heads}] and a [{heads}]")
        if len(b) != 4 or b != c or DYNAMIC_INDEX in b[2:] or heads % b[2]:
            raise VerifyException(f"ad.cached_ssm_scan b and c must be one [batch, seq, groups, state_size] type, "
                                  f"groups static and dividing {heads} heads")
        for extra in (self.d, self.dt_bias):
            if extra is not None and _shape(extra.type) != (heads,):
                raise VerifyException(f"ad.cached_ssm_scan d and dt_bias must be [{heads}]")
        _verify_state_metadata(self, self.name, (heads, x[3], b[3]), x[0])
        if _shape(self.result.type) != x or self.result.type.element_type != Float32Type():
            raise VerifyException("ad.cached_ssm_scan result must be the input's shape in f32")


@irdl_op_definition
class CachedSelectiveScanOp(AdOp):
    """Mamba1's selective scan of each batch row's new tokens, continuing from the row's SSM
    state, the state written in place (HF's `mamba_selective_scan` and its one-token
    `mamba_selective_state_update`, in one op: Mamba, Falcon-Mamba).

    `input` [batch, channels, seq] is x and `dt` [batch, channels, seq] the time steps, `a`
    [channels, state_size] the (negative) decay rates A, `b`/`c` [batch, state_size, seq] B and C
    (shared by the channels), `d` [channels] the optional skip D, `z` [batch, channels, seq] the
    optional gate and `dt_bias` [channels] an optional bias of dt. Each time step is dt + dt_bias,
    then softplus (with `dt_softplus`), in dt's dtype as HF computes it. Row b uses slot
    `slots[b]` of `state` [slots, channels, state_size] (fp32): the state after the tokens before
    the new ones when `starts[b]` > 0, zeros when it is 0 (a new sequence). For each new token t,
    in order, in fp32: h = h * exp(dt_t a) + (dt_t x_t) B_t^T, y_t = h C_t + d x_t, times silu(z_t)
    with a gate. The result [batch, channels, seq] has the input's dtype promoted by d's (HF's);
    afterwards the slot holds h after the last token. Not pure: it writes the state.

    With `query_starts` [seqs + 1] (the paged form), the batch is 1 and holds the new tokens of
    `seqs` sequences, each run as a batch row of its own with `slots[s]` and `starts[s]`, as in
    `ad.cached_causal_conv1d`."""

    name = "ad.cached_selective_scan"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    dt = operand_def(AdTensor)
    a = operand_def(AdTensor)
    b = operand_def(AdTensor)
    c = operand_def(AdTensor)
    d = opt_operand_def(AdTensor)
    z = opt_operand_def(AdTensor)
    dt_bias = opt_operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    dt_softplus = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $dt `,` $a `,` $b `,` $c (`d` $d^)? (`z` $z^)? (`dt_bias` $dt_bias^)? (`dt_softplus` "
        "$dt_softplus^)? `state` $state `slots` $slots `starts` $starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? attr-dict `:` `(` type($input) `,` "
        "type($dt) `,` type($a) `,` type($b) `,` type($c) `,` type($state) `,` type($slots) `,` type($starts) "
        "(`,` `d` type($d)^)? (`,` `z` type($z)^)? (`,` `dt_bias` type($dt_bias)^)? "
        "`)` `->` type($result)"
    )

    def verify_op(self) -> None:
        x, dt, a, b, c = (_shape(v.type) for v in (self.input, self.dt, self.a, self.b, self.c))
        if len(x) != 3 or x[1] == DYNAMIC_INDEX or dt != x:
            raise VerifyException("ad.cached_selective_scan input and dt must be one [batch, channels, seq] shape, "
                                  "channels static")
        channels = x[1]
        if len(a) != 2 or a[0] != channels or a[1] == DYNAMIC_INDEX:
            raise VerifyException(f"ad.cached_selective_scan a must be [{channels}, state_size], state_size static")
        if len(b) != 3 or b != c or b[1] != a[1] or (b[0], b[2]) != (x[0], x[2]):
            raise VerifyException(f"ad.cached_selective_scan b and c must be one [batch, {a[1]}, seq] type")
        for name, extra, shape in (("d", self.d, (channels,)), ("dt_bias", self.dt_bias, (channels,)),
                                   ("z", self.z, x)):
            if extra is not None and _shape(extra.type) != shape:
                raise VerifyException(f"ad.cached_selective_scan {name} must be {list(shape)}")
        _verify_state_metadata(self, self.name, (channels, a[1]), x[0])
        if _shape(self.result.type) != x:
            raise VerifyException("ad.cached_selective_scan result must be the input's shape")


@irdl_op_definition
class CachedRgLruOp(AdOp):
    """RecurrentGemma's RG-LRU recurrence of each batch row's new tokens, continuing from the
    row's state, the state written in place (HF's `RecurrentGemmaRglru._rnn_scan`, its loop and
    its one-token step in one op; the gates before it stay ordinary ops).

    `input` [batch, seq, width] is x and `a` [batch, seq, width] the recurrence's diagonal (HF's
    gate, already 0 at position 0). Row b uses slot `slots[b]` of `state` [slots, width] (fp32):
    the state after the tokens before the new ones when `starts[b]` > 0, zeros when it is 0 (a
    new sequence). For each new token t, in order, in fp32: h = a_t h + x_t, y_t = h in x's dtype;
    afterwards the slot holds h after the last token. Not pure: it writes the state.

    With `query_starts` [seqs + 1] (the paged form), the batch is 1 and holds the new tokens of
    `seqs` sequences, each run as a batch row of its own with `slots[s]` and `starts[s]`, as in
    `ad.cached_causal_conv1d`."""

    name = "ad.cached_rg_lru"
    input = operand_def(AdTensor)
    a = operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $a `state` $state `slots` $slots `starts` $starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? attr-dict `:` `(` type($input) `,` "
        "type($a) `,` type($state) `,` type($slots) `,` type($starts) `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        x = _shape(self.input.type)
        if len(x) != 3 or x[2] == DYNAMIC_INDEX or _shape(self.a.type) != x:
            raise VerifyException("ad.cached_rg_lru input and a must be one [batch, seq, width] shape, width static")
        _verify_state_metadata(self, self.name, (x[2],), x[0])
        if self.result.type != self.input.type:
            raise VerifyException("ad.cached_rg_lru result must be the input's type")


@irdl_op_definition
class CachedWkvOp(AdOp):
    """RWKV's time mixing (the WKV recurrence) of each batch row's new tokens, continuing from
    the row's state, the state written in place (HF's `rwkv_linear_attention_cpu`, its loop and
    its one-token step in one op; the token shift and the projections stay ordinary ops).

    `w` [width] is the decay per channel (`-exp(time_decay)`), `u` [width] the current token's
    bonus (`time_first`), `key` and `value` [batch, seq, width]. Row b uses slot `slots[b]` of
    `state` [slots, 3, width] (fp32: num, den and the running maximum p): the state after the
    tokens before the new ones when `starts[b]` > 0, an empty one (0, 0, -1e38) when it is 0 (a
    new sequence). For each new token t, in order, in fp32: q = max(p, u + k_t), y_t =
    (e^(p-q) num + e^(u+k_t-q) v_t) / (e^(p-q) den + e^(u+k_t-q)) in key's dtype; then
    p' = max(p + w, k_t), num = e^(p+w-p') num + e^(k_t-p') v_t, den = e^(p+w-p') den + e^(k_t-p'),
    p = p'; afterwards the slot holds the state after the last token. Not pure: it writes the state.

    With `query_starts` [seqs + 1] (the paged form), the batch is 1 and holds the new tokens of
    `seqs` sequences, each run as a batch row of its own with `slots[s]` and `starts[s]`, as in
    `ad.cached_causal_conv1d`."""

    name = "ad.cached_wkv"
    w = operand_def(AdTensor)
    u = operand_def(AdTensor)
    key = operand_def(AdTensor)
    value = operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$w `,` $u `,` $key `,` $value `state` $state `slots` $slots `starts` $starts "
        "(`query_starts` $query_starts^ `:` type($query_starts))? attr-dict `:` `(` type($w) `,` type($u) `,` "
        "type($key) `,` type($value) `,` type($state) `,` type($slots) `,` type($starts) `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        k = _shape(self.key.type)
        if k is None or len(k) != 3 or k[2] == DYNAMIC_INDEX or _shape(self.value.type) != k:
            raise VerifyException("ad.cached_wkv key and value must be one [batch, seq, width] shape, width static")
        if _shape(self.w.type) != (k[2],) or _shape(self.u.type) != (k[2],):
            raise VerifyException("ad.cached_wkv w and u must be [width]")
        _verify_state_metadata(self, self.name, (3, k[2]), k[0])
        if self.result.type != self.key.type:
            raise VerifyException("ad.cached_wkv result must be the key's type")


@irdl_op_definition
class CachedGatedDeltaRuleOp(AdOp):
    """The gated delta rule of each batch row's new tokens, continuing from the row's recurrent
    state, the state written in place (HF's `torch_chunk_gated_delta_rule` and its one-token
    `torch_recurrent_gated_delta_rule`, in one op: Qwen3-Next, Qwen3.5, Olmo-Hybrid...).

    `query`/`key` [batch, seq, k_heads, k_dim], `value` [batch, seq, v_heads, v_dim] (value head
    h reads key head h // (v_heads / k_heads)), `g` [batch, seq, v_heads] the log decays (<= 0)
    and `beta` [batch, seq, v_heads] the write strengths. In fp32: with `use_qk_l2norm`, q and k
    are L2-normalized (q * rsqrt(sum q^2 + 1e-6)), and q is scaled by k_dim^-0.5. Row b uses
    slot `slots[b]` of `state` [slots, v_heads, k_dim, v_dim] (fp32): the state after the tokens
    before the new ones when `starts[b]` > 0, zeros when it is 0 (a new sequence). For each new
    token t, in order: S = S * exp(g_t); S = S + k_t (beta_t (v_t - k_t^T S))^T; o_t = q_t^T S.
    The result [batch, seq, v_heads, v_dim] has the query's dtype; afterwards the slot holds S
    after the last token. Not pure: it writes the state.

    With `query_starts` [seqs + 1] (the paged form), the batch is 1 and holds the new tokens of
    `seqs` sequences, each run as a batch row of its own with `slots[s]` and `starts[s]`, as in
    `ad.cached_causal_conv1d`."""

    name = "ad.cached_gated_delta_rule"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    query = operand_def(AdTensor)
    key = operand_def(AdTensor)
    value = operand_def(AdTensor)
    g = operand_def(AdTensor)
    beta = operand_def(AdTensor)
    state = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    use_qk_l2norm = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    assembly_format = (
        "$query `,` $key `,` $value `,` $g `,` $beta (`use_qk_l2norm` $use_qk_l2norm^)? `state` $state `slots` "
        "$slots `starts` $starts (`query_starts` $query_starts^ `:` type($query_starts))? attr-dict `:` `(` "
        "type($query) `,` type($key) `,` "
        "type($value) `,` type($g) `,` type($beta) `,` type($state) `,` type($slots) `,` type($starts) "
        "`)` `->` type($result)"
    )

    def verify_op(self) -> None:
        q, k, v, g, beta = (_shape(x.type) for x in (self.query, self.key, self.value, self.g, self.beta))
        if len(q) != 4 or q != k or DYNAMIC_INDEX in q[2:]:
            raise VerifyException("ad.cached_gated_delta_rule query and key must be one [batch, seq, k_heads, "
                                  "k_dim] type, k_heads and k_dim static")
        if len(v) != 4 or DYNAMIC_INDEX in v[2:] or v[2] % q[2]:
            raise VerifyException(f"ad.cached_gated_delta_rule value must be [batch, seq, v_heads, v_dim], v_heads "
                                  f"static and a multiple of {q[2]} key heads")
        if len(g) != 3 or g != beta or g[2] != v[2]:
            raise VerifyException(f"ad.cached_gated_delta_rule g and beta must be one [batch, seq, {v[2]}] type")
        _verify_state_metadata(self, self.name, (v[2], q[3], v[3]), q[0])
        if _shape(self.result.type) != v or self.result.type.element_type != self.query.type.element_type:
            raise VerifyException("ad.cached_gated_delta_rule result must be the value's shape in the query's "
                                  "dtype")


@irdl_op_definition
class CachedMlaAttentionOp(AdOp):
    """Multi-head latent attention (MLA: DeepSeek-V2/V3) of the new tokens of each sequence over
    pages of the compressed latent, the pages written in place: `ad.cached_attention`'s pages and
    metadata (the slot form is one configuration: a slot is one page of max_seq tokens, a
    sequence's block table that one page), with one latent row per token instead of the heads'
    K and V.

    `q_nope` [batch, heads, seq, nope] and `q_rope` [batch, heads, seq, rope] are the two parts of
    each query head (RoPE already applied to `q_rope`); `latent` [batch, 1, seq, rank] is the
    normalized compressed K/V (HF's `kv_a_layernorm` output) and `k_rope` [batch, 1, seq, rope]
    the key part shared by all heads (RoPE applied); `kv_b_weight` [heads * (nope + v_dim), rank]
    is HF's `kv_b_proj` weight, which expands a latent c into each head's key `W_uk[h] c` and
    value `W_uv[h] c` (rows h * (nope + v_dim) .. + nope and the v_dim after them). The new tokens
    come as `ad.cached_attention`'s do: batch row s is sequence s, or with `query_starts` [seqs +
    1] (int64, cumulative) one flattened batch [1, ..., T, ...] whose tokens `query_starts[s]` ..
    `query_starts[s + 1] - 1` are sequence s's. Sequence s already holds `cache_starts[s]` tokens;
    position p of it is row p % page_size of page `block_tables[s, p / page_size]` of `cache`
    [pages, page_size, rank + rope] (pages in any order in the pool; the slot form's table is
    [batch, 1], each row's slot, over a pool [slots, max_seq, rank + rope]). The new latent ++
    k_rope is written at its positions, and each new token attends causally to its sequence's
    positions 0 .. its own with scores `scale * (q_nope . W_uk c + q_rope . k_rope)` (what HF
    computes on the expanded keys [k_nope, k_rope]); the result [batch, heads, seq, v_dim] has
    the query's dtype. Only rank + rope values per token and layer are cached, not the heads'
    expanded K and V. Decode absorbs the up-projection as DeepSeek's inference does (scores
    against the latent: `(W_uk[h]^T q_nope) . c`; output `W_uv[h] sum_j p_j c_j`). Pages a step
    writes belong to that sequence alone. With `selected` [batch, seq, k] (batched only; int64;
    DeepSeek sparse attention's choice, `ad.cached_index_topk`), new token i attends only to the
    positions its row lists among those (-1: none). With `sinks` [heads] (HY-V4), each head's
    sink logit is one more softmax column, dropped after (as `ad.cached_attention`'s). Not pure:
    it writes the pages."""

    name = "ad.cached_mla_attention"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    q_nope = operand_def(AdTensor)
    q_rope = operand_def(AdTensor)
    latent = operand_def(AdTensor)
    k_rope = operand_def(AdTensor)
    kv_b_weight = operand_def(AdTensor)
    cache = operand_def(AdTensor)
    block_tables = operand_def(AdTensor)
    cache_starts = operand_def(AdTensor)
    query_starts = opt_operand_def(AdTensor)
    selected = opt_operand_def(AdTensor)
    sinks = opt_operand_def(AdTensor)
    scale = prop_def(FloatAttr[Float64Type])
    result = result_def(AdTensor)
    assembly_format = (
        "$q_nope `,` $q_rope `,` $latent `,` $k_rope `kv_b` $kv_b_weight `cache` $cache `block_tables` $block_tables "
        "`cache_starts` $cache_starts (`query_starts` $query_starts^ `:` type($query_starts))? "
        "(`selected` $selected^ `:` type($selected))? (`sinks` $sinks^ `:` type($sinks))? `scale` $scale attr-dict "
        "`:` `(` type($q_nope) `,` type($q_rope) `,` type($latent) `,` type($k_rope) `,` type($kv_b_weight) `,` "
        "type($cache) `,` type($block_tables) `,` type($cache_starts) `)` `->` type($result)"
    )

    def page_size(self) -> int:
        return _shape(self.cache.type)[1]

    def dims(self) -> tuple[int, int, int, int, int]:
        """(heads, nope, rope, rank, v_dim) of the verified op."""
        _, heads, _, nope = _shape(self.q_nope.type)
        rope, rank = _shape(self.q_rope.type)[3], _shape(self.latent.type)[3]
        return heads, nope, rope, rank, _shape(self.kv_b_weight.type)[0] // heads - nope

    def verify_op(self) -> None:
        flat = self.query_starts is not None
        qn, heads, nope, rope, rank = _verify_mla_inputs(
            self, *(("1", "tokens", "tokens") if flat else ("batch", "seq", "batch and seq")))
        cache = _shape(self.cache.type)
        if len(cache) != 3 or cache[2] != rank + rope or self.cache.type.element_type != self.latent.type.element_type:
            raise VerifyException(f"ad.cached_mla_attention cache must be [pages, page_size, {rank} + {rope}] of the "
                                  "latent's element type")
        if cache[1] == DYNAMIC_INDEX or cache[1] < 1:
            raise VerifyException(f"ad.cached_mla_attention page_size {'?' if cache[1] == DYNAMIC_INDEX else cache[1]} "
                                  "must be static and positive")
        for name, meta, rank_of in (("query_starts", self.query_starts, 1), ("cache_starts", self.cache_starts, 1),
                                    ("block_tables", self.block_tables, 2)):
            if meta is not None and (len(_shape(meta.type)) != rank_of or meta.type.element_type != i64):
                raise VerifyException(f"ad.cached_mla_attention {name} must be a rank-{rank_of} i64 tensor")
        v_dim = _shape(self.kv_b_weight.type)[0] // heads - nope
        if self.result.type != TensorType(self.q_nope.type.element_type, [*qn[:3], v_dim]):
            raise VerifyException(f"ad.cached_mla_attention result must be [batch, {heads}, seq, {v_dim}] in the "
                                  "query's element type")
        if self.selected is not None:
            if flat:
                raise VerifyException("ad.cached_mla_attention selected takes batch rows, not query_starts")
            _verify_selected(self.name, self.selected, (qn[0], qn[2]))
        if self.sinks is not None and _shape(self.sinks.type) != (heads,):
            raise VerifyException(f"ad.cached_mla_attention sinks must be [{heads}]")


def _verify_mla_inputs(op: CachedMlaAttentionOp, batch: str, seq: str,
                       agree: str) -> tuple[tuple[int, ...], int, int, int, int]:
    """The queries, latent, rope key and kv_b_weight of an MLA op, whose messages name the query's
    leading dims `batch` and `seq` (what must `agree`): (q_nope's shape, heads, nope, rope, rank)."""
    qn, qr, lat, kr, w = (_shape(x.type) for x in (op.q_nope, op.q_rope, op.latent, op.k_rope, op.kv_b_weight))
    if not len(qn) == len(qr) == len(lat) == len(kr) == 4 or DYNAMIC_INDEX in (*qn[1:2], *qn[3:], *qr[3:], lat[3]) \
            or (batch == "1" and qn[0] != 1):
        raise VerifyException(f"{op.name} q_nope/q_rope must be [{batch}, heads, {seq}, dim] and "
                              f"latent/k_rope [{batch}, 1, {seq}, dim], heads and dims static")
    if qr[:3] != qn[:3] or lat[1] != 1 or kr[:3] != lat[:3] or (lat[0], lat[2]) != (qn[0], qn[2]) or kr[3] != qr[3]:
        raise VerifyException(f"{op.name} q_nope/q_rope [{batch}, heads, {seq}, *] and latent/k_rope "
                              f"[{batch}, 1, {seq}, *] must agree in {agree}, q_rope and k_rope in the rope dim")
    heads, nope, rope, rank = qn[1], qn[3], qr[3], lat[3]
    if len(w) != 2 or w[1] != rank or w[0] % heads or w[0] // heads <= nope:
        raise VerifyException(f"{op.name} kv_b_weight must be [{heads} * ({nope} + v_dim), {rank}]")
    if not op.q_nope.type.element_type == op.q_rope.type.element_type == op.latent.type.element_type \
            == op.k_rope.type.element_type:
        raise VerifyException(f"{op.name} queries, latent and k_rope must have one element type")
    return qn, heads, nope, rope, rank


def _verify_selected(name: str, selected: SSAValue, rows: tuple[int, int]) -> None:
    """`selected` is [batch, seq, k] int64 of the query's batch and seq."""
    shape = _shape(selected.type)
    if len(shape) != 3 or not shapes_compatible(shape[:2], rows) or selected.type.element_type != i64:
        raise VerifyException(f"{name} selected must be tensor<batch x seq x k x i64> of the query's batch and seq")


@irdl_op_definition
class CachedIndexTopkOp(AdOp):
    """DeepSeek sparse attention's lightning indexer over a cache of its keys, the cache written
    in place: which `topk` cached positions each new token attends to.

    `query` [batch, seq, heads, dim] are the indexer's query heads and `key` [batch, seq, dim]
    its one key per token (RoPE applied to both), `weights` [batch, seq, heads] each head's
    weight. Row b uses slot `slots[b]` of `cache` [slots, max_seq, dim], which already holds
    `starts[b]` keys: the new keys are written at positions starts[b] .. starts[b] + seq - 1, and
    new token i scores each position t <= starts[b] + i as `sum_h weights[h] * relu(scale *
    query[h] . key_t)` (in fp32, as HF). The result [batch, seq, topk] (int64) lists the `topk`
    best positions (torch.topk's order; which of equal scores at the k-th place are kept is
    left open, as in HF), -1 where fewer positions are causal: the `selected`
    operand of `ad.cached_mla_attention`. Not pure: it writes the cache."""

    name = "ad.cached_index_topk"
    query = operand_def(AdTensor)
    key = operand_def(AdTensor)
    weights = operand_def(AdTensor)
    cache = operand_def(AdTensor)
    slots = operand_def(AdTensor)
    starts = operand_def(AdTensor)
    scale = prop_def(FloatAttr[Float64Type])
    topk = prop_def(IntegerAttr[I64])
    result = result_def(AdTensor)
    assembly_format = (
        "$query `,` $key `,` $weights `cache` $cache `slots` $slots `starts` $starts `scale` $scale `topk` $topk "
        "attr-dict `:` `(` type($query) `,` type($key) `,` type($weights) `,` type($cache) `,` type($slots) `,` "
        "type($starts) `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        q, k, w, cache = (_shape(x.type) for x in (self.query, self.key, self.weights, self.cache))
        if len(q) != 4 or DYNAMIC_INDEX in q[2:] or len(k) != 3 or not shapes_compatible(k, (*q[:2], q[3])):
            raise VerifyException("ad.cached_index_topk query must be [batch, seq, heads, dim] (heads and dim static) "
                                  "and key [batch, seq, dim]")
        if len(w) != 3 or not shapes_compatible(w, q[:3]):
            raise VerifyException(f"ad.cached_index_topk weights must be [batch, seq, {q[2]}]")
        if len(cache) != 3 or cache[2] != q[3] or self.cache.type.element_type != self.key.type.element_type:
            raise VerifyException(f"ad.cached_index_topk cache must be [slots, max_seq, {q[3]}] of the key's element "
                                  "type")
        for meta in (self.slots, self.starts):
            if len(_shape(meta.type)) != 1 or meta.type.element_type != i64:
                raise VerifyException("ad.cached_index_topk slots/starts must be tensor<batch x i64>")
        if self.topk.value.data < 1 or self.result.type != TensorType(i64, [*q[:2], self.topk.value.data]):
            raise VerifyException(f"ad.cached_index_topk result must be tensor<batch x seq x {self.topk.value.data} x "
                                  "i64> (topk positive)")


FP8_MAX = 448.0
"""The largest finite float8_e4m3fn value."""
FP8_MIN_AMAX = 1e-12
"""Dynamic scales use max(amax, this): an all-zero row gets a positive scale (its values quantize to 0)."""


def _is_fp8(t: Attribute) -> bool:
    return isinstance(t, TensorType) and t.element_type == Float8E4M3FNType()


@irdl_op_definition
class QuantizeFp8Op(KernelOp):
    """Static FP8 quantization: `clamp(float(input) / scale, -448, 448)` to float8_e4m3fn, with
    `scale` an f32 tensor that broadcasts to the input (per tensor: 0-d)."""

    name = "ad.quantize_fp8"
    input = operand_def(AdTensor)
    scale = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input `,` $scale attr-dict `:` `(` type($input) `,` type($scale) `)` `->` type($result)"

    def verify_op(self) -> None:
        if not _is_fp8(self.result.type) or not shapes_compatible(_shape(self.input.type), _shape(self.result.type)):
            raise VerifyException("ad.quantize_fp8 result must be the input shape in f8E4M3FN")
        if self.scale.type.element_type != Float32Type():
            raise VerifyException("ad.quantize_fp8 scale must be f32")


@irdl_op_definition
class QuantizeFp8DynamicOp(KernelOp):
    """Dynamic FP8 quantization: the scale is `max(amax(|input|), FP8_MIN_AMAX) / 448`, per row of the
    last dim with `per_token` (scale shape [..., 1]), else over the whole tensor (0-d); the
    values are quantized with it as by `ad.quantize_fp8`. Results: the fp8 values, the f32 scale."""

    name = "ad.quantize_fp8_dynamic"
    input = operand_def(AdTensor)
    per_token = opt_prop_def(UnitAttr)
    result = result_def(AdTensor)
    scale = result_def(AdTensor)
    assembly_format = (
        "$input (`per_token` $per_token^)? attr-dict `:` type($input) `->` `(` type($result) `,` type($scale) `)`"
    )

    def verify_op(self) -> None:
        shape = _shape(self.input.type)
        if not _is_fp8(self.result.type) or not shapes_compatible(shape, _shape(self.result.type)):
            raise VerifyException("ad.quantize_fp8_dynamic result must be the input shape in f8E4M3FN")
        expected = (*shape[:-1], 1) if self.per_token is not None else ()
        if self.scale.type.element_type != Float32Type() or not shapes_compatible(expected, _shape(self.scale.type)):
            raise VerifyException(f"ad.quantize_fp8_dynamic scale must be f32 of shape {_fmt_shape(expected)}")


@irdl_op_definition
class DequantizeFp8Op(KernelOp):
    """`float(input) * scale`, cast to the result's element type."""

    name = "ad.dequantize_fp8"
    input = operand_def(AdTensor)
    scale = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input `,` $scale attr-dict `:` `(` type($input) `,` type($scale) `)` `->` type($result)"

    def verify_op(self) -> None:
        if not _is_fp8(self.input.type):
            raise VerifyException("ad.dequantize_fp8 input must be f8E4M3FN")


@irdl_op_definition
class LinearFp8Op(KernelOp):
    """An FP8 linear: `(float(input) * input_scale) @ (float(weight) * weight_scale).T + bias`,
    cast to the result type. Scales are f32: per tensor (0-d, or [1]) or, for the input, per token
    ([..., 1]), for the weight per output channel ([N, 1]: compressed-tensors FP8-dynamic
    checkpoints, `zoo/ct_fp8.py`). Its kernel is a template (`codegen/templates/linear_fp8_kernel.py`)."""

    name = "ad.linear_fp8"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    weight = operand_def(AdTensor)
    input_scale = operand_def(AdTensor)
    weight_scale = operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $weight `,` $input_scale `,` $weight_scale (`bias` $bias^)? attr-dict `:` `(` type($input) `,` "
        "type($weight) `,` type($input_scale) `,` type($weight_scale) (`,` type($bias)^)? `)` `->` type($result)"
    )

    def verify_op(self) -> None:
        if not (_is_fp8(self.input.type) and _is_fp8(self.weight.type)):
            raise VerifyException("ad.linear_fp8 input and weight must be f8E4M3FN")
        in_shape, w_shape = _shape(self.input.type), _shape(self.weight.type)
        expected = (*in_shape[:-1], w_shape[0])
        if len(w_shape) != 2 or not shapes_compatible(expected, _shape(self.result.type)):
            raise VerifyException(f"ad.linear_fp8 result shape should be {_fmt_shape(expected)}")


def _is_power_of_two_block(side: int) -> bool:
    return side >= 16 and side & (side - 1) == 0


@irdl_op_definition
class LinearFp8BlockOp(KernelOp):
    """A fine-grained (block-scaled) FP8 linear, as transformers' `FP8Linear` with
    `weight_block_size` [bn, bk] and dynamic activations computes it (DeepSeek-V3, Qwen3-*-FP8).

    `weight` [N, K] is f8E4M3FN, `weight_scale_inv` [ceil(N / bn), ceil(K / bk)] f32: the weight
    is `weight * weight_scale_inv` broadcast over each bn x bk block. `input` [..., K] (f32, f16 or
    bf16) is quantized per token per group of bk elements: `s = amax(|group|) / 448`, `q =
    group / max(s, 1e-12)` rounded to e4m3. The product accumulates in fp32, K block after K
    block: `acc += (q_kb @ weight_kb.T) * s[:, kb] * weight_scale_inv[n / bn, kb]`; the result is
    `acc` rounded to the input's dtype, then `+ bias` rounded again (HF's `output.add_(bias)`).
    Blocks at the edges are the ragged rest. `block_size` is [bn, bk], each a power of two >= 16.
    Its reference is `zoo/fp8_blocks.py`'s `block_linear`; its kernel a template
    (`codegen/templates/linear_fp8_block_kernel.py`)."""

    name = "ad.linear_fp8_block"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    weight = operand_def(AdTensor)
    weight_scale_inv = operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    block_size = prop_def(DenseArrayBase.constr(i64))
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $weight `,` $weight_scale_inv (`bias` $bias^)? `block` $block_size attr-dict `:` `(` "
        "type($input) `,` type($weight) `,` type($weight_scale_inv) (`,` type($bias)^)? `)` `->` type($result)"
    )

    def __init__(self, input: SSAValue, weight: SSAValue, weight_scale_inv: SSAValue, bias: SSAValue | None,
                 block_size: Sequence[int], result_type: Attribute) -> None:
        super().__init__(operands=[input, weight, weight_scale_inv, bias], result_types=[result_type],
                         properties={"block_size": DenseArrayBase.from_list(i64, list(block_size))})

    def blocks(self) -> tuple[int, int]:
        bn, bk = self.block_size.get_values()
        return bn, bk

    def verify_op(self) -> None:
        sides = tuple(self.block_size.get_values())
        if len(sides) != 2 or not all(_is_power_of_two_block(b) for b in sides):
            raise VerifyException(f"ad.linear_fp8_block block_size {list(sides)} must be [bn, bk], powers of two >= 16")
        bn, bk = sides
        x, w, ws = _shape(self.input.type), _shape(self.weight.type), _shape(self.weight_scale_inv.type)
        dtype = self.input.type.element_type
        if dtype not in _FLOAT_TYPES or self.result.type.element_type != dtype:
            raise VerifyException("ad.linear_fp8_block input must be f32, f16 or bf16, and the result of its type")
        if not _is_fp8(self.weight.type) or len(w) != 2 or DYNAMIC_INDEX in w:
            raise VerifyException(f"ad.linear_fp8_block weight must be a static 2-D f8E4M3FN tensor, got "
                                  f"{self.weight.type}")
        if not _dims_compatible(x[-1], w[1]):
            raise VerifyException(f"ad.linear_fp8_block input features {x[-1]} do not match weight {_fmt_shape(w)}")
        expected = (-(-w[0] // bn), -(-w[1] // bk))
        if self.weight_scale_inv.type.element_type != Float32Type() or ws != expected:
            raise VerifyException(f"ad.linear_fp8_block weight_scale_inv must be f32 {_fmt_shape(expected)} for "
                                  f"weight {_fmt_shape(w)} in blocks {list(sides)}")
        if self.bias is not None and (_shape(self.bias.type) != (w[0],) or self.bias.type.element_type
                                      not in _FLOAT_TYPES):
            raise VerifyException(f"ad.linear_fp8_block bias must be a float tensor of shape [{w[0]}]")
        if not shapes_compatible((*x[:-1], w[0]), _shape(self.result.type)):
            raise VerifyException(f"ad.linear_fp8_block result shape should be {_fmt_shape((*x[:-1], w[0]))}")


NVFP4_GROUP = 16
"""Elements of a row that share one NVFP4 block scale."""


@irdl_op_definition
class LinearNvfp4Op(KernelOp):
    """An NVFP4 linear (NVIDIA ModelOpt's 4-bit float weights, `zoo/modelopt.py`), weight-only.

    `weight` [N, K / 2] is ui8: two e2m1 codes a byte, element 2i in the low nibble (`zoo/fp4.py`);
    `weight_scale` [N, K / 16] f8E4M3FN, one scale per 16 elements of a row; `weight_scale_2` f32,
    the global scale: one value (0-d), or one per output row ([N]: the parts of a GEMM that
    `fuse-gemms` merged, each part's value repeated over its rows). The result is
    `(input @ (e2m1 * weight_scale).T) * weight_scale_2 + bias` in fp32, rounded once to the
    input's dtype (f32, f16 or bf16). The activations are not quantized: Hopper has no FP4 MMA, so,
    as vLLM's Marlin fallback does there, the weight is decoded and the product is in the
    activation's dtype (`e2m1 * weight_scale` is exact in bf16 and fp16). A checkpoint's
    `input_scale` (the activation scale of Blackwell's FP4 x FP4 GEMM) is kept by the loaded
    module but unused, and is no operand. Its reference is `zoo/nvfp4.py`'s `linear`; its kernel a
    template (`codegen/templates/linear_nvfp4_kernel.py`)."""

    name = "ad.linear_nvfp4"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    weight = operand_def(AdTensor)
    weight_scale = operand_def(AdTensor)
    weight_scale_2 = operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $weight `,` $weight_scale `,` $weight_scale_2 (`bias` $bias^)? attr-dict `:` `(` type($input) "
        "`,` type($weight) `,` type($weight_scale) `,` type($weight_scale_2) (`,` type($bias)^)? `)` `->` "
        "type($result)"
    )

    def __init__(self, input: SSAValue, weight: SSAValue, weight_scale: SSAValue, weight_scale_2: SSAValue,
                 bias: SSAValue | None, result_type: Attribute) -> None:
        super().__init__(operands=[input, weight, weight_scale, weight_scale_2, bias], result_types=[result_type])

    def in_features(self) -> int:
        return 2 * self.weight.type.get_shape()[1]

    def verify_op(self) -> None:
        x, w, ws, gs = (_shape(v.type) for v in (self.input, self.weight, self.weight_scale, self.weight_scale_2))
        dtype = self.input.type.element_type
        if dtype not in _FLOAT_TYPES or self.result.type.element_type != dtype:
            raise VerifyException("ad.linear_nvfp4 input must be f32, f16 or bf16, and the result of its type")
        if self.weight.type.element_type != UI8 or len(w) != 2 or DYNAMIC_INDEX in w:
            raise VerifyException(f"ad.linear_nvfp4 weight must be a static 2-D ui8 tensor (packed e2m1), got "
                                  f"{self.weight.type}")
        n, k = w[0], 2 * w[1]
        if k % NVFP4_GROUP or not _dims_compatible(x[-1], k):
            raise VerifyException(f"ad.linear_nvfp4 input features {x[-1]} do not match weight {_fmt_shape(w)} "
                                  f"({k} packed in-features, a multiple of {NVFP4_GROUP})")
        if not _is_fp8(self.weight_scale.type) or ws != (n, k // NVFP4_GROUP):
            raise VerifyException(f"ad.linear_nvfp4 weight_scale must be f8E4M3FN {_fmt_shape((n, k // NVFP4_GROUP))}")
        if self.weight_scale_2.type.element_type != Float32Type() or gs not in ((), (1,), (n,)):
            raise VerifyException(f"ad.linear_nvfp4 weight_scale_2 must be f32 of one value or [{n}]")
        if self.bias is not None and (_shape(self.bias.type) != (n,) or self.bias.type.element_type
                                      not in _FLOAT_TYPES):
            raise VerifyException(f"ad.linear_nvfp4 bias must be a float tensor of shape [{n}]")
        if not shapes_compatible((*x[:-1], n), _shape(self.result.type)):
            raise VerifyException(f"ad.linear_nvfp4 result shape should be {_fmt_shape((*x[:-1], n))}")


@irdl_op_definition
class LinearInt4Op(KernelOp):
    """A 4-bit weight-only linear with group scales and zero points, as GPTQ and AWQ checkpoints
    hold it (`zoo/int4.py`, whose module docstring gives the layout).

    `qweight` i32 [K / 8, N] packs the codes along K (row 8i + j in nibble j of word row i);
    `qzeros` i32 [G, N / 8] the zero points along N; `scales` [G, N] (f16, bf16 or f32) the group
    scales; `g_idx` i32 [K], when present, each row's group (GPTQ's act-order), else row k is in
    group k // group_size; G = ceil(K / group_size). The weight is `(code - (zero +
    zero_offset)) * scale` (`zero_offset` 1 for GPTQ's v1 checkpoints, which store the zero
    points minus one, 0 otherwise), computed exactly in f32 and rounded once to the input's dtype;
    `input` [..., K] (f32, f16 or bf16) times it accumulates in f32, rounded to the input's dtype;
    then `+ bias` in f32, rounded again. Its reference is `zoo/int4.py`'s `int4_linear`; its
    kernel a template (`codegen/templates/linear_int4_kernel.py`)."""

    name = "ad.linear_int4"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    input = operand_def(AdTensor)
    qweight = operand_def(AdTensor)
    qzeros = operand_def(AdTensor)
    scales = operand_def(AdTensor)
    g_idx = opt_operand_def(AdTensor)
    bias = opt_operand_def(AdTensor)
    group_size = prop_def(IntegerAttr[I64])
    zero_offset = prop_def(IntegerAttr[I64])
    result = result_def(AdTensor)
    assembly_format = (
        "$input `,` $qweight `,` $qzeros `,` $scales (`g_idx` $g_idx^)? (`bias` $bias^)? `group` $group_size "
        "`zero_offset` $zero_offset attr-dict `:` `(` type($input) `,` type($qweight) `,` type($qzeros) `,` "
        "type($scales) (`,` type($g_idx)^)? (`,` type($bias)^)? `)` `->` type($result)"
    )

    def __init__(self, input: SSAValue, qweight: SSAValue, qzeros: SSAValue, scales: SSAValue,
                 g_idx: SSAValue | None, bias: SSAValue | None, group_size: int, zero_offset: int,
                 result_type: Attribute) -> None:
        super().__init__(operands=[input, qweight, qzeros, scales, g_idx, bias], result_types=[result_type],
                         properties={"group_size": IntegerAttr(group_size, i64),
                                     "zero_offset": IntegerAttr(zero_offset, i64)})

    def features(self) -> tuple[int, int]:
        """(N, K): out- and in-features."""
        rows, n = _shape(self.qweight.type)
        return n, rows * 8

    def verify_op(self) -> None:
        x, qw, qz, sc = (_shape(v.type) for v in (self.input, self.qweight, self.qzeros, self.scales))
        dtype = self.input.type.element_type
        if dtype not in _FLOAT_TYPES or self.result.type.element_type != dtype:
            raise VerifyException("ad.linear_int4 input must be f32, f16 or bf16, and the result of its type")
        if self.qweight.type.element_type != IntegerType(32) or len(qw) != 2 or DYNAMIC_INDEX in qw:
            raise VerifyException(f"ad.linear_int4 qweight must be a static 2-D i32 tensor, got {self.qweight.type}")
        n, k = self.features()
        group = self.group_size.value.data
        if group <= 0 or self.zero_offset.value.data not in (0, 1) or n % 8:
            raise VerifyException(f"ad.linear_int4 group_size {group} must be positive, zero_offset 0 or 1, "
                                  f"N {n} a multiple of 8")
        if not _dims_compatible(x[-1], k):
            raise VerifyException(f"ad.linear_int4 input features {x[-1]} do not match qweight {_fmt_shape(qw)}")
        groups = -(-k // group)
        if self.qzeros.type.element_type != IntegerType(32) or qz != (groups, n // 8):
            raise VerifyException(f"ad.linear_int4 qzeros must be i32 {_fmt_shape((groups, n // 8))}")
        if self.scales.type.element_type not in _FLOAT_TYPES or sc != (groups, n):
            raise VerifyException(f"ad.linear_int4 scales must be float {_fmt_shape((groups, n))}")
        if self.g_idx is not None and (self.g_idx.type.element_type != IntegerType(32)
                                       or _shape(self.g_idx.type) != (k,)):
            raise VerifyException(f"ad.linear_int4 g_idx must be i32 [{k}]")
        if self.bias is not None and (_shape(self.bias.type) != (n,) or self.bias.type.element_type
                                      not in _FLOAT_TYPES):
            raise VerifyException(f"ad.linear_int4 bias must be a float tensor of shape [{n}]")
        if not shapes_compatible((*x[:-1], n), _shape(self.result.type)):
            raise VerifyException(f"ad.linear_int4 result shape should be {_fmt_shape((*x[:-1], n))}")


# -------------------------------------------------------------------- collectives


@irdl_op_definition
class AllReduceOp(AdOp):
    """torch's functional all_reduce (`_c10d_functional.all_reduce`): `reduce_op` ("sum", ...)
    of `input` over the ranks of the process group named `group_name`. As in torch, the
    result may be read only through `ad.wait_tensor`. Not pure: it communicates, so no pass
    may merge, move or drop it."""

    name = "ad.all_reduce"
    input = operand_def(AdTensor)
    reduce_op = prop_def(StringAttr)
    group_name = prop_def(StringAttr)
    result = result_def(AdTensor)
    assembly_format = "$input $reduce_op `group` $group_name attr-dict `:` type($input) `->` type($result)"

    def verify_op(self) -> None:
        if self.result.type != self.input.type:
            raise VerifyException("ad.all_reduce result must have the input's type")


@irdl_op_definition
class WaitTensorOp(AdOp):
    """Waits for the collective that produced `input` (`_c10d_functional.wait_tensor`)."""

    name = "ad.wait_tensor"
    input = operand_def(AdTensor)
    result = result_def(AdTensor)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def verify_op(self) -> None:
        if self.result.type != self.input.type:
            raise VerifyException("ad.wait_tensor result must have the input's type")


# ----------------------------------------------------------------------- fusion


@irdl_op_definition
class FusedOp(AdOp):
    """A fused region: the body computes `outputs` from `inputs` (its block arguments) with
    elementwise and last-dim row-reduction ops, and ends in `ad.yield`. Codegen makes one
    kernel of it; its meaning is the body's ops run in order."""

    name = "ad.fused"
    traits = traits_def(Pure(), IsolatedFromAbove())
    inputs = var_operand_def(TensorOrScalar)
    outputs = var_result_def(AdTensor)
    body = region_def("single_block")
    assembly_format = "`(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs) $body"

    def verify_op(self) -> None:
        block = self.body.block
        if [a.type for a in block.args] != [v.type for v in self.inputs]:
            raise VerifyException("block argument types must be the input types")
        terminator = block.last_op
        if not isinstance(terminator, YieldOp):
            raise VerifyException("the body must end in ad.yield")
        if [v.type for v in terminator.values] != [r.type for r in self.outputs]:
            raise VerifyException("ad.yield types must be the output types")


@irdl_op_definition
class YieldOp(IRDLOperation):
    name = "ad.yield"
    traits = traits_def(IsTerminator(), HasParent(FusedOp), Pure())
    values = var_operand_def(AdTensor)
    assembly_format = "$values attr-dict `:` type($values)"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[values])


# ----------------------------------------------------------------- factories, sizes


@irdl_op_definition
class ConstantOp(AdOp):
    """A Python scalar (float f64, int i64, bool i1, or a static `index`)."""

    name = "ad.constant"
    traits = traits_def(Pure())
    value = prop_def(AnyOf((base(IntegerAttr), base(FloatAttr))))
    result = result_def(ScalarType)

    def __init__(self, value: IntegerAttr | FloatAttr):
        super().__init__(properties={"value": value}, result_types=[value.type])

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        value = parser.parse_attribute()
        if not isinstance(value, IntegerAttr | FloatAttr):
            parser.raise_error(f"ad.constant expects a typed integer or float, got {value}")
        attrs = parser.parse_optional_attr_dict()
        op = cls(value)
        op.attributes.update(attrs)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_attribute(self.value)
        printer.print_op_attributes(self.attributes)

    def verify_op(self) -> None:
        if self.value.type != self.result.type:
            raise VerifyException("ad.constant value type must be its result type")


class FactoryOp(AdOp):
    """Creates a tensor; `device`/`layout`/`pin_memory` are torch's, the dtype is the
    result's element type."""

    traits = traits_def(Pure())
    device = opt_prop_def(TorchValueAttr)
    layout = opt_prop_def(TorchValueAttr)
    pin_memory = opt_prop_def(UnitAttr)


@irdl_op_definition
class ArangeOp(FactoryOp):
    """`[start, start + step, ...)` below `end`; bounds are scalar values."""

    name = "ad.arange"
    start = operand_def(ScalarType)
    end = operand_def(ScalarType)
    step = operand_def(ScalarType)
    result = result_def(AdTensor)
    assembly_format = (
        "$start `,` $end `,` $step (`device` $device^)? (`layout` $layout^)? "
        "(`pin_memory` $pin_memory^)? attr-dict `:` type($start) `,` type($end) `,` type($step) "
        "`->` type($result)"
    )

    def verify_op(self) -> None:
        if len(_shape(self.result.type)) != 1:
            raise VerifyException("ad.arange produces a 1-D tensor")


@irdl_op_definition
class FullOp(FactoryOp):
    """A tensor of `size` filled with `fill_value`."""

    name = "ad.full"
    custom_directives = (DynamicIndexList,)
    size = var_operand_def(IndexType())
    static_size = prop_def(DenseArrayBase.constr(i64))
    fill_value = operand_def(ScalarType)
    result = result_def(AdTensor)
    assembly_format = (
        "custom<DynamicIndexList>($size, $static_size) `,` $fill_value (`device` $device^)? "
        "(`layout` $layout^)? (`pin_memory` $pin_memory^)? attr-dict `:` type($fill_value) "
        "`->` type($result)"
    )

    def verify_op(self) -> None:
        verify_dynamic_index_list(self.static_size.get_values(), self.size, DYNAMIC_INDEX)
        if len(self.static_size.get_values()) != len(_shape(self.result.type)):
            raise VerifyException("ad.full size does not match the result rank")


@irdl_op_definition
class SymSizeOp(AdOp):
    """The size of `input` along `dim`, as an `index` value."""

    name = "ad.sym_size"
    traits = traits_def(Pure())
    input = operand_def(AdTensor)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(IndexType())
    assembly_format = "$input `dim` $dim attr-dict `:` type($input)"

    def verify_op(self) -> None:
        normalize_dim(self.dim.value.data, len(_shape(self.input.type)))


# ---------------------------------------------------------------- opaque carrier


@irdl_op_definition
class TorchOp(IRDLOperation):
    """Any FX call target without an `ad` op: `target` names it ("aten.index.Tensor",
    "operator.mul"), `args`/`kwargs` rebuild its arguments, with `#ad.ref<N>` for the N-th
    operand. `unpack` marks a target that returns a sequence (results are its items)."""

    name = "ad.torch_op"
    traits = traits_def(CanonicalizedBy(("RemoveNoValueTorchOp", "RemoveEvalDropout", "SdpaBackendToAttention",
                                          "MathSdpaToAttention", "InPlaceBinaryOnFreshValue",
                                          "ReshapeAsToReshape")))
    target = prop_def(StringAttr)
    args = prop_def(ArrayAttr)
    kwargs = prop_def(DictionaryAttr)
    unpack = opt_prop_def(UnitAttr)
    inputs = var_operand_def(AnyAttr())
    outputs = var_result_def(AnyAttr())
    assembly_format = (
        "$target `(` $inputs `)` $args $kwargs (`unpack` $unpack^)? attr-dict "
        "`:` functional-type($inputs, $outputs)"
    )

    def verify_(self) -> None:
        refs = _collect_refs(self.args) + _collect_refs(self.kwargs)
        for r in refs:
            if not 0 <= r < len(self.inputs):
                raise VerifyException(
                    f"ad.torch_op '{self.target.data}' refers to operand #{r} but has "
                    f"{len(self.inputs)} operands"
                )
        if sorted(set(refs)) != list(range(len(self.inputs))):
            raise VerifyException(
                f"ad.torch_op '{self.target.data}': every operand must be referenced by "
                "#ad.ref in args or kwargs"
            )


def _collect_refs(attr: Attribute) -> list[int]:
    if isinstance(attr, OperandRefAttr):
        return [attr.index.data]
    if isinstance(attr, ArrayAttr):
        return [r for a in attr.data for r in _collect_refs(a)]
    if isinstance(attr, DictionaryAttr):
        return [r for a in attr.data.values() for r in _collect_refs(a)]
    return []


LINEAR_OPS = LinearOp | LinearFp8BlockOp | LinearFp8Op | LinearNvfp4Op | LinearInt4Op
"""The linear layers: float, and the quantized ones of checkpoints (what `fuse-gemms` merges and
`shard` splits)."""


Ad = Dialect(
    "ad",
    [
        NegOp, AbsOp, ExpOp, LogOp, SqrtOp, RsqrtOp, ReciprocalOp, SinOp, CosOp, TanhOp,
        ErfOp, SigmoidOp, SiluOp, ReluOp, LogicalNotOp, BitwiseNotOp, GeluOp, CastOp,
        AddOp, SubOp, MulOp, DivOp, PowOp, MaximumOp, MinimumOp, BitwiseAndOp, BitwiseOrOp,
        LogicalAndOp, LogicalOrOp, EqOp, NeOp, LtOp, LeOp, GtOp, GeOp, WhereOp,
        SumOp, MeanOp, AmaxOp, AminOp, SoftmaxOp,
        ReshapeOp, ExpandOp, PermuteOp, TransposeOp, UnsqueezeOp, SqueezeOp, SliceOp,
        CatOp, SplitOp, AliasOp, CloneOp,
        LinearOp, MmOp, BmmOp, MatmulOp, AddmmOp, EmbeddingOp, AttentionOp,
        RmsNormOp, AddRmsNormOp, SiluAndMulOp, RopeAttentionOp, RopeOp, CachedAttentionOp, CachedCausalConv1dOp, CachedTokenWindowOp, QuantizeFp8Op, QuantizeFp8DynamicOp, DequantizeFp8Op, LinearFp8Op,
        LinearFp8BlockOp,
        LinearNvfp4Op,
        LinearInt4Op,
        LayerNormOp, AddLayerNormOp, MoeOp,
        MoeMxfp4Op,
        MoeFp8BlockOp,
        GeluAndMulOp, ActivationOp,
        CachedSsmScanOp, CachedGatedDeltaRuleOp, CachedMlaAttentionOp, CachedIndexTopkOp,
        CachedSelectiveScanOp,
        CachedRgLruOp,
        CachedWkvOp,
        AllReduceOp, WaitTensorOp,
        FusedOp, YieldOp, ConstantOp, ArangeOp, FullOp, SymSizeOp, TorchOp,
    ],
    [OperandRefAttr, TorchValueAttr],
)

"""The one table between PyTorch and the `ad` dialect.

Each `ad` op has an `OpSpec`: the ATen overloads it stands for. The op's operand and
property names are those overloads' schema argument names (`self` is spelled `input`,
other renames are per overload), so the mapping is generic:

- tensor / Scalar / SymInt arguments are operands (Python scalars become `ad.constant`);
- `SymInt[]` arguments are a variadic `index` operand `X` plus a `static_X` property;
- other arguments are properties, stored only where they differ from the default;
- an argument the op does not hold must have its default value, or the node is carried
  by `ad.torch_op` instead (an argument is never dropped).

The importer (`fx_import`), the exporter (`fx_export`) and the reference evaluator
(`semantics/reference.py`) all go through `bind_node` / `build_call` below.
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    BFloat16Type,
    ComplexType,
    DenseArrayBase,
    DictionaryAttr,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    NoneAttr,
    NoneType,
    Signedness,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, TypeAttribute
from xdsl.irdl import IRDLOperation, OptionalDef, VarOperandDef

from ad_mlir.dialects import ad
from ad_mlir.semantics import torch_ops

# ----------------------------------------------------------------------- dtypes

_DTYPES: tuple[tuple[torch.dtype, TypeAttribute], ...] = (
    (torch.float32, Float32Type()),
    (torch.float16, Float16Type()),
    (torch.bfloat16, BFloat16Type()),
    (torch.float8_e4m3fn, Float8E4M3FNType()),
    (torch.float64, Float64Type()),
    (torch.int64, IntegerType(64)),
    (torch.int32, IntegerType(32)),
    (torch.int16, IntegerType(16)),
    (torch.int8, IntegerType(8)),
    (torch.uint8, IntegerType(8, Signedness.UNSIGNED)),
    (torch.bool, IntegerType(1)),
    (torch.complex64, ComplexType(Float32Type())),
    (torch.complex128, ComplexType(Float64Type())),
)
_TO_MLIR = dict(_DTYPES)
_TO_TORCH = {t: d for d, t in _DTYPES}


def element_type(dtype: torch.dtype) -> TypeAttribute:
    if dtype not in _TO_MLIR:
        raise UnsupportedError(f"dtype {dtype} has no ad element type")
    return _TO_MLIR[dtype]


def torch_dtype(t: Attribute) -> torch.dtype:
    if isinstance(t, TensorType):
        t = t.element_type
    if t not in _TO_TORCH:
        raise UnsupportedError(f"element type {t} has no torch dtype")
    return _TO_TORCH[t]


class UnsupportedError(Exception):
    """A node or value the typed ops cannot hold; the importer then uses `ad.torch_op`."""


# ------------------------------------------------------- Python values <-> attributes

_TORCH_ENUMS = {"layout": torch.layout, "memory_format": torch.memory_format}


def value_to_attr(value: Any, ref: Callable[[Any], int] | None = None) -> Attribute:
    """A non-tensor Python argument as an attribute (torch_op templates, properties).
    `ref` maps an FX node to its operand index (templates only)."""
    if ref is not None and isinstance(value, torch.fx.Node):
        return ad.OperandRefAttr(ref(value))
    match value:
        case bool():
            return IntegerAttr(int(value), IntegerType(1))
        case int():
            return IntegerAttr(value, i64)
        case float():
            return FloatAttr(value, Float64Type())
        case str():
            return StringAttr(value)
        case None:
            return NoneAttr()
        case list() | tuple():
            return ArrayAttr([value_to_attr(v, ref) for v in value])
        case dict():
            return DictionaryAttr({k: value_to_attr(v, ref) for k, v in value.items()})
        case torch.dtype():
            return _TO_MLIR.get(value) or ad.TorchValueAttr("dtype", str(value).removeprefix("torch."))
        case torch.device():
            return ad.TorchValueAttr("device", str(value))
        case torch.layout() | torch.memory_format():
            kind = "layout" if isinstance(value, torch.layout) else "memory_format"
            return ad.TorchValueAttr(kind, str(value).removeprefix("torch."))
    raise UnsupportedError(f"cannot carry argument {value!r} of type {type(value).__name__}")


def attr_to_value(attr: Attribute, operands: Sequence[Any] = ()) -> Any:
    """Inverse of `value_to_attr`; `#ad.ref<N>` becomes `operands[N]`."""
    match attr:
        case ad.OperandRefAttr():
            return operands[attr.index.data]
        case UnitAttr():
            return True
        case IntegerAttr():
            v = attr.value.data
            return bool(v) if attr.type == IntegerType(1) else v
        case FloatAttr():
            return attr.value.data
        case StringAttr():
            return attr.data
        case NoneAttr() | NoneType():  # `none` in IR text parses as the type, which prints the same
            return None
        case DenseArrayBase():
            return list(attr.get_values())
        case ArrayAttr():
            return [attr_to_value(a, operands) for a in attr.data]
        case DictionaryAttr():
            return {k: attr_to_value(a, operands) for k, a in attr.data.items()}
        case ad.TorchValueAttr():
            kind, text = attr.kind.data, attr.value.data
            if kind == "device":
                return torch.device(text)
            if kind == "dtype":
                return getattr(torch, text)
            value = getattr(torch, text)
            assert isinstance(value, _TORCH_ENUMS[kind])
            return value
    if attr in _TO_TORCH:
        return _TO_TORCH[attr]
    raise UnsupportedError(f"attribute {attr} has no Python value")


def value_to_property(value: Any) -> Attribute:
    """Like `value_to_attr`, in the forms the typed ops' properties use."""
    if value is True:
        return UnitAttr()
    if isinstance(value, list | tuple) and all(type(v) is int for v in value):
        return DenseArrayBase.from_list(i64, list(value))
    return value_to_attr(value)


# ------------------------------------------------------------------- schemas


def resolve_target(name: str) -> Callable[..., Any]:
    """`aten.add.Tensor` -> torch.ops.aten.add.Tensor; `operator.mul` -> operator.mul."""
    parts = name.split(".")
    if len(parts) == 3 and hasattr(torch.ops, parts[0]):
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if target in (operator.getitem,):
        return "operator.getitem"
    return torch.fx.node._get_qualified_name(target)


def _is_tensor_type(t: torch._C.JitType) -> bool:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch._C.TensorType)


@dataclass(frozen=True)
class Overload:
    """One ATen overload an `ad` op stands for; `renames` maps schema names to op field
    names; `to_fields` / `from_fields` adjust the bound arguments both ways where the op
    holds them differently (they must be inverse on what the op can represent)."""

    target: str
    renames: Mapping[str, str] = field(default_factory=dict)
    to_fields: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    from_fields: Callable[[dict[str, Any], Operation], dict[str, Any]] | None = None
    exportable: bool = True
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """Required arguments the op only holds at one value (`_softmax`'s half_to_float)."""

    @property
    def op(self) -> torch._ops.OpOverload:
        return resolve_target(self.target)

    @property
    def schema(self) -> torch._C.FunctionSchema:
        return self.op._schema

    def field_name(self, arg_name: str) -> str:
        return self.renames.get(arg_name, "input" if arg_name == "self" else arg_name)


@dataclass(frozen=True)
class OpSpec:
    op: type[IRDLOperation]
    overloads: tuple[Overload, ...]
    derived_dtype: str | None = None
    """A `ScalarType` argument that always equals the result dtype (not stored)."""


_ENUM_DEFAULTS = {
    "MemoryFormat": (torch.contiguous_format, torch.preserve_format, torch.channels_last, torch.channels_last_3d),
    "Layout": (torch.strided,),
}


def schema_default(a: torch._C.Argument) -> Any:
    """The default as torch passes it (schemas store enum defaults as ints)."""
    value = a.default_value
    t = a.real_type
    t = t.getElementType() if isinstance(t, torch._C.OptionalType) else t
    if isinstance(value, int) and str(t) in _ENUM_DEFAULTS:
        return _ENUM_DEFAULTS[str(t)][value]
    return value


def bound_arguments(target: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A call of `target` ("aten.layer_norm.default"): its arguments by schema name, defaults
    filled in (e.g. to read an `ad.torch_op`'s arguments; raises UnsupportedError)."""
    return _bind(resolve_target(target)._schema, args, kwargs)


def _bind(schema: torch._C.FunctionSchema, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    bound: dict[str, Any] = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise UnsupportedError(f"too many arguments for {schema.name}")
    for a, v in zip(positional, args, strict=False):
        bound[a.name] = v
    for a in schema.arguments:
        if a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.name not in bound:
            if not a.has_default_value():
                raise UnsupportedError(f"{schema.name}: missing argument '{a.name}'")
            bound[a.name] = schema_default(a)
    return bound


# ---------------------------------------------------------------- the table


def _slice_in(f: dict[str, Any], _: Any) -> dict[str, Any]:
    """None bounds mean 0 and "to the end" (torch clamps INT64_MAX to the size)."""
    s, e = f.pop("start"), f.pop("end")
    f["bounds"] = [0 if s is None else s, torch.iinfo(torch.int64).max if e is None else e, f.pop("step")]
    return f


def _slice_out(f: dict[str, Any], _: Operation) -> dict[str, Any]:
    f["start"], f["end"], f["step"] = f.pop("bounds")
    return f


def _arange_in(f: dict[str, Any], _: Any) -> dict[str, Any]:
    return {"start": 0, "step": 1, **f}


def _squeeze_dim_in(f: dict[str, Any], _: Any) -> dict[str, Any]:
    f["dim"] = [f["dim"]]
    return f


def _type_as_in(f: dict[str, Any], _: Any) -> dict[str, Any]:
    f.pop("other")
    return f


def _square_in(f: dict[str, Any], node: Any) -> dict[str, Any]:
    """`square(x)` is `x * x`, except for bool (square promotes it to int64, mul does not)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if val is not None and val.dtype == torch.bool:
        raise UnsupportedError("square of a bool tensor promotes; carried as is")
    f["other"] = f["input"]
    return f


_REVERSED = {"self": "other", "other": "input"}
"""`rsub(self, other, alpha)` is `other - alpha * self`: `sub` with the operands swapped."""

_SPELLINGS: dict[type[Operation], tuple[Overload, ...]] = {
    ad.SubOp: (
        Overload("aten.rsub.Scalar", _REVERSED),
        Overload("aten.rsub.Tensor", _REVERSED, exportable=False),
        *(Overload(f"aten.subtract.{o}", exportable=False) for o in ("Tensor", "Scalar")),
    ),
    ad.MulOp: (
        Overload("aten.square.default", to_fields=_square_in, exportable=False),
        *(Overload(f"aten.multiply.{o}", exportable=False) for o in ("Tensor", "Scalar")),
    ),
    ad.DivOp: tuple(Overload(f"aten.divide.{o}", exportable=False) for o in ("Tensor", "Scalar")),
}
"""Other ATen spellings of the generic binary ops (a scalar-first `sub` exports as `rsub`;
`torch.multiply`, `subtract` and `divide` export as themselves, Gemma 3n's `torch.multiply`)."""


def _to_same_device_in(f: dict[str, Any], node: Any) -> dict[str, Any]:
    """`x.to(dtype=d, layout=strided, device=<x's device>)` is a dtype cast."""
    src = node.args[0].meta.get("val") if isinstance(node, torch.fx.Node) else None
    if f.get("layout") in (None, torch.strided):
        f.pop("layout", None)
    if src is not None and f.get("device") is not None and torch.device(f["device"]) == src.device:
        f.pop("device")
    return f


SPECS: tuple[OpSpec, ...] = (
    *(
        OpSpec(cls, (Overload(f"aten.{name}.default"),))
        for cls, name in (
            (ad.NegOp, "neg"), (ad.AbsOp, "abs"), (ad.ExpOp, "exp"), (ad.LogOp, "log"),
            (ad.SqrtOp, "sqrt"), (ad.RsqrtOp, "rsqrt"), (ad.ReciprocalOp, "reciprocal"),
            (ad.SinOp, "sin"), (ad.CosOp, "cos"), (ad.TanhOp, "tanh"), (ad.ErfOp, "erf"),
            (ad.SigmoidOp, "sigmoid"), (ad.SiluOp, "silu"), (ad.ReluOp, "relu"),
            (ad.LogicalNotOp, "logical_not"), (ad.BitwiseNotOp, "bitwise_not"), (ad.GeluOp, "gelu"),
        )
    ),
    OpSpec(
        ad.CastOp,
        (
            Overload("aten._to_copy.default", to_fields=_to_same_device_in),
            Overload("aten.to.dtype", exportable=False),
            Overload("prims.convert_element_type.default", {"a": "input"}, exportable=False),
            Overload("aten.to.dtype_layout", to_fields=_to_same_device_in, exportable=False),
            Overload("aten.type_as.default", to_fields=_type_as_in, exportable=False),
        ),
        derived_dtype="dtype",
    ),
    *(
        OpSpec(cls, tuple(Overload(f"aten.{name}.{o}", renames) for o in overloads) + _SPELLINGS.get(cls, ()))
        for cls, name, overloads, renames in (
            (ad.AddOp, "add", ("Tensor", "Scalar"), {}),
            (ad.SubOp, "sub", ("Tensor", "Scalar"), {}),
            (ad.MulOp, "mul", ("Tensor", "Scalar"), {}),
            (ad.DivOp, "div", ("Tensor", "Scalar", "Tensor_mode", "Scalar_mode"), {}),
            (ad.PowOp, "pow", ("Tensor_Tensor", "Tensor_Scalar", "Scalar"), {"exponent": "other"}),
            (ad.MaximumOp, "maximum", ("default",), {}),
            (ad.MinimumOp, "minimum", ("default",), {}),
            (ad.LogicalAndOp, "logical_and", ("default",), {}),
            (ad.LogicalOrOp, "logical_or", ("default",), {}),
            (ad.EqOp, "eq", ("Tensor", "Scalar"), {}),
            (ad.NeOp, "ne", ("Tensor", "Scalar"), {}),
            (ad.LtOp, "lt", ("Tensor", "Scalar"), {}),
            (ad.LeOp, "le", ("Tensor", "Scalar"), {}),
            (ad.GtOp, "gt", ("Tensor", "Scalar"), {}),
            (ad.GeOp, "ge", ("Tensor", "Scalar"), {}),
            (ad.WhereOp, "where", ("self", "ScalarOther", "ScalarSelf", "Scalar"), {}),
        )
    ),
    *(
        OpSpec(
            cls,
            (
                Overload(f"aten.{name}.Tensor"),
                Overload(f"aten.{name}.Scalar"),
                Overload(f"aten.__{short}__.Tensor", exportable=False),
                Overload(f"aten.__{short}__.Scalar", exportable=False),
            ),
        )
        for cls, name, short in ((ad.BitwiseAndOp, "bitwise_and", "and"), (ad.BitwiseOrOp, "bitwise_or", "or"))
    ),
    OpSpec(ad.SumOp, (Overload("aten.sum.dim_IntList"),)),
    OpSpec(ad.MeanOp, (Overload("aten.mean.dim"),)),
    OpSpec(ad.AmaxOp, (Overload("aten.amax.default"),)),
    OpSpec(ad.AminOp, (Overload("aten.amin.default"),)),
    OpSpec(
        ad.SoftmaxOp,
        (
            Overload("aten._softmax.default", fixed={"half_to_float": False}),
            Overload("aten.softmax.int"),
        ),
    ),
    OpSpec(
        ad.ReshapeOp,
        (
            Overload("aten.reshape.default", {"shape": "sizes"}),
            Overload("aten.view.default", {"size": "sizes"}, exportable=False),
            Overload("aten._unsafe_view.default", {"size": "sizes"}, exportable=False),
        ),
    ),
    OpSpec(ad.ExpandOp, (Overload("aten.expand.default", {"size": "sizes"}),)),
    OpSpec(ad.PermuteOp, (Overload("aten.permute.default"),)),
    OpSpec(ad.TransposeOp, (Overload("aten.transpose.int"),)),
    OpSpec(ad.UnsqueezeOp, (Overload("aten.unsqueeze.default"),)),
    OpSpec(
        ad.SqueezeOp,
        (
            Overload("aten.squeeze.dims"),
            Overload("aten.squeeze.dim", to_fields=_squeeze_dim_in, exportable=False),
        ),
    ),
    OpSpec(ad.SliceOp, (Overload("aten.slice.Tensor", to_fields=_slice_in, from_fields=_slice_out),)),
    OpSpec(ad.CatOp, (Overload("aten.cat.default"),)),
    OpSpec(ad.SplitOp, (Overload("aten.split_with_sizes.default"),)),
    OpSpec(ad.AliasOp, (Overload("aten.alias.default"),)),
    OpSpec(
        ad.CloneOp,
        (Overload("aten.clone.default"), Overload("aten.contiguous.default", exportable=False)),
    ),
    OpSpec(ad.LinearOp, (Overload("aten.linear.default"),)),
    OpSpec(ad.MmOp, (Overload("aten.mm.default"),)),
    OpSpec(ad.BmmOp, (Overload("aten.bmm.default"),)),
    OpSpec(ad.MatmulOp, (Overload("aten.matmul.default"),)),
    OpSpec(ad.AddmmOp, (Overload("aten.addmm.default"),)),
    OpSpec(ad.EmbeddingOp, (Overload("aten.embedding.default"),)),
    OpSpec(ad.AttentionOp, (Overload("aten.scaled_dot_product_attention.default"),)),
    *(
        OpSpec(cls, (Overload(f"{torch_ops.NAMESPACE}.{cls.name.removeprefix('ad.')}.default"),))
        for cls in (
            ad.RmsNormOp, ad.AddRmsNormOp, ad.SiluAndMulOp, ad.RopeAttentionOp, ad.RopeOp, ad.CachedAttentionOp,
            ad.CachedCausalConv1dOp, ad.CachedTokenWindowOp,
            ad.CachedSsmScanOp, ad.CachedGatedDeltaRuleOp, ad.CachedMlaAttentionOp, ad.CachedIndexTopkOp,
            ad.CachedSelectiveScanOp,
            ad.CachedRgLruOp,
            ad.CachedWkvOp,
            ad.QuantizeFp8Op, ad.QuantizeFp8DynamicOp,
            ad.GeluAndMulOp, ad.ActivationOp,
        )
    ),
    OpSpec(ad.LayerNormOp, (Overload(f"{torch_ops.NAMESPACE}.layer_norm.default"),)),
    OpSpec(ad.AddLayerNormOp, (Overload(f"{torch_ops.NAMESPACE}.add_layer_norm.default"),)),
    OpSpec(ad.MoeOp, (Overload(f"{torch_ops.NAMESPACE}.moe.default"),)),
    OpSpec(ad.MoeMxfp4Op, (Overload(f"{torch_ops.NAMESPACE}.moe_mxfp4.default"),)),
    OpSpec(ad.MoeFp8BlockOp, (Overload(f"{torch_ops.NAMESPACE}.moe_fp8_block.default"),)),
    OpSpec(ad.AllReduceOp, (Overload("_c10d_functional.all_reduce.default"),)),
    OpSpec(ad.WaitTensorOp, (Overload("_c10d_functional.wait_tensor.default", {"tensor": "input"}),)),
    OpSpec(ad.DequantizeFp8Op, (Overload(f"{torch_ops.NAMESPACE}.dequantize_fp8.default"),), derived_dtype="dtype"),
    OpSpec(ad.LinearFp8Op, (Overload(f"{torch_ops.NAMESPACE}.linear_fp8.default"),), derived_dtype="dtype"),
    OpSpec(ad.LinearFp8BlockOp, (Overload(f"{torch_ops.NAMESPACE}.linear_fp8_block.default"),)),
    OpSpec(ad.LinearNvfp4Op, (Overload(f"{torch_ops.NAMESPACE}.linear_nvfp4.default"),)),
    OpSpec(ad.LinearInt4Op, (Overload(f"{torch_ops.NAMESPACE}.linear_int4.default"),)),
    OpSpec(
        ad.ArangeOp,
        (
            Overload("aten.arange.start_step"),
            Overload("aten.arange.default", to_fields=_arange_in, exportable=False),
            Overload("aten.arange.start", to_fields=lambda f, _: {"step": 1, **f}, exportable=False),
        ),
        derived_dtype="dtype",
    ),
    OpSpec(ad.FullOp, (Overload("aten.full.default"),), derived_dtype="dtype"),
    OpSpec(ad.SymSizeOp, (Overload("aten.sym_size.int"),)),
)

SPEC_BY_OP: dict[type[Operation], OpSpec] = {s.op: s for s in SPECS}
assert len(SPEC_BY_OP) == len(SPECS), "one OpSpec per ad op"
"""`ad` op class -> its spec (export and reference semantics)."""

OVERLOAD_BY_TARGET: dict[str, tuple[OpSpec, Overload]] = {
    o.target: (s, o) for s in SPECS for o in s.overloads
}
"""FX target name -> (spec, overload) (import)."""


# ------------------------------------------------------------- op field access


def _operand_defs(op_cls: type[IRDLOperation]) -> dict[str, Any]:
    return dict(op_cls.get_irdl_definition().operands)


def _property_defs(op_cls: type[IRDLOperation]) -> dict[str, Any]:
    return dict(op_cls.get_irdl_definition().properties)


@dataclass
class FieldValues:
    """An op's fields before it is built: operands (values or lists of values) and
    properties, keyed by field name."""

    operands: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Attribute] = field(default_factory=dict)


def fields_from_arguments(
    spec: OpSpec,
    overload: Overload,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    result_dtype: torch.dtype | None,
    node: Any = None,
) -> dict[str, Any]:
    """Bind an FX call's arguments to the op's field names (raises UnsupportedError when
    an argument the op does not hold has a non-default value)."""
    bound = _bind(overload.schema, args, kwargs)
    defaults = {a.name: schema_default(a) for a in overload.schema.arguments if a.has_default_value()}
    defaults.update(overload.fixed)
    fields = {overload.field_name(k): v for k, v in bound.items()}
    if overload.to_fields is not None:
        fields = overload.to_fields(fields, node)
    if spec.derived_dtype is not None:
        dtype = fields.pop(spec.derived_dtype, None)
        if dtype is not None and dtype != result_dtype:
            raise UnsupportedError(f"dtype argument {dtype} differs from result {result_dtype}")
    known = set(_operand_defs(spec.op)) | set(_property_defs(spec.op))
    for name in list(fields):
        if name in known:
            continue
        schema_name = next((k for k in bound if overload.field_name(k) == name), name)
        if fields[name] != defaults.get(schema_name, object()):
            raise UnsupportedError(f"{overload.target}: argument '{name}'={fields[name]!r} is not held by {spec.op.name}")
        del fields[name]
    return fields


def canonical_defaults(spec: OpSpec) -> dict[str, Any]:
    """Field name -> default value, from the first exportable overload."""
    o = spec.overloads[0]
    return {o.field_name(a.name): schema_default(a) for a in o.schema.arguments if a.has_default_value()}


def build_call(op: Operation, operand_values: Sequence[Any]) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The torch call that computes `op`, given a value per operand (tensors, Python
    scalars, or FX nodes when exporting). Shared by the exporter and the evaluator."""
    if isinstance(op, ad.TorchOp):
        args = attr_to_value(op.args, operand_values)
        kwargs = attr_to_value(op.kwargs, operand_values)
        return resolve_target(op.target.data), tuple(args), kwargs
    if isinstance(op, ad.ConstantOp):
        raise ValueError("ad.constant is a value, not a call")
    spec = SPEC_BY_OP[type(op)]
    fields = _op_fields(op, operand_values)
    kinds = {name: _operand_is_tensor(op, name) for name in _operand_defs(type(op))}
    for overload in spec.overloads:
        if overload.exportable and _accepts(overload, kinds, fields):
            return _call_for(overload, spec, op, dict(fields))
    raise UnsupportedError(f"no overload of {op.name} takes operands {kinds}")


def _operand_is_tensor(op: Operation, name: str) -> bool | None:
    v = getattr(op, name)
    if v is None or isinstance(v, Sequence):
        return None
    return isinstance(v.type, TensorType)


def _accepts(overload: Overload, kinds: Mapping[str, bool | None], fields: Mapping[str, Any]) -> bool:
    """Whether `overload` takes the op's operands (tensor vs scalar) and holds all its
    properties (e.g. softmax with a dtype needs `softmax.int`)."""
    held = {overload.field_name(a.name) for a in overload.schema.arguments}
    if overload.from_fields is None and not set(fields) <= held:
        return False
    for a in overload.schema.arguments:
        kind = kinds.get(overload.field_name(a.name))
        if kind is not None and kind != _is_tensor_type(a.type):
            return False
    return True


def _op_fields(op: Operation, operand_values: Sequence[Any]) -> dict[str, Any]:
    """Field name -> Python value (or FX node), for every operand and property held."""
    values_of = dict(zip(op.operands, operand_values, strict=True))
    fields: dict[str, Any] = {}
    props = _property_defs(type(op))
    for name, odef in _operand_defs(type(op)).items():
        v = getattr(op, name)
        static = f"static_{name}"
        if static in props:
            it = iter(values_of[x] for x in v)
            fields[name] = [next(it) if s == DYNAMIC_INDEX else s for s in getattr(op, static).get_values()]
        elif isinstance(odef, OptionalDef):
            fields[name] = None if v is None else values_of[v]
        elif isinstance(odef, VarOperandDef):
            fields[name] = [values_of[x] for x in v]
        else:
            fields[name] = values_of[v]
    for name in props:
        if name.startswith("static_") or name == "operandSegmentSizes":
            continue
        attr = getattr(op, name)
        if attr is not None:
            fields[name] = attr_to_value(attr)
    return fields


def _call_for(overload: Overload, spec: OpSpec, op: Operation, fields: dict[str, Any]):
    if overload.from_fields is not None:
        fields = overload.from_fields(fields, op)
    if spec.derived_dtype is not None:
        fields[spec.derived_dtype] = torch_dtype(op.results[0].type)
    fields.update(overload.fixed)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for a in overload.schema.arguments:
        name = overload.field_name(a.name)
        if name not in fields:
            if isinstance(a.type, torch._C.OptionalType) and not a.kwarg_only and not a.has_default_value():
                fields[name] = None
            elif not a.has_default_value():
                raise UnsupportedError(f"{op.name}: no value for '{a.name}' of {overload.target}")
            else:
                continue
        if a.kwarg_only:
            kwargs[a.name] = fields[name]
        else:
            while len(args) < _positional_index(overload, a.name):
                args.append(_default_of(overload, len(args)))
            args.append(fields[name])
    return overload.op, tuple(args), kwargs


def _positional_index(overload: Overload, name: str) -> int:
    return [a.name for a in overload.schema.arguments if not a.kwarg_only].index(name)


def _default_of(overload: Overload, index: int) -> Any:
    return schema_default([a for a in overload.schema.arguments if not a.kwarg_only][index])


def is_python_scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float)


def scalar_type(value: Any) -> Attribute:
    """The `ad` type of a Python scalar argument."""
    if isinstance(value, bool):
        return IntegerType(1)
    if isinstance(value, int):
        return i64
    return Float64Type()


def constant_attr(value: bool | int | float, type_: Attribute | None = None) -> IntegerAttr | FloatAttr:
    t = type_ or scalar_type(value)
    if isinstance(t, Float64Type):
        return FloatAttr(float(value), t)
    return IntegerAttr(int(value), t)


def property_attrs(spec: OpSpec, fields: Mapping[str, Any]) -> dict[str, Attribute]:
    """Properties for the fields that are not operands; defaults are left out, except where the
    op requires the property (ad.slice's `dim`, whose default is 0)."""
    defaults = canonical_defaults(spec)
    props = _property_defs(spec.op)
    out: dict[str, Attribute] = {}
    for name, value in fields.items():
        if name not in props:
            continue
        if value is None or (name in defaults and _same_value(value, defaults[name]) and is_optional(props[name])):
            continue
        if value is False and defaults.get(name, False) is None:
            continue  # `bool? x=None`: False and None mean the same (pin_memory)
        if value is False:
            raise UnsupportedError(f"{spec.op.name}: '{name}=False' differs from its default")
        out[name] = value_to_property(value)
    return out


def is_optional(odef: Any) -> bool:
    return isinstance(odef, OptionalDef)


def operand_fields(op_cls: type[IRDLOperation]) -> list[tuple[str, Any]]:
    return list(_operand_defs(op_cls).items())


def is_mixed_list(op_cls: type[IRDLOperation], name: str) -> bool:
    return f"static_{name}" in _property_defs(op_cls)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) == list(b)
    return type(a) is type(b) and a == b or (a is None and b is None)

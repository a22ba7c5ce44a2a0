"""FX GraphModule / ExportedProgram -> `builtin.module` with one `func.func @forward`.

Weights (parameters, buffers, tensor constants) become function arguments carrying
their FQN (`ad.param` / `ad.buffer` / `ad.constant_tensor`); user inputs carry
`ad.input`. Each op's location is the HF module path from `nn_module_stack`.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DictionaryAttr,
    Float64Type,
    FunctionType,
    IndexType,
    IntegerType,
    ModuleOp,
    NameLoc,
    NoneAttr,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.utils.exceptions import VerifyException

from ad_mlir.dialects import ad
from ad_mlir.frontends import op_table as T

log = logging.getLogger(__name__)

WEIGHT_ATTRS = {
    InputKind.PARAMETER: ad.PARAM_ATTR,
    InputKind.BUFFER: ad.BUFFER_ATTR,
    InputKind.CONSTANT_TENSOR: ad.CONSTANT_TENSOR_ATTR,
}
INPUT_ATTR = ad.INPUT_ATTR


def weight_of(arg_attrs: DictionaryAttr) -> tuple[str, str] | None:
    """(attribute name, FQN) of a weight argument, None for a user input."""
    for name in WEIGHT_ATTRS.values():
        if name in arg_attrs.data:
            return name, arg_attrs.data[name].data
    return None


@dataclass(frozen=True)
class Rank:
    """Which tensor-parallel rank a graph is built or run for."""

    rank: int = 0
    world_size: int = 1


SINGLE_RANK = Rank()
"""No tensor parallelism."""


class ShardError(ValueError):
    """A sharded weight argument whose shard does not fit the weight and the world size."""


def rank_weight(tensor: torch.Tensor, arg_type: Attribute, arg_attrs: DictionaryAttr, rank: Rank) -> torch.Tensor:
    """The value of a weight argument on `rank`: the weight itself, or for a shard
    (`ad.shard_dim`) the rank's contiguous slice of the argument's local size."""
    if ad.SHARD_DIM_ATTR not in arg_attrs.data:
        return tensor
    dim = arg_attrs.data[ad.SHARD_DIM_ATTR].value.data
    local = arg_type.get_shape()[dim]
    if tensor.shape[dim] != local * rank.world_size:
        fqn = weight_of(arg_attrs)[1]
        raise ShardError(
            f"weight '{fqn}' has {tensor.shape[dim]} along dim {dim}, but its shard of {local} on each of "
            f"{rank.world_size} ranks covers {local * rank.world_size}"
        )
    return tensor.narrow(dim, rank.rank * local, local).contiguous()


INLINED_HIGHER_ORDER_OPS = ("higher_order.wrap_with_set_grad_enabled",)
"""Grad mode does not change inference values, so these are inlined."""


class ImportError_(Exception):
    """A graph the importer cannot take (the message names the node and why)."""


@dataclass
class ImportedProgram:
    """The `ad` module and the weights its function arguments name."""

    module: ModuleOp
    weights: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def function(self) -> func.FuncOp:
        return next(op for op in self.module.ops if isinstance(op, func.FuncOp))


def import_program(
    program: ExportedProgram | torch.fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
) -> ImportedProgram:
    """Import an ExportedProgram, or a GraphModule whose nodes have `meta["val"]`
    (else `example_inputs` are propagated through it as fake tensors)."""
    if isinstance(program, ExportedProgram):
        return _Importer().run_exported(program)
    if not isinstance(program, torch.fx.GraphModule):
        raise TypeError(f"expected an ExportedProgram or GraphModule, got {type(program).__name__}")
    if any("val" not in n.meta for n in program.graph.nodes if n.op in ("placeholder", "call_function")):
        if example_inputs is None:
            raise ImportError_(
                "the GraphModule has no meta['val'] shapes: pass example_inputs, or use torch.export"
            )
        _propagate_fake(program, example_inputs)
    return _Importer().run_graph_module(program)


def _propagate_fake(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs])
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            n.meta.setdefault("val", operator.attrgetter(n.target)(gm))


# ------------------------------------------------------------------------ types


def _dim(d: Any) -> int:
    if isinstance(d, int):
        return d
    expr = d.node.expr
    return int(expr) if expr.is_number else DYNAMIC_INDEX


def type_of(val: Any) -> Attribute:
    if isinstance(val, torch.Tensor):
        return TensorType(T.element_type(val.dtype), [_dim(d) for d in val.shape])
    if isinstance(val, torch.SymBool | bool):
        return IntegerType(1)
    if isinstance(val, torch.SymInt | int):
        return IndexType()
    if isinstance(val, torch.SymFloat | float):
        return Float64Type()
    raise T.UnsupportedError(f"no ad type for value {val!r}")


def result_types(node: torch.fx.Node) -> tuple[list[Attribute], bool]:
    """(types, unpack): a sequence-valued node has one result per item."""
    val = node.meta.get("val")
    if val is None:
        return [], False
    if isinstance(val, list | tuple):
        return [type_of(v) for v in val], True
    return [type_of(val)], False


def location_of(node: torch.fx.Node) -> Attribute | None:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for key, (path, _) in stack.items() if not key.startswith("_empty")]
    return NameLoc(StringAttr(paths[-1]), NoneAttr()) if paths and paths[-1] else None


# --------------------------------------------------------------------- importer


class _Importer:
    def __init__(self) -> None:
        self.values: dict[torch.fx.Node, SSAValue | list[SSAValue]] = {}
        self.block = Block()
        self.arg_attrs: list[DictionaryAttr] = []
        self.weights: dict[str, torch.Tensor] = {}

    # entry points ---------------------------------------------------------------

    def run_exported(self, ep: ExportedProgram) -> ImportedProgram:
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        for node in ep.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                self._add_argument(node, {INPUT_ATTR: StringAttr(node.name)})
            elif spec.kind in WEIGHT_ATTRS:
                attr = WEIGHT_ATTRS[spec.kind]
                source = ep.constants if spec.target in ep.constants else ep.state_dict
                if spec.kind == InputKind.BUFFER and spec.persistent is False:
                    source = ep.constants
                self.weights[spec.target] = source[spec.target]
                self._add_argument(node, {attr: StringAttr(spec.target)})
            else:
                raise ImportError_(f"input '{node.name}' of kind {spec.kind.name} is not supported")
        return self._finish(ep.graph)

    def run_graph_module(self, gm: torch.fx.GraphModule) -> ImportedProgram:
        buffers = dict(gm.named_buffers())
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = operator.attrgetter(node.target)(gm)
                if not isinstance(value, torch.Tensor):
                    raise ImportError_(f"get_attr '{node.target}' is a {type(value).__name__}, not a tensor")
                kind = InputKind.PARAMETER if isinstance(value, torch.nn.Parameter) else (
                    InputKind.BUFFER if node.target in buffers else InputKind.CONSTANT_TENSOR
                )
                node.meta.setdefault("val", value)
                self.weights[node.target] = value
                self._add_argument(node, {WEIGHT_ATTRS[kind]: StringAttr(node.target)})
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self._add_argument(node, {INPUT_ATTR: StringAttr(node.name)})
        return self._finish(gm.graph, submodules=gm)

    # graph walk -----------------------------------------------------------------

    def _finish(self, graph: torch.fx.Graph, submodules: torch.nn.Module | None = None) -> ImportedProgram:
        owner = submodules or graph.owning_module
        outputs = self._import_nodes(graph, owner)
        self.block.add_op(func.ReturnOp(*outputs))
        fn = func.FuncOp(
            "forward",
            FunctionType.from_lists([a.type for a in self.block.args], [v.type for v in outputs]),
            Region(self.block),
            arg_attrs=ArrayAttr(self.arg_attrs),
        )
        module = ModuleOp([fn])
        try:
            module.verify()
        except VerifyException as e:
            raise ImportError_(f"imported IR does not verify: {e}") from e
        return ImportedProgram(module, self.weights)

    def _add_argument(self, node: torch.fx.Node, attrs: dict[str, Attribute]) -> None:
        arg = self.block.insert_arg(type_of(node.meta["val"]), len(self.block.args))
        arg.name_hint = _name_hint(node.name)
        self.values[node] = arg
        self.arg_attrs.append(DictionaryAttr(attrs))

    def _import_nodes(self, graph: torch.fx.Graph, owner: torch.nn.Module | None) -> list[SSAValue]:
        for node in graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                continue
            if node.op == "output":
                return [self._output_value(v) for v in torch.utils._pytree.tree_leaves(node.args[0])]
            if node.op != "call_function":
                raise ImportError_(
                    f"node '{node.name}': {node.op} nodes are not supported (use torch.export, "
                    "which produces only call_function nodes)"
                )
            self._import_call(node, owner)
        raise ImportError_("graph has no output node")

    def _output_value(self, v: Any) -> SSAValue:
        if not isinstance(v, torch.fx.Node) or not isinstance(self.values.get(v), SSAValue):
            raise ImportError_(f"graph output {v!r} is not a tensor or symbolic value")
        return self.values[v]

    def _import_call(self, node: torch.fx.Node, owner: torch.nn.Module | None) -> None:
        name = T.target_name(node.target)
        if name == "operator.getitem" and isinstance(self.values.get(node.args[0]), list):
            self.values[node] = self.values[node.args[0]][node.args[1]]
            return
        if name in INLINED_HIGHER_ORDER_OPS:
            self._inline_submodule(node, owner)
            return
        op: Operation | None = None
        if name in T.OVERLOAD_BY_TARGET:
            try:
                op = self._typed_op(node, *T.OVERLOAD_BY_TARGET[name])
            except (T.UnsupportedError, VerifyException) as e:
                log.debug("node %s (%s) kept as ad.torch_op: %s", node.name, name, e)
        if op is None:
            op = self._torch_op(node, name)
        if (loc := location_of(node)) is not None:
            op.location = loc
        self.block.add_op(op)
        _, unpack = result_types(node)
        self.values[node] = list(op.results) if unpack else (op.results[0] if op.results else None)
        for r in op.results:
            r.name_hint = _name_hint(node.name)

    def _inline_submodule(self, node: torch.fx.Node, owner: torch.nn.Module | None) -> None:
        _, sub_node, *args = node.args
        sub = getattr(owner, sub_node.target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for p, a in zip(placeholders, args, strict=True):
            self.values[p] = self.values[a]
        outputs = self._import_nodes(sub.graph, sub)
        self.values[node] = outputs

    # typed ops --------------------------------------------------------------------

    def _typed_op(self, node: torch.fx.Node, spec: T.OpSpec, overload: T.Overload) -> Operation:
        types, unpack = result_types(node)
        if not types:
            raise T.UnsupportedError("no result")
        result_dtype = node.meta["val"][0].dtype if unpack else getattr(node.meta["val"], "dtype", None)
        fields = T.fields_from_arguments(spec, overload, node.args, node.kwargs, result_dtype, node)
        operands: list[SSAValue | Sequence[SSAValue]] = []
        properties: dict[str, Attribute] = {}
        for name, odef in T.operand_fields(spec.op):
            value = fields.pop(name, None)
            if T.is_mixed_list(spec.op, name):
                static, dynamic = self._mixed_list(value)
                properties[f"static_{name}"] = static
                operands.append(dynamic)
            elif isinstance(value, list | tuple):
                operands.append([self._operand(v) for v in value])
            elif value is None:
                if not T.is_optional(odef):
                    raise T.UnsupportedError(f"'{name}' is None")
                operands.append([])
            else:
                operands.append(self._operand(value))
        properties.update(T.property_attrs(spec, fields))
        op = spec.op.build(
            operands=operands,
            result_types=[types] if unpack and _one_variadic_result(spec.op) else types,
            properties=properties,
        )
        op.verify()
        return op

    def _operand(self, value: Any) -> SSAValue:
        if isinstance(value, torch.fx.Node):
            v = self.values[value]
            if not isinstance(v, SSAValue):
                raise T.UnsupportedError(f"'{value.name}' is not a single value")
            return v
        if T.is_python_scalar(value):
            const = ad.ConstantOp(T.constant_attr(value))
            self.block.add_op(const)
            return const.result
        raise T.UnsupportedError(f"cannot use {value!r} as an operand")

    def _mixed_list(self, items: Sequence[Any]) -> tuple[Attribute, list[SSAValue]]:
        from xdsl.dialects.builtin import DenseArrayBase, i64

        static: list[int] = []
        dynamic: list[SSAValue] = []
        for item in items:
            if isinstance(item, torch.fx.Node):
                v = self._operand(item)
                if not isinstance(v.type, IndexType):
                    raise T.UnsupportedError(f"size '{item.name}' is not a SymInt")
                static.append(DYNAMIC_INDEX)
                dynamic.append(v)
            elif type(item) is int:
                static.append(item)
            else:
                raise T.UnsupportedError(f"size {item!r} is not an int or SymInt")
        return DenseArrayBase.from_list(i64, static), dynamic

    # opaque ops -------------------------------------------------------------------

    def _torch_op(self, node: torch.fx.Node, name: str) -> Operation:
        if name.startswith("higher_order."):
            raise ImportError_(
                f"node '{node.name}': higher-order op {name} is not supported "
                "(export under torch.no_grad() and without autocast)"
            )
        types, unpack = result_types(node)
        operands: list[SSAValue] = []
        index: dict[torch.fx.Node, int] = {}

        def ref(n: torch.fx.Node) -> int:
            if n not in index:
                index[n] = len(operands)
                operands.append(self._operand(n))
            return index[n]

        try:
            args = T.value_to_attr(list(node.args), ref)
            kwargs = T.value_to_attr(dict(node.kwargs), ref)
        except T.UnsupportedError as e:
            raise ImportError_(f"node '{node.name}' ({name}): {e}") from e
        properties: dict[str, Attribute] = {"target": StringAttr(name), "args": args, "kwargs": kwargs}
        if unpack:
            from xdsl.dialects.builtin import UnitAttr

            properties["unpack"] = UnitAttr()
        return ad.TorchOp.build(operands=[operands], result_types=[types], properties=properties)


def _one_variadic_result(op: type[Operation]) -> bool:
    """A sequence-valued node fills one variadic result (ad.split); else one result per item
    (ad.add_rms_norm's two)."""
    from xdsl.irdl import VarResultDef

    results = op.get_irdl_definition().results
    return len(results) == 1 and isinstance(results[0][1], VarResultDef)


def _name_hint(name: str) -> str:
    return name if name[:1].isalpha() or name[:1] == "_" else f"v{name}"

"""FX GraphModule / ExportedProgram -> `builtin.module` with one `func.func @forward`.

Weights (parameters, buffers, tensor constants) become function arguments carrying
their FQN (`ad.param` / `ad.buffer` / `ad.constant_tensor`); user inputs carry
`ad.input`. Each op's location is the HF module path from `nn_module_stack`.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export._unlift import GuardsFn
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
from ad_mlir.frontends.graph_sources import importable
from ad_mlir.frontends.input_checks import InputSpec, spec_of_value
from ad_mlir.semantics import op_table as T

log = logging.getLogger(__name__)

WEIGHT_ATTRS = {
    InputKind.PARAMETER: ad.PARAM_ATTR,
    InputKind.BUFFER: ad.BUFFER_ATTR,
    InputKind.CONSTANT_TENSOR: ad.CONSTANT_TENSOR_ATTR,
}
INPUT_ATTR = ad.INPUT_ATTR


class ImportError_(Exception):
    """A graph the importer cannot take (the message names the node and why)."""


@dataclass(frozen=True)
class Inlined:
    """How to inline a higher-order op: its subgraph's (first) index among the node's args and
    where its operands start."""

    subgraph: int
    operands: int


INLINED_HIGHER_ORDER_OPS = {
    # grad mode does not change inference values
    "torch.ops.higher_order.wrap_with_set_grad_enabled": Inlined(subgraph=1, operands=2),
    # (device_type, dtype, enabled, cache_enabled, subgraph, *operands): a no-op only when
    # disabled; an enabled one is refused here (the front door makes its casts explicit first)
    "torch.ops.higher_order.wrap_with_autocast": Inlined(subgraph=4, operands=5),
    # a subgraph called like a function
    "torch.ops.higher_order.invoke_subgraph": Inlined(subgraph=0, operands=2),
}
"""Higher-order ops whose subgraph is inlined where the node stands."""


@dataclass
class ImportedProgram:
    """The `ad` module and the weights its function arguments name."""

    module: ModuleOp
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    input_specs: dict[str, InputSpec] = field(default_factory=dict)
    """What each user input of the source graph was exported as (name -> spec, with the dynamic
    dims' ranges): the compiled graph's input checks."""

    @property
    def function(self) -> func.FuncOp:
        return next(op for op in self.module.ops if isinstance(op, func.FuncOp))


def import_program(
    program: ExportedProgram | torch.nn.Module,
    example_inputs: Sequence[Any] | Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
) -> ImportedProgram:
    """Import an ExportedProgram, `ep.module()`, an ATen-level GraphModule (`make_fx`, AOTAutograd)
    whose nodes have `meta["val"]` (else `example_inputs` are propagated through it as fake
    tensors), or an `nn.Module` / torch-level GraphModule (`symbolic_trace`), which is exported
    first with `example_inputs` and `dynamic_shapes` (`graph_sources.importable`)."""
    program = importable(program, example_inputs, dynamic_shapes)
    if isinstance(program, ExportedProgram):
        return _Importer().run_exported(program)
    if any("val" not in n.meta for n in program.graph.nodes if n.op in ("placeholder", "call_function")):
        if example_inputs is None:
            raise ImportError_(
                "the GraphModule has no meta['val'] shapes: pass example_inputs, or use torch.export"
            )
        if isinstance(example_inputs, Mapping):
            example_inputs = [example_inputs[n.target] for n in program.graph.find_nodes(op="placeholder")]
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


@functools.lru_cache(maxsize=4096)
def _tensor_type(dtype: torch.dtype, shape: tuple[int, ...]) -> TensorType:
    """Attributes are immutable, so values of one dtype and shape share one type, built and
    verified once (every node of a 32-layer Llama builds one: ~15% of its import otherwise)."""
    return TensorType(T.element_type(dtype), shape)


def type_of(val: Any) -> Attribute:
    if isinstance(val, torch.Tensor):
        return _tensor_type(val.dtype, tuple(_dim(d) for d in val.shape))
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


Relocation = Callable[[list[tuple[str, type]]], str]
"""The module path an inlined subgraph's op takes, from its module stack."""


def location_of(node: torch.fx.Node, relocate: Relocation | None = None) -> Attribute | None:
    """The op's module path (the innermost of `nn_module_stack`), as `relocate` renames it."""
    modules = _module_stack(node)
    if not modules:
        return None
    path = relocate(modules) if relocate is not None else modules[-1][0]
    return NameLoc(StringAttr(path), NoneAttr()) if path else None


def _module_stack(node: torch.fx.Node) -> list[tuple[str, type]]:
    """(path, class) of each module the op is in, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    return [(path, cls) for key, (path, cls) in stack.items() if not key.startswith("_empty")]


def _called_from(call: torch.fx.Node) -> Relocation | None:
    """For a subgraph `call` invokes (`invoke_subgraph`: Dynamo traces a `nested_compile_region`
    once, at its first call, and every call site calls that trace): its ops' module paths name
    the module of the first call (`model.layers.0.mlp`, under Dynamo's root for the region's
    arguments); inlined here, they are renamed into the module the call site is in
    (`model.layers.3.mlp`), which the op's stack holds as the same class. Else (a region that
    is not a module's method) they are left as they are."""
    site = _module_stack(call)
    if not site:
        return None
    call_path, call_class = site[-1]

    def relocate(modules: list[tuple[str, type]]) -> str:
        for traced_path, cls in modules:
            if cls is call_class:
                return call_path + modules[-1][0][len(traced_path):]
        return modules[-1][0]

    return relocate


# --------------------------------------------------------------------- importer


class _Importer:
    def __init__(self) -> None:
        self.values: dict[torch.fx.Node, SSAValue | list[SSAValue]] = {}
        self.block = Block()
        self.arg_attrs: list[DictionaryAttr] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.input_specs: dict[str, InputSpec] = {}
        self.verified: set[Operation] = set()
        """Ops verified when they were built."""
        self.relocate: Relocation | None = None
        """How the ops of the subgraph being inlined take their module paths (`_called_from`)."""

    # entry points ---------------------------------------------------------------

    def run_exported(self, ep: ExportedProgram) -> ImportedProgram:
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        for node in ep.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                self._add_input(node, ep.range_constraints)
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
        """A GraphModule's weights are its get_attr tensors (subgraphs of higher-order ops are
        inlined where they are called); the ranges of its dynamic dims are its
        `range_constraints` where it has them (`ep.module()` does)."""
        for node in gm.graph.find_nodes(op="get_attr"):
            self._add_weight(node, gm, "")
        range_constraints = getattr(gm, "range_constraints", None) or {}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self._add_input(node, range_constraints)
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
            # each typed op verified as it was built (`_typed_op`): verifying it again was a third of the import
            for op in (module, fn):
                op.verify(verify_nested_ops=False)
            for op in self.block.ops:
                if op not in self.verified:
                    op.verify()
        except VerifyException as e:
            raise ImportError_(f"imported IR does not verify: {e}") from e
        return ImportedProgram(module, self.weights, self.input_specs)

    def _add_weight(self, node: torch.fx.Node, owner: torch.nn.Module, prefix: str) -> None:
        """A get_attr tensor of `owner` (the module at `prefix`) becomes a weight argument named
        by its FQN; a subgraph of a higher-order op is inlined where it is called instead."""
        value = operator.attrgetter(node.target)(owner)
        if isinstance(value, torch.fx.GraphModule):
            return
        if not isinstance(value, torch.Tensor):
            raise ImportError_(f"get_attr '{prefix}{node.target}' is a {type(value).__name__}, not a tensor")
        *path, leaf = node.target.split(".")
        kind = InputKind.PARAMETER if isinstance(value, torch.nn.Parameter) else (
            InputKind.BUFFER if leaf in owner.get_submodule(".".join(path))._buffers else InputKind.CONSTANT_TENSOR
        )
        node.meta.setdefault("val", value)
        self.weights[prefix + node.target] = value
        self._add_argument(node, {WEIGHT_ATTRS[kind]: StringAttr(prefix + node.target)})

    def _add_input(self, node: torch.fx.Node, range_constraints: Any) -> None:
        if "val" not in node.meta:
            raise ImportError_(f"input '{node.name}' has no meta['val']: pass example_inputs, or use torch.export")
        spec = spec_of_value(node.name, node.meta["val"], range_constraints)
        if spec is not None:
            self.input_specs[node.name] = spec
        self._add_argument(node, {INPUT_ATTR: StringAttr(node.name)})

    def _add_argument(self, node: torch.fx.Node, attrs: dict[str, Attribute]) -> None:
        arg = self.block.insert_arg(type_of(node.meta["val"]), len(self.block.args))
        arg.name_hint = _name_hint(node.name)
        self.values[node] = arg
        self.arg_attrs.append(DictionaryAttr(attrs))

    def _import_nodes(self, graph: torch.fx.Graph, owner: torch.nn.Module | None, prefix: str = "") -> list[SSAValue]:
        """The graph's nodes (of the module `owner` at `prefix`, when inlined), and its outputs."""
        for node in graph.nodes:
            if node.op == "get_attr" and node not in self.values and owner is not None:
                self._add_weight(node, owner, prefix)
            if node.op in ("placeholder", "get_attr"):
                continue
            if node.op == "output":
                return [self._output_value(v) for v in torch.utils._pytree.tree_leaves(node.args[0])]
            if node.op == "call_module":
                self._import_call_module(node, owner)
            elif node.op == "call_function":
                self._import_call(node, owner)
            else:
                raise ImportError_(
                    f"node '{node.name}': {node.op} nodes are not supported (pass example_inputs, so "
                    "that ad_mlir exports the graph to ATen ops, or use torch.export)"
                )
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
            self._inline_higher_order(node, name, owner)
            return
        op: Operation | None = None
        before = self.block.last_op
        if name in T.OVERLOAD_BY_TARGET:
            try:
                op = self._typed_op(node, *T.OVERLOAD_BY_TARGET[name])
            except (T.UnsupportedError, VerifyException) as e:
                log.debug("node %s (%s) kept as ad.torch_op: %s", node.name, name, e)
        if op is None:
            op = self._torch_op(node, name)
        if (loc := location_of(node, self.relocate)) is not None:
            op.location = loc
            self._locate_constants_after(before, loc)
        self.block.add_op(op)
        _, unpack = result_types(node)
        self.values[node] = list(op.results) if unpack else (op.results[0] if op.results else None)
        for r in op.results:
            r.name_hint = _name_hint(node.name)

    def _locate_constants_after(self, before: Operation | None, loc: Attribute) -> None:
        """The constants made for a node's scalar operands (after `before`) take the node's
        location: they belong to its layer, also where they come first in it (a layer whose
        first op is `pow(x, 2)`, as AOTAutograd leaves an RMSNorm) and would otherwise count
        as the previous layer's (`passes/repeated_layers.py`)."""
        op = before.next_op if before is not None else self.block.first_op
        while op is not None:
            if isinstance(op, ad.ConstantOp):
                op.location = loc
            op = op.next_op

    def _import_call_module(self, node: torch.fx.Node, owner: torch.nn.Module | None) -> None:
        """`ep.module()`'s `_guards_fn` checks the inputs: the compiled graph's input checks do
        that (`runtime/input_checks.py`, made from the same placeholders and ranges). A
        GraphModule submodule is inlined; any other module has no graph to import."""
        sub = owner.get_submodule(node.target) if owner is not None else None
        if isinstance(sub, GuardsFn):
            return
        if not isinstance(sub, torch.fx.GraphModule):
            raise ImportError_(
                f"node '{node.name}': call_module of a {type(sub).__name__} ('{node.target}') has no graph to "
                "import (pass example_inputs, so that ad_mlir exports the graph to ATen ops, or use torch.export)"
            )
        self._inline_graph(node, sub, node.args, prefix=f"{node.target}.")

    def _inline_higher_order(self, node: torch.fx.Node, name: str, owner: torch.nn.Module | None) -> None:
        if name == "torch.ops.higher_order.wrap_with_autocast" and node.args[2]:
            raise ImportError_(
                f"node '{node.name}': an enabled autocast region ({node.args[0]}, {node.args[1]}) casts "
                "implicitly: compile the ExportedProgram (ad_mlir makes its casts explicit with "
                "ep.run_decompositions) or export without autocast"
            )
        how = INLINED_HIGHER_ORDER_OPS[name]
        sub_node = node.args[how.subgraph]
        sub = operator.attrgetter(sub_node.target)(owner)
        outer = self.relocate
        if name == "torch.ops.higher_order.invoke_subgraph":
            self.relocate = _called_from(node) or outer
        try:
            self._inline_graph(node, sub, node.args[how.operands:], prefix=f"{sub_node.target}.")
        finally:
            self.relocate = outer

    def _inline_graph(
        self, node: torch.fx.Node, sub: torch.fx.GraphModule, operands: Sequence[Any], prefix: str = ""
    ) -> None:
        """The subgraph's outputs stand for the node's: a tuple, or one value where the
        subgraph returns one (a GraphModule called as a module)."""
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(operands):
            raise ImportError_(
                f"node '{node.name}': its subgraph takes {len(placeholders)} inputs, the node passes {len(operands)}"
            )
        for p, a in zip(placeholders, operands, strict=True):
            self.values[p] = self.values[a] if isinstance(a, torch.fx.Node) else self._operand(a)
        outputs = self._import_nodes(sub.graph, sub, prefix)
        self.values[node] = outputs[0] if isinstance(sub.graph.output_node().args[0], torch.fx.Node) else outputs

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
        try:
            op.verify()
        except VerifyException:
            op.drop_all_references()  # refused (kept as ad.torch_op): it must not stay a user of its operands
            raise
        self.verified.add(op)
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
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            raise ImportError_(
                f"node '{node.name}': higher-order op {name} is not supported (ad_mlir inlines only "
                f"{', '.join(sorted(INLINED_HIGHER_ORDER_OPS))}; control flow such as torch.cond does not "
                "inline exactly): rewrite the model without it, or compile the graphs around it"
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

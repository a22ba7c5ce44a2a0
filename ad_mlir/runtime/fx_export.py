"""`ad` module -> runnable `torch.fx.GraphModule` holding the same weights.

Every op becomes the torch call `op_table.build_call` gives, so the exported graph
computes exactly what the reference evaluator computes. When compiling, pure ops on weights
alone (the concatenated weights of `fuse-gemms`, a cast of a weight) are computed once, here,
and the graph holds their results instead of the weights they read.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DictionaryAttr,
    Float64Type,
    IndexType,
    IntegerType,
    NameLoc,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue

from ad_mlir.codegen.lowering import kernel_inputs, kernel_outputs
from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import computes_from_weights_only, weight_of
from ad_mlir.frontends.fx_import import INPUT_ATTR, ImportedProgram
from ad_mlir.frontends.input_checks import DynamicDim, InputChecks, InputSpec
from ad_mlir.semantics import op_table as T
from ad_mlir.semantics import torch_ops
from ad_mlir.semantics.reference import run_op
from ad_mlir.semantics.weights import SINGLE_RANK, Rank, rank_weight

if TYPE_CHECKING:
    from ad_mlir.runtime.kernels import RegionKernel


def export_program(
    program: ImportedProgram,
    kernels: Mapping[Operation, RegionKernel] | None = None,
    fold_weights: bool = False,
    rank: Rank = SINGLE_RANK,
) -> torch.fx.GraphModule:
    """The GraphModule takes the user inputs, in order, and returns a tuple of outputs.
    An op with a kernel in `kernels` (a region or an LLM-level op) becomes one call of its
    `torch.ops.ad_mlir` op; a region without one is emitted inline, as its ops' torch calls.
    With `fold_weights`, pure ops on weights alone are computed now and the graph holds their
    results instead of the weights only they read (else the graph keeps every weight). Sharded
    weight arguments hold `rank`'s shard (`fx_import.rank_weight`). The module checks its inputs
    before running (`frontends/input_checks.py`; its `input_checks` attribute)."""
    kernels = kernels or {}
    fn = program.function
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[SSAValue, Any] = {}
    folded: dict[SSAValue, torch.Tensor] = {}
    for arg, attrs in zip(fn.body.block.args, fn.arg_attrs or [], strict=True):
        env[arg], value = _argument_node(graph, root, program, arg, attrs, rank)
        if fold_weights and value is not None:
            folded[arg] = value
    for op in fn.body.block.ops:
        if isinstance(op, func.ReturnOp):
            graph.output(tuple(env[v] for v in op.operands))
        elif op not in kernels and computes_from_weights_only(op, folded):
            _emit_folded(graph, root, op, env, folded)
        else:
            _emit_op(graph, op, env, kernels)
    if fold_weights:
        graph.eliminate_dead_code()
        _drop_unused_weights(root, graph)
    graph.lint()
    gm = torch.fx.GraphModule(root, graph, class_name="AdGraphModule")
    gm.input_checks = InputChecks(input_specs(program))
    gm.register_forward_pre_hook(gm.input_checks, with_kwargs=True)
    return gm


def input_specs(program: ImportedProgram) -> list[InputSpec]:
    """What each user argument of the function must be: dtype, rank and static sizes from its
    type (what the kernels were built for), device and the dynamic dims' ranges from the source
    graph's input (`ImportedProgram.input_specs`). An argument a pass added (a K/V cache) is
    expected on the device of the source's tensor inputs."""
    fn = program.function
    sources = program.input_specs
    devices = {s.device_type for s in sources.values() if s.kind is torch.Tensor}
    device = devices.pop() if len(devices) == 1 else None
    return [
        _argument_spec(attrs.data[INPUT_ATTR].data, arg.type, sources.get(attrs.data[INPUT_ATTR].data), device)
        for arg, attrs in zip(fn.body.block.args, fn.arg_attrs or [], strict=True)
        if INPUT_ATTR in attrs.data
    ]


def _argument_spec(name: str, arg_type: Attribute, source: InputSpec | None, device: str | None) -> InputSpec:
    if not isinstance(arg_type, TensorType):
        if source is not None and source.kind is _SCALAR_KINDS.get(type(arg_type)):
            return source
        return InputSpec(name, _SCALAR_KINDS[type(arg_type)])
    source_dims = source.shape if source is not None and len(source.shape) == arg_type.get_num_dims() else None
    shape = tuple(
        d if d != DYNAMIC_INDEX else (
            source_dims[i] if source_dims is not None and isinstance(source_dims[i], DynamicDim) else DynamicDim(None)
        )
        for i, d in enumerate(arg_type.get_shape())
    )
    return InputSpec(name, torch.Tensor, T.torch_dtype(arg_type), source.device_type if source else device, shape)


_SCALAR_KINDS: dict[type, type] = {IndexType: int, IntegerType: bool, Float64Type: float}
"""The Python type of a scalar argument, by its `ad` type (`fx_import.type_of`)."""


def _emit_folded(
    graph: torch.fx.Graph, root: torch.nn.Module, op: Operation, env: dict[SSAValue, Any],
    folded: dict[SSAValue, torch.Tensor],
) -> None:
    """Compute the op now, once (e.g. the weight concatenation of `fuse-gemms`), and hold its
    result as a buffer of the graph module."""
    with torch.no_grad():
        values = run_op(op, [folded[v] if v in folded else env[v] for v in op.operands])
    for result, value in zip(op.results, values, strict=True):
        name = f"_folded_{len(folded)}"
        root.register_buffer(name, value)
        folded[result] = value
        env[result] = graph.get_attr(name)
        _record_source(env[result], op)


def _drop_unused_weights(root: torch.nn.Module, graph: torch.fx.Graph) -> None:
    """Weights only folded ops read are not needed at run time (nor kept in memory)."""
    used = {n.target for n in graph.nodes if n.op == "get_attr"}
    for name, _ in [*root.named_parameters(), *root.named_buffers()]:
        if name not in used:
            *path, leaf = name.split(".")
            delattr(root.get_submodule(".".join(path)), leaf)


def _argument_node(
    graph: torch.fx.Graph,
    root: torch.nn.Module,
    program: ImportedProgram,
    arg: SSAValue,
    attrs: DictionaryAttr,
    rank: Rank,
) -> tuple[torch.fx.Node, torch.Tensor | None]:
    """A placeholder for a user input; for a weight, a `get_attr` of it (as held on `rank`) and
    its value."""
    if INPUT_ATTR in attrs.data:
        return graph.placeholder(attrs.data[INPUT_ATTR].data), None
    weight = weight_of(attrs)
    if weight is None:
        raise ValueError(f"argument %{arg.name_hint} has neither {INPUT_ATTR} nor a weight attribute")
    kind, fqn = weight
    if fqn not in program.weights:
        raise KeyError(f"weight '{fqn}' of argument %{arg.name_hint} is missing")
    value = rank_weight(program.weights[fqn], arg.type, attrs, rank)
    _register(root, fqn, value, kind)
    return graph.get_attr(fqn), value


def _register(root: torch.nn.Module, fqn: str, tensor: torch.Tensor, kind: str) -> None:
    *path, leaf = fqn.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    if kind == "ad.param":
        module.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=tensor.requires_grad))
    elif kind == "ad.buffer":
        module.register_buffer(leaf, tensor)
    else:
        setattr(module, leaf, tensor)


def _emit_op(
    graph: torch.fx.Graph, op: Operation, env: dict[SSAValue, Any], kernels: Mapping[Operation, RegionKernel]
) -> None:
    if isinstance(op, ad.ConstantOp):
        env[op.result] = T.attr_to_value(op.value)
    elif op in kernels:
        _emit_kernel_call(graph, op, env, kernels[op])
    elif isinstance(op, ad.FusedOp):
        _emit_fused_inline(graph, op, env)
    else:
        _emit_call(graph, op, env)


def block_graph(block: Block) -> torch.fx.GraphModule:
    """A region body (ending in `ad.yield`) as a GraphModule: its arguments in order, its ops'
    torch calls, the yielded values as a tuple. Built once, it runs a region's reference
    semantics without reading the IR again at every call."""
    graph = torch.fx.Graph()
    env: dict[SSAValue, Any] = {a: graph.placeholder(f"arg{i}") for i, a in enumerate(block.args)}
    for op in block.ops:
        if isinstance(op, ad.YieldOp):
            graph.output(tuple(env[v] for v in op.values))
            break
        _emit_op(graph, op, env, {})
    for node in graph.nodes:
        # the kernel op that runs this graph declared the writes already
        node.target = (node.op == "call_function" and torch_ops.direct_function(node.target)) or node.target
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _emit_kernel_call(graph: torch.fx.Graph, op: Operation, env: dict[SSAValue, Any], kernel: RegionKernel) -> None:
    node = graph.call_function(kernel.op, tuple(kernel.split_inputs([env[v] for v in kernel_inputs(op)])))
    _record_source(node, op)
    for i, r in enumerate(kernel_outputs(op)):
        env[r] = graph.call_function(operator.getitem, (node, i))


def _emit_fused_inline(graph: torch.fx.Graph, op: ad.FusedOp, env: dict[SSAValue, Any]) -> None:
    """The region's ops as plain torch calls (until the region has a kernel)."""
    block = op.body.block
    env.update(zip(block.args, (env[v] for v in op.inputs), strict=True))
    for inner in block.ops:
        if isinstance(inner, ad.YieldOp):
            env.update(zip(op.outputs, (env[v] for v in inner.values), strict=True))
        else:
            _emit_op(graph, inner, env, {})


def _emit_call(graph: torch.fx.Graph, op: Operation, env: dict[SSAValue, Any]) -> None:
    fn, args, kwargs = T.build_call(op, [env[v] for v in op.operands])
    node = graph.call_function(fn, args, kwargs)
    _record_source(node, op)
    if len(op.results) == 1 and not _unpacks(op):
        env[op.results[0]] = node
        return
    for i, r in enumerate(op.results):
        env[r] = graph.call_function(operator.getitem, (node, i))


def _record_source(node: torch.fx.Node, op: Operation) -> None:
    if isinstance(op.location, NameLoc):
        node.meta["ad_source"] = op.location.desc.data


def _unpacks(op: Operation) -> bool:
    return isinstance(op, ad.SplitOp) or (isinstance(op, ad.TorchOp) and op.unpack is not None)

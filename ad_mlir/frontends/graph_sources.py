"""The graphs a user may hold, made importable: an ExportedProgram, `ep.module()`, a GraphModule
from `make_fx` / `symbolic_trace`, or an `nn.Module` with example inputs.

Each is turned, with torch's own machinery, into an ExportedProgram or an ATen-level GraphModule
(call_function nodes on ATen ops, higher-order ops the importer inlines, and `ep.module()`'s
`_guards_fn`, which the compiled graph's input checks replace):
- an `nn.Module`, or a GraphModule of torch-level calls (`symbolic_trace`'s call_module /
  call_method nodes), is exported (`torch.export`, non-strict, under no_grad: `export_inference`);
- an ExportedProgram holding an enabled autocast region gets its casts made explicit by
  `ep.run_decompositions({})` (which retraces under the recorded autocast state and inlines the
  region; no decomposition table, so the ATen ops stay as they are).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export._unlift import GuardsFn

from ad_mlir.frontends.export import ModuleExport

Source = torch.nn.Module | ExportedProgram | ModuleExport
ExampleInputs = Sequence[Any] | Mapping[str, Any]


class SourceError(TypeError):
    """A graph source that cannot be made importable (the message says what to pass)."""


def importable(
    source: Source, example_inputs: ExampleInputs | None = None, dynamic_shapes: Any = None
) -> ExportedProgram | torch.fx.GraphModule:
    """`source` as an ExportedProgram or an ATen-level GraphModule (see the module's doc)."""
    if isinstance(source, ExportedProgram):
        return _explicit_autocast(source)
    if isinstance(source, ModuleExport):
        return _explicit_autocast(source.exported())
    if isinstance(source, torch.fx.GraphModule) and not _needs_export(source):
        return source
    if isinstance(source, torch.nn.Module):
        return _explicit_autocast(export_module(source, example_inputs, dynamic_shapes))
    raise SourceError(
        f"expected an ExportedProgram, a GraphModule or an nn.Module with example inputs, got {type(source).__name__}"
    )


def export_module(
    module: torch.nn.Module, example_inputs: ExampleInputs | None, dynamic_shapes: Any = None
) -> ExportedProgram:
    """Export for inference: positional example inputs (a sequence) or keyword ones (a mapping);
    `dynamic_shapes` as `torch.export.export` takes it (None: every size static)."""
    return module_export(module, example_inputs, dynamic_shapes).exported()


def module_export(
    module: torch.nn.Module, example_inputs: ExampleInputs | None, dynamic_shapes: Any = None
) -> ModuleExport:
    """`export_module`'s export, not run yet (`ModuleExport`)."""
    what = "a torch-level GraphModule" if isinstance(module, torch.fx.GraphModule) else f"nn.Module {type(module).__name__}"
    if example_inputs is None:
        raise SourceError(
            f"{what} is exported with torch.export before compiling: pass example_inputs (a tuple of positional "
            "inputs or a dict of keyword inputs) and, for dynamic sizes, dynamic_shapes"
        )
    if isinstance(example_inputs, Mapping):
        return ModuleExport(module, dict(example_inputs), dynamic_shapes)
    return ModuleExport(module, {}, dynamic_shapes, args=tuple(example_inputs))


def _needs_export(gm: torch.fx.GraphModule) -> bool:
    """A graph of torch-level calls (modules, methods, torch functions on tensors) rather than
    ATen ops: the importer would carry those opaquely, so it is exported to ATen first."""
    for node in gm.graph.nodes:
        if node.op == "call_method":
            return True
        if node.op == "call_module" and not _inlinable_module(gm.get_submodule(node.target), node):
            return True
        if node.op == "call_function" and not _aten_level(node):
            return True
    return False


def _inlinable_module(module: torch.nn.Module, node: torch.fx.Node) -> bool:
    """`ep.module()`'s guards, or a GraphModule with shapes (`split_module`'s partitions): the
    importer walks its graph where it is called. Without shapes, fake propagation would run it
    whole and leave its nodes without `meta["val"]`: the graph is exported instead."""
    return isinstance(module, GuardsFn) or (isinstance(module, torch.fx.GraphModule) and "val" in node.meta)


def _aten_level(node: torch.fx.Node) -> bool:
    """An ATen op or higher-order op, a tuple item, or Python arithmetic on sizes."""
    if isinstance(node.target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
        return True
    if node.target is operator.getitem:
        return True
    return "val" in node.meta and not isinstance(node.meta["val"], torch.Tensor)


def _explicit_autocast(ep: ExportedProgram) -> ExportedProgram:
    enabled = [
        node for module in ep.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.target is torch.ops.higher_order.wrap_with_autocast and node.args[2]
    ]
    return ep.run_decompositions({}) if enabled else ep

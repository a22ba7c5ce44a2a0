"""`torch.compile(model, backend="ad_mlir")`: ad-mlir as a TorchDynamo backend.

    model = torch.compile(model, backend="ad_mlir")                        # the default pipeline
    model = torch.compile(model, backend="ad_mlir", options={"pipeline": "none", "verify": True})
    options: ad_mlir.compile's (pipeline, verify, cache, world_size, rank) and fallback,
    freeze_weights (see BackendOptions)

The backend is registered under the `torch_dynamo_backends` entry point (pyproject.toml), so the
name works once the package is installed. Dynamo hands each graph it captures (one per side of a
graph break) to `ad_mlir_backend`; AOTAutograd functionalizes it into an ATen inference graph, and
that graph goes through `ad_mlir.compile` like a `torch.export` graph. Dynamic dimensions follow
Dynamo (`torch._dynamo.mark_dynamic`, or its automatic dynamic shapes after a recompile): their
sizes reach the compiled graph as `SymInt` inputs, so one compiled graph serves every length.
The parameters and buffers Dynamo lifts into inputs are compiled as weights (`freeze_weights`).

What does not compile runs eagerly, as the ATen graph AOTAutograd made, with one warning
(`EagerFallbackWarning`) per graph naming the reason:
- a graph the pipeline cannot take (the importer, a pass or code generation raised): the warning
  carries the error; `options={"fallback": False}` raises it instead;
- a graph that needs gradients (grad mode on and an input, e.g. a parameter, requires grad): the
  compiler makes inference graphs only, so training runs eagerly; call the compiled model under
  `torch.no_grad()` or `torch.inference_mode()` to compile it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.graph_module import _copy_attr

from ad_mlir.compiler import CompileOptions, compile


class EagerFallbackWarning(UserWarning):
    """A graph that ad-mlir did not compile runs eagerly (the message says why)."""


@dataclass(frozen=True)
class BackendOptions(CompileOptions):
    """`torch.compile(..., options=...)` keys: `ad_mlir.compile`'s (`CompileOptions`) and these."""

    fallback: bool = True
    """Run a graph the pipeline cannot take eagerly with a warning; False: raise its error."""
    freeze_weights: bool = True
    """Compile the parameters and buffers Dynamo lifts into graph inputs as weights (`ad.param`,
    as in a torch.export graph), so that weight-only work (fuse-gemms' concatenations) runs once,
    when compiling. Ops read the module's own tensors, but results computed from weights at
    compile time do not follow later in-place changes: call `torch._dynamo.reset()` after
    changing weights, or set False to keep them graph inputs."""


def ad_mlir_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """The Dynamo backend: AOTAutograd turns `gm` into an ATen graph; an inference graph is
    compiled by ad-mlir, a graph that needs gradients runs eagerly (see the module's docstring)."""
    from torch._dynamo.backends.common import aot_autograd

    opts = BackendOptions.of(options)
    weights = _LiftedWeights(gm, example_inputs) if opts.freeze_weights else None
    return aot_autograd(
        inference_compiler=lambda fw, inputs: _compile_inference(fw, inputs, opts, weights),
        fw_compiler=_eager_training_forward,
        bw_compiler=_eager,
    )(gm, example_inputs)


def _compile_inference(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: BackendOptions,
                       weights: _LiftedWeights | None) -> Any:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    _module_paths_from_the_model(gm)
    frozen, kept = weights.freeze(gm, example_inputs) if weights else (gm, list(range(len(example_inputs))))
    try:
        # AOTAutograd calls us under its fake mode; compiling folds weights and `verify` runs
        # the program, both on real tensors.
        with unset_fake_temporarily():
            compiled = compile(frozen, [example_inputs[i] for i in kept], options=opts)
    except Exception as e:  # noqa: BLE001 (any failure of ours leaves the graph eager, named in the warning)
        if not opts.fallback:
            raise
        _warn(gm, f"ad-mlir could not compile it: {type(e).__name__}: {_first_line(e)}")
        return _eager(gm, example_inputs)

    def run(args: list[Any]) -> Any:  # AOTAutograd's boxed calling convention: one list of inputs
        return compiled(*[args[i] for i in kept])

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


_DYNAMO_ROOT = re.compile(r"^[LG]\[[^\]]+\](?:\[\d+\])?\.?")
"""The root of Dynamo's module paths: the compiled module (`L['self']`, or `L['args'][0]` for
its own forward compiled) or a global (`G['model']`)."""


def _module_paths_from_the_model(gm: torch.fx.GraphModule) -> None:
    """The module paths of `gm`'s ops (`nn_module_stack`, which AOTAutograd keeps from Dynamo's
    graph) made relative to the compiled model, `L['self'].model.layers.0.mlp` ->
    `model.layers.0.mlp`, as torch.export names them: the ops' locations, by which
    compiling once per distinct layer (`passes/repeated_layers.py`) finds the layers and
    relates them to the weights (named alike by `_LiftedWeights`)."""
    for node in gm.graph.nodes:
        if stack := node.meta.get("nn_module_stack"):
            node.meta["nn_module_stack"] = {key: (_DYNAMO_ROOT.sub("", path), cls) for key, (path, cls) in stack.items()}


class _LiftedWeights:
    """The parameters and buffers Dynamo passes to its graph as inputs (real tensors, named by
    their module path, as torch.export names them, where Dynamo's source says it), to make them
    weights of AOTAutograd's graph."""

    def __init__(self, dynamo_gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        nodes = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
        placeholders = [n.name for n in nodes]
        paths = [_module_path(n) or _weight_name(n.name) for n in nodes]
        self.names = paths if len(set(paths)) == len(paths) else placeholders
        self.tensors = list(example_inputs)
        self.module_state = {i for i, name in enumerate(placeholders) if re.search(r"_(parameters|buffers)_", name)}
        """Inputs that are a module's parameters or buffers; other static inputs (a user's
        `mark_static_address`) are data and stay inputs."""

    def freeze(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[torch.fx.GraphModule, list[int]]:
        """`gm` with its static inputs (AOTAutograd's `static_input_indices`: the lifted
        parameters and buffers) read from attributes holding the real tensors, and the indices
        of the inputs it still takes. Unchanged where AOTAutograd's inputs are not Dynamo's one
        for one (it deduplicates aliased inputs, for one)."""
        context = torch._guards.TracingContext.try_get()
        metadata = context.fw_metadata if context is not None else None
        static = set(metadata.static_input_indices) & self.module_state if metadata is not None else set()
        everything = list(range(len(example_inputs)))
        if not static or len(example_inputs) != len(self.tensors) or not all(
            _same_tensor_type(example_inputs[i], self.tensors[i]) for i in static
        ):
            return gm, everything
        root, graph, env = torch.nn.Module(), torch.fx.Graph(), {}
        placeholders = iter(everything)
        for node in gm.graph.nodes:
            index = next(placeholders) if node.op == "placeholder" else None
            if index in static:
                _set_weight(root, self.names[index], self.tensors[index])
                env[node] = graph.get_attr(self.names[index])
                env[node].meta = dict(node.meta)
            else:
                env[node] = graph.node_copy(node, env.__getitem__)
                if node.op == "get_attr":  # a constant AOTAutograd lifted (Falcon's `_tensor_constant0`)
                    _copy_attr(gm, root, node.target)
        return torch.fx.GraphModule(root, graph), [i for i in everything if i not in static]


def _same_tensor_type(fake: Any, real: Any) -> bool:
    return (isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor) and fake.dtype == real.dtype
            and tuple(fake.shape) == tuple(real.shape))


def _set_weight(root: torch.nn.Module, path: str, tensor: torch.Tensor) -> None:
    """`tensor` at the dotted `path` of `root` (submodules made as needed), a parameter or a buffer."""
    *modules, leaf = path.split(".")
    owner = root
    for name in modules:
        if name not in owner._modules:  # a name a submodule had in the model is a valid one here
            owner.add_module(name, torch.nn.Module())
        owner = owner._modules[name]
    if isinstance(tensor, torch.nn.Parameter):
        owner.register_parameter(leaf, tensor)
    else:
        owner.register_buffer(leaf, tensor)


_SOURCE_PATH = re.compile(r"L\[[^\]]+\](?:\[\d+\])?((?:\._(?:modules|parameters|buffers)\['[^']+'\])+)")
"""Dynamo's source of a lifted weight, `L['self']._modules['model']._parameters['weight']`
(`L['args'][0]...` for a compiled module's own forward)."""


def _module_path(placeholder: torch.fx.Node) -> str | None:
    """The module path of the weight a Dynamo placeholder lifts (`model.layers.0.mlp.up_proj.weight`,
    as torch.export names it), from its source; None for another input."""
    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    match = _SOURCE_PATH.fullmatch(str(getattr(source, "name", "")))
    return ".".join(re.findall(r"\['([^']+)'\]", match.group(1))) if match else None


def _weight_name(placeholder: str) -> str:
    """Dynamo's placeholder name of a lifted weight, shortened to its module path:
    `l_self_modules_model_modules_norm_parameters_weight_` (or `l_args_0_modules_...` for a
    compiled module's own forward) -> `model_norm_weight`; where its source names no module path."""
    name = re.sub(r"^l_(self_|args_\d+_)?", "", placeholder)
    name = re.sub(r"(^|_)(modules|parameters|buffers)_", r"\1", name).rstrip("_")
    return name if name.isidentifier() else placeholder


def _eager_training_forward(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    _warn(gm, "it needs gradients (grad mode is on and an input requires grad) and ad-mlir compiles "
          "inference graphs only; call the model under torch.no_grad() or torch.inference_mode() to compile it")
    return _eager(gm, example_inputs)


def _eager(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The ATen graph itself, in AOTAutograd's boxed calling convention (a list of inputs)."""
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(gm.forward)


def _warn(gm: torch.fx.GraphModule, reason: str) -> None:
    nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    warnings.warn(f"ad_mlir backend: a graph of {nodes} ops runs eagerly: {reason}", EagerFallbackWarning,
                  stacklevel=2)


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")[:300]

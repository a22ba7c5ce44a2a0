"""`torch.compile(model, backend="ad_mlir")`: ad-mlir as a TorchDynamo backend.

    model = torch.compile(model, backend="ad_mlir")                        # the default pipeline
    model = torch.compile(model, backend="ad_mlir", options={"pipeline": "none", "verify": True})

The backend is registered under the `torch_dynamo_backends` entry point (pyproject.toml), so the
name works once the package is installed. Dynamo hands each graph it captures (one per side of a
graph break) to `ad_mlir_backend`; AOTAutograd functionalizes it into an ATen inference graph, and
that graph goes through `ad_mlir.compile` like a `torch.export` graph. Dynamic dimensions follow
Dynamo (`torch._dynamo.mark_dynamic`, or its automatic dynamic shapes after a recompile): their
sizes reach the compiled graph as `SymInt` inputs, so one compiled graph serves every length.

What does not compile runs eagerly, as the ATen graph AOTAutograd made, with one warning
(`EagerFallbackWarning`) per graph naming the reason:
- a graph the pipeline cannot take (the importer, a pass or code generation raised): the warning
  carries the error; `options={"fallback": False}` raises it instead;
- a graph that needs gradients (grad mode on and an input, e.g. a parameter, requires grad): the
  compiler makes inference graphs only, so training runs eagerly; call the compiled model under
  `torch.no_grad()` or `torch.inference_mode()` to compile it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch


class EagerFallbackWarning(UserWarning):
    """A graph that ad-mlir did not compile runs eagerly (the message says why)."""


@dataclass(frozen=True)
class BackendOptions:
    """`torch.compile(..., options=...)` keys."""

    pipeline: str | Path = "default"
    """As `ad_mlir.compile`'s: "default", "none", "pass,pass" or a pipeline YAML file."""
    verify: bool = False
    """Check every pass and the kernels numerically (`ad_mlir.compile(verify=True)`)."""
    fallback: bool = True
    """Run a graph the pipeline cannot take eagerly with a warning; False: raise its error."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options or {}) - known)
        if unknown:
            raise ValueError(
                f"unknown ad_mlir backend option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return cls(**(options or {}))


def ad_mlir_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """The Dynamo backend: AOTAutograd turns `gm` into an ATen graph; an inference graph is
    compiled by ad-mlir, a graph that needs gradients runs eagerly (see the module's docstring)."""
    from torch._dynamo.backends.common import aot_autograd

    opts = BackendOptions.from_options(options)
    return aot_autograd(
        inference_compiler=lambda fw, inputs: _compile_inference(fw, inputs, opts),
        fw_compiler=_eager_training_forward,
        bw_compiler=_eager,
    )(gm, example_inputs)


def _compile_inference(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: BackendOptions) -> Any:
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from ad_mlir.compiler import compile

    try:
        # AOTAutograd calls us under its fake mode; compiling folds weights and `verify` runs
        # the program, both on real tensors.
        with unset_fake_temporarily():
            compiled = compile(gm, example_inputs, pipeline=opts.pipeline, verify=opts.verify)
    except Exception as e:  # noqa: BLE001 (any failure of ours leaves the graph eager, named in the warning)
        if not opts.fallback:
            raise
        _warn(gm, f"ad-mlir could not compile it: {type(e).__name__}: {_first_line(e)}")
        return _eager(gm, example_inputs)
    return make_boxed_func(compiled)


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

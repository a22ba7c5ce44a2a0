"""Numeric verification of the compiled graph (`compile(..., verify=True)`): its kernels
compute what the pipeline's IR computes, on the same random inputs (`passes.verify`'s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp

from ad_mlir.dialects.weights import weight_of
from ad_mlir.passes.verify import (
    COLLECTIVES,
    NumericMismatch,
    beyond_rounding,
    example_arguments,
    function_of,
    kind_of,
    mismatch,
    nudged,
    run_values,
)
from ad_mlir.runtime.kernels import reference_kernels, registered_kernel


def check_compiled(gm: torch.fx.GraphModule, module: ModuleOp, weights: Mapping[str, torch.Tensor],
                   seed: int = 0) -> None:
    """The compiled graph (its Triton kernels) computes what the pipeline's IR computes, on the
    same random inputs (an output off by more than the tolerance is accepted where nudging the
    inputs by one rounding moves the IR's about as far: `passes.verify.beyond_rounding`); raises
    NumericMismatch naming the output that differs. A graph holding
    collectives is not checked (one process cannot run them)."""
    fn = function_of(module)
    if any(isinstance(op, COLLECTIVES) for op in fn.body.block.ops):
        return
    args = example_arguments(fn, weights, seed)
    expected, _ = run_values(fn, args)
    user_inputs = [a for a, attrs in zip(args, fn.arg_attrs or [], strict=True) if weight_of(attrs) is None]
    with torch.no_grad():  # forward, not the input checks: the random sizes (SEQ) ignore the export's ranges
        got = gm.forward(*user_inputs)
    moved: tuple[Any, ...] | None = None
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if why := mismatch(g, e):
            moved = moved or run_values(fn, nudged(args))[0]
            why = beyond_rounding(e, g, moved[i], why)  # how far a rounding moves the IR's result
        if why:
            culprit = first_differing_kernel(gm, user_inputs)
            raise NumericMismatch(f"the compiled graph's kernels differ from the IR the pipeline made, result {i}: "
                                  f"{why}" + (f"; the first kernel that differs: {culprit}" if culprit else ""))


def first_differing_kernel(gm: torch.fx.GraphModule, inputs: list[Any]) -> str | None:
    """Run `gm` node by node and each kernel call also as its region's reference semantics on
    the same inputs: the first kernel whose outputs differ, with its inputs' shapes, or None."""
    class Found(Exception):
        pass

    class Checked(torch.fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            out = super().call_function(target, args, kwargs)
            kernel = registered_kernel(target)
            if kernel is None:
                return out
            with reference_kernels():
                expected = target(*args, **kwargs)
            for j, (g, e) in enumerate(zip(out, expected, strict=True)):
                if why := mismatch(g, e):
                    shapes = ", ".join(kind_of(t) for t in args[0])
                    raise Found(f"{kernel.name} (inputs {shapes}), output {j}: {why}")
            return out

    try:
        with torch.no_grad():
            Checked(gm).run(*inputs)
    except Found as e:
        return str(e).splitlines()[0]  # the FX interpreter appends the node it was running
    return None

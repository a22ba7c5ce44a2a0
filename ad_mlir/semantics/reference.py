"""Reference semantics: run a `func.func` of the `ad` dialect on torch tensors.

Built on xDSL's interpreter; every `ad` op runs the torch call that
`op_table.build_call` gives, the same one the exporter emits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.interpreter import Interpreter, InterpreterFunctions, impl, register_impls
from xdsl.ir import Block, Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_of
from ad_mlir.semantics import op_table as T
from ad_mlir.semantics.weights import SINGLE_RANK, Rank, rank_weight


def run_op(op: Operation, values: Sequence[Any]) -> tuple[Any, ...]:
    """One op on concrete values; returns one value per result."""
    if isinstance(op, ad.ConstantOp):
        return (T.attr_to_value(op.value),)
    if isinstance(op, ad.FusedOp):
        return run_fused(op, values)
    fn, args, kwargs = T.build_call(op, values)
    out = fn(*args, **kwargs)
    if len(op.results) == 1 and not (isinstance(op, ad.SplitOp) or getattr(op, "unpack", None) is not None):
        return (out,)
    return tuple(out) if out is not None else ()


def run_fused(op: ad.FusedOp, values: Sequence[Any]) -> tuple[Any, ...]:
    """A fused region's meaning: its body's ops, in order."""
    return run_block(op.body.block, values)


def run_block(block: Block, values: Sequence[Any]) -> tuple[Any, ...]:
    """Run a region body ending in `ad.yield` on `values` (its arguments)."""
    return run_block_values(block, values)[0]


def run_block_values(block: Block, values: Sequence[Any]) -> tuple[tuple[Any, ...], dict[SSAValue, Any]]:
    """Run a block ending in `ad.yield` or `func.return` on `values` (its arguments): what the
    terminator returns, and every value of the block."""
    env: dict[SSAValue, Any] = dict(zip(block.args, values, strict=True))
    for inner in block.ops:
        if isinstance(inner, ad.YieldOp | func.ReturnOp):
            return tuple(env[v] for v in inner.operands), env
        env.update(zip(inner.results, run_op(inner, [env[v] for v in inner.operands]), strict=True))
    raise ValueError("block has no ad.yield or func.return")


def _ad_functions() -> type[InterpreterFunctions]:
    def run(self: Any, interpreter: Interpreter, op: Operation, values: tuple[Any, ...]) -> tuple[Any, ...]:
        return run_op(op, values)

    methods = {
        f"run_{op.name.replace('.', '_')}": impl(op)(run) for op in ad.Ad.operations if op is not ad.YieldOp
    }
    return register_impls(type("AdFunctions", (InterpreterFunctions,), methods))


AdFunctions = _ad_functions()


def evaluate(
    module: ModuleOp,
    weights: Mapping[str, torch.Tensor],
    inputs: Sequence[Any],
    function: str = "forward",
    rank: Rank = SINGLE_RANK,
) -> tuple[Any, ...]:
    """Run `function` with weight arguments taken from `weights` (by FQN; a sharded one as
    held on `rank`) and the user inputs in order."""
    fn = next(op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_name.data == function)
    arg_attrs = list(fn.arg_attrs or [])
    arg_weights = [weight_of(attrs) for attrs in arg_attrs]
    n_inputs = sum(w is None for w in arg_weights)
    if len(inputs) != n_inputs:
        raise ValueError(f"@{function} takes {n_inputs} inputs, got {len(inputs)}")
    user = iter(inputs)
    args = [
        next(user) if w is None else rank_weight(weights[w[1]], arg.type, attrs, rank)
        for arg, attrs, w in zip(fn.body.block.args, arg_attrs, arg_weights, strict=True)
    ]
    # imported here: the `xdsl.interpreters` package imports every dialect's interpreter (~0.5 s),
    # which compiling (the exporter's `run_op`, the passes' mask evaluation) does not need
    from xdsl.interpreters.func import FuncFunctions

    interpreter = Interpreter(module)
    interpreter.register_implementations(FuncFunctions())
    interpreter.register_implementations(AdFunctions())
    with torch.no_grad():
        return tuple(interpreter.call_op(function, tuple(args)))

"""Modelled HBM traffic and kernel launches of one decoder layer's non-GEMM part.

The layer is a middle layer of an HF model of real sizes on the meta device, exported and imported (what eager
runs) and compiled with the default pipeline (what ad-mlir runs). Outside GEMMs and attention
(`report.GEMM_AND_ATTENTION`), every op that launches a kernel reads each tensor operand and
writes each result once:
- eager: every non-view op of the layer, ops on weights alone included (eager recomputes
  them each call); a cast to the same type and an op without a tensor result launch nothing;
- ad-mlir: every kernel (fused region, LLM-level op, op left unfused) of the compiled layer;
  ops on weights alone are computed once, at compile time, and cost nothing;
- ideal: the eager layer's non-GEMM part as one kernel: each tensor it reads from outside
  (GEMM outputs, the residual stream, weights) read once, each tensor it hands on written once;
  also reported for ad-mlir's own non-GEMM part (how far its kernels are from one pass each).
An operand read through views costs the smallest tensor along its view chain (a slice reads
its part, a broadcast reads its source). ad-mlir's RoPE runs inside the attention kernel
(`ad.rope_attention`), so its traffic leaves the non-GEMM part: ad-mlir can come in under
the eager layer's ideal by that much.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_only_values
from ad_mlir.frontends.export import export_meta_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.tools.report import GEMM_AND_ATTENTION, NO_KERNEL, VIEW_OPS, layer_of
from ad_mlir.zoo.tiny import ModelShape, meta_model

LAYERS, LAYER = 3, 1
"""A middle layer: its first norm takes the previous layer's residual add, as in a real model."""


def tensor_bytes(value: SSAValue, tokens: int) -> int:
    """Bytes of a tensor value, its dynamic dim (the sequence) taken as `tokens`."""
    t = value.type
    n = 1
    for d in t.get_shape():
        n *= tokens if d == DYNAMIC_INDEX else d
    return n * max(t.element_type.bitwidth // 8, 1)


def _moves_nothing(op: Operation | object) -> bool:
    """A view, or a cast to the type it already has."""
    return isinstance(op, VIEW_OPS) or (isinstance(op, ad.CastOp) and op.input.type == op.result.type)


def _read_bytes(value: SSAValue, tokens: int) -> int:
    """What reading `value` moves: the smallest tensor along its chain of views."""
    smallest = tensor_bytes(value, tokens)
    while _moves_nothing(value.owner):
        value = value.owner.operands[0]
        smallest = min(smallest, tensor_bytes(value, tokens))
    return smallest


def _root(value: SSAValue) -> SSAValue:
    while _moves_nothing(value.owner):
        value = value.owner.operands[0]
    return value


def _tensors(values: Iterable[SSAValue]) -> list[SSAValue]:
    return [v for v in values if isinstance(v.type, TensorType)]


def launches(op: Operation, folded: set[SSAValue]) -> bool:
    """The op runs a kernel outside GEMMs and attention (values in `folded` are computed at
    compile time)."""
    if isinstance(op, NO_KERNEL + GEMM_AND_ATTENTION) or not op.name.startswith("ad.") or _moves_nothing(op):
        return False
    return bool(_tensors(op.results)) and not any(r in folded for r in op.results)


def layer_launches(fn: func.FuncOp, fold_weights: bool) -> list[Operation]:
    folded = weight_only_values(fn) if fold_weights else set()
    return [op for op in fn.body.block.ops if layer_of(op) == LAYER and launches(op, folded)]


def launch_bytes(ops: Sequence[Operation], tokens: int) -> int:
    inputs = (op.inputs if isinstance(op, ad.FusedOp) else op.operands for op in ops)
    return sum(
        sum(_read_bytes(v, tokens) for v in _tensors(reads)) + sum(tensor_bytes(r, tokens) for r in _tensors(op.results))
        for op, reads in zip(ops, inputs, strict=True)
    )


def ideal_bytes(ops: Sequence[Operation], tokens: int) -> int:
    """`ops` as one kernel: what it reads from outside, once each, and what it hands on."""
    inside = set(ops)
    read = {_root(v) for op in ops for v in _tensors(op.operands) if _root(v).owner not in inside}
    handed_on = {r for op in ops for r in _tensors(op.results) if _used_outside(r, inside)}
    return sum(_read_bytes(v, tokens) for v in read) + sum(tensor_bytes(r, tokens) for r in handed_on)


def _used_outside(value: SSAValue, inside: set[Operation]) -> bool:
    for use in value.uses:
        user = use.operation
        if _moves_nothing(user):
            if _used_outside(user.results[0], inside):
                return True
        elif user not in inside:
            return True
    return False


def layer_graphs(family: str, shape: ModelShape, dtype: str) -> tuple[func.FuncOp, func.FuncOp, int]:
    """One decoder layer's graph as eager runs it and as the default pipeline compiles it, and
    the model's hidden size (`shape`'s for a built-in family, else its config's)."""
    model = meta_model(family, shape, LAYERS, dtype)
    program = import_program(export_meta_model(model))
    eager = program.module.clone()
    run_pipeline(program.module, "default")
    return _function(eager), _function(program.module), model.config.hidden_size


def _function(module: Any) -> func.FuncOp:
    return next(op for op in module.ops if isinstance(op, func.FuncOp))


def run_traffic(
    tokens: Sequence[int], families: Sequence[str] = ("llama",), shape: ModelShape | None = None,
    dtype: str = "bfloat16",
) -> list[dict[str, Any]]:
    """One row per family and token count: launches and bytes of eager, ad-mlir and the ideal."""
    shape = shape or ModelShape()
    rows = []
    for family in families:
        eager_fn, compiled_fn, hidden = layer_graphs(family, shape, dtype)
        eager, compiled = layer_launches(eager_fn, False), layer_launches(compiled_fn, True)
        for t in tokens:
            ideal = ideal_bytes(eager, t)
            row = {
                "family": family, "tokens": t, "hidden": hidden, "dtype": dtype,
                "eager_launches": len(eager), "eager_bytes": launch_bytes(eager, t),
                "ad_mlir_launches": len(compiled), "ad_mlir_bytes": launch_bytes(compiled, t),
                "ideal_bytes": ideal,
            }
            row["ad_mlir_own_ideal_bytes"] = ideal_bytes(compiled, t)
            row["eager_ratio"] = row["eager_bytes"] / ideal
            row["ad_mlir_ratio"] = row["ad_mlir_bytes"] / ideal
            row["ad_mlir_own_ratio"] = row["ad_mlir_bytes"] / row["ad_mlir_own_ideal_bytes"]
            rows.append(row)
    return rows

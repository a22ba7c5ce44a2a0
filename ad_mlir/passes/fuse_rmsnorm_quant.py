"""`fuse-rmsnorm-quant`: an FP8 quantization of a norm's (or an MLP activation's) output joins
the kernel that produces it.

`rms_norm`/`add_rms_norm`/`layer_norm`/`add_layer_norm`/`silu_and_mul`/`gelu_and_mul`/`activation`
followed by `quantize_fp8` (static per-tensor scale, an input of the kernel) or `quantize_fp8_dynamic
per_token` (the kernel computes each row's amax and writes the fp8 values and the f32 scales)
become one `ad.fused` region holding both ops: one kernel reads the activation once and writes
fp8 (and the residual sum, for the add-and-norm ops). The unquantized output is still written
when something else reads it (a parallel block's unquantized MLP). A quantization of a view
that regroups the producer's rows moves before the view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import Float8E4M3FNType, Float32Type, ModuleOp, TensorType
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import keeps_rows, producer, reshape_like
from ad_mlir.passes.patterns.regions import outline, sort_topologically

log = logging.getLogger(__name__)

PRODUCERS = (ad.RmsNormOp, ad.AddRmsNormOp, ad.LayerNormOp, ad.AddLayerNormOp, ad.SiluAndMulOp, ad.GeluAndMulOp,
             ad.ActivationOp)


def quantized_producer(op: Operation, quantized: SSAValue | None = None) -> Operation | None:
    """The norm / SiLU-mul whose first result `op` quantizes (a row-kernel quantization), or
    whose first result is `quantized` when given (the value behind a view `op` quantizes)."""
    if isinstance(op, ad.QuantizeFp8DynamicOp) and op.per_token is None:
        return None
    if not isinstance(op, ad.QuantizeFp8Op | ad.QuantizeFp8DynamicOp):
        return None
    quantized = op.input if quantized is None else quantized
    owner = quantized.owner
    if not isinstance(owner, PRODUCERS) or quantized is not owner.results[0]:
        return None
    return owner


def quantize_before_view(quantize: Operation) -> None:
    """`quantize(view(n))`, `view` a regrouping of the rows of a producer's result `n` ->
    `view(quantize(n))` (and the view of the per-token scales): the quantization is per tensor
    or per row, so it commutes with the view, and the producer's kernel can then quantize what
    it computes (OPT views its rows as [tokens, hidden] around its norms)."""
    view = producer(quantize.input, ad.ReshapeOp)
    if view is None or not keeps_rows(view) or quantized_producer(quantize, view.input) is None:
        return
    normed, shape = view.input, view.input.type.get_shape()
    fp8 = TensorType(Float8E4M3FNType(), shape)
    if isinstance(quantize, ad.QuantizeFp8Op):
        moved = ad.QuantizeFp8Op.build(operands=[normed, quantize.scale], result_types=[fp8])
        views = [reshape_like(view, moved.result, quantize.result.type)]
    else:
        scales = TensorType(Float32Type(), [*shape[:-1], 1])
        moved = ad.QuantizeFp8DynamicOp.build(operands=[normed], properties=dict(quantize.properties),
                                              result_types=[fp8, scales])
        views = [reshape_like(view, moved.result, quantize.result.type),
                 reshape_like(view, moved.scale, quantize.scale.type, last_size=1)]
    moved.location = quantize.location
    Rewriter.replace_op(quantize, [moved, *views], [v.result for v in views])
    if not view.result.uses:  # else the normed value is still written, for the view's other users
        Rewriter.erase_op(view)


def fuse_block(block: Block) -> int:
    for quantize in [op for op in block.ops if isinstance(op, ad.QuantizeFp8Op | ad.QuantizeFp8DynamicOp)]:
        quantize_before_view(quantize)
    pairs = [(p, q) for q in block.ops if (p := quantized_producer(q)) is not None]
    order = {op: i for i, op in enumerate(block.ops)}
    for source, quantize in pairs:
        outline([source, quantize], order)
    if pairs:
        sort_topologically(block)
    return len(pairs)


@dataclass(frozen=True)
class FuseRmsNormQuantPass(ModulePass):
    """norm / SiLU-mul + FP8 quantization -> one kernel (see the module docstring)."""

    name = "fuse-rmsnorm-quant"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        fused = sum(fuse_block(fn.body.block) for fn in op.walk() if isinstance(fn, func.FuncOp) and fn.body.blocks)
        log.info("fuse-rmsnorm-quant: %d quantizations fused into their producer", fused)

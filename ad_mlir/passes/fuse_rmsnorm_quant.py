"""`fuse-rmsnorm-quant`: an FP8 quantization of a norm's (or an MLP activation's) output joins
the kernel that produces it.

`rms_norm`/`add_rms_norm`/`silu_and_mul`/`gelu_and_mul`/`activation` followed by
`quantize_fp8` (static per-tensor scale, an input of the kernel) or `quantize_fp8_dynamic
per_token` (the kernel computes each row's amax and writes the fp8 values and the f32
scales) become one `ad.fused` region holding both
ops: one kernel reads the activation once and writes fp8 (and the residual sum, for
add_rms_norm). The unquantized output is still written when something else reads it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass

from ad_mlir.dialects import ad
from ad_mlir.passes.fuse_elementwise import outline, sort_topologically

log = logging.getLogger(__name__)

PRODUCERS = (ad.RmsNormOp, ad.AddRmsNormOp, ad.SiluAndMulOp, ad.GeluAndMulOp, ad.ActivationOp)


def quantized_producer(op: Operation) -> Operation | None:
    """The norm / SiLU-mul whose first result `op` quantizes (a row-kernel quantization)."""
    if isinstance(op, ad.QuantizeFp8DynamicOp) and op.per_token is None:
        return None
    if not isinstance(op, ad.QuantizeFp8Op | ad.QuantizeFp8DynamicOp):
        return None
    producer = op.input.owner
    if not isinstance(producer, PRODUCERS) or op.input is not producer.results[0]:
        return None
    return producer


def fuse_block(block: Block) -> int:
    pairs = [(p, q) for q in block.ops if (p := quantized_producer(q)) is not None]
    order = {op: i for i, op in enumerate(block.ops)}
    for producer, quantize in pairs:
        outline([producer, quantize], order)
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

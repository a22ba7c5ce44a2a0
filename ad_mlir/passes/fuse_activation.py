"""`fuse-activation`: the activation of an ungated MLP's up projection, with the bias add when
the GEMM did not do it, -> one `ad.activation` ("gelu", "gelu_tanh", "relu", "relu2", "silu").

Where it matches: the activation's input is a GEMM's output (through reshapes and last-dim
slices: GPT-2's Conv1D `addmm` + view, Phi's fc1 as a slice of the GEMM `fuse-gemms` made of
it and Q/K/V), or such an output plus a bias `[N]` of its dtype read only there; and its
result is read by GEMMs only (through reshapes, or FP8-quantized for one). The spellings it
reads are in `passes/patterns/activations.py` (`ad.gelu`, the tanh formula in f32, `relu`,
`relu(x)^2`, `ad.silu` and its core-ATen form).

Why an op rather than leaving the ops to `fuse-elementwise` (which would also make one kernel
of them): the activation becomes one recognisable op in the IR (`ad.activation "gelu_tanh"`
for GPT-2's nine-op spelled-out GELU) and one kernel named for it (`gelu_tanh_<hash>`,
`bias_gelu_<hash>`), with a torch reference and a decomposition that equals it bit for bit
(`dialects/decompositions.py`): what a GEMM epilogue or an FP8 quantization can later be
fused onto, as for `ad.silu_and_mul`. Where it matches, the activation is a kernel of its
own either way (nothing elementwise before or after it but the bias add it takes), so the op
never costs a kernel that a fused region would have saved.

The bias: HF's `nn.Linear` (`ad.linear ... bias`) and GPT-2's Conv1D (`ad.addmm`) add it
inside the GEMM (cuBLAS adds it in its epilogue), so there the op is the activation alone;
Falcon's `FalconLinear` (`x @ W.T + b` as `ad.matmul` + `ad.add`) adds it after the GEMM,
and then the op's kernel adds it: bias add and activation are one kernel either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, StringAttr, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern
from xdsl.rewriter import InsertPoint

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.activations import Activation, gelu_of, relu2_of, relu_of, silu_of
from ad_mlir.passes.patterns.matching import describe_op, erase_dead, other_operand, plain_binary, producer
from ad_mlir.passes.patterns.pattern_pass import PatternPass

log = logging.getLogger(__name__)

MATCHERS = (gelu_of, relu2_of, relu_of, silu_of)
KERNEL_ELEMENT_TYPES = (Float32Type(), BFloat16Type(), Float16Type())

_GEMM_INPUT = {ad.LinearOp: 0, ad.MatmulOp: 0, ad.MmOp: 0, ad.BmmOp: 0, ad.LinearFp8Op: 0, ad.AddmmOp: 1}
"""GEMM op -> the operand index of the activation it multiplies (addmm's `mat1`)."""
GEMMS = tuple(_GEMM_INPUT)


def computed_by_gemm(value: SSAValue) -> bool:
    """`value` is a GEMM's output, or a reshape or slice of one."""
    while isinstance(value.owner, ad.ReshapeOp | ad.SliceOp):
        value = value.owner.input
    return isinstance(value.owner, GEMMS)


def read_by_gemms_only(value: SSAValue) -> bool:
    """Every use of `value` is a GEMM's activation operand, directly or through reshapes, or
    the FP8 quantization of one (`quantize-linear-fp8`'s, which `fuse-rmsnorm-quant` then
    fuses into the activation's kernel)."""
    uses = list(value.uses)
    for use in uses:
        user = use.operation
        if isinstance(user, ad.ReshapeOp):
            if not read_by_gemms_only(user.result):
                return False
        elif isinstance(user, ad.QuantizeFp8Op | ad.QuantizeFp8DynamicOp):
            continue
        elif _GEMM_INPUT.get(type(user)) != use.index:
            return False
    return bool(uses)


def bias_add(value: SSAValue) -> tuple[SSAValue, SSAValue, ad.AddOp] | None:
    """(GEMM output, bias, the add) when single-use `value` is a GEMM output plus a 1-D bias
    of its features and dtype (either operand order)."""
    add = producer(value, ad.AddOp)
    if add is None or not plain_binary(add, ad.AddOp) or not value.has_one_use():
        return None
    for gemm_out in add.operands:
        bias = other_operand(add, gemm_out)
        if not (computed_by_gemm(gemm_out) and gemm_out.type == value.type and isinstance(bias.type, TensorType)):
            continue
        if bias.type == TensorType(value.type.element_type, value.type.get_shape()[-1:]):
            return gemm_out, bias, add
    return None


def activation_of(value: SSAValue) -> Activation | None:
    return next((match for matcher in MATCHERS if (match := matcher(value)) is not None), None)


class FuseActivation(RewritePattern):
    def __init__(self) -> None:
        self.matches = 0

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if len(op.results) != 1:
            return
        value = op.results[0]
        if not isinstance(value.type, TensorType) or value.type.element_type not in KERNEL_ELEMENT_TYPES:
            return
        if not read_by_gemms_only(value) or (act := activation_of(value)) is None or act.input.type != value.type:
            return
        x, bias, ops = act.input, None, act.ops
        if (biased := bias_add(x)) is not None:
            x, bias, add = biased
            ops = [*ops, add]
        elif not computed_by_gemm(x):
            log.info("fuse-activation: %s (%s) left to fuse-elementwise: its input is not a GEMM's output",
                     describe_op(op), act.kind)
            return
        fused = ad.ActivationOp.build(operands=[x, [bias] if bias is not None else []],
                                      properties={"kind": StringAttr(act.kind)}, result_types=[value.type])
        fused.location = op.location
        fused.result.name_hint = value.name_hint
        rewriter.insert(fused, InsertPoint.before(op))
        rewriter.replace_all_uses_with(value, fused.result)
        erase_dead(rewriter.erase, ops)  # `op` first: its constants go too (relu2's exponent)
        self.matches += 1


@dataclass(frozen=True)
class FuseActivationPass(PatternPass):
    """An MLP's bias add + activation between GEMMs -> `ad.activation` (see the module docstring)."""

    name = "fuse-activation"
    summary = "%d activations fused"

    def patterns(self) -> list[RewritePattern]:
        return [FuseActivation()]

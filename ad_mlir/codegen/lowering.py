"""What codegen emits for a kernel: the `ad.fused` region of an op, with kernel ops expanded.

A kernel is an `ad.fused` region, or an LLM-level op (`ad.KernelOp`, or the cached ops such as
`ad.cached_attention`, `ad.cached_mla_attention`, `ad.cached_index_topk` and
`ad.cached_causal_conv1d`, which are not pure: they write their caches) on its own. Either way
codegen works on a detached region: a kernel op is wrapped in a region of its own, and every
kernel op in a body is replaced by its decomposition (`dialects/decompositions.py`), so the
generic region kernel sees elementwise and row-reduction ops only. Attention, RoPE, MoE and
the cached ops have no decomposition: they are emitted from the template `emitters.TEMPLATES`
names for their class. The IR the passes made is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.rewriter import Rewriter

from ad_mlir.codegen.emitters import TEMPLATES, emitter
from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import DECOMPOSITIONS
from ad_mlir.dialects.weights import weight_only_values

KERNEL_OPS = (ad.KernelOp, *(op for op in TEMPLATES if not issubclass(op, ad.KernelOp)))
"""Ops that are a kernel on their own (besides `ad.fused` regions): the LLM-level ops, and the
templated ops that are not `ad.KernelOp`s (they write caches or states, so never join a region)."""


@dataclass(frozen=True)
class KernelRegion:
    region: ad.FusedOp
    """Detached; its inputs are arguments of a block of its own (the real IR gains no uses)."""
    label: str | None
    """Names the kernel after its LLM-level ops ("add_rms_norm"); None for a generic region."""


def kernel_ops(module: ModuleOp) -> list[Operation]:
    """The ops that become kernels: `ad.fused` regions and LLM-level ops of each function's
    body, except those on weights alone (the exporter computes them once, at compile time)."""
    ops: list[Operation] = []
    for fn in module.ops:
        if isinstance(fn, func.FuncOp) and fn.body.blocks:
            once = weight_only_values(fn)
            ops += [
                op for op in fn.body.block.ops
                if isinstance(op, (ad.FusedOp, *KERNEL_OPS)) and not any(r in once for r in op.results)
            ]
    return ops


def kernel_inputs(op: Operation) -> tuple:
    return tuple(op.inputs) if isinstance(op, ad.FusedOp) else tuple(op.operands)


def kernel_outputs(op: Operation) -> tuple:
    return tuple(op.outputs) if isinstance(op, ad.FusedOp) else tuple(op.results)


def written_inputs(op: Operation) -> frozenset[int]:
    """The kernel inputs that the kernel of `op` writes in place."""
    return emitter(op).written(op) if type(op) in TEMPLATES else frozenset()


def kernel_region(op: Operation) -> KernelRegion:
    """Raises `NoKernelForm` for an op that has no kernel (it runs as its torch reference)."""
    if type(op) in TEMPLATES:
        emitter(op).check(op)
    fused = _wrapped(op) if isinstance(op, KERNEL_OPS) else _detached(op)
    kernel_ops = [o for o in fused.body.block.ops if isinstance(o, KERNEL_OPS)]
    label = "_".join(dict.fromkeys(_kernel_label(o) for o in kernel_ops)) or None
    for inner in kernel_ops:
        if type(inner) in DECOMPOSITIONS:
            new_ops, values = DECOMPOSITIONS[type(inner)](inner)
            Rewriter.replace_op(inner, new_ops, values)
    return KernelRegion(fused, label)


def _kernel_label(op: Operation) -> str:
    return op.kernel_label() if isinstance(op, ad.KernelOp) else op.name.removeprefix("ad.")


def template_op(region: ad.FusedOp) -> Operation | None:
    """The op of a region that is one templated kernel op alone, else None."""
    ops = [o for o in region.body.block.ops if not isinstance(o, ad.YieldOp)]
    return ops[0] if len(ops) == 1 and type(ops[0]) in TEMPLATES else None


def emit_kernel_source(region: ad.FusedOp, name: str, header: str) -> str:
    """The kernel module of a lowered region: its op's template (`emitters.TEMPLATES`) for a
    templated op alone, the generic region kernel otherwise."""
    from ad_mlir.codegen.templates import region_kernel

    op = template_op(region)
    if op is None:
        return region_kernel.emit_kernel_module(region, name, header)
    return emitter(op).emit(op, name, header)


def _detached(op: ad.FusedOp) -> ad.FusedOp:
    return _region_op([v.type for v in op.inputs], [r.type for r in op.outputs], op.body.clone())


def _wrapped(op: Operation) -> ad.FusedOp:
    block = Block(arg_types=[v.type for v in op.operands])
    inner = op.clone(value_mapper=dict(zip(op.operands, block.args, strict=True)))
    block.add_ops([inner, ad.YieldOp(*inner.results)])
    return _region_op([v.type for v in op.operands], [r.type for r in op.results], Region(block))


def _region_op(input_types: list[Attribute], output_types: list[Attribute], body: Region) -> ad.FusedOp:
    """An `ad.fused` whose inputs are arguments of a block of its own (no uses in the real IR)."""
    inputs = Block(arg_types=input_types).args
    return ad.FusedOp.build(operands=[inputs], result_types=[output_types], regions=[body])

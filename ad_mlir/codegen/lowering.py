"""What codegen emits for a kernel: the `ad.fused` region of an op, with kernel ops expanded.

A kernel is an `ad.fused` region, or an LLM-level op (`ad.KernelOp`, or the cached ops such as
`ad.cached_attention`, `ad.paged_attention`, the MLA ops, `ad.cached_index_topk` and
`ad.cached_causal_conv1d`, which are not pure: they write their caches) on its own. Either way
codegen works on a detached region: a kernel op is wrapped in a region of its own, and every
kernel op in a body is replaced by its decomposition (`dialects/decompositions.py`), so the
generic region kernel sees elementwise and row-reduction ops only. Attention, RoPE and MoE ops
have no decomposition: their regions are emitted from templates. The IR the passes made is
left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import DECOMPOSITIONS, NoKernelForm
from ad_mlir.dialects.weights import weight_only_values

if TYPE_CHECKING:
    from ad_mlir.codegen.templates.attention_kernel import AttentionSpec
    from ad_mlir.codegen.templates.cached_attention_kernel import CachedAttentionSpec
    from ad_mlir.codegen.templates.moe_kernel import MoeSpec
    from ad_mlir.codegen.templates.paged_attention_kernel import PagedAttentionSpec

RECURRENT_OPS = (ad.CachedSsmScanOp, ad.CachedGatedDeltaRuleOp, ad.CachedSelectiveScanOp)
"""Scans over a per-slot recurrent state (`state`, written in place), each its own template."""
KERNEL_OPS = (ad.KernelOp, ad.CachedAttentionOp, ad.PagedAttentionOp, ad.CachedMlaAttentionOp, ad.CachedIndexTopkOp,
              ad.PagedMlaAttentionOp, ad.CachedCausalConv1dOp, *RECURRENT_OPS)
"""Ops that are a kernel on their own (besides `ad.fused` regions)."""


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
    if isinstance(op, ad.CachedAttentionOp):
        caches = (op.k_cache, op.v_cache, *((op.compressed_cache,) if op.compressed_cache is not None else ()))
        return frozenset(op.operands.index(cache) for cache in caches)
    if isinstance(op, ad.PagedAttentionOp):
        return frozenset(op.operands.index(pages) for pages in (op.k_pages, op.v_pages))
    if isinstance(op, ad.CachedMlaAttentionOp | ad.CachedIndexTopkOp):
        return frozenset({op.operands.index(op.cache)})
    if isinstance(op, ad.PagedMlaAttentionOp):
        return frozenset({op.operands.index(op.pages)})
    if isinstance(op, (ad.CachedCausalConv1dOp, *RECURRENT_OPS)):
        return frozenset({op.operands.index(op.state)})
    return frozenset()


def kernel_region(op: Operation) -> KernelRegion:
    """Raises `NoKernelForm` for an op that has no kernel (it runs as its torch reference)."""
    if isinstance(op, ad.CachedAttentionOp | ad.PagedAttentionOp):
        try:
            cached_attention_spec(op)
        except ValueError as e:  # e.g. a head_dim the template does not take
            raise NoKernelForm(str(e)) from e
    if isinstance(op, ad.CachedAttentionOp) and op.compressed is not None:
        raise NoKernelForm("the cached attention template has no compressed entries (DeepSeek-V4's CSA and HCA)")
    if isinstance(op, ad.CachedMlaAttentionOp) and op.sinks is not None:
        raise NoKernelForm("the MLA template has no sink logits")
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


TEMPLATE_OPS = (ad.RopeAttentionOp, ad.RopeOp, ad.CachedAttentionOp, ad.PagedAttentionOp, ad.CachedMlaAttentionOp,
                ad.CachedIndexTopkOp, ad.PagedMlaAttentionOp, ad.CachedCausalConv1dOp, ad.MoeOp, *RECURRENT_OPS)
"""Kernel ops emitted from a template of their own (they have no decomposition)."""


def template_op(region: ad.FusedOp) -> Operation | None:
    """The op of a region that is one templated kernel op alone, else None."""
    ops = [o for o in region.body.block.ops if not isinstance(o, ad.YieldOp)]
    return ops[0] if len(ops) == 1 and isinstance(ops[0], TEMPLATE_OPS) else None


def emit_kernel_source(region: ad.FusedOp, name: str, header: str) -> str:
    """The kernel module of a lowered region: the attention, cached attention, cached causal
    convolution, RoPE or MoE template for those ops, the generic region kernel otherwise."""
    from ad_mlir.codegen.templates import (
        attention_kernel,
        cached_attention_kernel,
        paged_attention_kernel,
        region_kernel,
        rope_kernel,
    )
    from ad_mlir.semantics.op_table import torch_dtype

    op = template_op(region)
    if isinstance(op, ad.RopeAttentionOp):
        return attention_kernel.emit_attention_module(attention_spec(op), name, header)
    if isinstance(op, ad.CachedAttentionOp):
        return cached_attention_kernel.emit_cached_attention_module(cached_attention_spec(op), name, header)
    if isinstance(op, ad.PagedAttentionOp):
        return paged_attention_kernel.emit_paged_attention_module(cached_attention_spec(op), name, header)
    if isinstance(op, ad.CachedMlaAttentionOp):
        from ad_mlir.codegen.templates.mla_attention_kernel import emit_mla_attention_module

        return emit_mla_attention_module(torch_dtype(op.q_nope.type), op.scale.value.data, name, header,
                                         sparse=op.selected is not None)
    if isinstance(op, ad.CachedIndexTopkOp):
        from ad_mlir.codegen.templates.index_topk_kernel import emit_index_topk_module

        return emit_index_topk_module(op.scale.value.data, op.topk.value.data, name, header)
    if isinstance(op, ad.PagedMlaAttentionOp):
        from ad_mlir.codegen.templates.paged_mla_attention_kernel import emit_paged_mla_attention_module

        return emit_paged_mla_attention_module(torch_dtype(op.q_nope.type), op.scale.value.data, op.page_size(), name,
                                               header)
    if isinstance(op, (ad.CachedCausalConv1dOp, *RECURRENT_OPS)):
        return _emit_state_module(op, name, header)
    if isinstance(op, ad.MoeOp):
        from ad_mlir.codegen.templates.moe_kernel import emit_moe_module

        return emit_moe_module(moe_spec(op), name, header)
    if isinstance(op, ad.RopeOp):
        head_dim = op.query.type.get_shape()[3]
        return rope_kernel.emit_rope_module(head_dim, torch_dtype(op.query.type), torch_dtype(op.key.type), name,
                                            header, rotary_dim(op), op.interleaved is not None)
    return region_kernel.emit_kernel_module(region, name, header)


def _emit_state_module(op: ad.CachedCausalConv1dOp | ad.CachedSsmScanOp | ad.CachedGatedDeltaRuleOp |
                       ad.CachedSelectiveScanOp, name: str, header: str) -> str:
    """A per-sequence state op's kernel module: its template's, launched once per sequence in
    the paged form (`query_starts`: `by_sequence`)."""
    from ad_mlir.codegen.templates.by_sequence import by_sequence_source
    from ad_mlir.codegen.templates.causal_conv_kernel import emit_causal_conv_module
    from ad_mlir.semantics.op_table import torch_dtype

    if isinstance(op, ad.CachedCausalConv1dOp):
        source = emit_causal_conv_module(op.kernel_size(), torch_dtype(op.input.type), op.bias is not None, name,
                                         header)
    else:
        source = _emit_recurrent_module(op, name, header)
    if op.query_starts is None:
        return source
    tokens, axis = _token_inputs(op)
    return by_sequence_source(source, [i for i, v in enumerate(op.operands) if v in tokens], axis)


def _token_inputs(op: ad.CachedCausalConv1dOp | ad.CachedSsmScanOp | ad.CachedGatedDeltaRuleOp |
                  ad.CachedSelectiveScanOp) -> tuple[list[SSAValue], int]:
    """A state op's operands that hold a value per token, and their token axis."""
    if isinstance(op, ad.CachedCausalConv1dOp):
        return [op.input], 2
    if isinstance(op, ad.CachedSelectiveScanOp):
        return [op.input, op.dt, op.b, op.c, *([op.z] if op.z is not None else [])], 2
    if isinstance(op, ad.CachedSsmScanOp):
        return [op.input, op.dt, op.b, op.c], 1
    return [op.query, op.key, op.value, op.g, op.beta], 1


def _emit_recurrent_module(op: ad.CachedSsmScanOp | ad.CachedGatedDeltaRuleOp | ad.CachedSelectiveScanOp, name: str,
                           header: str) -> str:
    from ad_mlir.codegen.templates.gated_delta_rule_kernel import emit_gated_delta_rule_module
    from ad_mlir.codegen.templates.selective_scan_kernel import emit_selective_scan_module
    from ad_mlir.codegen.templates.ssm_scan_kernel import emit_ssm_scan_module
    from ad_mlir.semantics.op_table import torch_dtype

    if isinstance(op, ad.CachedSelectiveScanOp):
        return emit_selective_scan_module(torch_dtype(op.dt.type), torch_dtype(op.result.type), op.d is not None,
                                          op.z is not None, op.dt_bias is not None, op.dt_softplus is not None, name,
                                          header)
    if isinstance(op, ad.CachedSsmScanOp):
        return emit_ssm_scan_module(torch_dtype(op.dt.type), op.d is not None, op.dt_bias is not None,
                                    op.dt_softplus is not None, op.dt_min.value.data if op.dt_min is not None else 0.0,
                                    op.dt_max.value.data if op.dt_max is not None else None, name, header)
    return emit_gated_delta_rule_module(torch_dtype(op.query.type), op.query.type.get_shape()[3],
                                        op.use_qk_l2norm is not None, name, header)


def attention_spec(op: ad.RopeAttentionOp) -> AttentionSpec:
    from ad_mlir.codegen.templates.attention_kernel import AttentionSpec
    from ad_mlir.semantics.op_table import torch_dtype

    return AttentionSpec(
        head_dim=op.query.type.get_shape()[3],
        dtype=torch_dtype(op.query.type),
        rope=True,
        has_mask=op.attn_mask is not None,
        causal=op.is_causal is not None,
        scale=op.scale.value.data,
        cos_dtype=torch_dtype(op.cos.type),
        rotary_dim=rotary_dim(op),
        interleaved=op.interleaved is not None,
        window=op.window.value.data if op.window is not None else None,
        softcap=op.softcap.value.data if op.softcap is not None else None,
        qk_norm=ad.QkNorm.of_op(op),
    )


def cached_attention_spec(op: ad.CachedAttentionOp | ad.PagedAttentionOp) -> CachedAttentionSpec | PagedAttentionSpec:
    """The kernel spec of a cached attention (a `PagedAttentionSpec` for `ad.paged_attention`)."""
    from ad_mlir.codegen.templates.cached_attention_kernel import CachedAttentionSpec
    from ad_mlir.codegen.templates.paged_attention_kernel import PagedAttentionSpec
    from ad_mlir.semantics.op_table import torch_dtype

    paged = {"page_size": op.page_size()} if isinstance(op, ad.PagedAttentionOp) else {}
    return (PagedAttentionSpec if paged else CachedAttentionSpec)(
        **paged,
        head_dim=op.query.type.get_shape()[3],
        dtype=torch_dtype(op.query.type),
        scale=op.scale.value.data,
        rope=op.cos is not None,
        cos_dtype=torch_dtype(op.cos.type) if op.cos is not None else None,
        window=op.window.value.data if op.window is not None else None,
        softcap=op.softcap.value.data if op.softcap is not None else None,
        qk_norm=ad.QkNorm.of_op(op),
        rotary_dim=rotary_dim(op) if op.cos is not None else None,
        interleaved=op.interleaved is not None,
        sinks=op.sinks is not None,
        alibi=op.alibi_slopes is not None,
        distance_extent=op.distance_bias.type.get_shape()[3] if op.distance_bias is not None else None,
        v_head_dim=v_dim if (v_dim := op.value.type.get_shape()[3]) != op.query.type.get_shape()[3] else None,
    )


def rotary_dim(op: ad.RopeAttentionOp | ad.RopeOp | ad.CachedAttentionOp | ad.PagedAttentionOp) -> int:
    """The dims of each head RoPE rotates: the tables' width (`ad.RopeAttentionOp`)."""
    return op.cos.type.get_shape()[-1]


def moe_spec(op: ad.MoeOp) -> MoeSpec:
    from ad_mlir.codegen.templates.moe_kernel import MoeSpec
    from ad_mlir.semantics.op_table import torch_dtype

    _, inter, hidden = op.gate_up.type.get_shape()
    return MoeSpec(
        hidden=hidden,
        intermediate=inter // 2,
        experts=op.router_logits.type.get_shape()[1],
        shared_experts=op.num_shared,
        top_k=op.top_k.value.data,
        dtype=torch_dtype(op.input.type),
        shared_gate=op.shared_gate is not None,
        normalize=op.normalize is not None,
        round_weights=op.round_weights is not None,
    )


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

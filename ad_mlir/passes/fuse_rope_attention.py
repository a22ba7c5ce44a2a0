"""`fuse-rope-attention`: HF's RoPE on Q and K, `repeat_kv` and SDPA -> `ad.rope_attention`.

The pattern (`apply_rotary_pos_emb` + `repeat_kv` + `scaled_dot_product_attention`), in the
spellings of HF's decoders:
    rot(x)  = x * C + rotate(x) * S, rotate either rotate_half: cat(-x[..., R/2:], x[..., :R/2])
              or interleaved pairs (GPT-J, GLM): flatten(stack(-x[..., 1::2], x[..., ::2], -1), -2)
    q_embed = rot(q)                                  (every dim rotates)
            | cat(rot(q[..., :R]), q[..., R:])        (partial rotary: GPT-NeoX, Phi, GLM; an empty
                                                       q[..., R:] when R is the head dim: Phi-3)
            | transpose(either, 1, 2)                 (GPT-J rotates [b, s, h, d] before its transpose)
    C, S    = tables broadcast over heads: [b or 1, 1, s, R] ([b or 1, s, 1, R] before a transpose),
              however computed (unsqueeze(cos, 1); GLM and GPT-J repeat_interleave a half table)
    k_embed = the same on k, with the same tables (the same values, or the same computation)
    k_rep   = reshape(expand(unsqueeze(k_embed, 2), [b, kv, groups, s, d]), [b, kv * groups, s, d])
              (or k_embed itself: one group, or `enable_gqa`), v_rep likewise on v
    out     = attention(q_embed, k_rep, v_rep, mask?, causal?, scale?)
becomes `ad.rope_attention(q, k, v, cos, sin, mask)` (`interleaved` for pairs), with cos/sin the
[b or 1, s, R] tables (C's operand when C is an unsqueeze of one, else a squeeze of C) and q, k
the tensors before RoPE in [b, h, s, d] (a transpose of GPT-J's): one kernel that applies RoPE to
the Q and K tiles after loading them and reads each kv head once for its query heads (no rotated
or repeated copies of Q/K/V in memory). Q, K and V from one fused projection (Phi-3's slices of
`qkv_proj`, GPT-NeoX's chunk of `query_key_value`, Falcon's views) are operands like any other:
the kernel reads them through their strides. The rotated/repeated values must have no other
users to disappear. The RoPE must not promote (its result has x's type). HF's eager attention
(matmul, scale, Gemma2's soft cap, + mask, softmax, matmul: `attention_patterns`) with this RoPE
on its query and key (or one `ad.rope` of both) becomes the op too, with `softcap`.

QK-norm: when q and k before RoPE are each a per-head `ad.rms_norm` with a weight (Gemma3's, or
Qwen3's before the head transpose), of one eps/offset/weight form and used only here, the norms
move into the op (`q_norm_weight`, `k_norm_weight`, `qk_norm_*`): its kernel normalizes the loaded
tiles before RoPE. A norm over the whole projection (OLMo2), on GPT-J's [b, s, h, d] layout, or of
only one of q and k stays a kernel of its own, and the log says why.

The mask HF computes from the token positions is run (`attention_masks`, with the input ids
of a sequence longer than any number the computation holds): when it is causal, or causal
within a sliding window of W keys, the op masks causally (with `window` W) instead, and the
mask's computation goes; any other mask (padding, one computed from a position_ids input)
stays a boolean mask operand. Attentions the template cannot run (dtype, dropout, a float mask
that stays, a head too wide) stay as they are, and the log says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import check_rope_dims
from ad_mlir.passes.patterns.attention_masks import (
    MaskError,
    backward_slice,
    causal_window,
    erase_computation,
    evaluate,
    largest_integer,
)
from ad_mlir.passes.patterns.attention_patterns import match_eager_attention, match_repeat_kv
from ad_mlir.passes.patterns.matching import (
    erase_dead,
    producer,
)
from ad_mlir.passes.patterns.pattern_pass import PatternPass
from ad_mlir.passes.patterns.rope import (
    Rope,
    heads_first,
    match_rope,
    same_tables,
    swaps_heads_and_seq,
    table_ops,
    tables,
)

log = logging.getLogger(__name__)

ATTENTION_DTYPES = (Float16Type(), BFloat16Type(), Float32Type())


def unsupported(query: SSAValue, key: SSAValue, mask: SSAValue | None, rope: Rope) -> str | None:
    """Why the attention template cannot run an attention of `query` and `key` with `mask`
    (None where the kernel masks causally), rotated by `rope`, or None."""
    q = query.type
    if q.element_type not in ATTENTION_DTYPES or key.type.element_type != q.element_type:
        return f"dtype {q.element_type} (the template takes f16/bf16/f32)"
    try:
        check_rope_dims("the attention template", q.get_shape()[-1], rope.rotary_dim, rope.interleaved)
    except ValueError as e:
        return str(e)
    if mask is not None and mask.type.element_type != IntegerType(1):
        return "a float mask that is neither causal nor a causal sliding window (the template takes a boolean mask)"
    return None


def _per_head_norm(x: SSAValue, erased: set[Operation]
                   ) -> tuple[SSAValue, ad.RmsNormOp, list[Operation], list[Operation]] | str | None:
    """(the un-normalized x, the norm, its ops users first, new ops) when `x`, a RoPE input
    [batch, heads, seq, head_dim] that only `erased` ops use, is a per-head RMSNorm with a
    weight: `rms_norm(y)` (Gemma3) or `transpose(rms_norm(y), 1, 2)` (Qwen3, normalized before
    the heads are transposed); why not, when it is another norm; None when it has none."""
    transpose = producer(x, ad.TransposeOp)
    normed = transpose.input if transpose is not None and swaps_heads_and_seq(transpose) else x
    norm = producer(normed, ad.RmsNormOp)
    if norm is None:
        return _whole_projection_norm(x)
    if not all(use.operation in erased for use in x.uses) or (transpose is not None and not normed.has_one_use()):
        return f"the norm at {norm.location} has other users"
    if norm.weight is None or norm.result.type != norm.input.type:
        return f"the norm at {norm.location} has no weight, or one that promotes its input"
    if transpose is None:
        return norm.input, norm, [norm], []
    new = ad.TransposeOp.build(operands=[norm.input], properties=dict(transpose.properties), result_types=[x.type])
    new.location, new.result.name_hint = transpose.location, transpose.result.name_hint
    return new.result, norm, [transpose, norm], [new]


def _whole_projection_norm(x: SSAValue) -> str | None:
    """Why `x` is not normalized per head when a view of an RMSNorm over more than head_dim
    (OLMo2's over the whole q/k projection) computes it: that norm needs every head of a token
    and cannot run in a per-head prologue. None when no norm computes `x`."""
    value = x
    while isinstance(value.owner, ad.TransposeOp | ad.ReshapeOp):
        value = value.owner.input
    norm = producer(value, ad.RmsNormOp)
    if norm is None or value is x:
        return None
    return (f"the norm at {norm.location} normalizes {norm.input.type.get_shape()[-1]} values (the whole projection, "
            f"OLMo2), not each head's {x.type.get_shape()[-1]}: it needs every head of a token")


MIN_MASK_LEN = 64
"""Masks are evaluated at least at this length, and this far past the largest number their
computation holds (a sliding window of W shows from W + 2 tokens on)."""
MAX_MASK_LEN = 8192
"""Longer evaluations (n x n values) are not tried: the mask stays an operand."""


class CausalMasks:
    """Which masks of a function are causal or a causal sliding window (`attention_masks`),
    each evaluated once: layers share them. A mask may read the input ids (their shape) only:
    one computed from a position_ids input, a padding mask or a weight stays an operand, since
    the compiled graph may be given positions that are not 0 .. seq-1."""

    def __init__(self) -> None:
        self._windows: dict[SSAValue, int | None | MaskError] = {}

    def window(self, fn: func.FuncOp, mask: SSAValue) -> int | None:
        """None: causal; W: a causal sliding window of W. A MaskError when it is neither."""
        if mask not in self._windows:
            try:
                self._windows[mask] = causal_window(evaluate(fn, mask, {"input_ids": _ids(_evaluation_length(mask))}))
            except MaskError as e:
                self._windows[mask] = e
        found = self._windows[mask]
        if isinstance(found, MaskError):
            raise found
        return found


def _evaluation_length(mask: SSAValue) -> int:
    """A length past every window the mask's computation can compare positions with."""
    largest = largest_integer(backward_slice(mask)[0])
    n = max(MIN_MASK_LEN, largest + MIN_MASK_LEN)
    if n > MAX_MASK_LEN:
        raise MaskError(f"its computation holds the number {largest}: telling a window that long from causal "
                        f"would evaluate the mask at {n} > {MAX_MASK_LEN} tokens")
    return n


def _ids(n: int) -> torch.Tensor:
    return torch.zeros(1, n, dtype=torch.int64)


def _function_of(op: Operation) -> func.FuncOp:
    parent = op.parent_op()
    while not isinstance(parent, func.FuncOp):
        parent = parent.parent_op()
    return parent


@dataclass
class NormedQk:
    """Per-head RMSNorms of the query and the key before their RoPE (Qwen3, Gemma3), matched."""

    query: SSAValue
    """The query before its norm, as the fused op takes it ([batch, heads, seq, head_dim])."""
    key: SSAValue
    q_weight: SSAValue
    k_weight: SSAValue
    spec: ad.QkNorm
    """The norms' eps, offset and weight form (the query's and the key's are the same)."""
    ops: list[Operation]
    """The norms (after their transposes), erased once the RoPE chains are."""
    new_ops: list[Operation]
    """Transposes of the un-normalized query/key to insert (Qwen3 normalizes before its transpose)."""


@dataclass
class Fusion:
    """An attention with RoPE on its query and key, as `ad.rope_attention` takes it."""

    q: Rope
    k: Rope
    value: SSAValue
    mask: SSAValue | None
    causal: bool
    scale: float
    softcap: float | None = None
    window: int | None = None
    dropped_mask: SSAValue | None = None
    """The mask the op's causal (window) masking replaces: its computation goes once unused."""
    qk_norm: NormedQk | None = None


class RopeAttentionFusion(RewritePattern):
    """What the two patterns share: the masks evaluated so far and the rewrite."""

    def __init__(self, masks: CausalMasks) -> None:
        self.masks = masks
        self.matches = 0

    def drop_mask(self, op: Operation, fusion: Fusion) -> None:
        """The op's own masking instead of a causal or sliding-window mask (else the mask stays)."""
        if fusion.mask is None:
            return
        try:
            fusion.window = self.masks.window(_function_of(op), fusion.mask)
        except MaskError as e:
            log.info("fuse-rope-attention: the mask of the attention at %s stays an operand: %s", op.location, e)
            return
        fusion.dropped_mask, fusion.mask, fusion.causal = fusion.mask, None, True

    def fuse_qk_norm(self, fusion: Fusion, dead: list[Operation], location: object) -> None:
        """The query's and the key's per-head RMSNorms into the op, when both have one of the
        same kind that only this attention uses (else they stay kernels of their own)."""
        erased = {*dead, *fusion.q.chain, *fusion.k.chain}
        norms = [_per_head_norm(rope.x, erased) for rope in (fusion.q, fusion.k)]
        if norms == [None, None]:
            return
        reasons = [n for n in norms if isinstance(n, str)]
        if not reasons and None in norms:
            reasons = ["only one of the query and the key is normalized"]
        if not reasons and ad.QkNorm.of_norm(norms[0][1]) != ad.QkNorm.of_norm(norms[1][1]):
            reasons = ["the query's and the key's norms differ in eps, offset or weight form"]
        if not reasons and fusion.q.heads_dim != 1:
            reasons = ["the RoPE rotates [batch, seq, heads, head_dim] (GPT-J's layout), the prologue's norm heads first"]
        if reasons:
            log.info("fuse-rope-attention: the QK-norm of the attention at %s stays separate: %s", location, reasons[0])
            return
        (q, q_norm, q_ops, q_new), (k, k_norm, k_ops, k_new) = norms
        fusion.qk_norm = NormedQk(q, k, q_norm.weight, k_norm.weight, ad.QkNorm.of_norm(q_norm), [*q_ops, *k_ops],
                                  [*q_new, *k_new])

    def rewrite(self, output: Operation, fusion: Fusion, dead: list[Operation], rewriter: PatternRewriter) -> None:
        """`output` -> `ad.rope_attention`; `dead` (users first), the RoPE chains and the fused
        norms erased once unused."""
        norm = fusion.qk_norm
        if norm is not None:
            for op in norm.new_ops:
                rewriter.insert(op, InsertPoint.before(output))
        properties: dict[str, Attribute] = {"scale": FloatAttr(fusion.scale, Float64Type())}
        if fusion.causal:
            properties["is_causal"] = UnitAttr()
        if fusion.window is not None:
            properties["window"] = IntegerAttr(fusion.window, i64)
        if fusion.softcap is not None:
            properties["softcap"] = FloatAttr(fusion.softcap, Float64Type())
        if fusion.q.interleaved:
            properties["interleaved"] = UnitAttr()

        def insert(new: Operation) -> Operation:
            new.location = output.location
            return rewriter.insert(new)

        q, k = fusion.q, fusion.k
        query, key = (norm.query, norm.key) if norm else (heads_first(q, insert), heads_first(k, insert))
        fused = ad.RopeAttentionOp.build(
            operands=[query, key, fusion.value, *tables(q, insert), [norm.q_weight] if norm else [],
                      [norm.k_weight] if norm else [], [fusion.mask] if fusion.mask else []],
            properties=properties | (norm.spec.properties() if norm else {}),
            result_types=[output.results[0].type],
        )
        fused.location = output.location
        rewriter.replace(output, fused)
        norms = norm.ops if norm else []
        erase_dead(rewriter.erase, [*dead, *q.chain, *k.chain, *norms, *table_ops(q, k)])
        if fusion.dropped_mask is not None:
            erase_computation(fusion.dropped_mask, rewriter.erase)
        self.matches += 1


class FuseRopeAttention(RopeAttentionFusion):
    """RoPE + repeat_kv + SDPA (`ad.attention`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.AttentionOp, rewriter: PatternRewriter) -> None:
        q = match_rope(op.query)
        if q is None:
            return
        if op.dropout_p is not None and op.dropout_p.value.data != 0.0:
            log.info("fuse-rope-attention: attention at %s not fused: dropout", op.location)
            return
        heads = op.query.type.get_shape()[1]
        k_embed, k_repeat = match_repeat_kv(op.key, heads)
        v, v_repeat = match_repeat_kv(op.value, heads)
        k = match_rope(k_embed)
        if k is None or not same_tables(q, k):
            log.info("fuse-rope-attention: attention at %s not fused: its query has RoPE but its key is not "
                     "rotated with the same tables, form and rotary dim", op.location)
            return
        if k.heads_first_shape[1] != v.type.get_shape()[1]:
            log.info("fuse-rope-attention: attention at %s not fused: key and value heads differ", op.location)
            return
        scale = op.scale.value.data if op.scale is not None else op.query.type.get_shape()[-1] ** -0.5
        fusion = Fusion(q, k, v, op.attn_mask, op.is_causal is not None, scale)
        self.drop_mask(op, fusion)
        if (reason := unsupported(op.query, op.key, fusion.mask, q)) is not None:
            log.info("fuse-rope-attention: attention at %s not fused: %s", op.location, reason)
            return
        self.fuse_qk_norm(fusion, [*k_repeat, *v_repeat], op.location)
        self.rewrite(op, fusion, [*k_repeat, *v_repeat], rewriter)


class FuseEagerRopeAttention(RopeAttentionFusion):
    """HF's eager attention (matmul, scale, Gemma2's soft cap, + mask, softmax, matmul:
    `attention_patterns.match_eager_attention`) with RoPE on its query and key."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.SoftmaxOp, rewriter: PatternRewriter) -> None:
        found = match_eager_attention(op)
        if found is None:
            return
        if isinstance(found, str):
            log.info("fuse-rope-attention: the softmax at %s is no attention it fuses: %s", op.location, found)
            return
        if found.sinks is not None or found.alibi is not None or found.mask_fills or found.selected is not None \
                or found.multiplied is not None or found.key_seq_first or found.zeroed is not None:
            log.info("fuse-rope-attention: the eager attention at %s is not fused: ad.rope_attention takes no sink "
                     "logits, ALiBi bias, masked_fill mask, second mask or seq-first key (insert-cached-attention caches it "
                     "with them)",
                     found.output.location)
            return
        if found.rope is not None:  # one ad.rope of both (optimize-rope ran first): in found.chain
            q, k = (Rope(x, *found.rope, found.interleaved, heads_dim=1) for x in (found.query, found.key))
        else:
            q, k = match_rope(found.query), match_rope(found.key)
        if q is None or k is None or not same_tables(q, k):
            log.info("fuse-rope-attention: the eager attention at %s is not fused: no RoPE of its query and key "
                     "with the same tables, form and rotary dim", found.output.location)
            return
        fusion = Fusion(q, k, found.value, found.mask, found.causal, found.scale, found.softcap)
        self.drop_mask(found.output, fusion)
        if (reason := unsupported(found.query, found.key, fusion.mask, q)) is not None:
            log.info("fuse-rope-attention: the eager attention at %s is not fused: %s", found.output.location, reason)
            return
        self.fuse_qk_norm(fusion, found.chain, found.output.location)
        self.rewrite(found.output, fusion, found.chain, rewriter)


@dataclass(frozen=True)
class FuseRopeAttentionPass(PatternPass):
    """RoPE + repeat_kv + attention -> `ad.rope_attention` (see the module docstring)."""

    name = "fuse-rope-attention"
    summary = "%d attentions with RoPE fused (%d SDPA, %d eager)"

    def patterns(self) -> list[RewritePattern]:
        masks = CausalMasks()
        return [FuseRopeAttention(masks), FuseEagerRopeAttention(masks)]

    def counts(self, patterns: list[RewritePattern]) -> tuple[int, ...]:
        return (sum(p.matches for p in patterns), *(p.matches for p in patterns))

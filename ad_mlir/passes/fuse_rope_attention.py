"""`fuse-rope-attention`: HF's RoPE on Q and K, `repeat_kv` and SDPA -> `ad.rope_attention`.

The pattern (`apply_rotary_pos_emb` + `repeat_kv` + `scaled_dot_product_attention`):
    q_embed = q * unsqueeze(cos, 1) + cat(-q[..., d/2:], q[..., :d/2]) * unsqueeze(sin, 1)
    k_embed = the same on k, with the same cos/sin
    k_rep   = reshape(expand(unsqueeze(k_embed, 2), [b, kv, groups, s, d]), [b, kv * groups, s, d])
              (or k_embed itself: one group, or `enable_gqa`), v_rep likewise on v
    out     = attention(q_embed, k_rep, v_rep, mask?, causal?, scale?)
becomes `ad.rope_attention(q, k, v, cos, sin, mask)`: one kernel that applies RoPE to the Q
and K tiles after loading them and reads each kv head once for its query heads (no rotated
or repeated copies of Q/K/V in memory). The rotated/repeated values must have no other users.

The mask HF computes from the token positions is run (`attention_masks`, with the input ids
of a sequence longer than any number the computation holds): when it is causal, or causal
within a sliding window of W keys, the op masks causally (with `window` W) instead, and the
mask's computation goes; any other mask (padding, one computed from a position_ids input)
stays a boolean mask operand.
The attention template needs a power-of-two head_dim of at least 32 (RoPE rotates halves that
feed `tl.dot`, whose depth is at least 16) and float16/bfloat16/float32 operands; other
attentions stay as they are, and the log says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from ad_mlir.dialects import ad
from ad_mlir.passes.attention_masks import (
    MaskError,
    backward_slice,
    causal_window,
    erase_computation,
    evaluate,
    largest_integer,
)
from ad_mlir.passes.attention_patterns import match_eager_attention, match_repeat_kv
from ad_mlir.passes.matching import erase_dead, other_operand, plain_binary, producer

log = logging.getLogger(__name__)

ATTENTION_DTYPES = (Float16Type(), BFloat16Type(), Float32Type())


@dataclass
class Rope:
    x: SSAValue
    cos: SSAValue
    sin: SSAValue
    chain: list[Operation] = field(default_factory=list)


def _static_slice(op: Operation | None, x: SSAValue) -> tuple[int, int] | None:
    """(start, end) of a last-dim, step-1 static slice of `x`."""
    if not isinstance(op, ad.SliceOp) or op.input != x or op.bounds:
        return None
    start, end, step = op.static_bounds.get_values()
    rank = len(x.type.get_shape())
    if step != 1 or ad.normalize_dim(op.dim.value.data, rank) != rank - 1:
        return None
    return start, min(end, x.type.get_shape()[-1])


def rotate_half_of(value: SSAValue) -> tuple[SSAValue, list[Operation]] | None:
    """`x` when `value` is `cat(-x[..., d/2:], x[..., :d/2])` on the last dim."""
    cat = producer(value, ad.CatOp)
    if cat is None or len(cat.tensors) != 2:
        return None
    rank = len(value.type.get_shape())
    if ad.normalize_dim(cat.dim.value.data if cat.dim else 0, rank) != rank - 1:
        return None
    neg = producer(cat.tensors[0], ad.NegOp)
    high = neg.input.owner if neg is not None else None
    low = cat.tensors[1].owner
    if not isinstance(high, ad.SliceOp) or not isinstance(low, ad.SliceOp) or high.input != low.input:
        return None
    x = low.input
    d = x.type.get_shape()[-1]
    if _static_slice(high, x) != (d // 2, d) or _static_slice(low, x) != (0, d // 2) or d % 2:
        return None
    return x, [cat, neg, high, low]


def _table(value: SSAValue) -> tuple[SSAValue, Operation] | None:
    """`cos` when `value` is `unsqueeze(cos, 1)` of a [batch, seq, head_dim] table."""
    op = producer(value, ad.UnsqueezeOp)
    if op is None or op.dim.value.data != 1 or len(op.input.type.get_shape()) != 3:
        return None
    return op.input, op


def match_rope(value: SSAValue) -> Rope | None:
    add = value.owner
    if not plain_binary(add, ad.AddOp):
        return None
    for straight, rotated in (add.operands, reversed(add.operands)):
        m1, m2 = producer(straight, ad.MulOp), producer(rotated, ad.MulOp)
        if m1 is None or m2 is None:
            continue
        for cos_u in m1.operands:
            x = other_operand(m1, cos_u)
            for sin_u in m2.operands:
                rot = rotate_half_of(other_operand(m2, sin_u))
                cos, sin = _table(cos_u), _table(sin_u)
                if rot is not None and rot[0] == x and cos is not None and sin is not None:
                    return Rope(x, cos[0], sin[0], [add, m1, m2, *rot[1], cos[1], sin[1]])
    return None


def unsupported(query: SSAValue, key: SSAValue, mask: SSAValue | None) -> str | None:
    """Why the attention template cannot run an attention of `query` and `key` with `mask`
    (None where the kernel masks causally), or None."""
    q = query.type
    d = q.get_shape()[-1]
    if q.element_type not in ATTENTION_DTYPES or key.type.element_type != q.element_type:
        return f"dtype {q.element_type} (the template takes f16/bf16/f32)"
    if d < 32 or d & (d - 1):
        return f"head_dim {d} (the template needs a power of two >= 32)"
    if mask is not None and mask.type.element_type != IntegerType(1):
        return "a float mask that is neither causal nor a causal sliding window (the template takes a boolean mask)"
    return None


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

    def rewrite(self, output: Operation, fusion: Fusion, dead: list[Operation], rewriter: PatternRewriter) -> None:
        """`output` -> `ad.rope_attention`; `dead` (users first) and the RoPE chains erased once
        unused."""
        properties: dict[str, Attribute] = {"scale": FloatAttr(fusion.scale, Float64Type())}
        if fusion.causal:
            properties["is_causal"] = UnitAttr()
        if fusion.window is not None:
            properties["window"] = IntegerAttr(fusion.window, i64)
        if fusion.softcap is not None:
            properties["softcap"] = FloatAttr(fusion.softcap, Float64Type())
        fused = ad.RopeAttentionOp.build(
            operands=[fusion.q.x, fusion.k.x, fusion.value, fusion.q.cos, fusion.q.sin,
                      [fusion.mask] if fusion.mask else []],
            properties=properties,
            result_types=[output.results[0].type],
        )
        fused.location = output.location
        rewriter.replace(output, fused)
        tables = [*fusion.q.chain[-2:], *fusion.k.chain[-2:]]  # the cos/sin unsqueezes, last: both ropes use them
        erase_dead(rewriter.erase, [*dead, *fusion.q.chain[:-2], *fusion.k.chain[:-2], *tables])
        if fusion.dropped_mask is not None:
            erase_computation(fusion.dropped_mask, rewriter.erase)
        self.matches += 1


class FuseRopeAttention(RopeAttentionFusion):
    """RoPE + repeat_kv + SDPA (`ad.attention`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.AttentionOp, rewriter: PatternRewriter) -> None:
        q_rope = match_rope(op.query)
        if q_rope is None:
            return
        if op.dropout_p is not None and op.dropout_p.value.data != 0.0:
            log.info("fuse-rope-attention: attention at %s not fused: dropout", op.location)
            return
        heads = op.query.type.get_shape()[1]
        k_embed, k_repeat = match_repeat_kv(op.key, heads)
        v, v_repeat = match_repeat_kv(op.value, heads)
        k_rope = match_rope(k_embed)
        if k_rope is None or (k_rope.cos, k_rope.sin) != (q_rope.cos, q_rope.sin):
            return
        if k_rope.x.type.get_shape()[1] != v.type.get_shape()[1]:
            return
        scale = op.scale.value.data if op.scale is not None else op.query.type.get_shape()[-1] ** -0.5
        fusion = Fusion(q_rope, k_rope, v, op.attn_mask, op.is_causal is not None, scale)
        self.drop_mask(op, fusion)
        if (reason := unsupported(op.query, op.key, fusion.mask)) is not None:
            log.info("fuse-rope-attention: attention at %s not fused: %s", op.location, reason)
            return
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
        if found.rope is not None:  # one ad.rope of both (optimize-rope ran first): in found.chain
            q_rope, k_rope = Rope(found.query, *found.rope), Rope(found.key, *found.rope)
        else:
            q_rope, k_rope = match_rope(found.query), match_rope(found.key)
        if q_rope is None or k_rope is None or (k_rope.cos, k_rope.sin) != (q_rope.cos, q_rope.sin):
            log.info("fuse-rope-attention: the eager attention at %s is not fused: no RoPE of its query and key",
                     found.output.location)
            return
        fusion = Fusion(q_rope, k_rope, found.value, found.mask, found.causal, found.scale, found.softcap)
        self.drop_mask(found.output, fusion)
        if (reason := unsupported(found.query, found.key, fusion.mask)) is not None:
            log.info("fuse-rope-attention: the eager attention at %s is not fused: %s", found.output.location, reason)
            return
        self.rewrite(found.output, fusion, found.chain, rewriter)


@dataclass(frozen=True)
class FuseRopeAttentionPass(ModulePass):
    """RoPE + repeat_kv + attention -> `ad.rope_attention` (see the module docstring)."""

    name = "fuse-rope-attention"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        masks = CausalMasks()
        patterns = [FuseRopeAttention(masks), FuseEagerRopeAttention(masks)]
        PatternRewriteWalker(GreedyRewritePatternApplier(patterns), apply_recursively=False).rewrite_module(op)
        log.info("fuse-rope-attention: %d attentions with RoPE fused (%d SDPA, %d eager)",
                 sum(p.matches for p in patterns), *(p.matches for p in patterns))

"""HF's attention spellings that the attention passes (`fuse-rope-attention`,
`insert-cached-attention`) match: `repeat_kv`, and eager attention as a matmul/softmax chain.

HF's eager attention (Gemma2's soft-capped one is only this form) is matched whole:
    p   = softmax(tanh((matmul(q, transpose(repeat_kv(k), 2, 3)) * scale) / cap) * cap + mask)
    out = matmul(p, repeat_kv(v))
(the softmax possibly in f32 and cast back; q and k possibly the two results of one `ad.rope`;
a bare tanh is cap 1, whose division and product canonicalize drops; without the tanh, plain
eager attention, there is no soft cap). gpt-oss's attention sinks are this form with one more
softmax column, each head's learned logit, dropped after:
    l   = cat([scores + mask, expand(reshape(sinks, [1, heads, 1, 1]), [b, heads, s, 1])], -1)
    p   = softmax(l - max(l, -1, keepdim))[..., :-1]       (the max subtracted or not) The softmax must still be an `ad.softmax` (before
`decompose`). The scores and probabilities must have no other user; a softmax that feeds a
matmul but does not match exactly is reported with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import DYNAMIC_INDEX, IntegerAttr, TensorType
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import (
    constant,
    is_last_dim_row_reduction,
    other_operand,
    plain_binary,
    producer,
    sole_user,
)


@dataclass
class Attention:
    """One attention, whichever form it had in the graph (an attention op or the eager chain)."""

    output: Operation
    """The op whose result is the attention's output (replaced by the fused or cached op)."""
    query: SSAValue
    key: SSAValue
    value: SSAValue
    rope: tuple[SSAValue, SSAValue] | None
    """(cos, sin) when the replacing op applies RoPE to the query and the key (on their first
    `cos.shape[-1]` dims: partial rotary carries over as the tables' width)."""
    mask: SSAValue | None
    causal: bool
    scale: float
    softcap: float | None = None
    chain: list[Operation] = field(default_factory=list)
    """Ops besides `output` that only computed the attention, users first (erased once dead)."""
    window: int | None = None
    """The sliding window of a causal attention op without a mask (its mask already dropped)."""
    qk_norm: tuple[SSAValue, SSAValue, ad.QkNorm] | None = None
    """(query weight, key weight, the norm) of an attention op with QK-norm."""
    interleaved: bool = False
    """RoPE rotates pairs (2i, 2i + 1) (`ad.RopeAttentionOp`)."""
    sinks: SSAValue | None = None
    """[heads]: each head's sink logit, a softmax column of its own (gpt-oss)."""


def match_repeat_kv(value: SSAValue, query_heads: int) -> tuple[SSAValue, list[Operation]]:
    """The kv tensor before HF's `repeat_kv` (the value itself when it was not repeated)."""
    reshape = producer(value, ad.ReshapeOp)
    expand = producer(reshape.input, ad.ExpandOp) if reshape is not None else None
    unsqueeze = producer(expand.input, ad.UnsqueezeOp) if expand is not None else None
    if unsqueeze is None or unsqueeze.dim.value.data != 2:
        return value, []
    x = unsqueeze.input
    b, kv, s, d = x.type.get_shape()
    if tuple(expand.result.type.get_shape()) != (b, kv, query_heads // kv, s, d):
        return value, []
    return x, [reshape, expand, unsqueeze]


def match_eager_attention(softmax: ad.SoftmaxOp) -> Attention | str | None:
    """HF's eager attention around `softmax` (module docstring). None when the softmax weighs no
    values with a matmul (it is no attention); why not, when it does but the rest differs."""
    probs = softmax.result
    if (sink_dropped := _last_column_dropped(probs)) is not None:
        probs = sink_dropped.result
    if (cast := sole_user(probs, ad.CastOp)) is not None:
        probs = cast.result
    weighted = sole_user(probs, ad.MatmulOp)
    if weighted is None or weighted.input != probs:
        return _bmm_of_heads(probs)
    if len(probs.type.get_shape()) != 4 or ad.normalize_dim(softmax.dim.value.data, 4) != 3:
        return "its scores are not [batch, heads, seq, keys] normalized over the keys"
    logits, sinks, sink_ops = softmax.input, None, []
    if sink_dropped is not None:
        found = _sink_logits(softmax)
        if isinstance(found, str):
            return found
        logits, sinks, sink_ops = found
    add = logits.owner
    if not plain_binary(add, ad.AddOp) or not logits.has_one_use():
        return "its input is not the scores plus a mask (used only there)"
    scores = next(((x, m) for x in add.operands if (m := _scores(x)) is not None), None)
    if scores is None:
        return "its masked scores are not matmul(q, k^T) * scale, soft-capped or not, each used only there"
    mask = other_operand(add, scores[0])
    if not isinstance(mask.type, TensorType):
        return "its scores plus a number, not a mask"
    qk, scale, softcap, score_ops = scores[1]
    query = qk.input
    heads = query.type.get_shape()[1] if len(query.type.get_shape()) == 4 else DYNAMIC_INDEX
    transpose = producer(qk.other, ad.TransposeOp)
    if heads == DYNAMIC_INDEX or transpose is None or not _swaps_last_two(transpose):
        return "its scores are not matmul(q, transpose(k, 2, 3)) of a [batch, heads, seq, head_dim] q"
    key, key_repeat = match_repeat_kv(transpose.input, heads)
    value, value_repeat = match_repeat_kv(weighted.other, heads)
    if key.type != value.type or weighted.result.type != query.type or heads % key.type.get_shape()[1]:
        return "its query, key and value are not [batch, heads or kv_heads, seq, head_dim] of one type"
    if sinks is not None and sinks.type.get_shape() != (heads,):
        return f"its sink logits are not one per head: {sinks.type}"
    chain = [*([cast] if cast else []), *([sink_dropped] if sink_dropped else []), softmax, *sink_ops, add,
             *score_ops, qk, transpose, *key_repeat, *value_repeat]
    rope = producer(query, ad.RopeOp)
    if rope is not None and (query, key) == (rope.query_out, rope.key_out):
        return Attention(weighted, rope.query, rope.key, value, (rope.cos, rope.sin), mask, False, scale, softcap,
                         [*chain, rope], interleaved=rope.interleaved is not None, sinks=sinks)
    return Attention(weighted, query, key, value, None, mask, False, scale, softcap, chain, sinks=sinks)


def _last_column_dropped(probs: SSAValue) -> ad.SliceOp | None:
    """The sole user of `probs` when it is `probs[..., :-1]` of [batch, heads, seq, keys + 1]."""
    cut = sole_user(probs, ad.SliceOp)
    if cut is None or len(probs.type.get_shape()) != 4 or ad.normalize_dim(cut.dim.value.data, 4) != 3:
        return None
    return cut if tuple(cut.static_bounds.get_values()) == (0, -1, 1) else None


def _sink_logits(softmax: ad.SoftmaxOp) -> tuple[SSAValue, SSAValue, list[Operation]] | str:
    """(scores + mask, sinks [heads], ops users first) when the softmax's input is the module
    docstring's `l` or `l - max(l)`; why not, when its dropped last column is something else."""
    logits, ops = softmax.input, []
    sub = logits.owner
    if plain_binary(sub, ad.SubOp) and logits.has_one_use() and (row_max := _row_max_of(sub.other, sub.input)):
        logits, ops = sub.input, [sub, row_max]
    cat = producer(logits, ad.CatOp)
    if cat is None or len(cat.tensors) != 2 or ad.normalize_dim(cat.dim.value.data if cat.dim else 0, 4) != 3:
        return "its probabilities drop a last column that is not concatenated to the scores"
    if any(use.operation not in (softmax, *ops) for use in logits.uses):
        return "its scores with the sink column have other users"
    scores, column = cat.tensors
    expand = producer(column, ad.ExpandOp)
    per_head = producer(expand.input, ad.ReshapeOp) if expand is not None and column.has_one_use() else None
    if per_head is None or not expand.input.has_one_use() or len(per_head.input.type.get_shape()) != 1 \
            or tuple(per_head.result.type.get_shape()) != (1, per_head.input.type.get_shape()[0], 1, 1):
        return "the column concatenated to its scores is not a logit per head ([heads] viewed as [1, heads, 1, 1])"
    return scores, per_head.input, [*ops, cat, expand, per_head]


def _row_max_of(value: SSAValue, x: SSAValue) -> Operation | None:
    """The op when `value` is x's max over its last dim, kept (`x.max(-1, keepdim=True).values`
    or `amax`), used only there."""
    op = value.owner
    if isinstance(op, ad.AmaxOp) and op.input == x and is_last_dim_row_reduction(op) and value.has_one_use():
        return op
    if not isinstance(op, ad.TorchOp) or op.target.data != "aten.max.dim" or tuple(op.inputs) != (x,):
        return None
    _, dim, *keep = (a.value.data if isinstance(a, IntegerAttr) else a for a in op.args.data)
    rank = len(x.type.get_shape())
    if ad.normalize_dim(dim, rank) != rank - 1 or list(map(bool, keep)) != [True] or value.index != 0 or not value.has_one_use() \
            or op.results[1].uses:
        return None
    return op


def _bmm_of_heads(probs: SSAValue) -> str | None:
    """Why the attention is left when `probs` weigh the values as BLOOM does (a view to
    [batch * heads, seq, keys] and a bmm), else None: no attention."""
    view = sole_user(probs, ad.ReshapeOp)
    weighted = sole_user(view.result, ad.BmmOp) if view is not None else None
    if weighted is None or weighted.input != view.result:
        return None
    return ("its probabilities weigh the values with a bmm over [batch * heads] rows (BLOOM's layout, whose "
            "ALiBi bias no attention op takes)")


def _scores(value: SSAValue) -> tuple[ad.MatmulOp, float, float | None, list[Operation]] | None:
    """(matmul, scale, softcap, ops users first) when `value` is `matmul * scale`, soft-capped
    or not, and each value on the way has no other user (the probabilities stay internal)."""
    capped = _softcapped(value)
    scaled, softcap, cap_ops = capped if capped is not None else (value, None, [])
    unscaled, scale, scale_ops = _scaled(scaled)
    qk = producer(unscaled, ad.MatmulOp)
    ops = [*cap_ops, *scale_ops]
    if qk is None or not all(r.has_one_use() for op in [*ops, qk] for r in op.results):
        return None
    return qk, scale, softcap, ops


def _softcapped(value: SSAValue) -> tuple[SSAValue, float, list[Operation]] | None:
    """(x, cap, ops users first) when `value` is `tanh(x / cap) * cap` (`tanh(x)`: cap 1, whose
    division and product canonicalize drops)."""
    if (tanh := producer(value, ad.TanhOp)) is not None:
        return tanh.input, 1.0, [tanh]
    mul = value.owner
    if not plain_binary(mul, ad.MulOp):
        return None
    for capped in mul.operands:
        tanh = producer(capped, ad.TanhOp)
        div = producer(tanh.input, ad.DivOp) if tanh is not None else None
        cap = constant(other_operand(mul, capped))
        if div is not None and div.rounding_mode is None and cap is not None and cap > 0 and constant(div.other) == cap:
            return div.input, cap, [mul, tanh, div]
    return None


def _scaled(value: SSAValue) -> tuple[SSAValue, float, list[Operation]]:
    """(x, scale, [its op]) when `value` is `x * scale` or `x / (1 / scale)`; else (value, 1, [])."""
    op = value.owner
    if plain_binary(op, ad.MulOp):
        for x in op.operands:
            if (scale := constant(other_operand(op, x))) is not None:
                return x, scale, [op]
    if isinstance(op, ad.DivOp) and op.rounding_mode is None and (divisor := constant(op.other)):
        return op.input, 1 / divisor, [op]
    return value, 1.0, []


def _swaps_last_two(op: ad.TransposeOp) -> bool:
    rank = len(op.input.type.get_shape())
    return rank == 4 and {ad.normalize_dim(d.value.data, rank) for d in (op.dim0, op.dim1)} == {2, 3}

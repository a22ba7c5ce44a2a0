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
(Inkling2's column is a [b, heads, s, 1] logit per token, computed from its hidden state)
    p   = softmax(l - max(l, -1, keepdim))[..., :-1]       (the max subtracted or not)
(without sinks too: MiMo-V2's). GraniteSWA's sinks scale the output by the share of the
denominator the keys have (the same attention):
    out = matmul(softmax(x), v) * unsqueeze(sigmoid(logsumexp(x, -1) - view(sinks, [1, heads, 1])), -1)
with x = scores + mask (casts allowed around the factor).
ALiBi's scores carry a bias (`Attention.alibi`, which the insert pass evaluates), MPT's under a
boolean mask that is True where it masks:
    p   = softmax(masked_fill(matmul(q, k^T) * scale + bias, mask, lowest))
(XLM's fill is in place, `masked_fill_`, its mask `expand_as` the scores: the broadcast
masked_fill makes anyway; its query divided by sqrt(head_dim) before the matmul is the query,
scale 1; CPM-Ant's fill is a `torch.scalar_tensor`, and it zeroes the masked probabilities again
after the softmax, `masked_fill(p, mask, 0)`)
and BLOOM's are computed over [batch * heads] rows:
    s   = view(baddbmm(bias, view(q, [b * h, s, d]), transpose(view(k, ...), -1, -2), beta=1,
               alpha=scale), [b, h, s, keys])
    out = view(bmm(view(softmax(s + mask), [b * h, s, keys]), view(v, ...)), [b, h, s, d])
(the softmax possibly in f32 and cast back; GPT-NeoX-Japanese's bias is `torch.zeros`: no ALiBi;
q and k possibly the two results of one `ad.rope`). Masks besides HF's additive one: GPT-Neo's
`where(mask, scores, fill)` and OpenAI-GPT's multiplied `scores * mask + (1 - mask) * fill`, its
key permuted straight from [batch, seq, heads, head_dim] to k^T (`permute(k, 0, 2, 3, 1)`). The
softmax must still be an `ad.softmax` (before `decompose`). The scores and probabilities must have no other user; a softmax that feeds a
matmul but does not match exactly is reported with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from xdsl.dialects.builtin import DYNAMIC_INDEX, FloatAttr, IntegerAttr, IntegerType, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import (
    constant,
    is_last_dim_row_reduction,
    match_masked_fill,
    other_operand,
    plain_binary,
    producer,
    sole_user,
)
from ad_mlir.semantics.op_table import torch_dtype


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
    """[heads]: each head's sink logit, a softmax column of its own (gpt-oss); or [batch, heads,
    seq, 1]: each query token's (Inkling2)."""
    alibi: SSAValue | None = None
    """A bias added to the scaled scores, to be ALiBi's (BLOOM, MPT): the insert pass evaluates
    it and finds its slopes."""
    mask_fills: bool = False
    """The mask is boolean and True where masked (MPT's `masked_fill`), not True where attended."""
    selected: tuple[SSAValue, SSAValue] | None = None
    """GPT-Neo's (boolean mask, fill) of `where(mask, scores, fill)`, a mask besides `mask`: the
    insert pass evaluates both (the fill must be very negative)."""
    multiplied: tuple[SSAValue, float] | None = None
    """OpenAI-GPT's (mask, fill) of `scores * mask + (1 - mask) * fill`, a mask besides `mask`:
    the insert pass evaluates it (0 or 1: the mask is where it is 1) and checks the fill
    (`passes/cache/masks.py`'s `MULTIPLIED_FILL_MAX`)."""
    key_seq_first: bool = False
    """`key` is [batch, seq, heads, head_dim], which the scores read transposed as k^T by one
    permute (OpenAI-GPT's `permute(0, 2, 3, 1)`): the insert pass permutes it to heads first."""
    zeroed: SSAValue | None = None
    """CPM-Ant's boolean mask (True where masked) under which `masked_fill(p, mask, 0)` zeroes the
    probabilities after the softmax, with `mask_fills`: the insert pass evaluates it, which must be
    `mask` (then it zeroes what the softmax made 0 already, but in rows with every key masked,
    which a causal mask has none of)."""


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


def match_key_bias(mask: SSAValue, query_heads: int) -> tuple[SSAValue, SSAValue, list[Operation]] | None:
    """(bias [batch, kv_heads, keys], the boolean mask, True where it masks, ops users first)
    when an attention's float `mask` is Doge's dynamic mask, a bias per key (computed from the
    key's own value) under HF's mask, repeated over the query heads or not:
        repeat_kv(masked_fill(expand(unsqueeze(bias, 2), [-1, -1, queries, -1]), masked, lowest))"""
    filled, repeat = match_repeat_kv(mask, query_heads)
    op = filled.owner
    found = match_masked_fill(op) if filled.has_one_use() else None
    if found is None:
        return None
    biased, masked, fill, fill_ops = found
    lowest = torch.finfo(torch_dtype(filled.type.element_type)).min
    expand = producer(biased, ad.ExpandOp)
    unsqueeze = producer(expand.input, ad.UnsqueezeOp) if expand is not None else None
    if fill is None or fill > lowest / 2 or unsqueeze is None \
            or ad.normalize_dim(unsqueeze.dim.value.data, 4) != 2 or len(unsqueeze.input.type.get_shape()) != 3 \
            or not all(v.has_one_use() for v in (biased, expand.input)):
        return None
    return unsqueeze.input, masked, [*repeat, op, *fill_ops, expand, unsqueeze]


def match_eager_attention(softmax: ad.SoftmaxOp) -> Attention | str | None:
    """HF's eager attention around `softmax` (module docstring). None when the softmax weighs no
    values with a matmul (it is no attention); why not, when it does but the rest differs."""
    logits, probs, rows_ops = _softmax_over_heads(softmax)
    if (sink_dropped := _last_column_dropped(probs)) is not None:
        probs = sink_dropped.result
    if (cast := sole_user(probs, ad.CastOp)) is not None:
        probs = cast.result
    zeroed, zero_ops = None, []
    if (found := _zeroed(probs)) is not None:
        probs, zeroed, zero_ops = found
    if sink_dropped is None and _baddbmm_scores(softmax) is not None:
        return _match_bmm_of_heads(softmax, probs)
    weighted = sole_user(probs, ad.MatmulOp)
    if weighted is None or weighted.input != probs:
        return _match_bmm_of_heads(softmax, probs) if sink_dropped is None else None
    rank = len(softmax.result.type.get_shape())
    if len(probs.type.get_shape()) != 4 or ad.normalize_dim(softmax.dim.value.data, rank) != rank - 1:
        return "its scores are not [batch, heads, seq, keys] normalized over the keys"
    (logits, sink_ops), sinks = _without_row_max(logits), None
    logits, clamp_ops = _without_clamp(logits)
    sink_ops += clamp_ops
    if sink_dropped is not None:
        found = _sink_logits(softmax, logits, sink_ops)
        if isinstance(found, str):
            return found
        logits, sinks, cat_ops = found
        sink_ops += cat_ops
    output: Operation = weighted
    if sink_dropped is None and (lse_sinks := _lse_sinks(weighted, logits)) is not None:
        output, sinks, lse_ops = lse_sinks
        sink_ops += lse_ops
    masked = _masked_scores(logits, [softmax, *rows_ops, *sink_ops])
    if isinstance(masked, str):
        return masked
    (qk, scale, softcap, score_ops, bias), mask, mask_fills, mask_ops, second = masked
    if zeroed is not None and not mask_fills:
        return "its probabilities are zeroed under a mask, but its scores are not masked by masked_fill"
    query, query_view = _same_view(qk.input)
    heads = query.type.get_shape()[1] if len(query.type.get_shape()) == 4 else DYNAMIC_INDEX
    transposed = _key_transposed(qk.other)
    if heads == DYNAMIC_INDEX or transposed is None:
        return "its scores are not matmul(q, transpose(k, 2, 3)) of a [batch, heads, seq, head_dim] q"
    key, key_repeat = match_repeat_kv(transposed[0], heads) if not transposed[2] else (transposed[0], [])
    value, value_view = _same_view(weighted.other)
    value, value_repeat = match_repeat_kv(value, heads)
    if not _heads_of(query, key, value, weighted.result, transposed[2]) or heads % _key_heads(key, transposed[2]):
        return "its query, key and value are not [batch, heads or kv_heads, seq, head_dim] of one type"
    if sinks is not None and sinks.type.get_shape() != (heads,) and len(sinks.type.get_shape()) != 4:
        return f"its sink logits are not one per head: {sinks.type}"
    chain = [*([weighted] if output != weighted else []), *zero_ops, *([cast] if cast else []),
             *([sink_dropped] if sink_dropped else []), *rows_ops[:1], softmax, *rows_ops[1:], *sink_ops, *mask_ops,
             *score_ops, qk, *query_view, *transposed[1], *key_repeat, *value_view, *value_repeat]
    forms = {"sinks": sinks, "alibi": bias, "mask_fills": mask_fills, "key_seq_first": transposed[2],
             "zeroed": zeroed, **second}
    rope = producer(query, ad.RopeOp)
    if rope is not None and (query, key) == (rope.query_out, rope.key_out):
        return Attention(output, rope.query, rope.key, value, (rope.cos, rope.sin), mask, False, scale, softcap,
                         [*chain, rope], interleaved=rope.interleaved is not None, **forms)
    return Attention(output, query, key, value, None, mask, False, scale, softcap, chain, **forms)


Scores = tuple[ad.MatmulOp, float, float | None, list[Operation], SSAValue | None]
"""(matmul, scale, softcap, ops users first, ALiBi bias or None)."""


Masked = tuple[Scores, SSAValue | None, bool, list[Operation], dict[str, object]]
"""(scores, mask, whether the mask marks what is masked, ops, the `Attention` field of a second
mask: GPT-Neo's `selected` or OpenAI-GPT's `multiplied`, or none)."""


def _masked_scores(logits: SSAValue, users: list[Operation]) -> Masked | str:
    """The scores and their masks when `logits`, used only by `users`, is the scores plus a mask,
    MPT's `masked_fill(scores, mask, very negative)` (at most half the dtype's lowest: HF fills
    with the lowest), GPT-Neo's `where(mask, scores, fill)` or OpenAI-GPT's
    `scores * mask + (1 - mask) * fill` (either plus a mask or not); the scores possibly plus
    ALiBi's bias."""
    op = logits.owner
    if any(use.operation not in users for use in logits.uses):
        return "its input has other users"
    if (found := match_masked_fill(op)) is not None:
        filled, mask, fill, fill_ops = found
        if fill is None or fill > torch.finfo(torch_dtype(logits.type.element_type)).min / 2:
            return "its masked_fill does not fill the scores with a very negative number"
        mask, shape_ops = _expanded_as(mask, filled)
        scores = _biased_scores(filled, shape_ops)
        if scores is None:
            return "its masked scores are not matmul(q, k^T) * scale (+ a bias), each used only there"
        return scores, mask, True, [op, *fill_ops, *shape_ops], {}
    if (second := _second_mask(logits)) is not None:
        return second[0], None, False, second[1], second[2]
    if not plain_binary(op, ad.AddOp):
        return _buffer_mask(logits) or "its input is not the scores plus a mask, nor masked_fill of them"
    for x in op.operands:
        scores = _biased_scores(x)
        found = (scores, [], {}) if scores is not None else _second_mask(x)
        if found is None:
            continue
        mask = other_operand(op, x)
        if not isinstance(mask.type, TensorType):
            return "its scores plus a number, not a mask"
        return found[0], mask, False, [op, *found[1]], found[2]
    return _buffer_mask(logits) or ("its masked scores are not matmul(q, k^T) * scale, soft-capped or not (+ a bias), "
                                    "each used only there")


EXPAND_AS = "aten.expand_as.default"


def _expanded_as(mask: SSAValue, scores: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """(m, [the expand_as]) when `mask` is `m.expand_as(scores)` (XLM's), used only there: the
    broadcast masked_fill does to its mask anyway, reading the scores' shape alone; else (mask, [])."""
    op = mask.owner
    if isinstance(op, ad.TorchOp) and op.target.data == EXPAND_AS and tuple(op.inputs)[1:] == (scores,) \
            and op.args.data[:2] == (ad.OperandRefAttr(0), ad.OperandRefAttr(1)) and mask.has_one_use():
        return op.inputs[0], [op]
    return mask, []


def _second_mask(value: SSAValue) -> tuple[Scores, list[Operation], dict[str, object]] | None:
    """(scores, ops users first, {the `Attention` field}) when `value` is the scores under
    GPT-Neo's `where` or OpenAI-GPT's multiplied mask."""
    if (selected := _selected_scores(value)) is not None:
        return selected[0], selected[1], {"selected": selected[2]}
    if (multiplied := _multiplied_scores(value)) is not None:
        return multiplied[0], multiplied[1], {"multiplied": multiplied[2]}
    return None


def _multiplied_scores(value: SSAValue) -> tuple[Scores, list[Operation], tuple[SSAValue, float]] | None:
    """(scores, ops users first, (mask, fill)) when `value` is OpenAI-GPT's
    `scores * mask + (1 - mask) * fill` of a tensor mask (a slice of its triangular buffer) and
    a number fill, each product used only there."""
    add = value.owner
    if not plain_binary(add, ad.AddOp):
        return None
    for kept in add.operands:
        masked, filled = producer(kept, ad.MulOp), producer(other_operand(add, kept), ad.MulOp)
        if not (plain_binary(masked, ad.MulOp) and plain_binary(filled, ad.MulOp)) \
                or not all(v.has_one_use() for v in (masked.result, filled.result)):
            continue
        for inverted in filled.operands:
            rsub, fill = producer(inverted, ad.SubOp), constant(other_operand(filled, inverted))
            if rsub is None or fill is None or not plain_binary(rsub, ad.SubOp) or constant(rsub.input) != 1 \
                    or not inverted.has_one_use() or rsub.other not in masked.operands \
                    or not isinstance(rsub.other.type, TensorType):
                continue
            scores = _scores(other_operand(masked, rsub.other))
            if scores is not None:
                return (*scores, None), [add, masked, filled, rsub], (rsub.other, fill)
    return None


def _selected_scores(value: SSAValue) -> tuple[Scores, list[Operation], tuple[SSAValue, SSAValue]] | None:
    """(scores, [the where], (mask, fill)) when `value` is GPT-Neo's `where(mask, scores, fill)`
    of a boolean mask (True where attended) and a scalar tensor fill (a lifted constant: the
    insert pass evaluates it, which must be very negative), used only there."""
    where = producer(value, ad.WhereOp)
    if where is None or not value.has_one_use() or where.condition.type.element_type != IntegerType(1) \
            or not isinstance(where.other.type, TensorType) or where.other.type.get_shape():
        return None
    scores = _scores(where.input)
    return ((*scores, None), [where], (where.condition, where.other)) if scores is not None else None


BUFFER_MASK_DEPTH = 4
"""How many ops up from the softmax's input a mask sliced from a model's buffer is looked for."""


def _buffer_mask(logits: SSAValue) -> str | None:
    """Why not, when the masked scores are masked with a slice of a [1, 1, n, n] function
    argument (OpenAI-GPT's triangular `bias` buffer, `scores * mask + (1 - mask) * -1e4`) in a
    form the matcher does not know."""
    level = [logits]
    for _ in range(BUFFER_MASK_DEPTH):
        ops = [v.owner for v in level if isinstance(v.owner, Operation)]
        for op in ops:
            if isinstance(op, ad.SliceOp) and isinstance(op.input, BlockArgument):
                shape = op.input.type.get_shape()
                if len(shape) == 4 and shape[:2] == (1, 1) and shape[2] == shape[3] != DYNAMIC_INDEX:
                    return (f"its scores are masked by a slice of the model's {list(shape)} buffer "
                            f"%{op.input.name_hint} (a triangular buffer of older HF models) in a form not matched "
                            "(GPT-Neo's where(mask, scores, lowest) and OpenAI-GPT's scores * mask + (1 - mask) * fill are)")
        level = [v for op in ops for v in op.operands]
    return None


def _biased_scores(value: SSAValue, shape_readers: list[Operation] | None = None) -> Scores | None:
    """`_scores(value)`, or of one operand of `value` = scores + bias (ALiBi, BLOOM and MPT: a
    tensor the insert pass evaluates); `value` may also be read by `shape_readers` (for its
    shape alone)."""
    if (scores := _scores(value, shape_readers)) is not None:
        return (*scores, None)
    add = value.owner
    if not plain_binary(add, ad.AddOp) or not value.has_one_use():
        return None
    for x in add.operands:
        bias = other_operand(add, x)
        if isinstance(bias.type, TensorType) and (scores := _scores(x)) is not None:
            qk, scale, softcap, ops = scores
            return qk, scale, softcap, [add, *ops], bias
    return None


def _key_heads(key: SSAValue, seq_first: bool) -> int:
    """The key's head count, from [batch, heads, seq, dim] or, `seq_first`, [batch, seq, heads, dim]."""
    return key.type.get_shape()[2 if seq_first else 1]


def _heads_of(query: SSAValue, key: SSAValue, value: SSAValue, output: SSAValue, key_seq_first: bool = False) -> bool:
    """Key and value are one [batch, kv_heads, seq, head_dim] type (the key possibly [batch, seq,
    kv_heads, head_dim]), but for the value's head dim, which the output [batch, heads, seq, ...]
    has (DeepSeek's heads: value 128, query/key 192)."""
    q, k, v, o = (x.type.get_shape() for x in (query, key, value, output))
    if key_seq_first:
        k = (k[0], k[2], k[1], k[3])
    return (k[:3] == v[:3] and k[3] == q[3] and o == (*q[:3], v[3])
            and key.type.element_type == value.type.element_type and output.type.element_type == query.type.element_type)


def _zeroed(probs: SSAValue) -> tuple[SSAValue, SSAValue, list[Operation]] | None:
    """(the zeroed probabilities, the mask, ops users first) when the sole user of `probs` is
    CPM-Ant's `masked_fill(probs, mask, 0)`, which zeroes the masked keys' probabilities after the
    softmax; else None."""
    user = sole_user(probs, ad.TorchOp)
    found = match_masked_fill(user) if user is not None else None
    if found is None or found[0] != probs or found[2] != 0:
        return None
    return user.results[0], found[1], [user, *found[3]]


def _last_column_dropped(probs: SSAValue) -> ad.SliceOp | None:
    """The sole user of `probs` when it is `probs[..., :-1]` of [batch, heads, seq, keys + 1]."""
    cut = sole_user(probs, ad.SliceOp)
    if cut is None or len(probs.type.get_shape()) != 4 or ad.normalize_dim(cut.dim.value.data, 4) != 3:
        return None
    return cut if tuple(cut.static_bounds.get_values()) == (0, -1, 1) else None


def _softmax_over_heads(softmax: ad.SoftmaxOp) -> tuple[SSAValue, SSAValue, list[Operation]]:
    """(its 4-D input, its 4-D probabilities, [the view back, the view in]) when the softmax runs
    over [batch * heads] rows viewed from and back to [batch, heads, seq, keys] (XGLM; the views
    keep the rows: the softmax is over the last dim, which they keep), else (its input, result, [])."""
    rows = producer(softmax.input, ad.ReshapeOp)
    back = sole_user(softmax.result, ad.ReshapeOp)
    if rows is None or back is None or len(softmax.input.type.get_shape()) != 3 or not softmax.input.has_one_use() \
            or back.result.type != rows.input.type or len(back.result.type.get_shape()) != 4 \
            or softmax.input.type.get_shape()[-1] != rows.input.type.get_shape()[-1]:
        return softmax.input, softmax.result, []
    return rows.input, back.result, [back, rows]


def _without_clamp(logits: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """(x, [ops]) when `logits` is `max(x, t)` of a scalar tensor t filled with a very negative
    number (XGLM clamps its masked scores at the dtype's lowest: still masked), else (logits, [])."""
    op = logits.owner
    if not (isinstance(op, ad.TorchOp) and op.target.data == "aten.max.other" and len(op.inputs) == 2
            and logits.has_one_use()):
        return logits, []
    full = producer(op.inputs[1], ad.FullOp)
    fill = constant(full.fill_value) if full is not None else None
    if fill is None or full.result.type.get_shape() or fill > torch.finfo(torch_dtype(logits.type.element_type)).min / 2:
        return logits, []
    return op.inputs[0], [op, full]


def _same_view(value: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """(x, [the view]) when `value` is a view of x to its own type (dynamic sizes keep it from
    folding: XGLM's heads viewed back from its bmm rows), used only there; else (value, [])."""
    view = producer(value, ad.ReshapeOp)
    if view is not None and view.input.type == value.type and value.has_one_use():
        return view.input, [view]
    return value, []


def _key_transposed(value: SSAValue) -> tuple[SSAValue, list[Operation], bool] | None:
    """(k, ops users first, whether k is [batch, seq, heads, head_dim]) when `value` is
    `transpose(k, 2, 3)` of a 4-D k, that over [batch * heads] rows:
    `view(transpose(view(k, [b * h, s, d]), 1, 2), [b, h, d, s])` (XGLM), or `permute(k, 0, 2, 3, 1)`
    of a seq-first k (OpenAI-GPT)."""
    transpose = producer(value, ad.TransposeOp)
    if transpose is not None and _swaps_last_two(transpose):
        return transpose.input, [transpose], False
    permute = producer(value, ad.PermuteOp)
    if permute is not None and tuple(permute.dims.get_values()) == (0, 2, 3, 1) and value.has_one_use():
        return permute.input, [permute], True
    outer = producer(value, ad.ReshapeOp)
    transpose = producer(outer.input, ad.TransposeOp) if outer is not None else None
    inner = producer(transpose.input, ad.ReshapeOp) if transpose is not None else None
    if inner is None or not all(v.has_one_use() for v in (outer.input, inner.result)):
        return None
    key, rows = inner.input, inner.result.type.get_shape()
    k, t = key.type.get_shape(), value.type.get_shape()
    if len(k) != 4 or len(rows) != 3 or rows[2] != k[3] or len(t) != 4 or (t[1], t[2]) != (k[1], k[3]) \
            or {ad.normalize_dim(d.value.data, 3) for d in (transpose.dim0, transpose.dim1)} != {1, 2}:
        return None
    return key, [outer, transpose, inner], False


def _without_row_max(logits: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """(l, ops users first) when `logits` is `l - max(l, -1, keepdim)` (which the softmax
    cancels: gpt-oss's and MiMo's eager forms), else (logits, [])."""
    sub = logits.owner
    if plain_binary(sub, ad.SubOp) and logits.has_one_use() and (row_max := _row_max_of(sub.other, sub.input)):
        return sub.input, [sub, row_max]
    return logits, []


def _sink_logits(softmax: ad.SoftmaxOp, logits: SSAValue,
                 ops: list[Operation]) -> tuple[SSAValue, SSAValue, list[Operation]] | str:
    """(scores + mask, sinks [heads], ops users first) when `logits` (the softmax's input, or the
    `l` of its `l - max(l)`: `ops`) is the module docstring's `l`; why not, when its dropped last
    column is something else."""
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
        if _per_token_column(column, scores):
            return scores, column, [cat]
        return ("the column concatenated to its scores is not a logit per head ([heads] viewed as [1, heads, 1, 1]) "
                "nor one per token and head ([batch, heads, seq, 1])")
    return scores, per_head.input, [cat, expand, per_head]


def _per_token_column(column: SSAValue, scores: SSAValue) -> bool:
    """`column` is [batch, heads, seq, 1] of the scores' batch, heads and seq, in their float type
    (Inkling2's sink logit per token and head, computed from the token's hidden state)."""
    shape, of = column.type.get_shape(), scores.type.get_shape()
    return len(shape) == 4 and shape[3] == 1 and shape[:3] == of[:3] and DYNAMIC_INDEX != shape[1] \
        and column.type.element_type == scores.type.element_type


def _lse_sinks(weighted: ad.MatmulOp, logits: SSAValue) -> tuple[ad.MulOp, SSAValue, list[Operation]] | None:
    """(the product, sinks [heads], the factor's ops users first) when the attention's
    output `weighted` is scaled as the module docstring's LSE form (GraniteSWA's sinks):
    `weighted * unsqueeze(sigmoid(logsumexp(logits, -1) - view(sinks, [1, heads, 1])), -1)`,
    casts allowed on the way; None otherwise."""
    out = weighted.result
    mul = sole_user(out, ad.MulOp)
    if mul is None or not plain_binary(mul, ad.MulOp) or mul.result.type != out.type:
        return None
    factor, casts = _uncast(other_operand(mul, out))
    unsqueeze = producer(factor, ad.UnsqueezeOp)
    if unsqueeze is None or ad.normalize_dim(unsqueeze.dim.value.data, 4) != 3 or not factor.has_one_use():
        return None
    gate, gate_casts = _uncast(unsqueeze.input)
    sigmoid = producer(gate, ad.SigmoidOp)
    if sigmoid is None or not gate.has_one_use():
        return None
    shifted, shift_casts = _uncast(sigmoid.input)
    sub = shifted.owner
    if not plain_binary(sub, ad.SubOp) or not shifted.has_one_use() or not sub.input.has_one_use():
        return None
    lse, view = sub.input.owner, producer(sub.other, ad.ReshapeOp)
    heads = logits.type.get_shape()[1]
    if not (isinstance(lse, ad.TorchOp) and lse.target.data == "aten.logsumexp.default" and tuple(lse.inputs) == (logits,)
            and len(lse.args.data) == 2 and [ad.normalize_dim(d.value.data, 4) for d in lse.args.data[1].data] == [3]):
        return None
    if view is None or view.input.type.get_shape() != (heads,) or tuple(view.result.type.get_shape()) != (1, heads, 1) \
            or not sub.other.has_one_use():
        return None
    return mul, view.input, [*casts, unsqueeze, *gate_casts, sigmoid, *shift_casts, sub, lse, view]


def _uncast(value: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """(x, [the cast]) when `value` is `x` cast and used only there, else (value, [])."""
    cast = producer(value, ad.CastOp)
    return (cast.input, [cast]) if cast is not None and value.has_one_use() else (value, [])


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


def _match_bmm_of_heads(softmax: ad.SoftmaxOp, probs: SSAValue) -> Attention | str | None:
    """BLOOM's attention (module docstring) around `softmax` whose probabilities (cast back from
    f32 or not) are `probs`, None when they weigh no values with a bmm over [batch * heads] rows.
    The value product is the bmm of views, or the 4-D matmul canonicalize makes of it."""
    weighted = _values_weighted(probs)
    found = _baddbmm_scores(softmax)
    if weighted is None:
        return None
    output, value, value_ops = weighted
    if found is None or not all(v.has_one_use() for v in (softmax.input, found[1].result)):
        return ("its probabilities weigh the values with a bmm over [batch * heads] rows, but its scores are not "
                "BLOOM's baddbmm(bias, q, k^T) viewed as [batch, heads, seq, keys] plus a mask")
    add, scores = found
    baddbmm = scores.input.owner
    bias, q_rows, k_t = baddbmm.inputs
    beta, alpha = (baddbmm.kwargs.data.get(name) for name in ("beta", "alpha"))
    k_rows = producer(k_t, ad.TransposeOp)
    q_view, k_view = (producer(x, ad.ReshapeOp) if x is not None else None
                      for x in (q_rows, k_rows.input if k_rows else None))
    if not isinstance(beta, FloatAttr) or beta.value.data != 1 or not isinstance(alpha, FloatAttr) \
            or None in (q_view, k_view, value) or {ad.normalize_dim(d.value.data, 3) for d in (k_rows.dim0, k_rows.dim1)} != {1, 2}:
        return "its baddbmm is not bias + scale * q @ k^T of [batch * heads] rows viewed from [batch, heads, seq, dim]"
    query, key = q_view.input, k_view.input
    if not (len(query.type.get_shape()) == 4 and query.type == key.type == value.type == output.result.type):
        return "its query, key and value are not [batch, heads, seq, head_dim] of one type"
    cast = [probs.owner] if probs != softmax.result else []
    chain = [*value_ops, *cast, softmax, add, scores, baddbmm, q_view, k_rows, k_view]
    mask, alibi = other_operand(add, scores.result), None if _is_zeros(bias) else bias
    if alibi is None:
        chain.append(bias.owner)
    rope = producer(query, ad.RopeOp)
    if rope is not None and (query, key) == (rope.query_out, rope.key_out):
        return Attention(output, rope.query, rope.key, value, (rope.cos, rope.sin), mask, False, alpha.value.data,
                         chain=[*chain, rope], interleaved=rope.interleaved is not None, alibi=alibi)
    return Attention(output, query, key, value, None, mask, False, alpha.value.data, chain=chain, alibi=alibi)


def _is_zeros(value: SSAValue) -> bool:
    """`value` is `torch.zeros(...)`: GPT-NeoX-Japanese's baddbmm adds no bias."""
    op = value.owner
    return isinstance(op, ad.TorchOp) and op.target.data == "aten.zeros.default"


def _values_weighted(probs: SSAValue) -> tuple[Operation, SSAValue | None, list[Operation]] | None:
    """(the op whose result is the attention's output, the [batch, heads, keys, head_dim] values,
    the value product's ops) when `probs` weigh values as `bmm(view(probs), view(v))` viewed
    back to heads, or as the 4-D `matmul(probs, v)`; None otherwise."""
    same = sole_user(probs, ad.ReshapeOp)  # a view to its own shape, which dynamic sizes keep from folding
    viewed, same_ops = (same.result, [same]) if same is not None and same.result.type == probs.type else (probs, [])
    if (matmul := sole_user(viewed, ad.MatmulOp)) is not None and matmul.input == viewed:
        return matmul, matmul.other, [matmul, *same_ops]
    view = sole_user(probs, ad.ReshapeOp)
    weighted = sole_user(view.result, ad.BmmOp) if view is not None else None
    if weighted is None or weighted.input != view.result:
        return None
    output = sole_user(weighted.result, ad.ReshapeOp)
    v_view = producer(weighted.mat2, ad.ReshapeOp)
    if output is None:
        return None
    return output, v_view.input if v_view is not None else None, [weighted, view, *([v_view] if v_view else [])]


def _baddbmm_scores(softmax: ad.SoftmaxOp) -> tuple[ad.AddOp, ad.ReshapeOp] | None:
    """(the add, the view of the scores) when `softmax` reads BLOOM's `view(baddbmm(...)) + mask`."""
    add = softmax.input.owner
    if not plain_binary(add, ad.AddOp):
        return None
    scores = next((s for x in add.operands if (s := producer(x, ad.ReshapeOp)) is not None and _is_baddbmm(s.input)),
                  None)
    return (add, scores) if scores is not None else None


def _is_baddbmm(value: SSAValue) -> bool:
    op = value.owner
    return isinstance(op, ad.TorchOp) and op.target.data == "aten.baddbmm.default" and len(op.args.data) == 3


def _scores(value: SSAValue, shape_readers: list[Operation] | None = None,
            ) -> tuple[ad.MatmulOp, float, float | None, list[Operation]] | None:
    """(matmul, scale, softcap, ops users first) when `value` is `matmul * scale`, soft-capped
    or not, and each value on the way has no other user (the probabilities stay internal) but
    `shape_readers`, which read `value`'s shape alone."""
    capped = _softcapped(value)
    scaled, softcap, cap_ops = capped if capped is not None else (value, None, [])
    unscaled, scale, scale_ops = _scaled(scaled)
    qk = producer(unscaled, ad.MatmulOp)
    ops = [*cap_ops, *scale_ops]
    readers = shape_readers or []
    if qk is None or not all(sum(use.operation not in readers for use in r.uses) == 1 for op in [*ops, qk]
                             for r in op.results):
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

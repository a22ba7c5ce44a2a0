"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5, A.X K2, HY-V4, dots.3 note) as HF writes it,
for `insert-cached-attention` to cache the indexer's keys and restrict the cached attention to
the keys it selects.

HF's lightning indexer (transformers 5.24, `DeepseekV32Indexer` and its copies) scores every key
position t for each query s with small heads of its own and keeps the `index_topk` best:
    scores[b, s, h, t] = relu(scale * q[b, s, h] . k[b, t])       (q [B, S, H, D], k [B, S, D])
    index[b, s, t]     = sum_h w[b, s, h] * scores[b, s, h, t]     (matmul of w [B, S, 1, H]; HY-V4
                                                                    scales w instead: scale 1)
    index              = masked_fill(index, ~causal, -inf)         (or index + additive mask)
    chosen             = topk(index, min(index_topk, T)).indices    (exported: the top-k of index
                                                                    padded with min(index_topk, T)
                                                                    columns of -inf, clamped to
                                                                    T - 1: `export_patches`)
and the attention's mask becomes `causal & ~scatter(ones, chosen, False)` (SDPA's boolean mask)
or `masked_fill(causal, scatter(ones, chosen, False), lowest)` (the eager additive mask: the fill
at most half the dtype's lowest, as `attention_masks.attended` reads masks). A layer
that shares the previous one's selection (GLM-5's `indexer_types = "shared"`) builds its mask from
the same `topk`. `match_sparse_mask` reads this shape from an attention's mask; None when the mask
holds no `aten.topk` selection, why not when it does but the rest differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, IntegerAttr, NoneAttr, NoneType
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import constant, producer
from ad_mlir.semantics.op_table import torch_dtype

TOPK = "aten.topk.default"
SCATTER = "aten.scatter.value"
MASKED_FILL = "aten.masked_fill.Scalar"
NEW_ONES = "aten.new_ones.default"
SYM_MIN = "torch.sym_min"
PAD = "aten.pad.default"
CLAMP = "aten.clamp.default"
SUB = "_operator.sub"


@dataclass(frozen=True)
class Indexer:
    """One lightning indexer: what `ad.cached_index_topk` takes."""

    topk: ad.TorchOp
    """The `aten.topk` whose indices are the selection (shared by the layers that reuse it)."""
    query: SSAValue
    """[batch, seq, index heads, index head dim]: RoPE applied."""
    key: SSAValue
    """[batch, seq, index head dim]: one key per token, RoPE applied (what the cache holds)."""
    weights: SSAValue
    """[batch, seq, index heads]: each head's weight in a query's index score."""
    scale: float
    """Multiplies q . k before the relu."""
    k: int
    """index_topk: keys kept per query (fewer when fewer are causal)."""
    mask: SSAValue
    """The indexer's own mask over [batch, seq, keys], which must be causal."""
    mask_fills: bool
    """`mask` is boolean and applied as masked_fill(~mask, -inf); else it is added (additive)."""


@dataclass(frozen=True)
class SparseMask:
    """An attention mask that is a causal mask restricted to an indexer's selection."""

    indexer: Indexer
    causal: SSAValue
    """The mask without the selection (boolean True where attended, or additive)."""
    ops: list[Operation]
    """The selection's ops in the mask, users first (erased once dead)."""


def match_sparse_mask(mask: SSAValue) -> SparseMask | str | None:
    """The DSA selection in an attention's `mask` (module docstring); None when it holds none."""
    found = _selection(mask)
    if found is None:
        return None
    causal, scatter, ops = found
    indices, casts = scatter.inputs[1], []
    while isinstance(indices.owner, ad.CastOp):
        casts.append(indices.owner)
        indices = indices.owner.input
    if (clamp := _last_key_clamp(indices)) is not None:
        casts.append(clamp)
        indices = clamp.inputs[0]
    topk = indices.owner
    if not _is_torch(topk, TOPK) or indices != topk.outputs[1]:
        return None
    ones = scatter.inputs[0].owner
    if not _is_torch(ones, NEW_ONES) or not _integer(scatter.args.data[1], -1) or not _integer(scatter.args.data[3], 0):
        return "its selection mask is not ones scattered with False at the top-k indices along the last dim"
    indexer = _indexer(topk)
    if isinstance(indexer, str):
        return f"its top-k selection is not DeepSeek's lightning indexer: {indexer}"
    return SparseMask(indexer, causal, [*ops, scatter, ones, *casts])


def _selection(mask: SSAValue) -> tuple[SSAValue, ad.TorchOp, list[Operation]] | None:
    """(the causal mask, the scatter, the ops between them and `mask`, users first) of
    `causal & ~unsqueeze(scatter, 1)` or `masked_fill(causal, unsqueeze(scatter, 1), lowest)`."""
    op = mask.owner
    if isinstance(op, ad.BitwiseAndOp):
        for causal, selected in ((op.input, op.other), (op.other, op.input)):
            negated = producer(selected, ad.BitwiseNotOp)
            found = _unsqueezed_scatter(negated.input) if negated is not None else None
            if found is not None:
                return causal, found[0], [op, negated, found[1]]
        return None
    if _is_torch(op, MASKED_FILL) and len(op.inputs) == 2:
        fill = op.args.data[2]
        found = _unsqueezed_scatter(op.inputs[1])
        lowest = torch.finfo(torch_dtype(op.inputs[0].type)).min if found is not None else None
        if lowest is not None and isinstance(fill, FloatAttr) and fill.value.data <= lowest / 2:
            return op.inputs[0], found[0], [op, found[1]]
    return None


def _unsqueezed_scatter(value: SSAValue) -> tuple[ad.TorchOp, ad.UnsqueezeOp] | None:
    unsqueeze = producer(value, ad.UnsqueezeOp)
    if unsqueeze is None or unsqueeze.dim.value.data != 1:
        return None
    scatter = unsqueeze.input.owner
    return (scatter, unsqueeze) if _is_torch(scatter, SCATTER) and len(scatter.args.data) == 4 else None


def _indexer(topk: ad.TorchOp) -> Indexer | str:
    """The indexer whose masked scores `topk` ranks."""
    args = topk.args.data
    if len(args) != 2 or topk.kwargs.data:
        return "its topk is not over the last dim, largest first"
    k = _topk_count(topk)
    if k is None:
        return "its topk count is neither a constant nor min(index_topk, keys)"
    scores, mask, fills = _masked(_unpadded(topk))
    if mask is None:
        return "its scores are not masked by masked_fill(~mask, -inf) or an added mask"
    squeeze = producer(scores, ad.SqueezeOp)
    weighted = producer(squeeze.input, ad.MatmulOp) if squeeze is not None else None
    row = producer(weighted.input, ad.UnsqueezeOp) if weighted is not None else None
    relu = producer(weighted.other, ad.ReluOp) if weighted is not None else None
    if row is None or relu is None or list(squeeze.dim.get_values()) not in ([-2], [2]):
        return "its index scores are not squeeze(matmul(unsqueeze(weights, -2), relu(scores)), -2)"
    scale, products = 1.0, relu.input
    if (mul := producer(products, ad.MulOp)) is not None and (c := constant(mul.other)) is not None:
        scale, products = c, mul.input
    dot = producer(products, ad.MatmulOp)
    key_t = producer(_uncast(dot.other), ad.UnsqueezeOp) if dot is not None else None
    transpose = producer(_uncast(key_t.input), ad.TransposeOp) if key_t is not None else None
    if transpose is None or key_t.dim.value.data != 1 or \
            {ad.normalize_dim(d.value.data, 3) for d in (transpose.dim0, transpose.dim1)} != {1, 2}:
        return "its head scores are not matmul(q, unsqueeze(transpose(k, -1, -2), 1)) [* scale]"
    query, key, weights = _uncast(dot.input), _uncast(transpose.input), row.input
    q, kk, w = (x.type.get_shape() for x in (query, key, weights))
    if len(q) != 4 or len(kk) != 3 or len(w) != 3 or q[3] != kk[2] or w[2] != q[2]:
        return f"its query {q}, key {kk} and weights {w} are not [batch, seq, heads, dim], [batch, seq, dim], " \
               "[batch, seq, heads]"
    return Indexer(topk, query, key, weights, scale, k, mask, fills)


def _topk_count(topk: ad.TorchOp) -> int | None:
    count = topk.args.data[1]
    if isinstance(count, IntegerAttr):
        return count.value.data
    bound = topk.inputs[1].owner if len(topk.inputs) == 2 else None
    if _is_torch(bound, SYM_MIN) and isinstance(limit := bound.args.data[1], IntegerAttr):
        return limit.value.data
    return None


def _last_key_clamp(indices: SSAValue) -> ad.TorchOp | None:
    """`clamp(indices, max=keys - 1)`: `export_patches._PaddedTopk`'s indices of its padding
    mapped to the last key (which the cached indexer's -1 stands for)."""
    clamp = indices.owner
    if not _is_torch(clamp, CLAMP) or len(clamp.inputs) != 2 or not isinstance(clamp.args.data[1], NoneAttr | NoneType):
        return None
    last = clamp.inputs[1].owner
    return clamp if _is_torch(last, SUB) and _integer(last.args.data[1], 1) else None


def _unpadded(topk: ad.TorchOp) -> SSAValue:
    """What `topk` ranks, without the -inf columns `export_patches._PaddedTopk` appends (as many
    as its count)."""
    pad = topk.inputs[0].owner
    if _is_torch(pad, PAD) and len(pad.inputs) == 2 and len(pad.args.data) == 4 and pad.inputs[1] == topk.inputs[1] and \
            isinstance(fill := pad.args.data[3], FloatAttr) and fill.value.data == float("-inf") and \
            isinstance(amounts := pad.args.data[1], ArrayAttr) and len(amounts) == 2 and _integer(amounts.data[0], 0):
        return pad.inputs[0]
    return topk.inputs[0]


def _masked(scores: SSAValue) -> tuple[SSAValue, SSAValue | None, bool]:
    """(the raw scores, the mask, whether it is masked_fill(~mask, -inf)) of the masked scores."""
    op = scores.owner
    if _is_torch(op, MASKED_FILL) and len(op.inputs) == 2 and isinstance(fill := op.args.data[2], FloatAttr) \
            and fill.value.data == float("-inf") and (negated := producer(op.inputs[1], ad.BitwiseNotOp)) is not None:
        return op.inputs[0], negated.input, True
    if isinstance(op, ad.AddOp) and op.alpha is None:
        return op.input, op.other, False
    return scores, None, False


def _uncast(value: SSAValue) -> SSAValue:
    """`value` before the casts HF applies to score in fp32 (`.float()`): the op computes in fp32."""
    while isinstance(value.owner, ad.CastOp):
        value = value.owner.input
    return value


def _is_torch(op: object, target: str) -> bool:
    return isinstance(op, ad.TorchOp) and op.target.data == target


def _integer(attr: object, value: int) -> bool:
    """`attr` is the integer (or boolean: False is 0) `value`."""
    return isinstance(attr, IntegerAttr) and attr.value.data == value

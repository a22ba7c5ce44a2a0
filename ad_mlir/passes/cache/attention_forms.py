"""What HF's eager attention forms add to their scores, turned into operands of the cached
attention (`attention.py`), and the keys those forms hold in another layout.

gpt-oss's eager form concatenates each head's learned sink logit to the masked scores as one more
softmax column and drops it after: the sinks [heads] become the cached op's `sinks` operand.
Inkling2's sink logit per token ([batch, heads, seq, 1] concatenated to the scores) becomes
`sinks` [batch, heads, seq] (the paged form refuses it by name, as `PerSequenceState`).

ALiBi (BLOOM, MPT): a bias added to the scaled scores (MPT's eager form, whose mask is a boolean
`masked_fill` that is True where it masks; BLOOM's `baddbmm(bias, q, k^T)` over [batch * heads]
rows, viewed as heads, with a bmm of the values) is evaluated at max-seq-len tokens as the mask
is: it must be `slope[h] * key position` plus a constant per query, and its computation must hold
the slopes ([heads], or MPT's [1, heads, 1, 1], then viewed as [heads]), which become the op's
`alibi_slopes`; anything else is an error naming the layer.

Inkling's relative bias (`patterns/distance_bias.py`: per-token logits [batch, heads, seq,
extent] gathered by the query-key distance and zeroed outside 0 .. extent - 1, added to the scores
or, through SDPA, the float mask `where(mask, bias, lowest)`) becomes the op's `distance_bias`:
the gather's index and zeroed positions are run at max-seq-len tokens and must be exactly those
(else an error naming the layer); per-query casts and factors on the bias (Inkling's log scaling)
apply to the logits.

Doge's dynamic mask, a bias per key and kv head (computed from each key's own value) put under
HF's mask with `masked_fill` and repeated over the query heads (`attention_patterns.match_key_bias`),
is cached as one more head dim: the query gets a 1 and the key the bias / scale (so the scaled
scores gain the bias, and the cache keeps each key's bias with it), the key and value lose their
repeat_kv, and HF's mask is evaluated as a masked_fill mask. Its bias's computation stays in the
graph, where a token-mixing op would be refused.

OpenAI-GPT's key, which it permutes straight to k^T, is permuted to heads first for the cache.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseArrayBase,
    Float64Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    TensorType,
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CacheSite, PerSequenceState
from ad_mlir.passes.patterns.attention_masks import MaskError, alibi_slopes
from ad_mlir.passes.patterns.attention_patterns import Attention, match_key_bias, match_repeat_kv
from ad_mlir.passes.patterns.distance_bias import (
    biased_mask,
    check_distance_bias,
    match_distance_bias,
    scaled_logits,
)


def distance_bias(site: CacheSite, attention: Attention, layer: str) -> tuple[list[SSAValue], SSAValue | None]:
    """([the per-token logits], the bias they replace) when the scores' bias (eager: added
    to the scores; SDPA: the float mask `where(mask, bias, lowest)`, which leaves the boolean
    mask) is Inkling's relative bias gathered by distance (`patterns/distance_bias.py`; the
    logits scaled per query as the bias was, by new ops before the attention); ([], None)
    for any other. A bias of that form gathered otherwise raises, naming the layer."""
    if attention.alibi is not None and (found := match_distance_bias(attention.alibi)) is not None:
        bias, attention.alibi = attention.alibi, None
    elif attention.mask is not None and not attention.mask_fills and (split := biased_mask(attention.mask)):
        bias = attention.mask
        attention.mask, found = split
    else:
        return [], None
    try:
        check_distance_bias(site.fn, found, site.mask_inputs())
    except MaskError as e:
        raise PassFailedException(f"{layer}: {e}; only a bias gathered by the query-key distance can be "
                                  "cached") from None
    return [scaled_logits(found, InsertPoint.before(attention.output))], bias


def sinks(site: CacheSite, attention: Attention, layer: str) -> SSAValue:
    """The op's `sinks`: [heads] as matched, or a [batch, heads, seq, 1] column per token
    squeezed to [batch, heads, seq] (a new op before the attention; the slot form only)."""
    found = attention.sinks
    shape = found.type.get_shape()
    if len(shape) == 1:
        return found
    if site.paged:
        raise PerSequenceState(f"{layer}: its sink logits are one per token (Inkling2's); the paged form "
                               "(paged=true) takes one per head only: compile it in the slot form")
    squeeze = ad.SqueezeOp.build(operands=[found], properties={"dim": DenseArrayBase.from_list(i64, [3])},
                                 result_types=[TensorType(found.type.element_type, shape[:3])])
    squeeze.location = attention.output.location
    Rewriter.insert_op(squeeze, InsertPoint.before(attention.output))
    return squeeze.result


def slopes(site: CacheSite, attention: Attention, layer: str) -> SSAValue:
    """The [heads] slopes of the bias added to the scores, which must be ALiBi's (viewed as
    [heads], once for every layer, when the graph holds them as [1, heads, 1, 1]); raises
    otherwise."""
    heads = attention.query.type.get_shape()[1]
    try:
        found = alibi_slopes(site.fn, attention.alibi, heads, site.mask_inputs())
    except MaskError as e:
        raise PassFailedException(f"{layer}: {e}; only ALiBi's bias can be cached") from None
    if found.type.get_shape() == (heads,):
        return found
    viewed = TensorType(found.type.element_type, [heads])
    done = next((u.operation for u in found.uses if isinstance(u.operation, ad.ReshapeOp)
                 and u.operation.result.type == viewed), None)
    if done is not None:
        return done.result
    view = ad.ReshapeOp.build(operands=[found, []], properties={"static_sizes": DenseArrayBase.from_list(i64, [heads])},
                              result_types=[viewed])
    Rewriter.insert_op(view, InsertPoint.after(found.owner))
    return view.result


def bias_as_key_dim(attention: Attention) -> None:
    """Doge's dynamic mask (`match_key_bias`: a bias per key and kv head, under HF's mask) as one
    more head dim: the query gets a 1 and the key bias / scale, so that the scaled scores gain
    the bias (the cache holds each key's bias with it); HF's mask stays the attention's, a
    masked_fill mask. The key and value lose their repeat_kv. Nothing changes for another mask."""
    heads = attention.query.type.get_shape()[1]
    found = match_key_bias(attention.mask, heads) if attention.mask is not None and not attention.mask_fills \
        and attention.rope is None and attention.alibi is None else None
    if found is None:
        return
    bias, masked, ops = found
    (key, key_ops), (value, value_ops) = (match_repeat_kv(x, heads) for x in (attention.key, attention.value))
    kv_heads = bias.type.get_shape()[1]
    if key.type.get_shape()[1] != kv_heads or value.type.get_shape()[1] != kv_heads:
        return
    ones, new_ops = _ones_column(attention.query)
    scaled = _scaled_column(bias, attention.scale, key.type.element_type)
    widened = [_widened(x, extra) for x, extra in ((attention.query, ones), (key, scaled[-1].results[0]))]
    Rewriter.insert_op([*new_ops, *scaled, *widened], InsertPoint.before(attention.output))
    attention.query, attention.key, attention.value = widened[0].result, widened[1].result, value
    attention.mask, attention.mask_fills = masked, True
    attention.chain += [*ops, *key_ops, *value_ops]


def _ones_column(query: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """A [batch, heads, seq, 1] column of ones in the query's dtype, and its ops."""
    shape = query.type.get_shape()
    sizes = [ad.SymSizeOp.build(operands=[query], properties={"dim": IntegerAttr(d, i64)}, result_types=[IndexType()])
             for d, n in enumerate(shape[:3]) if n == DYNAMIC_INDEX]
    one = ad.ConstantOp(FloatAttr(1.0, Float64Type()))
    ones = ad.FullOp.build(operands=[[s.result for s in sizes], one.result],
                           properties={"static_size": DenseArrayBase.from_list(i64, [*shape[:3], 1])},
                           result_types=[TensorType(query.type.element_type, [*shape[:3], 1])])
    return ones.result, [*sizes, one, ones]


def _scaled_column(bias: SSAValue, scale: float, dtype: object) -> list[Operation]:
    """The ops of `bias` [batch, kv_heads, seq] as a column divided by `scale`, in `dtype` (the
    last op's result)."""
    column = ad.UnsqueezeOp.build(operands=[bias], properties={"dim": IntegerAttr(3, i64)},
                                  result_types=[TensorType(bias.type.element_type, [*bias.type.get_shape(), 1])])
    inverse = ad.ConstantOp(FloatAttr(1 / scale, Float64Type()))
    scaled = ad.MulOp(column.result, inverse.result, column.result.type)
    if bias.type.element_type == dtype:
        return [column, inverse, scaled]
    return [column, inverse, scaled, ad.CastOp(scaled.result, TensorType(dtype, column.result.type.get_shape()))]


def _widened(x: SSAValue, extra: SSAValue) -> ad.CatOp:
    """`x` [b, h, s, d] with `extra` [b, h, s, 1] as one more head dim."""
    shape = x.type.get_shape()
    return ad.CatOp.build(operands=[[x, extra]], properties={"dim": IntegerAttr(3, i64)},
                          result_types=[TensorType(x.type.element_type, [*shape[:3], shape[3] + 1])])


def heads_first(key: SSAValue) -> SSAValue:
    """[batch, seq, heads, head_dim] `key` permuted to [batch, heads, seq, head_dim], placed
    right after it."""
    b, s, h, d = key.type.get_shape()
    permute = ad.PermuteOp.build(operands=[key], properties={"dims": DenseArrayBase.from_list(i64, [0, 2, 1, 3])},
                                 result_types=[TensorType(key.type.element_type, [b, h, s, d])])
    Rewriter.insert_op(permute, InsertPoint.after(key.owner) if isinstance(key.owner, Operation)
                       else InsertPoint.at_start(key.owner))
    return permute.result
